"""A request layout compiled against one servable's signature: the fused serving path.

Every check `Signature.resolve_inputs` makes (names, dtypes, shapes, batch sizes), the
signature and the output filter depend only on a request's *layout*: what the native parser
reports apart from the values. So once one request of a layout has passed those checks, a
route remembers where each input sits in the parser's int64 values buffer, and every request
of that layout is served from the buffer it was parsed into: the ids of all bindings go to
the lookup plan in place (`LookupPlan.run_packed`, one native call, no per-input arrays, no
concatenate), dense inputs are views of it. Values never change what a route does; string
ids are hashed into their own slots of the buffer first.

Where the session group folds a Concat of graph inputs into one input
(`recserve.runtime.input_concat`) and every lookup feeds that Concat, the route writes the
folded input itself: dense columns from the buffer, and the plan's outputs (one float32
arena, [B, dim] blocks back to back) moved into their columns a block of alike outputs at
a time, instead of 26 views and a 27-way concatenate (28 us vs 3 us at batch 1).

Immutable once built; shared by every thread serving its servable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.embedding import IntegerKeys, StringKeys
from recserve.processor.signature import Signature

if TYPE_CHECKING:
    from recserve.runtime.input_concat import InputConcat
    from recserve.wire._codec_native import ParsedRequest, WireInput

__all__ = ["RequestRoute"]

_Reader = Callable[[np.ndarray, bytes], np.ndarray]


class _FoldedFeed:
    """How a route fills the folded Concat input `name` ([batch, width] float32): dense
    `columns` (start, stop, reader) and `blocks` (first column, arena offset, count, dim) of
    alike plan outputs standing side by side in both the arena and the Concat."""

    __slots__ = ("blocks", "column_inputs", "columns", "name", "width")

    def __init__(self, name: str, width: int, columns: tuple[tuple[int, int, _Reader], ...],
                 blocks: tuple[tuple[int, int, int, int], ...], column_inputs: tuple[str, ...] = ()) -> None:
        self.name = name
        self.width = width
        self.columns = columns
        self.blocks = blocks
        self.column_inputs = column_inputs   # the graph input of each of `columns`

    @classmethod
    def build(cls, concat: InputConcat, batch: int, part_widths: Mapping[str, int],
              dense: Mapping[str, _Reader], outputs: Sequence[tuple[str, int, int]]) -> _FoldedFeed | None:
        """`outputs`: (graph input, arena offset, dim) of every plan output, in plan order;
        None unless each of them and each dense part is a [batch, w] part of the Concat."""
        where, column = {}, 0
        for name in concat.parts:
            where[name] = column
            column += part_widths[name]
        if any(name not in where for name, _, _ in outputs):
            return None
        blocks: list[list[int]] = []
        for name, offset, dim in outputs:
            last = blocks[-1] if blocks else None
            if (last is not None and last[3] == dim and where[name] == last[0] + last[2] * dim
                    and offset == last[1] + last[2] * batch * dim):
                last[2] += 1
            else:
                blocks.append([where[name], offset, 1, dim])
        columns, column_inputs = [], []
        for name in concat.parts:
            if name in dense:
                columns.append((where[name], where[name] + part_widths[name], dense[name]))
                column_inputs.append(name)
            elif name not in {n for n, _, _ in outputs}:
                return None
        return cls(concat.output, column, tuple(columns), tuple(tuple(b) for b in blocks),  # type: ignore[misc]
                   tuple(column_inputs))

    def fill(self, arena: np.ndarray, values: np.ndarray, data: bytes, batch: int) -> np.ndarray:
        out = np.empty((batch, self.width), dtype=np.float32)
        for start, stop, read in self.columns:
            out[:, start:stop] = read(values, data)
        for column, offset, count, dim in self.blocks:
            out[:, column:column + count * dim].reshape(batch, count, dim)[...] = (
                arena[offset:offset + count * batch * dim].reshape(count, batch, dim).transpose(1, 0, 2)
            )
        return out


class RequestRoute:
    __slots__ = ("_bound", "_dense", "_folded", "_layout", "_plan", "_strings", "batch_size", "output_keys",
                 "output_names", "sources")

    def __init__(
        self,
        plan: Any,
        layout: Any,
        bound: tuple[str, ...],
        dense: tuple[tuple[str, _Reader, np.dtype[Any] | None], ...],
        strings: tuple[tuple[int, int, StringKeys | IntegerKeys], ...],
        outputs: Sequence[tuple[str, str]],
        batch_size: int,
        folded: _FoldedFeed | None = None,
        sources: Mapping[str, tuple[WireInput, np.dtype[Any]]] | None = None,
    ) -> None:
        self._plan = plan
        self._layout = layout          # the plan's packed layout of the bindings' ids
        self._bound = bound            # graph inputs the plan's outputs feed, in plan order
        self._dense = dense            # (graph input, reader, dtype to cast to or None)
        # (first, stop, keys) of string ids' (start, length) pairs, or of integer ids through an
        # integer vocabulary, to key in place
        self._strings = strings
        self.output_keys = tuple(key for key, _ in outputs)
        self.output_names = [name for _, name in outputs]
        self.batch_size = batch_size
        self._folded = folded          # set: the Concat input is filled here, see _FoldedFeed
        # Every dense graph input (folded or not): where it sits on the wire and the dtype it
        # is fed as; what recserve.processor.native_route compiles the route from.
        self.sources = dict(sources or {})

    @classmethod
    def build(
        cls,
        sig: Signature,
        plan: Any,
        dense: Sequence[tuple[str, str]],
        bound: Sequence[tuple[str, str, StringKeys | IntegerKeys | None]],
        parsed: ParsedRequest,
        arrays: Mapping[str, np.ndarray],
        outputs: Sequence[tuple[str, str]],
        concat: InputConcat | None = None,
    ) -> RequestRoute | None:
        """The route of `parsed`'s layout, given the arrays `sig.resolve_inputs` made of it
        (so the layout is known valid); None when the layout cannot be served in place."""
        wire = {sig.alias(inp.name): inp for inp in parsed.recipe.inputs}
        spans, strings = [], []
        for alias, _, keys in bound:
            inp, ids = wire[alias], arrays[alias]
            if isinstance(keys, StringKeys):
                strings.append((inp.slot, inp.slot + 2 * inp.count, keys))   # each key over its own pair
            elif not inp.int64_values:
                return None
            elif keys is not None:
                strings.append((inp.slot, inp.slot + inp.count, keys))   # integer ids keyed in place
            spans.append((inp.slot, ids.shape))
        readers, sources = [], {}
        for alias, graph_input in dense:
            inp, arr = wire[alias], arrays[alias]
            read = inp.reader()
            raw = read(parsed.values, parsed.data)
            if raw.shape != arr.shape:
                return None
            readers.append((graph_input, read, arr.dtype if raw.dtype != arr.dtype else None))
            sources[graph_input] = (inp, arr.dtype)
        batch = next((a.shape[0] for a in arrays.values() if a.ndim), 1)
        layout = plan.packed(spans)
        folded = None
        if concat is not None and bound:
            by_input = {graph_input: (arrays[alias], read) for (alias, graph_input), (_, read, _) in zip(dense, readers)}
            folded = cls._fold(concat, sig, bound, arrays, by_input, batch)
        if folded is not None:
            readers = [r for r in readers if r[0] not in concat.parts]  # type: ignore[union-attr]
        return cls(
            plan, layout, tuple(g for _, g, _ in bound), tuple(readers), tuple(strings),
            [(key, sig.outputs[alias].name) for key, alias in outputs], batch, folded, sources,
        )

    @staticmethod
    def _fold(concat: InputConcat, sig: Signature, bound: Sequence[tuple[str, str, StringKeys | IntegerKeys | None]],
              arrays: Mapping[str, np.ndarray], dense: Mapping[str, tuple[np.ndarray, _Reader]],
              batch: int) -> _FoldedFeed | None:
        """`dense`: graph input -> (its request array, its reader)."""
        outputs, widths, offset = [], {}, 0
        for alias, graph_input, _ in bound:
            binding = sig.inputs[alias].binding
            assert binding is not None
            ids = arrays[alias]
            shape = (*ids.shape, binding.dim) if binding.combiner == "none" else (ids.shape[0], binding.dim)
            if shape != (batch, binding.dim):
                return None
            outputs.append((graph_input, offset, binding.dim))
            widths[graph_input] = binding.dim
            offset += batch * binding.dim
        readers = {}
        for name in concat.parts:
            if name in dense:
                array, read = dense[name]
                if array.ndim != 2 or array.shape[0] != batch:
                    return None
                widths[name] = array.shape[1]
                readers[name] = read
            elif name not in widths:
                return None
        return _FoldedFeed.build(concat, batch, widths, readers, outputs)

    def feeds(self, parsed: ParsedRequest) -> dict[str, np.ndarray]:
        """The graph's inputs for a request of this route's layout. Consumes `parsed`: string
        ids are overwritten by their keys."""
        values, data = parsed.values, parsed.data
        for first, stop, keys in self._strings:
            keys.keys_at(data, values[first:stop])
        feeds = {
            name: read(values, data) if cast is None else read(values, data).astype(cast)
            for name, read, cast in self._dense
        }
        if self._folded is None:
            feeds.update(zip(self._bound, self._plan.run_packed(values, self._layout)))
        else:
            arena = self._plan.run_packed_flat(values, self._layout)
            feeds[self._folded.name] = self._folded.fill(arena, values, data, self.batch_size)
        return feeds
