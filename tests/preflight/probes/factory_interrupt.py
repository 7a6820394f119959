"""Probe: a model factory (--model factory_interrupt:build) that raises KeyboardInterrupt."""


def build():
    raise KeyboardInterrupt("raised by the model factory")
