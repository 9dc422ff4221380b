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
# LANCEFN_TEST_WORKERS pytest-xdist workers (default 2; 0: in this process, one test at a time);
# tests/conftest.py keeps the browser tests on one worker. The bare run (CI) first runs the tests that start a Ray
# cluster (marker `ray`) on their own, one at a time: Ray gives its daemons fixed start-up deadlines that a machine
# busy with other tests misses (tried beside the others, even at nice 19 for those, they failed). With arguments,
# one run of what they select.
workers="${LANCEFN_TEST_WORKERS:-2}"
set +e
if [ "$workers" = 0 ]; then
  echo "== running the test suite"
  .venv/bin/python -m pytest "$@"
  code=$?
elif [ "$#" = 0 ]; then
  echo "== running the Ray tests (one at a time)"
  .venv/bin/python -m pytest -m ray
  ray_code=$?
  [ "$ray_code" = 5 ] && ray_code=0  # none collected: Ray is not installed
  echo "== running the other tests ($workers workers)"
  .venv/bin/python -m pytest -n "$workers" --dist loadgroup -m "not ray"
  code=$?
  [ "$code" = 0 ] && code=$ray_code
else
  echo "== running the test suite ($workers workers)"
  .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
  code=$?
fi
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
