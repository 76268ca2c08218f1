# voxserve: `make demo` sets everything up and writes hello.wav; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp
# The CPU build of PyTorch (see README for CUDA). A bare `torch` would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test install bench bench-quick serve clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,bark,sbv2,cosyvoice2,wyoming,ray]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/voxserve say "Hello! This is voxserve, a fast text to speech engine, speaking with the Joe voice. Every sentence you hear was synthesised by voxserve's own PyTorch model." -o hello.wav

test: $(STAMP)
	$(PY) -m pytest -q

bench-quick: $(STAMP)
	$(VENV)/bin/voxserve bench --quick

bench: $(STAMP)
	$(VENV)/bin/voxserve bench

serve: $(STAMP)
	$(VENV)/bin/voxserve serve

clean:
	rm -rf $(VENV) .pytest_cache hello.wav
