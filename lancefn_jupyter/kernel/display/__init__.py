"""Pure text and HTML of what the kernel shows (runs in the kernel; no I/O, no ipywidgets): `cards`
(GPU classes, jobs, versions, function cards), `batch` (a batch and its chunk strip), `jobs` (the `%gpu_jobs`
table) and `timings` (cold or warm, in words: "cold start 1.2 s, setup 1.0 s", "warm")."""
