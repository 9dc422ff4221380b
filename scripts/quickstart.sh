#!/usr/bin/env bash
# The main job: install lancefn-jupyter (with JupyterLab and the prebuilt side panel) into .venv and
# open the quickstart notebook in JupyterLab, with the embedded control plane starting on first use.
#   scripts/quickstart.sh             JupyterLab on notebooks/01-quickstart.ipynb
#   scripts/quickstart.sh --headless  execute the quickstart top to bottom and print what it shows
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
echo "== installing lancefn-jupyter[lab] (builds the JupyterLab extension)"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[lab]"

# No GPU here? The CUDA simulator must be chosen before numba.cuda is imported, so the kernel's
# environment decides; with a GPU (NVML sees one) the real device is used.
if ! .venv/bin/python -c "import pynvml; pynvml.nvmlInit(); assert pynvml.nvmlDeviceGetCount() > 0" 2>/dev/null; then
  export NUMBA_ENABLE_CUDASIM=1
fi

NOTEBOOK=notebooks/01-quickstart.ipynb
if [ "${1:-}" = "--headless" ]; then
  exec .venv/bin/python scripts/run_notebook.py "$NOTEBOOK"
fi
ROOT_FLAG=()
[ "$(id -u)" = 0 ] && ROOT_FLAG=(--allow-root)
exec .venv/bin/jupyter lab --ip 127.0.0.1 "${ROOT_FLAG[@]}" "$NOTEBOOK"
