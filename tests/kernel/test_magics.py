"""The magics and Python API against a real control plane on 127.0.0.1 (issue 2's "done means")."""

from __future__ import annotations

import httpx
import pytest
from helpers import kernel_shell
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.client import InvalidRequest, LancefnError

CELL = """\
def normalize_score(value: float) -> float:
    return value / 100.0
"""

TWO_CLASSES = """
[[gpu_classes]]
name = "default"
gpu_model = "Simulated A"
gpu_memory_bytes = 17179869184
max_gpu_count_per_worker = 2
simulated = 2

[[gpu_classes]]
name = "big"
gpu_model = "Simulated B"
gpu_memory_bytes = 85899345920
max_gpu_count_per_worker = 4
simulated = 4
"""


@pytest.fixture
def cp(control_plane_factory):
    return control_plane_factory(gpu_classes=TWO_CLASSES)


@pytest.fixture
def ip(cp):
    yield from kernel_shell(cp)


def shown(captured) -> str:
    """Everything a cell showed: printed text plus the text/plain of displayed objects."""
    return captured.stdout + "\n".join(o.data.get("text/plain", "") for o in captured.outputs)


def versions(cp) -> list[dict]:
    with httpx.Client(base_url=cp.url, headers={"x-api-key": cp.api_key}) as http:
        return http.post("/v1/functions/list", json={"include_definition": True}).json()["functions"]


def test_cell_registers_and_binds_a_handle_that_still_runs_locally(ip, cp):
    with capture_output() as out:
        ip.run_cell_magic("gpu_function", "num_gpus=1", CELL)
    handle = ip.user_ns["normalize_score"]
    assert isinstance(handle, api.GpuFunction)
    assert handle(50.0) == 0.5  # still the local function
    version = handle.version
    assert version.name == "normalize_score"
    assert version.runtime.kind == "python_v2" and version.runtime.resources.num_gpus == 1
    assert handle.registration_request.artifact.digest == version.artifact.digest
    listed = versions(cp)
    assert [(f["name"], f["version"]) for f in listed] == [("normalize_score", version.version)]
    # The card shows the identity and the class's hardware.
    card = shown(out)
    assert version.version in card and "Simulated A" in card and "python_v2" in card


def test_unchanged_cell_gives_same_version_changes_give_new_ones(ip, cp):
    ip.run_cell_magic("gpu_function", "num_gpus=1", CELL)
    first = ip.user_ns["normalize_score"].version.version
    ip.run_cell_magic("gpu_function", "num_gpus=1", "# a comment only\n" + CELL)
    assert ip.user_ns["normalize_score"].version.version == first
    assert len(versions(cp)) == 1

    ip.run_cell_magic("gpu_function", "num_gpus=1", CELL.replace("100.0", "10.0"))
    edited = ip.user_ns["normalize_score"].version.version
    ip.run_cell_magic("gpu_function", "num_gpus=2", CELL)
    two_gpus = ip.user_ns["normalize_score"].version.version
    ip.run_cell_magic("gpu_function", "num_gpus=1 pip=numpy", CELL)
    with_numpy = ip.user_ns["normalize_score"].version
    assert len({first, edited, two_gpus, with_numpy.version}) == 4
    assert with_numpy.runtime.environment.packages == ("numpy",)
    assert len(versions(cp)) == 4


def test_default_num_gpus_is_one(ip):
    ip.run_cell_magic("gpu_function", "", CELL)
    assert ip.user_ns["normalize_score"].version.runtime.resources.num_gpus == 1


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "True", "x"])
def test_bad_num_gpus_is_a_usage_error_and_registers_nothing(ip, cp, bad):
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("gpu_function", f"num_gpus={bad}", CELL)
    assert "num_gpus" in str(raised.value)
    assert versions(cp) == []
    assert "normalize_score" not in ip.user_ns


def test_unknown_option_names_the_valid_ones(ip, cp):
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("gpu_function", "num_gpu=1", CELL)
    assert "num_gpu" in str(raised.value) and "num_gpus" in str(raised.value)
    assert versions(cp) == []


def test_unknown_class_and_over_limit_are_400s_naming_the_classes(ip, cp):
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("gpu_function", "gpu_class=h100", CELL)
    message = str(raised.value)
    assert "h100" in message and "default" in message and "big" in message
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("gpu_function", "num_gpus=3", CELL)  # default allows 2
    assert "default" in str(raised.value) and "2" in str(raised.value)
    assert versions(cp) == []
    # Same check straight through the client: a 400 with the request id.
    request = api.gpu_function(num_gpus=5, gpu_class="big")(_module_level).registration_request
    with pytest.raises(InvalidRequest) as raised_api:
        api.current_client().functions.register(request)
    assert raised_api.value.status == 400 and "big" in raised_api.value.message and raised_api.value.request_id


def _module_level(value: float) -> float:
    return value * 2


def test_pinned_class_and_register_no(ip, cp):
    ip.run_cell_magic("gpu_function", "gpu_class=big num_gpus=4", CELL)
    assert ip.user_ns["normalize_score"].version.runtime.resources.gpu_class == "big"
    with capture_output() as out:
        ip.run_cell_magic("gpu_function", "register=no name=draft", CELL)
    draft = ip.user_ns["normalize_score"]
    assert draft._version is None and draft.registration_request.name == "draft"
    assert "not registered" in shown(out)
    assert [f["name"] for f in versions(cp)] == ["normalize_score"]


def test_cell_that_fails_to_run_registers_nothing(ip, cp):
    ip.run_cell_magic("gpu_function", "", "def broken(x: int) -> int:\n    return x\nraise RuntimeError('boom')\n")
    assert versions(cp) == []


def test_notebook_value_is_refused_with_a_fix(ip, cp):
    ip.run_cell("scale = [1, object()]")
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("gpu_function", "", "def f(x: int) -> int:\n    return x * len(scale)\n")
    assert "'scale[1]' is an object" in str(raised.value) and "define it in the cell" in str(raised.value)
    assert versions(cp) == []
    # the refused cell's name is a handle that says so, not a plain function (docs/user-guide.md)
    with pytest.raises(LancefnError, match="f is not registered: the function uses 'scale'"):
        ip.user_ns["f"].submit(1)


def test_profiles_with_explicit_override(ip, cp):
    ip.run_line_magic("gpu_profile", "big num_gpus=2 gpu_class=big pip=numpy")
    ip.run_cell_magic("gpu_function", "profile=big num_gpus=3", CELL)
    runtime = ip.user_ns["normalize_score"].version.runtime
    assert (runtime.resources.num_gpus, runtime.resources.gpu_class) == (3, "big")
    assert runtime.environment.packages == ("numpy",)
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("gpu_function", "profile=nope", CELL)
    assert "nope" in str(raised.value) and "big" in str(raised.value)


def test_listing_magics(ip, cp):
    ip.run_cell_magic("gpu_function", "", CELL)
    classes = ip.run_line_magic("gpu_classes", "")
    assert [c.name for c in classes] == ["default", "big"]
    text = repr(classes)
    assert "Simulated B" in text and "80 GiB" in text and "2/2" in text
    assert "(simulated)" not in text  # "Simulated B" says it
    listed = ip.run_line_magic("gpu_versions", "normalize_score")
    assert [(v.name, v.version) for v in listed] == [("normalize_score", ip.user_ns["normalize_score"].version.version)]
    assert "normalize_score" in repr(listed)
    status = repr(ip.run_line_magic("lancefn", ""))
    assert cp.url in status and "remote" in status and cp.api_key not in status
    with pytest.raises(UsageError):
        ip.run_line_magic("lancefn", "bogus")


def test_decorator_for_py_code(cp):
    api.connect(cp.url, cp.api_key)
    decorated = api.gpu_function(num_gpus=1, pip=["numpy"])(_module_level)
    assert decorated(2.0) == 4.0
    request = decorated.registration_request
    source = request.artifact  # LanceDB's snapshot layout for a plain module-level function
    import base64

    assert base64.b64decode(source.content.data).decode() == (
        "from __future__ import annotations\n\ndef _module_level(value: float) -> float:\n    return value * 2\n"
    )
    assert decorated.version.name == "_module_level"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            api.gpu_function(num_gpus=bad)(_module_level)


# ---------------------------------------------------------------- warm state: the state option, class entries

SCALER_CELL = """\
import math
class Scaler:
    setups = 0
    def setup(self):
        type(self).setups += 1
        self.factor = math.sqrt(4.0)
    def __call__(self, x: float, bias: float = 0.0) -> float:
        return x * self.factor + bias
Scaler
"""


def test_state_option_changes_the_version_only_when_per_job(ip, cp):
    ip.run_cell_magic("gpu_function", "", CELL)
    default = ip.user_ns["normalize_score"].version
    ip.run_cell_magic("gpu_function", "state=per_worker", CELL)
    assert ip.user_ns["normalize_score"].version.version == default.version  # the default is never encoded
    assert default.runtime.state is None
    ip.run_cell_magic("gpu_function", "state=per_job", CELL)
    per_job = ip.user_ns["normalize_score"].version
    assert per_job.version != default.version and per_job.runtime.state == "per_job"
    assert len(versions(cp)) == 2
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("gpu_function", "state=per_call", CELL)
    assert (
        str(raised.value) == "state must be per_worker (the default) or per_job (got 'per_call'); write state=per_job"
    )
    ip.run_line_magic("gpu_profile", "fresh state=per_job")
    ip.run_cell_magic("gpu_function", "profile=fresh", CELL)
    assert ip.user_ns["normalize_score"].version.version == per_job.version


def test_a_class_entry_binds_its_name_and_runs_setup_once_in_the_kernel(ip, cp):
    with capture_output() as out:
        ip.run_cell_magic("gpu_function", "", SCALER_CELL)
    scale = ip.user_ns["Scaler"]
    assert isinstance(scale, api.GpuFunction) and scale.entrypoint == "Scaler"
    assert ip.user_ns["Scaler"].__wrapped__.setups == 0  # the cell only displayed the class
    assert scale(3.0) == 6.0 and scale(1.0, bias=0.5) == 2.5
    assert scale.__wrapped__.setups == 1  # one kernel-side instance, set up once
    # Rows bind to __call__ without self, defaults left to the worker.
    assert scale.item_row(3.0) == {"x": 3.0} and scale.item_row({"x": 1.0, "bias": 2.0}) == {"x": 1.0, "bias": 2.0}
    assert scale.parameter_defaults() == {"bias": 0.0}
    assert [p.name for p in scale.version.signature.inputs] == ["x", "bias"]
    card = shown(out)
    assert "entry       class Scaler: setup once per worker" in card
    assert "left out: line 10, Scaler" in card  # the trailing expression (notebook line: after the magic line)
    with pytest.raises(TypeError, match="Scaler\\(\\): missing a required argument: 'x'"):
        scale.submit()
    # Looked up from the control plane (as from another kernel): the artifact says it is a class.
    looked_up = api.lookup("Scaler")
    assert looked_up.version.version == scale.version.version
    assert "entry       class Scaler: setup once per worker" in repr(looked_up)
    assert "left out" not in repr(looked_up)
    ip.run_cell_magic("gpu_function", "state=per_job", SCALER_CELL)
    assert "class Scaler: setup once per job" in repr(ip.user_ns["Scaler"])
    assert "class Scaler: setup once per job" in repr(api.lookup(f"Scaler@{ip.user_ns['Scaler'].version.version}"))


def test_a_class_entry_that_needs_init_arguments_is_refused(ip, cp):
    cell = "class Model:\n    def __init__(self, path):\n        self.path = path\n    def __call__(self, x: int) -> int:\n        return x\n"
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("gpu_function", "", cell)
    assert "instantiated with no arguments: give every __init__ parameter a default, or load in setup()" in str(
        raised.value
    )
    assert versions(cp) == []
    # The refused cell's class name says so on job methods (docs/user-guide.md, "When a cell is refused").
    assert isinstance(ip.user_ns["Model"], api.UnregisteredFunction)
    with pytest.raises(LancefnError, match="Model is not registered: the class entry 'Model'"):
        ip.user_ns["Model"].submit(1)


def test_a_mid_cell_call_runs_in_the_worker_and_trial_calls_are_left_out(ip, cp):
    cell = (
        "_STATE = {}\n"
        "_STATE.update(mode='eval')\n"
        "def mode(x: int) -> str:\n"
        "    return _STATE['mode'] + str(x)\n"
        "mode(1)\n"
        "print('tried')\n"
    )
    with capture_output() as out:
        ip.run_cell_magic("gpu_function", "", cell)
    handle = ip.user_ns["mode"]
    assert "_STATE.update(mode='eval')" in handle.artifact_source and "mode(1)" not in handle.artifact_source
    assert "left out: line 6, mode(1); line 7, print('tried')" in shown(out)
    assert handle.remote(2) == "eval2"  # the kept call ran when the worker executed the module


class _Doubler:
    def setup(self) -> None:
        self.offset = 1.0

    def __call__(self, x: float) -> float:
        return 2 * x + self.offset


def test_decorator_on_a_class(cp):
    api.connect(cp.url, cp.api_key)
    decorated = api.gpu_function(state="per_job")(_Doubler)
    assert decorated(2.0) == 5.0
    assert decorated.registration_request.runtime.state == "per_job"
    assert decorated.artifact_source.startswith("from __future__ import annotations\n\nclass _Doubler:\n")
    assert "class _Doubler: setup once per job" in repr(decorated)
    with pytest.raises(ValueError, match="state must be per_worker"):
        api.gpu_function(state="sometimes")(_Doubler)
