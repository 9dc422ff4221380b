"""The control plane's REST routes, one module per resource (docs/ARCHITECTURE.md, "REST API (v1)").

Each module is a thin layer: authenticate (``RouteContext.require``), parse the body into a
request model (``bodies.parse``), call the control plane's part that does the work
(``ctx.plane.machine``, ``ctx.plane.jobs`` ...).  ``app.create_app`` composes them
under the middleware and error handlers that every route shares.
"""
