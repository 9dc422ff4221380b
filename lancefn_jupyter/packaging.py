"""The public path of `lancefn_jupyter.kernel.packaging`; its public names keep this `__module__`, which artifacts that capture them name."""

from lancefn_jupyter.kernel.packaging import *  # noqa: F403
from lancefn_jupyter.kernel.packaging import __all__ as __all__
