"""The lancefn control plane (``lancefn-server``): REST API, SQLite store, scheduler, executors.

Layout: ``cli`` (process, flags, server.json) → ``app`` (thin FastAPI routes) → ``core``
(``ControlPlane``: the job state machine, composing ``catalog``, ``jobs``, ``callbacks``,
``journal``, ``results``, ``reports`` and ``batches``; see docs/ARCHITECTURE.md) → ``store``
(SQLite WAL), ``scheduler`` (pure FIFO-per-class placement), ``gpu_classes`` (TOML / NVML /
simulated), ``executors`` (``local`` | ``ray``) → ``worker`` (runs an artifact).
Nothing is imported here so that ``import lancefn_jupyter.server.policy.scheduler`` stays cheap for the
kernel side.
"""
