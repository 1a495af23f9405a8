"""Helpers the HTTP routes share: the JSON error body, bounded body reads, admin auth."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from recserve.server.context import ServerContext
from recserve.server.errors import AdminAuthError, RequestTooLargeError

__all__ = ["error_response", "read_body", "require_admin"]


def error_response(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) one over `limit` bytes before reading it where the
    Content-Length says so, and as soon as it passes the limit otherwise."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        if int(declared) > limit:
            raise RequestTooLargeError(f"request body of {declared} bytes exceeds max_request_bytes ({limit})")
        return await request.body()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"request body exceeds max_request_bytes ({limit})")
        chunks.append(chunk)
    return b"".join(chunks)


def require_admin(ctx: ServerContext, request: Request) -> None:
    if not ctx.settings.admin_allowed(request.headers.get("authorization")):
        raise AdminAuthError(
            "admin routes need 'Authorization: Bearer <token>' with the server's admin token "
            "(config admin_token or RECSERVE_ADMIN_TOKEN)")
