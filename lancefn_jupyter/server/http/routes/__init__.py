"""The control plane's REST routes, one module per resource (docs/ARCHITECTURE.md, "REST API (v1)").

Each module is a thin layer: authenticate (``RouteContext.require``), parse the body into a
request model (``common.parse``), call the ``ControlPlane``.  ``app.create_app`` composes them
under the middleware and error handlers that every route shares.
"""
