"""The `recserve` command line (DESIGN §6)."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile


def _demo(args: argparse.Namespace) -> int:
    from recserve.export.demo import write_demo

    demo = write_demo(args.out)
    print(f"wrote demo model to {demo.root}; serve it with: recserve serve --config {demo.config_path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.workers != "1" and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # Before prometheus_client is imported: every process's metrics go to files there,
        # and /metrics on any worker sums them all.
        metrics_dir = tempfile.mkdtemp(prefix="recserve-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    else:
        metrics_dir = None
    from recserve.server import serve

    try:
        return serve(args.config, host=args.host, http_port=args.http_port, grpc_port=args.grpc_port,
                     workers=args.workers)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _perf(args: argparse.Namespace) -> int:
    from recserve.perf import options_from_args, run_perf

    return run_perf(options_from_args(args))


def _convert(args: argparse.Namespace) -> int:
    from recserve.convert import run_conversion

    print(run_conversion(args.savedmodel_dir, args.out_dir, args.signature, args.check), end="")
    return 0


def _lib_path(args: argparse.Namespace) -> int:
    from recserve.processor.cabi import library_path

    print(library_path())
    return 0


def _include_path(args: argparse.Namespace) -> int:
    from recserve.processor.cabi import include_dir

    print(include_dir())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="recserve", description="Serve recommendation models on ONNX Runtime.")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="write a small ready-to-serve model and its config.json")
    demo.add_argument("--out", required=True, help="directory to write (created)")
    demo.set_defaults(run=_demo)

    serve = sub.add_parser("serve", help="serve the models of a DeepRec/EAS JSON config over HTTP and gRPC")
    serve.add_argument("--config", required=True, help="path of the JSON config")
    serve.add_argument("--host", default=os.environ.get("RECSERVE_HOST", "127.0.0.1"),
                       help="address to listen on (default 127.0.0.1; env RECSERVE_HOST: the image sets 0.0.0.0)")
    serve.add_argument("--http-port", type=int, default=8080)
    serve.add_argument("--grpc-port", type=int, default=8500)
    serve.add_argument("--workers", default=os.environ.get("RECSERVE_WORKERS", "1"),
                       help="worker processes sharing one copy of the tables: N or 'auto' (one per usable CPU "
                            "divided by intra_op_parallelism_threads); 1 = one process (default; env RECSERVE_WORKERS)")
    serve.set_defaults(run=_serve)

    perf = sub.add_parser("perf", help="load-test a deployment: req/s and latency per batch and concurrency")
    from recserve.perf.options import add_arguments as add_perf_arguments

    add_perf_arguments(perf)
    perf.set_defaults(run=_perf)

    convert = sub.add_parser("convert", help="convert a TensorFlow SavedModel into a recserve model dir that "
                                            "serves without TensorFlow (needs recserve[tensorflow] here)")
    convert.add_argument("savedmodel_dir", help="the SavedModel (saved_model.pb + variables/)")
    convert.add_argument("out_dir", help="the model dir to write (must not exist)")
    convert.add_argument("--signature", default=None, help="the signature to serve (default: serving_default, or "
                                                           "the only one)")
    convert.add_argument("--check", type=int, default=0, metavar="N",
                         help="run TensorFlow and recserve on N synthesized requests; refuse above 1e-5")
    convert.set_defaults(run=_convert)

    lib = sub.add_parser("lib-path", help="print the absolute path of libserving_processor.so")
    lib.set_defaults(run=_lib_path)

    include = sub.add_parser("include-path", help="print the directory holding processor.h (the C ABI's header)")
    include.set_defaults(run=_include_path)

    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from recserve.errors import RecserveError

    try:
        return int(args.run(args))
    except RecserveError as exc:
        print(f"recserve: {exc.message}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name != "onnxruntime":
            raise
        print(f"recserve: {exc}", file=sys.stderr)  # names the extra to install (recserve.runtime)
        return 2


if __name__ == "__main__":
    sys.exit(main())
