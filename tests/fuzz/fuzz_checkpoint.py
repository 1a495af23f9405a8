"""Atheris (libFuzzer for Python) target: the checkpoint readers on arbitrary bytes.

The first byte picks the reader, the rest is the file:
  0  an embedding table file read from a local path (safetensors' header check, then
     recserve's own parse of the header to map the values without a copy),
  1  the same file read as bytes (an object store: OSS/S3, HDFS),
  2  dense.safetensors,
  3  MANIFEST.json.
Whatever the bytes, a reader returns a valid result or raises CorruptVersionError naming
the file; anything else (another exception, a crash) is a finding. A table that loads must
also be a table (TableData checks dtypes, shapes and unique keys) whose rows read back.

Run: python tests/fuzz/fuzz_checkpoint.py CORPUS_DIR [libFuzzer flags], or `make fuzz`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["recserve"]):
    from recserve.errors import CorruptVersionError
    from recserve.model_store.checkpoint import read_dense, read_table
    from recserve.model_store.manifest import MANIFEST_NAME, read_manifest
    from recserve.model_store.storage import LocalStorage

_DIR = tempfile.mkdtemp(prefix="fuzz-checkpoint-")
atexit.register(shutil.rmtree, _DIR, True)
_FILE = os.path.join(_DIR, "table.safetensors")


class _RemoteStorage(LocalStorage):
    """The local files without a local path: readers take the object-store route."""

    def local_path(self, path: str) -> str | None:
        return None


def test_one_input(data: bytes) -> None:
    if not data:
        return
    reader, body = data[0] % 4, data[1:]
    path = os.path.join(_DIR, MANIFEST_NAME) if reader == 3 else _FILE
    with open(path, "wb") as f:
        f.write(body)
    try:
        if reader == 0 or reader == 1:
            table = read_table(LocalStorage() if reader == 0 else _RemoteStorage(), path)
            assert table.values.shape == (table.keys.shape[0], table.dim)
            table.values.sum()   # every row readable (a mapping past the file's end would fault)
        elif reader == 2:
            read_dense(LocalStorage(), path)
        else:
            read_manifest(LocalStorage(), _DIR)
    except CorruptVersionError as exc:
        assert path in str(exc), exc


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
