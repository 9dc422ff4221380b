"""GPU class config: TOML parsing, errors that name file/class/field, NVML absent → simulated default."""

from __future__ import annotations

import sys

import pytest

from lancefn_jupyter.server.executors.local_plugin import PLUGIN as LOCAL
from lancefn_jupyter.server.executors.ray_plugin import PLUGIN as RAY
from lancefn_jupyter.server.policy.gpu_classes import (
    SIMULATED_GPU_MODEL,
    ConfigError,
    detect_nvml_gpus,
    load_gpu_classes,
    parse_gpu_classes,
)

pytestmark = pytest.mark.unit

GOOD = """
[[gpu_classes]]
name = "default"
resource_name = "nvidia.com/gpu"
gpu_model = "NVIDIA H100 80GB HBM3"
gpu_memory_bytes = 85899345920
max_gpu_count_per_worker = 2
node_selector = { "cloud.google.com/gke-accelerator" = "nvidia-h100-80gb" }
tolerations = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]
devices = [0, 1, 2, 3]

[[gpu_classes]]
name = "sim"
simulated = 3
"""


def test_good_config_parses_into_classes_and_devices():
    config = parse_gpu_classes(GOOD, source="classes.toml")
    assert config.names == ["default", "sim"]
    assert config.default_class == "default"
    h100 = config.get(None)
    assert h100.devices == ("0", "1", "2", "3")
    assert h100.gpu_class.max_gpu_count_per_worker == 2
    assert h100.gpu_class.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert h100.gpu_class.tolerations[0]["operator"] == "Exists"
    assert not h100.simulated
    sim = config.get("sim")
    assert sim.simulated and sim.devices == ("sim0", "sim1", "sim2")
    assert sim.gpu_class.gpu_model == SIMULATED_GPU_MODEL
    # max_gpu_count_per_worker defaults to the device count
    assert sim.gpu_class.max_gpu_count_per_worker == 3
    assert config.get("nope") is None
    assert config.devices() == {"default": ("0", "1", "2", "3"), "sim": ("sim0", "sim1", "sim2")}


def test_default_class_is_first_when_none_is_named_default():
    config = parse_gpu_classes(
        '[[gpu_classes]]\nname = "t4"\nsimulated = 1\n[[gpu_classes]]\nname = "a100"\nsimulated = 1\n'
    )
    assert config.default_class == "t4"
    config = parse_gpu_classes(
        'default_class = "a100"\n[[gpu_classes]]\nname = "t4"\nsimulated = 1\n[[gpu_classes]]\nname = "a100"\nsimulated = 1\n'
    )
    assert config.default_class == "a100"


@pytest.mark.parametrize(
    "text, words",
    [
        ("[[gpu_classes]]\nname = 'x'\nsimulated = 1\nbogus = 1\n", ["class 'x'", "'bogus'", "allowed fields"]),
        ("[[gpu_classes]]\nsimulated = 1\n", ["gpu_classes[0]", "'name'", "missing"]),
        ("[[gpu_classes]]\nname = 'a b'\nsimulated = 1\n", ["'name'", "'a b'"]),
        ("[[gpu_classes]]\nname = 'x'\ndevices = [0]\n", ["class 'x'", "'gpu_model'", "missing"]),
        (
            "[[gpu_classes]]\nname = 'x'\ngpu_model = 'A'\ndevices = [0]\n",
            ["class 'x'", "'gpu_memory_bytes'", "missing"],
        ),
        (
            "[[gpu_classes]]\nname = 'x'\ngpu_model = 'A'\ngpu_memory_bytes = '80GB'\ndevices = [0]\n",
            ["class 'x'", "'gpu_memory_bytes'", "'80GB'"],
        ),
        (
            "[[gpu_classes]]\nname = 'x'\nsimulated = 2\nmax_gpu_count_per_worker = 4\n",
            ["class 'x'", "'max_gpu_count_per_worker'", "only 2 device", "at most 2"],
        ),
        (
            "[[gpu_classes]]\nname = 'x'\nsimulated = 2\nmax_gpu_count_per_worker = true\n",
            ["'max_gpu_count_per_worker'", "True"],
        ),
        ("[[gpu_classes]]\nname = 'x'\nsimulated = 0\n", ["'simulated'", "simulated = N"]),
        ("[[gpu_classes]]\nname = 'x'\nsimulated = 1\ndevices = [0]\n", ["'simulated'", "not both"]),
        (
            "[[gpu_classes]]\nname = 'x'\ngpu_model = 'A'\ngpu_memory_bytes = 1\n",
            ["'devices'", "missing", "simulated = N"],
        ),
        (
            "[[gpu_classes]]\nname = 'x'\ngpu_model='A'\ngpu_memory_bytes=1\ndevices = [0, 0]\n",
            ["'devices'", "more than once"],
        ),
        ("[[gpu_classes]]\nname = 'x'\ngpu_model='A'\ngpu_memory_bytes=1\ndevices = [-1]\n", ["'devices'", "-1"]),
        (
            "[[gpu_classes]]\nname = 'x'\nsimulated = 1\n[[gpu_classes]]\nname = 'x'\nsimulated = 1\n",
            ["duplicate", "'x'"],
        ),
        (
            "[[gpu_classes]]\nname='a'\ngpu_model='A'\ngpu_memory_bytes=1\ndevices=[0]\n"
            "[[gpu_classes]]\nname='b'\ngpu_model='A'\ngpu_memory_bytes=1\ndevices=[0]\n",
            ["class 'b'", "'devices'", "already in class 'a'"],
        ),
        ("[[gpu_classes]]\nname = 'x'\nsimulated = 1\nnode_selector = { a = 1 }\n", ["'node_selector'"]),
        ("[[gpu_classes]]\nname = 'x'\nsimulated = 1\ntolerations = ['a']\n", ["'tolerations'"]),
        ("[[gpu_classes]]\nname = 'x'\nsimulated = 1\ntolerations = [{ a = nan }]\n", ["class 'x'", "tolerations"]),
        ("classes = 1\n", ["unknown top-level key 'classes'"]),
        ("", ["at least one GPU class"]),
        ("[[gpu_classes]\n", ["not valid TOML"]),
        ("default_class = 'z'\n[[gpu_classes]]\nname = 'x'\nsimulated = 1\n", ["'default_class'", "'z'", "x"]),
    ],
)
def test_config_errors_name_the_file_class_and_field(text, words):
    with pytest.raises(ConfigError) as info:
        parse_gpu_classes(text, source="/etc/lancefn/classes.toml")
    message = str(info.value)
    assert message.startswith("/etc/lancefn/classes.toml: "), message
    for word in words:
        assert word in message, (word, message)


def test_ray_executor_allows_classes_without_devices():
    text = "[[gpu_classes]]\nname = 'x'\ngpu_model = 'A'\ngpu_memory_bytes = 1\nmax_gpu_count_per_worker = 8\n"
    config = parse_gpu_classes(text, rules=RAY)
    assert config.get("x").devices == ()
    with pytest.raises(ConfigError, match="max_gpu_count_per_worker"):
        parse_gpu_classes("[[gpu_classes]]\nname = 'x'\ngpu_model = 'A'\ngpu_memory_bytes = 1\n", rules=RAY)
    with pytest.raises(ConfigError, match="the local executor needs devices = "):  # its plug-in's rule
        parse_gpu_classes(text, rules=LOCAL)


def test_load_reads_the_file_from_the_flag_or_env(tmp_path):
    path = tmp_path / "classes.toml"
    path.write_text(GOOD)
    assert load_gpu_classes(path, environ={}).names == ["default", "sim"]
    assert load_gpu_classes(None, environ={"LANCEFN_GPU_CLASSES": str(path)}).source == str(path)
    with pytest.raises(ConfigError, match="not found"):
        load_gpu_classes(tmp_path / "missing.toml", environ={})


def test_nvml_absent_means_zero_gpus_and_a_simulated_default(monkeypatch):
    # A None entry in sys.modules makes `import pynvml` raise ImportError: NVML is absent.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert detect_nvml_gpus() == []
    config = load_gpu_classes(None, environ={})
    assert config.source == "simulated"
    default = config.get(None)
    assert default.name == "default"
    assert default.simulated and default.gpu_class.simulated
    assert default.gpu_class.gpu_model == SIMULATED_GPU_MODEL
    assert default.devices == ("sim0", "sim1")
    assert default.gpu_class.max_gpu_count_per_worker == 2


def test_detected_gpus_form_the_default_class():
    gpus = [("0", "NVIDIA H200", 150_000_000_000), ("1", "NVIDIA H200", 150_000_000_000)]
    config = load_gpu_classes(None, environ={}, detect=lambda: gpus)
    default = config.get(None)
    assert config.source == "nvml"
    assert default.devices == ("0", "1")
    assert default.gpu_class.gpu_model == "NVIDIA H200"
    assert default.gpu_class.gpu_memory_bytes == 150_000_000_000
    assert default.gpu_class.max_gpu_count_per_worker == 2
    assert not default.simulated
    # LANCEFN_DISABLE_NVML skips detection entirely.
    assert load_gpu_classes(None, environ={"LANCEFN_DISABLE_NVML": "1"}, detect=lambda: gpus).source == "simulated"


SCALED = """
[[gpu_classes]]
name = "t4"
gpu_model = "NVIDIA T4"
gpu_memory_bytes = 17179869184
max_gpu_count_per_worker = 1
"""


def test_a_ray_class_says_its_node_shape_and_node_range_for_the_autoscaler():
    spec = parse_gpu_classes(SCALED + "max_nodes = 4\n", rules=RAY).get("t4")
    assert spec.scaling.max_nodes == 4 and spec.scaling.min_nodes == 0
    assert spec.scaling.node.gpus == 1 and spec.scaling.node_type == "t4"  # defaults: one worker, the class's name
    spec = parse_gpu_classes(
        SCALED + 'max_nodes = 3\nmin_nodes = 1\ngpus_per_node = 8\nnode_type = "t4-group"\n', rules=RAY
    ).get("t4")
    assert (spec.scaling.node.gpus, spec.scaling.min_nodes, spec.scaling.node_type) == (8, 1, "t4-group")
    assert parse_gpu_classes(SCALED, rules=RAY).get("t4").scaling is None


@pytest.mark.parametrize(
    ("extra", "rules", "says"),
    [
        ("max_nodes = 2\ngpus_per_node = 1\nmax_gpu_count_per_worker = 2\n", RAY, None),
        ("max_nodes = 2\nmin_nodes = 3\n", RAY, "field 'min_nodes' is 3, more than max_nodes = 2"),
        ("min_nodes = 1\n", RAY, "field 'min_nodes' is set without 'max_nodes'"),
        ("max_nodes = 0\n", RAY, "field 'max_nodes' is 0"),
        ("max_nodes = 2\ndevices = [0]\n", LOCAL, "field 'max_nodes' is set on a class with devices"),
    ],
)
def test_node_scaling_fields_are_checked(extra, rules, says):
    text = SCALED.replace("max_gpu_count_per_worker = 1\n", "") if "max_gpu_count_per_worker" in extra else SCALED
    with pytest.raises(ConfigError) as error:
        parse_gpu_classes(text + extra, rules=rules)
    message = str(error.value)
    if says is None:  # a job as large as the class allows must fit a node
        says = "field 'gpus_per_node' is 1 but max_gpu_count_per_worker is 2: a job of 2 GPUs could never start"
    assert says in message, message
