"""One engine replica as a Ray actor: today's engine, started from the serving process's
EngineConfig, with its ZeroMQ front door on a tcp port of the actor's node.

This module imports no Ray: gateway/replicas.py wraps `ReplicaActor` with `ray.remote` when
`zinfer serve --replicas` asks for it, and Ray builds it in a worker process (again after each
restart). The front door is a CURVE server under the key pair the serving process handed
out, and lets in only the serving process's client key, so only the router talks to it.
Keys travel as Ray actor arguments and are written to files only this process can read.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import msgspec

from zinfer.actors.engine import EngineConfig
from zinfer.gateway.api import EngineThread


class ReplicaKeys(msgspec.Struct, frozen=True):
    """The CURVE keys of every replica's front door (Z85): its key pair and the one client let in."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes


class ReplicaInfo(msgspec.Struct, frozen=True):
    """Where one incarnation of a replica listens, and which process it is."""

    name: str
    endpoint: str
    pid: int
    node: str


def free_port(host: str) -> int:
    """A tcp port free on host now (the front door binds it right after)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def write_keys(directory: Path, keys: ReplicaKeys) -> tuple[str, str]:
    """The key files the engine's config names: (server .key_secret file, clients directory)."""
    clients = directory / "clients"
    clients.mkdir(mode=0o700)
    secret = directory / "server.key_secret"
    body = f'metadata\ncurve\n    public-key = "{keys.server_public.decode()}"\n'
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(body + f'    secret-key = "{keys.server_secret.decode()}"\n')
    (clients / "router.key").write_text(f'metadata\ncurve\n    public-key = "{keys.client_public.decode()}"\n')
    return str(secret), str(clients)


class ReplicaActor:
    """A running engine in this (Ray worker) process. Ray calls `info` to learn where it listens."""

    def __init__(self, name: str, config_json: bytes, keys: ReplicaKeys | None, host: str):
        """config_json: the EngineConfig (msgspec JSON); keys: None for a plain endpoint (tests
        on loopback only); host: the address to bind ("" : this node's address as Ray knows it)."""
        import ray  # the ray extra: this module runs only inside a Ray worker

        config = msgspec.json.decode(config_json, type=EngineConfig)
        host = host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._dir = Path(tempfile.mkdtemp(prefix="zinfer-replica-"))
        secret, clients = write_keys(self._dir, keys) if keys is not None else ("", "")
        endpoint = f"tcp://{f'[{host}]' if ':' in host else host}:{free_port(host)}"
        config = msgspec.structs.replace(config, zmq_endpoints=(endpoint,), zmq_curve_secret=secret,
                                         zmq_curve_clients=clients)
        self._engine = EngineThread(config).start()
        self._info = ReplicaInfo(name, endpoint, os.getpid(), host)

    def info(self) -> bytes:
        """This incarnation's ReplicaInfo (msgspec JSON)."""
        return msgspec.json.encode(self._info)

    def stop(self) -> None:
        """Stop the engine (its open requests end; the router has drained it first)."""
        self._engine.stop()
