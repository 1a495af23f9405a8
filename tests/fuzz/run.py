"""Builds and runs recserve's fuzz targets (RELIABILITY.md says what each covers).

    python tests/fuzz/run.py [--seconds N] [--ci] [--merge] [TARGET ...]

Default (a campaign, `make fuzz FUZZ_SECONDS=N`): each target runs N seconds on a working
corpus under build/fuzz/corpus/<target> that starts from the checked-in one and grows
across campaigns, then prints one line per target: executions, coverage, corpus, result.
--merge then adds the inputs that reached new coverage to tests/fuzz/corpus/<target>.
--ci (the short run `make test` does, through test_fuzz_corpus.py): every checked-in input
once, then N seconds of fuzzing on a throwaway copy; any crash fails.

C targets are built with clang's libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer
straight from native/ (not the Python package's libraries); the Python target runs under
atheris. Findings go to build/fuzz/artifacts/<target>-crash-<sha1>.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = ROOT / "build" / "fuzz"
SANITIZE = ["-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all"]
ENGINE = ["native/embedding.c", "native/embedding_arena.c", "native/embedding_keys.c", "native/embedding_ssd.c", "native/embedding_tier.c"]
# Leaks are findings; the Python target's interpreter is not instrumented and frees
# nothing at exit, so it runs without ASan (atheris' own libFuzzer).
ASAN_OPTIONS = "detect_leaks=1:abort_on_error=1:symbolize=1"
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1"


@dataclass(frozen=True)
class Target:
    name: str
    source: str                           # the harness, relative to the repository root
    native: tuple[str, ...] = ()          # C sources it links; empty for a Python target
    flags: tuple[str, ...] = ()
    max_len: int = 4096
    corpus_of: str = ""                   # another target whose corpus it shares (same input format)

    @property
    def corpus(self) -> Path:
        return HERE / "corpus" / (self.corpus_of or self.name)


TARGETS = {
    t.name: t
    for t in [
        Target("codec", "tests/fuzz/fuzz_codec.c", ("native/codec.c",)),
        # Pooled sums are checked bit for bit, as the engine is built (setup.py).
        Target("engine", "tests/fuzz/fuzz_engine.c", tuple(ENGINE), ("-ffp-contract=off", "-pthread", "-lm"), 512),
        Target("ssd", "tests/fuzz/fuzz_ssd.c", tuple(ENGINE), ("-pthread", "-lm"), 256),
        # The native request route, with the codec and the engine it calls.
        Target("route", "tests/fuzz/fuzz_route.c", ("native/route.c", "native/route_vocabulary.c",
                                                   "native/route_int_vocabulary.c", "native/codec.c", *ENGINE),
               ("-ffp-contract=off", "-pthread", "-lm")),
        Target("checkpoint", "tests/fuzz/fuzz_checkpoint.py", max_len=2048),
        Target("codec_parity", "tests/fuzz/fuzz_codec_parity.py", corpus_of="codec"),
        # fuzz_codec_tfs.c includes fuzz_codec.c (its layout checks); codec_tfs.inc is in codec.c.
        Target("codec_tfs", "tests/fuzz/fuzz_codec_tfs.c", ("native/codec.c",)),
        Target("codec_tfs_parity", "tests/fuzz/fuzz_codec_tfs_parity.py", corpus_of="codec_tfs"),
        # The gRPC front end's TF Serving ModelSpec reader and writer.
        Target("tfs_spec", "tests/fuzz/fuzz_tfs_spec.c", ("native/tfs_spec.c",), max_len=512),
    ]
}


def clang() -> str:
    found = shutil.which("clang")
    if found is None:
        raise SystemExit("clang is not installed: run `make clang` (apt-get install clang libclang-rt-dev)")
    return found


def build(target: Target) -> list[str]:
    """The command that runs `target` (building the C ones when a source changed)."""
    if not target.native:
        return [sys.executable, str(ROOT / target.source)]
    binary = BUILD / f"fuzz_{target.name}"
    sources = [ROOT / target.source, *(ROOT / s for s in target.native), *ROOT.glob("native/*.h"),
               *ROOT.glob("native/*.inc"), *HERE.glob("*.h"), *HERE.glob("fuzz_codec*.c")]
    if not binary.exists() or binary.stat().st_mtime < max(s.stat().st_mtime for s in sources):
        BUILD.mkdir(parents=True, exist_ok=True)
        cmd = [clang(), "-g", "-O1", *SANITIZE, "-Inative", target.source, *target.native, *target.flags,
               "-o", str(binary)]
        subprocess.run(cmd, cwd=ROOT, check=True)
    return [str(binary)]


def environment(target: Target) -> dict[str, str]:
    env = dict(os.environ, ASAN_OPTIONS=ASAN_OPTIONS, UBSAN_OPTIONS=UBSAN_OPTIONS)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    # Record files of the engine targets: a tmpfs when there is one (every input makes some).
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        env["TMPDIR"] = str(shm)
    return env


@dataclass
class Result:
    target: str
    executions: int
    coverage: int        # libFuzzer's "cov": code edges (C) / Python branches (atheris) reached
    edges: int           # C: instrumented edges in all (harness and native/ sources); Python: 0
    features: int
    corpus: int
    ok: bool
    output: str

    def line(self) -> str:
        cov = f"{self.coverage}/{self.edges}" if self.edges else str(self.coverage)
        return (f"{self.target:<13} executions={self.executions:<10} cov={cov:<10} ft={self.features:<7}"
                f" corpus={self.corpus:<6} {'ok' if self.ok else 'FAILED'}")


def _run(target: Target, args: list[str], timeout: float) -> Result:
    BUILD.joinpath("artifacts").mkdir(parents=True, exist_ok=True)
    cmd = [*build(target), f"-max_len={target.max_len}", "-print_final_stats=1", "-timeout=30",
           f"-artifact_prefix={BUILD / 'artifacts'}/{target.name}-", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=environment(target), capture_output=True, text=True,
                          timeout=timeout, check=False)
    out = proc.stdout + proc.stderr
    executions = re.findall(r"stat::number_of_executed_units: (\d+)", out)
    progress = re.findall(r"#\d+\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)", out)
    cov, ft, corpus = map(int, progress[-1]) if progress else (0, 0, 0)
    edges = re.findall(r"\((\d+) inline 8-bit counters\)", out) if target.native else []
    return Result(target.name, int(executions[-1]) if executions else 0, cov, int(edges[0]) if edges else 0, ft,
                  corpus, proc.returncode == 0, out)


def campaign(target: Target, seconds: int) -> Result:
    work = BUILD / "corpus" / target.name
    work.mkdir(parents=True, exist_ok=True)
    return _run(target, [f"-max_total_time={seconds}", str(work), str(target.corpus)], seconds * 2 + 600)


def merge(target: Target) -> None:
    """Adds the working corpus' inputs that reach coverage the checked-in one does not."""
    work = BUILD / "corpus" / target.name
    subprocess.run([*build(target), "-merge=1", f"-max_len={target.max_len}", str(target.corpus), str(work)],
                   cwd=ROOT, env=environment(target), check=True, capture_output=True)


def ci(target: Target, seconds: int) -> Result:
    """Every checked-in input once, then `seconds` of fuzzing from them on a throwaway copy."""
    replay = _run(target, ["-runs=0", str(target.corpus)], 900)
    if not replay.ok:
        return replay
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target.name}-") as scratch:
        shutil.copytree(target.corpus, scratch, dirs_exist_ok=True)
        return _run(target, [f"-max_total_time={seconds}", scratch], seconds * 4 + 600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", choices=[[], *TARGETS], default=[], metavar="TARGET")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--ci", action="store_true", help="replay the checked-in corpus, then a short run")
    parser.add_argument("--merge", action="store_true", help="merge new coverage into the checked-in corpus")
    args = parser.parse_args(argv)
    failed = False
    for name in args.targets or TARGETS:
        target = TARGETS[name]
        result = ci(target, args.seconds) if args.ci else campaign(target, args.seconds)
        if not result.ok:
            sys.stdout.write(result.output[-6000:])
            failed = True
        elif args.merge:
            merge(target)
        print(result.line(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
