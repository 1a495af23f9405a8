"""The CI short run of every fuzz target (tests/fuzz/run.py --ci): each checked-in corpus
input once, then a few seconds of fuzzing from them, under ASan and UBSan (C targets) or
atheris (Python). An input that once crashed stays in the corpus, so a regression fails
here; so does any new crash the short run finds (its input is printed and saved under
build/fuzz/artifacts/)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("fuzz_run", Path(__file__).with_name("run.py"))
assert _spec and _spec.loader
run = sys.modules["fuzz_run"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)

SECONDS = int(os.environ.get("RECSERVE_FUZZ_CI_SECONDS", "10"))


@pytest.mark.parametrize("name", sorted(run.TARGETS))
def test_fuzz_target_survives_its_corpus(name: str) -> None:
    target = run.TARGETS[name]
    if name in ("codec_parity", "codec_tfs_parity") and os.environ.get("RECSERVE_PURE_PYTHON") == "1":
        pytest.skip("the native decoder is off (RECSERVE_PURE_PYTHON=1): nothing to compare it with")
    if target.native and not run.shutil.which("clang"):
        pytest.fail("clang is not installed: run `make clang` (apt-get install clang libclang-rt-dev)")
    result = run.ci(target, SECONDS)
    assert result.ok, result.output[-6000:]
    # The replay ran every checked-in input, and the short run added executions of its own.
    assert result.executions > len(list(target.corpus.iterdir())), result.output[-2000:]
