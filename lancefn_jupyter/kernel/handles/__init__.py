"""The kernel's handles on control-plane objects (runs in the notebook kernel; docs/ARCHITECTURE.md,
"Client and API (kernel side)"): functions, jobs, batches, backfills (table maps) and versions.

Imports point down this list: `lookup` → `function` → `table_map` → `batch` → `job` → the leaves
(`base` with the `FunctionRef` protocol, `submit`, `history`, `rows`, `chunking`, `tracebacks`,
`local_run`). Jobs, batches and table maps hold a `FunctionRef`, never a `GpuFunction`.
"""
