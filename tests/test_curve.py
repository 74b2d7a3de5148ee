"""CURVE on ZeroMQ: `zinfer keygen`, a CURVE front door that lets in only listed
clients, the --api-key refusal, and the tcp topology's authenticated actor sockets."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys

import httpx
import pytest
import trio
import zmq
from zmq.utils.monitor import recv_monitor_message

from zinfer.actors.engine import EngineConfig, open_engine
from zinfer.gateway.client import AsyncClient, Client, EngineError
from zinfer.messages.client import Delta, Finished
from zinfer.messages.codec import Codec
from zinfer.messages.curve import ClientKeys, KeyPair, load_public_keys
from zinfer.messages.engine import SchedulerInbox, Shutdown
from zinfer.messages.params import SamplingParams
from tiny import write_tiny_gguf
from http_server import free_port, running_server

GREEDY = SamplingParams(temperature=0, max_tokens=4)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", "llama")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """`zinfer keygen` output, and a client allowlist directory holding only client.key."""
    out = tmp_path_factory.mktemp("keys")
    subprocess.run([sys.executable, "-m", "zinfer.gateway.cli", "keygen", str(out / "k")], check=True,
                   capture_output=True)
    allowed = out / "allowed"
    allowed.mkdir()
    shutil.copy(out / "k" / "client.key", allowed)
    return out / "k", allowed


def zinfer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zinfer.gateway.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_keygen_writes_loadable_keys_with_owner_only_secrets(keys):
    kdir, _ = keys
    for name in ("server", "client"):
        mode = stat.S_IMODE((kdir / f"{name}.key_secret").stat().st_mode)
        assert mode == 0o600, oct(mode)
        pair = KeyPair.load(kdir / f"{name}.key_secret")
        assert load_public_keys(kdir) >= {pair.public}
    client = ClientKeys.load(kdir / "client.key_secret", kdir / "server.key")
    assert client.server_public == KeyPair.load(kdir / "server.key_secret").public
    before = (kdir / "server.key_secret").read_bytes()
    again = zinfer("keygen", str(kdir))
    assert again.returncode == 1 and "exists" in again.stderr
    assert (kdir / "server.key_secret").read_bytes() == before


def generate_text(client: Client) -> list:
    return list(client.generate("hello there", params=GREEDY))


@pytest.mark.slow  # a refused client is seen only by its timeouts: ~15 s
def test_curve_front_door_serves_only_listed_clients(tiny_model, keys):
    kdir, allowed = keys
    authorized = ClientKeys.load(kdir / "client.key_secret", kdir / "server.key")
    stranger = KeyPair.generate()
    with running_server(tiny_model, "--zmq-curve-secret", str(kdir / "server.key_secret"),
                        "--zmq-curve-clients", str(allowed)) as server:
        with Client(server.zmq, ctx=zmq.Context(), timeout_s=120, curve=authorized) as c:
            events = generate_text(c)
        assert isinstance(events[-1], Finished) and any(isinstance(e, Delta) for e in events)

        no_keys = Client(server.zmq, ctx=zmq.Context(), timeout_s=3)
        unknown = Client(server.zmq, ctx=zmq.Context(), timeout_s=3,
                         curve=ClientKeys(authorized.server_public, stranger.public, stranger.secret))
        for refused in (no_keys, unknown):
            with refused, pytest.raises(EngineError):
                generate_text(refused)

        # still healthy: the gateway's inproc client needs no keys, and listed clients get in
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200, r.text
        with Client(server.zmq, ctx=zmq.Context(), timeout_s=120, curve=authorized) as c:
            assert isinstance(generate_text(c)[-1], Finished)


def test_api_key_with_a_reachable_zmq_endpoint_refuses_to_start(tiny_model):
    p = zinfer("serve", "--model", str(tiny_model), "--port", str(free_port()), "--api-key", "K",
               "--zmq", f"tcp://0.0.0.0:{free_port()}")
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--api-key" in lines[0] and "--zmq-curve-secret" in lines[0], p.stderr


def test_api_key_with_a_loopback_zmq_endpoint_starts(tiny_model):
    with running_server(tiny_model, api_key="K") as server:  # running_server binds --zmq on 127.0.0.1
        with Client(server.zmq, ctx=zmq.Context(), timeout_s=120) as c:
            assert isinstance(generate_text(c)[-1], Finished)


HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def push_shutdown(ctx: zmq.Context, address: str, curve: ClientKeys | None) -> zmq.Event:
    """Connect a PUSH to address, send a well-formed Shutdown, return how its first handshake ended."""
    sock = ctx.socket(zmq.PUSH)
    sock.linger = 0
    monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
    monitor.rcvtimeo = 60_000
    if curve is not None:
        curve.apply(sock)
    sock.connect(address)
    sock.send_multipart(Codec(SchedulerInbox).encode(Shutdown()))
    try:
        return zmq.Event(recv_monitor_message(monitor)["event"])
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


def plain_client_generates(address: str) -> bool:
    with Client(address, ctx=zmq.Context(), timeout_s=120) as c:
        return isinstance(generate_text(c)[-1], Finished)


@pytest.mark.slow  # an actor per process: ~5 s
async def test_tcp_topology_lets_no_foreign_socket_reach_an_actor(tiny_model):
    async def generate(client: AsyncClient) -> object:
        async for ev in client.generate("hello there", params=GREEDY):  # noqa: B007 (the loop keeps the last event)
            pass
        return ev

    public = f"tcp://127.0.0.1:{free_port()}"  # no CURVE asked for: stays plain next to the CURVE actor endpoints
    config = EngineConfig(model=str(tiny_model), topology="tcp", zmq_endpoints=(public,))
    async with open_engine(config) as engine, AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        assert engine.addrs.scheduler.startswith("tcp://127.0.0.1:")
        assert isinstance(await generate(client), Finished)
        engine_public = engine.ctx.actor_keys.public
        stranger = KeyPair.generate()
        foreign = zmq.Context()
        try:
            plain = await trio.to_thread.run_sync(push_shutdown, foreign, engine.addrs.scheduler, None)
            # knows the engine's public key, not its secret
            guessed = ClientKeys(engine_public, stranger.public, stranger.secret)
            curve = await trio.to_thread.run_sync(push_shutdown, foreign, engine.addrs.scheduler, guessed)
        finally:
            foreign.destroy(linger=0)
        assert plain != zmq.EVENT_HANDSHAKE_SUCCEEDED and curve == zmq.EVENT_HANDSHAKE_FAILED_AUTH, (plain, curve)
        with trio.fail_after(120):  # the Shutdown never arrived: the scheduler still serves
            assert isinstance(await generate(client), Finished)
        assert all(p.returncode is None for p in engine.actors["processes"].values())
        assert await trio.to_thread.run_sync(plain_client_generates, public)


async def test_async_client_with_listed_keys_gets_in_and_without_gets_nothing(tiny_model, keys):
    kdir, allowed = keys
    public = f"tcp://127.0.0.1:{free_port()}"
    config = EngineConfig(model=str(tiny_model), zmq_endpoints=(public,),
                          zmq_curve_secret=str(kdir / "server.key_secret"), zmq_curve_clients=str(allowed))
    outside = zmq.Context()  # a separate client context, as another program would have
    try:
        async with open_engine(config):
            async with AsyncClient(outside, public,
                                   curve=ClientKeys.load(kdir / "client.key_secret", kdir / "server.key")) as client:
                with trio.fail_after(120):
                    events = [ev async for ev in client.generate("hello there", params=GREEDY)]
                assert isinstance(events[-1], Finished)
            async with AsyncClient(outside, public) as client:
                with trio.move_on_after(3) as waited:
                    events = [ev async for ev in client.generate("hello there", params=GREEDY)]
                assert waited.cancelled_caught
    finally:
        outside.destroy(linger=0)
