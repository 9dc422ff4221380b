"""Magic-line and kwargs options: every option, every error, profiles, properties."""

import dataclasses
import shlex

import pytest
from helpers import OPTION_LINE_TOKENS
from hypothesis import given, settings
from hypothesis import strategies as st

from lancefn_jupyter.kernel.options import (
    ComputeProfile,
    FunctionOptions,
    OptionsError,
    build_options,
    build_profile,
    parse_function_line,
    parse_profile_line,
)
from lancefn_jupyter.wire.models import PythonRuntimeSpec

pytestmark = pytest.mark.unit

SEED_CANONICAL = '{"environment":{"kind":"pip"},"kind":"python_v2","python_version":"3.12","resources":{"num_gpus":1}}'


def parse(line, **profiles):
    return parse_function_line(line, profiles)


# ------------------------------------------------------------------------ every option


def test_empty_line_gives_the_defaults():
    options = parse("")
    assert options == FunctionOptions()
    assert options.num_gpus == 1 and options.register is True
    assert options.runtime("3.12").to_canonical_json() == SEED_CANONICAL


def test_every_option_on_one_line():
    options = parse(
        "num_gpus=2 gpu_class=h100 name=my.fn-2 pip=numpy,scipy pip=pandas env=B=2 env='MSG=hello world' "
        "python_version=3.11 image=nvcr.io/nvidia/pytorch:24.05-py3 register=no timeout_s=90.5"
    )
    assert options == FunctionOptions(
        num_gpus=2,
        gpu_class="h100",
        name="my.fn-2",
        pip=("numpy", "scipy", "pandas"),
        env=(("B", "2"), ("MSG", "hello world")),
        python_version="3.11",
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        register=False,
        timeout_s=90.5,
    )
    assert options.env_dict == {"B": "2", "MSG": "hello world"}
    runtime = options.runtime("3.12")
    assert runtime.kind == "python_v2"
    assert runtime.python_version == "3.11"
    assert runtime.resources.to_wire() == {"num_gpus": 2, "gpu_class": "h100"}
    assert runtime.environment.to_wire() == {
        "kind": "pip",
        "packages": ["numpy", "pandas", "scipy"],
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
    }
    assert dict(runtime.env) == {"B": "2", "MSG": "hello world"}


def test_conda_environment_keeps_channel_order():
    options = parse("conda=numba,cudatoolkit conda_channels=nvidia,conda-forge conda_channels=defaults")
    environment = options.environment()
    assert environment.kind == "conda"
    assert environment.packages == ("cudatoolkit", "numba")
    assert environment.channels == ("nvidia", "conda-forge", "defaults")


def test_package_lists_split_on_commas_but_not_inside_requirements():
    options = parse('pip="numpy>=1.24, <2" pip=pkg[a,b]==1.0,scipy pip=numpy>=1.24,<2')
    assert options.pip == ("numpy>=1.24,<2", "pkg[a,b]==1.0", "scipy")


@pytest.mark.parametrize(
    "text, value",
    [
        ("yes", False),
        ("no", True),
        ("true", False),
        ("false", True),
        ("1", False),
        ("0", True),
        ("YES", False),
        ("No", True),
    ],
)
def test_register_spellings(text, value):
    assert parse(f"register={text}").register is (not value)


def test_env_values_may_contain_equals_and_be_empty():
    assert parse("env=URL=http://x/?a=b env=EMPTY=").env == (("EMPTY", ""), ("URL", "http://x/?a=b"))


def test_resources_without_gpu_class_keep_seed_bytes():
    assert parse("num_gpus=1").resources().to_canonical_json() == '{"num_gpus":1}'


# -------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "line, option, fix",
    [
        ("num_gpus=0", "num_gpus", "write num_gpus=1"),
        ("num_gpus=-1", "num_gpus", "write num_gpus=1"),
        ("num_gpus=1.5", "num_gpus", "write num_gpus=1"),
        ("num_gpus=True", "num_gpus", "write num_gpus=1"),
        ("num_gpus=x", "num_gpus", "write num_gpus=1"),
        ("num_gpus=", "num_gpus", "write num_gpus=1"),
        ("num_gpus=99999999999", "num_gpus", "write num_gpus=1"),
        ("num_gpus", "num_gpus", "write num_gpus=1"),
        ("num_gpus=1 num_gpus=2", "num_gpus", "keep one of them"),
        ("num_gpu=2", "num_gpu", "did you mean num_gpus?"),
        ("gpuclass=a", "gpuclass", "did you mean gpu_class?"),
        ("cpu=2x", "cpu='2x'", "write cpu=4, cpu=0.5 or cpu=500m"),
        ("memory=16GB", "memory='16GB'", "write memory=16Gi"),
        ("zzz=1", "zzz", "valid options: batched, conda, conda_channels, cpu, env, gpu_class"),
        ("gpu", "gpu", "write options like num_gpus=1"),
        ("gpu_class='a b'", "gpu_class", "write gpu_class=default"),
        ("gpu_class=", "gpu_class", "write gpu_class=default"),
        ("name=1fn", "name", "write name=my_function"),
        ("name=a name=b", "name", "keep one of them"),
        ("pip=", "pip", "write pip=numpy,scipy"),
        ("pip=numpy,,scipy", "pip", "write pip=numpy,scipy"),
        ("pip=-r", "pip", "write pip=numpy,scipy"),
        ("conda=,", "conda", "write conda=numba"),
        ("pip=numpy conda=numba", "pip and conda", "keep one of them"),
        ("conda_channels=conda-forge", "conda_channels", "add conda=PACKAGES or remove conda_channels"),
        ("conda=numba conda_channels=a,", "conda_channels", "write conda_channels=conda-forge"),
        ("env=NOVALUE", "env", "write env=MY_VAR=value"),
        ("env=1X=a", "env", "write env=MY_VAR=value"),
        ("env==a", "env", "write env=MY_VAR=value"),
        ("env=A=1 env=A=2", "env", "keep one of them"),
        ("env=CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES", "choose them with num_gpus and gpu_class"),
        ("env=NUMBA_ENABLE_CUDASIM=1", "NUMBA_ENABLE_CUDASIM", "use a simulated class"),
        ("python_version=3", "python_version", "write python_version=3.12"),
        ("python_version=latest", "python_version", "write python_version=3.12"),
        ("image='a b'", "image", "write image="),
        ("register=maybe", "register", "write register=no"),
        ("register=yes register=no", "register", "keep one of them"),
        ("timeout_s=0", "timeout_s", "write timeout_s=600"),
        ("timeout_s=-5", "timeout_s", "write timeout_s=600"),
        ("timeout_s=nan", "timeout_s", "write timeout_s=600"),
        ("timeout_s=inf", "timeout_s", "write timeout_s=600"),
        ("timeout_s=soon", "timeout_s", "write timeout_s=600"),
        ("state=per_call", "state must be per_worker (the default) or per_job (got 'per_call')", "write state=per_job"),
        ("state=", "state", "write state=per_job"),
        ("state=per_job state=per_worker", "state", "keep one of them"),
        ("stat=per_job", "stat", "did you mean state?"),
        ("profile=nope", "profile 'nope'", "define it with %gpu_profile nope"),
        ("profile=a profile=b", "profile", "keep one of them"),
        ("'unclosed", "cannot split", "close the quote"),
    ],
)
def test_errors_name_the_option_and_the_fix(line, option, fix):
    with pytest.raises(OptionsError) as info:
        parse(line)
    message = str(info.value)
    assert option in message
    assert fix in message
    assert isinstance(info.value, ValueError)


def test_state_is_encoded_only_when_per_job():
    # per_worker is the default: never encoded, so a cell's runtime (and version id) is the same with or without it.
    assert parse("state=per_worker") == parse("") and parse("").state == "per_worker"
    assert parse("state=per_worker").runtime("3.12").to_canonical_json() == SEED_CANONICAL
    per_job = parse("state=per_job")
    assert per_job.state == "per_job" and per_job.runtime("3.12").state == "per_job"
    assert per_job.runtime("3.12").to_canonical_json() == SEED_CANONICAL[:-1] + ',"state":"per_job"}'
    assert build_options(state="per_job") == per_job and build_options(state=None) == parse("")


def test_state_in_a_profile_and_explicit_over_it():
    profile = parse_profile_line("warm state=per_job num_gpus=2")
    assert profile.state == "per_job"
    assert parse("profile=warm", warm=profile).state == "per_job"
    assert parse("profile=warm state=per_worker", warm=profile).state == "per_worker"
    assert build_profile("w", state="per_job").options() == {"state": "per_job"}
    with pytest.raises(
        OptionsError, match=r"^state must be per_worker \(the default\) or per_job \(got 'job'\); write state=per_job$"
    ):
        build_options(state="job")
    with pytest.raises(OptionsError, match="state must be per_worker"):
        build_profile("w", state=1)


def test_num_gpus_message_shows_what_was_written():
    with pytest.raises(OptionsError, match=r"^num_gpus must be a whole number ≥ 1 \(got '1\.5'\); write num_gpus=1$"):
        parse("num_gpus=1.5")


def test_unknown_profile_lists_the_defined_ones():
    big = build_profile("big", num_gpus=4)
    small = build_profile("small", num_gpus=1)
    with pytest.raises(OptionsError, match="defined profiles: big, small"):
        parse("profile=huge", big=big, small=small)


# ------------------------------------------------------------------------ profiles


def test_profile_line():
    profile = parse_profile_line(
        "big_gpu num_gpus=4 gpu_class=h100 conda=cupy conda_channels=conda-forge "
        "env=A=1 python_version=3.11 image=img:1 timeout_s=60"
    )
    assert profile == ComputeProfile(
        name="big_gpu",
        num_gpus=4,
        gpu_class="h100",
        conda=("cupy",),
        conda_channels=("conda-forge",),
        env=(("A", "1"),),
        python_version="3.11",
        image="img:1",
        timeout_s=60.0,
    )
    assert parse_profile_line("empty") == ComputeProfile(name="empty")


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("", "a profile needs a NAME first; write %gpu_profile"),
        ("num_gpus=2", "a profile needs a NAME first"),
        ("b@d num_gpus=1", "profile name 'b@d' is invalid"),
        ("big name=x", "name is a per-function option, not allowed in a profile; put it on the %%gpu_function line"),
        ("big register=no", "register is a per-function option"),
        ("big profile=other", "profile is a per-function option"),
        ("big num_gpus=0", "num_gpus must be a whole number ≥ 1"),
        ("big num_gpu=1", "did you mean num_gpus?"),
        ("big pip=a conda=b", "pip and conda are exclusive"),
    ],
)
def test_profile_line_errors(line, fragment):
    with pytest.raises(OptionsError, match=None) as info:
        parse_profile_line(line)
    assert fragment in str(info.value)


def test_precedence_defaults_then_profile_then_explicit():
    profile = parse_profile_line("big num_gpus=4 gpu_class=h100 pip=cupy env=A=1 env=B=1 timeout_s=60")
    from_profile = parse("profile=big", big=profile)
    assert (from_profile.num_gpus, from_profile.gpu_class, from_profile.pip) == (4, "h100", ("cupy",))
    assert from_profile.profile == "big" and from_profile.timeout_s == 60.0
    assert from_profile.register is True  # a default the profile cannot set

    overridden = parse("profile=big num_gpus=2 env=B=2 env=C=3 pip=numpy register=no", big=profile)
    assert overridden.num_gpus == 2
    assert overridden.gpu_class == "h100"
    assert overridden.pip == ("numpy",)
    assert overridden.env == (("A", "1"), ("B", "2"), ("C", "3"))  # merged per variable
    assert overridden.register is False


def test_explicit_packages_replace_the_profiles_package_set():
    conda = parse_profile_line("rapids conda=cudf conda_channels=rapidsai,conda-forge")
    pip = parse("profile=rapids pip=numpy", rapids=conda)
    assert (pip.pip, pip.conda, pip.conda_channels) == (("numpy",), (), ())
    channels = parse("profile=rapids conda_channels=nvidia", rapids=conda)
    assert (channels.conda, channels.conda_channels) == (("cudf",), ("nvidia",))


def test_explicit_option_errors_name_what_was_written_not_the_merge():
    profile = parse_profile_line("p env=A=1")
    with pytest.raises(OptionsError, match="env sets A twice"):
        parse("profile=p env=A=2 env=A=3", p=profile)


# --------------------------------------------------------------------- Python kwargs


@pytest.mark.parametrize("bad", [0, -1, 1.5, 1.0, True, False, "1", 2**32])
def test_build_options_num_gpus_must_be_a_real_int(bad):
    with pytest.raises(OptionsError, match=r"num_gpus must be a whole number ≥ 1 .*; write num_gpus=1"):
        build_options(num_gpus=bad)


def test_build_options_accepts_python_values():
    options = build_options(num_gpus=2, pip="numpy,scipy", env={"B": "2", "A": "1"}, register=False, timeout_s=30)
    assert options.pip == ("numpy", "scipy")
    assert options.env == (("A", "1"), ("B", "2"))
    assert options.timeout_s == 30.0 and isinstance(options.timeout_s, float)
    assert (
        build_options(pip=["numpy", "scipy"])
        == build_options(pip=("numpy", "scipy"))
        == build_options(pip="numpy,scipy")
    )
    # None means "not given", so a decorator can forward its defaults.
    assert build_options(num_gpus=None, pip=None, register=None, profile=None) == FunctionOptions()
    assert build_options(num_gpus=2) == parse("num_gpus=2")


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"pip": 3}, "pip must be a string or a list of strings (got 3)"),
        ({"pip": ["numpy", 1]}, "pip must be a string or a list of strings"),
        ({"env": "A=1"}, "env must be a mapping of names to strings"),
        ({"env": {"A": 1}}, "env must map names to strings"),
        ({"env": {"bad name": "x"}}, "env variable name 'bad name' is invalid"),
        ({"register": "yes"}, "register must be True or False (got 'yes'); write register=False"),
        ({"timeout_s": True}, "timeout_s must be a positive number of seconds"),
        ({"timeout_s": "60"}, "timeout_s must be a positive number of seconds"),
        ({"timeout_s": float("nan")}, "timeout_s must be a positive number of seconds"),
        ({"timeout_s": 10**400}, "timeout_s must be a positive number of seconds"),
        ({"gpu_class": 3}, "gpu_class must be a string (got 3); write gpu_class=default"),
        ({"name": " padded"}, "name must be non-empty without surrounding spaces"),
        ({"python_version": 3.12}, "python_version must be a string"),
        ({"bogus": 1}, "unknown option 'bogus' for gpu_function; valid options:"),
        ({"num_gpu": 1}, "did you mean num_gpus?"),
        ({"profile": "missing"}, "profile 'missing' is not defined (no profiles are defined yet)"),
        ({"pip": "numpy", "conda": "numba"}, "pip and conda are exclusive"),
        ({"pip": ["numpy\n-r /etc/shadow"]}, "pip entry 'numpy\\n-r /etc/shadow' holds a line break"),
        ({"pip": ["numpy --index-url https://x"]}, "is not a PEP 508 requirement"),
        ({"pip": "./mypkg"}, "write a direct reference as 'NAME @ URL'"),
    ],
)
def test_build_options_errors(kwargs, fragment):
    with pytest.raises(OptionsError) as info:
        build_options(**kwargs)
    assert fragment in str(info.value)


def test_a_direct_reference_passes_the_kernels_check():
    # A server of one namespace (and .local()) builds it; a shared one says so at registration.
    assert build_options(pip=["mypkg @ file:///srv/mypkg", "numpy"]).pip == ("mypkg @ file:///srv/mypkg", "numpy")


def test_build_options_profiles_by_object_or_name():
    profile = build_profile("big", num_gpus=4, pip=["cupy"], env={"A": "1"})
    assert profile == parse_profile_line("big num_gpus=4 pip=cupy env=A=1")
    by_object = build_options(profile=profile, gpu_class="h100")
    by_name = build_options(profile="big", profiles={"big": profile}, gpu_class="h100")
    assert by_object == by_name == parse("profile=big gpu_class=h100", big=profile)
    assert by_object.num_gpus == 4


def test_decorator_defaults_do_not_override_a_profile():
    # gpu_function forwards its keyword defaults; empty package lists are "not given".
    profile = build_profile("rapids", conda=["cudf"], conda_channels="rapidsai", env={"A": "1"})
    options = build_options(pip=(), conda=(), conda_channels=(), env=None, register=True, profile=profile)
    assert (options.conda, options.conda_channels, options.env) == (("cudf",), ("rapidsai",), (("A", "1"),))
    assert build_profile("p", pip=(), env={}) == ComputeProfile(name="p")


def test_build_profile_errors():
    with pytest.raises(OptionsError, match="register is a per-function option"):
        build_profile("p", register=False)
    with pytest.raises(OptionsError, match="num_gpus must be a whole number"):
        build_profile("p", num_gpus=True)
    with pytest.raises(OptionsError, match="profile name '' is invalid"):
        build_profile("")


def test_dataclasses_validate_on_construction_and_are_frozen():
    with pytest.raises(OptionsError, match="num_gpus"):
        FunctionOptions(num_gpus=0)
    with pytest.raises(OptionsError, match="conda_channels needs conda packages"):
        FunctionOptions(conda_channels=("conda-forge",))
    options = FunctionOptions(pip="numpy")
    assert options.pip == ("numpy",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.num_gpus = 2


def test_every_field_is_an_option():
    # The line accepts each field of FunctionOptions; a profile each field but name/profile/register.
    values = {
        "num_gpus": "2",
        "gpu_class": "c",
        "cpu": "500m",
        "memory": "16Gi",
        "name": "n",
        "pip": "p",
        "conda": "",
        "conda_channels": "",
        "env": "A=1",
        "python_version": "3.12",
        "image": "i",
        "profile": "p",
        "register": "no",
        "timeout_s": "1",
        "state": "per_job",
        "include": "mylib.py",
        "batched": "yes",
        "reuse_setup": "no",
        "secrets": "S",
    }
    assert {field.name for field in dataclasses.fields(FunctionOptions)} == set(values)
    profile_fields = {field.name for field in dataclasses.fields(ComputeProfile)} - {"name"}
    assert profile_fields == set(values) - {"name", "profile", "register", "include", "secrets"}
    line = " ".join(f"{key}={value}" for key, value in values.items() if value)
    options = parse(line, p=ComputeProfile(name="p"))
    assert options.num_gpus == 2 and options.image == "i" and options.timeout_s == 1.0
    assert options.reuse_setup is False and options.runtime("3.12").reuse_setup == "no"
    assert options.include == ("mylib.py",) and options.batched is True
    assert (options.cpu, options.memory) == ("500m", "16Gi")
    assert options.resources().to_wire() == {"num_gpus": 2, "gpu_class": "c", "cpu": "500m", "memory": "16Gi"}
    assert parse("include=a.py include=pkg").include == ("a.py", "pkg")  # repeatable
    assert build_options(include=["a.py"]).include == ("a.py",)


# ----------------------------------------------------------------------- properties

_tokens = st.sampled_from(
    [
        *OPTION_LINE_TOKENS,
        "yes",
        "A=1",
        "numpy",
        "[",
        "]",
        ">=",
        "nan",
        "default",
        "p",
    ]
)


@settings(max_examples=500)
@given(st.one_of(st.text(max_size=40), st.lists(_tokens, max_size=12).map("".join)))
def test_random_lines_fail_only_with_options_error(line):
    profiles = {"p": ComputeProfile(name="p", num_gpus=2, conda=("numba",))}
    for call in (lambda: parse_function_line(line, profiles), lambda: parse_profile_line(line)):
        try:
            result = call()
        except OptionsError:
            continue
        assert isinstance(result, (FunctionOptions, ComputeProfile))


_words = st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,8}", fullmatch=True)
_names = st.from_regex(r"[A-Za-z]([A-Za-z0-9_.-]{0,7}[A-Za-z0-9])?", fullmatch=True)  # PEP 508 project names
_env_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=8)
_options = st.fixed_dictionaries(
    {},
    optional={
        "num_gpus": st.integers(1, 2**32 - 1),
        "gpu_class": _words,
        "name": _words,
        "pip": st.lists(_names, min_size=1, max_size=3, unique=True),
        "env": st.dictionaries(
            st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True).filter(
                lambda name: name not in ("CUDA_VISIBLE_DEVICES", "NUMBA_ENABLE_CUDASIM")
            ),
            _env_values,
            min_size=1,
            max_size=3,
        ),
        "python_version": st.sampled_from(["3.10", "3.11", "3.12", "3.13"]),
        "image": _words,
        "register": st.booleans(),
        "timeout_s": st.floats(min_value=0.001, max_value=1e6),
        "state": st.sampled_from(["per_worker", "per_job"]),
    },
)


def _to_line(options):
    tokens = []
    for key, value in options.items():
        if key == "env":
            tokens += [f"env={name}={text}" for name, text in value.items()]
        elif key == "pip":
            tokens.append("pip=" + ",".join(value))
        elif key == "register":
            tokens.append("register=" + ("yes" if value else "no"))
        else:
            tokens.append(f"{key}={value!r}" if key == "timeout_s" else f"{key}={value}")
    return " ".join(shlex.quote(token) for token in tokens)


@settings(max_examples=300)
@given(_options)
def test_valid_lines_round_trip(options):
    parsed = parse_function_line(_to_line(options), {})
    assert parsed == build_options(**options)
    for key, value in options.items():
        if key == "pip":
            value = tuple(value)
        elif key == "env":
            value = tuple(sorted(value.items()))
        assert getattr(parsed, key) == value
    # Every valid option set makes a valid wire runtime.
    runtime = parsed.runtime("3.12")
    assert PythonRuntimeSpec.from_json(runtime.to_canonical_json()) == runtime


# ------------------------------------------------------------- options ↔ runtime (one function each way)

_conda_or_pip = st.one_of(
    st.fixed_dictionaries({"pip": st.lists(_names, min_size=1, max_size=3, unique=True)}),
    st.fixed_dictionaries(
        {"conda": st.lists(_names, min_size=1, max_size=3, unique=True)},
        optional={"conda_channels": st.lists(_words, min_size=1, max_size=2, unique=True)},
    ),
    st.just({}),
)
# What a runtime does not carry: passed back in beside it (a looked-up version: its name and signature's batched).
_NOT_IN_RUNTIME = ("name", "register", "timeout_s", "batched", "include")
_beside = st.fixed_dictionaries(
    {},
    optional={
        "batched": st.booleans(),
        "include": st.lists(st.from_regex(r"[a-z]{1,6}\.py", fullmatch=True), min_size=1, max_size=2, unique=True),
    },
)


@settings(max_examples=300)
@given(_options, _conda_or_pip, _beside)
def test_options_to_runtime_and_back_keep_every_option(given_options, packages, beside):
    options = build_options(**{**given_options, "pip": None, **packages, **beside})  # pip or conda, not both
    runtime = options.runtime("3.12")
    back = FunctionOptions.from_runtime(runtime, **{key: getattr(options, key) for key in _NOT_IN_RUNTIME})
    # A runtime's packages are a set (sorted: their order never changes a version id); the default Python is written.
    expected = dataclasses.replace(
        options,
        pip=tuple(sorted(options.pip)),
        conda=tuple(sorted(options.conda)),
        python_version=options.python_version or "3.12",
    )
    assert back == expected
    assert back.runtime("3.11") == runtime  # and the same runtime again: the same version id and digests


def test_a_runtime_from_the_wire_comes_back_as_the_options_that_make_it():
    stored = PythonRuntimeSpec.from_wire(
        {
            "kind": "python_v2",
            "python_version": "3.11",
            "environment": {
                "kind": "conda",
                "packages": ["numba", "cupy"],
                "channels": ["conda-forge"],
                "image": "img",
            },
            "env": {"A": "1", "TOKEN": "<redacted>"},
            "resources": {"num_gpus": 2, "gpu_class": "a100"},
            "state": "per_job",
        }
    )
    options = FunctionOptions.from_runtime(stored, env={"A": "1"}, name="embed", timeout_s=30.0)
    assert options == FunctionOptions(
        num_gpus=2,
        gpu_class="a100",
        name="embed",
        conda=("cupy", "numba"),
        conda_channels=("conda-forge",),
        env=(("A", "1"),),  # the values given (a looked-up version's are redacted), not the runtime's
        python_version="3.11",
        image="img",
        timeout_s=30.0,
        state="per_job",
    )
    assert FunctionOptions.from_runtime(stored).env_dict == {"A": "1", "TOKEN": "<redacted>"}
