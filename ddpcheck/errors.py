"""One way to report a user mistake, for every command (``lint``, ``rule``,
``preflight``): one line ``ddpcheck: error: ...`` on stderr and exit 2, never a
traceback. A leaf module: click only."""

from __future__ import annotations

from typing import NoReturn

import click

EXIT_USAGE = 2


def error_line(message: str) -> str:
    return f"ddpcheck: error: {message}"


class UsageError(click.ClickException):
    """Raised anywhere below a click command; click prints it with :meth:`show`
    and exits with :data:`EXIT_USAGE`."""

    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:
        click.echo(error_line(self.format_message()), err=True)


def fail(message: str) -> NoReturn:
    """A user mistake: one line on stderr, exit 2, no traceback."""
    raise UsageError(message)
