"""The public path of `lancefn_jupyter.kernel.handles.local_run`: `from lancefn_jupyter.handles.local_run import gpu_available`."""

from lancefn_jupyter.kernel.handles.local_run import *  # noqa: F403
from lancefn_jupyter.kernel.handles.local_run import __all__ as __all__
