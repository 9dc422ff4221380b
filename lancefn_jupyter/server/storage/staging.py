"""Result staging: fresh Arrow results land in memory (tmpfs), in reused pages, and reach the home's disk off
the reply's path (docs/ARCHITECTURE.md, "Result staging").

Why: on this kind of machine (a VM whose balloon reports freed memory to the host) a fresh page costs a host
fault, ~3 ms per MB, so an 8 MB result written into a new file took 2–35 ms by how recently memory had been
freed; Ray's object store reuses one mapped arena and stays near 8 ms.  So results are written into *slots*,
tmpfs files of a private directory on ``/dev/shm`` whose pages are written over (``dataplane.write_ipc_into``),
and a slot goes back to the pool only once nobody has it open or mapped — a kernel's client may still hold
zero-copy views of an old result — which a write lease proves (``F_SETLEASE`` is refused while any other
process has the file open or mapped).

The job is DONE once its staged file is renamed into place, as before (a tmpfs file outlives every process:
the server, the kernel, the worker).  A spooler thread then writes it to ``$HOME/data/results`` with
``O_DIRECT`` (no page-cache pages to allocate: the disk's DMA reads the slot), renames it there, and returns the
slot to the pool.  What a SIGKILL leaves staged is moved at the next start, before any job is recovered.  A
machine that loses power loses staged results as it loses unwritten page-cache ones: the job's result then
answers 410 ("run the function again").  Staging is off with ``--result-fsync`` (results are fsynced to the
home before the job is DONE), without a usable ``/dev/shm``, for results over ``max_file_bytes``, and while
the staged backlog is over ``max_bytes`` (results then go to the home directly).

Readers find a result with :meth:`ResultStaging.find`: the staged file while it is there (memory), else the
home's (the spooler renames the home's file before it takes the staged one, so one of them is always there).
The embedded server's kernel reads ``$HOME/data/staged/<job_id>.arrow``, a link to the staging directory.

Names in the staging directory: ``<job_id>.arrow`` (a staged result), ``<job_id>.slot`` (a slot handed to a
job's worker), ``free-<pid>-<n>`` (the pool), ``*.tmp-<pid>`` (a spooler's or writer's temp file)."""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import logging
import mmap
import os
import queue
import shutil
import stat
import threading
import time
from pathlib import Path

log = logging.getLogger("lancefn.server")

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_FILE_BYTES", "DEFAULT_POOL_BYTES", "ResultStaging", "staging_dir_for"]

DEFAULT_MAX_BYTES = 512 * 1024**2  # staged and not yet on disk: memory, so bounded
DEFAULT_MAX_FILE_BYTES = 64 * 1024**2  # a bigger result goes straight to the home (its write dwarfs the rest)
DEFAULT_POOL_BYTES = 128 * 1024**2  # free slots kept for reuse; what is over goes
POOL_IDLE_S = 60.0  # a free slot unused this long goes (an idle server holds no memory for nothing)
_SHM = Path("/dev/shm")
_SUFFIX = ".arrow"
_SLOT = ".slot"
_FREE = "free-"
_BLOCK = 4096  # O_DIRECT's alignment of offsets, lengths and buffers
_SLOT_TRIES = 4


def staging_dir_for(home: Path, shm: Path = _SHM) -> Path:
    """The staging directory of the home (one per home, so two servers on one machine never share one)."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(home))).hexdigest()[:16]
    return shm / f"lancefn-{os.getuid()}-{digest}"


def _private_dir(path: Path) -> bool:
    """Create ``path`` 0700, or accept it if it is already ours, 0700 and no link; False if it cannot be used
    (another user made it first on the shared ``/dev/shm``, or there is no such file system)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700


def unshared(path: Path) -> bool:
    """Whether no other open file or mapping holds ``path``: a write lease is granted only then."""
    lease = getattr(fcntl, "F_SETLEASE", None)  # Linux only: elsewhere a slot is never reused
    if lease is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, lease, fcntl.F_WRLCK)
        fcntl.fcntl(fd, lease, fcntl.F_UNLCK)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class ResultStaging:
    """Staged results of one home, their pool of slots, and the spooler that moves them to ``results_dir``."""

    def __init__(
        self,
        results_dir: Path,
        directory: Path | None,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        pool_bytes: int = DEFAULT_POOL_BYTES,
    ):
        self.results_dir = results_dir
        self._wanted = directory
        self.dir: Path | None = None  # made private by start(): staging is off until then
        self.max_bytes, self.max_file_bytes, self.pool_bytes = max_bytes, max_file_bytes, pool_bytes
        self._lock = threading.Lock()  # the backlog, the pool; a move against a removal
        self._idle = threading.Condition(self._lock)
        self._backlog = 0
        self._offered: set[str] = set()  # jobs handed a result_stage that have not ended yet
        self._sizes: dict[str, int] = {}  # staged, queued for the spooler
        self._removed: set[str] = set()  # removed (retention) while staged: not moved
        self._stuck: set[str] = set()  # could not be moved: kept staged for the next start
        self._pool: list[tuple[str, int, float]] = []  # free slots: (name, size, freed at), the last freed last
        self._pool_total = 0
        self._names = itertools.count()
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._tail: mmap.mmap | None = None  # one aligned block for O_DIRECT's last partial block

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    def staged_path(self, job_id: str) -> Path | None:
        return None if self.dir is None else self.dir / f"{job_id}{_SUFFIX}"

    def task_fields(self, job_id: str) -> dict:
        """The worker protocol's ``result_stage`` for a job whose output is an Arrow type: where its result is
        staged, and a free slot nobody holds to write it into, if there is one; none when staging is off or the
        backlog is full. (Other jobs' results are small or JSON as a rule: they go to the home, unstaged.)"""
        path = self.staged_path(job_id)
        with self._lock:
            if path is None or self._backlog >= self.max_bytes:
                return {}
            self._offered.add(job_id)
        stage: dict = {"file": str(path), "max_bytes": self.max_file_bytes}
        taken = self._take_slot(job_id)
        if taken is not None:
            stage["slot"] = str(taken)
        return {"result_stage": stage}

    def _take_slot(self, job_id: str) -> Path | None:
        """The most recently freed slot that nobody holds (of the last few: dispatch stays cheap), as the job's."""
        assert self.dir is not None
        with self._lock:
            candidates = self._pool[-_SLOT_TRIES:][::-1]
        for entry in candidates:
            free, slot = self.dir / entry[0], self.dir / f"{job_id}{_SLOT}"
            if not unshared(free):  # a reader still maps its old result: it stays in the pool for later
                continue
            with self._lock:
                if entry not in self._pool:
                    continue
                self._pool.remove(entry)
                self._pool_total -= entry[1]
                try:
                    os.replace(free, slot)
                except OSError:
                    continue
            return slot
        return None

    def is_staged(self, path: str | os.PathLike[str], job_id: str) -> bool:
        staged = self.staged_path(job_id)
        return staged is not None and os.fspath(path) == os.fspath(staged)

    def find(self, final: Path, job_id: str) -> Path:
        """Where the result of ``job_id`` is now: staged (memory), else in the home (``final`` when neither)."""
        staged = self.staged_path(job_id)
        if staged is not None and staged.exists():
            return staged
        return final

    # ----------------------------------------------------------------- the spooler

    def start(self) -> None:
        """Move what a killed server left staged (before any job is recovered), then start the spooler."""
        if self._wanted is None or self._thread is not None:
            return
        if not self._wanted.parent.is_dir():
            return  # no /dev/shm here (macOS): results go to the home directly
        if not _private_dir(self._wanted):
            log.warning("results are not staged in memory: %s is not a private directory of ours", self._wanted)
            return
        self.dir = self._wanted
        for entry in sorted(os.scandir(self.dir), key=lambda e: e.name):
            if entry.name.endswith(_SUFFIX):
                try:
                    self._move(entry.name[: -len(_SUFFIX)])
                except OSError:
                    log.exception("could not move the staged result %s to the home", entry.path)
            elif entry.name.endswith(_SLOT) or entry.name.startswith(_FREE):
                self._free(Path(entry.path))  # a slot a killed worker held, or the pool: pages to reuse
            else:
                _unlink(Path(entry.path))
        self._thread = threading.Thread(target=self._spool, name="lancefn-result-spooler", daemon=True)
        self._thread.start()

    def staged(self, job_id: str) -> None:
        """A result was staged for ``job_id``: queue its move to the home."""
        path = self.staged_path(job_id)
        if path is None:
            return
        try:
            size = path.stat().st_size
        except OSError:
            return
        with self._lock:
            self._backlog += size - self._sizes.get(job_id, 0)
            self._sizes[job_id] = size
        self._queue.put(job_id)

    def remove(self, job_id: str) -> None:
        """Retention removed the job's result: drop a staged copy too, and never move it."""
        path = self.staged_path(job_id)
        if path is None:
            return
        with self._lock:
            if job_id in self._sizes:
                self._removed.add(job_id)
            _unlink(path)

    def discard(self, job_id: str) -> None:
        """The job ended: its unused slot goes back to the pool, and a staged file no result took (the job
        failed, timed out or was cancelled after writing it) goes, since it holds memory."""
        with self._lock:
            if self.dir is None or job_id not in self._offered:
                return  # the common case, without a system call
            self._offered.discard(job_id)
        slot = self.dir / f"{job_id}{_SLOT}"
        if slot.exists():
            self._free(slot)
        with self._lock:
            if job_id not in self._sizes and job_id not in self._stuck:
                _unlink(self.dir / f"{job_id}{_SUFFIX}")

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every staged result is in the home (a graceful stop); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._sizes, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """A graceful stop: staged results reach the home; the pool's memory is given back."""
        if self._thread is None:
            return
        self.flush(timeout)
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None
        self._trim(0.0)
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        if self.dir is not None:
            try:
                self.dir.rmdir()  # empty unless a result is stuck there; the next start moves it
            except OSError:
                pass
        self.dir = None  # what comes now goes to the home directly

    def _spool(self) -> None:
        while True:
            try:
                job_id = self._queue.get(timeout=POOL_IDLE_S / 2)
            except queue.Empty:
                self._trim(POOL_IDLE_S)
                continue
            if job_id is None:
                return
            try:
                self._move(job_id)
            except Exception:  # it stays staged; the next start moves it
                log.exception("could not move the staged result of job %s to the home", job_id)
                with self._lock:
                    self._stuck.add(job_id)
            finally:
                with self._idle:
                    self._backlog -= self._sizes.pop(job_id, 0)
                    self._removed.discard(job_id)
                    self._idle.notify_all()

    def _move(self, job_id: str) -> None:
        """Write the staged file to the home under a temp name, rename it into place, then pool the staged one."""
        assert self.dir is not None
        staged = self.dir / f"{job_id}{_SUFFIX}"
        final = self.results_dir / f"{job_id}{_SUFFIX}"
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        self.results_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            self._copy(staged, tmp)
        except FileNotFoundError:
            _unlink(tmp)
            return  # removed meanwhile (retention)
        with self._lock:  # against remove(): a result retention took is never put back
            if job_id in self._removed or not staged.exists():
                _unlink(tmp)
                return
            os.replace(tmp, final)
        self._free(staged)  # readers that opened it keep it; new ones read the home's

    def _copy(self, source: Path, target: Path) -> None:
        """``source`` into a new file ``target`` (0600): with O_DIRECT where the file system takes it."""
        with open(source, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o600)
            except OSError:  # no O_DIRECT here (e.g. a tmpfs home)
                fd = -1
            if fd < 0 or size == 0:
                if fd >= 0:
                    os.close(fd)
                shutil.copyfile(source, target)
                os.chmod(target, 0o600)
                return
            try:
                with mmap.mmap(src.fileno(), size, prot=mmap.PROT_READ) as view:
                    whole, done = size - size % _BLOCK, 0
                    with memoryview(view) as data:  # page-aligned: the mapping starts on a page
                        while done < whole:  # a short write leaves an unaligned offset: EINVAL, then a plain copy
                            done += os.write(fd, data[done:whole])
                    if whole < size:
                        tail = self._tail_block()
                        tail[: size - whole] = view[whole:size]
                        tail[size - whole :] = bytes(_BLOCK - (size - whole))
                        os.write(fd, tail)
                os.ftruncate(fd, size)
            except OSError as error:
                os.close(fd)
                fd = -1
                log.debug("O_DIRECT copy failed (%s); copying through the page cache", error)
                shutil.copyfile(source, target)
                os.chmod(target, 0o600)
            finally:
                if fd >= 0:
                    os.close(fd)

    def _tail_block(self) -> mmap.mmap:
        if self._tail is None:
            self._tail = mmap.mmap(-1, _BLOCK)  # anonymous: page-aligned, as O_DIRECT wants
        return self._tail

    def _free(self, path: Path) -> None:
        """Put a slot into the pool (renamed ``free-<pid>-<n>``), or remove it when the pool is full."""
        try:
            size = path.stat().st_size
        except OSError:
            return
        assert self.dir is not None
        name = f"{_FREE}{os.getpid()}-{next(self._names)}"
        with self._lock:
            if self._pool_total + size > self.pool_bytes:
                _unlink(path)
                return
            try:
                os.replace(path, self.dir / name)
            except OSError:
                return
            self._pool.append((name, size, time.monotonic()))
            self._pool_total += size

    def _trim(self, idle_s: float) -> None:
        """Give back the memory of free slots unused for ``idle_s``, and of what a job that ended left behind
        (its worker, being killed, renamed its result after the job was over)."""
        assert self.dir is not None
        now = time.monotonic()
        with self._lock:
            keep = [entry for entry in self._pool if now - entry[2] < idle_s]
            for name, _, _ in (entry for entry in self._pool if now - entry[2] >= idle_s):
                _unlink(self.dir / name)
            self._pool = keep
            self._pool_total = sum(size for _, size, _ in keep)
            held = self._offered | set(self._sizes) | self._stuck
        for entry in os.scandir(self.dir):
            job_id, _, kind = entry.name.rpartition(".")
            if f".{kind}" not in (_SUFFIX, _SLOT) or job_id in held:
                continue
            try:
                if time.time() - entry.stat().st_mtime < idle_s:
                    continue  # ended just now: discard() or the spooler may still act on it
            except OSError:
                continue
            with self._lock:
                if job_id in self._offered or job_id in self._sizes or job_id in self._stuck:
                    continue
            if kind == _SLOT[1:]:
                self._free(Path(entry.path))
            else:
                _unlink(Path(entry.path))


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
