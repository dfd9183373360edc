# One command each: `make demo` (set up, then profile a bundled model with SME2 off and on),
# `make test` (set up, then the whole test suite), `make test-fast` (the suite without the farm-starting,
# browser, adb and emulated-arm64 tests). Set-up is a local virtualenv in .venv.
PYTHON ?= python3
VENV ?= .venv
PIP_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make demo PORT=8001 DATA_DIR=/tmp/farm2`: where the farm listens and keeps its data
# (DATA_DIR unset: SME2_DATA_DIR, else .farm)
PORT ?= 8000
DATA_DIR ?=
FARM_ARGS := --port $(PORT) $(if $(DATA_DIR),--data-dir $(DATA_DIR))

.PHONY: setup emulator demo up test lint bench docs clean

# setuptools' notice on every editable install of a package-dir layout ("Editable installation ... folders in
# your working directory with the same name as your package"), a box a newcomer reads as a fault; nothing else.
EDITABLE_QUIET := PYTHONWARNINGS="ignore:Editable installation:UserWarning"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(EDITABLE_QUIET) $(BIN)/python -m pip install -q $(PIP_ARGS) -e '.[dev]'
	$(BIN)/python -m pip install -q $(PIP_ARGS) --no-deps 'optimum-executorch==1.1.0'  # pyproject.toml: hf
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/sme2-farm demo $(FARM_ARGS)

up: setup
	$(BIN)/sme2-farm up $(FARM_ARGS)

# The SME2-capable QEMU for the emulated devices (idempotent, ~1 s; a failure is said, and the
# emulated-SME2 tests then skip, or fail under SME2_REQUIRE_SERVICES=1).
emulator: setup
	-$(BIN)/sme2-farm emulator install

# What runs in FAST_WORKERS pytest-xdist processes: all but the farm-starting, browser, adb and emulated tests.
PARALLEL := not e2e and not browser and not adb and not arm64 and not sme2emu
# The loop while changing code: those without the model-export tests too (on 2 cores about 0.6 of the serial time).
FAST := $(PARALLEL) and not models
FAST_WORKERS ?= 2
SERIAL_WORKERS ?= 2

# The whole suite: PARALLEL in FAST_WORKERS processes, then the rest (each starts farms, browsers or emulators
# of its own) in SERIAL_WORKERS processes, a test module to a process (--dist loadfile: a module's tests run in
# order, in one process, its module fixtures made once); both run, either fails it. Much of the second run waits
# out real bounds (leases, lost and offline bounds, restarts), so two modules side by side fill the two cores.
# The exported example models are shared by both runs (SME2_TEST_EXAMPLES_DIR, removed after).
# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on some CI
# machines): without it every farm, agent and client process the tests start compiles the project again,
# and each pytest run rewrites every test module's asserts (collection 10.7 -> 4.9 CPU s here).
# --durations: the slowest tests, printed at the end of each run.
test: setup emulator
	export SME2_TEST_EXAMPLES_DIR=$$(mktemp -d) PYTHONDONTWRITEBYTECODE=; \
	$(BIN)/python -m pytest -m "$(PARALLEL)" -n $(FAST_WORKERS) --durations=10; parallel=$$?; \
	$(BIN)/python -m pytest -m "not ($(PARALLEL))" -n $(SERIAL_WORKERS) --dist loadfile --durations=25; serial=$$?; \
	rm -rf "$$SME2_TEST_EXAMPLES_DIR"; \
	echo "in parallel: exit $$parallel; farms, browsers, emulators: exit $$serial"; [ $$parallel -eq 0 ] && [ $$serial -eq 0 ]

test-fast: setup
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -m "$(FAST)" -n $(FAST_WORKERS)

# The import contracts (.importlinter) and no private imports across modules: lint-imports on a symlinked
# tree of the installed package (plain `lint-imports` in the checkout cannot see pyproject's package-dir).
lint: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_layers.py

bench: setup
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/runners.py

# docs/configuration.md from the settings classes (tests/test_docs.py fails when it is stale)
docs: setup
	$(BIN)/python -m sme2farm.farm.configdoc

clean:
	rm -rf $(VENV) .farm runners/build
