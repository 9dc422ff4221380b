#!/usr/bin/env bash
# Install everything the tests need into .venv (Python deps, the prebuilt labextension, Debian
# Chromium for the browser tests), run the linters, the type checker and the import-layer contracts,
# then the whole suite.
# This is the README's test command and what .ci/run calls, so CI enforces the linters too.
# Extra arguments go to pytest (e.g. scripts/test.sh -k magics, scripts/test.sh -m unit for the fast
# tier); with arguments, collecting no tests is a failure (exit 5). LANCEFN_SKIP_LINT=1 skips the
# lint step (e.g. while iterating on one test).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing Debian chromium for the browser tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "== chromium missing and not root: browser tests will be skipped (sudo apt-get install chromium)"
  fi
fi

. scripts/install_venv.sh test

if [ "${LANCEFN_SKIP_LINT:-0}" != 1 ]; then
  echo "== lint: ruff check, ruff format --check, mypy, lint-imports"
  .venv/bin/python -m ruff check lancefn_jupyter tests benchmarks scripts
  .venv/bin/python -m ruff format --check lancefn_jupyter tests benchmarks scripts
  .venv/bin/python -m mypy
  .venv/bin/lint-imports  # the layer contracts in pyproject.toml's [tool.importlinter]
  if [ -d labextension/node_modules ]; then  # installed by the build above
    echo "== lint: eslint, prettier --check (labextension/src)"
    (cd labextension && npm run --silent lint)
  fi
fi

# Most tests wait on processes they started (servers, kernels, workers) more than they compute, so the suite runs on
# LANCEFN_TEST_WORKERS pytest-xdist workers (default 3, even on 2 cores; 0: in this process, one test at a time);
# tests/conftest.py keeps the Ray tests on one worker and the browser tests on one.
workers="${LANCEFN_TEST_WORKERS:-3}"
echo "== running the test suite ($workers workers)"
set +e
if [ "$workers" = 0 ]; then
  .venv/bin/python -m pytest "$@"
else
  .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
fi
code=$?
set -e
if [ "$code" = 5 ]; then
  # Fine for the bare CI run; with arguments it means a mistyped path or filter.
  if [ "$#" = 0 ]; then
    echo "pytest collected no tests"
    exit 0
  fi
  echo "pytest collected no tests for: $*; check the test paths and -k/-m filters" >&2
fi
exit "$code"
