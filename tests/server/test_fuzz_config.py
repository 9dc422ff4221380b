"""Bad input, generated: GPU-class and API-key config files as random TOML (hypothesis). Parsing
fails only with ``ConfigError`` / ``ApiKeyError``, and the message names a field; what parses is
usable. The other input edges are fuzzed in test_fuzz_inputs.py.
"""

from __future__ import annotations

import json
import math

from helpers import fuzz
from hypothesis import given
from hypothesis import strategies as st

from lancefn_jupyter.server.executors.local_plugin import PLUGIN as LOCAL
from lancefn_jupyter.server.executors.ray_plugin import PLUGIN as RAY

# ------------------------------------------------------------------- config files (TOML)


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"


def toml_document(top: dict, tables: list[dict], array_name: str) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in top.items()]
    for table in tables:
        lines.append(f"[[{array_name}]]")
        lines.extend(f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


_SCALARS = st.one_of(
    st.integers(-3, 10),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True),
    st.booleans(),
    st.sampled_from(
        ["default", "big", "a b", "", "nvidia.com/gpu", "NVIDIA H100", "Exists", "NoSchedule", "sim0", "0"]
    ),
    st.text(max_size=8),
)
_VALUES = st.one_of(
    _SCALARS,
    st.lists(_SCALARS, max_size=4),
    st.dictionaries(st.sampled_from(["key", "operator", "effect", "value", "x"]), _SCALARS, max_size=3),
    st.lists(
        st.dictionaries(st.sampled_from(["key", "operator", "effect", "value", "x"]), _SCALARS, max_size=3), max_size=2
    ),
)
CLASS_FIELDS = [
    "name",
    "resource_name",
    "gpu_model",
    "gpu_memory_bytes",
    "max_gpu_count_per_worker",
    "node_selector",
    "tolerations",
    "devices",
    "simulated",
]
_CLASS = st.dictionaries(st.sampled_from([*CLASS_FIELDS, "bogus"]), _VALUES, max_size=7)
# Mostly-valid classes, so the deeper checks (devices, limits, duplicates) are reached too.
_GOOD_CLASS = st.fixed_dictionaries(
    {"name": st.sampled_from(["default", "big", "x"]), "simulated": st.integers(-1, 4)},
    optional={
        "max_gpu_count_per_worker": st.integers(-1, 6),
        "devices": st.lists(st.integers(-1, 3), max_size=3),
        "gpu_model": st.sampled_from(["A", ""]),
        "gpu_memory_bytes": st.integers(-1, 2**40),
    },
)


@fuzz(400)
@given(
    top=st.dictionaries(st.sampled_from(["default_class", "classes", "junk"]), _SCALARS, max_size=2),
    tables=st.lists(st.one_of(_CLASS, _GOOD_CLASS), max_size=3),
    executor=st.sampled_from([LOCAL, RAY]),
    raw=st.one_of(st.none(), st.text(max_size=40)),
)
def test_random_gpu_class_configs_fail_only_with_a_config_error_naming_a_field(top, tables, executor, raw):
    from lancefn_jupyter.server.policy.gpu_classes import ConfigError, parse_gpu_classes

    text = raw if raw is not None else toml_document(top, tables, "gpu_classes")
    try:
        config = parse_gpu_classes(text, source="fuzz.toml", rules=executor)
    except ConfigError as error:
        message = str(error)
        assert message.startswith("fuzz.toml: "), message
        words = [f"'{field}'" for field in [*CLASS_FIELDS, "default_class", "bogus", "classes", "junk"]]
        words += ["not valid TOML", "at least one GPU class", "duplicate", "gpu_classes", "unknown"]
        assert any(word in message for word in words), message
        return
    assert config.classes and all(spec.name for spec in config.classes)


@fuzz(200)
@given(
    top=st.dictionaries(st.sampled_from(["junk"]), _SCALARS, max_size=1),
    tables=st.lists(
        st.dictionaries(
            st.sampled_from(["key", "privileges", "extra"]),
            st.one_of(_VALUES, st.lists(st.sampled_from(["functions", "jobs", "system_usage", "admin"]), max_size=3)),
            max_size=3,
        ),
        max_size=3,
    ),
    raw=st.one_of(st.none(), st.text(max_size=40)),
)
def test_random_api_key_files_fail_only_with_an_api_key_error(tmp_path_factory, top, tables, raw):
    from lancefn_jupyter.server.policy.namespaces import ApiKeyError, load_api_keys

    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(raw if raw is not None else toml_document(top, tables, "api_keys"), encoding="utf-8")
    path.chmod(0o600)  # else every file is refused for its mode before it is parsed
    try:
        keys = load_api_keys(str(path))
    except ApiKeyError as error:
        assert str(error).startswith(str(path)), str(error)
        return
    assert all(isinstance(k, str) and len(k) >= 8 for k in keys)
