"""The front door's grammar check: every constraint is measured here and compiled with
the model's vocabulary in the grammar worker (a child process, actors/grammar_worker.py)
before its request is admitted, so a grammar the sampler would reject, or one that would
crash or stall the compiler, is a refusal ("bad_constraint") and never reaches the engine.

- Measuring (actors/grammar_limits.py) runs in a worker thread: linear in the spec's size.
- One worker process, started on the first constrained request (it loads the vocabulary
  first: seconds), checks one grammar at a time within CHECK_SECONDS; a worker that dies or
  overruns is killed, the request refused, and the next check starts a new one.
- Verdicts are kept for the last CACHE_SIZE distinct grammars (clients repeat theirs);
  only the worker's compile outcomes, not an overrun or a crash, which load can cause. A
  constraint with prefix_ids (a continued stream) is checked with them every time: the
  worker advances its grammar over them, and an id the grammar does not allow refuses it.
"""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict

import msgspec
import structlog
import trio

from zinfer.actors.grammar_limits import check_limits
from zinfer.actors.grammar_worker import HEADER, Ready, Reply, Verdict
from zinfer.messages.params import Constraint

log = structlog.get_logger("zinfer.grammar")

CHECK_SECONDS = 5.0
"""How long one grammar may take to compile and give its first mask in the worker."""
START_SECONDS = 120.0
"""How long the worker may take to start and load the vocabulary (a load takes seconds, more under
load: BENCHMARKS.md, "actors/grammar_vocab.py")."""
CACHE_SIZE = 256


class GrammarChecker:
    """Checks constraints for one model (path or known name, as the engine opened it)."""

    def __init__(self, model: str, check_seconds: float = CHECK_SECONDS):
        self.model, self.check_seconds = model, check_seconds
        self._proc: trio.Process | None = None
        self._lock = trio.Lock()
        self._verdicts: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
        self._decoder = msgspec.msgpack.Decoder(Reply)

    async def check(self, constraint: Constraint) -> Constraint:
        """The constraint to admit (GBNF converted to Lark); ValueError saying why the
        grammar is refused."""
        key = (constraint.kind, constraint.spec)
        verdict = None if constraint.prefix_ids else self._verdicts.get(key)  # a prefix's verdict is not kept
        if verdict is None:
            await trio.to_thread.run_sync(check_limits, constraint)
            async with self._lock:
                verdict, compiled = await self._ask(constraint)
            if compiled and not constraint.prefix_ids:  # an overrun or a crash may go otherwise: not kept
                self._verdicts[key] = verdict
                if len(self._verdicts) > CACHE_SIZE:
                    self._verdicts.popitem(last=False)
        else:
            self._verdicts.move_to_end(key)
        if not verdict.ok:
            raise ValueError(verdict.message)
        assert verdict.constraint is not None
        return verdict.constraint

    async def _ask(self, constraint: Constraint) -> tuple[Verdict, bool]:
        """The worker's verdict on constraint and True, or a refusal of ours and False when
        the worker died or overran (it is then stopped; the next check starts another). A
        check cancelled midway stops the worker too: its late reply must not answer the next."""
        proc = await self._worker()
        reply = None
        try:
            with trio.move_on_after(self.check_seconds) as deadline:
                try:
                    assert proc.stdin is not None
                    body = msgspec.msgpack.encode(constraint)
                    await proc.stdin.send_all(HEADER.pack(len(body)) + body)
                    reply = await self._read(proc)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    reply = None
        except BaseException:
            await self._stop(proc)
            raise
        if isinstance(reply, Verdict):
            return reply, True
        await self._stop(proc)
        if deadline.cancelled_caught:
            log.warning(
                "grammar worker overran", kind=constraint.kind, bytes=len(constraint.spec), seconds=self.check_seconds)
            why = f"the grammar took longer than {self.check_seconds:g} s to compile; simplify it"
            return Verdict(False, why), False
        log.warning(
            "grammar worker died on a grammar",
            kind=constraint.kind,
            bytes=len(constraint.spec),
            returncode=proc.returncode,
        )
        return Verdict(False, "the grammar is too complex to compile (the compiler failed on it); simplify it"), False

    async def _worker(self) -> trio.Process:
        """The running worker, started (and its vocabulary loaded) if there is none."""
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        cmd = [sys.executable, "-m", "zinfer.actors.grammar_worker", self.model]
        proc = await trio.lowlevel.open_process(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        with trio.move_on_after(START_SECONDS):
            first = await self._read(proc)
            if isinstance(first, Ready):
                self._proc = proc
                return proc
            await self._stop(proc)
            if isinstance(first, Verdict):
                raise ValueError(first.message)
            raise ValueError("constraints are unavailable: the grammar worker did not start")
        await self._stop(proc)
        raise ValueError("constraints are unavailable: the grammar worker did not start in time")

    async def _read(self, proc: trio.Process) -> Reply | None:
        """The worker's next frame, or None when its output ended."""
        assert proc.stdout is not None
        head = await _read_exactly(proc.stdout, HEADER.size)
        body = await _read_exactly(proc.stdout, HEADER.unpack(head)[0]) if head is not None else None
        return self._decoder.decode(body) if body is not None else None

    async def _stop(self, proc: trio.Process) -> None:
        if self._proc is proc:
            self._proc = None
        with trio.CancelScope(shield=True):
            proc.kill()
            await proc.wait()

    async def aclose(self) -> None:
        """Stop the worker, if one runs."""
        if self._proc is not None:
            await self._stop(self._proc)


async def _read_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
