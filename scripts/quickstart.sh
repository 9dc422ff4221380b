#!/usr/bin/env bash
# The main job: install lancefn-jupyter (with JupyterLab, Notebook 7 and the prebuilt side panel) into .venv and
# open the quickstart notebook in JupyterLab, with the embedded control plane starting on first use.
#   scripts/quickstart.sh             JupyterLab on notebooks/01-quickstart.ipynb, on port 8888 (or the next free one)
#   scripts/quickstart.sh --port N    the same on port N; any other argument goes to `jupyter lab` as it is
#                                     (e.g. --no-browser, --ServerApp.token=...)
#   scripts/quickstart.sh --headless  execute the quickstart top to bottom and print what it shows, in a
#                                     throwaway home whose control plane is stopped at the end
set -euo pipefail
cd "$(dirname "$0")/.."

HEADLESS=0
JUPYTER_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --headless) HEADLESS=1 ;;
    --port)
      [ $# -ge 2 ] || { echo "quickstart.sh: --port needs a number, e.g. --port 8890" >&2; exit 2; }
      JUPYTER_ARGS+=("--port=$2")
      shift ;;
    *) JUPYTER_ARGS+=("$1") ;;
  esac
  shift
done

. scripts/install_venv.sh lab

# No GPU here? The CUDA simulator must be chosen before numba.cuda is imported, so the kernel's
# environment decides; with a GPU (NVML sees one) the real device is used.
if ! .venv/bin/python -c "import pynvml; pynvml.nvmlInit(); assert pynvml.nvmlDeviceGetCount() > 0" 2>/dev/null; then
  export NUMBA_ENABLE_CUDASIM=1
fi

NOTEBOOK=notebooks/01-quickstart.ipynb
if [ "$HEADLESS" = 1 ]; then
  # A throwaway home: no jobs from an earlier run, and the control plane (and its workers) that
  # this run starts is stopped, and its state removed, when it ends.
  LANCEFN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/lancefn-quickstart.XXXXXX")
  export LANCEFN_HOME
  cleanup() {
    .venv/bin/python -c "from lancefn_jupyter.embedded import stop_server; stop_server()" || true
    rm -rf "$LANCEFN_HOME"
  }
  trap cleanup EXIT
  .venv/bin/python scripts/run_notebook.py "$NOTEBOOK"
  exit
fi
[ "$(id -u)" = 0 ] && JUPYTER_ARGS+=(--allow-root)
exec .venv/bin/jupyter lab --ip 127.0.0.1 "${JUPYTER_ARGS[@]}" "$NOTEBOOK"
