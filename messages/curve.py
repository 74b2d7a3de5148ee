"""ZeroMQ CURVE security: key pairs and key files, CURVE server and client options, and
the ZAP allowlist that decides which client keys a CURVE server lets in.

Two uses, each with its own ZAP domain:

- The public front door (`zinfer serve --zmq tcp://... --zmq-curve-secret ...
  --zmq-curve-clients DIR`): `bind_public` makes those endpoints CURVE servers under
  the server's key pair; only client keys found in DIR's `*.key` files get in.
- The tcp topology: the engine makes one ephemeral key pair per start. Every socket of
  a `CurveContext` that binds an actor endpoint is a CURVE server under it, every
  socket that connects to one is a CURVE client with it, and only that same public key
  is let in, so a process without the key pair gets nothing through.

libzmq asks the ZAP handler of the socket's own context (inproc://zeromq.zap.01) at
each handshake; without a handler every client that knows the server's public key
would be let in, so `CurveContext` runs pyzmq's ThreadAuthenticator (a thread, so it
works next to trio) for as long as the context lives. inproc:// connections carry no
ZMTP handshake and stay open to everyone in the process (the gateway itself).
Keys are Z85 text (40 bytes), as zmq.curve_keypair returns them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Self

import msgspec
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

if TYPE_CHECKING:
    from zmq.sugar.socket import _SocketContext  # what Socket.bind / connect return

ACTORS_DOMAIN = b"zinfer-actors"
"""ZAP domain of the tcp topology's actor sockets: only the engine's own key."""

CLIENTS_DOMAIN = b"zinfer-clients"
"""ZAP domain of the public front door: the keys of --zmq-curve-clients."""


LOOPBACK_PREFIXES = ("tcp://127.", "tcp://localhost:", "tcp://[::1]:", "ipc://", "inproc://")


def is_loopback(endpoint: str) -> bool:
    """Whether only this host can reach a ZeroMQ endpoint (loopback tcp, ipc, inproc)."""
    return endpoint.lower().startswith(LOOPBACK_PREFIXES)


class KeyPair(msgspec.Struct, frozen=True):
    """A CURVE key pair, Z85-encoded (40 bytes each)."""

    public: bytes
    secret: bytes

    @staticmethod
    def generate() -> "KeyPair":
        public, secret = zmq.curve_keypair()
        return KeyPair(public, secret)

    @staticmethod
    def load(secret_file: str | os.PathLike[str]) -> "KeyPair":
        """Read a `NAME.key_secret` certificate (as `zinfer keygen` writes); ValueError if unusable."""
        public, secret = _read_certificate(secret_file)
        if secret is None:
            raise ValueError(f"{secret_file} holds no secret key (use the .key_secret file)")
        return KeyPair(public, secret)


class ClientKeys(msgspec.Struct, frozen=True):
    """What a CURVE client needs: the server's public key and its own key pair."""

    server_public: bytes
    public: bytes
    secret: bytes

    @staticmethod
    def load(secret_file: str | os.PathLike[str], server_public_file: str | os.PathLike[str]) -> "ClientKeys":
        """The client's `.key_secret` file and the server's public `.key` file."""
        own = KeyPair.load(secret_file)
        return ClientKeys(_read_certificate(server_public_file)[0], own.public, own.secret)

    def apply(self, sock: zmq.Socket[object]) -> None:
        """Make sock a CURVE client for the endpoints it connects to from now on."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)


def _read_certificate(path: str | os.PathLike[str]) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read CURVE key file {path}: {exc}") from None
    if not public or len(public) != 40 or (secret is not None and len(secret) != 40):
        raise ValueError(f"{path} is not a CURVE key file (no 40-character Z85 key)")
    return public, secret


def write_keypairs(directory: str | os.PathLike[str], names: tuple[str, ...] = ("server", "client")) -> list[Path]:
    """Write NAME.key (public) and NAME.key_secret (mode 0600) per name into directory.

    Creates the directory (mode 0700) if needed; refuses (FileExistsError) to overwrite
    a key file. Returns the files written.
    """
    out = Path(directory)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    written = [out / f"{name}{suffix}" for name in names for suffix in (".key", ".key_secret")]
    for path in written:
        if path.exists():
            raise FileExistsError(f"{path} exists; not overwriting a key")
    for name in names:
        # created 0600 before any key is in it; create_certificates then rewrites it in place
        os.close(os.open(out / f"{name}.key_secret", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        zmq.auth.create_certificates(out, name)
    return written


def load_public_keys(directory: str | os.PathLike[str]) -> frozenset[bytes]:
    """The public keys of every `*.key` file in directory: the clients to let in.

    ValueError when the directory is missing or holds no key (an allowlist that
    lets nobody in is a mistake, not a policy)."""
    if not os.path.isdir(directory):
        raise ValueError(f"CURVE client key directory {directory} does not exist")
    keys = frozenset(_read_certificate(p)[0] for p in sorted(Path(directory).glob("*.key")))
    if not keys:
        raise ValueError(f"no client public keys (*.key files) in {directory}")
    return keys


def serve_curve(sock: zmq.Socket[object], keys: KeyPair, domain: bytes) -> None:
    """Make sock a CURVE server under keys, checked in ZAP domain, for the endpoints it binds from now on."""
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain)


def bind_public(sock: zmq.Socket[object], endpoints: Iterable[str], keys: KeyPair | None) -> None:
    """Bind the front door's public endpoints: CURVE servers under keys, or plain when None.

    With keys, sock's context must be a CurveContext with a client allowlist: without
    a ZAP handler libzmq would let every client in.
    """
    endpoints = list(endpoints)
    if not endpoints:
        return
    if keys is not None:
        ctx = sock.context
        if not (isinstance(ctx, CurveContext) and ctx.clients is not None):
            raise ValueError("a CURVE public endpoint needs a client allowlist (--zmq-curve-clients)")
        serve_curve(sock, keys, CLIENTS_DOMAIN)
    else:
        sock.setsockopt(zmq.CURVE_SERVER, 0)  # back to NULL if an actor endpoint was bound with CURVE
    for endpoint in endpoints:
        sock.bind(endpoint)


class _Allowlist:
    """ThreadAuthenticator's credentials provider: is this key allowed in this domain?"""

    def __init__(self, keys: frozenset[bytes]) -> None:
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys


class CurveSocket(zmq.Socket[bytes]):
    """A socket of a CurveContext: CURVE on every bind or connect to an actor endpoint."""

    context: CurveContext  # the context that made it (CurveContext._socket_class)

    def bind(self, addr: str) -> _SocketContext[Self]:  # type: ignore[override]  # zmq.Socket's (backend's: None)
        ctx = self.context
        if ctx.actor_keys is not None and addr in ctx.actor_endpoints:
            serve_curve(self, ctx.actor_keys, ACTORS_DOMAIN)
        return super().bind(addr)

    def connect(self, addr: str) -> _SocketContext[Self]:  # type: ignore[override]  # zmq.Socket's (backend's: None)
        ctx = self.context
        if ctx.actor_keys is not None and addr in ctx.actor_endpoints:
            keys = ctx.actor_keys
            ClientKeys(keys.public, keys.public, keys.secret).apply(self)
        return super().connect(addr)


class CurveContext(zmq.Context[CurveSocket]):
    """A zmq.Context that secures the engine's sockets; a plain context when given nothing.

    actor_keys / actor_endpoints: sockets made here that bind or connect one of
    actor_endpoints do so as CURVE server / client under actor_keys, and the ZAP
    handler lets in only actor_keys.public (domain ACTORS_DOMAIN).
    clients: public keys let in on the front door's CURVE endpoints (CLIENTS_DOMAIN).
    The ZAP handler thread runs from construction until destroy() or term().
    """

    _socket_class = CurveSocket
    actor_keys: KeyPair | None = None
    actor_endpoints: frozenset[str] = frozenset()
    clients: frozenset[bytes] | None = None
    _auth: ThreadAuthenticator | None = None

    def __init__(
        self,
        *,
        actor_keys: KeyPair | None = None,
        actor_endpoints: Iterable[str] = (),
        clients: frozenset[bytes] | None = None,
    ) -> None:
        super().__init__()
        self.actor_keys, self.actor_endpoints, self.clients = actor_keys, frozenset(actor_endpoints), clients
        if actor_keys is None and clients is None:
            return
        auth = ThreadAuthenticator(self)
        auth.start()
        if actor_keys is not None:
            auth.configure_curve_callback(ACTORS_DOMAIN.decode(), _Allowlist(frozenset([actor_keys.public])))
        if clients is not None:
            auth.configure_curve_callback(CLIENTS_DOMAIN.decode(), _Allowlist(clients))
        self._auth = auth

    def _stop_auth(self) -> None:
        """Stop the ZAP thread before its sockets go (they belong to that thread)."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def destroy(self, linger: int | None = None) -> None:
        self._stop_auth()
        super().destroy(linger)

    def term(self) -> None:
        self._stop_auth()
        super().term()
