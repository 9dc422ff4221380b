"""Batches: one ``map`` fanned out as chunk jobs (docs/ARCHITECTURE.md, "Batches"): the manager,
the pure batch state and its SQLite tables.  Runs in the control plane process."""
