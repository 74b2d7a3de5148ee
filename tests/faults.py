"""Faults the tests inject into a running engine, through test-only subclasses swapped in
for the engine's own actors (no production class carries a test hook).

    def test_x(monkeypatch):
        poisoned_sampler(monkeypatch)  # before open_engine: the engine builds a PoisonedSampler
        async with open_engine(config) as engine:
            engine.actors["sampler"].poison = lambda prompt_ids, row: ...

Inproc topology only: a child process builds its own actors.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from zinfer.actors import engine_build
from zinfer.actors.sampler_actor import SamplerActor
from zinfer.messages.engine import TokenSample

Poison = Callable[[list[int], np.ndarray], np.ndarray]


def _unpoisoned(prompt_ids: list[int], row: np.ndarray) -> np.ndarray:
    return row


class PoisonedSampler(SamplerActor):
    """A SamplerActor that samples `poison(prompt_ids, row)` instead of each row: the logits
    row [vocab], or the candidate values [K] of a row the device reduced (whose row max then
    shows a NaN the poison put in, as a full row's would)."""

    poison: Poison = staticmethod(_unpoisoned)

    def _prompt_ids(self, seq_id: int) -> list[int]:
        sampler = self.samplers.get(seq_id)
        return list(sampler.prompt_ids) if sampler is not None else []

    def _sample_row(self, seq_id: int, logits: np.ndarray) -> TokenSample:
        return super()._sample_row(seq_id, self.poison(self._prompt_ids(seq_id), logits))

    def _sample_candidates(self, seq_id: int, ids: np.ndarray, values: np.ndarray, row_max: float) -> TokenSample:
        values = self.poison(self._prompt_ids(seq_id), values)  # [K]
        return super()._sample_candidates(seq_id, ids, values, float(np.max(np.append(values, row_max))))


def poisoned_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines opened in this test (inproc) build a PoisonedSampler as their sampler."""
    monkeypatch.setattr(engine_build, "SamplerActor", PoisonedSampler)
