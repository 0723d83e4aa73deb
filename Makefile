# medddpm task runner. `make demo` (the main job) and `make test` do all set-up themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   ?= _demo

.PHONY: setup demo test gpu-measure clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/install_torch.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python scripts/install_torch.py
	$(BIN)/python -m pip install --quiet -e ".[test,plot]"
	touch $(STAMP)

## The main job until the book lands: a full CPU demo of the CLI on MNI152-based data.
demo: setup
	rm -rf $(DEMO)
	$(BIN)/medddpm summary --model whole-head
	$(BIN)/medddpm demo-data --out $(DEMO)/data --n 4 --size 32
	$(BIN)/medddpm train --images $(DEMO)/data/images --masks $(DEMO)/data/masks --model tiny \
	    --size 32 --steps 10 --out $(DEMO)/run --device cpu
	$(BIN)/medddpm sample --checkpoint $(DEMO)/run/checkpoint.pt --masks $(DEMO)/data/masks \
	    --out $(DEMO)/samples --sampler ddim --steps 10
	$(BIN)/medddpm bench --model tiny --size 32 --config baseline,opt2 --steps 3 --warmup 1 --device cpu
	@echo "demo outputs under $(DEMO)/ (data, run/checkpoint.pt, run/log.csv, samples/)"

test: setup
	$(BIN)/python -m pytest

## On a machine with an NVIDIA GPU: bench + torch.profiler tables into data/results/<gpu>/.
gpu-measure: setup
	PYTHON=$(BIN)/python scripts/measure_gpu.sh

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache
