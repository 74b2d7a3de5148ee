"""One round, from the scheduler's plan to the sampler's logits, and its device context.

The lifecycle, in one place:

1. The scheduler decides a Round (messages/engine.py): for each running sequence some
   tokens to compute (a prompt, a chunk of one, or one decode token) and its KV block
   table deltas.
2. The executor (actors/executor_actor.py) applies the deltas and flattens the round into a
   host ForwardBatch (devices/batch.py): token ids, positions and KV slots [T], one
   SeqChunk per sequence, the rows whose logits are wanted [S].
3. It calls `device.run_round(layers, batch, kv)`, where `layers` is models.forward.forward
   bound to the spec, weights and KV pool kv, and takes the ops to run on and the ctx
   when called. run_round is the device's say over how the round runs: eagerly
   (layers(device, ctx)), or (CUDA and cpu-fast decode rounds) as the replay of a graph
   that kv owns, captured the first time (CUDA: layers on the device under stream
   capture; cpu-fast: layers on a GraphRecorder, devices/cpu_graph_recorder.py). A traced
   device (traces/kernels.py) hands the real device's run_round a layers that runs on
   timed ops.
4. `device.begin_round(batch)` builds the round's RoundCtx once: the per-token arrays on
   the device, and whatever metadata its kernels want (padded block tables, tiles,
   RoPE tables), so no op rebuilds it per layer.
5. `layers(ops, ctx)` runs the forward over the ctx: every layer's rope, write_kv and
   attention read it. It returns logits [S, vocab] as a device array.
6. The executor reduces them on the device to what the sampler needs
   (devices/reductions.py: the argmax or top-k candidates of greedy and top-k rows, full
   rows only where a row needs them), brings that to the host and sends it to the
   sampler, which turns each row into a token.

A RoundCtx lives for one round: nothing keeps it after run_round returns, except a
captured graph (CUDA or cpu-fast), whose fixed-capacity ctx is refilled before each replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zinfer.devices.batch import ForwardBatch
from zinfer.kernels.oracle import reference as ref
from zinfer.kernels.oracle.rope import RopeScaling


RopeKey = tuple[float, int, RopeScaling | None]  # (base, rope_dim, scaling) of a RoPE table


@dataclass(frozen=True, eq=False)
class RoundCtx:
    """What every op of one round shares. Arrays are the device's own (numpy on cpu).

    Devices subclass it for their own metadata; `rope` tables are made on first ask and
    kept for the round (every layer with the same base asks again).
    """

    batch: ForwardBatch  # the host batch the round was built from
    token_ids: Any  # [T] int64
    positions: Any  # [T] int64
    slots: Any  # [T] int64: where each token's K/V goes in the pool
    logits_rows: Any  # [S] int64: rows of T whose logits the round returns
    _rope: dict[RopeKey, tuple[Any, Any]] = field(default_factory=dict, init=False, repr=False)  # key -> (cos, sin)

    @property
    def n_tokens(self) -> int:
        return self.batch.n_tokens

    def rope(self, base: float, rope_dim: int, scaling: RopeScaling | None = None) -> tuple[Any, Any]:
        """cos, sin [T, rope_dim/2] of this round's positions at this base and scaling
        (kernels/oracle/rope.py; None: plain RoPE), made once."""
        key = rope_key(base, rope_dim, scaling)
        table = self._rope.get(key)
        if table is None:
            table = self._rope[key] = self.rope_table(*key)
        return table

    def rope_table(self, base: float, rope_dim: int, scaling: RopeScaling | None = None) -> tuple[Any, Any]:
        """Compute the tables (`rope` caches them): numpy's, on the host positions."""
        return ref.rope_angles(np.asarray(self.batch.positions), base, rope_dim, scaling)


def rope_key(base: float, rope_dim: int, scaling: RopeScaling | None) -> RopeKey:
    """The (base, rope_dim, scaling) a round's RoPE table is made and kept under: an identity
    scaling is None (plain RoPE)."""
    return float(base), int(rope_dim), None if scaling is None or scaling.is_identity else scaling
