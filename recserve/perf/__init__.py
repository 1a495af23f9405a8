"""`recserve perf`: a load tester for any deployment that speaks EAS (HTTP, gRPC), KServe
v2 (HTTP, gRPC) or TF Serving REST (DESIGN §6).

    options            the command line and its parsing
    served_signature   the inputs the target serves, asked of the target
    traffic            requests from a file or synthesized (Zipf ids)
    payloads           requests encoded per protocol, once, before the load
    preflight          one request first: a clear error for a stopped server or wrong protocol
    connections        one client connection (HTTP/1.1 keep-alive, or gRPC)
    client_process     one client process's share of a point
    client_pool        the client processes and the split of connections among them
    server_metrics     the server's stage breakdown from /metrics
    results            a point's figures, the table, the JSON
    progress           the live progress line
    plot               PNG charts (matplotlib: `recserve[perf]`)
    run                the command, start to end
"""

from recserve.perf.options import PerfOptions, add_arguments, options_from_args
from recserve.perf.results import PointResult
from recserve.perf.run import run_perf

__all__ = ["PerfOptions", "PointResult", "add_arguments", "options_from_args", "run_perf"]
