# The README's two commands: `make serve` and `make test`. Everything they need is
# installed from scratch: a venv with the package (native parts compiled by its build),
# and redis-server from Debian's packages when the machine has none.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install native redis-server wrk serve test bench proto docs clean

install: $(VENV)/.installed native

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# Rebuilds the C libraries when their sources changed (editable installs do not).
native: $(VENV)/.installed
	$(BIN)/python setup.py -q build_ext --inplace

redis-server:
	@command -v redis-server >/dev/null || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server; }

# The benchmarks' HTTP load generator (bench_frontdoor).
wrk:
	@command -v wrk >/dev/null || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends wrk; }

serve: install
	@[ -f .demo/config.json ] || $(BIN)/recserve demo --out .demo
	$(BIN)/recserve serve --config .demo/config.json

test: install redis-server
	$(BIN)/python -m pytest -q

bench: install redis-server wrk
	$(BIN)/python -m benchmarks

proto: install
	$(BIN)/python -m recserve.proto.generate

# README.md inlines docs/*.md; docs/config.md is generated from the config field table.
docs: install
	$(BIN)/python -m recserve.config --markdown > docs/config.md
	$(BIN)/python docs/include.py

clean:
	rm -rf $(VENV) build *.egg-info .demo
	find recserve -name '*.so' -delete
