"""pip's configuration, read as pip reads it, mapped to uv's flags (docs/ARCHITECTURE.md, "Environments").

uv ignores pip.conf and ``PIP_*``; a machine whose packages come from a local mirror or a wheel directory says so
there, so builds would otherwise reach for PyPI (or fail offline). :func:`pip_settings` is pure (file texts and an
environment mapping in); :func:`read_pip_settings` finds the files.
"""

from __future__ import annotations

import configparser
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["UvSettings", "config_files", "pip_settings", "read_pip_settings", "uv_settings"]

_TRUE = frozenset({"1", "true", "yes", "on", "y"})
_ALIASES = {"default-timeout": "timeout"}  # one pip option, two long names


@dataclass(frozen=True)
class UvSettings:
    """What pip's settings become for uv: command-line flags, and environment variables for what uv reads there."""

    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


def config_files(env: Mapping[str, str], *, home: str, prefix: str = sys.prefix) -> list[str]:
    """pip's configuration files in its load order (later overrides earlier): global, user, site, then
    ``PIP_CONFIG_FILE``. ``PIP_CONFIG_FILE=os.devnull`` loads none; an existing ``PIP_CONFIG_FILE`` skips the user
    files (pip's rule)."""
    chosen = env.get("PIP_CONFIG_FILE")
    if chosen == os.devnull:
        return []
    xdg_dirs = env.get("XDG_CONFIG_DIRS") or "/etc/xdg"
    files = [os.path.join(d, "pip", "pip.conf") for d in xdg_dirs.split(os.pathsep) if d]
    files.append("/etc/pip.conf")
    if not (chosen and os.path.exists(chosen)):
        config_home = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
        files += [os.path.join(home, ".pip", "pip.conf"), os.path.join(config_home, "pip", "pip.conf")]
    files.append(os.path.join(prefix, "pip.conf"))
    if chosen:
        files.append(chosen)
    return files


def pip_settings(texts: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The effective ``install`` settings: ``[global]`` of every file (in order), then ``[install]`` of every file,
    then ``PIP_*`` variables — pip's precedence. Keys are long option names (``find-links``); values are raw."""
    sections: dict[str, dict[str, str]] = {"global": {}, "install": {}}
    for text in texts:
        parser = configparser.RawConfigParser()
        try:
            parser.read_string(text)
        except configparser.Error:
            continue  # pip would refuse to start; a build should not be the one to say so
        for section, values in sections.items():
            if parser.has_section(section):
                values.update({_key(k): v for k, v in parser.items(section)})
    settings = {**sections["global"], **sections["install"]}
    for name, value in env.items():
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE" and value:
            settings[_key(name[4:].lower().replace("_", "-"))] = value
    return settings


def uv_settings(settings: Mapping[str, str]) -> UvSettings:
    """pip's settings as uv flags and environment variables (those uv has no equivalent for are dropped)."""
    args: list[str] = []
    env: list[tuple[str, str]] = []
    if _flag(settings.get("no-index")):
        args.append("--no-index")
    elif index := settings.get("index-url"):
        args += ["--index-url", index.split()[0]]
    if not _flag(settings.get("no-index")):
        extras = _words(settings.get("extra-index-url"))
        for url in extras:
            args += ["--extra-index-url", url]
        if extras:  # pip picks the best version across all indexes; uv's default stops at the first that has one
            args += ["--index-strategy", "unsafe-best-match"]
    for link in _words(settings.get("find-links")):
        args += ["--find-links", link]
    for path in _words(settings.get("constraint")):
        args += ["--constraint", path]
    if _flag(settings.get("pre")):
        args += ["--prerelease", "allow"]
    for option in ("only-binary", "no-binary"):
        for name in re.split(r"[\s,]+", settings.get(option, "").strip()):
            if name:
                args += [f"--{option}", name]
    for host in _words(settings.get("trusted-host")):
        args += ["--allow-insecure-host", host]
    if cert := settings.get("cert"):
        env.append(("SSL_CERT_FILE", cert))
    if timeout := settings.get("timeout"):
        env.append(("UV_HTTP_TIMEOUT", timeout))
    return UvSettings(tuple(args), tuple(env))


def read_pip_settings(env: Mapping[str, str] | None = None, *, prefix: str = sys.prefix) -> UvSettings:
    """This machine's pip configuration for an install by ``prefix``'s pip, as uv settings."""
    env = os.environ if env is None else env
    home = env.get("HOME") or str(Path.home())
    texts = []
    for path in config_files(env, home=home, prefix=prefix):
        try:
            texts.append(Path(path).read_text())
        except (OSError, UnicodeDecodeError):
            continue
    return uv_settings(pip_settings(texts, env))


def _key(name: str) -> str:
    """A setting's name as pip looks it up: its long option name, lower case, dashes."""
    name = name.lower().replace("_", "-")
    return _ALIASES.get(name, name)


def _flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def _words(value: str | None) -> list[str]:
    return value.split() if value else []
