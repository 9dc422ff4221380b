"""A team's backfill table I/O with the team's own rights (docs/ARCHITECTURE.md, "Backfills", "Which tables").

On a server shared by several namespaces, a namespace key's backfill of a local table never touches it as the
control plane's user (root): its plan, each chunk's slice read and each fragment commit run in a table agent
(``tables/agent.py``), a process of the uid and gid that own the namespace's table root, with no other groups, so
the kernel's own checks apply to every file the table's tree leads to. Before each, the tree is checked
(``table_tree.py``) for a clear refusal. The agent gets what it needs of the server's private home as open
descriptors (the rows file to write, a chunk's result file), never paths; one agent per owner, started on first
use and again once it has died (a request it was serving fails, saying so).

Object-store tables (``s3://…``) have no local files: they are opened as before, by the control plane.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lancefn_jupyter.server.executors.base import TaskSpec
from lancefn_jupyter.server.executors.isolation import worker_environment
from lancefn_jupyter.server.executors.table_tree import TreeCheck
from lancefn_jupyter.tables.agent import recv_frame, send_frame
from lancefn_jupyter.wire.backfill_models import TableSlice
from lancefn_jupyter.wire.homefs import replace_atomically

__all__ = [
    "AGENT_REPLY_TIMEOUT_S",
    "AGENT_START_TIMEOUT_S",
    "RemotePlanSource",
    "TableAccessError",
    "TableAgent",
    "TableAgents",
    "read_rows",
]

AGENT_START_TIMEOUT_S = 60.0
# The longest an agent may work between two frames of a request (a plan's scan, a slice read, a commit's write
# between two chunks; the wait for a chunk is the control plane's, not counted): one that hangs (its own table's
# FIFO, swapped in after the check) fails its request instead of holding the thread for ever.
AGENT_REPLY_TIMEOUT_S = 600.0


class TableAccessError(Exception):
    """A team's table I/O refused or failed; the message says why and what to do. ``status``: the HTTP status a
    create answers with (403: the table or its root is refused; 503: the agent could not do it)."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


class TableAgent:
    """One agent process, run as ``uid``/``gid`` (or as the server's own user when it is not root)."""

    def __init__(self, uid: int, gid: int) -> None:
        self.uid, self.gid = uid, gid
        self._lock = threading.Lock()  # starting the process and handing it a request's socket
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)

    def _start(self) -> None:
        """A new agent process, ready to serve (lock held); TableAccessError saying why it could not start."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        switch = os.geteuid() == 0 and self.uid != os.geteuid()
        user: dict[str, Any] = {"user": self.uid, "group": self.gid, "extra_groups": []} if switch else {}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lancefn_jupyter.tables.agent", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=worker_environment(os.environ, switched=True),
                cwd="/",
                start_new_session=True,
                **user,
            )
        except OSError as error:
            ours.close()
            raise TableAccessError(f"the table agent for uid {self.uid} could not start: {error}") from None
        finally:
            theirs.close()
        self._stderr.clear()
        threading.Thread(target=self._drain, args=(proc,), name="lancefn-table-agent-err", daemon=True).start()
        ours.settimeout(AGENT_START_TIMEOUT_S)
        try:
            recv_frame(ours)
        except (OSError, EOFError, ValueError):
            ours.close()
            _end(proc)
            raise TableAccessError(
                f"the table agent for uid {self.uid} could not start ({self._why(proc)}); that user must be able to "
                f"run {sys.executable} and import lancefn_jupyter (e.g. `chmod o+x` the directories above them)"
            ) from None
        ours.settimeout(None)
        self._proc, self._control = proc, ours

    def _drain(self, proc: subprocess.Popen) -> None:
        """Keep the agent's last stderr lines (its start failure says why), never in the server's log."""
        assert proc.stderr is not None
        with proc.stderr:
            for line in proc.stderr:
                self._stderr.append(line.decode(errors="replace").rstrip()[:500])

    def _why(self, proc: subprocess.Popen) -> str:
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "it is running but closed the request"
        lines = [line for line in self._stderr if line.strip()]
        return f"exit code {code}" + (f": {lines[-1]}" if lines else "")

    def _connect(self) -> socket.socket:
        """A socket of its own for one request, handed to the (re)started agent."""
        with self._lock:
            for _ in range(2):
                if self._proc is None or self._proc.poll() is not None:
                    self._stop()
                    self._start()
                assert self._control is not None
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    send_frame(self._control, {}, [theirs.fileno()])
                    return mine
                except OSError:  # it died between two requests: once more with a new one
                    mine.close()
                    self._stop()
                finally:
                    theirs.close()
        raise TableAccessError(f"the table agent for uid {self.uid} stopped as it was handed a request")

    def call(self, request: dict, fds: Sequence[int] = (), load: Callable[[int], int] | None = None) -> dict:
        """``request``'s reply; ``load(i)`` opens part i's results for a commit (its descriptor, closed here once
        sent); an exception of ``load`` ends the request (the agent's commit ends unwritten) and is raised. An
        agent found dead before it answered anything (killed between two requests, its end not yet seen) is
        started again and asked once more: every request is idempotent (a commit too, "Backfills")."""
        try:
            return self._call(request, fds, load)
        except _DiedFirst:
            return self._call(request, fds, load, retry=False)

    def _call(
        self, request: dict, fds: Sequence[int], load: Callable[[int], int] | None, *, retry: bool = True
    ) -> dict:
        with self._connect() as conn:
            conn.settimeout(AGENT_REPLY_TIMEOUT_S)
            try:
                self._exchange(conn, request, fds)
                reply, got = self._exchange(conn)
            except TableAccessError:
                if retry and self._dead():
                    raise _DiedFirst from None
                raise
            while True:
                for fd in got:
                    os.close(fd)
                if "load" not in reply:
                    return reply
                if load is None:
                    raise TableAccessError("the table agent asked for results outside a commit")
                fd = load(int(reply["load"]))
                try:
                    self._exchange(conn, {"file": True}, [fd])
                finally:
                    os.close(fd)
                reply, got = self._exchange(conn)

    def _exchange(
        self, conn: socket.socket, message: dict | None = None, fds: Sequence[int] = ()
    ) -> tuple[dict, list[int]]:
        """Send ``message`` (with ``fds``), or receive the next frame; the agent's end said as TableAccessError."""
        try:
            if message is not None:
                send_frame(conn, message, fds)
                return message, []
            return recv_frame(conn)
        except TimeoutError:
            raise TableAccessError(
                f"the table agent for uid {self.uid} did not answer within {AGENT_REPLY_TIMEOUT_S:g} s; "
                "a file of the table may block reads (a FIFO or a hung file system)"
            ) from None
        except (OSError, EOFError, ValueError):
            raise TableAccessError(
                f"the table agent for uid {self.uid} stopped during the request ({self._why_now()}); "
                "it is started again for the next one"
            ) from None

    def _dead(self) -> bool:
        """Whether the agent that served the last request has ended (it is then started again by ``_connect``)."""
        with self._lock:
            proc = self._proc
        if proc is None:
            return True
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _why_now(self) -> str:
        with self._lock:
            proc = self._proc
        return "it is gone" if proc is None else self._why(proc)

    def _stop(self) -> None:
        """Close the control socket (the agent exits at its end) and reap the process (lock held)."""
        control, proc, self._control, self._proc = self._control, self._proc, None, None
        if control is not None:
            control.close()
        if proc is not None:
            _end(proc)

    def close(self) -> None:
        with self._lock:
            self._stop()


class _DiedFirst(Exception):
    """The agent ended before it answered a request: nothing of it was done, so it may be asked again."""


def _end(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _checked(reply: dict, agent: TableAgent, doing: str) -> dict:
    """The reply, or its failure raised as the kind it is (TableError, CommitFailed, else TableAccessError saying
    what the agent was ``doing`` and as whom: the kernel's refusal of a file the team cannot reach lands here)."""
    if "error" not in reply:
        return reply
    from lancefn_jupyter.tables.commit import CommitFailed
    from lancefn_jupyter.tables.plan import TableError

    message, kind = str(reply["error"])[:4000], reply.get("kind")
    if kind == "table":
        raise TableError(message)
    if kind == "commit":
        raise CommitFailed(message)
    raise TableAccessError(
        f"{doing} with the rights of uid {agent.uid} (the owner of the namespace's table root) failed: {message}; "
        "every file of the table must be the team's own, under its table root"
    )


class RemotePlanSource:
    """``tables.plan.PlanSource`` through a table agent: the schema and version read now, the plan at that version."""

    def __init__(self, agent: TableAgent, uri: str) -> None:
        import pyarrow as pa

        self.agent, self.uri = agent, uri
        reply = _checked(agent.call({"op": "schema", "uri": uri}), agent, "opening the table")
        self.version = int(reply["version"])
        self.schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(reply["schema"])))

    def plan(self, **options: Any) -> Any:
        from lancefn_jupyter.tables.plan import Plan

        request = {"op": "plan", "uri": self.uri, "table_version": self.version, "options": options}
        reply = _checked(self.agent.call(request), self.agent, "planning the rows")
        try:
            fragments = {int(fid): int(rows) for fid, rows in reply["fragments"]}
            chunks = [
                {"fragment": int(c["fragment"]), "ranges": [[int(a), int(b)] for a, b in c["ranges"]]}
                for c in reply["chunks"]
            ]
            return Plan(table_version=int(reply["table_version"]), fragments=fragments, chunks=chunks)
        except (KeyError, TypeError, ValueError):
            raise TableAccessError("the table agent answered a plan that is not one") from None


class TableAgents:
    """The agents by owner, and the checks before each use (any thread but the event loop; never under the job
    table's lock: a check walks the table's tree and a request waits for the agent)."""

    def __init__(self) -> None:
        self._agents: dict[tuple[int, int], TableAgent] = {}
        self._lock = threading.Lock()
        self.tree = TreeCheck()

    def agent(self, root: str) -> TableAgent:
        """The agent of the owner of the table root ``root``; a root owned by uid 0 is refused (403)."""
        try:
            st = os.stat(root)
        except OSError as error:
            raise TableAccessError(f"the table root {root} cannot be read ({error.strerror})", 403) from None
        if os.geteuid() != 0:
            key = (os.geteuid(), os.getegid())  # a server that is not root can only act as itself
        elif st.st_uid == 0:
            raise TableAccessError(
                f"the table root {root} belongs to root, so a backfill there would read and write with the server's "
                "rights, not the team's; ask the operator to give it to the team's own user "
                f"(`chown -R <team-user>: {root}`)",
                403,
            )
        else:
            key = (st.st_uid, st.st_gid)
        with self._lock:
            agent = self._agents.get(key)
            if agent is None:
                agent = self._agents[key] = TableAgent(*key)
        return agent

    def check(self, root: str, uri: str) -> None:
        """TableAccessError (403) when the table's tree leads out of ``root`` (``table_tree``)."""
        problem = self.tree.problem(uri, root)
        if problem is not None:
            raise TableAccessError(f"table {uri}: {problem}", 403)

    def plan_source(self, root: str, uri: str) -> RemotePlanSource:
        agent = self.agent(root)
        self.check(root, uri)
        return RemotePlanSource(agent, uri)

    def read_slice(self, table_slice: TableSlice, input_types: Mapping[str, str], rows_file: str) -> None:
        """The slice's rows into ``rows_file`` (atomically), read by the agent of ``table_slice.root``."""
        root = table_slice.root
        if root is None:
            raise TableAccessError("the slice names no table root: the control plane reads it itself")
        agent = self.agent(root)
        self.check(root, table_slice.uri)
        tmp = f"{rows_file}.tmp-{os.getpid()}"

        def write() -> None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            try:
                request = {"op": "slice", "slice": table_slice.to_wire(), "input_types": dict(input_types)}
                _checked(agent.call(request, [fd]), agent, "reading the chunk's rows")
            finally:
                os.close(fd)

        os.makedirs(os.path.dirname(rows_file), mode=0o700, exist_ok=True)
        replace_atomically(tmp, rows_file, write)

    def commit(
        self,
        root: str,
        uri: str,
        fragment: int,
        *,
        into: str,
        output_type: str,
        version: str,
        parts: Sequence[tuple[Sequence[Sequence[int]], Callable[[], int]]],
    ) -> int:
        """``tables.commit.commit_fragment`` by the agent of ``root``; ``parts``: each chunk's ranges and how to
        open its results (a descriptor; called when the commit reaches it). Raises as ``commit_fragment`` does,
        or TableAccessError."""
        agent = self.agent(root)
        self.check(root, uri)
        request = {
            "op": "commit",
            "uri": uri,
            "fragment": fragment,
            "into": into,
            "output_type": output_type,
            "version": version,
            "parts": [ranges for ranges, _ in parts],
        }

        def load(index: int) -> int:
            if not 0 <= index < len(parts):
                raise TableAccessError(f"the table agent asked for part {index} of a commit of {len(parts)}")
            return parts[index][1]()

        reply = _checked(agent.call(request, load=load), agent, f"writing fragment {fragment}")
        try:
            return int(reply["table_version"])
        except (KeyError, TypeError, ValueError):
            raise TableAccessError("the table agent answered a commit without its table version") from None

    def close(self) -> None:
        with self._lock:
            agents, self._agents = list(self._agents.values()), {}
        for agent in agents:
            with contextlib.suppress(Exception):
                agent.close()


def read_rows(agents: TableAgents | None, task: TaskSpec) -> None:
    """A backfill chunk's slice into its rows file (``data.rows_file``): by the team's table agent when the slice
    names its table root (a shared server's namespace key), else here as before (docs/ARCHITECTURE.md,
    "Backfills", "Running a chunk")."""
    table_slice, input_types, rows_file = task.table_slice, task.data.input_types, task.data.rows_file
    if table_slice is None or rows_file is None:
        raise ValueError("the task is no backfill chunk: it has no table slice to read into a rows file")
    if table_slice.root is not None:
        if agents is None:
            raise TableAccessError("this executor has no table agents to read a team's table with")
        agents.read_slice(table_slice, input_types, rows_file)
        return
    from lancefn_jupyter.tables.slices import read_slice
    from lancefn_jupyter.wire.dataplane import write_ipc_file

    write_ipc_file(rows_file, read_slice(table_slice, input_types), durable=False)
