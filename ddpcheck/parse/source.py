"""Reading a Python source file as text the way Python itself does: a UTF-8
BOM or a PEP 263 coding cookie (`# -*- coding: latin-1 -*-`) picks the
encoding, UTF-8 otherwise. A leaf module (no libcst, no torch)."""

from __future__ import annotations

import codecs
import io
import tokenize
from pathlib import Path

from ddpcheck.findings import ErrorKind, SourceError


def read_source(path: str) -> str:
    """Read a Python file as text, or raise SourceError with a one-line reason."""
    return read_source_encoded(path)[0]


def read_source_encoded(path: str) -> tuple[str, str]:
    """(text, encoding): the text and the codec that gives back the file's bytes
    from it (`utf-8-sig` when there is a BOM, a PEP 263 cookie's encoding);
    SourceError as read_source."""
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
    return decode_source(data), source_encoding(data)


def source_encoding(data: bytes) -> str:
    """The codec Python reads these source bytes with: `utf-8-sig` for a BOM,
    a PEP 263 cookie's (normalised) name, else `utf-8`. Call after
    decode_source accepted `data`."""
    return tokenize.detect_encoding(io.BytesIO(data).readline)[0]


def decode_source(data: bytes) -> str:
    """Source bytes -> text, by the rules of PEP 263 and PEP 3120."""
    if b"\x00" in data:
        raise SourceError("binary file (contains NUL bytes), not Python source")
    try:
        # 'utf-8-sig' for a BOM, the cookie's (normalised) name, else 'utf-8'.
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # unknown encoding in the cookie, a BOM contradicting it
        raise SourceError(f"bad coding declaration ({exc.msg})",
                          ErrorKind.ENCODING) from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        name = "UTF-8" if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig") else encoding
        raise SourceError(f"not valid {name} (line {line}, byte {data[exc.start]:#04x})", ErrorKind.ENCODING) from None
    except LookupError:  # detect_encoding checks the name, but a codec can still be missing
        raise SourceError(f"unknown encoding {encoding!r}", ErrorKind.ENCODING) from None
