"""Pure rules of the control plane: scheduling, expected starts, namespaces and GPU classes (no
I/O besides reading config files).  Runs in the control plane process."""
