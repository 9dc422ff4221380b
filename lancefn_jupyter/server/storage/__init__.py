"""The control plane's durable state: SQLite (``store``) and the Arrow rows and result files next
to it (``files``).  Runs in the control plane process."""
