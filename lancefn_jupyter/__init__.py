"""lancefn-jupyter: interactive GPU functions for Jupyter (placeholder until the API lands)."""

from ._version import __version__

__all__ = ["__version__"]
