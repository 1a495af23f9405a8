# The README's two commands: `make serve` and `make test`. Everything they need is
# installed from scratch: a venv with the package (native parts compiled by its build),
# and grpc++, redis-server and valgrind from Debian's packages when the machine has none.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: peers install native grpcxx redis-server valgrind wrk clang container-tools serve test image-test test-sanitize fuzz fuzz-merge bench proto docs clean

install: $(VENV)/.installed native

$(VENV)/.installed: pyproject.toml setup.py | grpcxx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[test]'
	# TF Serving's gRPC client for the tests. --no-deps: it requires the `tensorflow`
	# distribution, which would install a second TensorFlow over tensorflow-cpu (same module).
	$(BIN)/pip install -q --no-deps 'tensorflow-serving-api>=2.16'
	touch $@

# Rebuilds the C libraries when their sources changed (editable installs do not).
# RECSERVE_REQUIRE_GRPCXX: the gRPC front end is built, or the build fails.
native: $(VENV)/.installed grpcxx
	RECSERVE_REQUIRE_GRPCXX=1 $(BIN)/python setup.py -q build_ext --inplace

# grpc++ and a C++ compiler for the gRPC front end (native/grpc_front.cc), from Debian's packages.
grpcxx:
	@pkg-config --exists grpc++ 2>/dev/null && command -v g++ >/dev/null || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends g++ libgrpc++-dev pkg-config; }

redis-server:
	@command -v redis-server >/dev/null || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server; }

# The C ABI's leak check (tests/cabi/test_cabi_leaks.py) runs its C host under valgrind.
valgrind:
	@command -v valgrind >/dev/null || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends valgrind; }

# The benchmarks' HTTP load generator (bench_frontdoor).
wrk:
	@command -v wrk >/dev/null || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends wrk; }

# clang with libFuzzer's runtime, for the fuzz targets (tests/fuzz/, RELIABILITY.md).
clang:
	@echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' | clang -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends clang libclang-rt-dev; }

# buildah, podman and runc build and run the image (tests/image); debootstrap makes a
# stand-in for its base image where no registry is reachable.
container-tools:
	@command -v buildah >/dev/null && command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends buildah podman runc debootstrap uidmap netavark aardvark-dns iptables; }

serve: install
	@[ -f .demo/config.json ] || $(BIN)/recserve demo --out .demo
	$(BIN)/recserve serve --config .demo/config.json

# tests/fuzz/test_fuzz_corpus.py runs every fuzz target briefly on its checked-in corpus.
# RECSERVE_REQUIRE_VALGRIND: the leak check fails instead of skipping without valgrind.
test: install redis-server clang valgrind
	RECSERVE_REQUIRE_VALGRIND=1 $(BIN)/python -m pytest -q

# The Dockerfile built with buildah and run with podman (tests/image/test_image.py): every
# protocol, the user, the size, the SIGTERM drain. RECSERVE_IMAGE_GPU=1 builds the gpu
# target too (~3 GB of CUDA wheels). Needs root (rootful podman).
image-test: install container-tools
	RECSERVE_IMAGE_TEST=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/image

# The native-heavy tests against libraries built with AddressSanitizer and
# UndefinedBehaviorSanitizer (RELIABILITY.md), in a copy of the tree so the regular build
# stays as it is. Python is not instrumented: libasan must be its first library
# (LD_PRELOAD), and the interpreter's memory that lives until exit is not a leak. Left
# out: tests that measure memory (ASan's shadow and quarantine change RSS), and tests
# where onnxruntime throws a C++ exception (it aborts with libasan preloaded; not our code),
# and the Redis tests (Python code; their outage timings only get flakier under ASan).
# --capture=sys: a sanitizer report is written to fd 2 just before the abort, which
# pytest's default fd capture would swallow with the process.
SANITIZE_TREE  := build/sanitize
SANITIZE_TESTS ?= tests/wire $(wildcard tests/embedding/test_embedding_*.py) tests/cabi \
                  tests/processor/test_processor_requests.py tests/processor/test_processor_tiers.py \
                  tests/processor/test_processor_parity.py tests/processor/test_batching.py \
                  tests/processor/test_request_route.py tests/processor/test_native_route.py \
                  tests/processor/test_native_route_strings.py tests/processor/test_native_route_tfs.py \
                  tests/processor/test_native_predict.py tests/processor/test_native_route_integer_ids.py \
                  tests/processor/test_merged_runs.py \
                  tests/runtime/test_native_runner.py tests/server/test_grpc_front.py
SANITIZE_SKIP  ?= not never_sits_in_memory and not memory_does_not_grow
SANITIZE_ENV    = LD_PRELOAD=$$($(CC) -print-file-name=libasan.so) \
                  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
                  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
test-sanitize: install redis-server
	rm -rf $(SANITIZE_TREE) && mkdir -p $(SANITIZE_TREE)
	tar -c --exclude=./$(VENV) --exclude=./build --exclude=./.git --exclude='*.so' . | tar -x -C $(SANITIZE_TREE)
	cd $(SANITIZE_TREE) && RECSERVE_SANITIZE=1 $(abspath $(BIN))/python setup.py --quiet build_ext --inplace
	cd $(SANITIZE_TREE) && PYTHONPATH=$$PWD $(SANITIZE_ENV) $(abspath $(BIN))/python -m pytest -q -p no:cacheprovider --capture=sys -k '$(SANITIZE_SKIP)' $(SANITIZE_TESTS)

# A fuzzing campaign: every target FUZZ_SECONDS seconds (tests/fuzz/run.py --help).
FUZZ_SECONDS ?= 60
fuzz: install clang
	$(BIN)/python tests/fuzz/run.py --seconds $(FUZZ_SECONDS)

# The same, then the inputs that found new coverage join the checked-in corpus.
fuzz-merge: install clang
	$(BIN)/python tests/fuzz/run.py --merge --seconds $(FUZZ_SECONDS)

bench: install redis-server wrk peers
	$(BIN)/python -m benchmarks

# The peer servers bench_kserve compares with, in a virtualenv of their own (kserve pins its
# own fastapi, uvicorn and protobuf).
peers: .venv-peers/.installed

.venv-peers/.installed:
	python3 -m venv .venv-peers
	.venv-peers/bin/pip install -q "kserve>=0.14" "onnxruntime>=1.17"
	touch $@

proto: install
	$(BIN)/python -m recserve.proto.generate

# README.md inlines docs/*.md; docs/config.md is generated from the config field table.
docs: install
	$(BIN)/python -m recserve.config --markdown > docs/config.md
	$(BIN)/python docs/include.py

clean:
	rm -rf $(VENV) build *.egg-info .demo
	find recserve -name '*.so' -delete
