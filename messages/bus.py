"""The trio + ZeroMQ socket layer: one class, `AsyncSocket`, for every channel.

pyzmq has no trio integration. libzmq exposes one file descriptor per socket
(`zmq.FD`) that is *edge-triggered* and shared by both directions: it becomes
readable when the socket's internal mailbox receives commands, and any call on the
socket (send, recv, or reading `zmq.EVENTS`) may consume those commands without the
descriptor ever firing again. The rules this module follows, each one a hang we
reproduced when broken:

1. Always try the operation with NOBLOCK (or read `zmq.EVENTS`, which processes the
   same pending commands) first; wait only on EAGAIN or an absent event (waiting on
   the FD first hangs when messages were already queued).
2. Before sleeping, read `zmq.EVENTS`; sleep only if the wanted event is absent.
3. After every send, recv or EVENTS read, look at `zmq.EVENTS` and wake the task
   waiting in the other direction if its event is now present (its edge may have
   been consumed by us).
4. Only one task at a time sits in `trio.lowlevel.wait_readable(fd)`; the task
   waiting in the other direction parks and is woken when that one returns.
5. `close()` calls `trio.lowlevel.notify_closing(fd)` first, so waiters wake with
   `trio.ClosedResourceError` instead of sleeping forever. LINGER is always 0, so
   `Context.term()` never blocks on unsent messages.

Concurrency rule: at most ONE sender task and ONE receiver task per socket at a
time. A second task waiting in the same direction raises `trio.BusyResourceError`.

Zero copy: `send` hands frames of SEND_COPY_MAX bytes or more over with copy=False;
the caller must not mutate a sent buffer afterwards: over inproc:// the receiver's
frame IS the sender's buffer (BENCHMARKS.md, "messages/bus.py", has the costs). Smaller
frames are copied into the message. `recv` returns
small frames as `bytes` and large ones as read-only `memoryview`s over the received
message, which `np.frombuffer` wraps without copying.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio
import zmq

Frame = bytes | memoryview
"""A received frame: bytes when small, a memoryview over the zmq message when large."""

COPY_THRESHOLD = 1024
"""Received frames at least this large are returned as memoryviews, not copied."""


SEND_COPY_MAX = 1 << 20
"""Frames under this many bytes are copied on send (pyzmq's copy_threshold, 64 KiB by
default). A zero-copy frame costs a wake-up of pyzmq's garbage-collector thread when
libzmq releases it, which outweighs the copy below about 1 MiB (BENCHMARKS.md,
"messages/bus.py")."""


# Plain ints: pyzmq's constants are enum members, and each & or | on one builds a new
# member; the socket loop does a dozen of those per message.
_POLLIN, _POLLOUT, _BOTH = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.POLLIN | zmq.POLLOUT)
_EVENTS, _NOBLOCK = int(zmq.EVENTS), int(zmq.NOBLOCK)


ROUTER_POLL_S = 0.001
"""Poll period of a ROUTER send to one peer at its HWM while the socket says writable."""


class PeerGone(Exception):
    """A ROUTER was asked to send to an identity it has no connection for.

    Raised instead of libzmq's silent drop (ROUTER_MANDATORY is always on). The
    message was not sent; the socket stays usable.
    """

    def __init__(self, identity: bytes) -> None:
        super().__init__(f"no peer with identity {identity!r}")
        self.identity = identity


class AsyncSocket:
    """A zmq.Socket driven from trio tasks.

    Construction sets LINGER 0, SNDHWM = RCVHWM = `hwm` (messages), the send copy
    threshold to SEND_COPY_MAX, ROUTER_MANDATORY on ROUTER sockets and `identity`
    (ROUTING_ID) when given, then binds and/or connects. Bind to "tcp://127.0.0.1:*"
    and read `endpoint` for a random port.

    Backpressure: `send` waits while the high-water mark is reached (for every peer,
    or for the addressed peer on a ROUTER); `send_nowait` returns False instead.
    `recv` waits until a message arrives. Waits end early with
    `trio.ClosedResourceError` when the socket is closed, and are cancellable
    without losing or half-sending a message.
    """

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        socket_type: int,
        *,
        bind: str | None = None,
        connect: str | list[str] | None = None,
        hwm: int = 1000,
        identity: bytes | None = None,
    ) -> None:
        sock = ctx.socket(socket_type)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, hwm)
            sock.setsockopt(zmq.RCVHWM, hwm)
            sock.copy_threshold = SEND_COPY_MAX
            if socket_type == zmq.ROUTER:
                sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            if identity is not None:
                sock.setsockopt(zmq.ROUTING_ID, identity)
            if bind is not None:
                sock.bind(bind)
            for addr in [connect] if isinstance(connect, str) else connect or []:
                sock.connect(addr)
        except BaseException:
            sock.close(linger=0)
            raise
        self._sock = sock
        self._fd: int = sock.getsockopt(zmq.FD)  # type: ignore[assignment]  # an int option (pyzmq types int | bytes)
        self._closed = False
        self._wanted = 0  # zmq.POLLIN / POLLOUT bits of the directions now waiting
        self._fd_holder = 0  # the direction whose task sits in wait_readable, or 0
        self._fd_scope: trio.CancelScope | None = None
        self._one_way = socket_type in (zmq.PUSH, zmq.PULL)  # one direction only: one waiting task
        self._lots = {_POLLIN: trio.lowlevel.ParkingLot(), _POLLOUT: trio.lowlevel.ParkingLot()}

    # ----------------------------------------------------------------- properties

    @property
    def socket(self) -> zmq.Socket[bytes]:
        """The wrapped zmq.Socket, for options; never send or recv on it directly."""
        return self._sock

    @property
    def endpoint(self) -> str:
        """The last endpoint bound (zmq.LAST_ENDPOINT), e.g. with the port chosen for '*'."""
        return self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def closed(self) -> bool:
        return self._closed

    # ----------------------------------------------------------------- send

    async def send(self, frames: Sequence[Any]) -> None:
        """Send one multipart message; wait while the high-water mark is reached.

        `frames` are bytes-like objects (bytes, memoryview, contiguous numpy arrays);
        large ones are sent without copying and must not be mutated afterwards.
        Raises PeerGone (ROUTER, unknown identity in frames[0]) and
        trio.ClosedResourceError. On cancellation nothing was sent.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.send_nowait(frames):
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        while True:
            await self._wait(_POLLOUT)
            if self.send_nowait(frames):
                return
            # zmq.EVENTS said writable yet this message's pipe is full: a ROUTER whose
            # addressed peer is at its HWM while others are not. libzmq exposes no
            # per-peer readiness, so poll rather than spin.
            await trio.sleep(ROUTER_POLL_S)

    def send_nowait(self, frames: Sequence[Any]) -> bool:
        """Send one multipart message if the socket can take it now.

        Returns False, sending nothing, when the high-water mark is reached.
        Raises PeerGone and trio.ClosedResourceError like `send`.
        """
        sock = self._live()
        try:
            sock.send_multipart(frames, flags=_NOBLOCK, copy=False)
        except zmq.Again:
            self._wake_ready()
            return False
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                self._wake_ready()
                raise PeerGone(bytes(frames[0])) from None
            raise self._translate(e) from e
        self._wake_ready()
        return True

    # ----------------------------------------------------------------- recv

    async def recv(self) -> list[Frame]:
        """Receive one multipart message, waiting until one arrives.

        Frames under COPY_THRESHOLD bytes are `bytes`; larger ones are read-only
        memoryviews over the received message (no copy). Raises
        trio.ClosedResourceError when the socket is closed. On cancellation no
        message was taken off the socket.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        msg = self.recv_nowait() if self._readable() else None
        if msg is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return msg
        while True:
            await self._wait(_POLLIN)
            msg = self.recv_nowait()
            if msg is not None:
                return msg
            await trio.sleep(ROUTER_POLL_S)  # never seen; guards against a busy loop

    def recv_nowait(self) -> list[Frame] | None:
        """Take one multipart message if one is queued now, else return None."""
        sock = self._live()
        try:
            parts = sock.recv_multipart(flags=_NOBLOCK, copy=False)
        except zmq.Again:
            self._wake_ready()
            return None
        except zmq.ZMQError as e:
            raise self._translate(e) from e
        self._wake_ready()
        return [p.bytes if len(p) < COPY_THRESHOLD else p.buffer.toreadonly() for p in parts]

    # ----------------------------------------------------------------- close

    def close(self) -> None:
        """Close the socket, waking any task waiting on it with ClosedResourceError.

        Unsent messages are dropped (LINGER 0). Idempotent; callable outside trio.
        """
        if self._closed:
            return
        self._closed = True
        try:
            trio.lowlevel.notify_closing(self._fd)
        except RuntimeError:
            pass  # closed outside trio.run: no task can be waiting on it
        for lot in self._lots.values():
            lot.unpark_all()
        self._sock.close(linger=0)

    async def __aenter__(self) -> AsyncSocket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- waiting

    def _live(self) -> zmq.Socket[bytes]:
        if self._closed:
            raise trio.ClosedResourceError("socket was closed")
        return self._sock

    def _translate(self, e: zmq.ZMQError) -> Exception:
        if e.errno in (zmq.ENOTSOCK, zmq.ETERM):
            return trio.ClosedResourceError(f"socket unusable: {e}")
        return e

    def _readable(self) -> bool:
        """Whether zmq.EVENTS says a message is queued. An idle actor's receive asks this
        first: it is cheaper than a recv that raises EAGAIN."""
        self._live()
        try:
            return bool(self._check() & _POLLIN)
        except zmq.ZMQError as e:
            raise self._translate(e) from e

    def _wake_ready(self) -> None:
        """After an operation: wake waiters whose event it may have consumed.

        With nobody waiting there is nothing to do: a task about to wait reads
        zmq.EVENTS itself (unthrottled, so every pending command is processed) first.
        """
        if self._wanted:
            self._check()

    def _check(self) -> int:
        """Read zmq.EVENTS (consuming pending edges) and wake waiters now ready."""
        events: int = self._sock.getsockopt(_EVENTS)  # type: ignore[assignment]  # an int option; no cast() (hot path)
        ready = events & self._wanted
        if ready:
            for flag in (_POLLIN, _POLLOUT):
                if ready & flag:
                    if self._fd_holder == flag and self._fd_scope is not None:
                        self._fd_scope.cancel()
                    else:
                        self._lots[flag].unpark_all()
        return events

    async def _wait(self, flag: int) -> None:
        """Return once zmq.EVENTS has `flag`; the caller then retries its operation.

        Mutates the waiter bookkeeping only; takes nothing off the socket.
        """
        if self._wanted & flag:
            raise trio.BusyResourceError(
                "another task is already waiting to " + ("recv" if flag == _POLLIN else "send")
                + " on this socket (rule: one sender task and one receiver task)"
            )
        self._wanted |= flag
        try:
            while True:
                self._live()
                try:
                    if self._check() & flag:
                        return
                except zmq.ZMQError as e:
                    raise self._translate(e) from e
                if self._fd_holder:
                    await self._lots[flag].park()
                    continue
                self._fd_holder = flag
                try:
                    if self._one_way:  # no task of the other direction to cancel this wait
                        await trio.lowlevel.wait_readable(self._fd)
                    else:
                        with trio.CancelScope() as scope:
                            self._fd_scope = scope
                            await trio.lowlevel.wait_readable(self._fd)
                finally:
                    self._fd_holder = 0
                    self._fd_scope = None
                    # The other direction's task may be parked: let it re-check,
                    # and take over the descriptor if it still has to wait.
                    self._lots[flag ^ _BOTH].unpark_all()
        finally:
            self._wanted &= ~flag
