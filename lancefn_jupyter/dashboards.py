"""The public path of `lancefn_jupyter.kernel.dashboards`: `from lancefn_jupyter.dashboards import team_dashboard`."""

from lancefn_jupyter.kernel.dashboards import *  # noqa: F403
from lancefn_jupyter.kernel.dashboards import __all__ as __all__
