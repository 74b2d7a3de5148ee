"""The trio + ZeroMQ socket layer: transports, missed wake-ups, cancellation, close, backpressure."""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid

import numpy as np
import pytest
import trio
import trio.testing
import zmq

from zinfer.messages.bus import COPY_THRESHOLD, AsyncSocket, PeerGone

TRANSPORTS = ["inproc", "ipc", "tcp"]


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.term()  # hangs (and the test times out) if a socket was left open


@pytest.fixture
def ipc_dir():
    d = tempfile.mkdtemp(prefix="zb", dir="/tmp")  # ipc paths must stay under ~100 chars
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _bind_addr(transport: str, ipc_dir: str) -> str:
    if transport == "inproc":
        return f"inproc://{uuid.uuid4().hex}"
    if transport == "ipc":
        return f"ipc://{ipc_dir}/{uuid.uuid4().hex[:8]}"
    return "tcp://127.0.0.1:*"


def _pair(ctx, ipc_dir, transport, bind_type, connect_type, **kw):
    """A bound socket and one connected to it (to LAST_ENDPOINT, so tcp ports are random)."""
    server = AsyncSocket(ctx, bind_type, bind=_bind_addr(transport, ipc_dir), **kw)
    client = AsyncSocket(ctx, connect_type, connect=server.endpoint, **kw)
    return server, client


def _num(i: int) -> bytes:
    return i.to_bytes(4, "little")


def _int(frame) -> int:
    return int.from_bytes(frame, "little")


# ----------------------------------------------------------------------- transports


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_push_pull_multipart_with_large_frame(ctx, ipc_dir, transport):
    pull, push = _pair(ctx, ipc_dir, transport, zmq.PULL, zmq.PUSH)
    arr = np.arange(100_000, dtype=np.float32)
    async with pull, push:
        with trio.fail_after(5):
            await push.send([b"head", arr])
            frames = await pull.recv()
    assert frames[0] == b"head"
    assert isinstance(frames[1], memoryview) and frames[1].readonly
    got = np.frombuffer(frames[1], np.float32)
    assert np.shares_memory(got, np.frombuffer(frames[1], np.uint8))  # wrapped, not copied
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_dealer_router_request_reply(ctx, ipc_dir, transport):
    router, dealer = _pair(ctx, ipc_dir, transport, zmq.ROUTER, zmq.DEALER)
    async with router, dealer:
        with trio.fail_after(5):
            await dealer.send([b"ping", b"x" * (COPY_THRESHOLD * 2)])
            ident, body, big = await router.recv()
            assert body == b"ping" and bytes(big) == b"x" * (COPY_THRESHOLD * 2)
            await router.send([ident, b"pong"])
            assert await dealer.recv() == [b"pong"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_pair_both_directions(ctx, ipc_dir, transport):
    a, b = _pair(ctx, ipc_dir, transport, zmq.PAIR, zmq.PAIR)
    async with a, b:
        with trio.fail_after(5):
            await a.send([b"1"])
            assert await b.recv() == [b"1"]
            await b.send([b"2", b"3"])
            assert await a.recv() == [b"2", b"3"]


# ----------------------------------------------------------------------- wake-ups


@pytest.mark.slow  # 5-8 s a transport
@pytest.mark.parametrize("transport", ["inproc", "tcp"])
async def test_10k_messages_each_way_with_sender_and_receiver_task_per_socket(ctx, ipc_dir, transport):
    """A pipelines numbers to B, B echoes each one back through its own sender task.

    Each socket has one task blocked in send (HWM 4) while another waits in recv: the
    shared edge-triggered FD must wake both. A lost wake-up hangs and fails the limit.
    """
    n = 10_000
    a, b = _pair(ctx, ipc_dir, transport, zmq.DEALER, zmq.DEALER, hwm=4)
    echoed: list[int] = []
    to_echo_send, to_echo_recv = trio.open_memory_channel(4)

    async def a_sender():
        for i in range(n):
            await a.send([_num(i)])

    async def a_receiver():
        for _ in range(n):
            echoed.append(_int((await a.recv())[0]))

    async def b_receiver():
        async with to_echo_send:
            for _ in range(n):
                await to_echo_send.send((await b.recv())[0])

    async def b_sender():
        async with to_echo_recv:
            async for frame in to_echo_recv:
                await b.send([frame])

    async with a, b:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for task in (a_receiver, b_sender, b_receiver, a_sender):
                    nursery.start_soon(task)
    assert echoed == list(range(n))


async def test_recv_finds_messages_queued_before_it_started(ctx, ipc_dir):
    """The FD edge for these messages is consumed before recv runs: waiting first would hang."""
    a, b = _pair(ctx, ipc_dir, "inproc", zmq.PAIR, zmq.PAIR)
    async with a, b:
        for i in range(3):
            a.socket.send(_num(i))
        assert b.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN  # consumes the edge
        with trio.fail_after(2):
            assert [_int((await b.recv())[0]) for _ in range(3)] == [0, 1, 2]


async def test_send_from_other_task_wakes_receiver_waiting_on_same_socket(ctx, ipc_dir):
    """B's receiver waits on the FD; B's own send then consumes the edge of A's message."""
    a, b = _pair(ctx, ipc_dir, "inproc", zmq.PAIR, zmq.PAIR)
    async with a, b:
        with trio.fail_after(2):
            async with trio.open_nursery() as nursery:
                got = []

                async def receive():
                    got.append(await b.recv())

                nursery.start_soon(receive)
                await trio.testing.wait_all_tasks_blocked()
                a.socket.send(b"for-b")  # raw send: nothing on B's side checks EVENTS
                b.send_nowait([b"for-a"])  # B's send processes the command that signalled the FD
            assert got == [[b"for-b"]]
            assert await a.recv() == [b"for-a"]


# ----------------------------------------------------------------------- cancellation, close


async def test_cancelled_recv_leaves_socket_usable(ctx, ipc_dir):
    a, b = _pair(ctx, ipc_dir, "inproc", zmq.PAIR, zmq.PAIR)
    async with a, b:
        with trio.move_on_after(0.05) as scope:
            await b.recv()
        assert scope.cancelled_caught
        await a.send([b"after"])
        with trio.fail_after(2):
            assert await b.recv() == [b"after"]


async def test_cancelling_fd_waiter_hands_the_fd_to_the_parked_sender(ctx, ipc_dir):
    """Receiver waits on the FD, sender parks behind it on a full HWM; cancel the receiver."""
    a, b = _pair(ctx, ipc_dir, "inproc", zmq.PAIR, zmq.PAIR, hwm=1)
    async with a, b:
        sent = 0
        while sent < 100 and a.send_nowait([_num(sent)]):
            sent += 1
        assert 0 < sent < 100
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                recv_scope = trio.CancelScope()
                done = trio.Event()

                async def receiver():
                    with recv_scope:
                        await a.recv()

                async def sender():
                    await a.send([_num(sent)])
                    done.set()

                nursery.start_soon(receiver)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(sender)
                await trio.testing.wait_all_tasks_blocked()
                recv_scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                assert not done.is_set()
                got = [_int((await b.recv())[0]) for _ in range(sent + 1)]
                await done.wait()
        assert got == list(range(sent + 1))
        await b.send([b"back"])
        with trio.fail_after(2):
            assert await a.recv() == [b"back"]


async def test_close_wakes_waiting_receiver_and_sender(ctx, ipc_dir):
    a, b = _pair(ctx, ipc_dir, "inproc", zmq.PAIR, zmq.PAIR, hwm=1)
    while a.send_nowait([b"fill"]):
        pass
    errors = []

    async def wait_on(op):
        try:
            await op()
        except trio.ClosedResourceError as e:
            errors.append(e)

    with trio.fail_after(2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_on, a.recv)
            nursery.start_soon(wait_on, lambda: a.send([b"blocked"]))
            await trio.testing.wait_all_tasks_blocked()
            a.close()
    assert len(errors) == 2
    a.close()  # idempotent
    with pytest.raises(trio.ClosedResourceError):
        await a.recv()
    with pytest.raises(trio.ClosedResourceError):
        a.send_nowait([b"x"])
    b.close()


async def test_second_receiver_task_is_refused(ctx, ipc_dir):
    a, b = _pair(ctx, ipc_dir, "inproc", zmq.PAIR, zmq.PAIR)
    async with a, b:
        with trio.fail_after(2):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(b.recv)
                await trio.testing.wait_all_tasks_blocked()
                with pytest.raises(trio.BusyResourceError):
                    await b.recv()
                await a.send([b"x"])


# ----------------------------------------------------------------------- routing, backpressure, term


async def test_router_to_unknown_identity_raises_peer_gone(ctx, ipc_dir):
    router = AsyncSocket(ctx, zmq.ROUTER, bind=_bind_addr("inproc", ipc_dir))
    dealer = AsyncSocket(ctx, zmq.DEALER, connect=router.endpoint, identity=b"exec-0")
    async with router, dealer:
        with pytest.raises(PeerGone) as info:
            await router.send([b"exec-9", b"lost"])
        assert info.value.identity == b"exec-9"
        with pytest.raises(PeerGone):
            router.send_nowait([b"exec-9", b"lost"])
        with trio.fail_after(2):
            await router.send([b"exec-0", b"found"])  # still usable
            assert await dealer.recv() == [b"found"]


async def test_send_waits_at_hwm_until_the_receiver_reads(ctx, ipc_dir):
    pull, push = _pair(ctx, ipc_dir, "inproc", zmq.PULL, zmq.PUSH, hwm=1)
    async with pull, push:
        queued = 0
        while queued < 100 and push.send_nowait([_num(queued)]):
            queued += 1
        assert 0 < queued < 100  # send_nowait said False once the HWM was reached
        with trio.move_on_after(0.2) as scope:
            await push.send([b"blocked"])
        assert scope.cancelled_caught  # send waited; nothing was sent
        with trio.fail_after(2):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(push.send, [b"last"])
                got = [(await pull.recv())[0] for _ in range(queued + 1)]
        assert got == [_num(i) for i in range(queued)] + [b"last"]


def test_context_term_does_not_hang_after_close_with_unsent_messages():
    ctx = zmq.Context()
    push = AsyncSocket(ctx, zmq.PUSH, connect="tcp://127.0.0.1:9")  # nobody listens
    pair = AsyncSocket(ctx, zmq.PAIR, bind="inproc://term-test")
    peer = AsyncSocket(ctx, zmq.PAIR, connect="inproc://term-test")
    assert peer.send_nowait([b"unread"])
    push.send_nowait([b"unsent"])
    for s in (push, pair, peer):
        s.close()
    t = threading.Thread(target=ctx.term, daemon=True)
    t.start()
    t.join(timeout=2)
    assert not t.is_alive()
