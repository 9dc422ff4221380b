# Sourced by scripts/quickstart.sh and scripts/test.sh from the repository root: .venv with
# lancefn-jupyter[$1] installed editable (which builds the JupyterLab extension) and our modules compiled.
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
echo "== installing lancefn-jupyter[$1] (builds the JupyterLab extension)"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[$1]"
# An editable install leaves our own modules uncompiled, and with PYTHONDONTWRITEBYTECODE set nothing
# ever writes their bytecode: every kernel and server would compile them from source (~60 ms a start).
.venv/bin/python -m compileall -q lancefn_jupyter >/dev/null
