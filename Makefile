# Two entry points: `make demo` (set up + run the main job) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)
DEMO_SCHEMES ?= bsp,ssp,gssp,gssp+sim,bsp+ina-grid

.PHONY: setup demo test test-fast browser bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,ray,tensorboard]'
	touch $(STAMP)

setup: $(STAMP)

# BSP, SSP, GSSP, GSSP+SIM and BSP with in-network aggregation on 8 workers in four speed tiers
# (a few minutes on 2 cores).
demo: $(STAMP)
	$(BIN)/shoal compare --config examples/demo.toml --schemes $(DEMO_SCHEMES) --out runs/demo --overwrite
	@echo "open file://$(CURDIR)/runs/demo/report.html in a browser (accuracy over time, speed-ups, per-worker timelines, groups, SIM, routing)"

# Everything: the suite on every core, then the tests that start a real Ray instance, one at a time
# (they time real processes; two at a time, each with its own Ray, failed timing checks on a quiet machine).
test: $(STAMP) browser
	$(BIN)/python -m pytest -q -n auto -m "not ray" --durations=10
	$(BIN)/python -m pytest -q -m ray --durations=10

# The edit loop (about 3 minutes on 2 cores): everything but the slow end-to-end runs and the Ray tests.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n auto -m "not slow and not ray"

# Headless Chromium for the report's browser test; installed quietly where apt-get exists (the test
# skips without it).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	  || ! command -v apt-get >/dev/null 2>&1 || { \
	  echo "installing chromium (apt-get) for the headless report test"; \
	  ( $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends chromium fonts-liberation ) >/dev/null 2>&1 \
	  || echo "warning: could not install chromium; the headless report test will be skipped"; }

clean:
	rm -rf $(VENV) runs

# Regenerate the configuration reference from the schema in src/shoal/config.py.
.PHONY: docs
docs: $(STAMP)
	$(BIN)/python -m shoal.docgen --out docs/configuration.md
	$(BIN)/python -m shoal.docgen --schema docs/shoal.schema.json
	$(BIN)/python -m shoal.docgen --schema src/shoal/config/shoal.schema.json
