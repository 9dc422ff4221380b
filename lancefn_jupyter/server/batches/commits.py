"""A backfill's chunk results and its fragment commits (docs/ARCHITECTURE.md, "Backfills", "Commits"):
reading a DONE chunk's results (:func:`chunk_results`, :func:`result_file`, :func:`skipped_rows`), the rows
it skipped (:func:`commit_errors`) and the committer threads (:class:`Committer`). The Lance commit itself
runs on the committer threads without the job table's lock. pylance and pyarrow are imported only by a
backfill.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Committer", "chunk_results", "commit_errors", "result_file", "skipped_rows"]

log = logging.getLogger("lancefn.server")


def chunk_results(source: Path | list, output_type: str) -> tuple[Any, Any]:
    """A DONE chunk's results: (the result column, the ``error`` column or None). ``source``: the
    kept Arrow result file, or the job's JSON results (small plain results travel as JSON)."""
    from lancefn_jupyter.tables.commit import result_columns
    from lancefn_jupyter.wire import dataplane

    if isinstance(source, list):
        return dataplane.encode_results(source, output_type, many=True).column(0), None
    return result_columns(dataplane.read_ipc(source))


def result_file(source: Path | list, output_type: str) -> int:
    """A DONE chunk's results as an open file for a table agent (docs/ARCHITECTURE.md, "Backfills", "Which
    tables"): its kept Arrow file, or its JSON results encoded into an anonymous one. The caller closes it."""
    if not isinstance(source, list):
        return os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    from lancefn_jupyter.wire import dataplane

    data = dataplane.to_ipc_bytes(dataplane.encode_results(source, output_type, many=True))
    fd = os.memfd_create("lancefn-chunk-results", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def skipped_rows(source: Path | list) -> int:
    """How many rows a chunk's worker skipped (``on_error="skip"``: a non-null ``error``)."""
    if isinstance(source, list):
        return 0
    from lancefn_jupyter.wire import dataplane

    table = dataplane.read_ipc(source)
    if "error" not in table.column_names:
        return 0
    column = table.column("error")
    return len(column) - column.null_count


def commit_errors(errors: Any, offsets: Any, fragment: int, chunk_of: Any, version: str) -> list[tuple]:
    """``backfill_errors`` rows for the skipped rows (error values are JSON {message, traceback})."""
    out = []
    for i, text in enumerate(errors.to_pylist()):
        if text is None:
            continue
        try:
            detail = json.loads(text)
        except ValueError:
            detail = {"message": text}
        offset = int(offsets[i])
        out.append(
            (
                (fragment << 32) | offset,
                fragment,
                offset,
                str(detail.get("message") or "the row failed"),
                detail.get("traceback"),
                version,
                int(chunk_of[i]),
            )
        )
    return out


class Committer:
    """The control plane's committer: one thread per backfill with fragments to commit, each writing
    its batch's fragments one at a time, in the order they were queued (so a slow backfill never
    holds up another's commits). A commit starts when a fragment's first chunk is done and takes its
    chunks' results as they finish (docs/ARCHITECTURE.md, "Backfills", "Commits")."""

    def __init__(self, commit: Callable[[str, int], None]) -> None:
        self._commit = commit
        self._lock = threading.Lock()
        self._queues: dict[str, list[int]] = {}  # batch id → fragments queued; present while its thread runs
        self._threads: set[threading.Thread] = set()
        self.stopping = threading.Event()  # commits waiting for chunks give up (the server stops)

    def start(self) -> None:
        self.stopping.clear()

    def submit(self, batch_id: str, fragment: int) -> None:
        with self._lock:
            if self.stopping.is_set():
                return  # a restart queues it again
            queued = self._queues.get(batch_id)
            if queued is not None:
                queued.append(fragment)
                return
            self._queues[batch_id] = [fragment]
            thread = threading.Thread(
                target=self._run, args=(batch_id,), name=f"lancefn-backfill-commit-{batch_id}", daemon=True
            )
            self._threads.add(thread)
        thread.start()

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(30)

    def _run(self, batch_id: str) -> None:
        try:
            while True:
                with self._lock:
                    queued = self._queues[batch_id]
                    if not queued or self.stopping.is_set():
                        del self._queues[batch_id]
                        return
                    fragment = queued.pop(0)
                try:
                    self._commit(batch_id, fragment)
                except Exception:  # never the thread: the fragment stays uncommitted and is redone on restart
                    log.exception("backfill %s: committing fragment %s failed", batch_id, fragment)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
