"""HTTP routes about the server rather than predictions: health, model listing and
metadata (KServe v2 and TF Serving forms), admin version pins and warmup recording, and
/metrics."""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from recserve import __version__
from recserve.errors import RequestError
from recserve.server import kserve, tfserving
from recserve.server.context import ServerContext, check_version
from recserve.server.http_common import error_response, read_body, require_admin
from recserve.server.metrics import CONTENT_TYPE
from recserve.server.registry import ModelEntry

__all__ = ["model_status", "status_router"]

SERVER_NAME = "recserve"
PLATFORM = "onnxruntime_onnx"


DEFAULT_WARMUP_REQUESTS = 64
MAX_WARMUP_REQUESTS = 10_000


def _admin_json(body: bytes, shape: str) -> dict[str, Any]:
    try:
        doc = json.loads(body or b"{}")
    except ValueError as exc:
        raise RequestError(f"body must be JSON {shape}: {exc}") from exc
    if not isinstance(doc, dict):
        raise RequestError(f"body must be JSON {shape}")
    return doc


def model_status(entry: ModelEntry) -> dict[str, Any]:
    """Listing entry: load state plus the processor's model_info (secrets never in it)."""
    processor = entry.processor
    info = processor.model_info() if processor is not None else {}
    status = {
        "name": entry.name,
        "state": "READY" if entry.ready else ("UNAVAILABLE" if entry.state == "failed" else "LOADING"),
        "ready": entry.ready,
        "version": info.get("version"),
        "global_step": info.get("global_step"),
        "update_time": info.get("update_time"),
        "pinned_version": info.get("pinned_version"),
        "delta_step": info.get("delta_step"),
        "last_error": entry.last_error or info.get("last_error"),
        # A version loading now: percent, rate, ETA (in a worker process: the leader's load).
        "load": info["load"] if "load" in info else entry.progress.snapshot(),
    }
    if "worker" in info:
        status["worker"] = info["worker"]  # which worker process answered
    return status


def status_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()
    models = ctx.models

    def ready_response(ready: bool, what: str) -> Response:
        if ready:
            return JSONResponse({"ready": True})
        return error_response(503, f"{what} not ready")

    # -- health ------------------------------------------------------------------------------

    @router.get("/v2/health/live")
    async def live() -> Response:
        return JSONResponse({"live": True})

    @router.get("/v2/health/ready")
    async def ready() -> Response:
        waiting = [name for name, e in models.entries.items() if not e.ready]
        return ready_response(models.ready, "models " + ", ".join(waiting) + " are" if waiting else "server is")

    # -- listing and metadata ------------------------------------------------------------------

    @router.get("/models")
    async def listing() -> Response:
        return JSONResponse({"models": [model_status(e) for e in models.entries.values()]})

    @router.get("/v2")
    async def server_metadata() -> Response:
        return JSONResponse({"name": SERVER_NAME, "version": __version__, "extensions": ["binary_tensor_data"]})

    @router.post("/v2/repository/index")
    async def repository_index() -> Response:
        rows = []
        for entry in models.entries.values():
            status = model_status(entry)
            row = {"name": entry.name, "version": status["version"] or "", "state": status["state"]}
            if status["last_error"]:
                row["reason"] = status["last_error"]
            rows.append(row)
        return JSONResponse(rows)

    def v2_metadata(name: str, version: str | None) -> dict[str, Any]:
        entry = models.get(name)
        with entry.lease() as processor:
            check_version(entry, processor, version)
            sig = processor.signature_info()
            return {
                "name": name, "versions": [str(processor.model_info()["version"])], "platform": PLATFORM,
                "inputs": kserve.tensor_metadata(sig["inputs"]), "outputs": kserve.tensor_metadata(sig["outputs"]),
            }

    @router.get("/v2/models/{name}")
    async def v2_model(name: str) -> Response:
        return JSONResponse(await run_in_threadpool(v2_metadata, name, None))

    @router.get("/v2/models/{name}/versions/{version}")
    async def v2_model_version(name: str, version: str) -> Response:
        return JSONResponse(await run_in_threadpool(v2_metadata, name, version))

    def v2_ready(name: str, version: str | None) -> Response:
        entry = models.get(name)
        if not entry.ready:
            return ready_response(False, f"model {name!r} is")
        with entry.lease() as processor:
            check_version(entry, processor, version)
        return ready_response(True, "")

    @router.get("/v2/models/{name}/ready")
    async def v2_model_ready(name: str) -> Response:
        return await run_in_threadpool(v2_ready, name, None)

    @router.get("/v2/models/{name}/versions/{version}/ready")
    async def v2_model_version_ready(name: str, version: str) -> Response:
        return await run_in_threadpool(v2_ready, name, version)

    @router.get("/v1/models/{name}")
    async def tf_status(name: str) -> Response:
        status = model_status(models.get(name))
        state = {"READY": "AVAILABLE", "LOADING": "LOADING", "UNAVAILABLE": "END"}[status["state"]]
        error = {"error_code": "OK", "error_message": ""}
        if status["last_error"] and not status["ready"]:
            error = {"error_code": "UNAVAILABLE", "error_message": status["last_error"]}
        versions = [{"version": str(status["version"] or ""), "state": state, "status": error}]
        load = status["load"]
        if load is not None:
            message = f"{load['percent']}% of {load['bytes_total']} bytes, ETA {load['eta_seconds']} s"
            loading = {"version": load["loading"].removeprefix("version "), "state": "LOADING",
                       "status": {"error_code": "OK", "error_message": message}}
            versions = [loading] if not status["version"] else [*versions, loading]
        return JSONResponse({"model_version_status": versions})

    def tf_metadata(name: str) -> dict[str, Any]:
        entry = models.get(name)
        with entry.lease() as processor:
            sig = processor.signature_info()
            return {
                "model_spec": {"name": name, "signature_name": "",
                               "version": str(processor.model_info()["version"])},
                "metadata": {"signature_def": {"signature_def": {
                    sig["signature_name"]: tfserving.signature_def(sig)}}},
            }

    @router.get("/v1/models/{name}/metadata")
    async def tf_model_metadata(name: str) -> Response:
        return JSONResponse(await run_in_threadpool(tf_metadata, name))

    # -- admin -------------------------------------------------------------------------------

    async def admin_call(request: Request, name: str, shape: str) -> tuple[ModelEntry, dict[str, Any]]:
        """The admin check, the model, and the JSON object body of the given `shape`."""
        require_admin(ctx, request)
        entry = models.get(name)
        return entry, _admin_json(await read_body(request, 1 << 16), shape)

    @router.post("/admin/models/{name}/pin")
    async def pin(name: str, request: Request) -> Response:
        entry, doc = await admin_call(request, name, '{"version": "<version directory name>"}')
        version = doc.get("version")
        if not isinstance(version, str) or not version:
            raise RequestError('body must be JSON {"version": "<version directory name>"}')
        await run_in_threadpool(entry.pin, version)
        return JSONResponse(model_status(entry))

    @router.post("/admin/models/{name}/unpin")
    async def unpin(name: str, request: Request) -> Response:
        require_admin(ctx, request)
        entry = models.get(name)
        await run_in_threadpool(entry.pin, None)
        return JSONResponse(model_status(entry))

    @router.post("/admin/models/{name}/warmup/record")
    async def warmup_record(name: str, request: Request) -> Response:
        entry, doc = await admin_call(request, name, '{"requests": <1..10000>} (optional)')
        limit = doc.get("requests", DEFAULT_WARMUP_REQUESTS)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_WARMUP_REQUESTS:
            raise RequestError(f'"requests" must be an integer 1..{MAX_WARMUP_REQUESTS}, got {limit!r}')
        entry.start_recording(limit)
        return JSONResponse({"model": name, "recording": True, "requests": limit})

    @router.post("/admin/models/{name}/warmup/save")
    async def warmup_save(name: str, request: Request) -> Response:
        entry, doc = await admin_call(request, name, '{"path": "<absolute path of the file to write>"}')
        path = doc.get("path")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise RequestError(f'"path" must be an absolute file path on the server, got {path!r}')
        return JSONResponse(await run_in_threadpool(entry.save_recording, path))

    # -- metrics -----------------------------------------------------------------------------

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(await run_in_threadpool(ctx.metrics.render), media_type=CONTENT_TYPE)

    return router
