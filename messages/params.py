"""Per-request sampling parameters, shared by the sampler, scheduler, tokenizer and gateways.

Encoded as a map (field names on the wire) because it is also part of the public
ZeroMQ and stdio protocols, where clients in other languages build it by hand.
"""

from __future__ import annotations

import msgspec


class SamplingParams(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """How to turn logits into tokens, and when to stop.

    temperature 0 means greedy. top_k 0 and top_p 1.0 and min_p 0.0 disable those
    filters. Penalties follow OpenAI (presence, frequency: subtracted) and
    llama.cpp/vLLM (repetition: divides positive logits, multiplies negative ones),
    counted over the generated tokens (presence/frequency) and over prompt plus
    generated tokens (repetition). logprobs N asks for the top-N alternatives per token.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = {}
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None
    n: int = 1

    def validate(self) -> None:
        """Raise ValueError naming the first field out of range."""
        checks = [
            ("temperature", self.temperature >= 0.0),
            ("top_k", self.top_k >= 0),
            ("top_p", 0.0 < self.top_p <= 1.0),
            ("min_p", 0.0 <= self.min_p <= 1.0),
            ("repetition_penalty", self.repetition_penalty > 0.0),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0),
            ("max_tokens", self.max_tokens >= 1),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= 20),
            ("n", 1 <= self.n <= 16),
            ("stop", len(self.stop) <= 16 and all(self.stop)),
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"invalid value for {name}: {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
