"""test_tool_calls_real.py's tool-call tests on Qwen2.5-Coder-1.5B, the largest model, in a file of
its own: the slow tier's two workers each take a file, and this model's server and forced calls
were a third of that file's time."""

from __future__ import annotations

import pytest

from test_tool_calls_real import serve
from test_tool_calls_real import test_a_compulsory_call_validates_against_its_schema  # noqa: F401
from test_tool_calls_real import test_left_to_choose_the_model_calls_a_tool  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["qwen2.5-coder-1.5b"])
def server(request):
    with serve(request.param) as s:
        yield s
