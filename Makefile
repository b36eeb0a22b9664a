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

.PHONY: install run serve test test-latest lock proto client-ops bench clean image image-push

$(STAMP): pyproject.toml clients/python/pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e clients/python -e '.[test]'
	# bytecode now, as pip compiles a non-editable install's: with PYTHONDONTWRITEBYTECODE set, an
	# editable install would compile every module on every CLI start (~70 ms of ~250)
	$(PY) -m compileall -q gradcheck_svc clients/python/gradcheck_client clients/python/gradcheck
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) scripts/run_examples.py

serve: $(STAMP)
	$(VENV)/bin/gradcheck-svc serve $(SERVE_ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

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
	rm -rf $(VENV) .venv-latest build *.egg-info
