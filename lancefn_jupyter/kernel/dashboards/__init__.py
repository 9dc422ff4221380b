"""The team dashboard: one page for a shared control plane's GPUs (docs/ARCHITECTURE.md, "Front ends").

`team_dashboard()` builds it from the notebook widgets (`lancefn_jupyter.kernel.widgets`); `gpu.ipynb` (shipped
here) is one cell calling it, and `lancefn-dashboard` (`dashboards/cli.py`) serves that notebook with Voilà
on 127.0.0.1, behind a token. Nothing here is on `%load_ext`'s path, and only `cli.py` knows Voilà.

    from lancefn_jupyter.kernel.dashboards import team_dashboard
    team_dashboard()
"""

from __future__ import annotations

from typing import Any

__all__ = ["team_dashboard"]


def team_dashboard(**options: Any) -> Any:
    """The live team dashboard widget (`dashboards.team.TeamDashboard`; see it for ``options``)."""
    from lancefn_jupyter.kernel.dashboards.team import TeamDashboard

    return TeamDashboard(**options)
