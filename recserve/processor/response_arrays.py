"""PredictResponse bytes of the native route (native/route.c, encode) -> {output: array}
in the order of its entries, the order the request asked for its outputs.

`OutputPlan` reads float and double outputs straight from the bytes by a plan made from a
layout's first response; `read_any` reads any response with the generated parser.
Immutable plans, pure functions: thread-safe.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from recserve.wire import codec

__all__ = ["OutputPlan", "read_any"]


def _varint_at(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def read_any(response: bytes) -> dict[str, np.ndarray]:
    """Any PredictResponse the native encoder writes, as arrays in its entries' order (the
    order of the request's outputs): the generated parser reads the values, a walk over the
    entries' heads the order (a protobuf map has none of its own). Each entry's key comes
    first (native/route.c, put_output)."""
    decoded = codec.decode_response(response)
    ordered, at = {}, 0
    while at < len(response):
        length, at = _varint_at(response, at + 1)
        key_length, start = _varint_at(response, at + 1)
        key = response[start:start + key_length].decode()
        ordered[key] = decoded[key]
        at += length
    return ordered


class OutputPlan:
    """Reads one layout's PredictResponse bytes into arrays without the generated parser: the
    (name, dtype, shape) of each output as the first response had them, each a float or
    double array (its values are the bytes after a fixed head: codec._entry_prefix). Later
    responses are checked to have the same heads at the same places."""

    __slots__ = ("entries", "size")

    def __init__(self, entries: tuple[tuple[str, bytes, int, np.dtype[Any], tuple[int, ...], int], ...],
                 size: int) -> None:
        self.entries = entries   # (key, head, its offset, dtype, shape, element count)
        self.size = size

    @classmethod
    def plan(cls, response: bytes) -> OutputPlan | None:
        """The plan for responses like `response`; None when an output is not a non-empty float
        or double array (those responses are read by `read_any`)."""
        decoded = read_any(response)
        entries, at = [], 0
        for key, arr in decoded.items():
            head = codec._entry_prefix(key, arr)
            if head is None or head[1] != arr.dtype or not response.startswith(head[0], at):
                return None
            entries.append((key, head[0], at, arr.dtype, arr.shape, arr.size))
            at += len(head[0]) + arr.nbytes
        plan = cls(tuple(entries), len(response))
        read = plan.read(response)
        if read is None or list(read) != list(decoded) or any(
                read[k].shape != decoded[k].shape or read[k].tobytes() != decoded[k].tobytes() for k in decoded):
            return None
        return plan

    def read(self, response: bytes) -> dict[str, np.ndarray] | None:
        if len(response) != self.size:
            return None
        outputs = {}
        for key, head, at, dtype, shape, count in self.entries:
            if not response.startswith(head, at):
                return None
            # A copy: aligned and writeable, as the Python route's arrays are.
            outputs[key] = np.frombuffer(response, dtype, count, at + len(head)).reshape(shape).copy()
        return outputs
