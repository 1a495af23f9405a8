"""`recserve perf`'s command line (DESIGN §6): the arguments and their parsing.

Every bad value is a ConfigError naming the option, what it got and what is valid.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from recserve.errors import ConfigError

__all__ = [
    "PROTOCOLS",
    "PerfOptions",
    "add_arguments",
    "options_from_args",
    "parse_batches",
    "parse_concurrency",
    "parse_duration",
    "parse_keys",
]

PROTOCOLS = ("eas-http", "eas-grpc", "kserve-http", "kserve-grpc", "tfserving", "tfserving-grpc")
_MAX_POINTS = 4096


@dataclass(frozen=True, kw_only=True)
class PerfOptions:
    url: str                     # http://host:port (HTTP protocols) or host:port (gRPC)
    protocol: str
    model: str
    batches: tuple[int, ...] | None   # None: requests from --requests, as they are
    concurrency: tuple[int, ...]
    duration: float              # seconds per point
    warmup: float                # seconds of unmeasured load before each point
    requests_file: str | None
    keys: tuple[int, int]        # [low, high) ids are drawn from
    zipf: float
    distinct: int                # distinct requests per point
    processes: int | None        # client processes; None: one per core, at most one per connection
    metrics_url: str | None      # where /metrics is; None: the target's own, for HTTP protocols
    json_path: str | None
    plot_path: str | None
    timeout: float


def parse_batches(text: str) -> tuple[int, ...]:
    """"1,64,512" -> (1, 64, 512)."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"--batch must be positive integers separated by commas (e.g. 1,64,512), got {text!r}",
                          field="--batch")
    return values


def parse_concurrency(text: str) -> tuple[int, ...]:
    """"1:64:x2" -> (1, 2, 4, ..., 64); "4:16:+4" -> (4, 8, 12, 16); "8" -> (8,); "1,8,32" as given."""
    valid = "N, N,M,... or START:STOP:xFACTOR / START:STOP:+STEP (e.g. 1:64:x2)"
    m = re.fullmatch(r"(\d+):(\d+):([x+])(\d+)", text)
    if m:
        start, stop, kind, step = int(m[1]), int(m[2]), m[3], int(m[4])
        if start < 1 or stop < start or (kind == "x" and step < 2) or (kind == "+" and step < 1):
            raise ConfigError(f"--concurrency {text!r}: need 1 <= START <= STOP and a factor >= 2 or a step >= 1; "
                              f"valid forms: {valid}", field="--concurrency")
        values, v = [], start
        while v <= stop and len(values) < _MAX_POINTS:
            values.append(v)
            v = v * step if kind == "x" else v + step
        return tuple(values)
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"--concurrency must be {valid}, got {text!r}", field="--concurrency")
    return tuple(values)


def parse_duration(text: str, option: str = "--duration") -> float:
    """"10s", "500ms", "2m" or a plain number of seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m)?", text.strip())
    if not m:
        raise ConfigError(f"{option} must be a time like 10s, 500ms or 2m, got {text!r}", field=option)
    seconds = float(m[1]) * {"ms": 1e-3, "s": 1.0, "m": 60.0, None: 1.0}[m[2]]
    if option == "--duration" and seconds <= 0:
        raise ConfigError(f"{option} must be more than zero, got {text!r}", field=option)
    return seconds


def parse_keys(text: str) -> tuple[int, int]:
    """"LOW:HIGH" (HIGH excluded) or "N" for 0:N."""
    try:
        low, high = (int(x) for x in text.split(":")) if ":" in text else (0, int(text))
    except ValueError:
        low, high = 0, 0
    if high <= low or low < 0:
        raise ConfigError(f"--keys must be LOW:HIGH with 0 <= LOW < HIGH (ids drawn from [LOW, HIGH)), or N "
                          f"for 0:N, got {text!r}", field="--keys")
    return low, high


def _check_url(url: str, protocol: str) -> str:
    grpc = protocol.endswith("grpc")
    if grpc:
        host_port = url.removeprefix("grpc://").removeprefix("http://").rstrip("/")
        if not re.fullmatch(r"[^/:\s]+:\d+", host_port):
            raise ConfigError(f"--url for {protocol} must be HOST:PORT (e.g. 127.0.0.1:8500), got {url!r}",
                              field="--url")
        return host_port
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(f"--url for {protocol} must be http://HOST[:PORT] (e.g. http://127.0.0.1:8080), "
                          f"got {url!r}", field="--url")
    return url.rstrip("/")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", required=True, help="the server: http://HOST:PORT for HTTP protocols, HOST:PORT for gRPC")
    add("--protocol", required=True, choices=PROTOCOLS)
    add("--model", default="default", help="model (KServe, TF Serving) or EAS service name (default: default)")
    add("--batch", default=None, help="rows per request, comma-separated (default 1,64; with --requests: "
                                      "the file's own)")
    add("--concurrency", default="1:64:x2", help="requests in flight: N, N,M,... or START:STOP:xFACTOR "
                                                 "(default 1:64:x2)")
    add("--duration", default="10s", help="measured time per point (default 10s)")
    add("--warmup", default="1s", help="unmeasured load before each point (default 1s)")
    add("--requests", default=None, metavar="FILE",
        help="requests to send: a warmup file (recserve's records or one DeepRec PredictRequest); "
             "default: synthesized from the served signature")
    add("--keys", default="0:100000", help="ids of synthesized requests come from [LOW, HIGH) (default 0:100000)")
    add("--zipf", type=float, default=1.1, help="Zipf exponent of synthesized ids, > 1 (default 1.1)")
    add("--distinct", type=int, default=64, help="distinct synthesized requests per batch size (default 64)")
    add("--processes", type=int, default=None, help="client processes (default: one per core)")
    add("--metrics-url", default=None, help="where the server's /metrics is (default: --url for HTTP "
                                            "protocols; none for gRPC)")
    add("--timeout", default="30s", help="per-request timeout (default 30s)")
    add("--json", default=None, metavar="FILE", help="write the results as JSON")
    add("--plot", default=None, metavar="FILE.png", help="draw throughput vs concurrency and latency CDFs "
                                                          "(needs recserve[perf])")


def options_from_args(args: argparse.Namespace) -> PerfOptions:
    if not args.zipf > 1.0:
        raise ConfigError(f"--zipf must be more than 1.0 (numpy's Zipf), got {args.zipf}", field="--zipf")
    if args.distinct < 1:
        raise ConfigError(f"--distinct must be at least 1, got {args.distinct}", field="--distinct")
    if args.processes is not None and args.processes < 1:
        raise ConfigError(f"--processes must be at least 1, got {args.processes}", field="--processes")
    if args.requests is not None and not os.path.isfile(args.requests):
        raise ConfigError(f"--requests {args.requests!r} is not a readable file", field="--requests")
    batch = args.batch if args.batch is not None else (None if args.requests else "1,64")
    return PerfOptions(
        url=_check_url(args.url, args.protocol), protocol=args.protocol, model=args.model,
        batches=parse_batches(batch) if batch is not None else None,
        concurrency=parse_concurrency(args.concurrency), duration=parse_duration(args.duration),
        warmup=parse_duration(args.warmup, "--warmup"), requests_file=args.requests,
        keys=parse_keys(args.keys), zipf=args.zipf, distinct=args.distinct, processes=args.processes,
        metrics_url=args.metrics_url.rstrip("/") if args.metrics_url else None,
        json_path=args.json, plot_path=args.plot, timeout=parse_duration(args.timeout, "--timeout"),
    )
