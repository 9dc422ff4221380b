"""Everything that runs only in the notebook kernel (docs/ARCHITECTURE.md, "Package layout"): the magics, the
public API's implementation, handles, widgets, display, the HTTP client, packaging and the team dashboard.

Importing this package imports nothing: `%load_ext lancefn_jupyter` loads `kernel.magics` and no more.
"""
