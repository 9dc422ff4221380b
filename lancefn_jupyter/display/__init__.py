"""Pure text and HTML of what the kernel shows (runs in the kernel; no I/O, no ipywidgets): `cards`
(GPU classes, jobs, versions, function cards) and `batch` (a batch and its chunk strip)."""
