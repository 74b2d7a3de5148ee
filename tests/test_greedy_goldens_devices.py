"""Parity with llama.cpp on the faster devices: cpu-llama (llama.cpp's arithmetic, its kernels
repacked or not) and cpu-fast (int8 activations, its own kernels). The cases, floors and helpers
are test_greedy_goldens.py's; this file holds half of the slow tier's longest work, so that the
slow tier's two workers can take one file each."""

from __future__ import annotations

import pytest

from test_greedy_goldens import DEVICE_CASES, check_parity

pytestmark = pytest.mark.slow  # every test here loads a real model


@pytest.mark.parametrize("name,model,device,options,cases,min_full,min_agree", DEVICE_CASES)
def test_greedy_parity_with_llama_cpp(name, model, device, options, cases, min_full, min_agree, capsys):
    check_parity(name, model, device, options, cases, min_full, min_agree, capsys)
