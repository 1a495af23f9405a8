"""A request layout compiled against one servable's signature: the fused serving path.

Every check `Signature.resolve_inputs` makes (names, dtypes, shapes, batch sizes), the
signature and the output filter depend only on a request's *layout*: what the native parser
reports apart from the values. So once one request of a layout has passed those checks, a
route remembers where each input sits in the parser's int64 values buffer, and every request
of that layout is served from the buffer it was parsed into: the ids of all bindings go to
the lookup plan in place (`LookupPlan.run_packed`, one native call, no per-input arrays, no
concatenate), dense inputs are views of it. Values never change what a route does; string
ids are hashed into their own slots of the buffer first.

Immutable once built; shared by every thread serving its servable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.embedding import string_keys
from recserve.processor.signature import Signature

if TYPE_CHECKING:
    from recserve.wire._codec_native import ParsedRequest

__all__ = ["RequestRoute"]

_Reader = Callable[[np.ndarray, bytes], np.ndarray]


class RequestRoute:
    __slots__ = ("_bound", "_dense", "_layout", "_plan", "_strings", "batch_size", "output_keys", "output_names")

    def __init__(
        self,
        plan: Any,
        layout: Any,
        bound: tuple[str, ...],
        dense: tuple[tuple[str, _Reader, np.dtype[Any] | None], ...],
        strings: tuple[tuple[int, int, _Reader], ...],
        outputs: Sequence[tuple[str, str]],
        batch_size: int,
    ) -> None:
        self._plan = plan
        self._layout = layout          # the plan's packed layout of the bindings' ids
        self._bound = bound            # graph inputs the plan's outputs feed, in plan order
        self._dense = dense            # (graph input, reader, dtype to cast to or None)
        self._strings = strings        # (slot, count, reader) of string ids to hash in place
        self.output_keys = tuple(key for key, _ in outputs)
        self.output_names = [name for _, name in outputs]
        self.batch_size = batch_size

    @classmethod
    def build(
        cls,
        sig: Signature,
        plan: Any,
        dense: Sequence[tuple[str, str]],
        bound: Sequence[tuple[str, str, bool]],
        parsed: ParsedRequest,
        arrays: Mapping[str, np.ndarray],
        outputs: Sequence[tuple[str, str]],
    ) -> RequestRoute | None:
        """The route of `parsed`'s layout, given the arrays `sig.resolve_inputs` made of it
        (so the layout is known valid); None when the layout cannot be served in place."""
        wire = {sig.alias(inp.name): inp for inp in parsed.recipe.inputs}
        spans, strings = [], []
        for alias, _, is_string in bound:
            inp, ids = wire[alias], arrays[alias]
            if is_string:
                strings.append((inp.slot, inp.count, inp.reader()))   # 2 slots per string: room
            elif not inp.int64_values:
                return None
            spans.append((inp.slot, ids.shape))
        readers = []
        for alias, graph_input in dense:
            inp, arr = wire[alias], arrays[alias]
            read = inp.reader()
            raw = read(parsed.values, parsed.data)
            if raw.shape != arr.shape:
                return None
            readers.append((graph_input, read, arr.dtype if raw.dtype != arr.dtype else None))
        batch = next((a.shape[0] for a in arrays.values() if a.ndim), 1)
        return cls(
            plan, plan.packed(spans), tuple(g for _, g, _ in bound), tuple(readers), tuple(strings),
            [(key, sig.outputs[alias].name) for key, alias in outputs], batch,
        )

    def feeds(self, parsed: ParsedRequest) -> dict[str, np.ndarray]:
        """The graph's inputs for a request of this route's layout. Consumes `parsed`: string
        ids are overwritten by their keys."""
        values, data = parsed.values, parsed.data
        for slot, count, read in self._strings:
            values[slot:slot + count] = string_keys(read(values, data).reshape(-1))
        feeds = {
            name: read(values, data) if cast is None else read(values, data).astype(cast)
            for name, read, cast in self._dense
        }
        feeds.update(zip(self._bound, self._plan.run_packed(values, self._layout)))
        return feeds
