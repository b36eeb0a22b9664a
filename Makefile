# Quickstart: `make run` (install into .venv, start a server, verify every bundled example over gRPC),
# `make serve` (the server in the foreground) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run serve test proto client-ops bench clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e clients/python -e '.[test]'
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

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

client-ops: $(STAMP)
	$(PY) scripts/gen_client_ops.py

bench: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[bench]'  # onnxruntime: a benchmark-only reference
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
