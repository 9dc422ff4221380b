"""The Python environment a function version names, built with uv (docs/ARCHITECTURE.md, "Environments").

Used by the control plane (it builds a version's environment before placing its jobs on the local executor) and
by the kernel's ``.local()`` (same rules, same cache), so it sits below both and imports only ``worker`` and
``wire``. Pure decisions (``request.py``, ``pipconf.py``, ``resolve.py``) are apart from the I/O that acts on them
(``interpreters.py``, ``build.py``, ``cache.py``).
"""
