"""Ray executor: each job is one call on a warm Ray actor of its version; a Ray cluster (KubeRay on Kubernetes) is how users
outgrow one machine.  Operator guide: ``docs/ray.md``.

Three processes take part::

    control plane (RayExecutor)  ──JSON lines──▶  Ray driver ("bridge")  ──Ray──▶  task on a node
      imports no Ray at all      ◀──────────────   ray.init, event hub    ◀──hub──   runs the artifact

* The **bridge** is a child process that is the Ray driver (``ray.init``).  Ray is never loaded
  into the control plane: a lost Ray cluster makes Ray terminate its driver process, and that
  must cost us the bridge, not the server.  The executor restarts the bridge with backoff, and
  fails the jobs that were in flight with a *retryable* ``executor`` failure.  The bridge runs
  in its own session, so whatever local Ray processes it started are swept (by session id)
  when it ends, however it ends.
* Each GPU job runs on an actor asking ``num_gpus`` GPUs plus as many units of the class resource
  ``lancefn_gpu_class:<class>`` (operators label nodes / KubeRay worker groups with it), with its
  version's environment in its ``runtime_env`` (pip packages by the rule in :func:`pip_requirements`, resolved
  over the control plane's packages, in ``uv``; an ``image`` in ``image_uri``: ``environment_runtime_env``); the
  function's ``env`` travels with the task.  Ray queues the actor until a node has room (an autoscaler can
  add one); CPU jobs wait in the bridge for a CPU slot (:mod:`.pool`).  So the executor *owns
  queuing* (``owns_queue``): the core launches at once and the job stays PENDING until the task
  itself reports ``started`` from the node, with the node id and the GPU ids Ray gave it
  (``CUDA_VISIBLE_DEVICES`` is set by Ray from those ids).
* Inside the task the artifact runs in the Ray worker process through
  :func:`lancefn_jupyter.worker.runner.run_task_inline` — the same code as the local warm worker,
  so results, phases and user-only tracebacks are identical.  fds 1/2 are captured for the
  task's duration and streamed as logs.  Events (started, log, progress) go to a small async
  **event hub** actor that the bridge long-polls (flushed every 20 ms; a task that ends sooner
  returns its events inline instead); the outcome comes back as the task's return value, with
  the number of events flushed before it, so the bridge reports the outcome only after the
  last log line.
* Cancel kills the job's actor (``ray.kill``); a timeout (counted from ``started``, like the local
  executor) is an executor-side deadline that kills it and reports ``timeout``.
  Tasks are owned by the bridge, so if the control plane dies Ray stops them (fate sharing) and
  the restarted core re-queues them: nothing runs twice concurrently, nothing is lost.

Every job runs on a **warm actor**: a pool per (class, GPU count, function name and version,
namespace), so a process never runs two versions or namespaces.  A GPU actor holds its GPUs for
its whole life (a CUDA context stays bound to the devices a process first saw, so a plain reused
Ray worker could not be trusted with other GPU ids), runs that version's later jobs one at a
time, and is killed when idle for ``LANCEFN_RAY_ACTOR_IDLE_S`` (default 300 s), when a job of
another key of its class needs the GPUs it sits on, after a crash, or when its job is cancelled
or times out (``ray.kill``: the GPUs are freed; the next job starts a new actor).  CPU actors
hold no CPU while alive; the bridge runs at most the cluster's CPUs' worth of CPU jobs and keeps
at most that many CPU actors (``LANCEFN_RAY_CPU_ACTORS``).

Modules, one per process: ``executor`` (``RayExecutor``, in the control plane), ``feed`` (the bridge's event lines,
read on the control plane's event loop), ``bridge`` (the
Ray driver ``_Driver``), ``task`` (the task body, job actor and event hub, in Ray workers), ``pool`` (the CPU actor
queue, in the bridge) and ``cluster`` (what they share about the cluster: class resources, the local cluster
plan and its temp dir, the sweep of a bridge's processes, pip rules and a version's runtime_env fields).
"""

from lancefn_jupyter.server.executors.ray.cluster import (
    CLASS_RESOURCE_PREFIX,
    class_resource,
    default_temp_dir,
    environment_runtime_env,
    local_cluster_plan,
    pip_requirements,
)
from lancefn_jupyter.server.executors.ray.executor import RayExecutor

__all__ = [
    "CLASS_RESOURCE_PREFIX",
    "RayExecutor",
    "class_resource",
    "default_temp_dir",
    "environment_runtime_env",
    "local_cluster_plan",
    "pip_requirements",
]
