"""What a client sends is range-checked before it can reach an encoder or an actor:
SamplingParams.validate(), the bounds of the public request Structs, and AsyncClient,
which refuses a request the engine could not decode for its caller alone."""

from __future__ import annotations

import math
import re

import msgspec
import pytest
import trio
import trio.testing
import zmq

from zinfer.gateway.client import AsyncClient, EngineError
from zinfer.messages.bus import AsyncSocket
from zinfer.messages.client import ClientEvent, ClientRequest, Finished, Generate, Rejected, Usage
from zinfer.messages.codec import Codec
from zinfer.messages.params import SamplingParams

BAD_PARAMS = [
    # (field, value): each must be refused by validate() with the field named
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", -1.0),
    ("top_p", math.nan),
    ("min_p", math.inf),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", math.nan),
    ("presence_penalty", -math.inf),
    ("frequency_penalty", math.nan),
    ("top_k", 10**30),
    ("top_k", 2**31),
    ("top_k", "5"),
    ("max_tokens", 2**64),
    ("max_tokens", 0),
    ("max_tokens", 1.5),
    ("n", True),
    ("n", 17),
    ("logprobs", 21),
    ("logit_bias", {2**64: 1.0}),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {5: math.nan}),
    ("logit_bias", {5: 101.0}),
    ("logit_bias", {i: 1.0 for i in range(1025)}),
    ("stop_token_ids", [2**31]),
    ("stop_token_ids", list(range(1025))),
    ("stop", ["x" * 513]),
    ("stop", [""]),
    ("stop", ["a"] * 17),
    ("stop", [5]),
    ("ignore_eos", 1),
]


@pytest.mark.parametrize("field,value", BAD_PARAMS, ids=[f"{f}={str(v)[:20]}" for f, v in BAD_PARAMS])
def test_validate_names_the_field_out_of_range(field, value):
    with pytest.raises(ValueError, match=f"invalid value for {field}"):
        SamplingParams(**{field: value}).validate()


def test_validate_takes_the_edges_of_every_range():
    SamplingParams(temperature=0, top_k=2**31 - 1, top_p=1, min_p=1, repetition_penalty=100, presence_penalty=-2,
                   max_tokens=2**31 - 1, logit_bias={i: 100.0 for i in range(1024)}, stop_token_ids=list(range(1024)),
                   stop=["x" * 512] * 16, logprobs=20, n=16).validate()
    for seed in (-(2**63), 2**63 - 1, 2**63, 2**64 - 1, None):
        SamplingParams(seed=seed).validate()


def test_a_seed_outside_64_bits_is_refused_where_it_is_made_or_decoded():
    for seed in (2**64, -(2**63) - 1, 10**30):
        with pytest.raises(ValueError, match="invalid value for seed"):
            SamplingParams(seed=seed)
        with pytest.raises(msgspec.ValidationError, match="seed"):
            msgspec.json.decode(b'{"seed": %d}' % seed, type=SamplingParams)


def test_every_64_bit_seed_crosses_the_wire_unchanged():
    codec = Codec(SamplingParams)
    for seed in (-(2**63), -1, 2**63, 2**64 - 1):
        assert codec.decode(codec.encode(SamplingParams(seed=seed))).seed == seed


BAD_REQUESTS = [
    # (what, request map as a ZeroMQ or stdio client writes it, path in the error)
    ("token id over 64 bits", {"type": "generate", "request_id": "a", "prompt_ids": [2**64 - 1]}, "prompt_ids[0]"),
    ("negative token id", {"type": "detokenize", "request_id": "a", "token_ids": [-1]}, "token_ids[0]"),
    ("long request id", {"type": "generate", "request_id": "r" * 257, "prompt": "Hi"}, "request_id"),
    ("too many messages",
     {"type": "generate", "request_id": "a", "messages": [{"role": "user", "content": "Hi"}] * 1025}, "messages"),
    ("float seed", {"type": "generate", "request_id": "a", "prompt": "Hi", "params": {"seed": 1e30}}, "params.seed"),
    ("top_k over int64", {"type": "generate", "request_id": "a", "prompt": "Hi", "params": {"top_k": 2**64 - 1}},
     "params.top_k"),
    ("logit_bias key over int64",
     {"type": "generate", "request_id": "a", "prompt": "Hi", "params": {"logit_bias": {2**63: 1.0}}},
     "params.logit_bias"),
    # "$" matches before a final newline: the name would reach the prompt and the grammar with it
    ("tool name ending in a newline",
     {"type": "generate", "request_id": "a", "messages": [{"role": "user", "content": "Hi"}],
      "tools": [{"name": "get_weather\n"}]}, "tools[0].name"),
    ("called name ending in a newline",
     {"type": "tokenize", "request_id": "a",
      "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f\n", "arguments": "{}"}}]}]},
     "messages[0].tool_calls[0].function.name"),
]


@pytest.mark.parametrize("what,request_map,path", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_public_requests_are_bounded_as_they_are_decoded(what, request_map, path):
    with pytest.raises(msgspec.ValidationError, match=re.escape(f"`$.{path}`")):
        Codec(ClientRequest).decode([msgspec.msgpack.encode(request_map)])


class FakeFront:
    """A real ROUTER where the engine's front door would be: records what arrives, answers Finished."""

    def __init__(self, ctx: zmq.Context):
        self.sock = AsyncSocket(ctx, zmq.ROUTER, bind="inproc://edge-front")
        self.requests = Codec(ClientRequest)
        self.events = Codec(ClientEvent)
        self.seen: list[ClientRequest] = []

    async def serve(self) -> None:
        while True:
            peer, *frames = await self.sock.recv()
            req = self.requests.decode(frames)
            self.seen.append(req)
            if isinstance(req, Generate):
                await self.sock.send([peer, *self.events.encode(Finished(req.request_id, ["stop"], Usage()))])


async def test_async_client_refuses_an_unencodable_request_for_its_caller_only():
    ctx = zmq.Context()
    front = FakeFront(ctx)
    try:
        async with trio.open_nursery() as nursery, AsyncClient(ctx, "inproc://edge-front") as client:
            nursery.start_soon(front.serve)
            bad = [ev async for ev in client.generate(prompt_ids=[2**64], request_id="bad")]
            assert (len(bad) == 1 and isinstance(bad[0], Rejected) and bad[0].request_id == "bad"
                    and "prompt_ids" in bad[0].message)
            with pytest.raises(EngineError, match="token_ids"):
                await client.detokenize([2**64])
            with pytest.raises(EngineError, match="request_id"):
                client.cancel("x" * 300)
            good = [ev async for ev in client.generate("Hi", request_id="good")]  # the sender is still alive
            assert [type(ev) for ev in good] == [Finished]
            assert [r.request_id for r in front.seen] == ["good"]
            nursery.cancel_scope.cancel()
    finally:
        front.sock.close()
        ctx.term()


async def test_async_client_refuses_an_id_already_open():
    """Before, the second stream took the first one's events and the first waited forever."""
    ctx = zmq.Context()
    front = AsyncSocket(ctx, zmq.ROUTER, bind="inproc://edge-front-2")  # never answers: "same" stays open
    try:
        async with AsyncClient(ctx, "inproc://edge-front-2") as client, trio.open_nursery() as nursery:

            async def first() -> None:
                async for _ in client.generate("Hi", request_id="same"):
                    pass

            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(30):  # before, no event ever came for the second
                second = [ev async for ev in client.generate("Hi", request_id="same")]
            assert len(second) == 1 and isinstance(second[0], Rejected) and "already in use" in second[0].message
            assert "same" in client.streams  # the first is still the one open
            nursery.cancel_scope.cancel()
    finally:
        front.close()
        ctx.term()
