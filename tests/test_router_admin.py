"""Scale-down over HTTP for autoscalers (gateway/replica_admin.py): a real hypercorn server on
build_app with a router over stub replicas, called with httpx; the same auth as every route."""

from __future__ import annotations

from functools import partial

import httpx
import hypercorn.config
import hypercorn.trio
import pytest
import trio
import zmq

from http_server import free_port
from router_stubs import StubReplica
from test_router import GREEDY, PROMPTS, collect, options
from tiny import write_tiny_gguf
from zinfer.gateway.app import build_app
from zinfer.gateway.replica_admin import OPEN_ADMIN, SCALER, ReplicaScaler
from zinfer.gateway.router import Router
from zinfer.gateway.router_links import StaticReplicas
from zinfer.gateway.state import GatewayState
from zinfer.messages.client import Finished
from zinfer.models.loader import open_model
from zinfer.models.prompt import PromptBuilder

KEY = {"Authorization": "Bearer sesame"}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return PromptBuilder.from_source(open_model(write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "t.gguf", "llama")))


async def serving(prompts, api_key: str | None, open_admin: bool, calls) -> list:
    """Run calls(client, router, stubs) against a server over three stub replicas; its result."""
    ctx = zmq.Context()
    stubs = [StubReplica(ctx, prompts) for _ in range(3)]
    state = GatewayState(model_name="tiny", api_key=api_key)
    port = free_port()
    hc = hypercorn.config.Config()
    hc.bind, hc.accesslog = [f"127.0.0.1:{port}"], None
    try:
        async with trio.open_nursery() as nursery:
            for stub in stubs:
                await nursery.start(stub.run)
            await nursery.start(partial(hypercorn.trio.serve, build_app(state), hc))  # type: ignore[arg-type]
            source = StaticReplicas({f"replica-{i}": s.endpoint for i, s in enumerate(stubs)})
            async with Router(ctx, source, options(), prompts) as router:
                await router.wait_up(3)
                state.client = router
                state.extra[SCALER] = ReplicaScaler(router, nursery)
                state.extra[OPEN_ADMIN] = open_admin
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                    with trio.fail_after(10):
                        result = await calls(client, router, source)
            nursery.cancel_scope.cancel()
    finally:
        ctx.destroy(linger=0)
    return result


async def test_scale_down_drains_replicas_for_good_and_keeps_the_last(prompts):
    async def calls(client, router, source):
        out = [await client.post("/admin/replicas/scale-down")]  # no key
        out.append(await client.post("/admin/replicas/scale-down", headers=KEY))  # one fewer: 2 left
        out.append(await client.post("/admin/replicas/scale-down", headers=KEY, json={"replicas": 0}))
        out.append(await client.post("/admin/replicas/scale-down", headers=KEY, json={"replicas": 1}))
        out.append(await client.post("/admin/replicas/scale-down", headers=KEY, json={"replicas": 1}))
        while len(source.endpoints) > 1:  # the drained replicas stop (StaticReplicas forgets them)
            await trio.sleep(0.01)
        out.append(await client.get("/admin/replicas", headers=KEY))
        out.append(await collect(router.generate(PROMPTS[0], params=GREEDY)))
        return out

    unauthorized, one, bad, two, none, listing, served = await serving(prompts, "sesame", False, calls)
    assert unauthorized.status_code == 401
    assert one.status_code == 202 and one.json() == {"draining": ["replica-2"], "replicas": ["replica-0", "replica-1"]}
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "replicas"
    assert two.status_code == 202 and two.json() == {"draining": ["replica-1"], "replicas": ["replica-0"]}
    assert none.status_code == 409 and none.json()["error"]["code"] == "nothing_to_drain"
    states = {r["name"]: (r["up"], r["draining"]) for r in listing.json()["replicas"]}
    assert states == {"replica-0": (True, False), "replica-1": (False, True), "replica-2": (False, True)}
    assert isinstance(served[-1], Finished)


@pytest.mark.parametrize("open_admin", [False, True])
async def test_without_an_api_key_admin_routes_answer_only_when_the_flag_allows(prompts, open_admin):
    async def calls(client, router, source):
        return [await client.post("/admin/replicas/scale-down"), await client.get("/admin/replicas")]

    scaled, listing = await serving(prompts, None, open_admin, calls)
    if open_admin:
        assert scaled.status_code == 202 and listing.status_code == 200
    else:
        assert scaled.status_code == 403 and listing.status_code == 403
        assert scaled.json()["error"]["code"] == "admin_disabled"
