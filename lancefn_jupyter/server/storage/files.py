"""Arrow IPC files of the data plane under the home: rows sent as Arrow, and results.

Layout (docs/ARCHITECTURE.md, "Arrow data plane")::

    $HOME/data/uploads/<32 hex>.arrow   rows a client on this machine wrote for functions/run
                                        ``rows_file`` (moved to rows/ by the run; refused otherwise)
    $HOME/data/rows/<uuid>.arrow        rows of a job submitted as Arrow IPC (removed when the job ends)
    $HOME/data/results/<job_id>.arrow   a job's result as an Arrow IPC stream
    $HOME/data/staged -> /dev/shm/…     results staged in memory on their way to results/ (``staging.py``)

Every file is written under a ``.tmp-<pid>`` name and renamed, so a SIGKILL never leaves a half
file under a final name; leftover temp files are removed at start.  Results are fsynced first only
with ``fsync=True`` (``--result-fsync``): by default a power cut may lose the latest results, like
the database's own last commits (SQLite WAL, synchronous=NORMAL); a result file whose size is not
the one recorded is then reported lost (410), never served truncated.  Results are removed by
the retention rule (older than ``max_age_s``, then oldest first while the total exceeds
``max_bytes``) on every result kept: one directory scan at start builds an index of the kept files
(a heap by age, a running total), so a write costs O(log results), not a scan.  pyarrow is imported
only when a body is checked.
"""

from __future__ import annotations

import heapq
import os
import re
import stat
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lancefn_jupyter.server.storage.staging import ResultStaging, staging_dir_for
from lancefn_jupyter.wire import dataplane

__all__ = ["DEFAULT_MAX_AGE_S", "DEFAULT_MAX_BYTES", "DataStore"]

DEFAULT_MAX_AGE_S = 7 * 24 * 3600.0
DEFAULT_MAX_BYTES = 5 * 1024**3  # a laptop's share of disk for kept results
DEFAULT_MAX_RESULT_BYTES = 4 * 1024**3  # one job's Arrow result (--max-arrow-result-bytes), as for its rows
_SUFFIX = ".arrow"
_UPLOAD_NAME = re.compile(r"[0-9a-f]{32}\.arrow")


class DataStore:
    def __init__(
        self,
        home: str | os.PathLike[str],
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        fsync: bool = False,
        stage: bool = True,
    ):
        """``stage``: stage fresh results in memory (``staging.py``); never with ``fsync``. ``max_result_bytes``: the
        largest Arrow result of one job (``--max-arrow-result-bytes``), whatever its worker says."""
        self.root = Path(home) / "data"
        self.rows_dir = self.root / "rows"
        self.results_dir = self.root / "results"
        self.uploads_dir = self.root / "uploads"
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self.max_result_bytes = max_result_bytes
        self.fsync = fsync
        self.staging = ResultStaging(self.results_dir, staging_dir_for(Path(home)) if stage and not fsync else None)
        # The kept results, by age: a heap of (mtime, job_id) and each one's size (the heap's entry is stale
        # when the job's size was dropped); built by ``enforce_retention`` at start, updated by ``kept``.
        self._by_age: list[tuple[float, str]] = []
        self._sizes: dict[str, int] = {}
        self._total = 0

    # ----------------------------------------------------------------- paths

    def result_path(self, job_id: str) -> Path:
        """Where the job's result is kept in the home (its file may still be staged: see ``find_result``)."""
        return self.results_dir / f"{job_id}{_SUFFIX}"

    def find_result(self, job_id: str) -> Path:
        """The job's result file as it is now: staged (memory) while it is there, else in the home
        (``result_path`` when neither)."""
        return self.staging.find(self.result_path(job_id), job_id)

    def result_fields(self, job_id: str, *, arrow: bool) -> dict:
        """The worker protocol's result fields of a task (docs/ARCHITECTURE.md, "Worker protocol"); ``arrow``:
        its output is an Arrow type, so its result is offered a reused slot ("Result staging"). ``result_max_bytes``:
        a larger result is refused (``--max-arrow-result-bytes``)."""
        stage = self.staging.task_fields(job_id) if arrow else {}
        result_file = os.path.join(self.results_dir, job_id + _SUFFIX)  # = result_path, without a Path per task
        return {
            "result_file": result_file,
            "result_fsync": self.fsync,
            "result_max_bytes": self.max_result_bytes,
            **stage,
        }

    def result_size(self, path: str | os.PathLike[str], job_id: str) -> int | None:
        """The size of a worker's reported ``result_file`` when it is one this job may write and is there, else
        None: the file's own size, whatever the worker said (one ``stat``)."""
        if os.fspath(path) != os.fspath(self.result_path(job_id)) and not self.staging.is_staged(path, job_id):
            return None
        try:
            return os.stat(path).st_size
        except OSError:
            return None

    def start(self) -> None:
        """At start, before any job is recovered: temp files go, staged results move to the home, and the
        ``staged`` link the embedded server's kernel reads through points at this server's staging."""
        self.sweep_temp()
        self.staging.start()
        link = self.root / "staged"
        if self.staging.dir is not None:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.root / f"staged.tmp-{os.getpid()}"
            _unlink(tmp)
            os.symlink(self.staging.dir, tmp)
            os.replace(tmp, link)
        elif os.path.islink(link):
            _unlink(link)

    def close(self) -> None:
        """A graceful stop: every staged result reaches the home."""
        self.staging.close()
        if os.path.islink(self.root / "staged"):
            _unlink(self.root / "staged")

    def rows_path(self, ref: dict) -> Path:
        return self.root / ref["arrow_file"]

    def new_rows_file(self) -> tuple[Path, Path]:
        """(temp path to stream a request body into, the final path it gets once checked)."""
        self.rows_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        final = self.rows_dir / f"{uuid.uuid4().hex}{_SUFFIX}"
        return final.with_name(f"{final.name}.tmp-{os.getpid()}"), final

    def upload(self, name: str) -> Path:
        """The hand-off file ``uploads/<name>`` a local client wrote (a plain file, no links);
        ValueError saying what is wrong otherwise."""
        if not _UPLOAD_NAME.fullmatch(name):
            raise ValueError(
                "rows_file must be the name of a file in the home's data/uploads directory "
                "(32 hex digits + '.arrow'); clients on other machines send the rows as the body"
            )
        path = self.uploads_dir / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise ValueError(f"rows_file {name} is not in {self.uploads_dir}; write it there first") from None
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"rows_file {name} is not a plain file")
        return path

    # ----------------------------------------------------------------- rows

    def check_rows(self, path: Path, inputs: Iterable[Any], label: str) -> int:
        """Validate an Arrow rows body against the signature's inputs; the number of rows.

        Raises ValueError with a message naming the column and the fix."""
        import pyarrow as pa

        inputs = list(inputs)
        try:
            reader = pa.ipc.open_stream(pa.memory_map(str(path), "r"))
            schema = reader.schema
            rows = sum(batch.num_rows for batch in reader)
        except (pa.ArrowInvalid, OSError) as error:
            raise ValueError(
                f"the body is not an Arrow IPC stream ({error}); send rows encoded with "
                "lancefn_jupyter.wire.dataplane.encode_rows and to_ipc_bytes, or send JSON"
            ) from None
        expected = {p.name: p.arrow_type for p in inputs}
        if list(expected.values()) == [dataplane.RECORD_BATCH_TYPE]:
            # A RecordBatch function's rows are its columns, any names, each arrow.value ("Batched functions").
            expected = {field.name: dataplane.VALUE_TYPE for field in schema if field.name != "_"}
        optional = {p.name for p in inputs if getattr(p, "default", None) is not None}  # the worker applies it
        got = {field.name for field in schema if field.name != "_"}
        missing = [n for n in expected if n not in got and n not in optional]
        unknown = sorted(got - set(expected))
        if missing or unknown:
            problems = ([f"missing column(s) {', '.join(missing)}"] if missing else []) + (
                [f"unknown column(s) {', '.join(unknown)}"] if unknown else []
            )
            raise ValueError(f"{' and '.join(problems)}; {label} takes ({', '.join(expected)})")
        for field in schema:
            if field.name == "_":
                continue
            declared = (field.metadata or {}).get(dataplane.TYPE_KEY, b"").decode()
            if declared != expected[field.name]:
                raise ValueError(
                    f"column {field.name!r} is typed {declared or 'nothing'!s} in its field metadata "
                    f"({dataplane.TYPE_KEY.decode()}), but {label} declares {expected[field.name]}"
                )
        if rows == 0:
            raise ValueError("the Arrow body has no rows; send at least one row")
        return rows

    def remove_rows(self, ref: Any) -> None:
        if isinstance(ref, dict) and "arrow_file" in ref:
            _unlink(self.rows_path(ref))

    # ----------------------------------------------------------------- results

    def sweep_temp(self) -> None:
        """Remove temp files a killed writer left behind (at start, before any job runs)."""
        for directory in (self.rows_dir, self.results_dir, self.uploads_dir):
            for entry in _entries(directory):
                if ".tmp-" in entry.name or directory == self.uploads_dir:
                    _unlink(Path(entry.path))

    def enforce_retention(self, now: float | None = None) -> list[str]:
        """Scan the results directory (at start), then apply the retention rule; the removed job ids."""
        self._by_age, self._sizes, self._total = [], {}, 0
        for entry in _entries(self.results_dir):
            if entry.name.endswith(_SUFFIX):
                try:
                    info = entry.stat()
                except OSError:
                    continue
                self._add(entry.name[: -len(_SUFFIX)], info.st_mtime, info.st_size)
        return self._prune(time.time() if now is None else now)

    def kept(self, job_id: str, now: float | None = None) -> list[str]:
        """A result file was written for ``job_id``: index it and apply the retention rule at once; the
        removed job ids (``job_id`` among them when it alone is over the size limit)."""
        for _ in range(2):  # staged, or in the home once the spooler moved it between finding and stat
            try:
                info = self.find_result(job_id).stat()
                break
            except FileNotFoundError:
                continue
            except OSError:
                return []
        else:
            return []
        self._add(job_id, info.st_mtime, info.st_size)
        return self._prune(time.time() if now is None else now)

    def forget(self, job_id: str) -> None:
        """Drop a job's result from the retention index: it is being removed for another reason (a backfill chunk's,
        committed into its table), so it never pushes another job's result out."""
        self._total -= self._sizes.pop(job_id, 0)  # its heap entry goes stale: _prune skips it at no cost

    def remove(self, job_id: str) -> None:
        """Remove the job's result file, staged or in the home (any thread: the spooler never puts it back)."""
        self.staging.remove(job_id)
        _unlink(self.result_path(job_id))

    def _add(self, job_id: str, mtime: float, size: int) -> None:
        self._total += size - self._sizes.get(job_id, 0)
        if job_id not in self._sizes:
            heapq.heappush(self._by_age, (mtime, job_id))
        self._sizes[job_id] = size

    def _prune(self, now: float) -> list[str]:
        removed = []
        while self._by_age:
            mtime, job_id = self._by_age[0]
            if now - mtime <= self.max_age_s and self._total <= self.max_bytes:
                break
            heapq.heappop(self._by_age)
            self.remove(job_id)
            self._total -= self._sizes.pop(job_id, 0)
            removed.append(job_id)
        return removed


def _entries(directory: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except FileNotFoundError:
        return []


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
