"""Execute a notebook top to bottom in a real kernel and print each cell with what it showed.

Used by `scripts/quickstart.sh --headless` (and handy for any tutorial): exits non-zero, naming the
cell, if a cell fails.
"""

from __future__ import annotations

import sys

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def _shown(output: dict) -> str:
    if output.get("output_type") == "stream":
        return output["text"].rstrip()
    if output.get("output_type") == "error":
        return f"{output['ename']}: {output['evalue']}"
    return output.get("data", {}).get("text/plain", "").rstrip()


def main(path: str) -> int:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "."}})
    try:
        client.execute()
    except CellExecutionError as error:
        print(error, file=sys.stderr)
        return 1
    for number, cell in enumerate(nb.cells, 1):
        if cell.cell_type != "code":
            continue
        print(f"--- [{number}] " + cell.source.splitlines()[0] if cell.source else f"--- [{number}]")
        for output in cell.get("outputs", []):
            text = _shown(output)
            if text:
                print(text)
    print(f"\n{path}: all cells ran")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "notebooks/01-quickstart.ipynb"))
