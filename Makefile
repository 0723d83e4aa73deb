# medddpm task runner. `make book` (the main job) and `make test` do all set-up themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BOOK_STAMP := $(VENV)/.book-installed
DEMO   ?= _demo
# pytest-xdist processes of `make test`, a test file each at a time (CI: 2 cores)
TEST_WORKERS ?= 2

.PHONY: setup setup-book chromium render book book-check checked-book nbmake test demo gpu-measure gpu-book clean

setup: $(STAMP)

## PyTorch's build for this machine, then the package with its extras: by uv where it can be had, else pip
## (scripts/install_torch.py)
$(STAMP): pyproject.toml scripts/install_torch.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python scripts/install_torch.py test,plot
	touch $(STAMP)

setup-book: $(BOOK_STAMP)

$(BOOK_STAMP): $(STAMP)
	$(BIN)/python scripts/install_torch.py test,plot,book
	touch $(BOOK_STAMP)

## Headless Chromium for the rendered-book check (Debian's package; installed when missing).
chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

## Execute every notebook with papermill (default parameters) into build/papermill/ (a check of the
## per-GPU path; the book does not need it).
render: setup-book
	$(BIN)/python -m medddpm.report.notebook --src notebooks --out build/papermill

## The main job: the book exactly as `jupyter-book build book/` builds it (it executes the chapters
## from the committed results), with warnings as errors.
book: setup-book
	rm -f _build/html/index.html  # jupyter-book keeps an old redirect when the root page changes
	$(BIN)/jupyter-book build book/ -W
	@echo "book: _build/html/index.html"

## Open every page of the built book in headless Chromium: pages load, images have a size.
book-check: chromium
	$(BIN)/python scripts/check_book_html.py _build/html --toc _toc.yml

## nbmake on every notebook (converted from its jupytext source; default, quick parameters).
nbmake: setup-book
	rm -rf build/nbmake && mkdir -p build/nbmake
	$(BIN)/python -c "import jupytext, pathlib, sys; [jupytext.write(jupytext.read(f), f'build/nbmake/{pathlib.Path(f).stem}.ipynb') for f in sys.argv[1:]]" notebooks/[0-9]*.py
	$(BIN)/python -m pytest --nbmake build/nbmake -p no:cacheprovider

## pytest (TEST_WORKERS processes, one CPU thread each), then nbmake beside the book and its rendered check (each
## executes every chapter in one kernel at a time, mostly on one core: on two cores together they take about the time
## of the longer one).
test: setup-book chromium
	$(BIN)/python -m compileall -q medddpm  # once: where PYTHONDONTWRITEBYTECODE is set each process would compile it
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile
	$(MAKE) -j2 --output-sync=target nbmake checked-book

checked-book: book
	$(MAKE) --no-print-directory book-check

## A CPU demo of the CLI: MNI152-based data → train → sample → bench.
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

## On a machine with an NVIDIA GPU: bench + torch.profiler tables into data/results/<gpu>/.
gpu-measure: setup
	PYTHON=$(BIN)/python scripts/measure_gpu.sh

## On a machine with an NVIDIA GPU, one command: every chapter's measurements (papermill,
## measure=True: end-to-end, ncu where it may read the counters, the fast-path ladder, sampling),
## then every chapter rendered; ~25 min on an H100. Options: GPU_BOOK_ARGS="--dry-run", "--stages …".
gpu-book: setup-book
	$(BIN)/python -m medddpm.report.gpu_book $(GPU_BOOK_ARGS)

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache _build build book/_build
