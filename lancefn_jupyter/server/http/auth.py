"""The one API-key check (docs/ARCHITECTURE.md, "Namespaces" and "REST details"): which principal
an ``x-api-key`` is, whether it grants a route's privilege, and which namespace's function a caller
means.  Runs in the control plane's server process; the guard checks the key before reading a
body, the router (and the fast path) check the route's privilege."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from starlette.requests import Request

from lancefn_jupyter.server.control.catalog import Where
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.policy.namespaces import Principal

MISSING_KEY_MESSAGE = "missing or unknown API key; send it in the x-api-key header (see server.json for the local key)"


class KeyRing:
    """The accepted keys and their principals."""

    def __init__(self, api_keys: Mapping[str, Principal]) -> None:
        self._keys = [(key.encode("utf-8"), principal) for key, principal in api_keys.items()]

    def principal(self, sent: bytes | None) -> Principal | None:
        """The principal of the key ``sent``, or None when no key matches."""
        found = None
        if sent:
            for key, principal in self._keys:  # every key compared: no early exit that times which one matched
                if hmac.compare_digest(sent, key):
                    found = principal
        return found

    def authorize(self, sent: bytes | None, privilege: str, path: str) -> Principal:
        """The principal of the ``x-api-key`` sent; a 401 if no key matches, a 403 if it lacks ``privilege``."""
        principal = self.principal(sent)
        if principal is None:
            raise ApiError(401, MISSING_KEY_MESSAGE)
        if privilege not in principal.privileges:
            raise ApiError(403, f"this API key lacks the '{privilege}' privilege needed for {path}")
        return principal


def who(request: Request) -> Principal:
    """The caller whose key the router checked for this route (``router.Router``)."""
    return request.state.principal


def pick(request: Request, namespace: str | None) -> Where:
    """Which namespace's function a name@version means: a key's own namespace; the admin's own
    unless it names another (``None`` then means: wherever the only such version is)."""
    return where(who(request), namespace)


def where(caller: Principal, namespace: str | None) -> Where:
    """:func:`pick` for a known caller."""
    if caller.admin:
        return {"namespace": namespace, "scope": None, "home": caller.namespace}
    return {"namespace": namespace or caller.namespace, "scope": caller.namespace, "home": caller.namespace}
