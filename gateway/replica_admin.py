"""Scaling down the replicas of `zinfer serve --replicas N` while it serves: by SIGUSR1 (one
replica per signal) or over HTTP for autoscalers (KEDA, a Kubernetes operator, a cron job).

- `ReplicaScaler.scale_down(target)` drains replicas for good until `target` take requests
  (None: one fewer), the last by name first, never the last one: each takes no more requests
  at once, finishes what it runs (or hands it over after the router's drain time, as a lost
  replica's streams move) and Ray does not restart it. The drains run in the server's nursery;
  the call returns the names it began to drain.
- `GET /admin/replicas`: every replica's name, whether it is up or draining, its open and
  routed requests. `POST /admin/replicas/scale-down` with an optional JSON body
  `{"replicas": N}` (the count to keep; no body: one fewer): 202 with the replicas now
  draining and those left; 409 when that would drain none (N is not below the count up, or
  one replica is left); 404 when this server does not serve replicas.
- Auth: the routes sit behind `--api-key` like every other path. A server started without a
  key refuses them (403) unless `--admin-without-key` says its network is trusted (a
  loopback bind, a Kubernetes NetworkPolicy), since anyone who reaches them can take the
  service down to one replica.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import structlog
import trio
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zinfer.gateway.openai_api import read_body
from zinfer.gateway.openai_schema import ApiError, parse
from zinfer.gateway.router import Router
from zinfer.gateway.state import GatewayState

log = structlog.get_logger("zinfer.serve")

SCALER = "replica_scaler"
"""GatewayState.extra's key for the serving process's ReplicaScaler (absent: no replicas)."""
OPEN_ADMIN = "admin_without_key"
"""GatewayState.extra's key: True lets the admin routes answer on a server without --api-key."""
MAX_BODY = 1024


class ReplicaScaler:
    """Drains a router's replicas for good, in the nursery given."""

    def __init__(self, router: Router, nursery: trio.Nursery):
        self.router, self.nursery = router, nursery

    def scale_down(self, target: int | None = None) -> list[str]:
        """Begin draining replicas until `target` take requests (None: one fewer; at least one
        is always kept); the names now draining, the last by name first ([]: none)."""
        up = sorted(self.router.up)
        keep = max(1, len(up) - 1 if target is None else target)
        names = up[keep:][::-1]
        if not names:
            log.warning("scale-down refused: one replica left" if len(up) <= 1 else "scale-down refused: "
                        f"{len(up)} replicas up, {target} asked", replicas=up)
        for name in names:
            self.router.table.replicas[name].draining = True  # out of routing now, before its drain task runs
            log.warning("scaling down", replica=name)
            self.nursery.start_soon(self._drain, name)
        return names

    async def _drain(self, name: str) -> None:
        await self.router.drain(name)
        log.warning("scaled down", replica=name, replicas=self.router.up)

    def describe(self) -> list[dict[str, object]]:
        """Each replica: name, up, draining, open and routed requests."""
        return [{"name": r.name, "up": r.up, "draining": r.draining, "open": r.open, "routed": r.routed}
                for r in sorted(self.router.table.replicas.values(), key=lambda r: r.name)]


class ScaleDown(msgspec.Struct, forbid_unknown_fields=True):
    replicas: Annotated[int, Meta(ge=1, le=100_000)] | None = None  # how many to keep; None: one fewer


def routes(state: GatewayState) -> list[Route]:
    def scaler() -> ReplicaScaler:
        if not state.api_key and not state.extra.get(OPEN_ADMIN):
            raise ApiError(403, "admin routes need --api-key (or --admin-without-key on a trusted network)",
                           type="permission_error", code="admin_disabled")
        found = state.extra.get(SCALER)
        if not isinstance(found, ReplicaScaler):
            raise ApiError(404, "this server does not serve replicas (zinfer serve --replicas N)", code="not_found")
        return found

    async def replicas(request: Request) -> Response:
        try:
            return JSONResponse({"replicas": scaler().describe()})
        except ApiError as exc:
            return exc.response()

    async def scale_down(request: Request) -> Response:
        try:
            s = scaler()
            body = await read_body(request, MAX_BODY)
            target = parse(body, ScaleDown).replicas if body.strip() else None
            names = s.scale_down(target)
            if not names:
                raise ApiError(409, f"nothing to drain: {len(s.router.up)} replica(s) take requests and at least one "
                               "is kept", type="conflict_error", code="nothing_to_drain")
            return JSONResponse({"draining": names, "replicas": sorted(s.router.up)}, status_code=202)
        except ApiError as exc:
            return exc.response()

    return [Route("/admin/replicas", replicas, methods=["GET"]),
            Route("/admin/replicas/scale-down", scale_down, methods=["POST"])]


async def scale_down_on_signal(scaler: ReplicaScaler, signum: int) -> None:
    """Each signum begins draining one replica (scale_down())."""
    with trio.open_signal_receiver(signum) as signals:
        async for _ in signals:
            scaler.scale_down()
