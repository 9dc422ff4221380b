"""The control plane's HTTP layer: the ASGI app, its guard and fast path, the one key check,
request bodies, core threads and the routes.  Runs in the control plane's server process."""
