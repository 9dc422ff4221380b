"""``lancefn-dashboard``: serve the team dashboard (`gpu.ipynb`) with Voilà on 127.0.0.1, behind a token.

    lancefn-dashboard [--port 8866] [--open] [--token-file PATH | --no-auth]

The dashboard acts with its kernel's key, so it asks for a token as JupyterLab does (docs/ARCHITECTURE.md,
"Front ends"): ``$LANCEFN_DASHBOARD_TOKEN`` or the content of ``--token-file``, else a random one printed with
the URL. The token never enters a command line (``/proc/<pid>/cmdline`` is world-readable): Voilà runs in this
process and gets it as a setting, and the variable is removed before any kernel starts. ``--no-auth`` serves
without one, with a warning.

The dashboard's kernel connects as any kernel does: ``LANCEFN_URL`` and ``LANCEFN_API_KEY`` when set, else the
embedded control plane in ``$LANCEFN_HOME`` (started if needed). Voilà comes with the ``dashboard`` extra
(``pip install 'lancefn-jupyter[dashboard]'``); this module is the only one that runs it, and it is never
imported by a kernel.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import html
import importlib.util
import os
import secrets
import stat
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

__all__ = [
    "NOTEBOOK",
    "TOKEN_ENV",
    "dashboard_url",
    "main",
    "no_auth_warning",
    "redirect_page",
    "voila_argv",
    "without_token",
]

NOTEBOOK = Path(__file__).resolve().parent / "gpu.ipynb"
DEFAULT_PORT = 8866  # Voilà's own default
MISSING_VOILA = "lancefn-dashboard needs Voilà: pip install 'lancefn-jupyter[dashboard]'"
TOKEN_ENV = "LANCEFN_DASHBOARD_TOKEN"
MIN_TOKEN_CHARS = 16  # a login anyone on the machine may try: too short a token is guessed


def voila_argv(port: int, *, open_browser: bool = False) -> list[str]:
    """Voilà's arguments serving the dashboard notebook on 127.0.0.1:``port`` (never the token: argv is
    world-readable). Its kernels talk over Unix sockets in Voilà's private (0700) connection directory: a kernel's
    TCP ports would let any local user subscribe to its output, the dashboard's widget state included. The login
    page offers no "set a password": it would write one to ``jupyter_server_config.json`` in the working directory."""
    argv = [
        str(NOTEBOOK),
        f"--port={port}",
        "--Voila.ip=127.0.0.1",
        "--KernelManager.transport=ipc",
        "--PasswordIdentityProvider.allow_password_change=False",
    ]
    if not open_browser:
        argv.append("--no-browser")
    return argv


def dashboard_url(port: int, token: str) -> str:
    """The URL that opens the dashboard: with ``?token=`` unless it is served without one (``token == ""``)."""
    base = f"http://127.0.0.1:{port}/"
    return f"{base}?token={quote(token, safe='')}" if token else base


def without_token(path: str, query: str) -> str:
    """``path?query`` less its ``token`` parameter (the page's own, e.g. ``template=``, kept)."""
    rest = [(name, value) for name, value in parse_qsl(query, keep_blank_values=True) if name != "token"]
    return f"{path}?{urlencode(rest)}" if rest else path


def redirect_page(url: str) -> str:
    """The private file ``--open`` hands the browser: it goes on to ``url`` (the token stays out of the browser's
    command line, as Jupyter does it)."""
    href = html.escape(url, quote=True)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0;url={href}"><title>GPU functions: team dashboard</title></head>\n'
        f'<body><a href="{href}">Open the team dashboard</a></body></html>\n'
    )


def no_auth_warning(port: int) -> str:
    return (
        f"lancefn-dashboard --no-auth: no token is asked. Anyone who can reach 127.0.0.1:{port} — every local "
        "user and every job — can act with this dashboard's key."
    )


def checked_token(given: str, source: str) -> str:
    """A token the user gave, trimmed; ValueError saying what to change when it is too short to be a login."""
    token = given.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"{source} holds {len(token)} characters; a dashboard token needs at least {MIN_TOKEN_CHARS} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())'), or leave it unset for a random one"
        )
    return token


def _read_token_file(path: Path) -> str:
    """The token file's text: a regular file of this user that no one else may read or change."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise ValueError(f"{path} is not a regular file of yours (uid {os.getuid()})")
        if st.st_mode & 0o077:
            raise ValueError(
                f"{path} is readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                f"fix it with: chmod 600 {path}"
            )
        return f.read()


def _token(args: argparse.Namespace) -> tuple[str, bool]:
    """(the token, whether it was generated here); "" for ``--no-auth``."""
    given = os.environ.get(TOKEN_ENV)
    if args.no_auth:
        if given is not None:
            raise ValueError(f"--no-auth and {TOKEN_ENV} contradict each other: unset {TOKEN_ENV} or drop --no-auth")
        return "", False
    if args.token_file is not None and given is not None:
        raise ValueError(f"--token-file and {TOKEN_ENV} both give a token: keep one")
    if args.token_file is not None:
        try:
            return checked_token(_read_token_file(args.token_file), f"--token-file {args.token_file}"), False
        except OSError as e:
            raise ValueError(f"cannot read --token-file {args.token_file}: {e.strerror}") from e
    if given is not None:
        return checked_token(given, TOKEN_ENV), False
    return secrets.token_urlsafe(32), True


def _open_private_page(url: str, browser: str | None) -> None:
    """Opens ``url`` through a 0600 redirect file (removed at exit), in a thread as Voilà does."""
    import webbrowser

    fd, path = tempfile.mkstemp(prefix="lancefn-dashboard-", suffix=".html")  # 0600: it holds the token
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(redirect_page(url))
    atexit.register(_remove, path)
    try:
        opener = webbrowser.get(browser or None)
    except webbrowser.Error as e:
        print(f"lancefn-dashboard: no web browser found ({e}); open the URL above", file=sys.stderr)
        return
    threading.Thread(target=opener.open, args=(Path(path).as_uri(),), daemon=True).start()


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _serve(voila_args: list[str], token: str, generated: bool) -> None:
    """Voilà in this process (Ctrl-C and signals reach it directly), asking for ``token``."""
    from tornado import web
    from voila.app import Voila
    from voila.tornado.handler import TornadoVoilaHandler

    class Page(TornadoVoilaHandler):
        @web.authenticated
        async def get(self, path: str | None = None) -> None:
            if "token" in self.request.query_arguments:
                # Logged in, the cookie set: the page again without the token, which Voilà would otherwise
                # put in the kernel's environment (QUERY_STRING, the request's URL) and the address bar keep.
                self.redirect(without_token(self.request.path, self.request.query))
                return
            await super().get(path)

    class LancefnDashboard(Voila):
        @property
        def display_url(self) -> str:
            # Printed once listening, as Jupyter does: a token given by the user is not echoed.
            return dashboard_url(self.port, token if generated or not token else "...")

        def launch_browser(self) -> None:
            _open_private_page(dashboard_url(self.port, token), self.browser)

        def init_handlers(self) -> list:
            return [
                (route[0], Page, *route[2:]) if route[1] is TornadoVoilaHandler else route
                for route in super().init_handlers()
            ]

    app = LancefnDashboard.instance()
    app.initialize(voila_args)
    app.token = token  # after Voilà read its config files: none of them turns the login off
    app.start()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lancefn-dashboard",
        description="Serve the team dashboard (GPU classes, queues, jobs and batches, live) with Voilà on 127.0.0.1, "
        "behind a token. It uses LANCEFN_URL/LANCEFN_API_KEY when set, else the embedded control plane.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT})")
    parser.add_argument(
        "--open", action="store_true", help="open it in a browser (the token travels in a private file)"
    )
    login = parser.add_mutually_exclusive_group()
    login.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help=f"read the token from PATH (mode 600); default: ${TOKEN_ENV}, else a random token printed with the URL",
    )
    login.add_argument(
        "--no-auth",
        action="store_true",
        help="ask no token: every local user and every job that reaches the port acts with this dashboard's key",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be 1-65535, got {args.port}")
    try:
        token, generated = _token(args)
    except ValueError as e:
        parser.error(str(e))
    if importlib.util.find_spec("voila") is None:
        sys.exit(MISSING_VOILA)
    os.environ.pop(TOKEN_ENV, None)  # the kernels Voilà starts inherit this environment
    if not token:
        print(no_auth_warning(args.port), file=sys.stderr, flush=True)
    _serve(voila_argv(args.port, open_browser=args.open), token, generated)


if __name__ == "__main__":
    main()
