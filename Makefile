# Quickstart: `make run` (install into .venv, start a server, verify every bundled example over gRPC),
# `make serve` (the server in the foreground) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Every install resolves to the locked versions (constraints.txt, written by `make lock`), so a fresh
# clone tests what was tested; `make test-latest` installs the newest releases instead, to see drift
# before a fresh install meets it.
LOCK := constraints.txt
CONSTRAINTS ?= -c $(LOCK)
PIP := $(PY) -m pip install -q --disable-pip-version-check $(CONSTRAINTS)

.PHONY: install run serve test test-fast test-latest lock proto client-ops node-deps bench gpu-bundle gpu-rehearse clean image image-push

$(STAMP): pyproject.toml clients/python/pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e clients/python -e '.[test]'
	# bytecode now, as pip compiles a non-editable install's: with PYTHONDONTWRITEBYTECODE set, an
	# editable install would compile every module on every CLI start (~70 ms of ~250)
	$(PY) -m compileall -q gradcheck_svc clients/python/gradcheck_client clients/python/gradcheck_core clients/python/gradcheck
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) scripts/run_examples.py

serve: $(STAMP)
	$(VENV)/bin/gradcheck-svc serve $(SERVE_ARGS)

# the whole suite on 2 workers (pytest-xdist; a test file stays on one worker, so its servers start once);
# `make test-fast`: the unmarked tier (no `slow`: no model exports, no server or CLI processes), for edits
TEST_WORKERS ?= 2
# PYTHONDONTWRITEBYTECODE (set on these machines) would make pytest rewrite every test module on every run
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP) node-deps
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

# the Node.js client example's packages (clients/node, pinned by its package-lock.json), when npm is
# here and they are not: offline or refused, the install fails quietly and tests/client/test_node_client.py
# skips, quoting clients/node/npm-install.log
node-deps:
	@if command -v npm >/dev/null 2>&1 && [ ! -d clients/node/node_modules/@grpc/grpc-js ]; then \
	  (cd clients/node && $$(command -v timeout >/dev/null && echo timeout 300) npm ci --no-audit --no-fund \
	   --prefer-offline --fetch-retries=1 > npm-install.log 2>&1) || \
	  echo "node-deps: npm ci failed (clients/node/npm-install.log); the Node client test will skip"; fi

# the whole suite on the newest releases of every dependency, in a venv of its own (.venv-latest)
test-latest:
	rm -f .venv-latest/.installed
	$(MAKE) test VENV=.venv-latest CONSTRAINTS=--upgrade

# re-resolve every dependency (all extras) to its newest release in a scratch venv and write the lock;
# then `make test` (which reinstalls, the lock being newer than .venv) before committing it
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --disable-pip-version-check -e clients/python -e '.[test,bench,plot,onnx,gpu]'
	{ echo "# The locked dependency set: written by \`make lock\` ($$(date -u +%F)); every \`make\` install uses it."; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | sed -E 's/^(torch==[^+]*)\+.*/\1/'; } > $(LOCK)
	rm -rf .venv-lock

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

client-ops: $(STAMP)
	$(PY) scripts/gen_client_ops.py

bench: $(STAMP)
	$(PIP) -e '.[bench]'  # onnxruntime: a benchmark-only reference
	$(PY) bench/run_all.py

# The one GPU run (docs/benchmarks.md, "The GPU run"): `make gpu-bundle` downloads the wheels the GPU
# machine lacks (bench/gpu_bundle.txt: cp312 manylinux, the lock's versions) into bench/gpu_wheels/ and
# checks that they and the working tree fit the 64 MiB the machine receives; `make gpu-rehearse` runs
# bench/gpu_check.sh here in .venv-gpu, a Python 3.12 with the GPU machine's distributions
# (bench/gpu_machine.txt: CuPy installed, no device), so that only the GPU itself is untried.
GPU_WHEELS := bench/gpu_wheels
GPU_VENV := .venv-gpu
PYTHON312 ?= python3.12
TREE_LIMIT := 67108864

gpu-bundle: $(STAMP)
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PY) -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps --python-version 3.12 \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -c $(LOCK) -r bench/gpu_bundle.txt -d $(GPU_WHEELS)
	@tree=$$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $$1} END {print s}'); \
	wheels=$$(cat $(GPU_WHEELS)/*.whl | wc -c); total=$$((tree + wheels)); \
	echo "gpu-bundle: working tree $$((tree / 1024)) KiB + $(GPU_WHEELS) $$((wheels / 1024)) KiB = $$((total / 1048576)) MiB of 64"; \
	test $$total -le $(TREE_LIMIT) || { echo "gpu-bundle: over the 64 MiB the GPU machine receives" >&2; exit 1; }

$(GPU_VENV)/.installed: bench/gpu_machine.txt
	@command -v $(PYTHON312) >/dev/null || { echo "gpu-rehearse: needs a Python 3.12: PYTHON312=/path/to/python3.12" >&2; exit 2; }
	rm -rf $(GPU_VENV)
	$(PYTHON312) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --disable-pip-version-check -r bench/gpu_machine.txt
	touch $@

gpu-rehearse: gpu-bundle $(GPU_VENV)/.installed
	PYTHON=$(GPU_VENV)/bin/python OUT=$(CURDIR)/bench/gpu_check_logs/rehearsal bash bench/gpu_check.sh

# The images (deploy/docker): `make image` builds the CPU one, `make image VARIANT=gpu` the GPU one, as
# $(IMAGE):$(VERSION)-$(VARIANT) from the repository root, with the locked dependency set (constraints.txt);
# `make image-push` pushes that tag. BASE_IMAGE=NAME@sha256:DIGEST pins the base image by digest (a tag
# moves; the Dockerfiles name tags only because a digest cannot be looked up offline -- see deploy/README.md).
# DOCKER=podman works too; DOCKER_BUILD_ARGS passes more (--platform, --push with buildx...).
IMAGE ?= ghcr.io/gradcheck/gradcheck
VARIANT ?= cpu
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
TAG ?= $(VERSION)-$(VARIANT)
DOCKER ?= docker
DOCKERFILE_cpu := deploy/docker/Dockerfile
DOCKERFILE_gpu := deploy/docker/Dockerfile.gpu
BASE_ARG_cpu := PYTHON_IMAGE
BASE_ARG_gpu := CUDA_IMAGE
REVISION := $(shell git rev-parse HEAD 2>/dev/null)

image:
	@test -n "$(DOCKERFILE_$(VARIANT))" || { echo "make image: VARIANT must be cpu or gpu, not '$(VARIANT)'" >&2; exit 2; }
	$(DOCKER) build -f $(DOCKERFILE_$(VARIANT)) $(if $(BASE_IMAGE),--build-arg $(BASE_ARG_$(VARIANT))=$(BASE_IMAGE)) \
	  --label org.opencontainers.image.version=$(VERSION) $(if $(REVISION),--label org.opencontainers.image.revision=$(REVISION)) \
	  -t $(IMAGE):$(TAG) $(DOCKER_BUILD_ARGS) .

image-push:
	$(DOCKER) push $(IMAGE):$(TAG)

clean:
	rm -rf $(VENV) .venv-latest $(GPU_VENV) $(GPU_WHEELS) build *.egg-info
