"""Secrets from a notebook (docs/ARCHITECTURE.md, "Secrets"): `%gpu_secret NAME` asks with getpass, a
`%%gpu_function secret=...` cell binds it by name, its jobs get the value, and the card names it, never the value;
the cell's version parses with LanceDB 0.40's own models."""

from __future__ import annotations

import getpass
import os

import pytest
from helpers import kernel_shell
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from lancedb.functions import FunctionVersion as LanceFunctionVersion

from lancefn_jupyter import secrets
from lancefn_jupyter.kernel.api import JobError
from lancefn_jupyter.kernel.options import OptionsError, build_options, parse_function_line

CELL = """\
import os


def token_tail(x: int) -> str:
    return os.environ["{variable}"][-4:] + str(x)
"""


@pytest.fixture(scope="module")
def cp(module_control_plane_factory):
    return module_control_plane_factory()


@pytest.fixture
def ip(cp):
    yield from kernel_shell(cp)


def typed(monkeypatch, value: str) -> None:
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": value)


def test_gpu_secret_binds_by_name_and_jobs_get_the_value(ip, cp, monkeypatch):
    typed(monkeypatch, "hf_cell_value_1111")
    with capture_output() as made:
        ip.run_line_magic("gpu_secret", "HF_TOKEN")
    assert "created" in made.stdout and "hf_cell_value" not in made.stdout
    # OTHER's secret does not exist: the registration is refused, naming it and how to create it.
    with pytest.raises(UsageError, match="secret 'hf' does not exist; create it with %gpu_secret hf"):
        ip.run_cell_magic("gpu_function", "num_gpus=1 secret=HF_TOKEN secret=hf:OTHER", CELL.format(variable="OTHER"))
    typed(monkeypatch, "hf_other_value_2222")
    ip.run_line_magic("gpu_secret", "hf")
    with capture_output() as card:
        ip.run_cell_magic("gpu_function", "num_gpus=1 secret=HF_TOKEN secret=hf:OTHER", CELL.format(variable="OTHER"))
    handle = ip.user_ns["token_tail"]
    shown = card.stdout + "\n".join(o.data.get("text/plain", "") for o in card.outputs)
    assert "HF_TOKEN, hf as OTHER" in shown and "value" not in shown
    assert handle.submit(7).result() == "22227"
    typed(monkeypatch, "hf_other_value_3333")
    with capture_output() as altered:
        ip.run_line_magic("gpu_secret", "hf")
    assert "altered" in altered.stdout
    assert handle.submit(7).result() == "33337"  # the same version, the new value
    assert sorted(secrets.list()) == ["HF_TOKEN", "hf"]
    assert set(secrets.describe("hf")) == {"name", "created_at_millis", "updated_at_millis"}
    with cp.http() as http:
        reply = http.post(
            "/v1/function/token_tail/describe", json={"version": handle.version.version}
        )  # our content id works here
    fv = LanceFunctionVersion.model_validate(reply.json())
    assert [(b.variable, b.secret_ref.name) for b in fv.secret_bindings] == [("HF_TOKEN", "HF_TOKEN"), ("OTHER", "hf")]
    assert fv.metadata["lancefn.version"] == handle.version.version
    ip.run_line_magic("gpu_secret", "--drop hf")
    with pytest.raises(JobError, match=r"secret 'hf' \(bound to environment variable OTHER\) does not exist"):
        handle.submit(1).result()


def test_secret_options():
    assert parse_function_line("secret=A secret=s:B", {}).secrets == (("A", "A"), ("B", "s"))
    assert build_options(secrets={"VAR": "sec"}).secrets == (("VAR", "sec"),)
    with pytest.raises(OptionsError, match="set by env= and bound to a secret"):
        parse_function_line("secret=A env=A=1", {})
    with pytest.raises(OptionsError, match="invalid variable name"):
        build_options(secrets=["s:1BAD"])


def test_gpu_secret_usage(ip):
    with pytest.raises(UsageError, match="%gpu_secret NAME"):
        ip.run_line_magic("gpu_secret", "a b")


def test_local_runs_get_the_bound_secret_from_the_server_and_name_a_missing_one(ip, cp, monkeypatch):
    typed(monkeypatch, "local_value_4444")
    ip.run_line_magic("gpu_secret", "LOCAL_TOKEN")
    with capture_output() as shown:
        ip.run_cell_magic("gpu_function", "num_gpus=1 secret=LOCAL_TOKEN", CELL.format(variable="LOCAL_TOKEN"))
        assert ip.user_ns["token_tail"].local(5) == "44445"  # fetched with the key, into the run's environment only
    assert "local_value" not in shown.stdout + shown.stderr
    assert "LOCAL_TOKEN" not in os.environ  # not set in the kernel's own environment
    ip.run_line_magic("gpu_secret", "--drop LOCAL_TOKEN")
    with pytest.raises(
        Exception,
        match=r"token_tail.local\(\): secret 'LOCAL_TOKEN' \(bound to environment variable LOCAL_TOKEN\) does not exist .* %gpu_secret LOCAL_TOKEN",
    ):
        ip.user_ns["token_tail"].local(5)
    with cp.http() as http:  # another form of binding is a 400, never a 5xx
        bad = http.post("/v1/secrets/local_env", json={"secret_bindings": [{"kind": "file"}]})
    assert bad.status_code == 400 and "only kind 'env'" in bad.text
