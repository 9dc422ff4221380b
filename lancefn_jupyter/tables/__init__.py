"""Lance tables as a backfill sees them: which rows, reading a slice, committing a column per fragment
(docs/ARCHITECTURE.md, "Backfills"). Runs in the control plane and in Ray workers; imports only ``wire``
of the package, and pylance / pyarrow only inside functions."""
