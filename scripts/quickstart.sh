#!/usr/bin/env bash
# The main job: install lancefn-jupyter (with JupyterLab and the prebuilt side panel) into .venv and
# open the quickstart notebook in JupyterLab, with the embedded control plane starting on first use.
#   scripts/quickstart.sh             JupyterLab on notebooks/01-quickstart.ipynb
#   scripts/quickstart.sh --headless  execute the quickstart top to bottom and print what it shows, in a
#                                     throwaway home whose control plane is stopped at the end
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/install_venv.sh lab

# No GPU here? The CUDA simulator must be chosen before numba.cuda is imported, so the kernel's
# environment decides; with a GPU (NVML sees one) the real device is used.
if ! .venv/bin/python -c "import pynvml; pynvml.nvmlInit(); assert pynvml.nvmlDeviceGetCount() > 0" 2>/dev/null; then
  export NUMBA_ENABLE_CUDASIM=1
fi

NOTEBOOK=notebooks/01-quickstart.ipynb
if [ "${1:-}" = "--headless" ]; then
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
ROOT_FLAG=()
[ "$(id -u)" = 0 ] && ROOT_FLAG=(--allow-root)
exec .venv/bin/jupyter lab --ip 127.0.0.1 "${ROOT_FLAG[@]}" "$NOTEBOOK"
