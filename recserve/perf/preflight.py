"""One request before the load, so that a stopped server, a wrong --url or a wrong
--protocol ends the run at once with one clear line instead of a table of errors."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

from recserve.errors import RecserveError
from recserve.perf.payloads import Payload
from recserve.perf.served_signature import http_error_text

__all__ = ["preflight"]

_HINT = "is the server up, and are --url, --protocol and --model right?"


def _http(url: str, payload: Payload, protocol: str, timeout: float) -> None:
    request = urllib.request.Request(url + payload.path, data=payload.body, headers=dict(payload.headers),
                                     method="POST")
    what = f"{protocol} POST {url}{payload.path}"
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.URLError as exc:
        raise RecserveError(f"{http_error_text(exc, what)} ({_HINT})") from None
    except http.client.HTTPException:
        raise RecserveError(f"{what}: the answer is not HTTP/1.1 (is --protocol right, or is this a gRPC "
                            "port?)") from None
    except OSError as exc:
        raise RecserveError(f"{what} failed: {exc} ({_HINT})") from None


def _grpc(target: str, payload: Payload, protocol: str, timeout: float) -> None:
    import grpc

    with grpc.insecure_channel(target) as channel:
        try:
            channel.unary_unary(payload.method)(payload.data, timeout=timeout)
        except grpc.RpcError as exc:
            raise RecserveError(f"{protocol} {payload.method} at {target} failed: {exc.code().name}: "
                                f"{exc.details()} ({_HINT})") from None


def preflight(protocol: str, url: str, payload: Payload, timeout: float) -> None:
    """Send `payload` once; raise RecserveError (one line) unless it succeeds."""
    if payload.method:
        _grpc(url, payload, protocol, timeout)
    else:
        _http(url, payload, protocol, timeout)
