"""Which pip entries a version may declare (docs/ARCHITECTURE.md, "Environments"), pure.

An entry is one PEP 508 requirement: a name from the index, with extras, a version and markers. A pip option
line (``-r FILE``, ``-c FILE``, ``-e PATH``, ``--index-url URL``) is never one: uv would read it as an option
(a requirement file read by the builder, another index), so it is refused wherever a version is declared. A
direct reference (``NAME @ URL``: a local path, ``file://``, a VCS or archive URL) runs code its declarer chose
when it is built; a server shared by several namespaces refuses it unless its operator allows it.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.requirements import InvalidRequirement, Requirement

__all__ = ["ALLOW_FLAG", "pip_entry_problem", "pip_problem"]

ALLOW_FLAG = "--allow-direct-references"
_HOW = "write NAME with an optional version, e.g. 'numpy>=1.26' or 'tabulate==0.9.0'"
_LOCATION_HINTS = ("/", "\\", ".whl", ".tar.gz", ".zip")


def pip_entry_problem(text: str, *, direct_references: bool = True) -> str | None:
    """Why ``text`` cannot be a pip entry (a sentence naming it and saying what to write), or None.
    ``direct_references``: whether ``NAME @ URL`` is accepted."""
    entry = text.strip()
    if entry.startswith("-"):
        return (
            f"pip entry {text!r} is a pip option, not a requirement: options such as -r, -c, -e and --index-url are "
            f"not accepted (the server's operator chooses where packages come from); list the packages themselves: "
            f"{_HOW}"
        )
    if len(entry.splitlines()) > 1 or "\0" in entry:
        return f"pip entry {text!r} holds a line break; give one requirement per entry: {_HOW}"
    try:
        requirement = Requirement(entry)
    except InvalidRequirement as error:
        located = entry.startswith(".") or any(hint in entry for hint in _LOCATION_HINTS)
        fix = "write a direct reference as 'NAME @ URL', e.g. 'mypkg @ file:///abs/path/mypkg'" if located else _HOW
        return f"pip entry {text!r} is not a PEP 508 requirement ({str(error).splitlines()[0]}); {fix}"
    if requirement.url is not None and not direct_references:
        return (
            f"pip entry {text!r} is a direct reference ({requirement.url}): this server is shared by several "
            f"namespaces and installs packages only from its index; name a released version instead (e.g. "
            f"'{requirement.name}==1.0'), or ask its operator to start lancefn-server with {ALLOW_FLAG}"
        )
    return None


def pip_problem(packages: Sequence[str], *, direct_references: bool = True) -> str | None:
    """The first entry's problem (:func:`pip_entry_problem`), or None when every entry is a requirement."""
    for text in packages:
        problem = pip_entry_problem(text, direct_references=direct_references)
        if problem is not None:
            return problem
    return None
