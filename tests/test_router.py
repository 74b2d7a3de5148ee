"""The router (gateway/router.py) over stub replicas on real tcp sockets (tests/router_stubs.py):
streams that lose their replica move without a gap or a duplicate, one terminal event per
request, drain, cancel, and the router's own ZeroMQ front door."""

from __future__ import annotations

import pytest
import trio
import zmq

from router_stubs import StubReplica
from tiny import write_tiny_gguf
from zinfer.gateway.client import AsyncClient
from zinfer.gateway.metrics import Metrics
from zinfer.gateway.router import NO_REPLICA, Router, RouterOptions
from zinfer.gateway.router_links import StaticReplicas
from zinfer.gateway.router_front_door import RouterFrontDoor
from zinfer.gateway.router_policy import RoutePolicy
from zinfer.messages.bus import AsyncSocket
from zinfer.messages.client import (
    TERMINAL_EVENTS,
    Cancelled,
    ClientEvent,
    Delta,
    EngineStats,
    Failed,
    Finished,
    Rejected,
    Started,
)
from zinfer.messages.params import SamplingParams
from zinfer.models.loader import open_model
from zinfer.models.prompt import PromptBuilder
from zinfer.traces.config import TraceConfig
from zinfer.traces.setup import Tracing

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PROMPTS = [f"the router test prompt number {i} " * 3 for i in range(6)]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return PromptBuilder.from_source(open_model(write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "t.gguf", "llama")))


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


async def collect(events) -> list[ClientEvent]:
    return [e async for e in events]


def text_and_ids(events: list[ClientEvent]) -> tuple[str, list[int]]:
    deltas = [e for e in events if isinstance(e, Delta)]
    return "".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids]


async def run_all(router: Router, params: SamplingParams = GREEDY) -> list[list[ClientEvent]]:
    out: list[list[ClientEvent]] = [[] for _ in PROMPTS]

    async def one(i: int) -> None:
        out[i] = await collect(router.generate(PROMPTS[i], params=params))

    async with trio.open_nursery() as nursery:
        for i in range(len(PROMPTS)):
            nursery.start_soon(one, i)
    return out


def options(kind: str = "round_robin", **kw: float) -> RouterOptions:
    return RouterOptions(policy=RoutePolicy(kind=kind, block_size=4), **kw)  # type: ignore[arg-type]


async def reference(ctx, prompts) -> list[tuple[str, list[int]]]:
    """What one healthy replica streams for every prompt."""
    stub = StubReplica(ctx, prompts)
    async with trio.open_nursery() as nursery:
        await nursery.start(stub.run)
        async with Router(ctx, StaticReplicas({"a": stub.endpoint}), options(), prompts) as router:
            await router.wait_up(1)
            runs = await run_all(router)
        nursery.cancel_scope.cancel()
    return [text_and_ids(r) for r in runs]


async def test_streams_continue_on_another_replica_without_gap_or_duplicate(ctx, prompts):
    expected = await reference(ctx, prompts)
    dying = StubReplica(ctx, prompts, delay_s=0.002, die_after=20)  # dies mid-stream under several requests
    healthy = StubReplica(ctx, prompts, delay_s=0.002)
    async with trio.open_nursery() as nursery:
        await nursery.start(dying.run)
        await nursery.start(healthy.run)
        source = StaticReplicas({"a": dying.endpoint, "b": healthy.endpoint})
        async with Router(ctx, source, options(), prompts) as router:
            await router.wait_up(2)
            with trio.fail_after(10):
                runs = await run_all(router)
        nursery.cancel_scope.cancel()
    assert dying.dead.is_set()
    continued = [g for g in healthy.seen if g.prompt_ids is not None]
    assert continued, "no stream was continued from prompt + tokens"
    for events, (text, ids) in zip(runs, expected):
        assert [type(e) for e in events if isinstance(e, TERMINAL_EVENTS)] == [Finished]
        assert isinstance(events[-1], Finished) and sum(isinstance(e, Started) for e in events) == 1
        assert text_and_ids(events) == (text, ids)
        assert events[-1].usage.completion_tokens == GREEDY.max_tokens
        assert events[-1].usage.prompt_tokens == events[0].prompt_tokens  # type: ignore[union-attr]


async def test_a_request_that_streamed_nothing_is_resent_as_it_was(ctx, prompts):
    silent = StubReplica(ctx, prompts, delay_s=5.0)  # admits, then streams nothing before it dies
    healthy = StubReplica(ctx, prompts)
    async with trio.open_nursery() as nursery:
        await nursery.start(silent.run)
        await nursery.start(healthy.run)
        source = StaticReplicas({"a": silent.endpoint, "b": healthy.endpoint})
        async with Router(ctx, source, options("load"), prompts) as router:
            await router.wait_up(2)
            router.table.replicas["b"].open = 5  # the load policy sends the request to "a"
            async with trio.open_nursery() as inner:
                result: list[list[ClientEvent]] = []
                inner.start_soon(lambda: _append(result, collect(router.generate(PROMPTS[0], params=GREEDY))))
                while not silent.seen:
                    await trio.sleep(0.005)
                silent.kill()
        nursery.cancel_scope.cancel()
    events = result[0]
    assert isinstance(events[-1], Finished) and sum(isinstance(e, Started) for e in events) == 1
    assert healthy.seen[0].prompt == PROMPTS[0] and healthy.seen[0].prompt_ids is None


async def _append(out: list, awaitable) -> None:
    out.append(await awaitable)


async def test_with_no_replica_left_a_request_fails_once(ctx, prompts):
    stub = StubReplica(ctx, prompts, delay_s=0.002, die_after=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(stub.run)
        async with Router(ctx, StaticReplicas({"a": stub.endpoint}), options(wait_s=0.3), prompts) as router:
            await router.wait_up(1)
            with trio.fail_after(5):
                events = await collect(router.generate(PROMPTS[0], params=GREEDY))
        nursery.cancel_scope.cancel()
    terminals = [e for e in events if isinstance(e, TERMINAL_EVENTS)]
    assert terminals == [events[-1]] and isinstance(events[-1], Failed) and events[-1].code == NO_REPLICA
    assert len(text_and_ids(events)[1]) == 3  # what was streamed stays streamed, once


async def test_cancel_reaches_the_replica_serving_the_request(ctx, prompts):
    stub = StubReplica(ctx, prompts, delay_s=0.01)
    async with trio.open_nursery() as nursery:
        await nursery.start(stub.run)
        async with Router(ctx, StaticReplicas({"a": stub.endpoint}), options(), prompts) as router:
            await router.wait_up(1)
            events: list[ClientEvent] = []
            with trio.fail_after(5):
                async for e in router.generate(PROMPTS[0], params=GREEDY, request_id="r1"):
                    events.append(e)
                    if isinstance(e, Delta):
                        router.cancel("r1")
        nursery.cancel_scope.cancel()
    assert isinstance(events[-1], Cancelled) and "r1" in stub.cancelled


async def test_drain_finishes_what_runs_and_sends_new_requests_elsewhere(ctx, prompts):
    a, b = StubReplica(ctx, prompts, delay_s=0.01), StubReplica(ctx, prompts)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        source = StaticReplicas({"a": a.endpoint, "b": b.endpoint})
        async with Router(ctx, source, options("load"), prompts) as router:
            await router.wait_up(2)
            router.table.replicas["b"].open = 5
            running: list[list[ClientEvent]] = []
            async with trio.open_nursery() as inner:
                inner.start_soon(lambda: _append(running, collect(router.generate(PROMPTS[0], params=GREEDY))))
                while not a.seen:
                    await trio.sleep(0.005)
                router.table.replicas["b"].open = 0
                inner.start_soon(router.drain, "a")
                await trio.sleep(0.02)
                later = await collect(router.generate(PROMPTS[1], params=GREEDY))
            up_after = router.up
        nursery.cancel_scope.cancel()
    assert isinstance(running[0][-1], Finished) and len(text_and_ids(running[0])[1]) == GREEDY.max_tokens
    assert isinstance(later[-1], Finished) and [g.prompt for g in b.seen] == [PROMPTS[1]]
    assert "a" not in source.endpoints and up_after == ["b"]


async def test_the_routers_zmq_front_door_speaks_the_engine_protocol(ctx, prompts):
    stub = StubReplica(ctx, prompts)
    async with trio.open_nursery() as nursery:
        await nursery.start(stub.run)
        async with Router(ctx, StaticReplicas({"a": stub.endpoint}), options(), prompts) as router:
            await router.wait_up(1)
            door = RouterFrontDoor(ctx, router)
            await nursery.start(door.run)
            async with AsyncClient(ctx, door.address) as one, AsyncClient(ctx, door.address) as two:
                with trio.fail_after(5):
                    first = await collect(one.generate(PROMPTS[0], params=GREEDY, request_id="same"))
                    second = await collect(two.generate(PROMPTS[0], params=GREEDY, request_id="same"))
                    stats = await one.stats()
                async with AsyncSocket(ctx, zmq.DEALER, connect=door.address) as raw:
                    with trio.fail_after(5):
                        await raw.send([b"\x93not a request"])
                        reply = bytes((await raw.recv())[0])
        nursery.cancel_scope.cancel()
    assert all(e.request_id == "same" for e in first + second)
    assert text_and_ids(first) == text_and_ids(second) and isinstance(first[-1], Finished)
    assert stats.kv_blocks == 100 and b"bad_request" in reply


async def test_the_replica_gets_the_router_span_as_its_parent_in_the_clients_trace(ctx, prompts, tmp_path):
    tracing = Tracing(TraceConfig(dir=str(tmp_path)), "router")
    stub = StubReplica(ctx, prompts)
    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with trio.open_nursery() as nursery:
        await nursery.start(stub.run)
        async with Router(ctx, StaticReplicas({"a": stub.endpoint}), options(), prompts, tracing=tracing) as router:
            await router.wait_up(1)
            await collect(router.generate(PROMPTS[0], params=GREEDY, traceparent=f"00-{client_trace}-{client_span}-01"))
        nursery.cancel_scope.cancel()
    tracing.close()
    sent = stub.seen[0].traceparent
    assert sent is not None
    _, trace_id, span_id, _ = sent.split("-")
    assert trace_id == client_trace and span_id != client_span  # the router's span, in the client's trace


async def test_a_full_queue_passes_the_request_to_another_replica_and_the_last_refusal_reaches_the_client(ctx, prompts):
    full, healthy = StubReplica(ctx, prompts, full=True), StubReplica(ctx, prompts)
    async with trio.open_nursery() as nursery:
        await nursery.start(full.run)
        await nursery.start(healthy.run)
        source = StaticReplicas({"a": full.endpoint, "b": healthy.endpoint})
        async with Router(ctx, source, options("load"), prompts) as router:
            await router.wait_up(2)
            router.table.replicas["b"].open = 5  # the load policy tries "a" first
            with trio.fail_after(5):
                served = await collect(router.generate(PROMPTS[0], params=GREEDY))
            await router.drain("b", timeout_s=0)
            with trio.fail_after(5):
                refused = await collect(router.generate(PROMPTS[1], params=GREEDY))
        nursery.cancel_scope.cancel()
    assert len(full.seen) == 2 and isinstance(served[-1], Finished)
    assert [type(e) for e in refused] == [Rejected] and refused[0].code == "queue_full"


def test_metrics_label_each_replicas_gauges_and_show_a_down_one_as_down():
    m = Metrics()
    m.replicas = lambda: {"replica-0": (EngineStats(running=2, kv_used_blocks=7, kv_blocks=64), 11),
                          "replica-1": (None, 4)}
    text = m.render(None)
    assert 'zinfer_replica_up{replica="replica-0"} 1' in text and 'zinfer_replica_up{replica="replica-1"} 0' in text
    assert 'zinfer_replica_kv_used_blocks{replica="replica-0"} 7' in text
    assert 'zinfer_replica_requests_total{replica="replica-1"} 4' in text
    assert 'zinfer_replica_running_sequences{replica="replica-1"}' not in text  # no stats while it is down


async def test_prefix_routing_keeps_a_chats_turns_together_without_a_tokenizer(ctx, prompts):
    stubs = [StubReplica(ctx, prompts) for _ in range(3)]
    policy = RoutePolicy(kind="prefix")  # 64-byte blocks: each system prompt differs within its first
    where: dict[int, list[int]] = {}  # conversation -> the stub of each turn
    async with trio.open_nursery() as nursery:
        for stub in stubs:
            await nursery.start(stub.run)
        source = StaticReplicas({f"r{i}": s.endpoint for i, s in enumerate(stubs)})
        async with Router(ctx, source, RouterOptions(policy=policy), None) as router:  # no tokenizer: text keys
            await router.wait_up(3)
            for i in range(8):
                chat = [{"role": "system", "content": f"You are assistant {i} of eight, and you are terse."}]
                for turn in range(3):
                    chat.append({"role": "user", "content": f"question {turn}"})
                    events = await collect(router.generate(messages=chat, params=GREEDY, request_id=f"c{i}t{turn}"))
                    assert isinstance(events[-1], Finished)
                    where.setdefault(i, []).append(next(n for n, s in enumerate(stubs)
                                                        if any(g.request_id == f"c{i}t{turn}" for g in s.seen)))
                    chat.append({"role": "assistant", "content": text_and_ids(events)[0]})
        nursery.cancel_scope.cancel()
    assert all(len(set(turns)) == 1 for turns in where.values()), where  # every turn where its history is cached
    assert len({turns[0] for turns in where.values()}) > 1, where  # the conversations spread
