"""The worker process (docs/ARCHITECTURE.md, "Worker protocol"): one warm process per (namespace, version)
that runs a function's rows, started by the control plane's executors and by the kernel's ``.local()``
(``process.py`` is the parent's handle on it).  It imports only ``wire``, and the standard library at top level,
so a spare worker starts fast."""
