"""The sampler actor: turns each round's logits into tokens, per request parameters.

Per-sequence state (seeded generator, penalty counts) arrives as sampler updates that
ride along with the round, so it is always in place before the logits that need it.

One request's failure is its own: an exception while setting up or sampling one
sequence (bad parameters, logits that are not finite) becomes an error sample for that
sequence, which the scheduler ends; the other rows of the round are sampled as usual.

Constrained requests (params.constraint) get a GrammarMask (actors/constraints.py) built
on the model's vocabulary as llguidance reads it, made once per actor from `source` on the
first constrained request. Masks are compiled in a worker thread on a large stack
(constraints.on_thread) before their round is sampled; their next masks are computed in a
worker thread right after a round is sampled, while the executors run the next forward,
and awaited only when that round's logits arrive.
"""

from __future__ import annotations

import time

import numpy as np
import structlog
import trio
import zmq
from llguidance import LLTokenizer

from zinfer.actors.constraints import COMPILE_STACK, ConstraintError, GrammarMask, MaskPrefetch, on_thread
from zinfer.actors.grammar_vocab import grammar_tokenizer
from zinfer.actors.sampling import RequestSampler
from zinfer.actors.speculation_verify import candidates_sampler, full_row_sampler, verify_rows
from zinfer.actors.topology import Addresses
from zinfer.messages.channel import Inbox, Outbox
from zinfer.messages.engine import (
    CONSTRAINT_FAILURE, RoundLogits, SamplerAdd, SamplerInbox, Sampled, SchedulerInbox, SeqError, Shutdown, TokenSample,
)
from zinfer.models.loader import ModelSource
from zinfer.traces.setup import Tracing

log = structlog.get_logger("zinfer.sampler")


class SamplerActor:
    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        addrs: Addresses,
        vocab_size: int,
        tracing: Tracing | None = None,
        source: ModelSource | None = None,
    ):
        self.vocab_size = vocab_size
        self.tracing = tracing  # None: tracing off
        self.source = source  # the ModelSource whose vocabulary constraints are compiled for; None: constraints fail
        # llguidance's LLTokenizer (or the exception building it raised), once needed
        self.grammar_tokenizer: LLTokenizer | Exception | None = None
        self.prefetch = MaskPrefetch()
        self.samplers: dict[int, RequestSampler] = {}
        self.inbox: Inbox[SamplerInbox] = Inbox(ctx, addrs.sampler, SamplerInbox)
        self.to_scheduler: Outbox[SchedulerInbox] = Outbox(ctx, addrs.scheduler, SchedulerInbox)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:  # holds the mask prefetch's worker
                while True:
                    msg = await self.inbox.recv()
                    if isinstance(msg, Shutdown):
                        return
                    await self.prefetch.wait()
                    await self._load_grammar_tokenizer(msg)
                    grammars: dict[int, GrammarMask | Exception] = {}  # no thread hop per plain round
                    if adds_constraint(msg):
                        grammars = await trio.to_thread.run_sync(self.build_grammars, msg)
                    t0 = time.time_ns()
                    sampled = self.sample_round(msg, grammars)
                    if self.tracing is not None and msg.traceparents:
                        attrs = {"sampled_round": msg.round_id, "rows": len(msg.seq_ids), "seq_ids": msg.seq_ids}
                        self.tracing.record("sample", msg.traceparents[0], attrs, msg.traceparents[1:], t0)
                    await self.to_scheduler.send(sampled)
                    self.prefetch.start(nursery, [s.grammar for s in self.samplers.values() if s.grammar is not None])
        finally:
            self.inbox.close()
            self.to_scheduler.close()

    def build_grammars(self, msg: RoundLogits) -> dict[int, GrammarMask | Exception]:
        """The grammar mask (or the exception building it raised) of each constrained
        sequence the round adds, compiled on a COMPILE_STACK thread. Blocks for as long as
        llguidance compiles: call it in a worker thread."""
        out: dict[int, GrammarMask | Exception] = {}
        for u in msg.sampler_updates:
            if isinstance(u, SamplerAdd) and u.params.constraint is not None:
                try:
                    out[u.seq_id] = on_thread(
                        COMPILE_STACK, GrammarMask, self._grammar_tokenizer(), u.params.constraint, self.vocab_size)
                except ValueError as e:  # this request's alone
                    out[u.seq_id] = ConstraintError(str(e))
                except Exception as e:
                    out[u.seq_id] = e
        return out

    def sample_round(self, msg: RoundLogits, grammars: dict[int, GrammarMask | Exception] | None = None) -> Sampled:
        """Apply the round's sampler updates, then sample one token per logits row and per
        candidates row. grammars: build_grammars(msg), built here when not given.

        A sequence whose set-up or sampling raises gets TokenSample(seq_id, -1,
        error=...) instead of a token; its state is dropped. Mutates self.samplers.
        """
        grammars = self.build_grammars(msg) if grammars is None else grammars
        tokens, failed = [], set()
        for u in msg.sampler_updates:
            if isinstance(u, SamplerAdd):
                try:
                    sampler = RequestSampler(u.params, u.prompt_ids, self.vocab_size, u.seq_id)
                    grammar = grammars.get(u.seq_id)
                    if isinstance(grammar, Exception):
                        raise grammar
                    sampler.grammar = grammar
                    self.samplers[u.seq_id] = sampler
                except Exception as e:  # bad parameters, a bad constraint: this request only
                    tokens.append(self._failure(u.seq_id, e))
                    failed.add(u.seq_id)
            else:
                self.samplers.pop(u.seq_id, None)
        drafts = {d.seq_id: d.token_ids for d in msg.drafts}
        q = {d.seq_id: d.probs for d in msg.drafts if d.probs is not None}  # a draft model's proposal distributions
        for row, seq_id, n in _row_runs(msg.seq_ids, drafts):
            if seq_id in failed:
                continue
            try:
                if seq_id in drafts:
                    tokens += self._verify(seq_id, drafts[seq_id], msg.logits[row : row + n], None, q.get(seq_id))
                else:
                    tokens.append(self._sample_row(seq_id, msg.logits[row]))  # [vocab]
            except Exception as e:  # non-finite logits, a broken row: this request only
                tokens.append(self._failure(seq_id, e))
        c = msg.candidates
        for row, seq_id, n in _row_runs(c.seq_ids if c is not None else [], drafts):
            if seq_id in failed:
                continue
            assert c is not None  # only candidates have these rows
            try:
                if seq_id in drafts:
                    rows = (c.ids[row : row + n], c.values[row : row + n], c.row_max[row : row + n])
                    tokens += self._verify(seq_id, drafts[seq_id], None, rows, q.get(seq_id))
                else:
                    # ids, values [K] each
                    tokens.append(self._sample_candidates(seq_id, c.ids[row], c.values[row], float(c.row_max[row])))
            except Exception as e:
                tokens.append(self._failure(seq_id, e))
        return Sampled(msg.round_id, tokens)

    def _verify(self, seq_id: int, draft: list[int], logits: np.ndarray | None,
                candidates: tuple[np.ndarray, np.ndarray, np.ndarray] | None, q: np.ndarray | None = None
                ) -> list[TokenSample]:
        """Verify seq_id's draft against its len(draft) + 1 rows: full logits [k + 1, vocab], or
        candidates (ids, values [k + 1, K], row_max [k + 1]); q: the draft's proposal
        distributions [k, draft vocab] (None: point masses); its kept tokens, recorded."""
        sampler = self.samplers.get(seq_id)
        if sampler is None:
            raise ValueError(f"no sampling state for seq {seq_id}")
        if logits is not None:
            kept = verify_rows(sampler, draft, full_row_sampler(sampler, logits, q))
        else:
            assert candidates is not None
            kept = verify_rows(sampler, draft, candidates_sampler(sampler, *candidates, q))
        return [TokenSample(seq_id, s.token_id, s.logprob, s.top_logprobs) for s in kept]

    async def _load_grammar_tokenizer(self, msg: RoundLogits) -> None:
        """Build llguidance's view of the vocabulary in a worker thread (seconds: the event
        loop keeps serving the other actors) if this round brings the first constrained request."""
        if not adds_constraint(msg) or self.grammar_tokenizer is not None or self.source is None:
            return
        t0 = time.perf_counter()
        try:
            self.grammar_tokenizer = await trio.to_thread.run_sync(grammar_tokenizer, self.source)
        except Exception as e:  # the constrained requests fail with it; free ones carry on
            self.grammar_tokenizer = e
            log.warning("grammar tokenizer failed", error=str(e))
            return
        log.info(
            "grammar tokenizer built",
            vocab=self.grammar_tokenizer.vocab_size,
            eos_ids=self.grammar_tokenizer.eos_tokens,
            ms=round((time.perf_counter() - t0) * 1e3),
        )

    def _grammar_tokenizer(self) -> LLTokenizer:
        """The LLTokenizer constraints compile against; raises why there is none."""
        tok = self.grammar_tokenizer
        if tok is None:
            raise ValueError("constraints need the model's vocabulary, which this sampler was not given")
        if isinstance(tok, Exception):
            raise ValueError(f"constraints are unavailable: the model's vocabulary did not load into llguidance: {tok}")
        return tok

    def _sample_candidates(self, seq_id: int, ids: np.ndarray, values: np.ndarray, row_max: float) -> TokenSample:
        """Sample and record one token of seq_id from its row's candidates ids, values [K]."""
        sampler = self.samplers.get(seq_id)
        if sampler is None:
            raise ValueError(f"no sampling state for seq {seq_id}")
        s = sampler.sample_candidates(ids, values, row_max)
        sampler.accept(s.token_id)
        return TokenSample(seq_id, s.token_id)

    def _sample_row(self, seq_id: int, logits: np.ndarray) -> TokenSample:
        """Sample and record one token of seq_id from its logits row [vocab]."""
        sampler = self.samplers.get(seq_id)
        if sampler is None:
            raise ValueError(f"no sampling state for seq {seq_id}")
        s = sampler.sample(logits)
        sampler.accept(s.token_id)
        return TokenSample(seq_id, s.token_id, s.logprob, s.top_logprobs)

    def _failure(self, seq_id: int, e: Exception) -> TokenSample:
        """The error sample that ends seq_id alone; forgets its sampling state."""
        self.samplers.pop(seq_id, None)
        message = str(e) or type(e).__name__
        if isinstance(e, ConstraintError):  # the request's own problem
            error = SeqError("bad_constraint", CONSTRAINT_FAILURE + message)
        else:
            error = SeqError("engine_failed", message)
        log.warning("sampling failed", seq_id=seq_id, error=error.message)
        return TokenSample(seq_id, -1, error=error)


def _row_runs(seq_ids: list[int], drafts: dict[int, list[int]]) -> list[tuple[int, int, int]]:
    """(first row, seq id, rows) per sequence of a round's rows seq_ids: a drafted sequence's
    len(draft) + 1 rows follow each other, any other has one. Raises ValueError on a short run."""
    runs, row = [], 0
    while row < len(seq_ids):
        seq_id = seq_ids[row]
        n = len(drafts[seq_id]) + 1 if seq_id in drafts else 1
        if seq_ids[row : row + n] != [seq_id] * n:
            raise ValueError(f"seq {seq_id}: a draft of {n - 1} tokens without its {n} logits rows")
        runs.append((row, seq_id, n))
        row += n
    return runs


def adds_constraint(msg: RoundLogits) -> bool:
    """Whether the round adds a sequence with a grammar constraint."""
    return any(isinstance(u, SamplerAdd) and u.params.constraint is not None for u in msg.sampler_updates)
