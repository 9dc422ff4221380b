"""Wire models: the byte-exact anchors of docs/ARCHITECTURE.md ("Function versions"), canonical JSON, derivation, job and GPU models."""

import base64
import hashlib
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lancefn_jupyter.wire.models import (
    TERMINAL_STATES,
    FunctionArtifact,
    FunctionArtifactRequest,
    FunctionOutput,
    FunctionParameter,
    FunctionRegistrationRequest,
    FunctionResourceRequirements,
    FunctionSignature,
    FunctionVersion,
    GpuClass,
    GpuUsage,
    Job,
    JobFailure,
    JobPlacement,
    JobProgress,
    JobState,
    PythonEnvironmentSpec,
    PythonRuntimeSpec,
    canonical_json,
    decode_artifact,
    derive_version,
    display_state,
    environment_digest,
    rfc3339_now,
    runtime_digest,
    version_id,
)

pytestmark = pytest.mark.unit

SEED_CANONICAL = '{"environment":{"kind":"pip"},"kind":"python_v2","python_version":"3.12","resources":{"num_gpus":1}}'
SOURCE = b"from __future__ import annotations\n\n\ndef double(value: int) -> int:\n    return value * 2\n"


def runtime(num_gpus=None, pip=("cupy-cuda12x",), python_version="3.12", **extra):
    """A runtime the way the decorator builds it: python_v2 with resources, else python."""
    return PythonRuntimeSpec(
        kind="python_v2" if num_gpus is not None else "python",
        python_version=python_version,
        environment=PythonEnvironmentSpec(kind="pip", packages=pip),
        resources=FunctionResourceRequirements(num_gpus=num_gpus) if num_gpus is not None else None,
        **extra,
    )


def request(source=SOURCE, name="double", num_gpus=1, pip=("numpy",)):
    return FunctionRegistrationRequest(
        name=name,
        artifact=FunctionArtifactRequest(
            kind="python_callable",
            digest="sha256:" + hashlib.sha256(source).hexdigest(),
            entrypoint="double",
            content={"encoding": "base64", "data": base64.b64encode(source).decode()},
            adapter={"kind": "scalar_to_arrow_batch", "version": 1},
        ),
        signature=FunctionSignature(
            inputs=(FunctionParameter(name="value", arrow_type="int64", nullable=False),),
            output=FunctionOutput(kind="scalar", arrow_type="int64", nullable=False),
        ),
        runtime=runtime(num_gpus, pip=pip),
    )


# ---------------------------------------------------- byte-exact anchors and validation


def test_udf_gpu_requirement_uses_resource_aware_runtime():
    gpu = json.loads(request(num_gpus=1).to_canonical_json())
    assert gpu["runtime"]["kind"] == "python_v2"
    assert gpu["runtime"]["resources"] == {"num_gpus": 1}

    cpu = json.loads(request(num_gpus=None, pip=("pyarrow",)).to_canonical_json())["runtime"]
    assert cpu["kind"] == "python"
    assert "resources" not in cpu

    for invalid in [0, -1, 1.5, True]:
        with pytest.raises(ValueError, match=r"num_gpus must be a whole number of GPUs ≥ 1.*write e\.g\. num_gpus=1"):
            runtime(num_gpus=invalid)


def test_resource_aware_python_runtime_round_trips_and_validates():
    parsed = PythonRuntimeSpec.from_json(
        '{"kind":"python_v2","python_version":"3.12","environment":{"kind":"pip"},"resources":{"num_gpus":1}}'
    )
    assert parsed.kind == "python_v2"
    assert parsed.resources.num_gpus == 1
    assert canonical_json(parsed) == SEED_CANONICAL
    assert parsed.to_canonical_json() == SEED_CANONICAL

    invalid = {
        '{"kind":"python","python_version":"3.12","environment":{"kind":"pip"},"resources":{"num_gpus":1}}': "python runtime with resources requires kind='python_v2'",
        '{"kind":"python_v2","python_version":"3.12","environment":{"kind":"pip"}}': "python_v2 runtime requires resources",
        '{"kind":"python_v2","python_version":"3.12","environment":{"kind":"pip"},"resources":{"num_gpus":0}}': "num_gpus must be a whole number of GPUs ≥ 1",
    }
    for payload, message in invalid.items():
        with pytest.raises(ValidationError, match=re.escape(message)):
            PythonRuntimeSpec.from_json(payload)


def test_seed_canonical_bytes_built_from_python():
    built = PythonRuntimeSpec(
        kind="python_v2",
        python_version="3.12",
        environment=PythonEnvironmentSpec(kind="pip"),
        resources=FunctionResourceRequirements(num_gpus=1),
    )
    assert built.to_canonical_json() == SEED_CANONICAL  # gpu_class not pinned → not written


# ------------------------------------------------------------------------ resources


def test_gpu_class_is_written_only_when_pinned():
    pinned = FunctionResourceRequirements(num_gpus=2, gpu_class="a100-80gb")
    assert pinned.to_canonical_json() == '{"gpu_class":"a100-80gb","num_gpus":2}'
    assert FunctionResourceRequirements(num_gpus=2).to_wire() == {"num_gpus": 2}


@pytest.mark.parametrize("bad", [0, -1, 1.5, 1.0, True, False, "1", None, 2**32])
def test_num_gpus_rejects_everything_but_a_positive_uint32(bad):
    with pytest.raises(ValidationError, match="num_gpus must be a whole number of GPUs ≥ 1") as info:
        FunctionResourceRequirements(num_gpus=bad)
    assert info.value.errors()[0]["loc"] == ("num_gpus",)


def test_num_gpus_bounds_and_json_strictness():
    assert FunctionResourceRequirements(num_gpus=2**32 - 1).num_gpus == 2**32 - 1
    for text in ['{"num_gpus":1.0}', '{"num_gpus":"1"}', '{"num_gpus":true}']:
        with pytest.raises(ValidationError, match="num_gpus"):
            FunctionResourceRequirements.from_json(text)


@pytest.mark.parametrize("bad", ["", "1gpu", "a b", "a/b", 5])
def test_gpu_class_name_is_validated(bad):
    with pytest.raises(ValidationError) as info:
        FunctionResourceRequirements(num_gpus=1, gpu_class=bad)
    assert info.value.errors()[0]["loc"][0] == "gpu_class"


# ---------------------------------------------------------------------- environment


def test_packages_are_trimmed_deduplicated_and_sorted():
    env = PythonEnvironmentSpec(kind="pip", packages=[" scipy", "numpy ", "numpy", "scipy"])
    assert env.packages == ("numpy", "scipy")
    assert env.to_canonical_json() == '{"kind":"pip","packages":["numpy","scipy"]}'
    assert env == PythonEnvironmentSpec(kind="pip", packages=["scipy", "numpy"])


@pytest.mark.parametrize("packages", [[""], ["numpy", "  "]])
def test_empty_package_is_rejected(packages):
    with pytest.raises(ValidationError, match="is empty; remove it or name a package"):
        PythonEnvironmentSpec(kind="pip", packages=packages)


def test_package_must_be_a_string():
    with pytest.raises(ValidationError, match="packages"):
        PythonEnvironmentSpec(kind="pip", packages=[1])


def test_conda_channels_keep_order_and_pip_stays_bare():
    conda = PythonEnvironmentSpec.from_json('{"kind":"conda","packages":["numba"],"channels":["nvidia","conda-forge"]}')
    assert conda.channels == ("nvidia", "conda-forge")
    assert conda.to_canonical_json() == '{"channels":["nvidia","conda-forge"],"kind":"conda","packages":["numba"]}'
    pip = PythonEnvironmentSpec.from_json('{"kind":"pip","packages":["numpy"]}')
    assert "channels" not in pip.to_canonical_json()


def test_pip_and_conda_are_exclusive():
    with pytest.raises(ValidationError, match="channels are only for conda environments; use kind='conda'"):
        PythonEnvironmentSpec(kind="pip", packages=["numpy"], channels=["conda-forge"])
    for kind in ["pip+conda", "both", "", "uv"]:
        with pytest.raises(ValidationError, match="kind"):
            PythonEnvironmentSpec(kind=kind)
    with pytest.raises(ValidationError, match="channel #1 is empty"):
        PythonEnvironmentSpec(kind="conda", channels=["nvidia", " "])


def test_image_is_optional_and_not_empty():
    assert (
        PythonEnvironmentSpec(kind="pip", image="nvcr.io/nvidia/pytorch:24.05").to_wire()["image"]
        == "nvcr.io/nvidia/pytorch:24.05"
    )
    with pytest.raises(ValidationError, match="must not be empty"):
        PythonEnvironmentSpec(kind="pip", image="")


# -------------------------------------------------------------------------- runtime


def test_runtime_required_fields_name_the_fix():
    cases = {
        "python runtime requires python_version; add python_version='3.12'": {
            "kind": "python",
            "environment": {"kind": "pip"},
        },
        "python runtime requires environment": {"kind": "python", "python_version": "3.12"},
        "python_v2 runtime requires python_version": {
            "kind": "python_v2",
            "environment": {"kind": "pip"},
            "resources": {"num_gpus": 1},
        },
        "python_v2 runtime requires environment": {
            "kind": "python_v2",
            "python_version": "3.12",
            "resources": {"num_gpus": 1},
        },
    }
    for message, payload in cases.items():
        with pytest.raises(ValidationError, match=re.escape(message)):
            PythonRuntimeSpec.from_wire(payload)


def test_unknown_runtime_kind_decodes_to_kind_only():
    parsed = PythonRuntimeSpec.from_json(
        '{"kind":"python_v9","python_version":"bogus","environment":7,"resources":{"num_gpus":0},"future":[1]}'
    )
    assert parsed.kind == "python_v9"
    assert parsed.python_version is None and parsed.environment is None and parsed.resources is None
    assert parsed.to_canonical_json() == '{"kind":"python_v9"}'
    assert PythonRuntimeSpec.from_json(parsed.to_canonical_json()) == parsed


def test_unknown_fields_are_ignored_and_never_re_emitted():
    text = (
        '{"kind":"python_v2","python_version":"3.12","shiny":true,'
        '"environment":{"kind":"pip","future":{"x":1}},"resources":{"num_gpus":1,"mig":"1g.10gb"}}'
    )
    parsed = PythonRuntimeSpec.from_json(text)
    assert parsed.to_canonical_json() == SEED_CANONICAL
    assert not hasattr(parsed, "shiny")


def test_env_is_validated_and_empty_env_means_no_env():
    assert runtime(env={}).to_wire() == runtime().to_wire()
    assert runtime(env={"B": "2", "A": "1"}).to_canonical_json().startswith('{"env":{"A":"1","B":"2"},')
    with pytest.raises(ValidationError, match="environment variable name '1X' is invalid"):
        runtime(env={"1X": "v"})
    with pytest.raises(ValidationError, match="env"):
        runtime(env={"A": 1})


def test_python_version_format():
    with pytest.raises(ValidationError, match=r"must be MAJOR\.MINOR.*'3\.12'"):
        runtime(python_version="three")


def test_models_are_frozen_all_the_way_down():
    value = runtime(env={"A": "1"})
    with pytest.raises(ValidationError):
        value.kind = "python_v2"
    with pytest.raises(TypeError, match="immutable"):
        value.env["A"] = "2"
    assert isinstance(value.environment.packages, tuple)


# ---------------------------------------------------------------- canonical JSON


def test_canonical_json_sorts_keys_at_every_depth_and_keeps_array_order():
    value = {"b": [{"z": 1, "a": [3, 1, {"y": None, "x": "é"}]}], "a": {"d": 1, "c": 2}}
    assert canonical_json(value) == '{"a":{"c":2,"d":1},"b":[{"a":[3,1,{"x":"é","y":null}],"z":1}]}'


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), {"a": [float("nan")]}])
def test_canonical_json_rejects_non_finite_numbers(bad):
    with pytest.raises(ValueError):
        canonical_json(bad)


def test_defaults_are_omitted_and_required_fields_written():
    job = Job(job_id="j", job_type="run_function", job_state=JobState.PENDING, creation_ms=0, placement={}, progress={})
    assert job.to_wire() == {
        "job_id": "j",
        "job_type": "run_function",
        "job_state": "PENDING",
        "creation_ms": 0,
        "placement": {},
        "progress": {},
    }
    output = FunctionOutput(kind="scalar", arrow_type="int64", nullable=False)
    assert output.to_canonical_json() == '{"arrow_type":"int64","kind":"scalar","nullable":false}'


def test_strict_ints_everywhere():
    with pytest.raises(ValidationError):
        JobProgress(rows_done=True, rows_total=1)
    with pytest.raises(ValidationError):
        JobProgress.from_json('{"rows_done":1.0,"rows_total":2}')
    with pytest.raises(ValidationError):
        GpuUsage(name="default", gpus_total="2", gpus_busy=0, jobs_running=0, jobs_pending=0)
    with pytest.raises(ValidationError):
        FunctionArtifactRequest.from_wire(
            {**request().artifact.to_wire(), "adapter": {"kind": "scalar_to_arrow_batch", "version": True}}
        )
    with pytest.raises(ValidationError):
        FunctionArtifactRequest.from_wire(
            {**request().artifact.to_wire(), "adapter": {"kind": "scalar_to_arrow_batch", "version": 1.0}}
        )


# ------------------------------------------------------------------- artifacts etc.


def test_artifact_request_shape_is_enforced():
    wire = request().artifact.to_wire()
    assert wire["kind"] == "python_callable"
    assert wire["adapter"] == {"kind": "scalar_to_arrow_batch", "version": 1}
    bad = {
        "kind": "python_script",
        "digest": "sha1:" + "0" * 40,
        "entrypoint": "not an identifier",
        "content": {"encoding": "hex", "data": "00"},
        "adapter": {"kind": "scalar_to_arrow_batch", "version": 2},
    }
    for field, value in bad.items():
        with pytest.raises(ValidationError) as info:
            FunctionArtifactRequest.from_wire({**wire, field: value})
        assert info.value.errors()[0]["loc"][0] == field


def test_signature_rules():
    with pytest.raises(ValidationError, match="input 'x' appears more than once"):
        FunctionSignature(
            inputs=[{"name": "x", "arrow_type": "int64", "nullable": False}] * 2,
            output={"kind": "scalar", "arrow_type": "int64", "nullable": False},
        )
    with pytest.raises(ValidationError, match="a scalar output requires arrow_type and nullable"):
        FunctionOutput(kind="scalar")
    assert FunctionOutput.from_json('{"kind":"named_struct","fields":[]}').to_wire() == {"kind": "named_struct"}


@pytest.mark.parametrize("name", ["", "1abc", "has space", "semi;colon", "ünïcode"])
def test_registration_name_regex(name):
    with pytest.raises(ValidationError) as info:
        FunctionRegistrationRequest.from_wire({**request().to_wire(), "name": name})
    assert info.value.errors()[0]["loc"] == ("name",)


def test_decode_artifact_checks_digest_and_base64():
    assert decode_artifact(request().artifact) == SOURCE
    other = request(source=b"x = 1\n").artifact
    mismatched = other.model_copy(update={"content": request().artifact.content})
    with pytest.raises(ValueError, match=r"artifact\.digest sha256:[0-9a-f]{64} does not match the content"):
        decode_artifact(mismatched)
    garbled = other.model_copy(update={"content": other.content.model_copy(update={"data": "!!not base64!!"})})
    with pytest.raises(ValueError, match=r"artifact\.content\.data is not valid base64"):
        decode_artifact(garbled)


# ----------------------------------------------------------------------- derivation


def test_version_id_is_deterministic_and_sensitive_to_every_part():
    base = request()
    assert version_id(base) == version_id(request())
    assert re.fullmatch("[0-9a-f]{16}", version_id(base))
    assert version_id(base) == hashlib.sha256(base.to_canonical_json().encode()).hexdigest()[:16]
    variants = [
        request(source=SOURCE + b"# changed\n"),
        request(name="double2"),
        request(num_gpus=2),
        request(num_gpus=None),
        request(pip=("numpy", "scipy")),
    ]
    ids = {version_id(variant) for variant in variants}
    assert len(ids) == len(variants) and version_id(base) not in ids
    # Package order and repeats are not part of the identity.
    assert version_id(request(pip=("scipy", "numpy", "numpy"))) == version_id(request(pip=("numpy", "scipy")))


def test_env_values_are_keyed_in_version_ids_and_runtime_digests():
    plain = request()
    with_pin = plain.model_copy(update={"runtime": plain.runtime.model_copy(update={"env": {"PIN": "123456"}})})
    key, other_key = b"server-one-secret", b"server-two-secret"
    # No env: the key changes nothing (ids and digests as before).
    assert version_id(plain, key) == version_id(plain) and runtime_digest(plain.runtime, key) == runtime_digest(
        plain.runtime
    )
    # Same request, same key: same id; another server's key: another id.
    assert version_id(with_pin, key) == version_id(with_pin, key) != version_id(with_pin, other_key)
    keyed = derive_version(with_pin, rfc3339_now(), key)
    assert keyed.version == version_id(with_pin, key) and keyed.runtime_digest == runtime_digest(with_pin.runtime, key)
    # Hashing a guess of the value (what anyone reading the digest could do offline) finds nothing.
    guess = "sha256:" + hashlib.sha256(with_pin.runtime.to_canonical_json().encode()).hexdigest()
    assert keyed.runtime_digest != guess and keyed.version != version_id(with_pin)
    changed = with_pin.model_copy(update={"runtime": with_pin.runtime.model_copy(update={"env": {"PIN": "123457"}})})
    assert version_id(changed, key) != keyed.version  # a new value is still a new version


def test_derive_version():
    req = request()
    created = rfc3339_now()
    version = derive_version(req, created)
    assert version.version == version_id(req)
    assert version.artifact == FunctionArtifact(kind="python_callable", digest=req.artifact.digest, entrypoint="double")
    assert "content" not in version.to_canonical_json()
    assert version.runtime_digest == "sha256:" + hashlib.sha256(req.runtime.to_canonical_json().encode()).hexdigest()
    assert version.runtime_digest == runtime_digest(req.runtime)
    assert version.environment_digest == environment_digest(req.runtime.environment)
    assert version.environment_digest != version.runtime_digest
    assert FunctionVersion.from_json(version.to_canonical_json()) == version
    with pytest.raises(ValidationError, match="created_at"):
        derive_version(req, "yesterday")
    unknown = req.model_copy(update={"runtime": PythonRuntimeSpec(kind="wasm")})
    with pytest.raises(ValueError, match="runtime.kind 'wasm' is not supported here"):
        derive_version(unknown, created)


def test_rfc3339_now_format():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rfc3339_now())


# ----------------------------------------------------------------- jobs and classes


def test_job_round_trip():
    job = Job(
        job_id="job-1",
        job_type="run_function",
        job_state="FAILED",
        creation_ms=1_700_000_000_000,
        started_ms=1_700_000_000_010,
        finished_ms=1_700_000_000_020,
        spec={"name": "double", "version": "abc", "rows_total": 2, "timeout_s": 1.5},
        placement=JobPlacement(gpu_class="default", num_gpus=1, devices=("sim0",), queue_position=0),
        progress=JobProgress(rows_done=1, rows_total=2),
        result=[2, None, {"a": [1.5]}],
        failure=JobFailure(phase="run", message="ZeroDivisionError: division by zero", traceback="..."),
    )
    again = Job.from_json(job.to_canonical_json())
    assert again == job
    assert again.job_state is JobState.FAILED
    assert again.placement.to_wire() == {
        "gpu_class": "default",
        "num_gpus": 1,
        "devices": ["sim0"],
        "queue_position": 0,
    }
    assert again.result == [2, None, {"a": [1.5]}]
    with pytest.raises(TypeError):
        again.spec["name"] = "other"


def test_job_validation():
    base = Job(
        job_id="j", job_type="create_function", job_state="PENDING", creation_ms=0, placement={}, progress={}
    ).to_wire()
    for field, value in {
        "job_state": "RUNNING",
        "job_type": "train",
        "creation_ms": -1,
        "result": float("inf"),
        "spec": {"x": {1, 2}},
    }.items():
        with pytest.raises(ValidationError) as info:
            Job.from_wire({**base, field: value})
        assert info.value.errors()[0]["loc"][0] == field
    with pytest.raises(ValidationError, match=r"rows_done \(3\) exceeds rows_total \(2\)"):
        JobProgress(rows_done=3, rows_total=2)
    with pytest.raises(ValidationError, match="phase"):
        JobFailure(phase="mystery", message="?")


def test_job_states_and_display():
    assert [display_state(state) for state in JobState] == [
        "pending",
        "running",
        "finished",
        "failed",
        "cancelled",
        "timed out",
    ]
    assert display_state("IN_PROGRESS") == "running"
    assert {JobState.DONE, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT} == TERMINAL_STATES


def test_gpu_class_and_usage_round_trip():
    gpu = GpuClass(
        name="h100",
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_memory_bytes=85899345920,
        max_gpu_count_per_worker=8,
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    assert GpuClass.from_json(gpu.to_canonical_json()) == gpu
    assert "resource_name" not in gpu.to_wire() and "simulated" not in gpu.to_wire()
    simulated = GpuClass(
        name="default",
        gpu_model="Simulated GPU (numba CUDA simulator)",
        gpu_memory_bytes=0,
        max_gpu_count_per_worker=2,
        simulated=True,
    )
    assert simulated.to_wire()["simulated"] is True
    with pytest.raises(ValidationError, match="max_gpu_count_per_worker"):
        GpuClass.from_wire({**gpu.to_wire(), "max_gpu_count_per_worker": 0})
    usage = GpuUsage(name="h100", gpus_total=8, gpus_busy=0, jobs_running=0, jobs_pending=3)
    assert usage.to_wire() == {"name": "h100", "gpus_total": 8, "gpus_busy": 0, "jobs_running": 0, "jobs_pending": 3}
    assert GpuUsage.from_json(usage.to_canonical_json()) == usage
    assert usage.nodes_text() is None  # a class no autoscaler scales
    scaling = GpuUsage.from_wire({**usage.to_wire(), "nodes_up": 0, "nodes_starting": 2, "nodes_max": 4})
    assert scaling.nodes_text() == "0 of 4 nodes up · 2 starting"
    assert scaling.model_copy(update={"nodes_up": 3, "nodes_starting": 0}).nodes_text() == "3 of 4 nodes up"


def test_gpu_classes_table_and_usage_line_show_the_nodes_of_a_class_an_autoscaler_scales():
    from lancefn_jupyter.kernel.display.cards import gpu_classes_table, usage_line

    gpu = GpuClass(name="t4", gpu_model="NVIDIA T4", gpu_memory_bytes=0, max_gpu_count_per_worker=1)
    plain = GpuUsage(name="t4", gpus_total=1, gpus_busy=0, jobs_running=0, jobs_pending=0)
    scaled = plain.model_copy(update={"gpus_total": 0, "nodes_up": 0, "nodes_starting": 2, "nodes_max": 4})
    assert "nodes" not in gpu_classes_table([gpu], [plain])[0]
    text, markup = gpu_classes_table([gpu], [scaled])
    assert "nodes" in text and "0 of 4 nodes up · 2 starting" in text and "0 of 4 nodes up · 2 starting" in markup
    assert usage_line("t4", scaled).endswith("; 0 of 4 nodes up · 2 starting")
    assert "nodes" not in usage_line("t4", plain)


# ----------------------------------------------------------------------- properties

_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,12}", fullmatch=True)
_packages = st.lists(st.text(min_size=1, max_size=12).filter(str.strip), max_size=4)
_environments = st.one_of(
    st.builds(PythonEnvironmentSpec, kind=st.just("pip"), packages=_packages),
    st.builds(
        PythonEnvironmentSpec,
        kind=st.just("conda"),
        packages=_packages,
        channels=st.lists(st.sampled_from(["conda-forge", "nvidia", "defaults"]), max_size=3),
    ),
)
_resources = st.builds(FunctionResourceRequirements, num_gpus=st.integers(1, 2**32 - 1), gpu_class=st.none() | _names)
_runtimes = st.one_of(
    st.builds(
        PythonRuntimeSpec,
        kind=st.just("python"),
        python_version=st.just("3.11"),
        environment=_environments,
        env=st.none() | st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True), st.text(max_size=5)),
    ),
    st.builds(
        PythonRuntimeSpec,
        kind=st.just("python_v2"),
        python_version=st.just("3.12"),
        environment=_environments,
        resources=_resources,
    ),
    st.builds(PythonRuntimeSpec, kind=_names.filter(lambda kind: kind not in ("python", "python_v2"))),
)


@settings(max_examples=200)
@given(_runtimes)
def test_canonical_json_is_a_fixed_point_of_decode_encode(value):
    text = value.to_canonical_json()
    decoded = PythonRuntimeSpec.from_json(text)
    assert decoded == value
    assert decoded.to_canonical_json() == text
    assert json.loads(text) == value.to_wire()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
_runtime_like = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from(["python", "python_v2", "other"]) | _json,
        "python_version": st.sampled_from(["3.12"]) | _json,
        "environment": st.fixed_dictionaries(
            {"kind": st.sampled_from(["pip", "conda"])}, optional={"packages": _json, "channels": _json}
        )
        | _json,
        "env": _json,
        "resources": st.fixed_dictionaries({"num_gpus": _json}) | _json,
    },
)


@settings(max_examples=300)
@given(st.one_of(_json, _runtime_like))
def test_arbitrary_json_fails_only_with_validation_error(data):
    for model in (PythonRuntimeSpec, FunctionRegistrationRequest, Job, GpuClass):
        try:
            value = model.from_json(json.dumps(data))
        except ValidationError:
            continue
        # Whatever decodes re-encodes canonically and decodes to itself.
        assert model.from_json(value.to_canonical_json()) == value
