"""What crosses process boundaries (docs/ARCHITECTURE.md, "Package layout"): the wire models, the Arrow data
plane, version diffs, private home files and the base error.  The kernel, the control plane and the worker all
import it; it imports nothing else of the package (an import-linter contract in pyproject.toml)."""
