"""An actor that raises inside the in-process engine: every open request still gets its one
terminal event (Failed, naming the actor), before the engine stops. (A round the executor
cannot compute is not such a fault: it fails that round's requests alone, tests/test_round_failure.py.)"""

from __future__ import annotations

import pytest
import trio

from tiny import write_tiny_gguf
from zinfer.gateway.api import EngineConfig, EngineThread
from zinfer.gateway.client import AsyncClient
from zinfer.messages.client import Failed
from zinfer.messages.params import SamplingParams


def _broken_plan(*args, **kwargs):
    raise RuntimeError("scheduler fault")  # stands in for a bug in an actor: this test is about what clients see


async def test_an_actor_that_raises_fails_every_open_request_once(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama")
    thread = EngineThread(EngineConfig(model=str(path), device="cpu", max_running=4)).start()
    thread.engine.actors["scheduler"].policy.plan = _broken_plan
    terminals: list = []
    async with AsyncClient(thread.ctx, thread.address) as client:

        async def one(i: int) -> None:
            async for ev in client.generate(f"hello {i}", params=SamplingParams(max_tokens=4)):
                if isinstance(ev, Failed) or type(ev).__name__ in ("Finished", "Cancelled", "Rejected"):
                    terminals.append(ev)

        with trio.fail_after(30):
            async with trio.open_nursery() as n:
                for i in range(3):
                    n.start_soon(one, i)
    assert len(terminals) == 3 and all(isinstance(ev, Failed) and "scheduler failed" in ev.message
                                       and "scheduler fault" in ev.message for ev in terminals), terminals
    with pytest.raises(ExceptionGroup, match="Trio nursery") as stopped:
        await trio.to_thread.run_sync(thread.stop)  # the engine stopped on the error, and says so
    assert stopped.group_contains(RuntimeError, match="scheduler fault")
