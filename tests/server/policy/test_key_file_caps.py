"""`max_gpus` in the `--api-keys` file: a whole number >= 1, one value per namespace, read as the scheduler's caps."""

from __future__ import annotations

import pytest

from lancefn_jupyter.server.policy.namespaces import ApiKeyError, gpu_caps, load_api_keys

pytestmark = pytest.mark.unit


def _keys(tmp_path, text: str):
    path = tmp_path / "keys.toml"
    path.write_text(text)
    path.chmod(0o600)
    return load_api_keys(str(path))


def _entry(name: str, namespace: str, extra: str = "") -> str:
    return f"[[api_keys]]\nname = '{name}'\nkey = '{name}-key-123456'\nnamespace = '{namespace}'\nprivileges = ['jobs']\n{extra}\n"


def test_max_gpus_becomes_the_namespaces_cap(tmp_path):
    keys = _keys(
        tmp_path,
        _entry("alice", "vision", "max_gpus = 2") + _entry("bob", "vision") + _entry("carol", "nlp"),
    )
    assert gpu_caps(keys.values()) == {"vision": 2}


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "'two'", "true"])
def test_a_bad_max_gpus_says_what_it_must_be(tmp_path, value):
    with pytest.raises(ApiKeyError, match=r"api_keys\[0\]: field 'max_gpus' must be a whole number of GPUs >= 1"):
        _keys(tmp_path, _entry("alice", "vision", f"max_gpus = {value}"))


def test_two_caps_for_one_namespace_are_refused(tmp_path):
    with pytest.raises(ApiKeyError, match=r"api_keys\[1\]: max_gpus = 3 but key 'alice' of namespace 'vision' says 2"):
        _keys(tmp_path, _entry("alice", "vision", "max_gpus = 2") + _entry("bob", "vision", "max_gpus = 3"))
