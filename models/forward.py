"""The forward pass, written once for every supported architecture over the device ops.

llama / mistral / qwen2 / qwen3 / gemma3 differ only in what the spec switches on:
attention biases, per-head q/k norms, sandwich norms, GeGLU, embedding scale and
sliding-window layers with their own RoPE base.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol

import numpy as np

from zinfer.devices.base import KV, Ctx, Device, KVStore, Layers, RoundOps
from zinfer.devices.batch import ForwardBatch
from zinfer.models.spec import ModelSpec
from zinfer.models.weights import LayerWeights, ModelWeights


class LayerMarks(Protocol):
    """A tracer told where each layer begins and ends (traces/kernels.py KernelRecorder)."""

    def begin_layer(self, i: int) -> None: ...

    def end_layer(self, i: int) -> None: ...


def forward(spec: ModelSpec, w: ModelWeights, kv: KV, dev: RoundOps[KV, Ctx], ctx: Ctx,
            marks: LayerMarks | None = None) -> Any:
    """Run one round over its context (dev.begin_round) on the ops of `dev` (a device, a
    recorder of its graphs, a traced device): write every token's K/V into `kv` and return
    logits [S, vocab] float32, a device array, for the rows in ctx.logits_rows (S may be
    0). marks: told where each layer begins and ends, or None. Bound as
    round_layers(spec, w, kv, marks), it is the Layers a device's run_round calls."""
    x = dev.embed(w.tok_embd, ctx.token_ids)  # [T, d]
    if spec.embed_scale != 1.0:
        x = dev.scale(x, spec.embed_scale)
    for i, layer in enumerate(w.layers):
        if marks is not None:
            marks.begin_layer(i)
        x = _layer(spec, i, layer, dev, kv, ctx, x)
        if marks is not None:
            marks.end_layer(i)
    if len(ctx.batch.logits_rows) == 0:
        return dev.from_numpy(np.zeros((0, spec.vocab_size), np.float32))
    h = dev.rms_norm(dev.take_rows(x, ctx.logits_rows), w.out_norm, spec.rms_eps)  # [S, d]
    return dev.linear(h, w.output)  # [S, vocab]


def round_layers(spec: ModelSpec, w: ModelWeights, kv: KV, marks: LayerMarks | None = None) -> Layers[KV, Any]:
    """The forward bound to its model, weights and KV pool: (ops, ctx) -> logits [S, vocab],
    what device.run_round(layers, batch, kv) calls."""
    return partial(forward, spec, w, kv, marks=marks)


def round_logits(spec: ModelSpec, w: ModelWeights, dev: Device, kv: KVStore, batch: ForwardBatch,
                 marks: LayerMarks | None = None) -> np.ndarray:
    """One whole round as the executor runs it, logits [S, vocab] on the host (for tests and
    benchmarks that drive the forward without an engine)."""
    return dev.to_numpy(dev.run_round(round_layers(spec, w, kv, marks), batch, kv))


def _layer(spec: ModelSpec, i: int, lw: LayerWeights, dev: RoundOps[KV, Ctx], kv: KV, ctx: Ctx, x: Any) -> Any:
    """One transformer block on x [T, d]; returns the new residual stream."""
    T = ctx.n_tokens
    h = dev.rms_norm(x, lw.attn_norm, spec.rms_eps)
    q, k, v = dev.linears(h, (lw.wq, lw.wk, lw.wv), (lw.bq, lw.bk, lw.bv))
    q = q.reshape(T, spec.n_heads, spec.head_dim)
    k = k.reshape(T, spec.n_kv_heads, spec.head_dim)
    v = v.reshape(T, spec.n_kv_heads, spec.head_dim)
    if spec.qk_norm:
        q = dev.rms_norm(q, lw.q_norm, spec.rms_eps)
        k = dev.rms_norm(k, lw.k_norm, spec.rms_eps)
    base, scaling = spec.layer_rope_base(i), spec.layer_rope_scaling(i)
    q = dev.rope(q, ctx, base, spec.rope_dim, spec.rope_interleaved, scaling)
    k = dev.rope(k, ctx, base, spec.rope_dim, spec.rope_interleaved, scaling)
    dev.write_kv(kv, i, k, v, ctx)
    a = dev.attention(q, kv, i, ctx, spec.attn_scale, spec.layer_window(i))  # [T, H, hd]
    o = dev.linear(a.reshape(T, spec.n_heads * spec.head_dim), lw.wo)  # [T, d]
    if spec.sandwich_norms:
        o = dev.rms_norm(o, lw.post_attn_norm, spec.rms_eps)
    x = dev.add(x, o)
    h = dev.rms_norm(x, lw.ffn_norm, spec.rms_eps)
    gate, up = dev.linears(h, (lw.w_gate, lw.w_up), (None, None))
    f = dev.linear(dev.glu(gate, up, spec.act), lw.w_down)
    if spec.sandwich_norms:
        f = dev.rms_norm(f, lw.post_ffn_norm, spec.rms_eps)
    return dev.add(x, f)
