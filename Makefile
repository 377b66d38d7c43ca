PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint histories bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/switchboard dev

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

test: $(STAMP) lint
	@# A private temp folder: a concurrent pytest run re-locks the shared default (chmod 700), which would cut
	@# the embedded PostgreSQL (running as its own user) off from its data directory.
	@tmp=$$(mktemp -d /tmp/switchboard-tests.XXXXXX); \
	$(BIN)/pytest -q -p no:cacheprovider --basetemp="$$tmp"; rc=$$?; rm -rf "$$tmp"; exit $$rc

# Record the replay history of every workflow path that has none committed yet (tests/workflows/replay.py);
# committed histories are never overwritten. Commit the new files under tests/workflows/histories/.
histories: $(STAMP)
	@tmp=$$(mktemp -d /tmp/switchboard-tests.XXXXXX); \
	SWITCHBOARD_WRITE_HISTORIES=1 $(BIN)/pytest -q -p no:cacheprovider --basetemp="$$tmp" tests/workflows tests/api/test_on_fault.py; \
	rc=$$?; rm -rf "$$tmp"; exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/ingest.py

clean:
	rm -rf $(VENV) .switchboard
