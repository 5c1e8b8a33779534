"""Start a serving cluster on Ray: LlumSched, N instance actors, and the gateway backend."""
from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from llumnix.cluster.instance_actor import InstanceActor
from llumnix.cluster.llumsched import LLUMSCHED_NAME, LlumSchedActor
from llumnix.config.fields import build
from llumnix.config.sections import LiveMigrationConfig
from llumnix.core.errors import LlumnixError
from llumnix.policy import SchedulingConfig
from llumnix.policy.pd import initial_roles


@dataclass(frozen=True)
class ClusterConfig:
    model: str = "smollm2"
    """'smollm2', a .gguf file or a Hugging Face directory."""
    instances: int = 2
    """Instance actors to start."""
    engine: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of each instance's LLM (kv_cache_bytes, max_num_seqs, device, dtype...)."""
    scheduling: SchedulingConfig | dict[str, Any] = field(default_factory=dict)
    """The SchedulingConfig (serve passes it built and checked), or its fields as a dict
    (tests, benchmarks: parsed once by ``start_cluster``, ``pending_grace_s`` 1 s by default)."""
    cms: str | None = None
    """Cluster meta store: None/'memory', or a redis:// URL."""
    ray_address: str | None = None
    """Join this Ray cluster instead of starting a local one."""
    ray_num_cpus: int = 2
    """CPUs of the local Ray cluster."""
    threads_per_instance: int = 1
    """torch intra-op threads of each instance."""
    namespace: str = "llumnix"
    """Ray namespace (named actors live there)."""
    migration: LiveMigrationConfig | dict[str, Any] = field(default_factory=dict)
    """The LiveMigrationConfig (stages, timeout, transport), or its fields as a dict."""
    reschedule_interval_s: float = 0.5
    """Seconds between LlumSched's migration rounds."""
    llumsched_name: str = LLUMSCHED_NAME
    """Name of the LlumSched actor in the namespace (instances find it by this name)."""
    gpus_per_instance: float | None = None
    """GPUs Ray reserves for each instance actor. None: 1 when the engine's device is
    CUDA, else 0. Ray then sets each actor's CUDA_VISIBLE_DEVICES to its own GPU(s), so
    every instance uses device ``cuda`` (its first visible GPU); 0.5 packs two on one GPU."""
    replace_lost_instances: bool = True
    """Start a fresh instance in place of one that died (its requests resume on the others
    meanwhile), so the cluster returns to ``instances``."""
    instance_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each instance actor asks for: with ``{"llumnix_slot": 1}`` and
    one such slot per node (``ray start --resources '{"llumnix_slot": 1}'``), one instance
    per node."""


def instance_gpus(engine: dict[str, Any], gpus_per_instance: float | None = None) -> float:
    """The ``num_gpus`` of an instance actor: without one, Ray pins no GPU and every
    CUDA instance on a node would share its first GPU."""
    if gpus_per_instance is not None:
        if gpus_per_instance < 0:
            raise LlumnixError(f"gpus_per_instance must be >= 0, got {gpus_per_instance:g}")
        return float(gpus_per_instance)
    return 1.0 if str(engine.get("device") or "cpu").startswith("cuda") else 0.0


def ray_gpus() -> float:
    """GPUs in the Ray cluster this process is connected to."""
    return float(ray.cluster_resources().get("GPU", 0))  # type: ignore[no-untyped-call]


def check_gpu_capacity(instances: int, gpus_each: float, available: float) -> None:
    """A one-line error where Ray could never place the instances: an actor asking for
    GPUs that the cluster lacks stays pending forever, and the start would hang."""
    needed = instances * gpus_each
    if needed > available + 1e-9:
        raise LlumnixError(f"{instances} instance(s) x {gpus_each:g} GPU need {needed:g} GPU(s), but the Ray "
                           f"cluster has {available:g}; use --device cpu, fewer --instances or "
                           f"--gpus-per-instance 0.5 to share a GPU")


@dataclass
class Cluster:
    llumsched: Any
    instances: dict[str, Any]
    info: dict[str, Any]
    owned: bool = True
    """Started by this process (``start_cluster``); an attached one (``attach_cluster``)
    is left running by ``shutdown``."""

    def shutdown(self) -> None:
        if not self.owned:
            return
        actors = dict(self.instances)
        with contextlib.suppress(Exception):  # instances started by auto-scaling
            members = ray.get(self.llumsched.members.remote(), timeout=5)
            actors.update({iid: m["handle"] for iid, m in members.items()})
        for a in actors.values():
            with contextlib.suppress(Exception):  # shutting down anyway
                ray.get(a.shutdown.remote(), timeout=10)
            with contextlib.suppress(Exception):  # already dead
                ray.kill(a)
        ray.kill(self.llumsched)


Progress = Callable[[str], None]
"""Where start-up says what it is doing (one line each)."""


def init_ray(cfg: ClusterConfig, progress: Progress | None = None) -> None:
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    t0 = time.monotonic()
    if cfg.ray_address:
        join_ray(cfg.ray_address, cfg.namespace, log_to_driver=True)
    else:
        # Token authentication is Ray's default for the clusters it starts (a token is
        # created under ~/.ray where none exists); join_ray finds it for other processes.
        ray.init(num_cpus=cfg.ray_num_cpus, include_dashboard=False, namespace=cfg.namespace,
                 log_to_driver=True, _system_config=local_ray_config())
        keep_token_private()
    if progress is not None:
        verb = "joined" if cfg.ray_address else "started"
        progress(f"Ray {verb} in {time.monotonic() - t0:.1f} s at {ray_address()} (namespace {cfg.namespace})")


def keep_token_private() -> None:
    """Ray writes the cluster's token to ``~/.ray/auth_token`` readable by every user of the
    machine (0644): anyone who reads it can run code in the cluster. Made 0600 here."""
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    with contextlib.suppress(OSError):  # none, or not ours to change
        if path.is_file() and path.stat().st_mode & 0o077:
            path.chmod(0o600)


def local_ray_config() -> dict[str, Any]:
    """Ray settings for a cluster this process starts (every process in it reads them from
    the GCS): no task events, which feed the dashboard's task list that a cluster started
    here has no dashboard for, and cost every worker a flush to the GCS a second (idle,
    0.2-0.3% of a core in LlumSched and ~0.1% in a gateway). ``RAY_task_events_report_interval_ms``
    in the environment keeps Ray's own setting."""
    if "RAY_task_events_report_interval_ms" in os.environ:
        return {}
    return {"task_events_report_interval_ms": 0}


def ray_address() -> str:
    """The address of the Ray cluster this process is connected to, as ``--ray-address`` takes it."""
    return str(ray.get_runtime_context().gcs_address)


def start_cluster(cfg: ClusterConfig, progress: Progress | None = None) -> Cluster:
    """LlumSched and the instances, each instance registered once it has loaded its model;
    ``progress`` hears Ray's address and each instance's loading."""
    sched_cfg, mig_cfg = scheduling_of(cfg), migration_of(cfg)  # built once, passed whole
    check_pd(cfg, sched_cfg)
    init_ray(cfg, progress)
    # Ray restarts LlumSched if it dies; instances re-register through their next announcement.
    token = secrets.token_bytes(32)  # authenticates KV transfers inside this cluster
    # What LlumSched needs to start more instances (auto-scaling scale-out).
    gpus = instance_gpus(cfg.engine, cfg.gpus_per_instance)
    spec = {"model": cfg.model, "engine": dict(cfg.engine), "scheduling": sched_cfg,
            "threads": cfg.threads_per_instance, "token": token, "migration": mig_cfg,
            "num_gpus": gpus, "resources": dict(cfg.instance_resources), "num_instances": cfg.instances,
            "replace_lost": cfg.replace_lost_instances}
    check_gpu_capacity(cfg.instances, gpus, ray_gpus())
    # (Ray's stubs do not know a decorated class's .options(): hence the ignores.)
    # On this process's node: the instances' nodes may come and go. Soft, so a restart
    # after this node is lost finds another.
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    llumsched = LlumSchedActor.options(name=cfg.llumsched_name, num_cpus=0, max_restarts=-1,  # type: ignore[attr-defined]
                                       max_task_retries=0, scheduling_strategy=here).remote(
        sched_cfg, cfg.cms, reschedule_interval_s=cfg.reschedule_interval_s, instance_spec=spec,
        name=cfg.llumsched_name)
    instances = {}
    for i in range(cfg.instances):
        iid = f"instance-{i}"
        # Named, so a restarted LlumSched finds them again through the meta store.
        instances[iid] = InstanceActor.options(name=f"{cfg.llumsched_name}-{iid}", num_cpus=0, num_gpus=gpus,  # type: ignore[attr-defined]
                                               resources=dict(cfg.instance_resources)).remote(
            iid, cfg.model, dict(cfg.engine), sched_cfg, cfg.llumsched_name, cfg.threads_per_instance,
            token, mig_cfg)
        if progress is not None:
            progress(f"instance {i + 1} of {cfg.instances} loading ({iid}, {cfg.model})")
    try:
        ray.get(llumsched.cluster_info.remote(), timeout=60)
        infos = _wait_ready(instances, progress)
    except ray.exceptions.RayActorError as e:
        for actor in (llumsched, *instances.values()):
            with contextlib.suppress(Exception):
                ray.kill(actor)
        raise LlumnixError(f"an instance failed to start: {_last_line(e)}") from None
    statuses = ray.get([a.status.remote() for a in instances.values()], timeout=60)
    roles = initial_roles(list(instances), sched_cfg.pd)
    ray.get([llumsched.register.remote(s, instances[s.instance_id], roles[s.instance_id]) for s in statuses],
            timeout=60)
    return Cluster(llumsched, instances, infos[0])


def scheduling_of(cfg: ClusterConfig) -> SchedulingConfig:
    """The cluster's scheduling config: as given, or parsed from a dict (with the
    dispatch's ``pending_grace_s`` at 1 s unless set: Ray delivery is not instant)."""
    if isinstance(cfg.scheduling, SchedulingConfig):
        return cfg.scheduling
    d = dict(cfg.scheduling)
    d["dispatch"] = {"pending_grace_s": 1.0, **(d.get("dispatch") or {})}
    return SchedulingConfig.from_dict(d)


def migration_of(cfg: ClusterConfig) -> LiveMigrationConfig:
    """The cluster's live-migration config: as given, or built from a dict (a path-named error)."""
    if isinstance(cfg.migration, LiveMigrationConfig):
        return cfg.migration
    return build(LiveMigrationConfig, dict(cfg.migration), "migration")


def check_pd(cfg: ClusterConfig, sched: SchedulingConfig | None = None) -> None:
    """PD's roles need both pools at the start, and fixed membership: one line otherwise,
    before Ray starts. ``sched``: the config's scheduling, when the caller has built it."""
    sched = scheduling_of(cfg) if sched is None else sched
    pd = sched.pd
    if not pd.is_on:
        return
    try:
        pd.check_instances(cfg.instances)
    except ValueError as e:
        raise LlumnixError(f"scheduling.{e}") from None
    if sched.scaling.enabled:
        raise LlumnixError("scheduling.pd.mode: PD with auto-scaling is not supported (turn one of them off)")


def _wait_ready(instances: dict[str, Any], progress: Progress | None, timeout_s: float = 600) -> list[Any]:
    """Each instance's ``ready()`` info, in order; ``progress`` hears each as it comes."""
    t0 = time.monotonic()
    refs = {a.ready.remote(): (k, iid) for k, (iid, a) in enumerate(instances.items())}
    infos: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        left = timeout_s - (time.monotonic() - t0)
        done, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0))
        if not done:
            raise LlumnixError(f"{len(pending)} instance(s) did not load within {timeout_s:g} s")
        k, iid = refs[done[0]]
        infos[k] = ray.get(done[0])
        if progress is not None:
            progress(f"instance {k + 1} of {len(refs)} loaded in {time.monotonic() - t0:.1f} s ({iid})")
    return infos


def attach_cluster(ray_address: str, namespace: str = "llumnix", llumsched_name: str = LLUMSCHED_NAME,
                   timeout_s: float = 30.0) -> Cluster:
    """A running cluster (its LlumSched and instances), for one more gateway in front of
    it: nothing is started, and ``shutdown`` leaves it running."""
    if not ray.is_initialized():
        join_ray(ray_address, namespace, log_to_driver=False)
    try:
        llumsched = ray.get_actor(llumsched_name)
    except ValueError:
        raise LlumnixError(f"no LlumSched actor {llumsched_name!r} in Ray namespace {namespace!r} "
                           f"at {ray_address!r}: is `llumnix serve` running there?") from None
    # ray.get's stubs cannot see through an actor handle (the overload they pick is a list)
    members: dict[str, dict[str, Any]] = cast(Any, ray.get(llumsched.members.remote(), timeout=timeout_s))
    if not members:
        raise LlumnixError("the cluster has no instance yet")
    instances = {iid: m["handle"] for iid, m in members.items()}
    info = ray.get(next(iter(instances.values())).ready.remote(), timeout=timeout_s)
    info["model_source"] = ray.get(llumsched.model_source.remote(), timeout=timeout_s)
    return Cluster(llumsched, instances, info, owned=False)


def join_ray(ray_address: str, namespace: str, log_to_driver: bool) -> None:
    """``ray.init`` on a running cluster, with one line where it fails. Ray turns on
    token authentication for the clusters it starts (whenever a token exists), but a
    process joining by explicit address sends no token unless ``RAY_AUTH_MODE=token``:
    where that is unset and a token can be found as Ray finds one (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), token mode is turned on here. A
    token sent to a cluster without authentication is ignored."""
    _check_reachable(ray_address)
    has_token = _use_auth_token()
    try:
        ray.init(address=ray_address, namespace=namespace, log_to_driver=log_to_driver)
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.AuthenticationError) as e:
        hint = "" if has_token else (
            f" (if it uses token authentication, set {AUTH_TOKEN_ENV} to its token: `ray get-auth-token` "
            f"on its head prints it; or {AUTH_TOKEN_ENV}_PATH to a file holding it)")
        raise LlumnixError(f"cannot join the Ray cluster at {ray_address!r}: {_last_line(e)}{hint}") from None


AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"


def _use_auth_token() -> bool:
    """Turn on Ray's token mode for this process (and what it starts) where the user
    chose no mode and a token exists; returns whether the process has a token."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]
    except ImportError:  # a Ray without token authentication
        return True
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is None:
        return bool(maybe_enable_token_auth_if_token_available(warn_if_disabled=False))
    if mode.lower() != "token":
        return True  # the user's choice: no hint about tokens
    return bool(AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True))


def _last_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


def _check_reachable(ray_address: str, timeout_s: float = 3.0) -> None:
    """Fail in seconds, with one line, where ``ray.init`` would retry for minutes."""
    import socket

    from ray._private.services import resolve_ip_for_localhost

    addr = ray_address.removeprefix("ray://")
    if addr == "auto" or ":" not in addr:
        return
    host, _, port = addr.rpartition(":")
    # Ray dials a loopback address as this node's IP (its GCS binds that one).
    hosts = dict.fromkeys([host, resolve_ip_for_localhost(host)] if host else [host])
    error: Exception | None = None
    for h in hosts:
        try:
            socket.create_connection((h, int(port)), timeout=timeout_s).close()
            return
        except (OSError, ValueError) as e:
            error = e
    raise LlumnixError(f"cannot reach a Ray cluster at {ray_address!r}: {error}") from None
