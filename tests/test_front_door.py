"""The front door (actors/front_door_actor.py) under big, bad and late requests, on a tiny random model.

A real in-process engine, real ZeroMQ clients (AsyncClient, raw DEALERs, a tcp client on
the public endpoint) and the real scheduler, executor and sampler behind it.
"""

from __future__ import annotations

import random

import pytest
import trio
import zmq
import zmq.utils.monitor

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.actors.front_door_actor import MAX_PUBLIC_MESSAGE
from zinfer.gateway.client import AsyncClient
from zinfer.messages.bus import AsyncSocket
from zinfer.messages.channel import Outbox
from zinfer.messages.client import (TERMINAL_EVENTS, Cancel, Cancelled, ClientEvent, ClientRequest, Delta, Detokenize,
                                    Failed, Finished, Generate, Rejected, Started, Tokenize, TokenizeResult)
from zinfer.messages.codec import Codec
from zinfer.messages.engine import ActorFailed, SchedulerStats, SeqError, SeqOutput, SeqOutputs, FrontDoorInbox
from zinfer.messages.params import SamplingParams
from tiny import write_tiny_gguf

BIG_CONTEXT = 32768
LONGEST_PIECE = len("<|bos|>")  # the tiny vocabulary's longest piece: a special token's text
WORDS = ["the", "and", "is", "of", "hello", "world", "zebra", "quick", "brown"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny llama whose context holds 32768 tokens (so prompts can be long)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "llama", max_position_embeddings=BIG_CONTEXT)


def words(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


class RawClient:
    """A DEALER that sends raw requests and reads events in arrival order."""

    def __init__(self, ctx: zmq.Context, address: str):
        self.sock = AsyncSocket(ctx, zmq.DEALER, connect=address)
        self.requests, self.events = Codec(ClientRequest), Codec(ClientEvent)

    async def send(self, req) -> None:
        await self.sock.send(self.requests.encode(req))

    async def recv(self):
        with trio.fail_after(60):
            return self.events.decode(await self.sock.recv())

    async def until_terminal(self, rid: str) -> list:
        out = []
        while not (out and isinstance(out[-1], TERMINAL_EVENTS) and out[-1].request_id == rid):
            out.append(await self.recv())
        return [e for e in out if e.request_id == rid]


async def run(client: AsyncClient, **kw) -> list:
    return [ev async for ev in client.generate(**kw)]


async def test_text_cap_refuses_unencodable_lengths_and_never_one_that_fits(tiny_model):
    mml = 256
    async with (open_engine(EngineConfig(model=str(tiny_model), max_model_len=mml)) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        # a 4 MiB prompt: refused at once as too_long, without being encoded
        (ev,) = await run(client, prompt="x" * (4 << 20))
        assert isinstance(ev, Rejected) and ev.code == "too_long" and "characters" in ev.message and ev.n_ctx == mml
        (ev,) = await run(client, prompt="a" * (mml * LONGEST_PIECE + 1))
        assert isinstance(ev, Rejected) and ev.code == "too_long" and "characters" in ev.message
        # the longest piece, written mml - 2 times, plus BOS: mml - 1 tokens fit
        events = await run(client, prompt="<|bos|>" * (mml - 2), params=SamplingParams(max_tokens=1, temperature=0))
        assert isinstance(events[0], Started) and events[0].prompt_tokens == mml - 1, events[0]
        assert isinstance(events[-1], Finished)
        # one more is encoded and refused by its token count
        (ev,) = await run(client, prompt="<|bos|>" * (mml - 1))
        assert isinstance(ev, Rejected) and ev.code == "too_long" and ev.n_prompt_tokens == mml
        # the same cap for chat messages and the tokenize request
        (ev,) = await run(client, messages=[{"role": "user", "content": "x" * (mml * LONGEST_PIECE)}])
        assert isinstance(ev, Rejected) and ev.code == "too_long"
        with pytest.raises(Exception, match="characters"):
            await client.tokenize("x" * (4 << 20))


async def test_a_big_prompt_delays_no_other_stream(tiny_model):
    """While a ~200k-character prompt is encoded, another request keeps streaming."""
    async with open_engine(EngineConfig(model=str(tiny_model), max_model_len=BIG_CONTEXT)) as engine:
        c = RawClient(engine.ctx, engine.addrs.frontend)
        await c.send(Generate("stream", prompt="hello world", params=SamplingParams(max_tokens=4000, ignore_eos=True)))
        while not isinstance(await c.recv(), Delta):
            pass
        big = words(200_000)  # ~140k tokens of the tiny vocabulary: refused after encoding
        await c.send(Generate("big", prompt=big))
        during = []
        while True:
            ev = await c.recv()
            if ev.request_id == "big":
                break
            during.append(ev)
        assert isinstance(ev, Rejected) and ev.code == "too_long" and ev.n_prompt_tokens > BIG_CONTEXT
        assert sum(isinstance(e, Delta) for e in during) >= 5, f"{len(during)} events while the big prompt was encoded"
        # Tokenize and Detokenize of big inputs answer too, with the library's ids
        await c.send(Tokenize("t", text=big[:100_000]))
        (res,) = await c.until_terminal("t")
        assert (isinstance(res, TokenizeResult)
                and res.token_ids == engine.actors["front_door"].prompts.tokenizer.encode(big[:100_000]))
        await c.send(Detokenize("d", token_ids=res.token_ids))
        (text,) = await c.until_terminal("d")
        assert isinstance(text, TokenizeResult) and text.text == big[:100_000]
        await c.send(Cancel("stream"))
        assert isinstance((await c.until_terminal("stream"))[-1], Cancelled)
        c.sock.close()


async def test_cancel_while_tokenizing_and_duplicate_ids(tiny_model):
    async with open_engine(EngineConfig(model=str(tiny_model), max_model_len=BIG_CONTEXT)) as engine:
        c = RawClient(engine.ctx, engine.addrs.frontend)
        await c.send(Generate("a", prompt=words(100_000, seed=1)))
        await c.send(Generate("a", prompt="hello"))  # its id is taken while the first is encoded
        await c.send(Cancel("a"))
        events = [await c.recv()]
        while not isinstance(events[-1], Cancelled):
            events.append(await c.recv())
        assert [type(e) for e in events] == [Rejected, Cancelled], events  # never started
        assert "already in use" in events[0].message
        # the id is free again; nothing else arrives for the cancelled request
        await c.send(Generate("a", prompt="hello", params=SamplingParams(max_tokens=3, temperature=0)))
        events = await c.until_terminal("a")
        assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
        assert sum(isinstance(e, TERMINAL_EVENTS) for e in events) == 1
        c.sock.close()


async def test_largest_seed_with_two_choices(tiny_model):
    def sampled(seed, n=1):
        return dict(params=SamplingParams(seed=seed, n=n, max_tokens=6, ignore_eos=True, temperature=1.0))

    async with (open_engine(EngineConfig(model=str(tiny_model), device="cpu", max_model_len=256)) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        events = await run(client, prompt="hello world", **sampled(2**64 - 1, n=2))
        assert isinstance(events[-1], Finished), events[-1]
        choice = {i: [t for e in events if isinstance(e, Delta) and e.index == i for t in e.token_ids] for i in (0, 1)}
        alone = {}
        for i, seed in ((0, 2**64 - 1), (1, 0)):  # choice 1 samples with seed + 1, wrapped to 0
            alone[i] = [t for e in await run(client, prompt="hello world", **sampled(seed)) if isinstance(e, Delta)
                        for t in e.token_ids]
        assert choice == alone


async def test_requests_after_an_actor_failed_fail_at_once(tiny_model):
    async with (open_engine(EngineConfig(model=str(tiny_model), max_model_len=256)) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        out = Outbox(engine.ctx, engine.addrs.front_door, FrontDoorInbox)
        await out.send(ActorFailed("executor", "process 1 exited with code -9"))
        out.close()
        with trio.fail_after(30):
            while True:  # the failure reaches the tokenizer
                events = await run(client, prompt="hello")
                if not isinstance(events[0], Started):
                    break
                assert isinstance(events[-1], TERMINAL_EVENTS)
        assert [type(e) for e in events] == [Failed] and "executor failed" in events[0].message
        (ev,) = await run(client, prompt="hello again")
        assert isinstance(ev, Failed)


async def test_a_sampling_error_fails_its_request_only(tiny_model):
    async with (open_engine(EngineConfig(model=str(tiny_model), max_model_len=256)) as engine,
                AsyncClient(engine.ctx, engine.addrs.frontend) as client):
        c = RawClient(engine.ctx, engine.addrs.frontend)
        await c.send(Generate("bad", prompt="hello",
                              params=SamplingParams(n=2, max_tokens=256, ignore_eos=True)))  # the whole context
        first = await c.recv()
        assert isinstance(first, Started)
        tok = engine.actors["front_door"]
        (request,) = [r for r in tok.requests.values() if r.request_id == "bad"]
        seq_ids = [ch.seq_id for ch in request.choices]
        out = Outbox(engine.ctx, engine.addrs.front_door, FrontDoorInbox)
        error = SeqError("engine_failed", "NaN in logits")
        failed = SeqOutput(seq_ids[0], [], None, finish_reason="error", error=error)
        await out.send(SeqOutputs([failed], SchedulerStats()))
        out.close()
        events = await c.until_terminal("bad")
        assert isinstance(events[-1], Failed) and events[-1].message == "NaN in logits"
        assert sum(isinstance(e, TERMINAL_EVENTS) for e in events) == 1
        # its other choice was aborted; the engine serves the next request
        events = await run(client, prompt="hello", params=SamplingParams(max_tokens=3, temperature=0))
        assert isinstance(events[-1], Finished)
        with trio.fail_after(30):
            while (await client.stats()).running:
                await trio.sleep(0.05)
        c.sock.close()


async def test_public_endpoint_drops_oversized_messages(tiny_model):
    """A 20 MiB frame on the tcp endpoint: libzmq hangs up on its sender; the next client is answered."""
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    async with open_engine(EngineConfig(model=str(tiny_model), max_model_len=256, zmq_endpoints=(endpoint,))):
        await trio.to_thread.run_sync(_talk_to, endpoint)


def _talk_to(endpoint: str) -> None:
    ctx = zmq.Context()
    try:
        big = ctx.socket(zmq.DEALER)
        big.setsockopt(zmq.LINGER, 0)
        monitor = big.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        big.connect(endpoint)
        assert _next_event(monitor) == zmq.EVENT_CONNECTED
        big.send(b"\x81" + b"x" * (MAX_PUBLIC_MESSAGE + (4 << 20)))  # 20 MiB
        assert _next_event(monitor) == zmq.EVENT_DISCONNECTED
        assert big.poll(0) == 0  # no reply came to it
        big.disable_monitor()
        big.close(0)
        ok = ctx.socket(zmq.DEALER)
        ok.setsockopt(zmq.LINGER, 0)
        ok.connect(endpoint)
        codec = Codec(ClientRequest)
        ok.send_multipart(codec.encode(Tokenize("t", text="hello world")))
        assert ok.poll(60_000), "no answer on a new connection"
        ev = Codec(ClientEvent).decode(ok.recv_multipart())
        assert isinstance(ev, TokenizeResult) and ev.token_ids
        ok.close(0)
        monitor.close(0)
    finally:
        ctx.destroy(linger=0)


def _next_event(monitor: zmq.Socket) -> int:
    assert monitor.poll(60_000), "no socket event"
    return zmq.utils.monitor.recv_monitor_message(monitor)["event"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
