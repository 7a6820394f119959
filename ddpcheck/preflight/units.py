"""Memory sizes: parse ``24GiB`` / ``24GB`` / ``512M`` and print bytes (pure Python)."""

from __future__ import annotations

import re

_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)(B?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``text``.

    ``GiB``/``MiB``/``KiB``/``TiB`` are binary, ``GB``/``MB``/``KB``/``TB`` decimal,
    and a bare ``G``/``M``/``K``/``T`` is binary (as nvidia-smi and most tools
    mean it). A plain number is bytes. Raises ``ValueError`` with a message
    that names the accepted forms.
    """
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(
            f"{text!r} is not a memory size: write e.g. 24GiB, 24GB, 16G or 512MiB"
        )
    number, prefix, binary, byte = match.groups()
    prefix = prefix.upper()
    value = float(number)
    if prefix and byte and not binary:
        factor = _DECIMAL[prefix]
    else:
        factor = _BINARY[prefix]
    size = int(round(value * factor))
    if size <= 0:
        raise ValueError(f"{text!r}: a memory size must be larger than 0")
    return size


def format_bytes(size: float | int | None) -> str:
    """``1536`` -> ``'1.5 KiB'``; ``None`` -> ``'-'``."""
    if size is None:
        return "-"
    size = float(size)
    sign = "-" if size < 0 else ""
    size = abs(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            if unit == "B":
                return f"{sign}{int(size)} B"
            return f"{sign}{size:.2f} {unit}" if size < 10 else f"{sign}{size:.1f} {unit}"
        size /= 1024
    return f"{sign}{size:.1f} GiB"  # pragma: no cover - loop always returns


def relative_path(path: str) -> str:
    """`path` relative to the working directory when it is below it, as written otherwise."""
    import os

    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
