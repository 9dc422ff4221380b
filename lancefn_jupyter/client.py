"""The public path of `lancefn_jupyter.kernel.client`: `Client`, its errors and events (`from lancefn_jupyter.client import Client`)."""

from lancefn_jupyter.kernel.client import *  # noqa: F403
from lancefn_jupyter.kernel.client import __all__ as __all__
