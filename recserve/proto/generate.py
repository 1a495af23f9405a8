"""Regenerate `recserve/proto/` from every `proto/*.proto`: `python -m recserve.proto.generate`.

Runs grpc_tools' bundled protoc, so the output depends only on the installed grpcio-tools
version. protoc writes imports between generated modules as top-level imports
(`import predict_pb2 as predict__pb2`); they are rewritten to package-relative form
(`from recserve.proto import predict_pb2 as predict__pb2`) so the modules import from
anywhere without touching sys.path. gRPC stubs (`*_pb2_grpc.py`) are written only for
files that declare a service.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

PACKAGE = "recserve.proto"
ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
OUT_DIR = Path(__file__).resolve().parent

# Everything generate() writes; files in OUT_DIR matching these and not regenerated are
# stale leftovers of a deleted .proto and are removed.
GENERATED_GLOBS = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")

_TOP_LEVEL_IMPORT = re.compile(r"^import (\w+_pb2(?:_grpc)?) as (\w+)$", re.M)


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc  # test/dev dependency only: serving never regenerates

    include = Path(protoc.__file__).resolve().parent / "_proto"  # google/protobuf/*.proto
    # In a process of its own: protoc's C++ in a process that has loaded TensorFlow (which
    # carries its own protobuf C++) crashes.
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{include}", *args], check=False,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"protoc failed (exit {done.returncode}) for: {' '.join(args)}: {done.stderr.strip()}")


def _files_with_services(sources: list[str], proto_dir: Path, scratch: Path) -> list[str]:
    descriptor_set = scratch / "descriptors.pb"
    _protoc([f"-I{proto_dir}", f"--descriptor_set_out={descriptor_set}", *sources])
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes()).file
    return [f.name for f in files if f.service]


def _make_package_relative(path: Path) -> None:
    text = path.read_text()
    fixed = _TOP_LEVEL_IMPORT.sub(rf"from {PACKAGE} import \1 as \2", text)
    if fixed != text:
        path.write_text(fixed)


def generate(proto_dir: Path = PROTO_DIR, out_dir: Path = OUT_DIR) -> list[Path]:
    """Compile every `proto_dir/*.proto` into `out_dir`; returns the files written, sorted."""
    sources = sorted(p.name for p in proto_dir.glob("*.proto"))
    if not sources:
        raise RuntimeError(f"no .proto files in {proto_dir}")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        build = scratch / "out"
        build.mkdir()
        _protoc([f"-I{proto_dir}", f"--python_out={build}", f"--pyi_out={build}", *sources])
        services = _files_with_services(sources, proto_dir, scratch)
        if services:
            _protoc([f"-I{proto_dir}", f"--grpc_python_out={build}", *services])
        written = sorted(build.glob("*.py*"))
        for path in written:
            _make_package_relative(path)
        out_dir.mkdir(parents=True, exist_ok=True)
        fresh = {p.name for p in written}
        for pattern in GENERATED_GLOBS:
            for old in out_dir.glob(pattern):
                if old.name not in fresh:
                    old.unlink()
        for path in written:
            shutil.copyfile(path, out_dir / path.name)
    return sorted(out_dir / name for name in fresh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-dir", type=Path, default=PROTO_DIR)
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    for path in generate(args.proto_dir, args.out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
