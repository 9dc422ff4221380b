"""Who is at the other end of a connection (docs/ARCHITECTURE.md, "REST details", the limits): the name its
per-peer caps count under.  Runs in the control plane's server process, on the event loop, once per new connection.

A remote client is its address.  Every client on this machine connects from 127.0.0.1 (or the server's own
address), notebooks and jobs alike, so there the owner of the client's socket tells them apart: the Unix socket's
``SO_PEERCRED``, and for TCP the uid that the kernel's socket table (``NETLINK_SOCK_DIAG``, an exact lookup of the
client's end by its four addresses: ~7 µs, where reading ``/proc/net/tcp`` took ~2 ms) holds for it.  Where that
cannot be read (not Linux, the client already gone) the address alone names the peer, and the per-key caps carry the
weight.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

__all__ = ["peer_of"]

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_TCP_TIME_WAIT = 6  # a closed socket's leftover: its uid field is 0, whoever owned it
_UID_OFFSET = 16 + 64  # nlmsghdr, then inet_diag_msg's family..inode: its idiag_uid

_diag: socket.socket | None = None
_diag_failed = False


def peer_of(transport: Any) -> str:
    """The peer a new connection counts under: ``"203.0.113.5"``, ``"127.0.0.1 uid 1000"``, ``"unix uid 0"``."""
    sock = transport.get_extra_info("socket")
    family = getattr(sock, "family", None)
    if family == socket.AF_UNIX:
        try:
            uid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        except OSError:
            return "unix"
        return f"unix uid {uid}"
    peer, local = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
    if not (isinstance(peer, tuple) and isinstance(local, tuple)):
        return str(peer)
    host = peer[0]
    if not _on_this_machine(host, local[0]):
        return host
    uid = _tcp_owner(family, peer, local)
    return host if uid is None else f"{host} uid {uid}"


def _on_this_machine(host: str, local_host: str) -> bool:
    return host == local_host or host.startswith("127.") or host == "::1" or host.startswith("::ffff:127.")


def _tcp_owner(family: Any, peer: tuple, local: tuple) -> int | None:
    """The uid owning the client's end of a TCP connection on this machine, or None where the kernel does not say."""
    global _diag, _diag_failed
    if _diag is None:
        if _diag_failed:
            return None
        try:
            _diag = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
            _diag.setblocking(False)  # the kernel answers within the send; never wait on the loop
        except (OSError, AttributeError):  # no netlink (not Linux) or not allowed here
            _diag_failed = True
            return None
    try:
        _diag.send(_request(family, peer, local))  # OSError too for an address inet_pton cannot read
        reply = _diag.recv(4096)
    except OSError:
        return None
    if len(reply) < _UID_OFFSET + 4 or struct.unpack_from("=H", reply, 4)[0] != _SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket (the client is gone)
    if reply[17] == _TCP_TIME_WAIT:
        return None
    return struct.unpack_from("=I", reply, _UID_OFFSET)[0]


_HEAD = struct.Struct("=IHHIIBBBBI")  # nlmsghdr, then inet_diag_req_v2's family, protocol, ext, pad, states
_PORTS = struct.Struct("!HH")
_TAIL = struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)  # any interface, no cookie
_SIZE = _HEAD.size + _PORTS.size + 32 + len(_TAIL)


def _request(family: Any, peer: tuple, local: tuple) -> bytes:
    """A ``SOCK_DIAG_BY_FAMILY`` request for the one socket whose own end is ``peer`` and whose other end is
    ``local``: the client's."""
    src, dst = peer[0], local[0]
    if family == socket.AF_INET6 and src.startswith("::ffff:") and dst.startswith("::ffff:"):
        family, src, dst = socket.AF_INET, src[7:], dst[7:]  # an IPv4 client of a dual-stack socket
    return b"".join(
        (
            _HEAD.pack(_SIZE, _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 0, 0, family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF),
            _PORTS.pack(peer[1], local[1]),
            socket.inet_pton(family, src).ljust(16, b"\0"),
            socket.inet_pton(family, dst).ljust(16, b"\0"),
            _TAIL,
        )
    )
