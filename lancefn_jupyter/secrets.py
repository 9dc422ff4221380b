"""The public path of `lancefn_jupyter.kernel.secrets` (`lancefn_jupyter.secrets.create("HF", value)`)."""

from lancefn_jupyter.kernel.secrets import *  # noqa: F403
from lancefn_jupyter.kernel.secrets import __all__ as __all__
