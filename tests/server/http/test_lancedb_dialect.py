"""LanceDB 0.40's released client against a real server (docs/ARCHITECTURE.md, "LanceDB 0.40 dialect"): it creates,
gets, lists and drops functions and follows their jobs; what the server cannot honour is refused, never dropped."""

from __future__ import annotations

import datetime
import importlib.util
import json

import httpx
import lancedb
import pyarrow as pa
import pytest
from conftest import register, registration_body
from helpers import two_teams
from lancedb.functions import FunctionVersion, udf
from lancedb.secrets import EnvVarSecret

A_KEY, B_KEY = "dialect-team-a-key-0001", "dialect-team-b-key-0002"
WAIT = datetime.timedelta(seconds=60)


def triple(x: int) -> int:
    return 3 * x


class Scale:
    def __init__(self, factor: float, offset: float = 0.0):
        self.factor, self.offset = factor, offset

    def __call__(self, x: float) -> float:
        return x * self.factor + self.offset


def doubled(x: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.multiply(x, 2)


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


def test_fields_not_implemented_are_refused_never_dropped(teams, tmp_path):
    db = connect(teams.url, A_KEY)
    with pytest.raises(Exception, match=r"400.*Arrow batches"):
        db.create_function(
            udf(
                doubled,
                input_schema=pa.schema([pa.field("x", pa.float64())]),
                output_schema=pa.float64(),
            )
        )
    helper = tmp_path / "helper_mod.py"
    helper.write_text("FACTOR = 3\n")
    spec = importlib.util.spec_from_file_location("helper_mod", helper)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(Exception, match=r"400.*python_bundle"):
        db.create_function(udf(triple, name="bundled", code=[module]))
    with teams.http(A_KEY) as http:
        body = registration_body("struct")
        body["signature"]["output"] = {
            "kind": "named_struct",
            "fields": [{"name": "y", "arrow_type": "int64", "nullable": False}],
        }
        reply = http.post("/v1/functions/create", json=body)
    assert reply.status_code == 400 and "named_struct" in reply.json()["error"]["message"]
    names = {fv.name for fv in db.list_functions()}
    assert not names & {"Scale", "doubled", "bundled", "struct"}


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
