"""The Python API: an engine for trio code (`open_engine` + `AsyncClient`) or plain scripts.

From trio:
    async with open_engine(EngineConfig(model="smollm2-135m")) as engine, \\
               AsyncClient(engine.ctx, engine.addrs.frontend) as client:
        async for event in client.generate("Hello", params=SamplingParams(temperature=0)):
            ...

From a plain script:
    with EngineThread(EngineConfig()) as engine:
        print(engine.complete("The capital of France is", temperature=0, max_tokens=8))
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import trio
import zmq

from zinfer.actors.engine import Engine, EngineConfig, open_engine
from zinfer.gateway.client import AsyncClient, Client, EngineError, MessageIn
from zinfer.messages.client import Delta, Failed, Finished, Rejected
from zinfer.messages.params import SamplingParams

__all__ = ["AsyncClient", "Client", "EngineConfig", "EngineThread", "SamplingParams", "open_engine"]


class EngineThread:
    """An in-process engine running on its own thread (its own trio loop).

    Clients in any thread reach it through `client()` (blocking) or, from another trio
    loop, `AsyncClient(self.ctx, self.address)`. `stop()` shuts it down; an engine that
    fails to start raises from `start()`.
    """

    def __init__(self, config: EngineConfig = EngineConfig()):
        self.config = config
        self.engine: Engine | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="zinfer-engine", daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None

    def start(self) -> "EngineThread":
        self._thread.start()
        self._ready.wait()
        if self.error is not None:
            raise self.error
        return self

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # surfaced by start() or stop()
            self.error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with open_engine(self.config) as engine:
            self.engine = engine
            self._ready.set()
            await self._stop.wait()

    def _started(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("the engine is not running: call start() first")
        return self.engine

    @property
    def ctx(self) -> zmq.Context[zmq.Socket[bytes]]:
        return self._started().ctx

    @property
    def address(self) -> str:
        return self._started().addrs.frontend

    def client(self) -> Client:
        """A blocking client; use one per thread."""
        return Client(self.address, ctx=self.ctx)

    def complete(self, prompt: str | None = None, *, messages: Sequence[MessageIn] | None = None, **params: Any) -> str:
        """Generate and return the whole text (raises EngineError on rejected/failed);
        params: SamplingParams fields."""
        text: list[str] = []
        with self.client() as c:
            for event in c.generate(prompt, messages=messages, params=SamplingParams(**params)):
                if isinstance(event, Delta):
                    text.append(event.text)
                elif isinstance(event, (Rejected, Failed)):
                    raise EngineError(event.message)
                elif isinstance(event, Finished):
                    break
        return "".join(text)

    def stop(self) -> None:
        if self._token is not None and self._stop is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def __enter__(self) -> "EngineThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
