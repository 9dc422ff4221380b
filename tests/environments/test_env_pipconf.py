"""pip's configuration as uv flags, and the layering rule's pure parts (docs/ARCHITECTURE.md, "Environments")."""

from __future__ import annotations

import os

import pytest

from lancefn_jupyter.environments import pipconf, resolve

pytestmark = pytest.mark.unit


def test_config_files_follow_pips_order():
    env = {"XDG_CONFIG_DIRS": "/a:/b"}
    files = pipconf.config_files(env, home="/h", prefix="/venv")
    assert files == [
        "/a/pip/pip.conf",
        "/b/pip/pip.conf",
        "/etc/pip.conf",
        "/h/.pip/pip.conf",
        "/h/.config/pip/pip.conf",
        "/venv/pip.conf",
    ]


def test_pip_config_file_devnull_loads_none_and_an_existing_one_replaces_the_users(tmp_path):
    assert pipconf.config_files({"PIP_CONFIG_FILE": os.devnull}, home="/h") == []
    chosen = tmp_path / "pip.conf"
    chosen.write_text("[global]\n")
    files = pipconf.config_files({"PIP_CONFIG_FILE": str(chosen)}, home="/h", prefix="/venv")
    assert files == ["/etc/xdg/pip/pip.conf", "/etc/pip.conf", "/venv/pip.conf", str(chosen)]


def test_later_files_then_install_section_then_environment_win():
    machine = "[global]\nindex-url = https://a/simple\nfind-links = /w1\ntimeout = 5\n"
    user = "[global]\nindex-url = https://b/simple\n[install]\nfind-links = /w2\n"
    later = "[global]\nfind-links = /w3\n"  # [install] of an earlier file still beats [global] of a later one
    settings = pipconf.pip_settings([machine, user, later], {"PIP_DEFAULT_TIMEOUT": "60", "HOME": "/h"})
    assert settings["index-url"] == "https://b/simple"
    assert settings["find-links"] == "/w2"
    assert settings["timeout"] == "60"  # PIP_DEFAULT_TIMEOUT is --default-timeout, an alias of --timeout


def test_environment_variables_override_files():
    settings = pipconf.pip_settings(["[global]\nno-index = false\n"], {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/x"})
    assert pipconf.uv_settings(settings).args == ("--no-index", "--find-links", "/x")


def test_a_broken_file_is_skipped():
    assert pipconf.pip_settings(["not ini", "[global]\npre = yes\n"], {}) == {"pre": "yes"}


def test_every_setting_maps_to_uv():
    settings = {
        "index-url": "https://mirror/simple",
        "extra-index-url": "file:///opt/pypi/simple\n file:///opt/more/simple",
        "find-links": "/opt/wheels /opt/more-wheels",
        "constraint": "/etc/c.txt",
        "pre": "true",
        "only-binary": ":all:",
        "no-binary": "pkg-a,pkg-b",
        "trusted-host": "mirror",
        "cert": "/etc/ca.pem",
        "timeout": "180",
    }
    uv = pipconf.uv_settings(settings)
    assert uv.args == (
        *("--index-url", "https://mirror/simple"),
        *("--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/more/simple"),
        *("--index-strategy", "unsafe-best-match"),
        *("--find-links", "/opt/wheels", "--find-links", "/opt/more-wheels"),
        *("--constraint", "/etc/c.txt"),
        *("--prerelease", "allow"),
        *("--only-binary", ":all:"),
        *("--no-binary", "pkg-a", "--no-binary", "pkg-b"),
        *("--allow-insecure-host", "mirror"),
    )
    assert dict(uv.env) == {"SSL_CERT_FILE": "/etc/ca.pem", "UV_HTTP_TIMEOUT": "180"}


def test_no_index_drops_the_indexes_but_keeps_find_links():
    uv = pipconf.uv_settings(
        {"no-index": "1", "index-url": "https://x", "extra-index-url": "https://y", "find-links": "/w"}
    )
    assert uv.args == ("--no-index", "--find-links", "/w")


def test_no_settings_no_flags():
    assert pipconf.uv_settings({}) == pipconf.UvSettings()


def test_read_pip_settings_reads_the_files(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url = file:///a file:///b\n")
    env = {"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path), "XDG_CONFIG_DIRS": str(tmp_path / "none")}
    uv = pipconf.read_pip_settings(env, prefix=str(tmp_path / "venv"))
    assert "--extra-index-url" in uv.args and "file:///b" in uv.args


def test_install_set_keeps_what_the_base_lacks_or_has_at_another_version():
    base = {"six": "1.17.0", "numpy": "2.1"}
    pins = ["ecdsa==0.19.2", "six==1.17.0", "numpy==2.1.0", "Six==1.16.0", "pkg @ file:///x/pkg.whl"]
    assert resolve.install_set(pins, base) == ("ecdsa==0.19.2", "Six==1.16.0", "pkg @ file:///x/pkg.whl")
    assert resolve.install_set(pins, None) == tuple(pins)


def test_resolved_pins_drop_comments_options_and_hashes():
    text = "# header\n--index-url https://x\nsix==1.16.0\n    # via ecdsa\necdsa==0.19.2 \\\n    --hash=sha256:ab\n"
    assert resolve.resolved_pins(text) == ["six==1.16.0", "ecdsa==0.19.2"]


def test_another_python_gets_the_workers_requirements():
    assert resolve.requirements_in(["tabulate"], layered=True, gpu=True) == ["tabulate"]
    assert resolve.requirements_in(["NumPy<3"], layered=False) == ["NumPy<3", "packaging", "pyarrow"]
    assert resolve.requirements_in([], layered=False, gpu=True) == [
        "packaging",
        "numpy",
        "pyarrow",
        "numba",
        "numba-cuda",
    ]


def test_preferences_and_normalized_spelling():
    assert (
        resolve.preferences({"six": "1.17.0", "ecdsa": "0.19", "old": "0.1-dev-r9 x"}) == "ecdsa==0.19\nsix==1.17.0\n"
    )
    assert resolve.normalized(["six ==1.16.0", "ecdsa"]) == resolve.normalized(["ecdsa", "six==1.16.0"])
