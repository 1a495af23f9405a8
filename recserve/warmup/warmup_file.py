"""Warmup files: the requests a new version answers before it serves.

Two formats, told apart by the first bytes:

- DeepRec's: the whole file is one serialized `PredictRequest`.
- recserve's: several requests as length-prefixed records after a magic line::

      b"recserve.warmup/1\\n"
      repeat: <uint32 little-endian n> <n bytes: one serialized PredictRequest>

  The file ends exactly after the last record; anything else (a truncated record, stray
  bytes) is an error naming the offset. A PredictRequest cannot begin with the magic:
  its first byte would be field 10 of PredictRequest, which does not exist.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

from recserve.errors import ConfigError

__all__ = ["MAGIC", "decode_warmup", "encode_warmup", "read_warmup_file", "write_warmup_file"]

MAGIC = b"recserve.warmup/1\n"
_LENGTH = struct.Struct("<I")


def encode_warmup(requests: Iterable[bytes]) -> bytes:
    """The record format for any number of requests (one included)."""
    parts = [MAGIC]
    for request in requests:
        if len(request) >= 1 << 32:
            raise ValueError(f"a warmup request of {len(request)} bytes does not fit a uint32 length")
        parts += [_LENGTH.pack(len(request)), bytes(request)]
    return b"".join(parts)


def decode_warmup(data: bytes, source: str = "warmup file") -> list[bytes]:
    """The serialized PredictRequests in `data` (either format). Requests are not parsed here."""
    if not data.startswith(MAGIC):
        return [data] if data else []
    out, offset = [], len(MAGIC)
    while offset < len(data):
        if offset + _LENGTH.size > len(data):
            raise ConfigError(f"{source}: truncated record length at byte {offset}", field="warmup_file_name")
        (n,) = _LENGTH.unpack_from(data, offset)
        start = offset + _LENGTH.size
        if start + n > len(data):
            raise ConfigError(
                f"{source}: the record at byte {offset} holds {n} bytes but only {len(data) - start} remain",
                field="warmup_file_name",
            )
        out.append(data[start:start + n])
        offset = start + n
    return out


def read_warmup_file(path: str | os.PathLike[str]) -> list[bytes]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"warmup_file_name {os.fspath(path)!r} cannot be read: {exc.strerror}",
                          field="warmup_file_name") from exc
    return decode_warmup(data, os.fspath(path))


def write_warmup_file(path: str | os.PathLike[str], requests: Iterable[bytes]) -> None:
    """Write `requests` in the record format, atomically (temp file, then rename)."""
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(encode_warmup(requests))
    os.replace(tmp, path)
