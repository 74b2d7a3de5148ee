"""`zinfer serve --replicas N`: engine replicas placed, watched and restarted by Ray.

`RayReplicas` is the router's ReplicaSource (gateway/router.py) on a Ray cluster: it joins
the cluster at `ray_address` (or starts a local Ray instance), makes one CURVE key pair
for the replicas' front doors and one for itself, and creates N named Ray actors
(gateway/replica_actor.py), each asking Ray for the resources its engine uses: `num_cpus`
(the engine's threads) or one GPU. Ray restarts an actor whose process dies
(`max_restarts`, -1: always), on any node with the resources; `locate` waits for it and
returns where its new front door listens.

Ray is the optional `ray` extra and is imported only here, inside functions, when
replicas are asked for; a serve without --replicas never imports it.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import msgspec
import structlog
import trio

from zinfer.actors.engine import EngineConfig
from zinfer.gateway.replica_actor import ReplicaActor, ReplicaInfo, ReplicaKeys
from zinfer.gateway.router_links import ReplicaGone
from zinfer.messages.curve import ClientKeys, KeyPair

log = structlog.get_logger("zinfer.replicas")


class ReplicaOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How many replicas, where, and with what; validated before Ray starts."""

    replicas: int = 1
    ray_address: str = ""  # "": a local Ray instance; else `ray.init(address=...)` (e.g. "auto", "ray://host:10001")
    num_cpus: float = 1.0  # Ray CPUs per replica (the engine's threads)
    num_gpus: float = 0.0  # Ray GPUs per replica (1 for a cuda engine)
    max_restarts: int = -1  # restarts Ray makes of one replica; -1: without end
    host: str = ""  # the address each front door binds ("": its node's address as Ray knows it)
    curve: bool = True  # CURVE on the replicas' front doors (off only for loopback tests)
    namespace: str = "zinfer"

    def validate(self) -> None:
        if not 1 <= self.replicas <= 1024:
            raise ValueError(f"--replicas {self.replicas}: 1..1024")
        if not 0 <= self.num_cpus <= 1024 or not 0 <= self.num_gpus <= 64:
            raise ValueError("per-replica CPUs must lie in 0..1024 and GPUs in 0..64")
        if self.max_restarts < -1:
            raise ValueError(f"max_restarts {self.max_restarts}: -1 (without end) or more")
        if not self.curve and self.host and not self.host.startswith("127."):
            raise ValueError("replicas without CURVE must bind a loopback host")


def replica_resources(config: EngineConfig) -> tuple[float, float]:
    """(CPUs, GPUs) one replica of this engine asks Ray for: one GPU for cuda, else its threads."""
    if config.device.startswith("cuda"):
        return 1.0, 1.0
    threads = getattr(config.device_options, "threads", None)
    return float(threads or 1), 0.0


class RayReplicas:
    """N replicas as Ray actors; the ReplicaSource of the router. `connect()` on the main
    thread, then `start()` and `close()` (blocking: from a thread under trio); `locate` and
    `stop` are trio calls."""

    def __init__(self, options: ReplicaOptions, config: EngineConfig):
        options.validate()
        self.options, self.config = options, config
        self.server = KeyPair.generate()
        self.client = KeyPair.generate()
        self.actors: dict[str, Any] = {}
        self.started_ray = False
        self.prefix = f"zinfer-{uuid.uuid4().hex[:8]}-"  # Ray actor names of this serve's replicas (`ray list actors`)

    @property
    def client_keys(self) -> ClientKeys | None:
        """The router's CURVE keys for the replicas' front doors (None: plain endpoints)."""
        if not self.options.curve:
            return None
        return ClientKeys(self.server.public, self.client.public, self.client.secret)

    def names(self) -> list[str]:
        return [f"replica-{i}" for i in range(self.options.replicas)]

    def connect(self) -> None:
        """Join the Ray cluster at ray_address, or start a local Ray instance (blocking). Call it
        on the main thread: a local instance's processes die with the thread that started them
        (Ray sets PR_SET_PDEATHSIG), and trio's worker threads come and go."""
        try:
            import ray  # the ray extra
        except ImportError:
            raise ValueError("--replicas needs Ray: pip install 'zinfer[ray]'") from None

        o = self.options
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"namespace": o.namespace, "include_dashboard": False,
                                      "log_to_driver": False}
            if o.ray_address:
                kwargs["address"] = o.ray_address
            ray.init(**kwargs)
            self.started_ray = True

    def start(self) -> None:
        """Create every replica actor (they load their models in parallel; blocking); Ray must
        be connected (`connect`)."""
        import ray  # the ray extra

        o = self.options
        keys = ReplicaKeys(self.server.public, self.server.secret, self.client.public) if o.curve else None
        remote = ray.remote(ReplicaActor)
        config_json = msgspec.json.encode(self.config)
        for name in self.names():
            self.actors[name] = remote.options(
                name=self.prefix + name, namespace=o.namespace,
                num_cpus=o.num_cpus, num_gpus=o.num_gpus, max_restarts=o.max_restarts, max_task_retries=0,
                max_concurrency=2, runtime_env={"env_vars": _engine_env(o.num_cpus)},
            ).remote(name, config_json, keys, o.host)
        log.warning("replicas placed", replicas=o.replicas, actors=f"{self.prefix}replica-*", namespace=o.namespace,
                    ray_address=o.ray_address or "local",
                    cpus=o.num_cpus, gpus=o.num_gpus)

    def info(self, name: str, timeout_s: float = 5.0) -> ReplicaInfo:
        """The replica's ReplicaInfo once its engine runs (blocking): Ray holds the call while it
        restarts the actor. ReplicaGone once it was stopped; TimeoutError while it starts, or
        when the call met the actor's death (Ray restarts it, or has given up: locate retries)."""
        import ray  # the ray extra
        from ray.exceptions import GetTimeoutError, RayActorError

        actor = self.actors.get(name)
        if actor is None:
            raise ReplicaGone(name)
        try:
            return msgspec.json.decode(ray.get(actor.info.remote(), timeout=timeout_s), type=ReplicaInfo)
        except (GetTimeoutError, RayActorError) as exc:
            raise TimeoutError(f"{name}: {type(exc).__name__}") from None

    async def locate(self, name: str) -> str:
        """The replica's front door once it is up (waits while Ray starts or restarts it)."""
        while True:
            try:
                return (await trio.to_thread.run_sync(self.info, name, abandon_on_cancel=True)).endpoint
            except TimeoutError as exc:
                log.info("replica not up yet", replica=name, why=str(exc))
                await trio.sleep(0.2)

    async def stop(self, name: str) -> None:
        """Stop the replica for good: Ray does not restart it."""
        actor = self.actors.pop(name, None)
        if actor is not None:
            await trio.to_thread.run_sync(_kill, actor)

    def close(self) -> None:
        """Kill every replica left, and stop Ray if this process started it (blocking)."""
        import ray  # the ray extra

        for actor in self.actors.values():
            _kill(actor)
        self.actors.clear()
        if self.started_ray:
            ray.shutdown()


def _kill(actor: Any) -> None:
    import ray  # the ray extra

    ray.kill(actor, no_restart=True)


def _engine_env(num_cpus: float) -> dict[str, str]:
    """The replica worker's thread counts: BLAS and OpenMP follow its CPUs."""
    n = str(max(1, int(num_cpus)))
    env = {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n}
    if "NUMBA_CACHE_DIR" in os.environ:
        env["NUMBA_CACHE_DIR"] = os.environ["NUMBA_CACHE_DIR"]
    return env
