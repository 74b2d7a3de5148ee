"""Messages between the engine's actors (array_like tagged unions, one per receiving actor).

Request-scoped messages carry the W3C traceparent of their request, so one trace
crosses actors and processes.
"""

from __future__ import annotations

from typing import Union

import msgspec
import numpy as np

from zinfer.messages.params import SamplingParams

_BUS = dict(array_like=True, omit_defaults=True, gc=False)


# ---- to the scheduler -------------------------------------------------------------

class Admit(msgspec.Struct, tag="admit", **_BUS):
    """A tokenized sequence to schedule (one per choice when n > 1)."""

    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: list[int]
    traceparent: str | None = None


class Abort(msgspec.Struct, tag="abort", **_BUS):
    """Stop a sequence now (client cancel, stop string matched); frees its KV."""

    seq_id: int
    reason: str


CONSTRAINT_FAILURE = "constraint: "
"""How the message of a constraint the engine cannot follow starts (SeqError and Rejected
with code "bad_constraint"), so the client reads that the grammar is the problem."""


class SeqError(msgspec.Struct, array_like=True, gc=False):
    """Why one sequence failed alone: its request fails with this code and message (the
    front door's Failed), the engine serves on."""

    code: str  # "bad_constraint": its grammar could not be followed; "engine_failed": anything else
    message: str


class TokenSample(msgspec.Struct, array_like=True, gc=False):
    seq_id: int
    token_id: int
    logprob: float | None = None  # None unless the request asked for logprobs
    top: list[tuple[int, float]] | None = None
    error: SeqError | None = None  # sampling this sequence failed (token_id is then -1): fail it alone


class Sampled(msgspec.Struct, tag="sampled", **_BUS):
    round_id: int
    tokens: list[TokenSample]


class ActorFailed(msgspec.Struct, tag="actor_failed", **_BUS):
    """An actor or process of the topology died; fail every open request."""

    actor: str
    message: str


class Shutdown(msgspec.Struct, tag="shutdown", **_BUS):
    pass


class RoundFailed(msgspec.Struct, tag="round_failed", **_BUS):
    """The executor could not compute round `round_id` (an exception on the device): the
    scheduler fails every sequence of that round alone, with `message`, and serves on.
    The round's sampler updates never reached the sampler."""

    round_id: int
    message: str


SchedulerInbox = Union[Admit, Abort, Sampled, RoundFailed, ActorFailed, Shutdown]


# ---- to the front door (from the scheduler) -------------------

class SeqOutput(msgspec.Struct, array_like=True, gc=False):
    """New tokens of one sequence this round; finish_reason set on its last."""

    seq_id: int
    token_ids: list[int]
    logprobs: list[float] | None  # None unless the request asked for logprobs
    top: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort:<why>" | "error" (then `error` says why)
    cached_tokens: int = 0
    error: SeqError | None = None  # the sequence failed alone (finish_reason "error"): its request fails with it
    drafted: int = 0  # speculative tokens drafted for this sequence in the round(s) behind this output
    accepted: int = 0  # of those, the ones verification kept (each is one of token_ids)


class SchedulerStats(msgspec.Struct, array_like=True, gc=False):
    running: int = 0
    waiting: int = 0
    kv_blocks: int = 0
    kv_used_blocks: int = 0
    kv_cached_blocks: int = 0
    rounds: int = 0
    drafted_tokens: int = 0  # speculative tokens drafted since the engine started
    accepted_tokens: int = 0  # of those, the ones verification kept


class SeqOutputs(msgspec.Struct, tag="outputs", **_BUS):
    outputs: list[SeqOutput]
    stats: SchedulerStats = msgspec.field(default_factory=SchedulerStats)


class SeqRejected(msgspec.Struct, tag="seq_rejected", **_BUS):
    seq_id: int
    code: str
    message: str


FrontDoorInbox = Union[SeqOutputs, SeqRejected, ActorFailed, Shutdown]


# ---- to an executor ---------------------------------------------------------------

class RoundSeq(msgspec.Struct, array_like=True, gc=False):
    """One sequence's share of a round. The block table travels as a delta: the executor
    keeps each sequence's table, cuts it to table_start entries and appends new_blocks
    (table_start 0 starts a fresh table: a new or preempted sequence)."""

    seq_id: int
    token_ids: list[int]  # tokens to compute this round
    start_pos: int  # position of token_ids[0]
    table_start: int  # entries of the executor's table that stay
    new_blocks: list[int]  # block ids appended after them
    wants_logits: bool
    logits_need: int = 0  # of a row it wants: 0 the full row, 1 the argmax, k the top-k (actors/logits_need.py)
    draft: int = 0  # the last `draft` of token_ids are drafted (speculative): logits at the last draft + 1 rows


class SamplerAdd(msgspec.Struct, tag="sampler_add", **_BUS):
    seq_id: int
    params: SamplingParams
    prompt_ids: list[int]


class SamplerDrop(msgspec.Struct, tag="sampler_drop", **_BUS):
    seq_id: int


SamplerUpdate = Union[SamplerAdd, SamplerDrop]


class Draft(msgspec.Struct, array_like=True, gc=False):
    """The drafted tokens of one sequence in a round, for the sampler to verify in order
    against its draft + 1 logits rows (actors/speculation_verify.py)."""

    seq_id: int
    token_ids: list[int]
    # a draft model's proposal distributions q, one row per drafted token ([k, draft vocab] float32), for
    # sampled requests whose drafts were drawn from q; None: each token drafted as a point mass (greedy, n-gram)
    probs: np.ndarray | None = None


class Round(msgspec.Struct, tag="round", **_BUS):
    """One forward round. sampler_updates ride along to the sampler, so they arrive
    before the logits that need them whatever the topology."""

    round_id: int
    seqs: list[RoundSeq]
    sampler_updates: list[SamplerUpdate] = []
    traceparents: list[str] = []
    forget: list[int] = []  # seq ids (finished, aborted, preempted) whose tables the executor drops first
    drafts: list[Draft] = []  # drafts with proposal distributions (Draft.probs): the executor hands them on


ExecutorInbox = Union[Round, Shutdown]


# ---- to the sampler ---------------------------------------------------------------

class Candidates(msgspec.Struct, array_like=True, gc=False):
    """The top-K candidates of the rows whose sequences need no more (devices/reductions.py);
    a row that asked for k < K reads its first k."""

    seq_ids: list[int]  # one per row
    ids: np.ndarray  # [S_k, K] int64, value descending, ties to the lower id; -1 pads past a row's non-NaN entries
    values: np.ndarray  # [S_k, K] float32 (-inf where ids is -1)
    row_max: np.ndarray  # [S_k] float32: each row's max over the whole vocabulary (NaN when it holds one)


class RoundLogits(msgspec.Struct, tag="logits", **_BUS):
    """A round's logits: the full rows of sequences that need them, candidates for the rest."""

    round_id: int
    seq_ids: list[int]  # one per full logits row
    logits: np.ndarray  # [S_full, vocab] float32
    sampler_updates: list[SamplerUpdate] = []
    traceparents: list[str] = []
    candidates: Candidates | None = None  # None: every row of the round is full
    # sequences with drafted tokens: their draft + 1 rows follow each other (all full or all candidates)
    drafts: list[Draft] = []


SamplerInbox = Union[RoundLogits, Shutdown]


# ---- the kv allocator's request/reply ---------------------------------------------

class KvAllocate(msgspec.Struct, array_like=True, gc=False):
    seq_id: int
    token_ids: list[int]  # all tokens known for the sequence (prefix hashing)
    num_tokens: int  # tokens its blocks must cover


class KvCommit(msgspec.Struct, array_like=True, gc=False):
    """Blocks first_block, first_block + 1, ... of a sequence are full and their KV is
    written; token_ids are the tokens of just those blocks (a whole number of blocks)."""

    seq_id: int
    first_block: int
    token_ids: list[int]


class KvTruncate(msgspec.Struct, array_like=True, gc=False):
    """A sequence's KV now covers only num_tokens tokens (speculative tokens were rejected):
    its blocks past them go back to the allocator."""

    seq_id: int
    num_tokens: int


class KvUpdate(msgspec.Struct, tag="kv_update", **_BUS):
    """Commits, then frees, then truncations, then allocations in order (each all-or-nothing);
    the first refused allocation refuses every later one, so blocks go first come, first served."""

    free: list[int] = []
    commit: list[KvCommit] = []
    allocate: list[KvAllocate] = []
    traceparents: list[str] = []  # of the requests whose blocks the update allocates
    truncate: list[KvTruncate] = []


class KvGrant(msgspec.Struct, array_like=True, gc=False):
    seq_id: int
    ok: bool
    block_table: list[int] = []
    cached_tokens: int = 0


class KvStats(msgspec.Struct, array_like=True, gc=False):
    num_blocks: int
    used_blocks: int
    cached_blocks: int


class KvReply(msgspec.Struct, tag="kv_reply", **_BUS):
    grants: list[KvGrant]
    stats: KvStats


KvInbox = Union[KvUpdate, Shutdown]


# ---- the draft model's request/reply (speculative decoding, actors/draft_model.py) --------

class DraftSeq(msgspec.Struct, array_like=True, gc=False):
    """One sequence to draft for. The sequence's tokens are the drafter's first `start` tokens of
    it followed by token_ids (start 0: all of them, the drafter keeps nothing of an earlier state)."""

    seq_id: int
    start: int
    token_ids: list[int]
    limit: int  # the most tokens to propose
    temperature: float = 0.0  # 0: greedy proposals; > 0: drawn from softmax(logits / temperature), q returned
    seed: int | None = None  # of the request: sampled proposals are reproducible per seed


class DraftAsk(msgspec.Struct, tag="draft_ask", **_BUS):
    """Draft for seqs (forgetting the sequences of `forget` first: ended, preempted)."""

    seqs: list[DraftSeq] = []
    forget: list[int] = []
    traceparents: list[str] = []


class DraftProposal(msgspec.Struct, array_like=True, gc=False):
    seq_id: int
    token_ids: list[int]  # the proposal, possibly empty
    known: int  # leading tokens of the sequence the drafter holds now (0: it dropped the sequence)
    probs: np.ndarray | None = None  # [len(token_ids), draft vocab] float32: q of each (sampled proposals)


class DraftReply(msgspec.Struct, tag="draft_reply", **_BUS):
    proposals: list[DraftProposal]  # one per DraftSeq, in order
    error: str = ""  # the draft round failed (no proposals; every asked sequence dropped)


DrafterInbox = Union[DraftAsk, Shutdown]
