"""The lancefn control plane (``lancefn-server``): its own process, never imported by the kernel
side.  Arranged by role (docs/ARCHITECTURE.md, "Package layout"); imports point down this list:

- ``cli``: the process (flags, home lock, ``server.json``);
- ``http/``: the ASGI app, the guard and the fast path, auth, bodies, the routes;
- ``plane``: ``ControlPlane``, the composition root and lifecycle;
- ``batches/``: ``map`` fanned out over chunk jobs;
- ``control/``: the job table, the state machine and the parts around it (catalog, queries,
  journal, callbacks, results, reports, events);
- ``executors/``: where tasks run (``local`` | ``ray``);
- ``storage/``: SQLite (``store``) and the Arrow files next to it (``files``);
- ``policy/``: pure rules (scheduler, expected starts, namespaces, GPU classes, backfill table roots);
- ``errors``, ``encoding``: what every layer shares (the client-visible error, compact JSON).

Nothing of the package is imported here so that ``import lancefn_jupyter.server.policy.scheduler`` stays cheap.
"""

import os
import sys


def _drop_cwd() -> None:
    """No module of the control plane, nor of a child it runs, comes from its working directory, which another
    user may write (docs/ARCHITECTURE.md, "Isolation"): ``python -m lancefn_jupyter.server.cli`` put the cwd first
    on ``sys.path``; it goes here, before the server imports anything else, unless the package itself lives there
    (a source checkout, the operator's own), and every child gets ``PYTHONSAFEPATH=1`` (``cli.main``)."""
    if sys.flags.safe_path:
        return
    cwd = os.getcwd()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root != cwd:
        sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != cwd]


_drop_cwd()
