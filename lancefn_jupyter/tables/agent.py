"""The table agent: a team's backfill table I/O done with the team's own rights (docs/ARCHITECTURE.md, "Backfills",
"Which tables"). ``python -m lancefn_jupyter.tables.agent FD``, started by the control plane as the owner of the
namespace's table root (its uid and gid, no other groups), so the kernel checks every file the table's tree leads
to: a link into another team's 0700 tree fails with EACCES however it got there.

FD is a Unix stream socket to the control plane. The agent says it is ready on it, then receives one socket per
request (``socket.send_fds``) and serves each on a thread of its own, so a commit waiting for its chunks never
holds up a slice read. A request and its replies are frames: 4 bytes of length, then JSON; open files (the rows
file a slice is written into, a chunk's result file) arrive as descriptors with the frame, never as paths. Ops:

- ``schema`` {uri} → {version, schema (Arrow IPC schema, base64)}
- ``plan`` {uri, table_version, options} → {table_version, fragments: [[id, rows], …], chunks}
- ``slice`` {slice, input_types} + the rows file → {rows}: the slice as an Arrow IPC stream into the file
- ``commit`` {uri, fragment, into, output_type, version, parts: [ranges, …]} → {table_version}; while it runs the
  agent asks ``{load: i}`` for part i's results and gets their file (the control plane waits for that chunk).

A failure is ``{error, kind}`` (kind ``table``: the table is not what a backfill needs, ``commit``: the commit
cannot succeed, ``io``: anything else); nothing is printed. The agent exits when the control plane's socket closes.
Imports only ``tables`` and ``wire``; pylance and pyarrow when a request needs them.
"""

from __future__ import annotations

import base64
import json
import mmap
import os
import socket
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["MAX_FRAME_BYTES", "main", "recv_frame", "send_frame"]

_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 << 20  # a plan of a few million chunks


def send_frame(sock: socket.socket, message: dict, fds: Sequence[int] = ()) -> None:
    """One frame, with ``fds`` (sent along, still the caller's to close)."""
    data = json.dumps(message, separators=(",", ":")).encode()
    frame = _HEADER.pack(len(data)) + data
    if fds:
        frame = frame[socket.send_fds(sock, [frame], list(fds)) :]
    if frame:
        sock.sendall(frame)


def recv_frame(sock: socket.socket, max_fds: int = 1) -> tuple[dict, list[int]]:
    """The next frame and the descriptors that came with it (the caller's to close); EOFError at the end."""
    header, fds = b"", []
    try:
        while len(header) < _HEADER.size:
            data, got, _flags, _addr = socket.recv_fds(sock, _HEADER.size - len(header), max_fds)
            fds += got
            if not data:
                raise EOFError("the other side closed the connection")
            header += data
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME_BYTES:
            raise ValueError(f"a frame of {size} bytes is over the {MAX_FRAME_BYTES} a table agent exchanges")
        payload = bytearray(size)
        view, got_bytes = memoryview(payload), 0
        while got_bytes < size:
            n = sock.recv_into(view[got_bytes:])
            if not n:
                raise EOFError("the other side closed the connection mid-frame")
            got_bytes += n
        message = json.loads(payload)
        if not isinstance(message, dict):
            raise ValueError("a frame that is not a JSON object")
        return message, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


class _Gone(Exception):
    """The control plane hung up on a request (a commit whose chunk will not finish)."""


def _mapped(fd: int) -> Any:
    """A received file's bytes, memory-mapped (the descriptor is closed; the mapping keeps the file)."""
    import pyarrow as pa

    try:
        return pa.py_buffer(mmap.mmap(fd, 0, prot=mmap.PROT_READ))
    finally:
        os.close(fd)


def _schema(conn: socket.socket, request: dict, fds: list[int]) -> dict:
    from lancefn_jupyter.tables.plan import PlanSource

    source = PlanSource(str(request["uri"]))
    schema = source.schema.serialize().to_pybytes()
    return {"version": source.version, "schema": base64.b64encode(schema).decode("ascii")}


def _plan(conn: socket.socket, request: dict, fds: list[int]) -> dict:
    from lancefn_jupyter.tables.plan import PlanSource

    plan = PlanSource(str(request["uri"]), int(request["table_version"])).plan(**request["options"])
    return {
        "table_version": plan.table_version,
        "fragments": [[fid, rows] for fid, rows in plan.fragments.items()],
        "chunks": plan.chunks,
    }


def _slice(conn: socket.socket, request: dict, fds: list[int]) -> dict:
    import pyarrow as pa

    from lancefn_jupyter.tables.slices import read_slice
    from lancefn_jupyter.wire.backfill_models import TableSlice

    if len(fds) != 1:
        raise ValueError("a slice request comes with the rows file to write")
    rows = read_slice(TableSlice.from_wire(request["slice"]), request["input_types"])
    with os.fdopen(fds.pop(), "wb") as raw, pa.ipc.new_stream(pa.PythonFile(raw, mode="w"), rows.schema) as writer:
        writer.write_table(rows)
    return {"rows": rows.num_rows}


def _commit(conn: socket.socket, request: dict, fds: list[int]) -> dict:
    from lancefn_jupyter.tables.commit import ChunkPart, commit_fragment, result_columns
    from lancefn_jupyter.tables.slices import slice_offsets
    from lancefn_jupyter.wire.dataplane import read_ipc

    def loader(index: int) -> Callable[[], tuple[Any, Any]]:
        def load() -> tuple[Any, Any]:
            send_frame(conn, {"load": index})
            reply, got = recv_frame(conn)
            if len(got) != 1 or not reply.get("file"):
                for fd in got:
                    os.close(fd)
                raise _Gone()
            return result_columns(read_ipc(_mapped(got[0])))

        return load

    parts = [ChunkPart(slice_offsets(ranges), loader(i)) for i, ranges in enumerate(request["parts"])]
    committed = commit_fragment(
        str(request["uri"]),
        int(request["fragment"]),
        into=str(request["into"]),
        output_type=str(request["output_type"]),
        parts=parts,
        version=str(request["version"]),
    )
    return {"table_version": committed}


_OPS: dict[str, Callable[[socket.socket, dict, list[int]], dict]] = {
    "schema": _schema,
    "plan": _plan,
    "slice": _slice,
    "commit": _commit,
}


def _failure(error: BaseException) -> dict:
    from lancefn_jupyter.tables.commit import CommitFailed
    from lancefn_jupyter.tables.plan import TableError

    kind = "table" if isinstance(error, TableError) else "commit" if isinstance(error, CommitFailed) else "io"
    text = str(error).strip()
    message = text if kind != "io" else f"{type(error).__name__}: {text}" if text else type(error).__name__
    return {"error": message[:4000], "kind": kind}


def _serve(conn: socket.socket) -> None:
    """One request on its own socket: its reply, or none when the control plane hung up."""
    with conn:
        fds: list[int] = []
        try:
            request, fds = recv_frame(conn)
            reply = _OPS[str(request.get("op"))](conn, request, fds)
        except (_Gone, EOFError, BrokenPipeError, ConnectionResetError):
            return
        except BaseException as error:  # every failure is the reply; the agent never prints one
            reply = _failure(error)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            send_frame(conn, reply)
        except OSError:
            pass


def _not_dumpable() -> None:
    """No process of the team's uid may trace this one or read its memory (it holds the control plane's files)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(argv[0]))
    _not_dumpable()
    send_frame(control, {"ready": os.getuid()})
    while True:
        try:
            _message, fds = recv_frame(control)
        except (EOFError, OSError, ValueError):
            return 0  # the control plane is gone: so is the agent
        for fd in fds:
            threading.Thread(target=_serve, args=(socket.socket(fileno=fd),), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
