"""The public path of `lancefn_jupyter.kernel.handles`, for `handles.local_run` (the tutorials import `gpu_available` from it)."""
