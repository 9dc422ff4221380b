"""Server process behaviour: SIGKILL + restart keeps state, one server per home, private
files, loopback bind, clean SIGTERM, config errors refuse to start."""

from __future__ import annotations

import os
import stat
import subprocess

import httpx
from conftest import register, registration_body


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_sigkill_and_restart_keeps_versions_jobs_and_the_key(control_plane):
    cp = control_plane
    with cp.http() as http:
        versions = [register(http, registration_body(f"fn{i}")) for i in range(3)]
        jobs = http.post("/v1/jobs/list", json={}).json()["jobs"]
    key = cp.api_key
    cp.kill()
    assert cp.server_json.exists()  # stale after SIGKILL; the next server replaces it
    cp.start()
    assert cp.api_key == key  # the generated admin key survives restarts, so clients keep working
    with cp.http() as http:
        for version in versions:
            described = http.post(
                "/v1/functions/describe", json={"name": version["name"], "version": version["version"]}
            )
            assert described.json() == {**version, "namespace": "default"}
        assert http.post("/v1/jobs/list", json={}).json()["jobs"] == jobs
        # Idempotency holds across restarts too.
        assert register(http, registration_body("fn0")) == versions[0]
        assert len(http.post("/v1/functions/list", json={}).json()["functions"]) == 3


def test_the_workers_directory_a_killed_server_left_is_removed_by_the_next_one(control_plane):
    from pathlib import Path

    from helpers import submit, wait_done

    cp = control_plane
    with cp.http() as http:
        version = register(http, registration_body("left", num_gpus=None))["version"]
        assert wait_done(http, submit(http, "left", version, [{"x": 1}]))["result"] == [2]
    left = Path((cp.home / "worker-dirs").read_text().strip())
    assert left.is_dir() and any(left.iterdir())  # the worker's own directory inside it
    cp.kill()
    assert left.is_dir()  # nobody cleaned up
    cp.start()
    now = Path((cp.home / "worker-dirs").read_text().strip())
    assert now != left and now.is_dir() and not left.exists()
    cp.stop()
    assert not now.exists()  # a clean stop removes its own


def test_a_second_server_on_the_same_home_refuses(control_plane):
    result = subprocess.run(control_plane.command, env=control_plane.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"pid {control_plane.proc.pid}" in result.stderr
    assert str(control_plane.home) in result.stderr
    assert "Traceback" not in result.stderr
    # The first server is unaffected and still owns server.json.
    assert control_plane.info()["pid"] == control_plane.proc.pid
    assert httpx.get(control_plane.url + "/v1/health").status_code == 200


def test_state_files_are_private(control_plane):
    home = control_plane.home
    assert _mode(control_plane.server_json) == 0o600
    assert _mode(home / "api_key") == 0o600
    assert _mode(home / "lancefn.sqlite3") == 0o600
    info = control_plane.info()
    assert set(info) == {"url", "api_key", "pid", "home", "version", "executor", "started_at", "unix_socket"}
    assert _mode(info["unix_socket"]) == 0o600
    assert info["home"] == str(home) and info["executor"] == "local"


def test_binds_loopback_only_by_default(control_plane):
    url = httpx.URL(control_plane.url)
    assert url.host == "127.0.0.1" and url.port > 0
    # The kernel's socket table agrees: the listening socket is on 127.0.0.1, not 0.0.0.0.
    listening = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # LISTEN
                address, port = local.split(":")
                listening.add((address, int(port, 16)))
    assert ("0100007F", url.port) in listening
    assert ("00000000", url.port) not in listening


def test_sigterm_stops_cleanly_and_removes_server_json(control_plane):
    assert control_plane.stop() == 0
    assert not control_plane.server_json.exists()
    assert "Traceback" not in control_plane.log_text()
    # And a new server can take the home right away.
    control_plane.start()
    assert httpx.get(control_plane.url + "/v1/health").status_code == 200


def test_invalid_gpu_class_config_refuses_to_start_with_the_reason(control_plane_factory):
    cp = control_plane_factory(
        "[[gpu_classes]]\nname = 'x'\nsimulated = 2\nmax_gpu_count_per_worker = 5\n", start=False
    )
    result = subprocess.run(cp.command, env=cp.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "gpu_classes.toml" in result.stderr and "class 'x'" in result.stderr
    assert "max_gpu_count_per_worker" in result.stderr
    assert "Traceback" not in result.stderr
    assert not cp.server_json.exists()


def test_invalid_api_keys_file_refuses_to_start(control_plane_factory):
    cp = control_plane_factory(api_keys="[[api_keys]]\nkey = 'short'\n", start=False)
    result = subprocess.run(cp.command, env=cp.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "api_keys[0]" in result.stderr and "'key'" in result.stderr


def test_admin_key_from_the_environment(control_plane_factory):
    cp = control_plane_factory(env={"LANCEFN_API_KEY": "env-provided-key-123"})
    assert cp.api_key == "env-provided-key-123"
    assert httpx.get(cp.url + "/v1/gpu/usage", headers={"x-api-key": "env-provided-key-123"}).status_code == 200
    assert not (cp.home / "api_key").exists()


def test_store_runs_after_commit_callbacks_only_once_the_outermost_batch_commits(tmp_path):
    from lancefn_jupyter.server.storage.store import Store

    store = Store(tmp_path / "db.sqlite3")
    ran: list[str] = []
    with store.batch():
        with store.batch():
            store.after_commit(lambda: ran.append("inner"))
            assert store.in_batch()
        assert ran == []  # the inner batch ending commits nothing
    assert ran == ["inner"] and not store.in_batch()
    try:
        with store.batch():
            store.after_commit(lambda: ran.append("rolled back"))
            raise RuntimeError("abort")
    except RuntimeError:
        pass
    store.after_commit(lambda: ran.append("no batch"))  # outside a batch: at once
    assert ran == ["inner", "no batch"]
    store.close()


def test_worker_max_rss_mb_must_be_positive_and_a_valid_limit_serves(control_plane_factory):
    for bad in ("0", "-5", "nan"):
        cp = control_plane_factory(args=["--worker-max-rss-mb", bad], start=False)
        result = subprocess.run(cp.command, env=cp.env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert "--worker-max-rss-mb must be a number of MiB > 0" in result.stderr
        assert "Traceback" not in result.stderr
        assert not cp.server_json.exists()
    cp = control_plane_factory(args=["--worker-max-rss-mb", "4096"])
    with cp.http() as http:
        version = register(http, registration_body())["version"]
        reply = http.post("/v1/functions/run", json={"name": "double", "version": version, "rows": [{"x": 4}]})
        job_id = reply.json()["job_id"]
        job = http.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 30}, timeout=40).json()
        assert job["job_state"] == "DONE" and job["result"] == [8]
