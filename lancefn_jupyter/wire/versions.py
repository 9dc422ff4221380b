"""Version history, diffs and version-id prefixes (pure: definitions and source text in, data out).

`api` fetches definitions (`functions/list`) and artifacts (`functions/artifact`) and hands them here;
nothing in this module does I/O, so every rule is tested directly. Env *values* never appear: the
server redacts them, and these functions only ever look at env names.
"""

from __future__ import annotations

import difflib
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lancefn_jupyter.wire.errors import LancefnError
from lancefn_jupyter.wire.models import FunctionVersion

__all__ = [
    "MIN_PREFIX",
    "HistoryRow",
    "VersionDiff",
    "VersionHistory",
    "VersionLookupError",
    "change_summary",
    "diff_pair",
    "diff_versions",
    "history",
    "lookup_snippet",
    "nonfinite_counts",
    "nonfinite_text",
    "parse_ref",
    "resolve_version",
    "runtime_fields",
]

MIN_PREFIX = 6  # long enough to be unique in practice, short enough to type
_CANDIDATES_SHOWN = 10


class VersionLookupError(LancefnError, LookupError):
    """An unknown function name, or a version prefix that is unknown, too short or ambiguous."""

    def __init__(self, message: str, *, unknown: bool = False):
        super().__init__(message)
        self.unknown = unknown  # nothing matched (a 404), rather than a malformed or ambiguous reference


def parse_ref(ref: str) -> tuple[str, str | None]:
    """``"name"`` → (name, None); ``"name@prefix"`` → (name, prefix). Function names never contain '@'."""
    if not isinstance(ref, str) or not ref.strip():
        raise VersionLookupError("give a function name, e.g. lookup('score') or lookup('score@1a2b3c')")
    name, sep, prefix = ref.strip().partition("@")
    if sep and not prefix:
        raise VersionLookupError(f"{ref!r} has an empty version after '@'; write NAME or NAME@VERSION-PREFIX")
    return name, (prefix if sep else None)


def _listing(versions: Sequence[str]) -> str:
    shown = list(reversed(versions))[:_CANDIDATES_SHOWN]  # newest first
    more = f" (and {len(versions) - len(shown)} older)" if len(versions) > len(shown) else ""
    return ", ".join(shown) + more


def resolve_version(name: str, prefix: str | None, versions: Sequence[str]) -> str:
    """The full version id for ``prefix`` among ``versions`` (registration order, oldest first).

    ``None`` means the newest. A prefix must have at least ``MIN_PREFIX`` characters unless it is a
    whole id; an unknown or ambiguous one is an error listing the candidates.
    """
    if not versions:
        raise VersionLookupError(
            f"no function named {name!r} is registered on this control plane; "
            "list names with %gpu_versions or lancefn_jupyter.list_versions()",
            unknown=True,
        )
    if prefix is None:
        return versions[-1]
    if prefix in versions:
        return prefix
    if len(prefix) < MIN_PREFIX:
        raise VersionLookupError(
            f"version prefix {prefix!r} of {name!r} is too short: use at least {MIN_PREFIX} characters "
            f"(versions, newest first: {_listing(versions)})"
        )
    matches = [v for v in versions if v.startswith(prefix)]
    if not matches:
        raise VersionLookupError(
            f"{name!r} has no version starting with {prefix!r}; versions, newest first: {_listing(versions)}",
            unknown=True,
        )
    if len(matches) > 1:
        raise VersionLookupError(
            f"version prefix {prefix!r} of {name!r} is ambiguous: it matches {_listing(matches)}; type more characters"
        )
    return matches[0]


def diff_pair(name: str, versions: Sequence[str], old: str | None, new: str | None) -> tuple[str, str]:
    """Which two versions `diff NAME [OLD [NEW]]` compares: NEW defaults to the newest, OLD to the
    version registered just before NEW."""
    new_id = resolve_version(name, new, versions)
    if old is not None:
        return resolve_version(name, old, versions), new_id
    index = list(versions).index(new_id)
    if index == 0:
        raise VersionLookupError(
            f"{name}@{new_id} is the first version of {name!r}: there is nothing before it to diff against"
        )
    return versions[index - 1], new_id


# ------------------------------------------------------------------------------------------ runtime


def runtime_fields(fv: FunctionVersion) -> dict[str, str]:
    """The runtime facts a user compares between versions, as display strings (env: names only)."""
    runtime = fv.runtime
    env = runtime.environment
    resources = runtime.resources
    return {
        "runtime": runtime.kind,
        "python": runtime.python_version or "-",
        "environment": env.kind if env else "-",
        "packages": ", ".join(env.packages) if env and env.packages else "-",
        "channels": ", ".join(env.channels) if env and env.channels else "-",
        "image": (env.image if env else None) or "-",
        "num_gpus": str(resources.num_gpus) if resources else "0",
        "gpu_class": ((resources.gpu_class or "default") if resources else "cpu"),
        "env names": ", ".join(sorted(runtime.env)) if runtime.env else "-",
        "entrypoint": fv.artifact.entrypoint,
    }


def _set_change(label: str, old: Sequence[str], new: Sequence[str]) -> str | None:
    added = [f"+{x}" for x in new if x not in old]
    removed = [f"-{x}" for x in old if x not in new]
    return f"{label}: {' '.join(added + removed)}" if added or removed else None


def _changed_lines(old_source: str, new_source: str) -> int:
    matcher = difflib.SequenceMatcher(a=old_source.splitlines(), b=new_source.splitlines(), autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")


def change_summary(
    old: FunctionVersion | None, new: FunctionVersion, old_source: str | None, new_source: str | None
) -> str:
    """One line saying what changed from ``old`` to ``new``, e.g. ``code: 3 lines; pip: +torch; num_gpus 1→2``."""
    if old is None:
        return "first version"
    parts: list[str] = []
    if old_source is not None and new_source is not None and old_source != new_source:
        count = _changed_lines(old_source, new_source)
        parts.append(f"code: {count} line{'' if count == 1 else 's'}")
    elif old.artifact.digest != new.artifact.digest and (old_source is None or new_source is None):
        parts.append("code")
    o_env, n_env = old.runtime.environment, new.runtime.environment
    either = n_env or o_env
    kind = either.kind if either else "pip"
    packages = _set_change(kind, o_env.packages if o_env else (), n_env.packages if n_env else ())
    if o_env and n_env and o_env.kind != n_env.kind:
        parts.append(f"environment {o_env.kind}→{n_env.kind}")
    if packages:
        parts.append(packages)
    channels = _set_change("channels", o_env.channels if o_env else (), n_env.channels if n_env else ())
    if channels:
        parts.append(channels)
    before, after = runtime_fields(old), runtime_fields(new)
    for key in ("num_gpus", "gpu_class", "python", "image", "runtime", "entrypoint"):
        if before[key] != after[key]:
            parts.append(f"{key} {before[key]}→{after[key]}")
    env_names = _set_change("env", sorted(old.runtime.env or {}), sorted(new.runtime.env or {}))
    if env_names:
        parts.append(env_names)
    elif not parts and old.runtime_digest != new.runtime_digest:
        parts.append("env: values changed")  # the digest covers the (redacted) values
    if not parts and old.signature != new.signature:
        parts.append("signature")
    return "; ".join(parts) or "no change"


# --------------------------------------------------------------------------------------------- diff


@dataclass(frozen=True)
class VersionDiff:
    """What changed between two versions of one function: source diff lines and runtime rows.

    Displays as HTML in notebooks and as text elsewhere (`str()`); the fields are plain data.
    """

    name: str
    old: str
    new: str
    source_diff: tuple[str, ...]  # unified diff of the artifact source (normalized cell), no trailing newlines
    runtime: tuple[tuple[str, str, str], ...]  # (field, old, new) for every field that differs
    summary: str

    @property
    def unchanged(self) -> bool:
        return not self.source_diff and not self.runtime

    def to_text(self) -> str:
        lines = [f"{self.name}: {self.old} → {self.new} ({self.summary})"]
        if self.runtime:
            width = max(len(f) for f, _, _ in self.runtime)
            lines.append("runtime:")
            lines += [f"  {f.ljust(width)}  {o} → {n}" for f, o, n in self.runtime]
        lines += ["source:", *self.source_diff] if self.source_diff else ["source: unchanged"]
        return "\n".join(lines)

    def to_html(self) -> str:
        styles = {"+": "background:#e6ffed", "-": "background:#ffeef0", "@": "color:#6f42c1"}
        code = "".join(
            f"<div style='{styles.get(line[:1], '') if not line.startswith(('+++', '---')) else 'font-weight:bold'}'>"
            f"{html.escape(line) or '&nbsp;'}</div>"
            for line in self.source_diff
        )
        rows = "".join(
            f"<tr><td style='padding:2px 8px'>{html.escape(f)}</td><td style='padding:2px 8px'>{html.escape(o)}</td>"
            f"<td style='padding:2px 8px'>{html.escape(n)}</td></tr>"
            for f, o, n in self.runtime
        )
        table = (
            f"<table><thead><tr><th style='text-align:left'>runtime</th><th style='text-align:left'>{html.escape(self.old)}</th>"
            f"<th style='text-align:left'>{html.escape(self.new)}</th></tr></thead><tbody>{rows}</tbody></table>"
            if rows
            else "<div><i>runtime unchanged</i></div>"
        )
        source = (
            f"<pre style='font-family:monospace;font-size:12px;margin:4px 0'>{code}</pre>"
            if code
            else "<div><i>source unchanged</i></div>"
        )
        return (
            f"<div class='lancefn lancefn-diff'><b>{html.escape(self.name)}</b> <code>{html.escape(self.old)}</code> → "
            f"<code>{html.escape(self.new)}</code> — {html.escape(self.summary)}{table}{source}</div>"
        )

    def to_wire(self) -> dict[str, Any]:
        """The `POST /v1/functions/diff` reply."""
        return {
            "name": self.name,
            "old": self.old,
            "new": self.new,
            "summary": self.summary,
            "source_diff": list(self.source_diff),
            "runtime": [list(row) for row in self.runtime],
        }

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        return self.to_html()


def diff_versions(old: FunctionVersion, new: FunctionVersion, old_source: str, new_source: str) -> VersionDiff:
    """Unified diff of the normalized sources plus every differing runtime field."""
    label = f"{new.name}@{{}}"
    diff = difflib.unified_diff(
        old_source.splitlines(),
        new_source.splitlines(),
        label.format(old.version),
        label.format(new.version),
        lineterm="",
    )
    before, after = runtime_fields(old), runtime_fields(new)
    runtime = tuple((key, before[key], after[key]) for key in before if before[key] != after[key])
    if not runtime and old.runtime_digest != new.runtime_digest and before["env names"] == after["env names"]:
        runtime = (("env values", "(redacted)", "(redacted, changed)"),)
    return VersionDiff(
        name=new.name,
        old=old.version,
        new=new.version,
        source_diff=tuple(diff),
        runtime=runtime,
        summary=change_summary(old, new, old_source, new_source),
    )


# ------------------------------------------------------------------------------------------ history


def lookup_snippet(name: str, version: str) -> str:
    """The line that uses this version from any kernel or script."""
    return f"lancefn_jupyter.lookup({f'{name}@{version[: MIN_PREFIX + 2]}'!r})"


@dataclass(frozen=True)
class HistoryRow:
    name: str
    version: str
    created_at: str
    change: str
    snippet: str


class VersionHistory(list):
    """`%gpu_versions NAME`: the versions newest first, one line of change each, with a lookup snippet."""

    def __init__(self, name: str, rows: Sequence[HistoryRow]):
        super().__init__(rows)
        self.name = name

    def to_text(self) -> str:
        if not self:
            return f"{self.name}: no versions"
        width = max(len(r.version) for r in self)
        lines = [f"{self.name}: {len(self)} version{'' if len(self) == 1 else 's'}, newest first"]
        lines += [f"  {r.version.ljust(width)}  {r.created_at}  {r.change}    {r.snippet}" for r in self]
        lines.append(f"diff: %gpu_versions diff {self.name} [OLD [NEW]]")
        return "\n".join(lines)

    def to_html(self) -> str:
        rows = "".join(
            f"<tr><td style='padding:2px 8px'><code>{html.escape(r.version)}</code></td>"
            f"<td style='padding:2px 8px'>{html.escape(r.created_at)}</td><td style='padding:2px 8px'>{html.escape(r.change)}</td>"
            f"<td style='padding:2px 8px'><code>{html.escape(r.snippet)}</code></td></tr>"
            for r in self
        )
        return (
            f"<div class='lancefn lancefn-versions'><b>{html.escape(self.name)}</b> — versions, newest first"
            f"<table><thead><tr><th style='text-align:left'>version</th><th style='text-align:left'>created</th>"
            f"<th style='text-align:left'>change</th><th style='text-align:left'>use it anywhere</th></tr></thead>"
            f"<tbody>{rows}</tbody></table><div>diff: <code>%gpu_versions diff {html.escape(self.name)} [OLD [NEW]]</code></div></div>"
        )

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        return self.to_html()


def history(name: str, definitions: Sequence[FunctionVersion], sources: Sequence[str | None]) -> VersionHistory:
    """Rows newest first; ``definitions`` and ``sources`` are in registration order (oldest first)."""
    rows = []
    for i, fv in enumerate(definitions):
        prev = definitions[i - 1] if i else None
        change = change_summary(prev, fv, sources[i - 1] if i else None, sources[i])
        rows.append(HistoryRow(name, fv.version, fv.created_at, change, lookup_snippet(name, fv.version)))
    return VersionHistory(name, list(reversed(rows)))


# ---------------------------------------------------------------------------------- result summaries


def nonfinite_counts(value: Any) -> dict[str, int] | None:
    """``{"nan": n, "inf": n, "-inf": n, "floats": total}`` over the floats in a (nested) list / array
    result, or None when it holds no floats. Widgets and reprs show it so silent NaNs stand out."""
    if hasattr(value, "tolist") and callable(value.tolist):
        value = value.tolist()
    counts = {"nan": 0, "inf": 0, "-inf": 0, "floats": 0}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            counts["floats"] += 1
            if math.isnan(item):
                counts["nan"] += 1
            elif math.isinf(item):
                counts["inf" if item > 0 else "-inf"] += 1
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return counts if counts["floats"] else None


def nonfinite_text(value: Any) -> str:
    """``"2 NaN, 1 +Inf of 100 floats"``, or "" when all floats are finite (or there are none)."""
    counts = nonfinite_counts(value)
    if not counts or not (counts["nan"] or counts["inf"] or counts["-inf"]):
        return ""
    parts = [
        f"{counts['nan']} NaN" if counts["nan"] else "",
        f"{counts['inf']} +Inf" if counts["inf"] else "",
        f"{counts['-inf']} -Inf" if counts["-inf"] else "",
    ]
    return f"{', '.join(p for p in parts if p)} of {counts['floats']} floats"
