"""Fixtures for the C ABI tests: the built library, a C host compiled with the system
compiler (cabi_client.c), the demo model, and record files in the client's format."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from recserve import Processor
from recserve.export.demo import DemoModel, write_demo
from recserve.processor.cabi import include_dir, library_path
from recserve.wire.codec import encode_request

HERE = Path(__file__).resolve().parent


# `make test-sanitize`: the library under test is built with ASan/UBSan, so the host needs
# the sanitizer runtime preloaded and its options, like any host of such a build.
_SANITIZER_VARIABLES = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")


def host_env() -> dict[str, str]:
    """A host that knows nothing of Python: no PYTHONPATH, no venv, no PYTHONHOME."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    env.update({name: os.environ[name] for name in _SANITIZER_VARIABLES if name in os.environ})
    return env


def compile_c(source: Path, out: Path, *extra: str) -> Path:
    cc = shutil.which("cc") or pytest.fail("no system C compiler (cc) on PATH")
    subprocess.run(
        [
            cc,
            "-std=c11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
            f"-I{include_dir()}",  # the header recserve ships
            *extra,
            str(source),
            "-o",
            str(out),
            "-ldl",
        ],
        check=True,
        capture_output=True,
    )
    return out


@dataclass(frozen=True)
class Client:
    """Runs cabi_client (a non-Python process) against the built library."""

    binary: Path
    library: str
    workdir: Path

    def run(
        self, mode: str, *args: object, timeout: float = 120, wrapper: Sequence[str] = ()
    ) -> subprocess.CompletedProcess[str]:
        return self.execute(
            [*wrapper, str(self.binary), self.library, mode, *map(str, args)], timeout
        )

    @staticmethod
    def execute(cmd: Sequence[object], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(map(str, cmd)),
            env=host_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def compile(self, source: Path, name: str, *extra: str) -> Path:
        return compile_c(source, self.workdir / name, *extra)

    def requests_file(self, name: str, requests: Sequence[bytes]) -> Path:
        path = self.workdir / name
        path.write_bytes(b"".join(struct.pack("<I", len(r)) + r for r in requests))
        return path

    def replies_file(self, name: str, replies: Sequence[tuple[int, bytes]]) -> Path:
        path = self.workdir / name
        path.write_bytes(b"".join(struct.pack("<iI", s, len(b)) + b for s, b in replies))
        return path

    def read_replies(self, name: str) -> list[tuple[int, bytes]]:
        data, replies, at = (self.workdir / name).read_bytes(), [], 0
        while at < len(data):
            status, size = struct.unpack_from("<iI", data, at)
            replies.append((status, data[at + 8 : at + 8 + size]))
            at += 8 + size
        return replies

    def config_file(self, name: str, text: str) -> Path:
        path = self.workdir / name
        path.write_text(text, encoding="utf-8")
        return path


@pytest.fixture(scope="session")
def client(tmp_path_factory: pytest.TempPathFactory) -> Client:
    workdir = tmp_path_factory.mktemp("cabi")
    binary = compile_c(HERE / "cabi_client.c", workdir / "cabi_client")
    return Client(binary, library_path(), workdir)


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    return write_demo(tmp_path_factory.mktemp("cabi_demo"))


@pytest.fixture(scope="session")
def processor(demo: DemoModel) -> Iterator[Processor]:
    p = Processor(demo.config_path.read_text())
    yield p
    p.close()


@pytest.fixture(scope="session")
def make_requests() -> Callable[..., list[bytes]]:
    def make(
        demo: DemoModel, count: int, *, batch: int = 1, min_batch: int = 1, seed: int = 0
    ) -> list[bytes]:
        """`count` valid requests, batch sizes `min_batch`..`batch`, every third asking for
        one output only."""
        rng = np.random.default_rng(seed)
        requests = []
        for i in range(count):
            inputs = demo.sample_inputs(int(rng.integers(min_batch, batch + 1)), rng)
            output_filter = ("probabilities",) if i % 3 == 1 else ()
            requests.append(encode_request(inputs, output_filter=output_filter))
        return requests

    return make
