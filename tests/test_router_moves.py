"""Streams the router cannot simply resend when their replica is lost mid-stream, over stub
replicas on real tcp sockets (tests/router_stubs.py): several choices (n > 1), each unfinished
one continued on its own and merged back under its index, and grammar-constrained streams,
whose continuation carries the tokens sent as the grammar's prefix_ids."""

from __future__ import annotations

import pytest
import trio
import zmq

from router_stubs import StubReplica
from test_router import PROMPTS, collect, options
from tiny import write_tiny_gguf
from zinfer.gateway.router import Router
from zinfer.gateway.router_links import StaticReplicas
from zinfer.messages.client import TERMINAL_EVENTS, Cancelled, ClientEvent, Delta, Finished, Started
from zinfer.messages.params import Constraint, SamplingParams
from zinfer.models.loader import open_model
from zinfer.models.prompt import PromptBuilder

CHOICES = SamplingParams(temperature=0.0, max_tokens=12, n=3, seed=11)
STOP_EVERY = 13  # the stubs end a choice on a token id that is a multiple of it: some choices end early


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return PromptBuilder.from_source(open_model(write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "t.gguf", "llama")))


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def by_choice(events: list[ClientEvent], n: int) -> list[tuple[str, list[int], str | None]]:
    """Per choice index: its text, its token ids and the finish reason its Deltas carried."""
    out: list[tuple[str, list[int], str | None]] = []
    for i in range(n):
        deltas = [e for e in events if isinstance(e, Delta) and e.index == i]
        reasons = [d.finish_reason for d in deltas if d.finish_reason]
        assert len(reasons) <= 1, f"choice {i} ended {len(reasons)} times"
        out.append(("".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids],
                    reasons[0] if reasons else None))
    return out


async def served(ctx, prompts, params: SamplingParams, die_after: int | None,
                 stop_every: int | None = None) -> tuple[list, StubReplica]:
    """Every prompt's events through a router over a replica that dies after die_after deltas in
    all (None: never) and a healthy one; and the healthy stub."""
    dying = StubReplica(ctx, prompts, delay_s=0.002, die_after=die_after, stop_every=stop_every)
    healthy = StubReplica(ctx, prompts, delay_s=0.002, stop_every=stop_every)
    runs: list[list[ClientEvent]] = [[] for _ in PROMPTS]
    async with trio.open_nursery() as nursery:
        await nursery.start(dying.run)
        await nursery.start(healthy.run)
        source = StaticReplicas({"a": dying.endpoint, "b": healthy.endpoint})
        async with Router(ctx, source, options(), prompts) as router:
            await router.wait_up(2)

            async def one(i: int) -> None:
                runs[i] = await collect(router.generate(PROMPTS[i], params=params))

            with trio.fail_after(10):
                async with trio.open_nursery() as inner:
                    for i in range(len(PROMPTS)):
                        inner.start_soon(one, i)
        nursery.cancel_scope.cancel()
    assert (die_after is not None) == dying.dead.is_set()
    return runs, healthy


def one_end(events: list[ClientEvent]) -> ClientEvent:
    assert sum(isinstance(e, Started) for e in events) == 1
    terminals = [e for e in events if isinstance(e, TERMINAL_EVENTS)]
    assert terminals == [events[-1]], terminals
    return events[-1]


async def test_each_unfinished_choice_continues_on_its_own_and_the_stream_reads_as_fault_free(ctx, prompts):
    expected, _ = await served(ctx, prompts, CHOICES, None, STOP_EVERY)
    runs, healthy = await served(ctx, prompts, CHOICES, 25, STOP_EVERY)
    children = [g for g in healthy.seen if "/choice-" in g.request_id]
    assert children and all(g.params.n == 1 for g in children), "no request was split by choice"
    assert any(g.prompt_ids is not None for g in children), "no choice was continued from its tokens"
    assert any(r for ref in expected for *_, r in by_choice(ref, 3) if r == "stop"), "no choice ended early"
    for events, ref in zip(runs, expected):
        end, ref_end = one_end(events), ref[-1]
        assert isinstance(end, Finished) and isinstance(ref_end, Finished)
        assert by_choice(events, 3) == by_choice(ref, 3)  # no gap, no duplicate, same text, per choice
        assert end.finish_reasons == ref_end.finish_reasons
        assert end.usage.completion_tokens == ref_end.usage.completion_tokens
        assert end.usage.prompt_tokens == ref_end.usage.prompt_tokens and end.prompt_ids == ref_end.prompt_ids
    for g in children:  # each choice samples on as the engine seeds it: seed + index
        assert g.params.seed == CHOICES.seed + int(g.request_id.rsplit("-", 1)[1])  # type: ignore[operator]


async def test_a_grammar_stream_continues_with_the_sent_tokens_as_its_grammars_prefix(ctx, prompts):
    params = SamplingParams(temperature=0.0, max_tokens=12, constraint=Constraint("regex", "[ -~]+"))
    expected, _ = await served(ctx, prompts, params, None)
    runs, healthy = await served(ctx, prompts, params, die_after=20)
    continued = [g for g in healthy.seen if g.prompt_ids is not None]
    assert continued, "no grammar stream was continued"
    for g in continued:
        assert g.params.constraint is not None and g.params.constraint.prefix_ids
        assert g.prompt_ids[-len(g.params.constraint.prefix_ids):] == g.params.constraint.prefix_ids
        assert g.params.max_tokens == 12 - len(g.params.constraint.prefix_ids)
    for events, ref in zip(runs, expected):
        assert isinstance(one_end(events), Finished)
        assert by_choice(events, 1) == by_choice(ref, 1)


async def test_cancelling_a_split_request_cancels_every_choice_on_its_replica(ctx, prompts):
    dying = StubReplica(ctx, prompts, delay_s=0.002, die_after=4)
    healthy = StubReplica(ctx, prompts, delay_s=0.02)
    params = SamplingParams(temperature=0.0, max_tokens=50, n=2, seed=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(dying.run)
        await nursery.start(healthy.run)
        source = StaticReplicas({"a": dying.endpoint, "b": healthy.endpoint})
        async with Router(ctx, source, options("load"), prompts) as router:
            await router.wait_up(2)
            router.table.replicas["b"].open = 5  # the load policy sends the request to "a" first
            events: list[ClientEvent] = []
            with trio.fail_after(10):
                async for e in router.generate(PROMPTS[0], params=params, request_id="r1"):
                    events.append(e)
                    if dying.dead.is_set() and isinstance(e, Delta) and len(healthy.seen) == 2:
                        router.cancel("r1")
                while len(healthy.cancelled) < 2:
                    await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    assert isinstance(one_end(events), Cancelled)
    assert healthy.cancelled == {"r1/choice-0", "r1/choice-1"}
