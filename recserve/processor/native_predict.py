"""`Processor.predict` on the native request route (native/route_values.inc, DESIGN §10).

The KServe v2 and TF Serving REST handlers call `predict` with arrays they parsed from JSON.
Instead of the Python route, those arrays go to the same compiled routes
`Processor.process` uses, handed over as the C parser would have left the equivalent
PredictRequest: its *layout* bytes (native/codec.h) and one buffer of values, packed with a
few numpy steps (recserve.processor.request_packing). The response comes back as
PredictResponse bytes, read into arrays by a plan cached per layout (float and double
outputs) or by the generated parser (recserve.processor.response_arrays).

Soundness. A layout's plan (`Packing`) is made once per request shape (signature, input
names, dtypes, shapes, output filter) and checked then against the C parser itself: the
request encoded (`codec.encode_request`) and parsed must give the same layout, and its
recipe must read the same arrays out of our values as out of the parser's. Equal layout
bytes then mean the route answers what `Processor.process` would for those bytes, which the
native route's tests hold equal to the Python route. Anything else -- a dtype the wire has
no kind for (uint32, float16 fed natively, ...), a string that is neither str nor bytes, a
layout with no route, an output the native encoder does not write, any error -- returns None and
`Processor.predict` takes the Python route, which owns every error message.

Thread-safe: the caches are dicts whose races only cost a recomputation.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.errors import RecserveError
from recserve.processor import native_route, request_packing
from recserve.processor.request_packing import Packing
from recserve.processor.response_arrays import OutputPlan, read_any
from recserve.wire import codec

if TYPE_CHECKING:
    from recserve.processor.manager import ServableManager
    from recserve.processor.servable import Servable
    from recserve.processor.trace import RequestTrace

__all__ = ["NativePredict"]

log = logging.getLogger("recserve.processor")

_ROUTE_MISS = native_route.FALLBACK_REASONS.index("route_miss")
_INFO_REASON = 7        # RS_INFO_REASON: the last of process_values's info
_CACHE_LIMIT = 1024     # request shapes (and layouts tried per version) remembered


def _fill_trace(trace: RequestTrace, info: tuple[int, ...]) -> None:
    """The stages `Servable.predict` traces, "lookup" and "run" (the response's encoding in C
    counted with the run); the caller traces its own decode and encode."""
    from recserve.processor.trace import Span

    servable_id, batch, t0, _, t2, _, t4, _ = info   # _route_call.process_values's (RS_INFO_*)
    native_route.trace_served_by(trace, servable_id, batch)
    trace.released_ns = t4 - t0
    trace.spans.extend((Span("lookup", t0, t2), Span("run", t2, t4)))


# The GIL released around the C call only (native/route_call.c), as for `process`.
_process_values = native_route._CALL.process_values if native_route._CALL is not None else None
_NO_PACKING: Any = object()


class NativePredict:
    """One Processor's hand-off of `predict` calls to its native route."""

    def __init__(self, manager: ServableManager[Servable]) -> None:
        self._manager = manager
        self._slot = manager.route_slot
        # (signature, filter, ((name, dtype, shape), ...)) -> Packing, or None: Python only.
        self._packings: dict[Any, Packing | None] = {}
        # layout -> the plan its responses are read by (None: read_any).
        self._outputs: dict[bytes, OutputPlan | None] = {}
        # Layouts whose route a version was already asked to build (never twice per version).
        self._tried: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()

    def predict(self, inputs: Mapping[str, Any], output_filter: Sequence[str] | None, signature_name: str | None,
                trace: RequestTrace | None) -> dict[str, np.ndarray] | None:
        """`Servable.predict`'s answer served natively, or None: take the Python route."""
        if _process_values is None or self._slot._native is None or self._slot.address is None:
            return None
        if trace is not None and trace.want_ort_profile:
            return None
        try:
            names = tuple(inputs)
            arrays = [v if type(v) is np.ndarray else np.asarray(v) for v in inputs.values()]
            signature = signature_name or ""
            wanted = tuple(output_filter) if output_filter else ()
            key = (signature, wanted, names, *[(a.dtype, a.shape) for a in arrays])
            packing = self._packings.get(key, _NO_PACKING)
        except (TypeError, ValueError):
            return None   # the Python route says what is wrong with it
        if packing is _NO_PACKING:
            packing = self._new_packing(key, signature, wanted, names, arrays)
        if packing is None:
            return None
        packed = packing.values(arrays)
        if packed is None:
            return None
        values, data = packed
        layout = packing.layout
        response, info = _process_values(self._slot.address, layout, values, data)
        if response is None:
            if info[_INFO_REASON] == _ROUTE_MISS:
                self._build_route(layout, signature, wanted, names, arrays)
            return None
        reader = self._outputs.get(layout, _NO_PACKING)
        if reader is _NO_PACKING:
            if len(self._outputs) >= _CACHE_LIMIT:
                self._outputs.clear()
            reader = self._outputs[layout] = OutputPlan.plan(response)
        outputs = reader.read(response) if reader is not None else None
        if outputs is None:
            if reader is not None:
                self._outputs.pop(layout, None)   # other shapes than before (a new version): plan again
            outputs = read_any(response)
        if trace is not None:
            _fill_trace(trace, info)
        return outputs

    def _new_packing(self, key: Any, signature: str, wanted: tuple[str, ...], names: tuple[str, ...],
                     arrays: list[np.ndarray]) -> Packing | None:
        try:
            packing = request_packing.packing(signature, wanted, names, arrays)
            if packing is not None and not request_packing.checked(packing, signature, wanted, names, arrays):
                packing = None
        except (AttributeError, TypeError, ValueError):   # a name or filter that is not text, unencodable text
            packing = None
        if len(self._packings) >= _CACHE_LIMIT:
            self._packings.clear()
        self._packings[key] = packing
        return packing

    def _build_route(self, layout: bytes, signature: str, wanted: tuple[str, ...], names: tuple[str, ...],
                     arrays: list[np.ndarray]) -> None:
        """Asks the current version to build and register the layout's route, as the first
        `process` of it would (once per version: invalid requests fail in Python each time)."""
        with self._manager.acquire() as servable:
            native = servable.native
            if native is None:
                return
            tried = self._tried.setdefault(native, set())
            if layout in tried:
                return
            if len(tried) >= _CACHE_LIMIT:
                tried.clear()
            tried.add(layout)
            parsed = codec.parse_request(request_packing.request_bytes(signature, wanted, names, arrays))
            if parsed is None or parsed.layout != layout:
                return
            try:
                servable.route(parsed)
            except RecserveError:
                pass   # the Python route raises it for this request again, with its message
            except Exception:   # a bug: logged; the Python route answers the request
                log.exception("native predict: building the route of a layout failed")

