"""The metadata (key/value) section of a GGUF file, read fast and without the tensors.

`read_metadata(path, keys)` walks the header and the key/value pairs (GGUF v2 and v3, little
endian) and returns the values of the keys asked for: str, int, float, bool, list[str] for string
arrays, a NumPy array for numeric arrays. It exists because `gguf.GGUFReader` builds NumPy views
for every part of every array: for a 248k-token vocabulary (tokens + merges, ~500k strings) that
alone costs seconds, while this loop costs ~0.1 s. Faults raise GGUFError naming the file and the
key being read.
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import Any, Iterable

import numpy as np

from ..errors import GGUFError, GGUFFormatError

_MAGIC = b"GGUF"
# GGUF value types (gguf.GGUFValueType): scalar type -> (struct format, NumPy dtype)
_SCALAR = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
           4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
           10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


class _Cursor:
    """Reads little-endian values from a buffer at a moving offset; running off the end (a
    truncated file) raises GGUFError naming the key being read."""

    def __init__(self, buf, path: str):
        self.buf, self.path, self.off, self.key = buf, path, 0, "the header"
        self.size = len(buf)

    def fail(self, what: str) -> GGUFError:
        return GGUFFormatError(f"{self.path}: {what} (reading {self.key} at byte {self.off})")

    def need(self, n: int) -> None:
        if n < 0 or self.off + n > self.size:
            raise self.fail("truncated or malformed GGUF metadata")

    def u32(self) -> int:
        self.need(4)
        (v,) = _U32.unpack_from(self.buf, self.off)
        self.off += 4
        return v

    def u64(self) -> int:
        self.need(8)
        (v,) = _U64.unpack_from(self.buf, self.off)
        self.off += 8
        return v

    def raw_string(self) -> bytes:
        n = self.u64()
        self.need(n)
        s = self.buf[self.off:self.off + n]
        self.off += n
        return s

    def string(self) -> str:
        try:
            return self.raw_string().decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"a string that is not UTF-8 ({e.reason})") from None

    def scalar(self, vtype: int) -> Any:
        fmt, _ = _SCALAR[vtype]
        size = struct.calcsize(fmt)
        self.need(size)
        (v,) = struct.unpack_from(fmt, self.buf, self.off)
        self.off += size
        return v

    def value(self, vtype: int, keep: bool) -> Any:
        """The value of type vtype (None when not kept: only skipped over)."""
        if vtype in _SCALAR:
            v = self.scalar(vtype)
            return v if keep else None
        if vtype == _STRING:
            if keep:
                return self.string()
            self.raw_string()
            return None
        if vtype != _ARRAY:
            raise self.fail(f"unknown value type {vtype}")
        etype, n = self.u32(), self.u64()
        if etype in _SCALAR:
            dt = np.dtype(_SCALAR[etype][1]).newbyteorder("<")
            self.need(n * dt.itemsize)
            arr = None
            if keep:
                arr = np.frombuffer(self.buf, dt, count=n, offset=self.off).copy()
            self.off += n * dt.itemsize
            return arr
        if etype == _STRING:
            return self._strings(n, keep)
        if etype == _ARRAY:   # nested arrays: walk them (no known key needs them)
            out = [self.value(_ARRAY, keep) for _ in range(n)]
            return out if keep else None
        raise self.fail(f"unknown array element type {etype}")

    def _strings(self, n: int, keep: bool) -> list[str] | None:
        # one tight loop: this is the hot part for tokens (248k) and merges (247k)
        buf, off, size, unpack = self.buf, self.off, self.size, _U64.unpack_from
        out: list[bytes] = []
        append = out.append
        try:
            for _ in range(n):
                (ln,) = unpack(buf, off)
                off += 8
                end = off + ln
                if end > size:
                    raise IndexError
                append(buf[off:end])
                off = end
        except (IndexError, struct.error):
            self.off = off
            raise self.fail("truncated or malformed string array") from None
        self.off = off
        if not keep:
            return None
        try:
            # one decode of the whole array (NUL-joined) instead of one per string; a NUL inside
            # a string (never in a byte-level token, maybe in an added one) makes the count
            # differ: then decode one by one
            joined = b"\0".join(out).decode("utf-8").split("\0")
            return joined if len(joined) == n else [b.decode("utf-8") for b in out]
        except UnicodeDecodeError:
            for i, b in enumerate(out):
                try:
                    b.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise self.fail(f"element {i} is not UTF-8 ({e.reason})") from None
            raise


def read_metadata(path: str | os.PathLike[str],
                  keys: Iterable[str] | None = None) -> dict[str, Any]:
    """{key: value} of the GGUF's metadata: every key, or only those in `keys` that the file has
    (a key it lacks is simply absent from the result)."""
    path = os.fspath(path)
    want = None if keys is None else set(keys)
    if os.path.exists(path) and not os.path.isfile(path):   # before open(): a FIFO would block it
        raise GGUFError(f"{path}: not a regular file")
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot open ({e.strerror or e})") from e
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise GGUFFormatError(f"{path}: not a GGUF file ({size} bytes)")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise GGUFError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from e
        try:
            return _parse(mm, path, want)
        finally:
            mm.close()


def _parse(buf, path: str, want: set[str] | None) -> dict[str, Any]:
    if buf[:4] != _MAGIC:
        raise GGUFFormatError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r}, expected {_MAGIC!r})")
    c = _Cursor(buf, path)
    c.off = 4
    version = c.u32()
    if version not in (2, 3):
        what = "big-endian or unknown" if version > 0xFFFF else "unsupported"
        raise GGUFFormatError(f"{path}: GGUF version {version} ({what}; pyprefill reads versions 2 "
                              "and 3)")
    c.u64()                      # tensor count: the tensors are not read here
    n_kv = c.u64()
    out: dict[str, Any] = {}
    for i in range(n_kv):
        c.key = f"metadata key #{i}"
        key = c.string()
        c.key = f"'{key}'"
        vtype = c.u32()
        keep = want is None or key in want
        v = c.value(vtype, keep)
        if keep:
            out[key] = v
        if want is not None and len(out) == len(want):
            break                # everything asked for is here: skip the rest
    return out


__all__ = ["read_metadata"]
