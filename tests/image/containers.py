"""buildah and podman for the image test (tests/image): the base image (pulled, or a
stand-in made by standin_base.sh when no registry answers), the build, and running
containers.

What this machine needs and a normal one does not lives here, never in the Dockerfile:
- podman runs containers with runc: its default crun fails here ("cgroups in hybrid mode
  not supported");
- explicit `--ulimit nofile/nproc`: podman's default raises them, which fails without
  CAP_SYS_RESOURCE (root here lacks it);
- the host's CA bundle (PIP_CERT, or pip's `cert` setting) is mounted over the base image's
  own bundle while building: the package index is reached through a proxy only that bundle
  trusts. Mounted over a file the base already has, so no trace of it stays in a layer; the
  base's pip (Debian's) and pip >= 24.2 read the system bundle. The index itself is PyPI's
  default here; a machine whose pip names another index would pass it the same way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("buildah", "podman", "runc", "debootstrap")
REPORT: list[str] = []  # what the image test measured, printed after its results (conftest)
RUN_OPTIONS = ["--runtime", "runc", "--ulimit", "nofile=16384:16384", "--ulimit", "nproc=16384:16384"]


def _run(args: list[str], *, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    # podman logs an error for every container with a HEALTHCHECK when systemd (which it
    # would time the checks with) is absent; the check itself still runs on request.
    result.stderr = "\n".join(line for line in result.stderr.splitlines() if "healthcheck" not in line)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} ... failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
    return result


def podman(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["podman", *args], timeout=timeout, check=check)


def tools_problem() -> str | None:
    """Why containers cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root: rootful podman, and debootstrap for the stand-in base"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (`make container-tools` installs them)"
    info = _run(["podman", "info"], check=False, timeout=120)
    if info.returncode != 0:
        return f"podman cannot run here: {info.stderr.strip()[-500:]}"
    return None


def base_image_name() -> str:
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError("the Dockerfile names no PYTHON_IMAGE")
    return match.group(1)


def ensure_base(name: str) -> str:
    """Make `name` available to buildah; returns how: present, pulled or stand-in built."""
    if podman("image", "exists", name, check=False).returncode == 0:
        return "present"
    if podman("pull", "-q", name, check=False, timeout=300).returncode == 0:
        return "pulled"
    _run([str(ROOT / "tests" / "image" / "standin_base.sh"), name], timeout=900)
    return "stand-in built (no registry reachable)"


def host_ca_bundle() -> Path | None:
    """The CA bundle the host's pip uses, if it names one."""
    configured = os.environ.get("PIP_CERT")
    if not configured:
        result = _run(["python3", "-m", "pip", "config", "get", "global.cert"], check=False, timeout=60)
        configured = result.stdout.strip() if result.returncode == 0 else ""
    path = Path(configured) if configured else None
    return path if path is not None and path.is_file() else None


def build(tag: str, target: str) -> float:
    """Build the Dockerfile's `target` as `tag` (layers cached between runs); seconds taken."""
    args = ["buildah", "bud", "--format", "docker", "--layers", "--target", target, "-t", tag]
    ca = host_ca_bundle()
    if ca is not None:
        args += ["-v", f"{ca}:/etc/ssl/certs/ca-certificates.crt:ro"]
    started = time.monotonic()
    _run([*args, str(ROOT)], timeout=1800)
    return time.monotonic() - started


@dataclass
class Layer:
    size: int
    created_by: str


def layers(image: str) -> list[Layer]:
    history = json.loads(podman("history", "--format", "json", image).stdout)
    return [Layer(int(entry["size"]), entry.get("CreatedBy", "")) for entry in history]


def image_size(image: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())


def exec_in_image(image: str, *command: str, user: str | None = None) -> str:
    """Run `command` in a throwaway container of `image` (entrypoint replaced); its stdout."""
    entry, *rest = command
    extra = ["--user", user] if user else []
    return podman("run", "--rm", *RUN_OPTIONS, *extra, "--entrypoint", entry, image, *rest).stdout
