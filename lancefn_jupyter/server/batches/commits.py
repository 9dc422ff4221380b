"""A backfill's chunk results and its fragment commits (docs/ARCHITECTURE.md, "Backfills", "Commits").

:class:`FragmentCommits` follows a backfill's DONE chunks for ``manager.BatchManager``: it keeps each
chunk's result from retention, counts the rows it skipped (the skip limit), queues a fragment's commit
once its first chunk is DONE, and writes the fragment on a committer thread (:class:`Committer`) as its
chunks finish, then records it. Its bookkeeping runs under the job table's lock, like the batches'
(it asks them for what a commit changes through :class:`BatchHooks`); the Lance commit itself runs on
the committer threads without the lock. Reading a chunk's results: :func:`chunk_results`,
:func:`result_file`, :func:`skipped_rows`, :func:`commit_errors`. pylance and pyarrow are imported only
by a backfill.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lancefn_jupyter.server.batches.backfill import BackfillStore
from lancefn_jupyter.server.batches.state import GIVEN_UP, BatchRun, Chunk
from lancefn_jupyter.server.batches.store import BatchStore
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.queries import JobQueries
from lancefn_jupyter.server.control.results import Results
from lancefn_jupyter.server.control.states import DONE
from lancefn_jupyter.server.executors.table_agent import TableAccessError, TableAgents
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.store import JobRecord, Store

__all__ = [
    "BatchHooks",
    "Committer",
    "FragmentCommits",
    "chunk_results",
    "commit_errors",
    "result_file",
    "skipped_rows",
]

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


@dataclass(frozen=True)
class BatchHooks:
    """What a fragment commit asks of the batches (``BatchManager``), with the job table's lock held."""

    batch: Callable[[str], BatchRun | None]  # an unfinished batch by id (None: finished, or unknown)
    rerun: Callable[[BatchRun, Chunk], None]  # a DONE chunk whose result is gone runs again
    stop: Callable[[BatchRun], None]  # the batch fails: its waiting chunks and live chunk jobs are cancelled
    advance: Callable[[BatchRun], None]  # submit what is due; finish the batch once nothing is left
    changed: Callable[[BatchRun], None]  # wake long polls, publish a `batch` event


class FragmentCommits:
    """A backfill's DONE chunks and their fragments' commits (see the module's docstring)."""

    def __init__(
        self,
        table: JobTable,
        *,
        store: Store,
        saved: BatchStore,
        backfills: BackfillStore,
        jobs: JobQueries,
        data: DataStore,
        results: Results,
        table_agents: TableAgents,
        hooks: BatchHooks,
    ) -> None:
        self.table, self.store, self.saved, self.backfills = table, store, saved, backfills
        self.jobs, self.data, self.results, self.table_agents, self.hooks = jobs, data, results, table_agents, hooks
        self.committer = Committer(self._commit)
        self.kept_dir = Path(data.root) / "backfills"  # chunk results kept until their fragment commits

    def start(self) -> None:
        self.committer.start()

    def stop(self) -> None:
        """Stop the committer (commits waiting for chunks give up; one writing finishes)."""
        self.committer.stop()

    def forget(self, batch_id: str) -> None:
        """The batch is finished: the results it kept go."""
        shutil.rmtree(self.kept_dir / batch_id, ignore_errors=True)

    def chunk_done(self, batch: BatchRun, chunk: Chunk, rec: JobRecord) -> None:
        """A backfill's chunk is DONE: keep its result, count its skipped rows (the skip limit), and
        queue its fragment's commit once every chunk of the fragment is DONE."""
        run = batch.backfill
        skipped = self._skipped(batch, chunk, rec)
        if skipped is None:
            self.hooks.rerun(batch, chunk)
            return
        run.skipped[chunk.idx] = skipped
        limit = run.spec.max_skip_fraction * batch.rows_total
        if run.failure is None and run.skipped[chunk.idx] and run.rows_skipped > limit:  # summed only on a skip
            run.failure = {
                "phase": "skip_limit",
                "message": f"{run.rows_skipped} of {batch.rows_total} rows were skipped, more than "
                f"max_skip_fraction={run.spec.max_skip_fraction:g} allows; see POST /v1/backfills/errors, fix "
                "the function (or raise max_skip_fraction) and run the backfill again",
                "chunk": chunk.idx,
            }
            self.backfills.save(batch.batch_id, run)
            self.hooks.stop(batch)
        self.queue(batch, [run.fragment_of[chunk.idx]])  # O(its fragment), not O(every chunk)

    def _skipped(self, batch: BatchRun, chunk: Chunk, rec: JobRecord | None) -> int | None:
        """How many rows a DONE chunk skipped, read from its result (kept first); None when the result is gone."""
        for _ in range(3):
            source = self.keep_result(batch, chunk, rec)
            if source is None:
                return None
            if batch.backfill is not None and batch.backfill.spec.on_error == "fail":
                return 0  # a failing row fails its chunk: a DONE chunk skipped none, no need to read it
            try:
                return skipped_rows(source)
            except FileNotFoundError:  # staged when found, moved to the home since: kept there now
                continue
        return None

    def _kept(self, batch: BatchRun, chunk: Chunk) -> Path:
        return self.kept_dir / batch.batch_id / f"{chunk.idx}-{chunk.job_id}.arrow"

    def keep_result(self, batch: BatchRun, chunk: Chunk, rec: JobRecord | None) -> Path | Any:
        """The chunk's result, safe from retention until its fragment commits: a hard link to its
        Arrow result file, or its JSON results (in the store already); None when it is gone.

        A result still staged in memory (another file system, so no link) is returned where it is, not
        copied: the callers hold the job table's lock, and a copy took 1.4 ms a chunk (3 MB), up to 11 ms. The
        spooler moves it to the home within milliseconds, and the next call (the commit's) links it there; a
        caller that finds it moved meanwhile (FileNotFoundError) asks again (docs/ARCHITECTURE.md, "Backfills")."""
        if rec is None or rec.state != DONE:
            return None
        if isinstance(rec.result, list):
            return rec.result
        kept = self._kept(batch, chunk)
        if kept.exists():
            return kept
        if not (isinstance(rec.result, dict) and "arrow" in rec.result):
            return None
        kept.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        for _ in range(2):  # a staged result may move to the home between finding and linking it
            source = self.data.find_result(rec.job_id)
            try:
                os.link(source, kept)
            except FileNotFoundError:
                continue
            except OSError as error:
                if error.errno == errno.EXDEV:
                    return source  # staged in memory: kept once the spooler has moved it to the home
                try:  # a file system without hard links: a copy
                    shutil.copyfile(source, kept)
                except FileNotFoundError:
                    continue
            return kept
        return None

    def queue(self, batch: BatchRun, fids: Any = None) -> None:
        """Queue the commit of each fragment of ``fids`` (default: all) that is not committed yet once its first
        chunk is DONE: the commit writes the fragment's chunks as they finish ("Backfills", "Commits")."""
        run = batch.backfill
        for fid in run.fragments if fids is None else fids:
            frag = run.fragments[fid]
            if frag.committed or fid in run.committing:
                continue
            for idx in frag.chunks:  # after a restart: the skips of chunks DONE before it (the skip limit)
                chunk = batch.chunks[idx]
                if chunk.state == DONE and idx not in run.skipped:
                    rec = self.jobs.record(chunk.job_id) if chunk.job_id else None
                    run.skipped[idx] = self._skipped(batch, chunk, rec) or 0
            states = [batch.chunks[idx].state for idx in frag.chunks]
            if states[0] == DONE and not any(state in GIVEN_UP for state in states):
                run.committing.add(fid)
                self.committer.submit(batch.batch_id, fid)

    def _commit(self, batch_id: str, fid: int) -> None:
        """A committer thread: write a fragment's results into the table as its chunks finish (without
        the lock), then record it; the batch finishes once no commit is left."""
        from lancefn_jupyter.tables.commit import ChunkPart, CommitFailed, commit_fragment
        from lancefn_jupyter.tables.plan import TableError
        from lancefn_jupyter.tables.slices import slice_offsets

        with self.table.lock:
            batch = self.hooks.batch(batch_id)
            if batch is None or batch.backfill is None:
                return
            run = batch.backfill
            frag = run.fragments[fid]
            # A backfill chunk's rows are its slice of the table.
            slices = [(idx, self.saved.chunk_slice(batch_id, idx)) for idx in frag.chunks]
            spec, version = run.spec, batch.version
        results = _ChunkResults(self, batch, fid, spec.output_type, version)
        parts = [
            ChunkPart(offsets, functools.partial(results.load, idx, offsets))
            for idx, offsets in ((idx, slice_offsets(table_slice.ranges)) for idx, table_slice in slices)
        ]
        problem = None
        try:
            if spec.table_root is None:
                commit_fragment(
                    spec.uri, fid, into=spec.into, output_type=spec.output_type, parts=parts, version=version
                )
            else:  # with the team's rights: its root owner's agent writes, opening each chunk's results as it goes
                self.table_agents.commit(
                    spec.table_root,
                    spec.uri,
                    fid,
                    into=spec.into,
                    output_type=spec.output_type,
                    version=version,
                    parts=[
                        (table_slice.ranges, functools.partial(results.open, idx, part.offsets))
                        for (idx, table_slice), part in zip(slices, parts, strict=True)
                    ],
                )
        except (CommitFailed, TableAccessError) as error:  # the batch says why; no traceback
            problem = str(error)
        except TableError as error:  # the table cannot be opened (gone, or not the team's to open)
            problem = f"fragment {fid}: {error}"
        except Exception as error:  # an unreadable result, a table gone: the batch says why
            if results.stopped is None:
                log.exception("backfill %s: committing fragment %s failed", batch_id, fid)
                problem = f"fragment {fid}: {type(error).__name__}: {error}"
        with self.table.lock:
            run.committing.discard(fid)
            with self.store.batch():
                if results.stopped is not None:  # a chunk did not finish: the fragment waits for a retry
                    if results.stopped.state == DONE:  # its result is gone: run it again
                        self.hooks.rerun(batch, results.stopped)
                elif problem is None:
                    rows = sum(len(part.offsets) for part in parts)
                    skipped = sum(results.skipped.values())
                    frag.committed, frag.rows_written, frag.rows_skipped = True, rows - skipped, skipped
                    for idx in frag.chunks:
                        run.skipped.pop(idx, None)
                    errors = [row for idx in frag.chunks for row in results.errors.get(idx, ())]
                    self.backfills.save_fragment(batch_id, fid, frag, errors)
                else:
                    run.commit_failure = problem
                    if run.failure is None:
                        run.failure = {"phase": "commit", "message": problem, "chunk": frag.chunks[0]}
                    self.backfills.save(batch_id, run)
                    self.hooks.stop(batch)
                self.hooks.advance(batch)  # a chunk re-run above
            released: list[str] = []
            if frag.committed:  # saved: the rows are in the table, the chunks' result files are not needed any more
                released = [job_id for idx in frag.chunks if (job_id := batch.chunks[idx].job_id)]
                with self.store.batch():
                    self.results.release(released)
            self.hooks.changed(batch)
        for job_id in released:  # without the lock: 25 unlinks of 3 MB files took up to 28 ms
            self.data.remove(job_id)
        if results.stopped is None and problem is None:
            for source in results.sources.values():
                if isinstance(source, Path) and source.parent == self.kept_dir / batch_id:
                    source.unlink(missing_ok=True)  # our link; never the job's own result


_CHUNK_POLL_S = 0.02  # how often a commit waiting for a chunk looks again


class _ChunkStopped(Exception):
    """A chunk a commit waits for will not finish (failed, cancelled, its result gone, the server stops)."""


class _ChunkResults:
    """A fragment commit's chunk results, each loaded when the commit reaches it: it waits (without the
    lock) until the chunk is DONE, keeps its result file from retention, and counts its skipped rows."""

    def __init__(self, commits: FragmentCommits, batch: BatchRun, fid: int, output_type: str, version: str) -> None:
        self.commits, self.batch, self.fid = commits, batch, fid
        self.output_type, self.version = output_type, version
        self.errors: dict[int, list] = {}  # chunk → its backfill_errors rows
        self.skipped: dict[int, int] = {}  # chunk → rows it skipped
        self.sources: dict[int, Any] = {}  # chunk → its kept result
        self.stopped: Chunk | None = None  # the chunk that will not finish, if one stopped the commit

    def load(self, idx: int, offsets: Any) -> tuple[Any, Any]:
        """The chunk's (results, errors) once it is DONE (a commit in the control plane)."""

        def read(source: Any) -> tuple[tuple[Any, Any], Any]:
            results, errors = chunk_results(source, self.output_type)
            return (results, errors), errors

        return self._take(idx, offsets, read)

    def open(self, idx: int, offsets: Any) -> int:
        """The chunk's results as an open file once it is DONE (a commit by a table agent, which maps it)."""

        def read(source: Any) -> tuple[int, Any]:
            fd = result_file(source, self.output_type)
            try:
                return fd, chunk_results(source, self.output_type)[1]  # its skipped rows, counted here
            except BaseException:
                os.close(fd)
                raise

        return self._take(idx, offsets, read)

    def _take(self, idx: int, offsets: Any, read: Callable[[Any], tuple[Any, Any]]) -> Any:
        """Wait (without the lock) until the chunk is DONE, keep its result, count its skipped rows from the
        ``error`` column ``read(source)`` returns with what the caller wants; that is returned."""
        import numpy as np

        commits, batch = self.commits, self.batch
        while True:
            source = None
            with commits.table.lock:
                chunk, run = batch.chunks[idx], batch.backfill
                if chunk.state == DONE:
                    rec = commits.jobs.record(chunk.job_id) if chunk.job_id else None
                    source = commits.keep_result(batch, chunk, rec)
                    if source is None:
                        self.stopped = chunk
                        raise _ChunkStopped(f"chunk {idx}'s result is gone")
                elif chunk.state in GIVEN_UP or batch.cancel_requested or (run is not None and run.failure):
                    self.stopped = chunk
                    raise _ChunkStopped(f"chunk {idx} did not finish")
            if source is not None:
                try:  # mapped, a staged result stays readable here even once the spooler has moved it
                    taken, error = read(source)
                    break
                except FileNotFoundError:  # staged when found, moved to the home since: kept there now
                    continue
            if commits.committer.stopping.wait(_CHUNK_POLL_S):
                self.stopped = chunk
                raise _ChunkStopped("the server is stopping")
        self.sources[idx] = source
        self.skipped[idx] = 0 if error is None else len(error) - error.null_count
        if self.skipped[idx]:
            self.errors[idx] = commit_errors(error, offsets, self.fid, np.full(len(offsets), idx), self.version)
        return taken
