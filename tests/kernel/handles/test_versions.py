"""Version history, diffs, prefixes and `lookup` (issue 17 §1–2): pure rules, then a real control plane."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import httpx
import pytest
from IPython.core.error import UsageError

from lancefn_jupyter.kernel import api
from lancefn_jupyter.wire import versions
from lancefn_jupyter.wire.models import FunctionVersion

_DIGEST = "sha256:" + "0" * 64


def _fv(
    version: str, *, packages=(), num_gpus=1, gpu_class=None, env=None, digest=_DIGEST, rdigest=_DIGEST
) -> FunctionVersion:
    runtime = {"kind": "python_v2", "python_version": "3.12", "resources": {"num_gpus": num_gpus}}
    if gpu_class:
        runtime["resources"]["gpu_class"] = gpu_class
    runtime["environment"] = {"kind": "pip", "packages": list(packages)}
    if env:
        runtime["env"] = dict(env)
    return FunctionVersion.from_wire(
        {
            "name": "score",
            "version": version,
            "artifact": {"kind": "python_callable", "digest": digest, "entrypoint": "score"},
            "signature": {
                "inputs": [{"name": "x", "arrow_type": "float64", "nullable": True}],
                "output": {"kind": "scalar", "arrow_type": "float64", "nullable": True},
            },
            "runtime": runtime,
            "runtime_digest": rdigest,
            "environment_digest": _DIGEST,
            "created_at": "2026-01-01T00:00:00.000Z",
        }
    )


# ------------------------------------------------------------------------------------- pure rules


def test_prefix_resolution_unique_short_unknown_ambiguous():
    ids = ["abcdef0011112222", "abcdef0111112222", "99887766aaaabbbb"]
    assert versions.resolve_version("score", None, ids) == ids[-1]  # newest
    assert versions.resolve_version("score", "998877", ids) == ids[2]
    assert versions.resolve_version("score", ids[0], ids) == ids[0]
    with pytest.raises(versions.VersionLookupError, match="too short: use at least 6") as short:
        versions.resolve_version("score", "99887", ids)
    assert ids[2] in str(short.value)
    with pytest.raises(versions.VersionLookupError, match="ambiguous") as ambiguous:
        versions.resolve_version("score", "abcdef0", ids)
    assert ids[0] in str(ambiguous.value) and ids[1] in str(ambiguous.value) and ids[2] not in str(ambiguous.value)
    with pytest.raises(versions.VersionLookupError, match="no version starting with 'ffffff'") as unknown:
        versions.resolve_version("score", "ffffff", ids)
    assert all(i in str(unknown.value) for i in ids)
    with pytest.raises(versions.VersionLookupError, match="no function named 'nope'"):
        versions.resolve_version("nope", None, [])


def test_parse_ref():
    assert versions.parse_ref("score") == ("score", None)
    assert versions.parse_ref("score@abc123") == ("score", "abc123")
    with pytest.raises(versions.VersionLookupError, match="empty version"):
        versions.parse_ref("score@")


def test_change_summary_lines():
    old = _fv("a" * 16, packages=["numpy"], env={"HF_TOKEN": "<redacted>"})
    new = _fv(
        "b" * 16,
        packages=["numpy", "torch"],
        num_gpus=2,
        gpu_class="a100",
        env={"HF_TOKEN": "<redacted>", "KEY": "<redacted>"},
        digest="sha256:" + "1" * 64,
    )
    src_old = "def score(x):\n    return x\n"
    src_new = "def score(x):\n    y = x * 2\n    return y\n"
    summary = versions.change_summary(old, new, src_old, src_new)
    assert summary == "code: 2 lines; pip: +torch; num_gpus 1→2; gpu_class default→a100; env: +KEY"
    assert versions.change_summary(None, old, None, src_old) == "first version"
    # Only an env value changed: shown without the value.
    assert (
        versions.change_summary(
            old,
            _fv("c" * 16, packages=["numpy"], env={"HF_TOKEN": "<redacted>"}, rdigest="sha256:" + "2" * 64),
            src_old,
            src_old,
        )
        == "env: values changed"
    )


def test_diff_data_and_renderings():
    old, new = _fv("a" * 16), _fv("b" * 16, packages=["torch"], num_gpus=2)
    diff = versions.diff_versions(old, new, "def score(x):\n    return (4 * x) / 2\n", "def score(x):\n    return x\n")
    assert ("num_gpus", "1", "2") in diff.runtime and ("packages", "-", "torch") in diff.runtime
    assert "-    return (4 * x) / 2" in diff.source_diff and "+    return x" in diff.source_diff
    text, markup = diff.to_text(), diff._repr_html_()
    assert "num_gpus  1 → 2" in text and "+    return x" in text
    assert "<table>" in markup and "(4 * x) / 2" in markup and "background:#e6ffed" in markup
    same = versions.diff_versions(old, old, "x\n", "x\n")
    assert same.unchanged and "source: unchanged" in same.to_text()


def test_nonfinite_counts():
    nan, inf = float("nan"), float("inf")
    assert versions.nonfinite_counts([1.0, nan, [inf, -inf, nan], 2]) == {"nan": 2, "inf": 1, "-inf": 1, "floats": 5}
    assert versions.nonfinite_counts([1, 2, "x"]) is None
    assert versions.nonfinite_text([1.0, nan, inf]) == "1 NaN, 1 +Inf of 3 floats"
    assert versions.nonfinite_text([1.0, 2.0]) == ""
    np = pytest.importorskip("numpy")
    assert versions.nonfinite_counts(np.array([[np.nan, 1.0], [np.inf, 0.0]]))["nan"] == 1


# ------------------------------------------------------------------------- against a control plane

V1 = "def score(x: float) -> float:\n    return (4 * x) / 2\n"
V2 = "def score(x: float) -> float:\n    y = x + 1\n    return y\n"


def test_history_diff_and_prefixes_through_magics(ip, control_plane):
    ip.run_cell_magic("gpu_function", "", V1)
    v1 = ip.user_ns["score"].version.version
    ip.run_cell_magic("gpu_function", "num_gpus=2 pip=numpy env=HF_TOKEN=secret-value", V2)
    v2 = ip.user_ns["score"].version.version
    listed = ip.run_line_magic("gpu_versions", "score")
    assert [r.version for r in listed] == [v2, v1]  # newest first
    assert listed[0].change == "code: 2 lines; pip: +numpy; num_gpus 1→2; env: +HF_TOKEN"
    assert listed[1].change == "first version"
    text = repr(listed)
    assert f"lancefn_jupyter.lookup('score@{v2[:8]}')" in text and "secret-value" not in text + listed._repr_html_()

    diff = ip.run_line_magic("gpu_versions", "diff score")  # default: the last two
    assert (diff.old, diff.new) == (v1, v2)
    assert "+    y = x + 1" in diff.source_diff and ("env names", "-", "HF_TOKEN") in diff.runtime
    assert "secret-value" not in diff.to_text() + diff.to_html()
    assert ip.run_line_magic("gpu_versions", f"diff score {v2[:6]} {v1[:7]}").source_diff[0].endswith(v2)
    assert ip.user_ns["score"].diff(v1[:6]).new == v2  # Python API, old against newest
    with pytest.raises(UsageError, match="too short"):
        ip.run_line_magic("gpu_versions", f"diff score {v1[:3]}")
    with pytest.raises(UsageError, match="no function named 'nope'"):
        ip.run_line_magic("gpu_versions", "nope")
    with pytest.raises(versions.VersionLookupError, match="first version"):
        api.diff_versions("score", new=v1)
    with pytest.raises(UsageError):
        ip.run_line_magic("gpu_versions", "diff a b c d e")


def test_artifact_route_is_authenticated_and_404s(control_plane, ip):
    ip.run_cell_magic("gpu_function", "", V1)
    version = ip.user_ns["score"].version.version
    with httpx.Client(base_url=control_plane.url) as http:
        body = {"name": "score", "version": version}
        assert http.post("/v1/functions/artifact", json=body).status_code == 401
        ok = http.post("/v1/functions/artifact", json=body, headers={"x-api-key": control_plane.api_key})
        assert ok.status_code == 200 and ok.json()["entrypoint"] == "score"
        missing = http.post(
            "/v1/functions/artifact",
            json={"name": "score", "version": "0" * 16},
            headers={"x-api-key": control_plane.api_key},
        )
        assert missing.status_code == 404


def test_lookup_from_a_plain_python_process(ip, control_plane):
    ip.run_cell_magic("gpu_function", "", V1)
    v1 = ip.user_ns["score"].version.version
    ip.run_cell_magic("gpu_function", "", V2)
    script = textwrap.dedent(
        f"""
        import lancefn_jupyter as lf
        from lancefn_jupyter.client import LancefnError
        lf.connect({control_plane.url!r}, {control_plane.api_key!r})
        newest = lf.lookup("score")
        old = lf.lookup("score@{v1[:6]}")
        assert isinstance(old, lf.GpuFunction)
        print("versions", newest.version.version != old.version.version, old.version.version == {v1!r})
        print("remote", old.remote(3.0), newest.submit(x=3.0).result(), newest.map([1.0, 2.0]).result())
        print("local", old.local(5.0))
        try:
            old(1.0)
        except LancefnError as error:
            print("call", "looked up" in str(error))
        try:
            lf.lookup("score@ffffff")
        except LookupError as error:
            print("unknown", {v1!r} in str(error))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "versions True True" in lines
    assert "remote 6.0 4.0 [2.0, 3.0]" in lines
    assert "local 10.0" in lines
    assert "call True" in lines and "unknown True" in lines


def test_history_and_diff_routes_for_the_panel(ip, control_plane):
    ip.run_cell_magic("gpu_function", "", V1)
    v1 = ip.user_ns["score"].version.version
    ip.run_cell_magic("gpu_function", "pip=numpy", V2)
    v2 = ip.user_ns["score"].version.version
    with httpx.Client(base_url=control_plane.url, headers={"x-api-key": control_plane.api_key}) as http:
        history = http.post("/v1/functions/history", json={}).json()["functions"]
        assert [(f["name"], [v["version"] for v in f["versions"]]) for f in history] == [("score", [v2, v1])]
        assert [v["change"] for v in history[0]["versions"]] == ["code: 2 lines; pip: +numpy", "first version"]
        # With a limit, the oldest row shown still says what changed (not "first version").
        limited = http.post("/v1/functions/history", json={"name": "score", "limit": 1}).json()["functions"][0][
            "versions"
        ]
        assert [(v["version"], v["change"]) for v in limited] == [(v2, "code: 2 lines; pip: +numpy")]
        assert http.post("/v1/functions/history", json={"name": "nope"}).status_code == 404
        diff = http.post("/v1/functions/diff", json={"name": "score"}).json()
        assert (diff["old"], diff["new"]) == (v1, v2) and ["packages", "-", "numpy"] in diff["runtime"]
        assert "+    y = x + 1" in diff["source_diff"]
        assert http.post("/v1/functions/diff", json={"name": "score", "old": v1[:3]}).status_code == 400
        assert http.post("/v1/functions/diff", json={"name": "score", "old": "ffffff"}).status_code == 404
        assert httpx.post(control_plane.url + "/v1/functions/history", json={}).status_code == 401


def test_job_summary_shows_nonfinite_results():
    from lancefn_jupyter.kernel.display import cards as display
    from lancefn_jupyter.wire.models import Job

    base = {
        "job_id": "j",
        "job_type": "run_function",
        "job_state": "DONE",
        "creation_ms": 0,
        "started_ms": 0,
        "finished_ms": 1500,
        "placement": {},
        "progress": {},
    }
    # JSON results cannot carry NaN (the worker refuses them today); Arrow results (issue 12) can.
    job = Job.from_wire(base).model_copy(update={"result": [[1.0, float("nan")], [float("-inf"), 2.0]]})
    assert display.job_summary(job) == "finished in 1.5s; results hold 1 NaN, 1 -Inf of 4 floats"
    assert display.job_summary(Job.from_wire({**base, "result": [1.0, 2.0]})) == "finished in 1.5s"


def test_looked_up_local_errors_name_the_artifact_lines(ip):
    ip.run_cell_magic(
        "gpu_function", "", "def boom(x: float) -> float:\n    y = x + 1\n    raise ValueError(f'bad {y}')\n"
    )
    version = ip.user_ns["boom"].version.version
    handle = api.lookup(f"boom@{version[:6]}")
    assert handle.version == ip.user_ns["boom"].version and "boom" in repr(handle)
    with pytest.raises(api.LancefnError) as raised:
        handle.local(1.0)
    text = str(raised.value)
    # The artifact is the only source this process has: its lines are named, with their text.
    assert f"line 5 of boom@{version[:8]}'s source, in boom\n    raise ValueError(f'bad {{y}}')" in text, text
    assert "ValueError: bad 2.0" in text and "<gpu_function" not in text
