"""``MODULE:NAME`` references (``--model``, ``--sample``, ``--loss``) and ``--input-shape``.

Pure Python: resolving a reference imports the user's module, not torch (the
user's module may of course import torch itself).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from typing import Callable


class SpecError(ValueError):
    """A reference or shape the user gave cannot be used (a usage error)."""


def with_article(noun: str) -> str:
    """"an int", "a list": for messages naming a type."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def split_ref(text: str, option: str) -> tuple[str, str]:
    """``'pkg.models:build'`` -> ``('pkg.models', 'build')``; also ``path/file.py:build``."""
    if not text or text.count(":") < 1:
        raise SpecError(f"{option} {text!r}: write MODULE:FUNCTION, e.g. mypkg.models:build "
                        f"or path/to/models.py:build")
    module, _, name = text.rpartition(":")
    if not module or not name.isidentifier():
        raise SpecError(f"{option} {text!r}: write MODULE:FUNCTION, e.g. mypkg.models:build")
    return module, name


def _module_name_for_file(path: str) -> str:
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    return f"_ddpcheck_user_{stem}_{abs(hash(os.path.abspath(path))) % 10**8}"


def _import(module: str, option: str, text: str):
    # like `python -m`, look in the current directory first
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    if module.endswith(".py") or os.sep in module or "/" in module:
        path = os.path.abspath(module)
        if not os.path.isfile(path):
            raise SpecError(f"{option} {text!r}: no such file {module}")
        name = _module_name_for_file(path)
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return mod
    return importlib.import_module(module)


def load_ref(text: str, option: str = "--model") -> Callable:
    """The callable ``text`` names; :class:`SpecError` with a one-line reason otherwise."""
    module, name = split_ref(text, option)
    try:
        mod = _import(module, option, text)
    except SpecError:
        raise
    except ModuleNotFoundError as exc:
        raise SpecError(f"{option} {text!r}: cannot import {module} ({exc}); run from the "
                        f"directory that contains it or install it") from None
    except SystemExit as exc:
        raise SpecError(f"{option} {text!r}: importing {module} called sys.exit({exc.code})") \
            from None
    except Exception as exc:  # the user's module failed while importing
        raise SpecError(f"{option} {text!r}: importing {module} raised "
                        f"{type(exc).__name__}: {exc}") from None
    try:
        obj = getattr(mod, name)
    except AttributeError:
        raise SpecError(f"{option} {text!r}: {module} has no attribute {name!r}") from None
    if not callable(obj):
        raise SpecError(f"{option} {text!r}: {module}.{name} is {with_article(type(obj).__name__)}, "
                        f"not a function") from None
    return obj


def parse_input_shape(text: str) -> tuple[int, ...]:
    """``'3,224,224'`` (or ``3x224x224``) -> ``(3, 224, 224)``: one sample, without the batch."""
    compact = re.sub(r"\s+", "", str(text)).strip("()[]")
    shape = ()
    if re.fullmatch(r"\d+([,x]\d+)*", compact):
        shape = tuple(int(p) for p in re.split(r"[,x]", compact))
    if not shape or any(d < 1 for d in shape):
        raise SpecError(f"--input-shape {text!r}: write the shape of ONE sample as positive "
                        f"integers, e.g. 3,224,224 (the batch dimension is added)")
    return shape


def split_call(batch) -> tuple[tuple, dict]:
    """What ``--sample``'s ``FN(batch_size)`` returned, as the model call's
    ``(args, kwargs)``: a tensor is the one positional input, a dict the keyword
    inputs, ``(tuple, dict)`` both, any other tuple/list the positional inputs."""
    if isinstance(batch, dict):
        return (), dict(batch)
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], tuple) \
            and isinstance(batch[1], dict):
        return batch[0], dict(batch[1])
    if isinstance(batch, (list, tuple)):
        return tuple(batch), {}
    return (batch,), {}
