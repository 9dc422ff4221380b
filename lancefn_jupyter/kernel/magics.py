"""IPython magics, thin over `lancefn_jupyter.kernel.api` (every option is reachable from Python too); runs in the kernel.

Lines are NOT variable-expanded (`@no_var_expand`): the line is part of the function version's
identity, so `env=HOME=$HOME` means the literal text, never whatever `$HOME` is in this kernel.
Heavy modules (pydantic models, the HTTP client, widgets, numba) load on first use, not at `%load_ext`.
"""

from __future__ import annotations

import shlex
import sys
import warnings
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.display import display

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.session import ConnectionInfo
    from lancefn_jupyter.wire.models import GpuClass
    from lancefn_jupyter.wire.versions import VersionDiff, VersionHistory

__all__ = ["GpuMagics"]

_LANCEFN_USAGE = """usage:
  %lancefn                  show which control plane this kernel uses
  %lancefn connect URL [api_key=KEY]   use a remote control plane (or set LANCEFN_URL / LANCEFN_API_KEY)
  %lancefn local            use the embedded local control plane (started if needed)
  %lancefn stop             stop the embedded control plane (versions and jobs persist)"""


def _prestart_embedded(line: str) -> bool:
    """First use with no control plane chosen: start the embedded one now, so its start-up
    overlaps this kernel's imports and packaging (`api.connect` adopts it). True if it did."""
    import os
    import sys

    session = sys.modules.get("lancefn_jupyter.kernel.session")  # not imported yet: no control plane chosen
    chosen = session is not None and session.chosen_client() is not None
    if chosen or os.environ.get("LANCEFN_URL") or "register=no" in line:
        return False
    from lancefn_jupyter.embedded import prestart

    try:
        prestart()
    except OSError:
        return False  # e.g. an unwritable home: the regular start below reports it properly
    return True


def _import_display() -> None:
    """What showing the function card takes, imported while a prestarted server is still starting
    (the kernel would only wait for it), not after the registration."""
    from lancefn_jupyter.kernel.widgets import use_widgets

    if use_widgets():
        from lancefn_jupyter.kernel.widgets import FunctionCardWidget  # noqa: F401


@magics_class
class GpuMagics(Magics):
    @no_var_expand
    @cell_magic
    def gpu_function(self, line: str, cell: str) -> None:
        """Run the cell, register it as an immutable GPU function version, bind its name to a handle.

        Options (key=value): num_gpus, gpu_class, name, pip, conda, conda_channels, env (K=V, repeatable),
        python_version, image, profile, timeout_s, state (per_worker|per_job), reuse_setup (yes|no), batched (yes|no), register (yes|no),
        include (PATH, repeatable).
        """
        shell = self.shell
        assert shell is not None  # a magic runs in the shell it is registered with
        prestarted = _prestart_embedded(line)
        from lancefn_jupyter.kernel import api
        from lancefn_jupyter.kernel.client import LancefnError
        from lancefn_jupyter.kernel.options import OptionsError, parse_function_line
        from lancefn_jupyter.kernel.packaging import PackagingError

        try:
            options = parse_function_line(line, api.profiles())
        except OptionsError as error:
            raise UsageError(str(error)) from None
        source = shell.transform_cell(cell)
        result = shell.run_cell(cell, store_history=False)
        if not result.success:
            # The traceback is already shown; a cell that does not run is not registered.
            return None
        if prestarted:
            _import_display()
        try:
            # The magic line, plus the leading blank lines transform_cell drops, precede the source.
            offset = 1 + len(cell) - len(cell.lstrip("\n"))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", api.LancefnEnvironmentWarning)
                handle = api.function_from_cell(source, shell.user_ns, options, line_offset=offset)
        except (PackagingError, LancefnError) as error:
            message = str(error) if isinstance(error, PackagingError) else f"registration failed: {error}"
            api.bind_refused(shell.user_ns, source, options, message)
            raise UsageError(f"%%gpu_function: {message}") from None
        shell.user_ns[handle.entrypoint] = handle
        display(handle)
        for warning in caught:  # under the card, in words (not a warnings-module line with a file and line number)
            if issubclass(warning.category, api.LancefnEnvironmentWarning):
                print(f"[lancefn] warning: {warning.message}", file=sys.stderr)
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        return None

    @no_var_expand
    @line_magic
    def gpu_profile(self, line: str) -> None:
        """%gpu_profile NAME key=value… defines a reusable compute profile; with no arguments lists them."""
        from lancefn_jupyter.kernel import api
        from lancefn_jupyter.kernel.options import OptionsError, parse_profile_line

        if not line.strip():
            defined = api.profiles()
            if not defined:
                print("no profiles defined; e.g. %gpu_profile big num_gpus=2 gpu_class=default pip=numpy")
            for profile in defined.values():
                names = f" env names: {', '.join(k for k, _ in profile.env)}" if profile.env else ""
                print(f"{profile!r}{names}")
            return None
        try:
            profile = parse_profile_line(line)
        except OptionsError as error:
            raise UsageError(str(error)) from None
        api.add_profile(profile)
        print(f"profile {profile.name!r} defined")
        return None

    @no_var_expand
    @line_magic
    def gpu_secret(self, line: str) -> None:
        """%gpu_secret NAME asks for NAME's value (not shown, never in the notebook) and creates or alters the secret;
        %gpu_secret lists the names; %gpu_secret --drop NAME removes one. Bind it: %%gpu_function secret=NAME."""
        from lancefn_jupyter.kernel import secrets

        words = line.split()
        if not words:
            names = secrets.list()
            print(", ".join(names) if names else "no secrets yet; create one with %gpu_secret NAME")
        elif words[0] == "--drop" and len(words) == 2:
            secrets.drop(words[1])
            print(f"secret {words[1]!r} dropped")
        elif len(words) == 1 and not words[0].startswith("-"):
            print(f"secret {words[0]!r} {secrets.prompt(words[0])}; bind it with %%gpu_function secret={words[0]}")
        else:
            raise UsageError("write %gpu_secret NAME (asks for the value), %gpu_secret --drop NAME, or %gpu_secret")
        return None

    @line_magic
    def lancefn(self, line: str) -> _Status | None:
        """%lancefn [connect URL [api_key=KEY] | local | stop]"""
        from lancefn_jupyter.kernel import api

        args = shlex.split(line)
        if not args:
            return _status()
        command, rest = args[0], args[1:]
        if command == "connect":
            if not rest:
                raise UsageError(
                    "%lancefn connect needs a URL, e.g. %lancefn connect https://lancefn.example.com api_key=…"
                )
            key = None
            for extra in rest[1:]:
                if not extra.startswith("api_key="):
                    raise UsageError(f"unknown argument {extra!r}; the only option is api_key=KEY")
                key = extra.split("=", 1)[1]
            client = api.connect(rest[0], key)
            client.health()
            return _status()
        if command == "local" and not rest:
            api.use_local()
            return _status()
        if command == "stop" and not rest:
            stopped = api.stop_local()
            print("embedded control plane stopped" if stopped else "no embedded control plane was running")
            return None
        raise UsageError(_LANCEFN_USAGE)

    @line_magic
    def gpu_classes(self, line: str) -> list[GpuClass]:
        """Each GPU class's model, memory, max GPUs per worker and live busy/free."""
        from lancefn_jupyter.kernel import api

        if line.strip():
            raise UsageError("%gpu_classes takes no arguments")
        return api.list_gpu_classes()

    @line_magic
    def gpu_versions(self, line: str) -> VersionDiff | VersionHistory | list[Any]:
        """%gpu_versions: every version; %gpu_versions NAME: its history, newest first, one line of change
        each; %gpu_versions diff NAME [OLD [NEW]]: source and runtime diff (default: the last two)."""
        from lancefn_jupyter.kernel import api
        from lancefn_jupyter.wire.versions import VersionLookupError

        args = shlex.split(line)
        usage = (
            "usage: %gpu_versions [NAME] | %gpu_versions diff NAME [OLD [NEW]] (versions: unique prefixes of 6+ chars)"
        )
        try:
            if args[:1] == ["diff"] and len(args) > 1:  # a function named "diff" still lists with one word
                if len(args) > 4:
                    raise UsageError(usage)
                return api.diff_versions(*args[1:])
            if len(args) > 1:
                raise UsageError(usage)
            return api.version_history(args[0]) if args else api.list_versions()
        except VersionLookupError as error:
            raise UsageError(str(error)) from None

    @line_magic
    def gpu_debug(self, line: str) -> Any:
        """%gpu_debug JOB_ID: step into a failed job's failing row here, stopped in the post-mortem debugger at the
        failing line (`Job.debug()`; docs/ARCHITECTURE.md, "Debugging a failure")."""
        from lancefn_jupyter.kernel import api

        args = shlex.split(line)
        if len(args) != 1:
            raise UsageError("usage: %gpu_debug JOB_ID (a failed job's id, e.g. from %gpu_jobs state=failed)")
        try:
            return api.debug_job(args[0])
        except api.LancefnError as error:
            raise UsageError(str(error)) from None

    @line_magic
    def gpu_jobs(self, line: str) -> list[Any]:
        """%gpu_jobs [state=pending|running|…] [name=FUNCTION]: recent jobs."""
        from lancefn_jupyter.kernel import api
        from lancefn_jupyter.wire.models import JobState, display_state

        filters: dict[str, str] = {}
        # The words users see, as one token each ("timed out" → timed_out).
        states = {display_state(state).replace(" ", "_"): state.value for state in JobState}
        for token in shlex.split(line):
            key, sep, value = token.partition("=")
            if not sep or key not in ("state", "name"):
                raise UsageError(f"usage: %gpu_jobs [state={'|'.join(states)}] [name=FUNCTION]")
            if key == "state":
                if value.upper() in JobState.__members__:
                    value = value.upper()
                elif value in states:
                    value = states[value]
                else:
                    raise UsageError(f"unknown state {value!r}; use one of {', '.join(states)}")
            filters[key] = value
        return api.list_jobs(state=filters.get("state"), name=filters.get("name"))

    @line_magic
    def gpu_usage(self, line: str) -> list[Any]:
        """%gpu_usage [by=namespace|version|class|day|batch] [since=7d|24h|2026-12-01]: what jobs held and cost."""
        from lancefn_jupyter.kernel import api

        options: dict[str, str] = {}
        for token in shlex.split(line):
            key, sep, value = token.partition("=")
            if not sep or key not in ("by", "since") or not value:
                raise UsageError("usage: %gpu_usage [by=namespace|version|class|day|batch] [since=7d|24h|2026-12-01]")
            options[key] = value
        from lancefn_jupyter.kernel.client import LancefnError

        try:
            return api.gpu_usage(**options)
        except LancefnError as error:
            raise UsageError(str(error)) from None


def _status() -> _Status:
    """The status of the control plane in use (chosen by the default rule if none is yet)."""
    from lancefn_jupyter.kernel import api

    info = api.connection_info()
    if info is None:
        api.current_client()
        info = api.connection_info()
    assert info is not None  # current_client() connected
    return _Status(info)


class _Status:
    """`%lancefn` output: which control plane, embedded or remote, and its health (never the key)."""

    def __init__(self, info: ConnectionInfo):
        from lancefn_jupyter.kernel import api

        self.info = info
        try:
            self.health = api.current_client().health()
        except Exception as error:  # shown to the user, not raised: status must always answer
            self.health = {"status": f"unreachable ({error})"}

    def _lines(self) -> list[str]:
        info, health = self.info, self.health
        kind = "embedded (local)" if info.embedded else "remote"
        lines = [f"control plane: {info.url} [{kind}]", f"status: {health.get('status')}"]
        if health.get("version"):
            lines.append(f"server version: {health['version']}, executor: {health.get('executor')}")
        if info.embedded:
            lines.append(f"home: {info.home} (pid {info.pid})")
        return lines

    def __repr__(self) -> str:
        return "\n".join(self._lines())

    def _repr_html_(self) -> str:
        import html

        return "<pre class='lancefn'>" + html.escape("\n".join(self._lines())) + "</pre>"
