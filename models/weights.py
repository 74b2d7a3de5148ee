"""Model weights by role, resident on a device, built from canonical (GGUF-named) tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from zinfer.kernels.tensor import TensorData
from zinfer.models.spec import ModelError, ModelSpec

Upload = Callable[[str, TensorData], Any]


@dataclass
class LayerWeights:
    attn_norm: Any
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    ffn_norm: Any
    w_gate: Any
    w_up: Any
    w_down: Any
    bq: Any = None
    bk: Any = None
    bv: Any = None
    q_norm: Any = None
    k_norm: Any = None
    post_attn_norm: Any = None
    post_ffn_norm: Any = None


@dataclass
class ModelWeights:
    tok_embd: Any
    out_norm: Any
    output: Any  # the LM head; the embedding table itself when tied
    layers: list[LayerWeights]


def build_weights(spec: ModelSpec, tensors: Mapping[str, TensorData], upload: Upload) -> ModelWeights:
    """Upload every tensor the spec needs through `upload(name, tensor)`; a missing one, or
    one whose shape is not the spec's (the kernels trust those shapes), raises ModelError."""
    shapes = expected_shapes(spec)

    def get(name: str, required: bool = True) -> Any:
        if name not in tensors:
            if required:
                raise ModelError(f"tensor {name!r} is missing")
            return None
        role = name.split(".", 2)[2] if name.startswith("blk.") else name  # blk.N.attn_q.weight -> attn_q.weight
        want, got = shapes.get(role), tuple(int(d) for d in tensors[name].shape)
        if want is not None and got != want:
            raise ModelError(f"tensor {name!r} has shape {list(got)}, the model's hyperparameters need {list(want)}")
        try:
            return upload(name, tensors[name])
        except ValueError as exc:  # kernels.oracle.quants.UnsupportedTensorType, bad sizes
            raise ModelError(f"tensor {name!r}: {exc}") from None

    layers = []
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        layers.append(
            LayerWeights(
                attn_norm=get(p + "attn_norm.weight"),
                wq=get(p + "attn_q.weight"),
                wk=get(p + "attn_k.weight"),
                wv=get(p + "attn_v.weight"),
                wo=get(p + "attn_output.weight"),
                ffn_norm=get(p + "ffn_norm.weight"),
                w_gate=get(p + "ffn_gate.weight"),
                w_up=get(p + "ffn_up.weight"),
                w_down=get(p + "ffn_down.weight"),
                bq=get(p + "attn_q.bias", spec.attn_bias),
                bk=get(p + "attn_k.bias", spec.attn_bias),
                bv=get(p + "attn_v.bias", spec.attn_bias),
                q_norm=get(p + "attn_q_norm.weight", spec.qk_norm),
                k_norm=get(p + "attn_k_norm.weight", spec.qk_norm),
                post_attn_norm=get(p + "post_attention_norm.weight", spec.sandwich_norms),
                post_ffn_norm=get(p + "post_ffw_norm.weight", spec.sandwich_norms),
            )
        )
    tok_embd = get("token_embd.weight")
    output = get("output.weight", required=False)
    return ModelWeights(
        tok_embd=tok_embd,
        out_norm=get("output_norm.weight"),
        output=tok_embd if output is None else output,
        layers=layers,
    )


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Role ("attn_q.weight" for blk.N.attn_q.weight, or a global name) -> numpy shape [out, in]."""
    d, ff, V = spec.d_model, spec.d_ff, spec.vocab_size
    q, kv = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    return {
        "attn_norm.weight": (d,), "ffn_norm.weight": (d,),
        "post_attention_norm.weight": (d,), "post_ffw_norm.weight": (d,),
        "attn_q.weight": (q, d), "attn_k.weight": (kv, d), "attn_v.weight": (kv, d), "attn_output.weight": (d, q),
        "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,),
        "attn_q_norm.weight": (spec.head_dim,), "attn_k_norm.weight": (spec.head_dim,),
        "ffn_gate.weight": (ff, d), "ffn_up.weight": (ff, d), "ffn_down.weight": (d, ff),
        "token_embd.weight": (V, d), "output_norm.weight": (d,), "output.weight": (V, d),
    }
