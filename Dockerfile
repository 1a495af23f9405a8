# recserve server image. Built and run by `make image-test` (tests/image/) on every CI run.
#
#   docker build -t recserve .                    # CPU (default: the last stage)
#   docker build -t recserve:gpu --target gpu .   # onnxruntime-gpu with CUDA 13 + cuDNN 9 from PyPI
#   docker run --stop-timeout 35 -p 8080:8080 -p 8500:8500 -v /models:/models:ro \
#       -v $PWD/config.json:/config/config.json:ro recserve
#   docker run ... recserve --config /models/config.json --workers 2   # flags after the image name
#
# `recserve serve` is the entrypoint; the arguments after the image name (default: the CMD
# below) are its flags. It listens on 0.0.0.0:8080 (HTTP) and :8500 (gRPC). On SIGTERM it
# reports not ready, closes its ports and finishes the requests in flight for up to 30 s:
# give the container longer than that before the kill (docker/podman `--stop-timeout 35`;
# their default is 10 s; Kubernetes: terminationGracePeriodSeconds, deploy/kubernetes.yaml).
# The root filesystem may be read-only: the server writes to /tmp and its home only.
#
# Versions come from deploy/constraints.txt (the same for both targets). Only the build
# stages reach the package index (the runtime stages install from the wheels they made,
# offline); nothing machine-specific belongs here (tests/image/ passes its machine's pip
# configuration in from outside).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the compilers and headers make the wheel (native libraries inside; the gRPC
# front end needs grpc++: RECSERVE_REQUIRE_GRPCXX fails the build without it) -------------
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends gcc g++ libc6-dev libgrpc++-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
ENV RECSERVE_REQUIRE_GRPCXX=1
WORKDIR /src
COPY deploy/constraints.txt deploy/
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install -q --no-cache-dir -c deploy/constraints.txt pip setuptools wheel
COPY pyproject.toml setup.py README.md ./
COPY native native
COPY recserve recserve
RUN /opt/build/bin/pip wheel -q --no-cache-dir --no-deps --no-build-isolation -w /wheels .

# --- the wheels each target installs: recserve's and its pinned dependencies --------------
FROM build AS wheels-cpu
RUN /opt/build/bin/pip download -q --no-cache-dir -d /wheels -c deploy/constraints.txt "$(echo /wheels/recserve-*.whl)[cpu]"

FROM build AS wheels-gpu
RUN /opt/build/bin/pip download -q --no-cache-dir -d /wheels -c deploy/constraints.txt "$(echo /wheels/recserve-*.whl)[gpu]"

# --- what both runtime targets share: the service user with a home, a venv. Each target
# then drops its dependencies' own test suites (`tests` directories, 53 MB: numpy's and
# sympy's the most), which nothing imports.
FROM ${PYTHON_IMAGE} AS runtime-base
# grpc++'s shared libraries, which the gRPC front end (librecserve_grpc_front.so) links
# (~20 MB; apt's package lists and caches are not kept: another ~110 MB).
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends libgrpc++1.51 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && useradd --create-home --home-dir /home/recserve --uid 10001 --user-group --shell /usr/sbin/nologin \
        --no-log-init recserve \
 && python -m venv /opt/recserve
COPY deploy/constraints.txt /opt/recserve/constraints.txt
ENV PATH=/opt/recserve/bin:$PATH \
    RECSERVE_HOST=0.0.0.0 \
    PYTHONUNBUFFERED=1
EXPOSE 8080 8500
# Worker processes: `docker run -e RECSERVE_WORKERS=auto ...`, or `--workers N` after the image name.
ENV RECSERVE_WORKERS=1
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/v2/health/ready', timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["recserve", "serve"]
CMD ["--config", "/config/config.json"]

# --- GPU: onnxruntime-gpu (the same version as the CPU target's onnxruntime) --------------
# Needs only the NVIDIA driver on the host (nvidia-container-toolkit); CUDA and cuDNN come
# as PyPI wheels, found through LD_LIBRARY_PATH.
FROM runtime-base AS gpu
RUN --mount=type=bind,from=wheels-gpu,source=/wheels,target=/wheels \
    pip install -q --no-cache-dir --no-index --find-links /wheels -c /opt/recserve/constraints.txt "recserve[gpu]" \
 && pip check \
 && find /opt/recserve/lib -depth -type d -name tests -exec rm -r {} +
ENV LD_LIBRARY_PATH=/opt/recserve/lib/python3.11/site-packages/nvidia/cu13/lib:/opt/recserve/lib/python3.11/site-packages/nvidia/cudnn/lib
USER recserve
WORKDIR /home/recserve

# --- CPU (default) ------------------------------------------------------------------------
FROM runtime-base AS cpu
RUN --mount=type=bind,from=wheels-cpu,source=/wheels,target=/wheels \
    pip install -q --no-cache-dir --no-index --find-links /wheels -c /opt/recserve/constraints.txt "recserve[cpu]" \
 && pip check \
 && find /opt/recserve/lib -depth -type d -name tests -exec rm -r {} +
USER recserve
WORKDIR /home/recserve
