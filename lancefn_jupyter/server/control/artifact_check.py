"""Static checks of an uploaded artifact: UTF-8 Python source that defines its entrypoint.

Large artifacts are parsed in a child process.  ``ast.parse`` holds the GIL for the whole
parse — seconds and gigabytes for a few MiB of literals like ``x=[0,0,…]`` — so even from a
worker thread it would stall every other request (health, SSE, other clients).  Small ones,
the usual case, are parsed in-process where it costs well under a millisecond.

A worst-case artifact takes GBs to parse, so only ``CHILDREN`` large registrations are parsed and checked at once
(``CheckTurns``): a request waits for its turn on the event loop, holding no thread, the waiting callers' keys served
in turn, so one key's burst of large registrations neither takes the threads (nor the GIL) other requests need nor
makes another key's registration wait behind all of it (docs/ARCHITECTURE.md, "REST details").

    python -m lancefn_jupyter.server.control.artifact_check ENTRYPOINT [PLAIN...] < artifact   → [problem, arrow] (JSON)
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import subprocess
import sys
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Hashable
from typing import NamedTuple

from lancefn_jupyter.server.errors import ApiError

__all__ = ["CHILDREN", "IN_PROCESS_MAX_BYTES", "CheckTurns", "Checked", "check_artifact", "in_process"]

IN_PROCESS_MAX_BYTES = 16 * 1024  # parses in a few ms at worst
CHILD_TIMEOUT_S = 60.0
CHILDREN = 2  # checker children at once


def in_process(data: bytes) -> bool:
    """Whether an artifact of ``data`` (or any artifact a registration body of ``data`` carries, base64 being larger
    than its bytes) is small enough to be parsed in the server's process."""
    return len(data) <= IN_PROCESS_MAX_BYTES


class CheckTurns:
    """Turns of large registrations (parsing them, checking their artifacts in a child), taken on the event loop: at
    most ``children`` at once, the waiting keys served round robin (FIFO within a key), and at most ``per_key``
    waiting or in their turn per key (``flag`` names it): past that, that key's next one is a 429."""

    def __init__(self, per_key: int, flag: str, children: int = CHILDREN) -> None:
        self.per_key, self.flag = per_key, flag
        self._free = children
        self._waiting: OrderedDict[Hashable, deque[asyncio.Future[None]]] = OrderedDict()
        self._held: dict[Hashable, int] = {}  # per key: waiting or running

    @contextlib.asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        """Hold one turn for ``key`` while the block runs."""
        held = self._held.get(key, 0)
        if held >= self.per_key:
            raise ApiError(
                429,
                f"this API key already has {self.per_key} large registrations waiting for their syntax check, the "
                f"server's limit ({self.flag}); register fewer at once, or start lancefn-server with a larger "
                f"{self.flag}",
            )
        self._held[key] = held + 1
        try:
            await self._wait(key)
            try:
                yield
            finally:
                self._next()
        finally:
            left = self._held[key] - 1
            if left:
                self._held[key] = left
            else:
                del self._held[key]

    async def _wait(self, key: Hashable) -> None:
        if self._free and not self._waiting:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._next()  # the turn came as the request was cancelled: pass it on
            else:
                self._forget(key, turn)
            raise

    def _next(self) -> None:
        """A turn ends: the next waiting key's oldest gets it (that key then goes last), else a child is free."""
        while self._waiting:
            key, turns = next(iter(self._waiting.items()))
            turn = turns.popleft()
            if turns:
                self._waiting.move_to_end(key)
            else:
                del self._waiting[key]
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def _forget(self, key: Hashable, turn: asyncio.Future[None]) -> None:
        turns = self._waiting.get(key)
        if turns is not None and turn in turns:
            turns.remove(turn)
            if not turns:
                del self._waiting[key]


class Checked(NamedTuple):
    """An artifact's check: what is wrong with it (a message saying how to fix it) or None, and ``arrow``: the
    per-row signature's ``plain`` parameters (and ``"return"``) its entry annotates as a pyarrow batch type, each with
    that type's name (``Array``, ``RecordBatch`` ...): a LanceDB batch UDF (``dialect.batch_udf``)."""

    problem: str | None
    arrow: dict[str, str]


def check_artifact(artifact: bytes, entrypoint: str, plain: tuple[str, ...] = ()) -> Checked:
    """Check ``artifact`` (the entry's Python source).  A large one is parsed in a child process here and now: the
    server takes a turn at the children first (``CheckTurns``).  ``plain``: the parameters (and ``"return"``) a
    per-row signature declares with a plain Arrow type (this server's own per-row ``pyarrow.Array`` / ``Table``
    values are typed ``arrow.*``)."""
    if in_process(artifact):
        return _check(artifact, entrypoint, plain)
    try:
        done = subprocess.run(
            # -P, cwd /: it runs as the server's user (root), so never from a directory another user can write
            [sys.executable, "-P", "-m", __name__, entrypoint, *plain],
            input=artifact,
            cwd="/",
            capture_output=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        return Checked(
            f"artifact content could not be checked within {CHILD_TIMEOUT_S:.0f}s and the checker's memory "
            "(too large or too deeply nested); keep data out of the source and package the function with "
            "lancefn_jupyter.packaging",
            {},
        )
    problem, arrow = json.loads(done.stdout)
    return Checked(problem, arrow)


def _check(artifact: bytes, entrypoint: str, plain: tuple[str, ...] = ()) -> Checked:
    # Cheap early checks so a broken upload fails at registration, not at the first run.
    try:
        tree = ast.parse(artifact.decode("utf-8"), filename="<artifact>")
    except UnicodeDecodeError:
        return Checked(
            "artifact content is not UTF-8 Python source; package the function with lancefn_jupyter.packaging", {}
        )
    except (SyntaxError, ValueError) as error:
        return Checked(
            f"artifact content is not valid Python ({error}); package the function with lancefn_jupyter.packaging", {}
        )
    except (MemoryError, RecursionError):  # the parser's own stack (e.g. 100 000 nested unary minus signs)
        return Checked(
            "artifact content is nested too deeply for the Python parser; simplify the expression or keep data "
            "out of the source, and package the function with lancefn_jupyter.packaging",
            {},
        )
    defined = set()
    arrow: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
            if plain and node.name == entrypoint:
                arrow = _arrow_batches(node, frozenset(plain))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    if entrypoint not in defined:
        return Checked(
            f"artifact.entrypoint {entrypoint!r} is not defined at the top level of the artifact; name the entry "
            "function",
            {},
        )
    return Checked(None, arrow)


_ARROW_BATCHES = frozenset({"Array", "ChunkedArray", "RecordBatch", "Table"})


def _arrow_batches(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, plain: frozenset[str]
) -> dict[str, str]:
    """The ``plain`` parameters (and ``"return"``) the entry (a function, or a class's ``__call__``) annotates as a
    pyarrow batch type (``pa.Array``, ``pyarrow.RecordBatch`` ...), each with that type's name."""
    if isinstance(node, ast.ClassDef):
        calls = [
            n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__call__"
        ]
        return _arrow_batches(calls[-1], plain) if calls else {}
    args = node.args
    named = [(a.arg, a.annotation) for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    found = {}
    for name, annotation in [*named, ("return", node.returns)]:
        if name not in plain or annotation is None:
            continue
        for part in ast.walk(annotation):
            if (
                isinstance(part, ast.Attribute)
                and part.attr in _ARROW_BATCHES
                and isinstance(part.value, ast.Name)
                and part.value.id in ("pa", "pyarrow")
            ):
                found[name] = part.attr
                break
    return found


if __name__ == "__main__":
    sys.stdout.write(json.dumps(_check(sys.stdin.buffer.read(), sys.argv[1], tuple(sys.argv[2:]))))
