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
- ``policy/``: pure rules (scheduler, expected starts, namespaces, GPU classes);
- ``errors``, ``encoding``: what every layer shares (the client-visible error, compact JSON).

Nothing is imported here so that ``import lancefn_jupyter.server.policy.scheduler`` stays cheap.
"""
