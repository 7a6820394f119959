"""Reading a Python source file as text; a leaf module (no libcst, no torch)."""

from __future__ import annotations

from pathlib import Path

from ddpcheck.findings import SourceError


def read_source(path: str) -> str:
    """Read a Python file as text, or raise SourceError with a one-line reason."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise SourceError("no such file") from None
    except IsADirectoryError:
        raise SourceError("is a directory") from None
    except PermissionError:
        raise SourceError("permission denied") from None
    except OSError as exc:  # symlink loops, I/O errors
        raise SourceError(exc.strerror or str(exc)) from None
    if b"\x00" in data:
        raise SourceError("binary file (contains NUL bytes), not Python source")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None
