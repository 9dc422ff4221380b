"""What many test modules share: polling with a deadline, file-gated "hold" functions, the REST
calls the job tests make against a real control plane, API-key files, an IPython shell with the
extension loaded, a Ray-executor server (and the body of the ``ray_cp`` fixture), an in-process control plane
with a recording executor, raw HTTP connections,
hypothesis settings for fuzzing, the packaging tests' cell helpers (and one numba CUDA cell), and which small
packages this Python lacks (the environment tests install them).

Test modules in different folders share through here, never by importing each other (a test
folder is on ``sys.path`` only while pytest collects it).

Waits poll until a condition holds and fail only when it never does (a generous deadline, never
an assert on elapsed time). A hold function runs until the test creates a file, so job states
change when the test says so, not by timing.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from conftest import ControlPlaneProcess, make_env, register, registration_body

from lancefn_jupyter.kernel.packaging import PackagedFunction, package_cell
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state
from lancefn_jupyter.server.executors.base import Executor, TaskSpec
from lancefn_jupyter.wire.models import Job

T = TypeVar("T")

#: tests/, which a subprocess puts on ``sys.path`` to import these helpers.
TESTS = Path(__file__).resolve().parent

DEADLINE_S = 60.0

#: ``hold(path)`` returns ``path`` once the file exists; it prints a line first so tests can see it started.
HOLD_SOURCE = """from __future__ import annotations

import os
import time


def hold(path: str) -> str:
    print("holding", path, flush=True)
    while not os.path.exists(path):
        time.sleep(0.01)
    return path
"""

TERMINAL = ("DONE", "FAILED", "CANCELLED", "TIMED_OUT")


def gated(path: str, value: int) -> int:
    """A batch row that waits for ``path``; a negative value fails until ``path + ".fixed"`` exists.
    Self-contained (imports inside), so it can be shipped as a function or as its source text."""
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.01)
    if value < 0 and not os.path.exists(path + ".fixed"):
        raise ValueError(f"value {value} is negative")
    return value * 10


#: Pieces of ``%%gpu_function`` option lines that property tests join at random: names, punctuation, values.
OPTION_LINE_TOKENS = (
    "num_gpus",
    "gpu_class",
    "name",
    "pip",
    "conda",
    "conda_channels",
    "env",
    "python_version",
    "image",
    "profile",
    "register",
    "timeout_s",
    "=",
    ",",
    "'",
    '"',
    " ",
    "\\",
    "1",
    "0",
    "-1",
    "1.5",
)


def wait_until(condition: Callable[[], T], what: str, timeout: float = DEADLINE_S, interval: float = 0.05) -> T:
    """Poll ``condition()`` until it returns something truthy and return that; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
    return value


def let_workers_reach_this_python() -> None:
    """Test setup for a root server whose workers run as ``nobody``: give the directories above this interpreter,
    its prefix and this checkout o+x (traverse, not list), the fix the server's refusal names.  CI's Python lives
    under a 0700 /root, so without this a root server refuses to start (and which test ran first would decide)."""
    import stat
    import sys

    import lancefn_jupyter
    from lancefn_jupyter.server.executors.isolation import _closed_dirs

    if os.geteuid() != 0:
        return
    paths = [Path(sys.executable).resolve(), Path(sys.prefix), Path(lancefn_jupyter.__file__).resolve()]
    for directory in _closed_dirs(paths):
        os.chmod(directory, os.stat(directory).st_mode | stat.S_IXOTH)


#: Small pure-Python packages whose module is named as the distribution: the environment tests declare the ones
#: this Python lacks (checked at run time, never assumed).
SMALL_PACKAGES = ("humanize", "tabulate", "toolz", "termcolor", "inflection", "pyfiglet")


def tiny_wheel(directory: Path, name: str, version: str, source: str = "VALUE = 42\n") -> Path:
    """A pure-Python wheel, written by hand: ``import <name>`` runs ``source`` (``VALUE = 42``)."""
    import base64
    import zipfile

    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}.py": source.encode(),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


_REPORTING_BACKEND = """
import os
import sys
import time


def _leave_a_daemon():
    # A detached process (setsid, double fork) that would outlive the build and rewrite the sealed tree.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            with open({daemon_file!r}, "w") as handle:
                handle.write(os.readlink("/proc/self"))  # its pid as the server sees it, in a pid namespace too
            time.sleep(120)
        os._exit(0)
    os.wait()


def _report(*args, **kwargs):
    _leave_a_daemon()
    try:
        with open({key_file!r}) as handle:
            key = "read " + handle.read().strip()
    except OSError as error:
        key = type(error).__name__
    sys.exit(f"evilpkg backend: uid {{os.getuid()}}, api_key {{key}}")


get_requires_for_build_wheel = prepare_metadata_for_build_wheel = build_wheel = _report
"""


@contextlib.contextmanager
def reporting_project(key_file: Path) -> Iterator[str]:
    """A local project ``evilpkg`` whose in-tree PEP 517 backend, asked for anything, leaves a detached daemon behind
    (its pid in ``left_daemon(reference)``) and fails saying ``evilpkg backend: uid N, api_key <read KEY | the
    OSError>`` (its metadata is dynamic, so a resolution must ask it); yields its direct reference
    ``evilpkg @ file://…``. Under /tmp, readable by every user."""
    project = Path(tempfile.mkdtemp(prefix="lancefn-evilpkg-", dir="/tmp"))
    try:
        project.chmod(0o755)
        (project / "pyproject.toml").write_text(
            '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
            '[project]\nname = "evilpkg"\ndynamic = ["version"]\n'
        )
        daemon_file = project / "out" / "daemon.pid"
        (project / "backend.py").write_text(
            _REPORTING_BACKEND.format(key_file=str(key_file), daemon_file=str(daemon_file))
        )
        for path in project.iterdir():
            path.chmod(0o644)
        daemon_file.parent.mkdir(mode=0o777)
        daemon_file.parent.chmod(0o777)  # the backend runs as another user
        yield f"evilpkg @ file://{project}"
    finally:
        shutil.rmtree(project, ignore_errors=True)


def left_daemon(reference: str) -> int | None:
    """The pid of the daemon ``reporting_project``'s backend left, once it wrote it; None before."""
    path = Path(reference.split("file://", 1)[1]) / "out" / "daemon.pid"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def absent_packages(count: int = 1) -> list[str]:
    """``count`` of ``SMALL_PACKAGES`` this Python does not have (the test is skipped when it has too many)."""
    found = []
    for name in SMALL_PACKAGES:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found.append(name)
    if len(found) < count:
        pytest.skip(
            f"needs {count} of {SMALL_PACKAGES} absent from this Python; absent: {found}", allow_module_level=True
        )
    return found[:count]


def text_body(name: str, source: str, *, entrypoint: str | None = None, arg: str = "path", **options: Any) -> dict:
    """A registration body for ``entrypoint(arg: str) -> str`` (holds, probes); ``entrypoint`` defaults to ``name``."""
    return registration_body(
        name,
        source=source,
        entrypoint=entrypoint or name,
        inputs=((arg, "utf8", False),),
        output_type="utf8",
        **options,
    )


def hold_version(http: httpx.Client, name: str = "hold", num_gpus: int | None = 1, **options: Any) -> str:
    """Registers :data:`HOLD_SOURCE` as ``name``; returns its version id."""
    return register(http, text_body(name, HOLD_SOURCE, entrypoint="hold", num_gpus=num_gpus, **options))["version"]


def submit(
    http: httpx.Client, name: str, version: str, rows: list[dict], timeout_s: float | None = None, **extra: Any
) -> str:
    """POST /v1/functions/run; returns the job id. ``extra`` goes into the body as is."""
    body = {"name": name, "version": version, "rows": rows, **({"timeout_s": timeout_s} if timeout_s else {}), **extra}
    reply = http.post("/v1/functions/run", json=body)
    assert reply.status_code == 202, reply.text
    return reply.json()["job_id"]


def admit(plane: Any, name: str, version: str, rows: Any, **where: Any) -> str:
    """A job of an in-process plane queued and saved on this thread (``Intake.admit``, a batch chunk's lane): its id."""
    from lancefn_jupyter.server.control.intake import JobRequest

    return plane.intake.admit(JobRequest(name, version, where, rows=rows)).job_id


def describe(http: httpx.Client, job_id: str) -> dict:
    reply = http.post("/v1/jobs/describe", json={"job_id": job_id})
    assert reply.status_code == 200, reply.text
    Job.from_wire(reply.json())  # every reply decodes as the wire model
    return reply.json()


def wait_state(http: httpx.Client, job_id: str, *states: str, timeout: float = DEADLINE_S) -> dict:
    """Polls until the job is in one of ``states``; fails at once if it ends in another."""

    def reached() -> dict | None:
        job = describe(http, job_id)
        if job["job_state"] in states:
            return job
        assert job["job_state"] not in TERMINAL, f"{job_id} ended instead of reaching {states}: {job}"
        return None

    return wait_until(reached, f"{job_id} in {states}", timeout)


def wait_done(http: httpx.Client, job_id: str, timeout: float = DEADLINE_S) -> dict:
    """POST /v1/jobs/wait (10 s at a time) until the job has ended; fails after ``timeout``."""

    def ended() -> dict | None:
        reply = http.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": min(10.0, timeout)})
        assert reply.status_code == 200, reply.text
        return reply.json() if reply.json()["job_state"] in TERMINAL else None

    return wait_until(ended, f"job {job_id} to end", timeout)


def fuzz(examples: int) -> Any:
    """Hypothesis settings for input fuzzing: ``examples`` derandomized examples, no deadline."""
    from hypothesis import HealthCheck, settings

    return settings(max_examples=examples, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def raw_socket(url: str, sent: bytes = b"") -> socket.socket:
    """A TCP connection to the server at ``url`` that has sent ``sent`` (a head, part of one, a body ...)."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=20)
    if sent:
        sock.sendall(sent)
    return sock


def read_reply(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the socket timeout)."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One reply on a kept-alive connection: its status and its body (``content-length``; none for a stream,
    whose head alone is read)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection mid-reply: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    size = int(fields.get("content-length", len(body)))
    while len(body) < size:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    return int(lines[0].split(" ", 2)[1]), body


def http_head(method: str, path: str, key: str | None = None, body_bytes: int | None = None) -> bytes:
    """A request's line and headers, as a raw client sends them."""
    lines = [f"{method} {path} HTTP/1.1", "Host: x"]
    if key is not None:
        lines.append(f"x-api-key: {key}")
    if body_bytes is not None:
        lines += ["content-type: application/json", f"content-length: {body_bytes}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


#: One simulated GPU in the ``default`` class: every job lands on the same device set.
ONE_GPU = "[[gpu_classes]]\nname = 'default'\nsimulated = 1\n"


def two_teams(a_key: str, b_key: str) -> str:
    """The API-key file of two teams: ann's ``a_key`` in namespace ``a`` and ben's ``b_key`` in ``b``, each with the
    ``functions`` and ``jobs`` privileges."""
    return api_keys_toml(
        {"name": "ann", "key": a_key, "namespace": "a", "privileges": ["functions", "jobs"]},
        {"name": "ben", "key": b_key, "namespace": "b", "privileges": ["functions", "jobs"]},
    )


# A worker-isolation probe, ``act(target)``: "" → "<uid> <gid> <pid> <umask>" of the worker that ran it; "detach" →
# the same and the pid of a ``sleep`` it leaves behind in a session of its own; "stop:<pid>" SIGSTOPs another
# worker ("pause:<pid>" then SIGCONTs it) and says "stopped", or "denied" when this user may not.
ACT_SOURCE = """
import os
import signal
import subprocess


def act(target: str) -> str:
    how, _, pid = target.partition(":")
    if pid:  # another namespace's worker
        try:
            os.kill(int(pid), signal.SIGSTOP)
        except PermissionError:
            return "denied"
        if how == "pause":
            os.kill(int(pid), signal.SIGCONT)
        return "stopped"
    me = f"{os.getuid()} {os.getgid()} {os.getpid()} {oct(os.umask(0o077))}"
    if target != "detach":
        return me
    started = subprocess.run(
        ["setsid", "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    return f"{me} {started.stdout.strip()}"
"""


def act_body() -> dict:
    """The registration of :data:`ACT_SOURCE` (a CPU function ``act``)."""
    return registration_body(
        "act", source=ACT_SOURCE, entrypoint="act", inputs=(("target", "utf8", False),), output_type="utf8"
    )


def api_keys_toml(*keys: dict[str, Any]) -> str:
    """An ``--api-keys`` file: one ``[[api_keys]]`` table per dict (name, key, privileges, namespace)."""
    tables = ("".join(f"{field} = {json.dumps(value)}\n" for field, value in key.items()) for key in keys)
    return "".join(f"[[api_keys]]\n{table}\n" for table in tables)


def kernel_shell(cp: Any) -> Iterator[Any]:
    """An IPython shell with the extension loaded and connected to ``cp`` (a fixture's body)."""
    from IPython.core.interactiveshell import InteractiveShell

    from lancefn_jupyter.kernel import api

    shell = InteractiveShell.instance()
    shell.reset()
    shell.run_line_magic("load_ext", "lancefn_jupyter")
    kernel_session.registered.clear()
    kernel_session.profiles.clear()
    api.connect(cp.url, cp.api_key)
    yield shell
    shell.reset()


@contextlib.contextmanager
def ray_server(tmp_path_factory: Any, classes: str, *args: str, **env: str) -> Iterator[ControlPlaneProcess]:
    """A started ``lancefn-server --executor ray`` with the ``classes`` TOML (its own local Ray unless
    ``args`` name ``--ray-address``), no pip installs; stopped and its Ray temp dir removed on exit."""
    base = tmp_path_factory.mktemp("ray")
    (base / "classes.toml").write_text(classes)
    temp_dir = tempfile.mkdtemp(prefix="lfr", dir="/tmp")  # short: Ray's unix sockets must fit in 107 chars
    server = ControlPlaneProcess(
        base / "home",
        args=["--gpu-classes", str(base / "classes.toml"), "--executor", "ray", *args],
        # RAY_AUTH_MODE: no token written to ~/.ray for a throwaway cluster.
        env=make_env(
            {"RAY_AUTH_MODE": "disabled", "LANCEFN_RAY_TEMP_DIR": temp_dir, "LANCEFN_RAY_PIP": "never", **env}
        ),
        log_dir=base,
    )
    try:
        yield server.start()
    finally:
        try:
            server.stop()
        except Exception:  # teardown must not leave the server running
            server.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


#: The Ray executor tests' classes: ``small`` (two simulated GPUs) and ``big`` (one).
RAY_CLASSES = """
[[gpu_classes]]
name = "small"
gpu_model = "Simulated small GPU"
simulated = 2

[[gpu_classes]]
name = "big"
gpu_model = "Simulated big GPU"
simulated = 1
"""


def ray_driver(cp: ControlPlaneProcess) -> psutil.Process:
    """The server's Ray driver process (whose session holds every Ray process it started)."""

    def found() -> psutil.Process | None:
        for child in psutil.Process(cp.proc.pid).children():
            try:
                if "bridge_main" in " ".join(child.cmdline()):  # its entry point, in the -c argv
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    return wait_until(found, "the server's Ray driver process", 30)


def session_processes(sid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                found.append(proc)
        except (ProcessLookupError, PermissionError, OSError):
            continue
    return found


@contextlib.contextmanager
def module_ray_server(tmp_path_factory: Any, *args: str) -> Iterator[ControlPlaneProcess]:
    """The body of conftest's ``ray_cp`` fixture: a Ray-backed server on :data:`RAY_CLASSES` (and the server
    flags ``args``) whose ``sessions`` lists its Ray drivers' sessions; every process in them is killed at the end."""
    sessions: list[int] = []  # every bridge session seen, swept at teardown
    try:
        # LOST_AFTER_S: a lost cluster is noticed fast. ACTOR_IDLE_S: warm actors hold their GPUs while idle; a
        # second server on this cluster (test_ray_executor.py's --ray-address test) cannot see them, so its job
        # waits until they retire. LANCEFN_RAY_PIP=never (ray_server): a missing package fails fast in the task.
        with ray_server(
            tmp_path_factory, RAY_CLASSES, *args, LANCEFN_RAY_LOST_AFTER_S="10", LANCEFN_RAY_ACTOR_IDLE_S="15"
        ) as cp:
            cp.sessions = sessions
            sessions.append(ray_driver(cp).pid)
            yield cp
    finally:
        for sid in sessions:  # never leave Ray behind, even when a test failed half-way
            for proc in session_processes(sid):
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass


@contextlib.contextmanager
def fake_autoscaling_cluster(
    gpu_class: str, max_nodes: int, idle_timeout_s: float = 6.0, gpus_per_node: int = 1
) -> Iterator[str]:
    """A Ray cluster with an autoscaler (Ray's fake multi-node provider: each node it adds is a raylet on this machine)
    whose one worker node type carries ``gpus_per_node`` GPUs of ``gpu_class`` and scales from 0 to ``max_nodes``,
    removing a node idle for ``idle_timeout_s``; yields its GCS address. Started with ``ray start`` in a session of
    its own, every process of which is killed at the end (never ``ray stop``: that stops every Ray on the machine)."""
    temp_dir = tempfile.mkdtemp(prefix="lfa", dir="/tmp")  # short: Ray's unix sockets must fit in 107 chars
    port = _free_port()
    node = {"CPU": 1, "GPU": gpus_per_node, f"lancefn_gpu_class:{gpu_class}": gpus_per_node}
    config = {
        "cluster_name": "lancefn-fake",
        "max_workers": max_nodes,
        "upscaling_speed": 100,
        "idle_timeout_minutes": idle_timeout_s / 60,
        # ``type: fake_multinode`` reads an example config this wheel lacks; the provider module directly works
        "provider": {
            "type": "external",
            "module": "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider",
            "gcs_address": f"127.0.0.1:{port}",
            "launch_multiple": True,
            # as Ray's own fake multi-node configs: no NodeUpdater (it would try to ssh into each node, fail, and
            # terminate the node as "launch failed", killing the jobs on it), no launch-config check, node ids as ips
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "use_node_id_as_ip": True,
        },
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            gpu_class: {"resources": node, "node_config": {}, "min_workers": 0, "max_workers": max_nodes},
        },
        "head_node_type": "ray.head.default",
        "auth": {"ssh_user": "nobody"},
        **{key: [] for key in ("initialization_commands", "setup_commands", "head_setup_commands")},
        **{key: [] for key in ("worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")},
        "file_mounts": {},
        "cluster_synced_files": [],
    }
    path = Path(temp_dir) / "autoscaling.json"
    path.write_text(json.dumps(config))
    env = make_env({"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_AUTH_MODE": "disabled"})
    env["RAY_raylet_start_wait_time_s"] = "120"  # a loaded machine starts the node agents slowly
    env.update(RAY_TMPDIR=temp_dir, RAY_USAGE_STATS_ENABLED="0")
    ray_cli = str(Path(sys.executable).parent / "ray")
    command = [ray_cli, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1"]
    command += ["--num-gpus=0", f"--autoscaling-config={path}", f"--temp-dir={temp_dir}", "--include-dashboard=false"]
    command.append("--include-log-monitor=false")  # one Python process less to start
    # ports of our own: Ray's defaults (10001, 8265) would clash with another cluster on this machine
    command += [f"--ray-client-server-port={_free_port()}", f"--dashboard-port={_free_port()}"]
    sessions: list[int] = []
    try:
        # Ray gives a node's agents 15 s to write their ports (a hard limit of its raylet): on a loaded machine they
        # may take longer, so a failed start is retried
        for attempt in range(3):
            # output to a file: Ray's daemons inherit it, so a pipe would stay open after ``ray start`` ends
            with open(Path(temp_dir) / f"start{attempt}.log", "w+b") as log:
                start = subprocess.Popen(command, env=env, start_new_session=True, stdout=log, stderr=log)
                sessions.append(start.pid)
                try:
                    if start.wait(timeout=240) == 0:
                        break
                except subprocess.TimeoutExpired:
                    start.kill()
                _kill_sessions(sessions)
                if attempt == 2:
                    log.seek(0)
                    raise RuntimeError(f"ray start failed 3 times: {log.read().decode(errors='replace')[-2000:]}")
        yield f"127.0.0.1:{port}"
    finally:
        _kill_sessions(sessions)  # the head's daemons and every node the autoscaler added
        shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_sessions(sessions: list[int]) -> None:
    for sid in sessions:
        for proc in session_processes(sid):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


def autoscaler_request(address: str) -> list[dict]:
    """The bundles the cluster's autoscaler is asked for now (``request_resources``), read from its GCS."""
    from ray._raylet import GcsClient

    raw = GcsClient(address=address).internal_kv_get(b"autoscaler_resource_request", None)
    return json.loads(raw) if raw else []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- packaging cells

HEADER = "from __future__ import annotations\n"  # every artifact's first line

#: A numba CUDA cell as packaging lays it out (header, then the cell's definitions): ``double_all``
#: doubles a list of floats in a kernel; runs on the simulator where there is no GPU.
CUDA_CELL = b"""from __future__ import annotations

import numpy as np
from numba import cuda

@cuda.jit
def _double(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2 * x[i]

def _as_array(values):
    return np.asarray(values, dtype=np.float32)

def double_all(values: list[float]) -> list[float]:
    x = _as_array(values)
    out = np.zeros_like(x)
    _double.forall(x.size)(x, out)
    print("doubled", x.size, "values")
    return out
"""


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def run_cell(cell: str, namespace: dict | None = None) -> dict:
    """What the kernel does before packaging: execute the cell in the user namespace."""
    namespace = {} if namespace is None else namespace
    exec(compile(cell, "<cell>", "exec", dont_inherit=True), namespace)
    return namespace


def pack(cell: str, namespace: dict | None = None, **kwargs) -> PackagedFunction:
    cell = textwrap.dedent(cell)
    return package_cell(cell, run_cell(cell, namespace), **kwargs)


def outputs_text(cell) -> str:
    """An executed notebook cell's outputs as text: streams, plain-text data, and errors as `Name: value`."""
    parts: list[str] = []
    stream = None  # the stream the last part came from, if it was one
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            # A busy kernel may flush one print() in pieces (separate stream outputs): rejoin them as printed.
            if stream == output.get("name"):
                parts[-1] += output["text"]
            else:
                parts.append(output["text"])
            stream = output.get("name")
            continue
        stream = None
        if "data" in output:
            parts.append(output["data"].get("text/plain", ""))
        elif output.get("output_type") == "error":
            parts.append(output["ename"] + ": " + output["evalue"])
    return "\n".join(parts)


# ------------------------------------------------------------- backfills (LanceDB tables)

# A per-row embedding of a text (SCALE replaced by a number: a new version per value).
EMBED = """from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def embed(text: str) -> NDArray[np.float32]:
    return np.array([len(text), float(text[1:]) % 7, SCALE, 1.0], dtype=np.float32)
"""


def table_dir() -> Path:
    # Workers may run as another user: the table's directory must be readable by them.
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="lancefn-backfill-"))
    path.chmod(0o755)
    return path


def batch_record(**fields: Any):
    """A batch as the REST API describes it (``wire.batch_models.Batch``): ``b1``, DONE, of ``model@v1`` with input
    digest ``d``, created at 0, but for ``fields``."""
    from lancefn_jupyter.wire.batch_models import Batch

    defaults = {"batch_id": "b1", "batch_state": "DONE", "name": "model", "version": "v1", "input_digest": "d"}
    return Batch(**{**defaults, "creation_ms": 0, **fields})


def new_table():
    """:func:`make_table` in a directory of its own (:func:`table_dir`): (the directory, the table)."""
    db_dir = table_dir()
    return db_dir, make_table(db_dir)[1]


def make_table(db_dir: Path, name: str = "docs", prefix: str = "t"):
    """Two fragments (tbl.add twice): ids 0–299 then 300–499; texts repeat (t0…t49, or ``prefix``0…), so equal
    inputs sit in distinct rows."""
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(str(db_dir))

    def part(ids):
        return pa.table({"id": ids, "text": [f"{prefix}{i % 50}" for i in ids], "a": [i / 4 for i in ids], "b": ids})

    table = db.create_table(name, part(list(range(300))))
    table.add(part(list(range(300, 500))))
    return db, table


def own_tree(path: Path, uid: int) -> None:
    """``chown -R uid:uid path`` (links themselves, not what they lead to)."""
    for directory, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(directory, name), uid, uid)
    os.chown(path, uid, uid)


TEAM_UID = 61179  # a table root's owner where a test needs one (no passwd entry has it)


def give_to_team(root: Path, uid: int = TEAM_UID) -> None:
    """A namespace's table root as an operator sets it up on a root server: the team's own user owns it (its tables
    included), so the table agent runs as that user (docs/ARCHITECTURE.md, "Backfills", "Which tables"). Nothing to
    do on a server that is not root (its agent runs as itself)."""
    if os.geteuid() == 0:
        let_workers_reach_this_python()  # the agent runs this Python as ``uid``
        own_tree(root, uid)


def team_table_roots(owners: dict[str, int], prefixes: dict[str, str] | None = None) -> Path:
    """Table roots ``<base>/<namespace>`` for ``--table-roots '<base>/{namespace}'``: each holds a LanceDB table
    ``t`` (``make_table``, texts with the namespace's prefix), given to the namespace's uid, mode 0700 (needs root)."""
    base = table_dir()
    for namespace, uid in owners.items():
        root = base / namespace
        root.mkdir()
        make_table(root, "t", prefix=(prefixes or {}).get(namespace, "t"))
        give_to_team(root, uid)
        root.chmod(0o700)
    return base


def wait_backfill(http: httpx.Client, batch_id: str) -> dict:
    """The batch once terminal (long polls of 60 s each, up to DEADLINE_S)."""
    batch = http.post("/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": 60}, timeout=DEADLINE_S + 10).json()
    for _ in range(int(DEADLINE_S / 60) + 1):
        if batch["batch_state"] in ("DONE", "FAILED", "CANCELLED"):
            break
        batch = http.post("/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": 60}, timeout=70).json()
    from lancefn_jupyter.wire.batch_models import Batch

    Batch.from_wire(batch)
    return batch


def column(table, name: str, order: str = "id") -> list:
    data = table.to_arrow().sort_by(order)
    return data.column(name).to_pylist()


# ------------------------------------------------- an in-process control plane, no workers


class RecordingExecutor(Executor):
    """Runs nothing: it keeps the tasks it is given and the jobs it is asked to cancel, and the test plays the
    worker through ``callbacks``."""

    name = "recording"

    def __init__(self) -> None:
        self.tasks: list[TaskSpec] = []
        self.cancelled: list[str] = []

    def start(self, callbacks) -> None:
        self.callbacks = callbacks

    def launch(self, task: TaskSpec) -> None:
        self.tasks.append(task)

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)

    def shutdown(self) -> None:
        pass


def task_spec(job_id: str = "j1", **fields: Any) -> TaskSpec:
    """A task of ``f@v`` (an empty artifact, no rows) on no device, simulated, with no env, but for ``fields``."""
    empty = {"rows": [], "devices": (), "env": {}, "packages": (), "timeout_s": None}
    function = {"name": "f", "version": "v", "artifact": b"", "entrypoint": "f", "simulated": True}
    return TaskSpec(job_id=job_id, **{**function, **empty, "gpu_class": None, "num_gpus": 0, **fields})


def in_process_plane(home: Path, executor: Executor | None, **parts: Any):
    """A started ``ControlPlane`` in this process: its store in ``home``, the simulated default class, ``executor``
    and the other ``parts`` (``environments=``)."""
    from lancefn_jupyter.server.plane import ControlPlane
    from lancefn_jupyter.server.policy.gpu_classes import simulated_default
    from lancefn_jupyter.server.storage.store import Store

    plane = ControlPlane(store=Store(home / "db.sqlite3"), classes=simulated_default(), executor=executor, **parts)
    plane.start()
    return plane


def job_wire(plane, job_id: str) -> dict:
    """An in-process plane's job as the REST API shows it (checked against the wire model)."""
    rec = plane.jobs.record(job_id)
    assert rec is not None
    data = plane.reports.job_wire(rec)
    Job.from_wire(data)
    return data
