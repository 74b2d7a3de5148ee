"""cpu-fast's thread governor (devices/cpu_team.py) on made-up round times: which count
it picks when the team is faster, when a busy machine makes it slower, and that it comes
back; and that a whole forward gives the same logits whatever count it ran on."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from gguf import GGMLQuantizationType as QT

from tiny import write_tiny_gguf
from zinfer.devices import cpu_team
from zinfer.devices.cpu_team import ThreadGovernor


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def drive(gov: ThreadGovernor, clock: Clock, seconds: dict[int, float], rounds: int, key="k") -> list[int]:
    """`rounds` rounds of shape key taking seconds[count]; the counts chosen."""
    chosen = []
    for _ in range(rounds):
        n = gov.choose(key)
        chosen.append(n)
        clock.t += seconds[n]
        gov.record(key, n, seconds[n])
    return chosen


def test_the_team_is_kept_while_it_is_faster_and_one_thread_is_probed_rarely():
    clock = Clock()
    gov = ThreadGovernor(2, clock)
    chosen = drive(gov, clock, {2: 0.010, 1: 0.016}, 2000)
    first = cpu_team.MIN_PROBE_ROUNDS + 1  # a warm-up round, then rounds measured before one thread is probed
    assert chosen[:first] == [2] * first and chosen[first] == 1
    probes = chosen[first:].count(1)
    assert 1 <= probes <= 2000 * 0.010 / cpu_team.MIN_PROBE_GAP_S
    assert probes * (0.016 - 0.010) <= 2 * cpu_team.PROBE_SHARE * clock.t  # the probes' extra time stays small


def test_a_busy_machine_drops_to_one_thread_within_rounds_and_the_team_comes_back():
    clock = Clock()
    gov = ThreadGovernor(2, clock)
    drive(gov, clock, {2: 0.010, 1: 0.016}, 100)
    busy = drive(gov, clock, {2: 0.140, 1: 0.017}, 400)  # another process takes a core
    assert 1 in busy[:8] and busy[-50:].count(2) <= 1
    spent_on_team = busy.count(2) * 0.140
    assert spent_on_team < 0.2 * clock.t
    idle_again = drive(gov, clock, {2: 0.010, 1: 0.016}, 4000)  # it went away
    assert idle_again[-100:].count(2) >= 95


def test_new_shapes_start_on_one_thread_while_the_machine_is_busy():
    clock = Clock()
    gov = ThreadGovernor(2, clock)
    drive(gov, clock, {2: 0.010, 1: 0.016}, 100, key="decode")
    assert drive(gov, clock, {2: 0.5, 1: 0.3}, 3, key="prefill-a") == [2, 2, 2]  # idle: a new shape starts on the team
    drive(gov, clock, {2: 0.140, 1: 0.017}, 30, key="decode")  # another process takes a core
    assert drive(gov, clock, {2: 3.0, 1: 0.3}, 3, key="prefill-b") == [1, 1, 1]  # and a new shape starts on one thread


def test_shapes_are_timed_apart_and_one_thread_has_nothing_to_choose():
    clock = Clock()
    gov = ThreadGovernor(2, clock)
    for _ in range(3):  # interleaved, as prefill and decode rounds are
        small = drive(gov, clock, {2: 0.010, 1: 0.016}, 20, key="small")
        big = drive(gov, clock, {2: 0.100, 1: 0.050}, 20, key="big")
    assert small[-10:].count(2) >= 9 and big[-10:].count(1) >= 9
    one = ThreadGovernor(1, clock)
    assert drive(one, clock, {1: 0.01}, 5) == [1] * 5


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", "llama", qtype=QT.Q8_0)


@pytest.fixture
def restore_numba_threads():
    yield
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")
def test_decode_graph_logits_do_not_depend_on_the_thread_count(tiny_model, restore_numba_threads):
    """The same decode rounds replayed on 1 thread and on 2 give the same logits bit for bit."""
    from zinfer.devices.batch import ForwardBatch
    from zinfer.devices.cpu_fast import FastCpuDevice
    from zinfer.models.forward import round_logits
    from zinfer.models.loader import open_model
    from zinfer.models.weights import build_weights

    src = open_model(str(tiny_model))
    spec = src.spec
    dev = FastCpuDevice(threads=2, decode_graphs=True)
    w = build_weights(spec, src.tensors, dev.upload)
    kv = dev.alloc_kv(spec.n_layers, spec.n_kv_heads, spec.head_dim, 16, 16)
    tables = [[2 * i, 2 * i + 1] for i in range(4)]
    prompts = [[1 + i, 5, 9, 3 + i] for i in range(4)]
    round_logits(spec, w, dev, kv, ForwardBatch.build([(p, 0, t, True) for p, t in zip(prompts, tables)], 16))
    step = ForwardBatch.build([([7 + i], 4, t, True) for i, t in enumerate(tables)], 16)
    round_logits(spec, w, dev, kv, step)
    assert dev.settle(300.0)
    outs = {}
    for threads in (1, 2, 1, 2):
        dev.team.threads = 1  # the governor off: every round on round_threads
        dev.threads = threads
        outs.setdefault(threads, []).append(round_logits(spec, w, dev, kv, step))
    assert dev.last_round_replayed
    for a in outs[1] + outs[2][1:]:
        np.testing.assert_array_equal(a, outs[2][0])
