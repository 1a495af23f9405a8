# recserve server image. NOT BUILT on the project's machines (Docker cannot run there):
# the install steps below are the README's (`make install`: venv, `pip install -e .`,
# native build in place), so they are exercised by every `make test`.
#
#   docker build -t recserve .                    # CPU (default: the last stage)
#   docker build -t recserve:gpu --target gpu .   # onnxruntime-gpu on CUDA 13 + cuDNN
#   docker run -p 8080:8080 -p 8500:8500 -v /models:/models -v $PWD/config.json:/config/config.json recserve
#
# The server reads /config/config.json (DeepRec/EAS JSON; see docs/config.md) and listens
# on 0.0.0.0:8080 (HTTP) and :8500 (gRPC). SIGTERM drains in-flight requests (30 s).

ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- GPU: onnxruntime-gpu (>= 1.27 is built for CUDA 13) instead of onnxruntime ----------
FROM ${CUDA_IMAGE} AS gpu
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends python3 python3-venv python3-dev gcc make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/recserve
COPY . .
RUN python3 -m venv .venv \
 && .venv/bin/pip install -q --upgrade pip setuptools wheel \
 && .venv/bin/pip install -q -e . \
 && .venv/bin/python setup.py -q build_ext --inplace \
 && .venv/bin/pip uninstall -q -y onnxruntime \
 && .venv/bin/pip install -q onnxruntime-gpu
RUN useradd --system --uid 10001 recserve
USER recserve
ENV PATH=/opt/recserve/.venv/bin:$PATH
# Worker processes (`--workers`); `docker run -e RECSERVE_WORKERS=auto ...` or pass
# `--workers N` after the image name: the entrypoint passes its arguments through.
ENV RECSERVE_WORKERS=1
EXPOSE 8080 8500
ENTRYPOINT ["recserve", "serve", "--host", "0.0.0.0", "--http-port", "8080", "--grpc-port", "8500"]
CMD ["--config", "/config/config.json"]

# --- CPU (default) ------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends gcc make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/recserve
COPY . .
RUN python -m venv .venv \
 && .venv/bin/pip install -q --upgrade pip setuptools wheel \
 && .venv/bin/pip install -q -e . \
 && .venv/bin/python setup.py -q build_ext --inplace
RUN useradd --system --uid 10001 recserve
USER recserve
ENV PATH=/opt/recserve/.venv/bin:$PATH
# Worker processes (`--workers`); `docker run -e RECSERVE_WORKERS=auto ...` or pass
# `--workers N` after the image name: the entrypoint passes its arguments through.
ENV RECSERVE_WORKERS=1
EXPOSE 8080 8500
ENTRYPOINT ["recserve", "serve", "--host", "0.0.0.0", "--http-port", "8080", "--grpc-port", "8500"]
CMD ["--config", "/config/config.json"]
