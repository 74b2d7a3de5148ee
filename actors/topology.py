"""Where each actor listens: one address per inbox, for inproc, ipc or tcp topologies."""

from __future__ import annotations

import os
import uuid

import msgspec

ACTORS = ("frontend", "front_door", "scheduler", "kv", "executor", "sampler")


class Addresses(msgspec.Struct, frozen=True):
    """ZeroMQ endpoints: `frontend` is the clients' ROUTER, the rest are actor inboxes."""

    frontend: str
    front_door: str
    scheduler: str
    kv: str
    executor: str
    sampler: str

    @staticmethod
    def inproc() -> "Addresses":
        """All actors in one process (one zmq.Context)."""
        tag = uuid.uuid4().hex[:8]
        return Addresses(**{a: f"inproc://zinfer-{tag}-{a}" for a in ACTORS})

    @staticmethod
    def ipc(directory: str) -> "Addresses":
        """Actors in separate processes on this host."""
        return Addresses(**{a: f"ipc://{os.path.join(directory, a)}.sock" for a in ACTORS})

    @staticmethod
    def tcp(host: str, base_port: int) -> "Addresses":
        """Actors on hosts reachable over TCP (consecutive ports from base_port)."""
        return Addresses(**{a: f"tcp://{host}:{base_port + i}" for i, a in enumerate(ACTORS)})

    def with_(self, **changes: str) -> "Addresses":
        return msgspec.structs.replace(self, **changes)
