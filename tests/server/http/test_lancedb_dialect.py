"""LanceDB 0.40's released client against a real server (docs/ARCHITECTURE.md, "LanceDB 0.40 dialect"): it creates,
gets, lists and drops functions and follows their jobs; what the server cannot honour is refused, never dropped."""

from __future__ import annotations

import base64
import datetime
import importlib
import json
import sys

import httpx
import lancedb
import pyarrow as pa
import pytest
from conftest import register, registration_body
from helpers import two_teams
from lancedb.functions import FunctionVersion, udf
from lancedb.secrets import EnvVarSecret

from lancefn_jupyter.server.control.artifact_check import IN_PROCESS_MAX_BYTES

A_KEY, B_KEY = "dialect-team-a-key-0001", "dialect-team-b-key-0002"
WAIT = datetime.timedelta(seconds=60)


def triple(x: int) -> int:
    return 3 * x


class Scale:
    def __init__(self, factor: float, offset: float = 0.0):
        self.factor, self.offset = factor, offset

    def __call__(self, x: float) -> float:
        return x * self.factor + self.offset


def connect(url: str, key: str):
    return lancedb.connect("db://lancefn", api_key=key, host_override=url)


@pytest.fixture(scope="module")
def teams(module_control_plane_factory):
    """One server of two teams (ann in ``a``, ben in ``b``) for the whole module."""
    return module_control_plane_factory(api_keys=two_teams(A_KEY, B_KEY))


def run_rows(cp, key: str, fv: FunctionVersion, rows: list[dict]) -> str:
    """Start a run of ``fv`` by its content id (in ``metadata``) over our REST; the job's id."""
    with cp.http(key) as http:
        reply = http.post(
            "/v1/functions/run", json={"name": fv.name, "version": fv.metadata["lancefn.version"], "rows": rows}
        )
    assert reply.status_code == 202, reply.text
    return reply.json()["job_id"]


def test_create_get_list_run_drop_plain_and_gpu(teams):
    db = connect(teams.url, A_KEY)
    cpu = db.create_function(udf(triple))
    gpu = db.create_function(udf(triple, gpu=True))
    # Decimal versions per name in registration order; our content ids in metadata, different: gpu counts.
    assert (cpu.version, gpu.version) == ("1", "2")
    assert cpu.metadata["lancefn.version"] != gpu.metadata["lancefn.version"]
    assert cpu.namespace_path == gpu.namespace_path == ("a",)
    assert cpu.object_id == gpu.object_id
    assert json.loads(gpu.metadata["lancefn.runtime"])["resources"] == {"num_gpus": 1}
    assert db.get_function("triple", version="2") == gpu
    assert db.get_function("triple", version=gpu.metadata["lancefn.version"]) == gpu  # our ids work too
    assert db.get_function("triple", version="1", namespace_path=["a"]) == cpu
    assert [fv.version for fv in db.list_functions() if fv.name == "triple"] == ["1", "2"]

    for fv, num_gpus in ((cpu, 0), (gpu, 1)):
        job = db.open_job(run_rows(teams, A_KEY, fv, [{"x": 2}, {"x": 5}]))
        job.wait(WAIT)
        job.refresh()  # wait records only the state; the record comes with refresh
        assert (job.state, job.result) == ("finished", [6, 15])
        with teams.http(A_KEY) as http:
            assert http.post("/v1/jobs/describe", json={"job_id": job.id}).json()["placement"]["num_gpus"] == num_gpus

    assert db.drop_function("triple", version="1") is True
    assert db.drop_function("triple", version="1") is False
    with pytest.raises(Exception, match="has no version '1'"):
        db.get_function("triple", version="1")
    # Versions never move: the next registration is 3, and 2 is still 2.
    assert db.create_function(udf(triple, name="triple", env={"K": "v"})).version == "3"
    assert db.get_function("triple", version="2") == gpu


def test_a_version_registered_our_way_parses_with_040_models(teams):
    with teams.http(A_KEY) as http:
        ours = register(http, registration_body("ours", num_gpus=1))
        reply = http.post("/v1/function/ours/describe", json={"version": "1"})
    assert reply.status_code == 200, reply.text
    fv = FunctionVersion.model_validate(reply.json())
    assert fv.metadata["lancefn.version"] == ours["version"]
    assert fv.image.manifest_digest == ours["artifact"]["digest"]
    from lancedb.functions import PythonRuntimeSpec

    assert PythonRuntimeSpec.model_validate(reply.json()["runtime"]).gpu is True
    assert connect(teams.url, A_KEY).get_function("ours", version=ours["version"]) == fv


def test_other_namespaces_answer_like_missing_ones(teams):
    connect(teams.url, A_KEY).create_function(udf(triple, name="private"))
    ben = connect(teams.url, B_KEY)
    with pytest.raises(Exception, match="has no version"):
        ben.get_function("private", version="1")
    assert "private" not in [fv.name for fv in ben.list_functions()]
    with teams.http(B_KEY) as http:
        theirs = http.post("/v1/function/a$private/describe", json={"version": "1"})
        nowhere = http.post("/v1/function/zz$private/describe", json={"version": "1"})
        listed = http.get("/v1/namespace/a/function/list")
        dropped = http.post("/v1/function/a$private/drop", json={"version": "1"})
    assert theirs.status_code == nowhere.status_code == listed.status_code == dropped.status_code == 404
    assert theirs.json()["error"]["message"] == nowhere.json()["error"]["message"].replace("'zz'", "'a'")
    assert connect(teams.url, A_KEY).get_function("private", version="1").name == "private"  # not dropped


def test_list_pages(teams):
    with teams.http(A_KEY) as http:
        for n in range(3):
            register(http, registration_body("paged", source=f"def double(x: int) -> int:\n    return x * {n + 2}\n"))
        first = http.get("/v1/namespace/$/function/list", params={"limit": 2}).json()
        second = http.get("/v1/namespace/$/function/list", params={"limit": 2, "page_token": first["page_token"]})
    assert "definition" not in first["functions"][0]
    names = [f["name"] for f in first["functions"] + second.json()["functions"]]
    assert names.count("paged") <= 3
    # the client follows page tokens to the end
    versions = [fv.version for fv in connect(teams.url, A_KEY).list_functions() if fv.name == "paged"]
    assert versions == ["1", "2", "3"]


def test_list_jobs_rows_carry_040_fields(teams):
    db = connect(teams.url, B_KEY)
    db.create_function(udf(triple, name="listed"))
    rows = db.list_jobs()
    assert rows and all(row.created_at_millis > 0 for row in rows)
    assert {row.job_type for row in rows} == {"create_function"}
    assert {row.state for row in rows} == {"finished"}


def half_rows(x: pa.Array, y: float) -> pa.Array:
    return x


def whole(batch: pa.RecordBatch) -> pa.Array:
    return batch.column(0)


def test_fields_not_implemented_are_refused_never_dropped(teams):
    db = connect(teams.url, A_KEY)
    with pytest.raises(Exception, match=r"400.*takes 'x' as Arrow batches but 'y' per row"):
        db.create_function(
            udf(
                half_rows,
                input_schema=pa.schema([pa.field("x", pa.float64()), pa.field("y", pa.float64())]),
                output_schema=pa.float64(),
            )
        )
    with teams.http(A_KEY) as http:
        body = registration_body("struct")
        body["signature"]["output"] = {"kind": "scalar", "arrow_type": "int64", "nullable": False, "fields": [FIELD_Y]}
        scalar_with_fields = http.post("/v1/functions/create", json=body)
        body["signature"]["output"] = {"kind": "named_struct", "fields": [FIELD_Y, FIELD_Y]}
        twice = http.post("/v1/functions/create", json=body)
        body["signature"]["output"] = {"kind": "union", "fields": [FIELD_Y]}
        union = http.post("/v1/functions/create", json=body)
    assert scalar_with_fields.status_code == twice.status_code == union.status_code == 400
    assert "'scalar' with fields is not supported" in scalar_with_fields.json()["error"]["message"]
    assert "name 'y' more than once" in twice.json()["error"]["message"]
    assert "'union' with fields is not supported" in union.json()["error"]["message"]
    names = {fv.name for fv in db.list_functions()}
    assert not names & {"half_rows", "whole", "struct"}


FIELD_Y = {"name": "y", "arrow_type": "int64", "nullable": False}


def test_gpu_marker_counts_in_identity_and_must_be_true(teams):
    plain = registration_body("marked", num_gpus=1)
    marked = json.loads(json.dumps(plain))
    marked["runtime"]["gpu"] = True
    alone = json.loads(json.dumps(marked))
    del alone["runtime"]["resources"]
    with teams.http(A_KEY) as http:
        ids = [register(http, body)["version"] for body in (plain, marked, alone)]
        false = json.loads(json.dumps(marked))
        false["runtime"]["gpu"] = False
        refused = http.post("/v1/functions/create", json=false)
        cpu = registration_body("marked", num_gpus=None)
        cpu["runtime"]["gpu"] = True
        refused_cpu = http.post("/v1/functions/create", json=cpu)
    assert ids[0] != ids[1] == ids[2]  # the marker is kept; alone it means one GPU, as beside resources
    assert refused.status_code == refused_cpu.status_code == 400
    assert "runtime.gpu must be true or absent" in refused.text
    assert "requires kind='python_v2'" in refused_cpu.text


def test_create_function_async_result_is_the_version(teams):
    db = connect(teams.url, A_KEY)
    job = db.create_function_async(udf(triple, name="later"))
    fv = job.wait(WAIT)
    assert isinstance(fv, FunctionVersion) and fv.version == "1"
    with httpx.Client(base_url=teams.url, headers={"x-api-key": A_KEY}) as http:
        assert http.post("/v1/jobs/describe", json={"job_id": job.id}).json()["result"]["version"] == "1"


def token_tail(x: int) -> str:
    import os

    return os.environ["HF_TOKEN"][-4:] + str(x)


def test_secrets_end_to_end(teams):
    db = connect(teams.url, B_KEY)
    binding = [EnvVarSecret("HF", "HF_TOKEN")]
    with pytest.raises(Exception, match=r"400.*secret 'HF' does not exist; create it with %gpu_secret HF"):
        db.create_function(udf(token_tail), secrets=binding)
    db.create_secret("HF", "hf_first_value_1234")
    with pytest.raises(Exception, match="409"):
        db.create_secret("HF", "again")
    info = db.describe_secret("HF")
    assert info.name == "HF" and info.created_at_millis == info.updated_at_millis > 0
    assert db.list_secrets() == ["HF"]
    assert connect(teams.url, A_KEY).list_secrets() == []  # per namespace
    fv = db.create_function(udf(token_tail), secrets=binding)
    assert [(b.variable, b.secret_ref.name) for b in fv.secret_bindings] == [("HF_TOKEN", "HF")]
    bare = db.create_function(udf(token_tail, env={"HF_TOKEN": "plain"}))
    assert bare.metadata["lancefn.version"] != fv.metadata["lancefn.version"]  # the binding counts in the id

    def run() -> dict:
        with teams.http(B_KEY) as http:
            body = {"name": fv.name, "version": fv.metadata["lancefn.version"], "rows": [{"x": 1}], "wait_s": 30}
            return http.post("/v1/functions/run", json=body).json()["job"]

    assert run()["result"] == ["12341"]
    db.alter_secret("HF", "hf_second_value_9999")
    assert db.describe_secret("HF").updated_at_millis >= info.updated_at_millis
    assert db.get_function(fv.name, version=fv.version) == fv  # altering changes no version
    assert run()["result"] == ["99991"]
    ref = {"kind": "env", "variable": "HF_TOKEN", "secret_ref": {"name": "HF", "namespace_path": ["b"]}}
    with teams.http(A_KEY) as http:  # .local()'s values go to a key of the secret's own namespace only
        other = http.post("/v1/secrets/local_env", json={"secret_bindings": [ref]})
        unqualified = http.post(
            "/v1/secrets/local_env", json={"secret_bindings": [{**ref, "secret_ref": {"name": "HF"}}]}
        )
    assert other.status_code == unqualified.status_code == 404 and "second_value" not in other.text + unqualified.text
    with teams.http(B_KEY) as http:
        assert http.post("/v1/secrets/local_env", json={"secret_bindings": [ref]}).json() == {
            "env": {"HF_TOKEN": "hf_second_value_9999"}
        }
    db.drop_secret("HF")
    failed = run()
    assert failed["job_state"] == "FAILED" and failed["failure"]["phase"] == "environment"
    assert "secret 'HF' (bound to environment variable HF_TOKEN) does not exist" in failed["failure"]["message"]
    assert "%gpu_secret HF" in failed["failure"]["message"]
    with teams.http() as http:  # the admin reads everything there is to read: no value anywhere
        seen = [
            http.post("/v1/jobs/list", json={"limit": 1000}).text,
            http.post("/v1/functions/list", json={"include_definition": True}).text,
            http.get("/v1/namespace/b/function/list", params={"include_definition": "true"}).text,
            teams.log_text(),
        ]
    assert not [text for text in seen if "first_value" in text or "second_value" in text]


def test_job_events_as_an_arrow_stream(teams):
    db = connect(teams.url, A_KEY)
    fv = db.create_function(udf(triple, name="eventful"))
    job = db.open_job(run_rows(teams, A_KEY, fv, [{"x": 1}, {"x": 2}]))
    job.wait(WAIT)
    events = job.events().to_pylist()
    assert [e["state"] for e in events][-1] == "DONE"
    assert {e["job_id"] for e in events} == {job.id} and events[-1]["rows_processed"] == 2
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    # 0.40's limit and filter (an SQL-like expression over the row's columns) are applied, the limit after the filter
    assert job.events(limit=1).to_pylist() == events[:1]
    assert job.events(filter="state = 'DONE'").to_pylist() == [e for e in events if e["state"] == "DONE"]
    kept = job.events(filter="NOT (state IN ('DONE') OR claim_entity IS NOT NULL) AND seq > 0", limit=1).to_pylist()
    assert kept == [e for e in events if e["state"] != "DONE"][:1] and kept
    with pytest.raises(Exception, match="'colour' is not a column; a filter compares the columns state"):
        job.events(filter="colour = 'red'")
    with pytest.raises(Exception, match="not found"):  # another team's job reads as a missing one
        connect(teams.url, B_KEY).open_job(job.id).events()


def test_a_class_with_initialization_runs_with_each_runs_values(teams):
    db = connect(teams.url, A_KEY)
    fv = db.create_function(udf(Scale))
    assert [(f.name, f.nullable) for f in fv.signature.initialization] == [("factor", False), ("offset", True)]
    ours = fv.metadata["lancefn.version"]

    def run(http, init) -> httpx.Response:
        body = {"name": "Scale", "version": ours, "rows": [{"x": 2.0}], "init": init, "wait_s": 30}
        return http.post("/v1/functions/run", json=body)

    with teams.http(A_KEY) as http:
        assert run(http, {"factor": 3.0}).json()["job"]["result"] == [6.0]
        assert run(http, {"factor": 0.5, "offset": 1.0}).json()["job"]["result"] == [2.0]  # its own instance
        missing, unknown = run(http, {}), run(http, {"factor": 1.0, "scale": 2})
    assert missing.status_code == unknown.status_code == 400
    assert "init: missing factor; Scale@" in missing.text and "unknown scale" in unknown.text
    # By our lookup: submit and map take init=, a batch's chunks all get it.
    from lancefn_jupyter.kernel import api

    api.connect(teams.url, A_KEY)
    handle = api.lookup(f"Scale@{ours}")
    assert handle.submit(2.0, init={"factor": 10.0}).result() == 20.0
    assert handle.map([1.0, 2.0], init={"factor": 2.0}).result() == [2.0, 4.0]
    batch = handle.map([1.0, 2.0, 3.0], chunk_size=1, parallel=2, init={"factor": -1.0}, fresh=True)
    assert batch.result() == [-1.0, -2.0, -3.0]


def test_list_jobs_lists_a_teams_batches_to_that_team_only(teams):
    with teams.http(A_KEY) as http:
        version = register(http, registration_body("batched"))["version"]
        body = {"name": "batched", "version": version, "chunks": [[{"x": 1}], [{"x": 2}]]}
        batch_id = http.post("/v1/batches/create", json=body).json()["batch_id"]
    rows = {row.job_id: row for row in connect(teams.url, A_KEY).list_jobs()}
    assert rows[batch_id].job_type == "batch"
    assert batch_id not in {row.job_id for row in connect(teams.url, B_KEY).list_jobs()}
    with teams.http(B_KEY) as http:
        assert http.post("/v1/jobs/list", json={"job_type": "batch"}).json()["jobs"] == []


def test_secrets_survive_a_restart_and_are_still_never_in_a_reply(control_plane_factory):
    cp = control_plane_factory()
    db = connect(cp.url, cp.api_key)
    db.create_secret("HF", "hf_kept_value_5678")
    fv = db.create_function(udf(token_tail, name="restarted"), secrets=[EnvVarSecret("HF", "HF_TOKEN")])
    body = {"name": fv.name, "version": fv.metadata["lancefn.version"], "rows": [{"x": 3}], "wait_s": 30}
    ref = {"kind": "env", "variable": "HF_TOKEN", "secret_ref": {"name": "HF"}}
    cp.restart()
    db = connect(cp.url, cp.api_key)
    with cp.http() as http:
        assert http.post("/v1/functions/run", json=body).json()["job"]["result"] == ["56783"]  # still delivered
        assert http.post("/v1/secrets/local_env", json={"secret_bindings": [ref]}).json()["env"] == {
            "HF_TOKEN": "hf_kept_value_5678"
        }
        seen = [  # everything else there is to read
            http.post("/v1/jobs/list", json={"limit": 1000}).text,
            http.post("/v1/functions/list", json={"include_definition": True}).text,
            http.post("/v1/secret/HF/describe").text,
            http.get("/v1/namespace/$/secret/list").text,
            *(p.read_text(errors="replace") for p in cp.log_dir.glob(f"server-{cp.home.name}-*.log")),
        ]
    assert len(seen) == 6 and not [text for text in seen if "kept_value" in text]
    assert db.describe_secret("HF").name == "HF" and db.list_secrets() == ["HF"]
    assert [b.secret_ref.name for b in db.get_function("restarted", version="1").secret_bindings] == ["HF"]


# ------------------------------------------------ bundles, batch UDFs and named-struct outputs run


def bundle_udf(tmp_path, factor: int):
    """``udf(code=[module])`` of an entry in its own module using a shipped module and a shipped package, ``factor``
    in the module: (the definition, the entry's name)."""
    (tmp_path / "lfb_helper.py").write_text(f"FACTOR = {factor}\n\ndef scale(x):\n    return x * FACTOR\n")
    (tmp_path / "lfb_pkg").mkdir(exist_ok=True)
    (tmp_path / "lfb_pkg" / "__init__.py").write_text("from lfb_pkg.plus import ONE\n")
    (tmp_path / "lfb_pkg" / "plus.py").write_text("ONE = 1\n")
    (tmp_path / "lfb_entry.py").write_text(
        "import lfb_helper\nimport lfb_pkg\n\n\ndef bundled(x: int) -> int:\n    return lfb_helper.scale(x) + lfb_pkg.ONE\n"
    )
    importlib.invalidate_caches()
    modules = {}
    for name in ("lfb_helper", "lfb_pkg.plus", "lfb_pkg", "lfb_entry"):
        sys.modules.pop(name, None)
    for name in ("lfb_helper", "lfb_pkg", "lfb_entry"):
        modules[name] = importlib.import_module(name)
    return udf(modules["lfb_entry"].bundled, code=[modules["lfb_helper"], modules["lfb_pkg"]])


def finished(db, job_id: str) -> list:
    """Follow a run with the 0.40 client's job routes; its result."""
    job = db.open_job(job_id)
    job.wait(WAIT)
    job.refresh()
    assert job.state == "finished", job.failure
    return job.result


def failure(db, job_id: str):
    """Follow a run that fails with the 0.40 client's job routes: its failure (phase, message)."""
    job = db.open_job(job_id)
    with pytest.raises(Exception, match="failed"):
        job.wait(WAIT)
    job.refresh()
    assert job.state == "failed"
    return job.failure


def test_a_python_bundle_runs_with_its_own_modules(teams, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    db = connect(teams.url, B_KEY)
    first = db.create_function(bundle_udf(tmp_path, 3))
    assert first.image.descriptor["mediaType"] == "application/vnd.lancefn.python-bundle.v1"
    assert db.get_function("bundled", version="1") == first
    assert [fv.version for fv in db.list_functions() if fv.name == "bundled"] == ["1"]
    assert finished(db, run_rows(teams, B_KEY, first, [{"x": 2}, {"x": 5}])) == [7, 16]
    # Another file of the bundle, another version; the worker that ran the first must not serve its module.
    second = db.create_function(bundle_udf(tmp_path, 10))
    assert second.version == "2" and second.metadata["lancefn.version"] != first.metadata["lancefn.version"]
    assert finished(db, run_rows(teams, B_KEY, second, [{"x": 2}])) == [21]
    assert finished(db, run_rows(teams, B_KEY, first, [{"x": 2}])) == [7]
    from lancefn_jupyter.kernel import api

    api.connect(teams.url, B_KEY)
    assert api.lookup(f"bundled@{second.metadata['lancefn.version']}").submit(1).result() == 11
    assert db.drop_function("bundled", version="1") is True
    assert [fv.version for fv in db.list_functions() if fv.name == "bundled"] == ["2"]


def bundle_body(files: dict[str, str]) -> dict:
    """A registration of a python_bundle of ``files`` beside a valid entry module."""
    entry = "def f(x: int) -> int:\n    return x\n"
    return registration_body("bad_bundle", source=entry, entrypoint="f", num_gpus=None, bundle=files)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"../evil.py": "X = 1\n"}, "must not contain '..'"),
        ({"lib/../../evil.py": "X = 1\n"}, "must not contain '..'"),
        ({"/etc/evil.py": "X = 1\n"}, "must be a relative path"),
        ({"notes.txt": "hi"}, "must be a .py file"),
        ({"os.py": "X = 1\n"}, "would shadow the worker's own modules"),
        ({"big.py": "# " + "x" * (1 << 20) + "\n"}, "over the limit of 1048576 bytes per file"),
        ({f"m{n}.py": "" for n in range(256)}, "257 files, over the limit of 256 files per bundle"),
    ],
)
def test_bad_bundles_are_refused(teams, files, message):
    with teams.http(A_KEY) as http:
        reply = http.post("/v1/functions/create", json=bundle_body(files))
        lancedb_reply = http.post("/v1/function/bad_bundle/create", json=bundle_body(files))
    assert reply.status_code == lancedb_reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]


def doubled(x: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.multiply(x, 2)


def integers(x: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.cast(x, pa.int64())


def calls(x: pa.Array) -> pa.Array:
    return pa.array([float(len(x))] * len(x))


FLOATS = {"input_schema": pa.schema([pa.field("x", pa.float64())]), "output_schema": pa.float64()}


class Shift:
    """A class batch UDF with initialization values."""

    def __init__(self, by: float):
        self.by = by

    def __call__(self, x: pa.Array) -> pa.Array:
        import pyarrow.compute as pc

        return pc.add(x, self.by)


def test_a_class_batch_udf_and_a_large_one_are_batched_too(teams, tmp_path, monkeypatch):
    db = connect(teams.url, A_KEY)
    shift = db.create_function(udf(Shift, **FLOATS))
    from lancefn_jupyter.kernel import api

    api.connect(teams.url, A_KEY)
    result = api.lookup(f"Shift@{shift.metadata['lancefn.version']}").map([1.0, 2.0], init={"by": 0.5}).result()
    assert list(result.to_pylist() if isinstance(result, pa.Array) else result) == [1.5, 2.5]
    # An entry source over the in-process limit is parsed in a child: batched all the same.
    (tmp_path / "lfb_large.py").write_text(
        f"import pyarrow as pa\n\n\ndef large(x: pa.Array) -> pa.Array:\n    '{'p' * 20000}'\n    return x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    definition = udf(importlib.import_module("lfb_large").large, **FLOATS)
    assert len(base64.b64decode(definition.registration_request.artifact.content.data)) > IN_PROCESS_MAX_BYTES
    large = db.create_function(definition)
    with teams.http(A_KEY) as http:
        ours = http.post("/v1/functions/describe", json={"name": "large", "version": large.metadata["lancefn.version"]})
    assert ours.json()["signature"]["batched"] is True


def test_a_batch_udf_is_called_once_per_batch(teams):
    db = connect(teams.url, A_KEY)
    fv = db.create_function(udf(doubled, **FLOATS))
    assert [(p.name, p.arrow_type) for p in fv.signature.inputs] == [("x", "float64")]
    with teams.http(A_KEY) as http:
        ours = http.post("/v1/functions/describe", json={"name": "doubled", "version": fv.metadata["lancefn.version"]})
    assert ours.json()["signature"]["batched"] is True
    assert ours.json()["signature"]["inputs"][0]["form"] == "arrow"
    from lancefn_jupyter.kernel import api

    api.connect(teams.url, A_KEY)
    result = api.lookup(f"doubled@{fv.metadata['lancefn.version']}").map([1.0, 2.5, -3.0]).result()
    assert list(result.to_pylist() if isinstance(result, pa.Array) else result) == [2.0, 5.0, -6.0]
    # one call per chunk: each row sees the chunk's length
    counted = db.create_function(udf(calls, **FLOATS))
    chunks = api.lookup(f"calls@{counted.metadata['lancefn.version']}").map([1.0] * 5, chunk_size=2).result()
    assert list(chunks.to_pylist() if isinstance(chunks, pa.Array) else chunks) == [2.0, 2.0, 2.0, 2.0, 1.0]
    job_id = run_rows(teams, A_KEY, fv, [{"x": 1.5}])
    job = db.open_job(job_id)
    job.wait(WAIT)
    assert job.status() == "finished"
    with teams.http(A_KEY) as http:
        table = pa.ipc.open_stream(http.get("/v1/jobs/result", params={"job_id": job_id}).content).read_all()
    assert table.column(0).to_pylist() == [3.0]


def test_a_batch_udf_result_of_another_type_fails_naming_it(teams):
    db = connect(teams.url, A_KEY)
    fv = db.create_function(udf(integers, **FLOATS))
    failed = failure(db, run_rows(teams, A_KEY, fv, [{"x": 1.0}]))
    assert failed.phase == "result"
    assert "expected a pyarrow.Array of float64 (the declared output type), got one of int64" in failed.message


def divmod3(x: int) -> dict:
    return {"q": x // 3, "r": x % 3}


def quotient_only(x: int) -> dict:
    return {"q": x // 3}


def with_extra(x: int) -> dict:
    return {"q": x // 3, "r": x % 3, "z": 0}


def struct_udf(function, fields=("q", "r")):
    return udf(
        function,
        input_schema=pa.schema([pa.field("x", pa.int64(), nullable=False)]),
        output_schema=pa.schema([pa.field(name, pa.int64()) for name in fields]),
    )


def test_a_named_struct_output_keeps_and_checks_its_fields(teams):
    db = connect(teams.url, A_KEY)
    fv = db.create_function(struct_udf(divmod3))
    assert fv.signature.output.kind == "named_struct"
    assert [f.name for f in fv.signature.output.fields] == ["q", "r"]
    renamed = db.create_function(struct_udf(divmod3, ("q", "rest")))
    assert renamed.metadata["lancefn.version"] != fv.metadata["lancefn.version"]  # the fields count in the id
    assert finished(db, run_rows(teams, A_KEY, fv, [{"x": 2}, {"x": 7}])) == [{"q": 0, "r": 2}, {"q": 2, "r": 1}]
    from lancefn_jupyter.kernel import api

    api.connect(teams.url, A_KEY)
    assert api.lookup(f"divmod3@{fv.metadata['lancefn.version']}").submit(10).result() == {"q": 3, "r": 1}
    for version, message in (
        (renamed, "the result of row 0 lacks field 'rest'"),
        (db.create_function(struct_udf(quotient_only)), "the result of row 0 lacks field 'r'"),
        (db.create_function(struct_udf(with_extra)), "the result of row 0 has field 'z', which is not an output field"),
    ):
        failed = failure(db, run_rows(teams, A_KEY, version, [{"x": 2}, {"x": 7}]))
        assert failed.phase == "result" and message in failed.message


def texts(x: int) -> dict:
    return {"q": x // 3, "r": "one" if x == 7 else x % 3}


def small(x: int) -> dict:
    return {"q": x * 100, "r": [x]}


def test_a_named_struct_outputs_values_are_checked_against_their_types(teams):
    db = connect(teams.url, A_KEY)
    failed = failure(db, run_rows(teams, A_KEY, db.create_function(struct_udf(texts)), [{"x": 2}, {"x": 7}]))
    assert failed.phase == "result"
    assert "the result of row 1: field 'r' is str, which does not convert to int64" in failed.message
    typed = udf(
        small,
        input_schema=pa.schema([pa.field("x", pa.int64(), nullable=False)]),
        output_schema=pa.schema([pa.field("q", pa.int8()), pa.field("r", pa.list_(pa.float64()))]),
    )
    fv = db.create_function(typed)
    assert finished(db, run_rows(teams, A_KEY, fv, [{"x": 1}])) == [{"q": 100, "r": [1]}]
    failed = failure(db, run_rows(teams, A_KEY, fv, [{"x": 1}, {"x": 2}]))
    assert failed.phase == "result"
    assert "the result of row 1: field 'q' is int, which does not convert to int8" in failed.message


def weighted(batch: pa.RecordBatch) -> pa.Array:
    import pyarrow.compute as pc

    return pc.add(pc.multiply(batch.column("x"), batch.column("w")), float(batch.num_rows) / 100)


def beside(batch: pa.RecordBatch, y: pa.Array) -> pa.Array:
    return y


XW = pa.struct([pa.field("x", pa.float64(), nullable=False), pa.field("w", pa.float64())])
RECORD_BATCH = {"input_schema": pa.schema([pa.field("batch", XW)]), "output_schema": pa.float64()}


def test_a_record_batch_udf_gets_each_chunk_as_one_record_batch(teams):
    db = connect(teams.url, A_KEY)
    fv = db.create_function(udf(weighted, **RECORD_BATCH))
    assert fv.signature.inputs[0].name == "batch"
    with teams.http(A_KEY) as http:
        ours = http.post("/v1/functions/describe", json={"name": "weighted", "version": fv.metadata["lancefn.version"]})
    assert (
        ours.json()["signature"]["batched"] is True and ours.json()["signature"]["inputs"][0]["form"] == "record_batch"
    )
    # By our REST (one struct per row) and the client's job routes: one call per chunk, the rows' fields as columns.
    rows = [{"batch": {"x": 1.0, "w": 2.0}}, {"batch": {"x": 3.0, "w": None}}, {"batch": {"x": -1.0, "w": 0.5}}]
    job_id = run_rows(teams, A_KEY, fv, rows)
    db.open_job(job_id).wait(WAIT)
    with teams.http(A_KEY) as http:
        table = pa.ipc.open_stream(http.get("/v1/jobs/result", params={"job_id": job_id}).content).read_all()
    assert table.column(0).to_pylist() == [2.03, None, -0.47]
    # By our lookup: dict rows (or a RecordBatch to submit) are the batch's columns, packed into the struct.
    from lancefn_jupyter.kernel import api

    api.connect(teams.url, A_KEY)
    function = api.lookup(f"weighted@{fv.metadata['lancefn.version']}")
    mapped = function.map([{"x": 1, "w": 1.0}] * 3, chunk_size=2).result()
    assert list(mapped.to_pylist() if isinstance(mapped, pa.Array) else mapped) == [1.02, 1.02, 1.01]
    batch = pa.record_batch({"w": [3.0], "x": [2.0]})  # by name, cast to the declared types
    submitted = function.submit(batch).result()
    assert list(submitted.to_pylist() if isinstance(submitted, pa.Array) else submitted) == [6.01]
    with pytest.raises(TypeError, match="has column 'z', which is not a field; its RecordBatch has the columns"):
        function.map([{"x": 1.0, "w": 1.0, "z": 0}])
    # A null row, or a null in a non-nullable field, fails the job in phase validation naming it.
    for bad, message in (
        ([{"batch": {"x": 1.0, "w": 1.0}}, {"batch": None}], "row 1 of parameter 'batch' is null"),
        ([{"batch": {"x": None, "w": 1.0}}], "field 'x' of parameter 'batch' is null in row 0"),
    ):
        failed = failure(db, run_rows(teams, A_KEY, fv, bad))
        assert failed.phase == "validation" and message in failed.message


def test_a_record_batch_udf_that_cannot_run_is_refused_saying_what_to_do(teams):
    db = connect(teams.url, A_KEY)
    with pytest.raises(Exception, match=r"400.*'batch' is a pa.RecordBatch but its input_schema type is float64"):
        db.create_function(
            udf(whole, input_schema=pa.schema([pa.field("batch", pa.float64())]), output_schema=pa.float64())
        )
    with pytest.raises(Exception, match=r"400.*'batch' is a pa.RecordBatch beside 'y'; a RecordBatch must be the only"):
        db.create_function(
            udf(
                beside,
                input_schema=pa.schema([pa.field("batch", XW), pa.field("y", pa.float64())]),
                output_schema=pa.float64(),
            )
        )


def test_a_batchs_events_by_its_id_and_another_namespace_reads_it_as_missing(teams):
    fv = connect(teams.url, A_KEY).create_function(udf(triple, name="batch_events"))
    with teams.http(A_KEY) as http:
        body = {"name": fv.name, "version": fv.metadata["lancefn.version"], "chunks": [[{"x": 1}], [{"x": 2}]]}
        batch_id = http.post("/v1/batches/create", json=body).json()["batch_id"]
        http.post("/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": 60}, timeout=70)
    events = connect(teams.url, A_KEY).open_job(batch_id).events().to_pylist()
    assert (events[0]["state"], events[0]["updated_by"]) == ("PENDING", "created")
    assert (events[-1]["state"], events[-1]["updated_by"], events[-1]["rows_processed"]) == ("DONE", "ended", 2)
    missing = "b" + batch_id[1:-4] + "0000"
    with teams.http(B_KEY) as http:
        theirs = http.post("/v1/jobs/query_events", json={"job_id": batch_id})
        absent = http.post("/v1/jobs/query_events", json={"job_id": missing})
    assert theirs.status_code == absent.status_code == 404
    assert theirs.json()["error"]["message"] == absent.json()["error"]["message"].replace(missing, batch_id)
    with pytest.raises(Exception, match="not found"):
        connect(teams.url, B_KEY).open_job(batch_id).events()
