"""What the chaos soak serves from and breaks: an S3 bucket behind a fault proxy, a
redis-server it kills, and a small filesystem it fills (benchmarks/soak.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.fault_proxy import FaultProxy
from benchmarks.load_tools import free_port

__all__ = ["Bucket", "SmallDisk"]


class Bucket:
    """moto's S3 server on a free port, a bucket in it, and the fault proxy in front of it."""

    NAME = "soak"

    def __init__(self) -> None:
        import boto3

        port = free_port()
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        endpoint = f"http://127.0.0.1:{port}"
        self.client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="soak", aws_secret_access_key="soak",
                                   region_name="us-east-1")
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.create_bucket(Bucket=self.NAME)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.proxy = FaultProxy(endpoint)

    def config(self) -> dict[str, object]:
        return {"model_store_type": "oss", "oss_endpoint": self.proxy.url, "oss_access_id": "soak",
                "oss_access_key": "soak", "savedmodel_dir": f"oss://{self.NAME}/model",
                "checkpoint_dir": f"oss://{self.NAME}/ckpt"}

    def publish(self, local: Path, prefix: str) -> None:
        """Upload `local` under `prefix`, every MANIFEST.json last (deepest first), as a
        trainer publishes a version."""
        files = sorted(p for p in local.rglob("*") if p.is_file())
        manifests = sorted((p for p in files if p.name == "MANIFEST.json"), key=lambda p: -len(p.parts))
        for path in [p for p in files if p.name != "MANIFEST.json"] + manifests:
            self.client.put_object(Bucket=self.NAME, Key=f"{prefix}/{path.relative_to(local).as_posix()}",
                                   Body=path.read_bytes())

    def delete(self, prefix: str) -> None:
        listed = self.client.list_objects_v2(Bucket=self.NAME, Prefix=prefix + "/")
        for item in listed.get("Contents", []):
            self.client.delete_object(Bucket=self.NAME, Key=item["Key"])

    def close(self) -> None:
        self.proxy.close()
        self.process.terminate()
        self.process.wait(30)


class SmallDisk:
    """A small tmpfs mounted for the SSD tier (`ev_storage_path`), which `fill()` fills to
    the last byte and `empty()` frees. Mounting needs root: `reason` says why not otherwise."""

    def __init__(self, path: Path, mib: int = 32) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)],
                              capture_output=True, text=True, check=False)
        self.mounted = done.returncode == 0
        self.reason = "" if self.mounted else f"cannot mount a tmpfs for the SSD tier: {done.stderr.strip()}"
        self._filler = path / "filler"

    def fill(self) -> None:
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for size in (1 << 16, 1 << 12, 1 << 9):  # down to the last block
                try:
                    while True:
                        os.write(fd, bytes(size))
                except OSError:
                    pass  # ENOSPC at this size
        finally:
            os.close(fd)

    def empty(self) -> None:
        self._filler.unlink(missing_ok=True)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
