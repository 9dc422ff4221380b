"""The parent's handle on a warm worker process (``worker.py``), used by the local executor and by
``lancefn_jupyter.kernel.handles.local_run`` (docs/ARCHITECTURE.md, "Worker protocol"): start it, send a task, read
its events, stop or kill it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, cast

import orjson

from lancefn_jupyter.wire import dataplane  # imports neither numpy nor pyarrow until a task uses the data plane
from lancefn_jupyter.wire.jsontext import loads
from lancefn_jupyter.worker import limits, reap
from lancefn_jupyter.worker.protocol import (
    FINAL_EVENTS,
    LINE_MAX_BYTES,
    MAX_PROCS_ENV,
    TEARDOWN_S,
    LineTooLong,
    result_target,
)
from lancefn_jupyter.worker.result import result_too_large

__all__ = [
    "ProtocolError",
    "ProtocolLines",
    "WorkerProcess",
    "WorkerStartError",
    "WorkerTask",
    "describe_exit",
    "invalid_event",
    "long_line",
]

_MODULE = "lancefn_jupyter.worker.main"


class WorkerStartError(RuntimeError):
    """The worker process died before it said ``ready``."""


class ProtocolError(Exception):
    """The worker broke the protocol (docs/ARCHITECTURE.md, "Worker protocol"): its job fails in ``phase`` with
    ``message``, and the worker, whose pipe can no longer be trusted, is killed and never reused."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase, self.message = phase, message


def long_line(sender: str = "the worker", limit: int = LINE_MAX_BYTES) -> str:
    """The failure message of a job whose ``sender`` wrote a protocol line past ``limit``."""
    return (
        f"{sender} sent a protocol line longer than {limit >> 20} MiB (the protocol's limit, "
        "lancefn_jupyter.worker.protocol.LINE_MAX_BYTES) and was replaced; return large data as arrays (numpy or "
        "pyarrow return types), which travel as Arrow files, and never write to the worker's protocol channel"
    )


def invalid_event(event: object, problem: str) -> str:
    """The failure message of a job whose worker sent ``event``, invalid for ``problem``."""
    kind = event.get("event") if isinstance(event, dict) else None
    what = f"{kind[:40]} event" if isinstance(kind, str) and kind else "protocol line"
    return f"the worker sent an invalid {what}: {problem}; it was replaced"


def describe_exit(returncode: int) -> str:
    """'worker process exited with code N' / 'worker process was killed by signal SIGSEGV (…)'."""
    if returncode >= 0:
        return f"worker process exited with code {returncode}"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"worker process was killed by signal {-returncode}"
    hint = {
        signal.SIGSEGV: " (segmentation fault: a crash in native code, e.g. an out-of-bounds access)",
        signal.SIGKILL: " (possibly by the out-of-memory killer)",
        signal.SIGABRT: " (aborted by native code)",
    }.get(sig, "")
    return f"worker process was killed by signal {sig.name}{hint}"


@dataclass(frozen=True)
class WorkerTask:
    """One task for a worker: the artifact's entry function, called once per row.

    ``env``: the function's env, set in the worker before the artifact loads.  ``data``: the Arrow
    data plane's task fields (``input_types``, ``output_type``, ``rows_file`` instead of ``rows``,
    ``result_file``); see docs/ARCHITECTURE.md, "Worker protocol".  ``state``: ``per_worker`` (the
    module stays loaded for the next task) or ``per_job`` (docs/ARCHITECTURE.md, "Warm state").
    ``python_version``: the ``MAJOR.MINOR`` the version asks for; the worker fails the task in phase
    ``environment`` when its interpreter is another (docs/ARCHITECTURE.md, "Environments").
    """

    task_id: str
    artifact: bytes
    entrypoint: str
    filename: str
    rows: list[dict]
    packages: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    data: Mapping[str, object] = field(default_factory=dict)
    state: str = "per_worker"
    python_version: str | None = None
    # Equal for versions whose setup part is the same: a worker holding one rebinds the other's code onto its live
    # module (docs/ARCHITECTURE.md, "Setup reuse"); None: never reused.
    setup_digest: str | None = None

    def line(self) -> dict:
        """The task line of the protocol (before the parent moves files onto the pipes)."""
        task = {
            "task_id": self.task_id,
            "artifact_b64": base64.b64encode(self.artifact).decode("ascii"),
            "entrypoint": self.entrypoint,
            "filename": self.filename,
            "rows": self.rows,
            "packages": list(self.packages),
            "state": self.state,
            **self.data,
        }
        if self.env:
            task["env"] = dict(self.env)
        if self.python_version:
            task["python_version"] = self.python_version
        if self.setup_digest:
            task["setup_digest"] = self.setup_digest
        if "rows_file" in task:
            del task["rows"]
        return task


def _task_line(task: dict) -> bytes:
    """A task's protocol line: orjson, a twentieth of the standard library's time on a quick job's path; the standard
    library for what orjson refuses (integers over 64 bits, lone surrogates). The rows were checked to be JSON."""
    try:
        return orjson.dumps(task, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        return json.dumps(task, separators=(",", ":")).encode() + b"\n"


class ProtocolLines:
    """A protocol pipe (a worker's, the Ray bridge's), read through a buffer of our own: so :meth:`ready` can tell,
    without blocking, whether a whole event is there (a buffered reader may hold one the pipe no longer shows), and
    the event loop and a thread can take turns reading it. A line is at most ``limit`` bytes: a longer one is dropped
    as it comes (:class:`LineTooLong`; the rest of it is skipped), so the buffer never holds much more than that."""

    _CHUNK = 1 << 16

    def __init__(self, pipe: BinaryIO, limit: int = LINE_MAX_BYTES) -> None:
        # Read through the pipe's file object, never its bare fd: once a concurrent kill closed it, a read
        # raises instead of reading whatever file got that descriptor number next.
        self._raw = cast("io.RawIOBase", getattr(pipe, "raw", pipe))
        self._buffer = bytearray()
        self.limit = limit
        self._skipping = False  # the rest of a dropped line is still to come

    def ready(self, timeout: float) -> bool:
        """A line is buffered, or the pipe has something (a line, the rest of one, or its end) within ``timeout``."""
        if b"\n" in self._buffer:
            return True
        try:
            return bool(select.select([self._raw], [], [], max(0.0, timeout))[0])
        except (OSError, ValueError):  # closed by a concurrent kill: reading says so
            return True

    def readline(self) -> bytes:
        """The next line with its newline; what is left without one at the pipe's end; b"" at the end.
        :class:`LineTooLong` for a line past the limit."""
        start = 0
        while (end := self._buffer.find(b"\n", start)) < 0:
            if len(self._buffer) >= self.limit:
                self._drop()
            start = len(self._buffer)
            chunk = self._wait_read(self._CHUNK)
            if not chunk:
                line = bytes(self._buffer)
                self._buffer.clear()
                return line
            self._take(chunk)
        if end >= self.limit:
            self._drop()
        line = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        return line

    def fileno(self) -> int:
        return self._raw.fileno()

    def fill(self) -> bool:
        """Take what the pipe has now into the buffer: call it only when the pipe is readable (the event loop says so),
        so it never waits. False at the pipe's end (or once a concurrent kill closed it)."""
        try:
            chunk = self._raw.read(self._CHUNK)
        except (OSError, ValueError):
            return False
        if chunk is None:  # nothing after all (a loop sets the pipe non-blocking while it watches it)
            return True
        if not chunk:
            return False
        self._take(chunk)
        return True

    def buffered_line(self, limit: int | None = None) -> bytes | None:
        """The next whole line in the buffer, left there (:meth:`drop_line` takes it); None when there is none yet.
        ``ValueError`` when it is, or will be, longer than ``limit`` bytes, a reader's own below the protocol's (the
        line is left for another reader); :class:`LineTooLong` past the protocol's limit (the line is dropped)."""
        end = self._buffer.find(b"\n")

        def over(bound: int) -> bool:
            return len(self._buffer) >= bound if end < 0 else end >= bound

        if limit is not None and limit < self.limit and over(limit):
            raise ValueError(f"a protocol line longer than {limit} bytes")
        if over(self.limit):
            self._drop()
        return None if end < 0 else bytes(self._buffer[: end + 1])

    def more_than_one_line(self) -> bool:
        end = self._buffer.find(b"\n")
        return 0 <= end < len(self._buffer) - 1

    def drop_line(self) -> None:
        end = self._buffer.find(b"\n")
        del self._buffer[: end + 1]

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes (fewer only at the pipe's end): the buffer first, then the pipe."""
        if self._buffer:
            data = bytes(self._buffer[:size])
            del self._buffer[:size]
            return data
        return self._wait_read(size)

    def _take(self, chunk: bytes) -> None:
        """Into the buffer, less the rest of a dropped line."""
        if self._skipping:
            end = chunk.find(b"\n")
            if end < 0:
                return
            self._skipping = False
            chunk = chunk[end + 1 :]
        self._buffer += chunk

    def _drop(self) -> None:
        """The line at the buffer's start is past the limit: dropped, with what of it is still to come."""
        end = self._buffer.find(b"\n")
        if end < 0:
            self._buffer.clear()
            self._skipping = True
        else:
            del self._buffer[: end + 1]
        raise LineTooLong(self.limit)

    def _wait_read(self, size: int) -> bytes:
        """Up to ``size`` bytes from the pipe, waiting for them; b"" at its end. The pipe may be non-blocking: an event
        loop that watched it (``add_reader``) left it so, and a thread reads on after it."""
        while (chunk := self._raw.read(size)) is None:
            select.select([self._raw], [], [])
        return chunk


class WorkerProcess:
    """Parent's handle on one warm worker; use from one thread at a time, except :meth:`kill`."""

    def __init__(
        self,
        env: Mapping[str, str],
        user: tuple[int, int] | None = None,
        *,
        python: str | None = None,
        pass_fds: Sequence[int] = (),
        contain: bool = False,
        workdir: str | None = None,
        max_procs: int | None = None,
        umask: int | None = None,
    ) -> None:
        """``user``: (uid, gid) to run as (a root server's unprivileged worker user), else ours. ``python``: the
        interpreter (a version's built environment, docs/ARCHITECTURE.md "Environments"), else this one's.
        ``pass_fds``: inherited descriptors (an environment lease, held for the worker's life). ``contain``: in a
        cgroup of its own where one can be made (the control plane's workers: "Job processes"). ``workdir``: its
        private working directory (docs/ARCHITECTURE.md, "Isolation"), removed once the process is reaped; None:
        the parent's cwd. ``max_procs``: its RLIMIT_NPROC (soft and hard, which its user cannot raise again),
        set by the worker before it imports or runs anything of a job. ``umask``: its umask (077 with a uid per
        namespace, so what a job writes is its uid's alone: docs/ARCHITECTURE.md, "Isolation"); None: ours."""
        self.env = dict(env)
        if max_procs is not None:  # the worker sets it first thing (not a preexec_fn: unsafe in a threaded server)
            self.env[MAX_PROCS_ENV] = str(max_procs)
        self.python = python or sys.executable
        # Another user cannot open the home's files: Arrow rows and results then travel on the pipes.
        self.frames = user is not None
        # (result file, fsync, its size limit) of the current task
        self._result_sink: tuple[str, bool, int | None] | None = None
        self._result_stage: dict | None = None  # and where it may be staged ("Result staging")
        switch = {"user": user[0], "group": user[1], "extra_groups": []} if user is not None else {}
        # A new session: Ctrl-C in the server's terminal or a kernel interrupt doesn't reach
        # workers, and killpg also stops processes the user's code started.
        self.process = subprocess.Popen(  # type: ignore[call-overload]
            [self.python, "-m", _MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
            cwd=workdir,
            **switch,
            **({"umask": umask} if umask is not None else {}),
        )
        self._workdir = workdir
        self._out = ProtocolLines(self.process.stdout)
        self._kill_lock = threading.Lock()
        self._cgroup = reap.worker_cgroup(self.process.pid) if contain else None  # before it runs any job
        # Its cgroup's process list, kept open: one read after each task finds what its job left (``strays``).
        self._procs = reap.open_procs(self._cgroup)
        # Its version's CPU and memory, once held to them (:meth:`hold`); whether the kernel killed it past its
        # memory.max (read as it ends: docs/ARCHITECTURE.md, "Compute resources").
        self.held: limits.Held | None = None
        self.oom_killed = False
        self.oom_used = 0  # what the kernel saw it hold at most, when it killed it for its memory (a v1 cgroup's)
        try:
            ready = self._read_event()
        except ProtocolError:
            ready = None
        if ready is None or ready.get("event") != "ready" or not isinstance(ready.get("device"), str):
            detail = self.process.stderr.read().decode("utf-8", "replace").strip()
            self.kill()
            raise WorkerStartError(
                f"{describe_exit(self.process.returncode)} before it was ready"
                + (f": {detail.splitlines()[-1]}" if detail else "")
            )
        self.process.stderr.close()  # the worker has re-pointed fd 2 at its log pipe by now
        self.device: str = ready["device"]

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def usable(self) -> bool:
        """Alive and not stopped (SIGSTOP): a worker fit to be handed a task. (A debugger's tracing stop is left
        alone.) Asked for every job a worker is handed."""
        # Not reaped (only its Popen reaps it, so the pid is still its own), not exited and not stopped.
        return self.process.returncode is None and not reap.child_halted(self.pid)

    def start_task(self, work: WorkerTask) -> None:
        """Send one task; a worker that already died shows up as an early end of :meth:`events`."""
        task = work.line()
        rows_file = None
        self._result_sink, self._result_stage = None, None
        if self.frames:  # the worker gets the rows after the line and sends the result after its event
            rows_file = cast("str | None", task.pop("rows_file", None))
            if rows_file is not None:
                task["rows_len"] = os.path.getsize(rows_file)
            if "result_file" in task:
                most = task.pop("result_max_bytes", None)
                self._result_sink = (str(task.pop("result_file")), bool(task.get("result_fsync", True)), most)
                self._result_stage = task.pop("result_stage", None)
                task["result_frame"] = True
        try:
            self.process.stdin.write(_task_line(task))
            if rows_file is not None:
                with open(rows_file, "rb") as rows_source:
                    shutil.copyfileobj(rows_source, self.process.stdin, 1 << 20)
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):  # ValueError: stdin closed by a concurrent kill
            pass

    def events(self) -> Iterator[dict]:
        """The current task's events up to its ``result``/``failed``; ends early if the worker exits."""
        while (event := self.next_event()) is not None:
            yield event
            if event["event"] in FINAL_EVENTS:
                return

    def event_ready(self, timeout: float) -> bool:
        """Whether :meth:`next_event` has something to read within ``timeout`` seconds (an event, or the end)."""
        return self._out.ready(timeout)

    def events_fd(self) -> int:
        """The protocol pipe's descriptor, for an event loop to watch (``fill_events`` when it is readable)."""
        return self._out.fileno()

    def fill_events(self) -> bool:
        """Read what the pipe has now without waiting (it is readable); False at its end."""
        return self._out.fill()

    def buffered_event(self, limit: int) -> dict | None:
        """The next event already read, parsed and left in the buffer (:meth:`drop_event` takes it); None when no
        whole one is there. ``ValueError`` for a line that is no event (:meth:`next_event` then says why) or longer
        than ``limit`` bytes (below the protocol's limit: :meth:`next_event` reads it). A result frame's event comes
        without its frame: only :meth:`next_event` reads that."""
        line = self._out.buffered_line(limit)
        if line is None:
            return None
        try:
            event = loads(line)
        except RecursionError:  # nested past what the parser follows
            raise ValueError("not a protocol event") from None
        if not isinstance(event, dict):
            raise ValueError("not a protocol event")
        return event

    def drop_event(self) -> None:
        self._out.drop_line()

    def next_event(self) -> dict | None:
        """The worker's next event; None once it exited (or is being killed). :class:`ProtocolError` for a line that
        is no event, is too long, or announces a result frame the task has no room for."""
        return self._read_event()

    def outcome_buffered(self) -> bool:
        """Whether the next line already read is an outcome (``result``/``failed``): after the one just read, a second
        outcome for one task (no read; a line still to come is the next task's to find)."""
        try:
            event = self.buffered_event(self._out.limit - 1)
        except ValueError:
            return False
        return event is not None and event.get("event") in FINAL_EVENTS

    def more_buffered(self) -> bool:
        """Whether the buffer holds more than the next line (no read)."""
        return self._out.more_than_one_line()

    def strays(self) -> bool:
        """Whether a process other than the worker is in its cgroup (one read): something its job started that the
        worker's own sweep could not see (e.g. a child started with ``CLONE_PARENT``, whose parent is ours).
        False without a cgroup (docs/ARCHITECTURE.md, "Job processes")."""
        return self._procs is not None and reap.others_in(self._procs, self.pid)

    def hold(self, cpu: float | None, memory: int | None) -> None:
        """Hold the idle worker to ``cpu`` cores and ``memory`` bytes from now on (``worker/limits.py``)."""
        self.held = limits.hold(self.pid, self._cgroup, cpu, memory, self.held.v1 if self.held else None)

    def memory_used(self) -> int:
        """Resident bytes of the worker and what its job started (in its cgroup)."""
        return limits.memory_used(self.pid, self._cgroup)

    def memory_peak(self) -> int:
        """The most resident bytes the worker held (its high water mark)."""
        return limits.peak_rss(self.pid)

    def end_strays(self) -> bool:
        """Kill what :meth:`strays` found, keeping the worker: it moves to a fresh cgroup of its own and the old one is
        killed whole (no pid race, forks included). False when that could not be done: the worker must be killed."""
        with self._kill_lock:
            if self.process.returncode is not None or self._cgroup is None:
                return False
            fresh = reap.rehouse(self._cgroup, self.pid)
            if fresh is None:
                return False
            reap.close_procs(self._procs)
            self._cgroup, self._procs = fresh, reap.open_procs(fresh)
            if self.held is not None:  # the fresh cgroup holds it as the old one did
                self.hold(self.held.cpu, self.held.memory)
            return True

    def wait(self) -> int:
        return self.process.wait()

    def kill(self, grace_s: float = 2.0) -> None:
        """SIGTERM the worker's process group (and SIGCONT, so a stopped worker handles it: its handler ends
        what its job started), after ``grace_s`` stop it and SIGKILL its descendants (found under it, the
        subreaper, wherever they moved: docs/ARCHITECTURE.md, "Job processes"), then it; reap it. Idempotent."""
        with self._kill_lock:
            if self.process.returncode is None:  # not reaped yet, so the pid/pgid is still ours
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        if sig == signal.SIGKILL:
                            os.kill(self.process.pid, signal.SIGSTOP)  # it starts nothing more meanwhile
                            reap.kill_descendants(self.process.pid)
                        os.killpg(self.process.pid, sig)
                        if sig == signal.SIGTERM:
                            os.killpg(self.process.pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                    try:
                        self.process.wait(grace_s)
                        break
                    except subprocess.TimeoutExpired:
                        continue
                self.process.wait()
            if self.held is not None and self.held.kernel_memory and limits.oom_killed(self._cgroup, self.held):
                self.oom_killed, self.oom_used = True, limits.peak_held(self.held)
            reap.end_cgroup(self._cgroup)  # what it left (a crashed worker's detached processes) ends with it
            limits.release(self.held)
            reap.close_procs(self._procs)
            self._cgroup, self._procs = None, None
            self._close_pipes()
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)

    def stop(self, grace_s: float = 2.0) -> None:
        """Graceful end for an idle worker: close its stdin so it exits, after the teardown of the
        version it holds (bounded by ``TEARDOWN_S`` in the worker), then :meth:`kill`."""
        try:
            self.process.stdin.close()
            self.process.wait(max(grace_s, TEARDOWN_S + 2.0))
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill(grace_s)

    def _read_event(self) -> dict | None:
        try:
            line = self._out.readline()
        except LineTooLong:
            raise ProtocolError("worker", long_line()) from None
        except (ValueError, OSError):  # stdout closed by a concurrent kill
            return None
        if not line.endswith(b"\n"):  # the pipe's end, or what a dying worker wrote of its last line
            return None
        try:
            event = loads(line)
        except (ValueError, RecursionError):
            raise ProtocolError("worker", invalid_event(None, "a line that is not JSON")) from None
        if not isinstance(event, dict):
            raise ProtocolError("worker", invalid_event(None, "a line that is not a JSON object"))
        return self._read_frame(event) if "ipc_len" in event else event

    def _read_frame(self, event: dict) -> dict | None:
        """An Arrow result frame's event, its frame streamed into the job's result file (staged when it fits: "Result
        staging"; a stream is written to a new file, never a slot); None if the worker died mid-frame."""
        size = event.pop("ipc_len")
        if self._result_sink is None or event.get("event") != "result" or type(size) is not int or size < 0:
            raise ProtocolError("worker", invalid_event(event, "an unexpected result frame"))
        path, durable, most = self._result_sink
        if most is not None and size > most:
            raise ProtocolError("result", result_too_large(size, most))
        path, _ = result_target({"result_file": path, "result_stage": self._result_stage}, size)
        try:
            event["nbytes"] = dataplane.write_stream_file(path, self._out, size, durable=durable)
        except (EOFError, ValueError, OSError):  # the worker died mid-frame, or a concurrent kill closed the pipe
            return None
        event["result_file"] = path
        return event

    def _close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            try:
                pipe.close()
            except OSError:
                pass
