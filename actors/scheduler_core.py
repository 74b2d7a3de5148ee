"""The scheduler's logic: what the scheduler actor decides, as a pure synchronous object.

Plain data in, wire messages out; no I/O, no clock, no tracing (the actor, actors/scheduler_actor.py,
does those). SchedulerPolicy (actors/scheduler_policy.py) holds the sequences and plans rounds;
this core runs the round loop around it, as vLLM v1's scheduler does with `schedule()` and
`update(outputs)`, with one difference: the KV allocator lives in another actor, so a round that
needs blocks is planned in steps.

The driver's loop (the actor's, and the tests'):

    admit(Admit) -> SeqRejected | None       send a rejection to the front door
    abort(seq_id)
    update(Sampled) -> SeqOutputs | None     the in-flight round's tokens: send to the front door
    fail_round(RoundFailed) -> SeqOutputs    the round's sequences end with the error: send them
    schedule() -> DraftAsk | KvUpdate | RoundPlan | SeqOutputs | None, while no round is in flight:
        DraftAsk    ask the drafter (a draft model); pass its reply to drafted(), then call schedule() again
        KvUpdate    ask the KV actor; pass its reply to granted(), then call schedule() again
        RoundPlan   send plan.round to the executor; the round is in flight until update()
                    or fail_round()
        SeqOutputs  nothing to run (the queue's head does not fit): send the stats to the front door
        None        nothing to do

Contracts:
- one round is in flight at a time; admissions and aborts meanwhile join the next round;
- a finished, aborted or failed sequence's KV free, SamplerDrop and executor `forget` go out with
  the next KvUpdate and Round; a preempted sequence's free and forget too (it keeps its sampler
  state and is recomputed from the waiting queue's head);
- the KV actor is asked only when frees or commits are pending or a chunk needs blocks its table
  lacks (a decode step inside its last block needs no call);
- a drafted chunk (speculative decoding) gets back its draft's kept prefix and one more token; the
  blocks of its rejected tokens go back with the next KvUpdate (a KvTruncate);
- with a draft model, the drafter is asked (once per round, for every decoding sequence that drafts
  with it) before the round is planned; each ask sends a sequence's tokens the drafter lacks and
  names the sequences it should forget (ended or preempted since the last ask);
- a sample that failed ends its sequence alone with finish reason "error" and its SeqError; a failed round
  ends each of its sequences so, and its sampler updates go out again with the next round (the
  sampler never saw them).
"""

from __future__ import annotations

from dataclasses import dataclass

from zinfer.actors.logits_need import logits_needed
from zinfer.actors.scheduler_policy import Chunk, SchedulerConfig, SchedulerPolicy, Seq
from zinfer.actors.speculation import ModelDrafter
from zinfer.messages.engine import (
    Admit,
    Draft,
    DraftAsk,
    DraftReply,
    DraftSeq,
    KvCommit,
    KvGrant,
    KvReply,
    KvStats,
    KvTruncate,
    KvUpdate,
    Round,
    RoundFailed,
    SamplerAdd,
    SamplerDrop,
    SamplerUpdate,
    Sampled,
    SchedulerStats,
    SeqError,
    SeqOutput,
    SeqOutputs,
    SeqRejected,
    TokenSample,
)


@dataclass
class RoundPlan:
    """A round to send to the executor, and the chunks it computes (in its order; read them only)."""

    round: Round
    chunks: list[Chunk]


class SchedulerCore:
    """The round loop's state over a SchedulerPolicy. Every method mutates only this object.

    device_reductions: each RoundSeq says how much of its logits row the sampler needs
    (actors/logits_need.py); False ships every row whole. kv_traceparents: each KvUpdate names
    the requests it allocates for (the KV actor's spans).
    """

    def __init__(self, config: SchedulerConfig, device_reductions: bool = True, kv_traceparents: bool = False):
        config.validate()
        self.policy = SchedulerPolicy(config)
        self.device_reductions = device_reductions
        self.kv_traceparents = kv_traceparents
        self.kv_stats = KvStats(config.num_blocks, 0, 0)  # as of the KV actor's last reply
        self.round_id = 0
        self.preemptions = 0
        self.in_flight: list[Chunk] | None = None  # the chunks of the round out (None: none)
        self.in_flight_updates: list[SamplerUpdate] = []  # the sampler updates that round carries
        self.frees: list[int] = []  # seq ids whose KV the next KvUpdate frees
        self.commits: list[KvCommit] = []
        self.truncations: list[KvTruncate] = []  # rejected drafts' blocks the next KvUpdate gives back
        self.drafted_tokens = 0  # speculative tokens drafted in rounds that completed
        self.accepted_tokens = 0  # of those, the ones verification kept
        self.forget: list[int] = []  # seq ids whose block tables the next Round tells the executor to drop
        self.sampler_updates: list[SamplerUpdate] = []  # for the next Round
        self._asked: list[Chunk] | None = None  # the chunks whose KV asks are out
        self._granted: tuple[list[Chunk], list[Chunk]] | None = None  # (planned, accepted) once answered
        self.has_drafter = bool(config.speculation.draft_model)  # a draft model's actor answers DraftAsks
        self.draft_forget: list[int] = []  # seq ids the next DraftAsk tells the drafter to forget
        self._drafting: list[Seq] | None = None  # the sequences of the DraftAsk out

    # ---- inputs ---------------------------------------------------------------------

    def admit(self, msg: Admit) -> SeqRejected | None:
        """Queue a sequence, or return why it is rejected."""
        seq = Seq(msg.seq_id, list(msg.prompt_ids), msg.params, frozenset(msg.eos_ids), msg.traceparent)
        rejection = self.policy.add(seq)
        if rejection:
            return SeqRejected(msg.seq_id, *rejection)
        self.sampler_updates.append(SamplerAdd(msg.seq_id, msg.params, list(msg.prompt_ids)))
        return None

    def abort(self, seq_id: int) -> bool:
        """End a waiting or running sequence (no output: the front door ended it); False when unknown."""
        if self.policy.abort(seq_id) is None:
            return False
        self._release(seq_id)
        return True

    def update(self, sampled: Sampled) -> SeqOutputs | None:
        """The in-flight round's samples: advance its sequences. Returns the outputs to send (the
        tokens of each sequence that sampled any: one, or a draft's kept prefix and one more; its
        finish reason on its last; "error" (with its SeqError) for a failed sample), None when no
        sequence has one (all mid-prefill)."""
        chunks, self.in_flight, self.in_flight_updates = self.in_flight or [], None, []
        samples: dict[int, list[TokenSample]] = {}
        outputs: list[SeqOutput] = []
        for t in sampled.tokens:
            if t.error is None:
                samples.setdefault(t.seq_id, []).append(t)
            elif self.abort(t.seq_id):
                outputs.append(_failed(t.seq_id, t.error))
        result = self.policy.complete(chunks, {k: [t.token_id for t in ts] for k, ts in samples.items()})
        self.commits += result.commits
        self.truncations += result.truncations
        reasons = {f.seq.seq_id: f.reason for f in result.finished}
        for c in chunks:
            e = result.emitted.get(c.seq.seq_id)
            if e is None or (c.seq not in self.policy.running and c.seq.seq_id not in reasons):
                continue  # mid-prefill, or aborted while the round ran
            kept = samples[c.seq.seq_id][: len(e.token_ids)]
            logprobs = [t.logprob for t in kept if t.logprob is not None] if kept[0].logprob is not None else None
            top = [t.top for t in kept if t.top is not None] if kept[0].top is not None else None
            reason = reasons.get(c.seq.seq_id)
            self.drafted_tokens += e.drafted
            self.accepted_tokens += e.accepted
            outputs.append(SeqOutput(c.seq.seq_id, e.token_ids, logprobs, top, reason, c.seq.cached_tokens,
                                     drafted=e.drafted, accepted=e.accepted))
        for seq_id in reasons:
            self._release(seq_id)
        return SeqOutputs(outputs, self.stats()) if outputs else None

    def fail_round(self, failed: RoundFailed) -> SeqOutputs:
        """The executor could not compute the in-flight round: end each of its sequences with the
        error (those aborted while it ran are gone already). Its sampler updates go out again with
        the next round, so the sampler's state stays the scheduler's (a failed sequence's add is
        dropped right after)."""
        chunks, self.in_flight = self.in_flight or [], None
        self.sampler_updates = self.in_flight_updates + self.sampler_updates
        self.in_flight_updates = []
        outputs = []
        for c in chunks:
            if self.abort(c.seq.seq_id):  # False: aborted while the round ran
                outputs.append(_failed(c.seq.seq_id, SeqError("engine_failed", failed.message)))
        return SeqOutputs(outputs, self.stats())

    # ---- the next round -------------------------------------------------------------

    def schedule(self) -> DraftAsk | KvUpdate | RoundPlan | SeqOutputs | None:
        """The next step towards a round (see the module docstring); call it only while no round
        is in flight and no KvUpdate is unanswered."""
        if self.in_flight is not None or self._asked is not None or self._drafting is not None:
            raise RuntimeError("schedule() while a round, a KV update or a draft ask is out")
        while True:
            if self._granted is not None:
                (chunks, accepted), self._granted = self._granted, None
            else:
                ask = self._draft_ask()
                if ask is not None:
                    return ask
                chunks = self.policy.plan()
                pending = self.frees or self.commits or self.truncations
                if not chunks and not pending:
                    return None
                if pending or not self.policy.kv_covered(chunks):
                    self._asked = chunks
                    return self._kv_update(chunks)
                grants = [KvGrant(c.seq.seq_id, True, c.seq.block_table) for c in chunks]
                accepted, _ = self.policy.accept(chunks, grants)  # all granted: nobody is preempted
            if accepted:
                return self._start_round(accepted)
            if not any(c.new and c.seq in self.policy.running for c in chunks):
                return SeqOutputs([], self.stats())  # idle: report the freed blocks
            # else admitted with a cached prefix longer than its chunk: plan its rest

    def drafted(self, reply: DraftReply) -> None:
        """The drafter's reply to the DraftAsk schedule() returned: park each proposal on its
        sequence (a failed ask: no drafts this round, the drafter starts the sequences over);
        call schedule() next."""
        if self._drafting is None:
            raise RuntimeError("drafted() with no draft ask out")
        seqs, self._drafting = self._drafting, None
        ok = not reply.error and [p.seq_id for p in reply.proposals] == [s.seq_id for s in seqs]
        for i, s in enumerate(seqs):
            assert isinstance(s.drafter, ModelDrafter)
            if ok:
                p = reply.proposals[i]
                s.drafter.take(list(p.token_ids), p.probs, p.known)
            else:
                s.drafter.take([], None, 0)

    def granted(self, reply: KvReply) -> list[int]:
        """The KV actor's reply to the KvUpdate schedule() returned. Returns the seq ids preempted
        because a running sequence's blocks ran out (the youngest running one; its frees go out
        with the next KvUpdate); call schedule() next."""
        if self._asked is None:
            raise RuntimeError("granted() with no KV update out")
        chunks, self._asked = self._asked, None
        self.kv_stats = reply.stats
        accepted, victims = self.policy.accept(chunks, reply.grants)
        if not victims:
            self._granted = chunks, accepted
            return []
        self.frees = [v.seq_id for v in victims]
        self.forget += self.frees
        if self.has_drafter:
            self.draft_forget += self.frees
        self.preemptions += len(victims)
        return list(self.frees)

    def stats(self) -> SchedulerStats:
        p, kv = self.policy, self.kv_stats
        kv_blocks = (kv.num_blocks, kv.used_blocks, kv.cached_blocks)
        return SchedulerStats(len(p.running), len(p.waiting), *kv_blocks, self.round_id,
                              self.drafted_tokens, self.accepted_tokens)

    # ---- internals ------------------------------------------------------------------

    def _draft_ask(self) -> DraftAsk | None:
        """The drafter's ask for the sequences that want a draft model's draft before this
        round, with the forgets pending (alone when none wants one: ended sequences' draft KV is
        freed as soon as the target's); None when there is nothing to ask."""
        if not self.has_drafter:
            return None
        wanted = self.policy.model_drafts_wanted()
        if not wanted and not self.draft_forget:
            return None
        seqs = []
        for s, limit in wanted:
            assert isinstance(s.drafter, ModelDrafter)
            start = s.drafter.known
            p = s.params
            seqs.append(DraftSeq(s.seq_id, start, s.tokens(start, len(s.prompt_ids) + len(s.output_ids)), limit,
                                 p.temperature, p.seed))
        parents = [s.traceparent for s, _ in wanted if s.traceparent]
        ask = DraftAsk(seqs, self.draft_forget, parents)
        self.draft_forget = []
        self._drafting = [s for s, _ in wanted]
        return ask

    def _kv_update(self, chunks: list[Chunk]) -> KvUpdate:
        """The pending frees and commits, and the chunks' block asks."""
        parents = [c.seq.traceparent for c in chunks if c.seq.traceparent] if self.kv_traceparents else []
        update = KvUpdate(self.frees, self.commits, self.policy.kv_asks(chunks), parents, self.truncations)
        self.frees, self.commits, self.truncations = [], [], []
        return update

    def _start_round(self, accepted: list[Chunk]) -> RoundPlan:
        self.round_id += 1
        seqs = self.policy.round_seqs(accepted)
        if self.device_reductions:
            for s, c in zip(seqs, accepted):
                s.logits_need = logits_needed(c.seq.params) if s.wants_logits else 0
        parents = [c.seq.traceparent for c in accepted if c.seq.traceparent]
        drafts = []  # the proposal distributions of a draft model's sampled drafts
        for c in accepted:
            q = c.seq.drafter.q_rows(len(c.draft)) if c.draft and isinstance(c.seq.drafter, ModelDrafter) else None
            if q is not None:
                drafts.append(Draft(c.seq.seq_id, list(c.draft), q))
        plan = RoundPlan(Round(self.round_id, seqs, self.sampler_updates, parents, self.forget, drafts), accepted)
        self.in_flight_updates, self.sampler_updates, self.forget = self.sampler_updates, [], []
        self.in_flight = accepted
        return plan

    def _release(self, seq_id: int) -> None:
        """A sequence ended: queue the freeing of its KV, sampler state and executor table."""
        self.frees.append(seq_id)
        self.forget.append(seq_id)
        if self.has_drafter:
            self.draft_forget.append(seq_id)
        self.sampler_updates.append(SamplerDrop(seq_id))


def _failed(seq_id: int, error: SeqError) -> SeqOutput:
    """The last output of a sequence that failed alone."""
    return SeqOutput(seq_id, [], None, finish_reason="error", error=error)
