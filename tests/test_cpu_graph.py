"""cpu-fast's decode graphs (devices/cpu_graph.py) give what the same rounds give op by op.

Tiny random models of each architecture the forward switches on (llama; gemma3 with
sliding windows, GeGLU, sandwich and q/k norms, the embedding scale; qwen2 with biases,
in f32 so its products are Python steps of the tape; llama in Q4_K (tests/goldens/tiny_q4k.py)
and Q5_0, whose int8 kernels read the file's blocks; K/V in f32; the float kernels), decoded
for many rounds with graphs and without, on batches that fill a bucket and batches padded up
to one, with sequences joining and leaving and tables growing past block edges: the logits
must be equal bit for bit; on an AMX host, a full bucket's rounds multiply on the tiles in
the tape too, with the same bits.
Then what must never happen: a round replaying another KV pool's graphs, an op fed an
array made outside the recorded ops (which must run eagerly and still be right), and a
tape node with a missing or wrongly typed field (a TypeError while the tape is built).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from tiny import write_tiny_gguf, write_tiny_hf
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu_fast import FastCpuDevice
from zinfer.devices.cpu_graph import BUCKETS
from zinfer.kernels.cpu_fast.int8 import amx_host, amx_products
from zinfer.kernels.cpu_fast import cpu_tape as ct
from zinfer.models.forward import round_layers, round_logits
from zinfer.models.loader import open_model
from zinfer.models.weights import build_weights

sys.path.insert(0, str(Path(__file__).parent / "goldens"))
from tiny_q4k import write_tiny_q4k  # noqa: E402

BLOCK = 4  # small blocks: tables grow past block edges within a few rounds
N_BLOCKS = 64
SHAPE = dict(hidden_size=128, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64)


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("graphs")
    return {
        "llama-q8_0": write_tiny_gguf(d / "llama.gguf", "llama", qtype=QT.Q8_0, **SHAPE),
        "gemma3-q8_0": write_tiny_gguf(d / "gemma3.gguf", "gemma3", qtype=QT.Q8_0, **SHAPE),
        "qwen2-f32": write_tiny_hf(d / "qwen2", "qwen2"),
        "llama-q4_k": write_tiny_q4k(d / "llama-q4k.gguf"),
        "llama-q5_0": write_tiny_gguf(d / "llama-q5.gguf", "llama", qtype=QT.Q5_0, **SHAPE),
    }


class Pair:
    """One model on two cpu-fast devices (options `opts`), decode graphs off and on, each with its own pool."""

    def __init__(self, path, **opts):
        src = open_model(path)
        self.spec = src.spec
        self.devs = [FastCpuDevice(decode_graphs=False, **opts), FastCpuDevice(decode_graphs=True, **opts)]
        self.ws = [build_weights(self.spec, src.tensors, d.upload) for d in self.devs]
        self.kvs = [d.alloc_kv(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim, N_BLOCKS, BLOCK)
                    for d in self.devs]
        self.devs[1].replay_compile.start()
        assert self.devs[1].settle(600)  # replay compiled up front, so every eligible round takes a graph

    def round(self, chunks) -> list[np.ndarray]:
        b = ForwardBatch.build(chunks, BLOCK)
        return [round_logits(self.spec, w, d, kv, b) for d, w, kv in zip(self.devs, self.ws, self.kvs)]


# K/V in f32; the float kernels, whose products are Python steps
OPTIONS = {"f32kv": dict(kv_f16=False), "float": dict(int8=False)}


@pytest.fixture(scope="module", params=["llama-q8_0", "gemma3-q8_0", "qwen2-f32", "llama-q4_k", "llama-q5_0",
                                        "gemma3-q8_0-f32kv", "llama-q8_0-float"])
def pair(request, tiny_paths):
    model, _, options = request.param.partition("-q8_0-")
    return Pair(tiny_paths[model + "-q8_0" if options else request.param], **OPTIONS.get(options, {}))


def test_decoding_with_graphs_equals_decoding_op_by_op(pair):
    """Sequences join (prefill rounds, eager), decode together in rounds of 1 to 7 (buckets
    1, 2, 3, 4, 6, 8: exact and padded) and leave; every round's logits equal bit for bit."""
    rng = np.random.default_rng(0)
    vocab = pair.spec.vocab_size
    tables = [list(range(i * 8, i * 8 + 8)) for i in range(7)]  # 8 blocks of 4: up to 32 tokens each
    live: dict[int, tuple[int, int]] = {}  # seq -> (last token, next position)
    replayed = 0
    for step in range(30):
        if len(live) < 7 and step % 4 == 0:  # a new sequence's prompt: an eager round of its own
            s = next(i for i in range(7) if i not in live)
            ids = [int(t) for t in rng.integers(3, vocab, int(rng.integers(2, 6)))]
            eager, graph = pair.round([(ids, 0, tables[s], True)])
            np.testing.assert_array_equal(graph, eager)
            live[s] = (int(np.argmax(eager[0])), len(ids))
            continue
        seqs = sorted(live)
        eager, graph = pair.round([([live[s][0]], live[s][1], tables[s], True) for s in seqs])
        replayed += pair.devs[1].last_round_replayed
        np.testing.assert_array_equal(graph, eager, err_msg=f"step {step}, {len(seqs)} sequences")
        for s, row in zip(seqs, eager):
            live[s] = (int(np.argmax(row)), live[s][1] + 1)
        for s in seqs:
            if live[s][1] >= 30 or (step % 7 == 6 and s == seqs[0]):
                del live[s]
    assert replayed >= 10  # most decode rounds came from a graph (a bucket's first records)


def test_each_pool_replays_its_own_graphs(pair):
    """Graphs belong to the pool they were recorded over: two pools of one device each
    record their own (each pool's first decode round records, later ones replay), and
    rounds alternating between them give the eager device's logits bit for bit."""
    spec = pair.spec
    dims = (spec.n_layers, spec.n_kv_heads, spec.head_dim, N_BLOCKS, BLOCK)
    pools = [[pair.devs[i].alloc_kv(*dims) for _ in range(2)] for i in range(2)]  # [device][pool]
    assert pools[1][0].graphs is not pools[1][1].graphs
    prompts, table = ([5, 9, 13], [7, 3]), [0, 1]
    last = []
    for p, ids in enumerate(prompts):
        batch = ForwardBatch.build([(ids, 0, table, True)], BLOCK)
        outs = [round_logits(spec, pair.ws[i], pair.devs[i], pools[i][p], batch) for i in range(2)]
        np.testing.assert_array_equal(outs[1], outs[0])
        last.append((int(np.argmax(outs[0][0])), len(ids)))
    for step in range(6):
        p = step % 2
        batch = ForwardBatch.build([([last[p][0]], last[p][1], table, True)], BLOCK)
        outs = [round_logits(spec, pair.ws[i], pair.devs[i], pools[i][p], batch) for i in range(2)]
        np.testing.assert_array_equal(outs[1], outs[0], err_msg=f"step {step}, pool {p}")
        assert pair.devs[1].last_round_replayed == (step >= 2)
        last[p] = (int(np.argmax(outs[0][0])), last[p][1] + 1)


def test_an_activation_made_outside_the_ops_runs_the_round_eagerly(tiny_paths):
    """A forward that adds in numpy behind the device's back: the tape would freeze that
    sum, so the recording stops and the round (and every later one of its bucket) runs
    eagerly, with the eager device's logits."""
    p = Pair(tiny_paths["llama-q8_0"])
    spec = p.spec

    def sneaky(dev, w, kv, ctx):
        x = dev.embed(w.tok_embd, ctx.token_ids)
        x = np.asarray(x) + np.float32(0)  # a numpy copy the tape does not own
        h = dev.rms_norm(x, w.out_norm, spec.rms_eps)
        return dev.linear(dev.take_rows(h, ctx.logits_rows), w.output)

    def layers(i):
        return lambda ops, ctx: sneaky(ops, p.ws[i], p.kvs[i], ctx)

    for pos in range(3):
        batch = ForwardBatch.build([([7], pos, [0], True)], BLOCK)
        eager, graph = (p.devs[i].run_round(layers(i), batch, p.kvs[i]) for i in range(2))
        np.testing.assert_array_equal(graph, eager)
        assert not p.devs[1].last_round_replayed
    # the real forward on the same device still records and replays its own bucket
    batch = ForwardBatch.build([([7], 3, [0], True), ([8], 0, [1], True)], BLOCK)
    for _ in range(2):
        out = p.devs[1].run_round(round_layers(spec, p.ws[1], p.kvs[1]), batch, p.kvs[1])
    assert p.devs[1].last_round_replayed and out.shape == (2, spec.vocab_size)


def test_a_traced_replay_is_one_graph_replay_kernel_span(tiny_paths):
    """Traced, the recording round times each op as usual; a replayed round is one span."""
    from zinfer.traces.kernels import KernelRecorder

    p = Pair(tiny_paths["llama-q8_0"])
    rec = KernelRecorder()
    traced = rec.wrap(p.devs[1])
    round_logits(p.spec, p.ws[1], traced, p.kvs[1], ForwardBatch.build([([5, 6, 7], 0, [0], True)], BLOCK))
    names = []
    for pos in (3, 4):
        rec.take()
        round_logits(p.spec, p.ws[1], traced, p.kvs[1], ForwardBatch.build([([9], pos, [0, 1], True)], BLOCK))
        names.append([e[0] for e in rec.take()[1]])
    assert "graph_replay" not in names[0] and {"linears", "attention"} <= set(names[0])  # recorded op by op
    assert names[1] == ["graph_replay"]


@pytest.mark.skipif(not amx_host.tiles_permitted(), reason="needs a CPU with AMX-INT8 and the OS's permission")
@pytest.mark.parametrize("model", ["llama-q8_0", "llama-q4_k"])
def test_a_round_of_a_full_bucket_replays_its_products_on_the_tiles_with_the_eager_bits(tiny_paths, model):
    """The largest bucket's rounds (amx_products.MIN_ROWS rows or more) multiply on the AMX
    tiles in the tape as the eager round does (an AmxLinears node), and give its logits bit
    for bit."""
    pair = Pair(tiny_paths[model])
    S = BUCKETS[-1]
    assert S >= amx_products.MIN_ROWS
    rng = np.random.default_rng(5)
    tables = [[2 * i, 2 * i + 1] for i in range(S)]  # 2 blocks of 4: up to 8 tokens each
    prompts = [[int(t) for t in rng.integers(3, pair.spec.vocab_size, 3)] for _ in range(S)]
    eager, graph = pair.round([(ids, 0, tables[i], True) for i, ids in enumerate(prompts)])
    last = [int(np.argmax(row)) for row in eager]
    replayed = 0
    for pos in range(3, 7):
        eager, graph = pair.round([([last[i]], pos, tables[i], True) for i in range(S)])
        np.testing.assert_array_equal(graph, eager, err_msg=f"position {pos}")
        replayed += pair.devs[1].last_round_replayed
        last = [int(np.argmax(row)) for row in eager]
    assert replayed >= 3
    tape = pair.kvs[1].graphs._graphs[S].tape
    ops = {int(op) for step in tape.steps if isinstance(step, np.ndarray) for op in step[:, 0]}
    assert ct.OP_AMX_LINEARS in ops


def test_a_tape_node_with_a_missing_or_mistyped_field_fails_when_built():
    """Nodes are typed records (kernels/cpu_fast/cpu_tape.py): a missing field, a float where an
    address or count goes, an array where a float goes, a flag that is not a bool or a null
    address is a TypeError naming the field, raised before anything is appended or run."""
    x, w, out = (np.zeros((2, 8), np.float32) for _ in range(3))
    good = dict(x=x.ctypes.data, w=w.ctypes.data, out=out.ctypes.data, rows=2, n=8, eps=1e-6)
    row = ct.pack(ct.RmsNorm(**good))
    assert row.shape == (ct.WIDTH,) and row[0] == ct.OP_RMS_NORM and row[ct.RMS_NORM.n] == 8
    assert row[ct.RMS_NORM.eps] == ct.f32_bits(1e-6)
    with pytest.raises(TypeError, match="eps"):
        ct.RmsNorm(**{k: v for k, v in good.items() if k != "eps"})
    bad = [
        (dict(good, rows=2.0), r"RmsNorm\.rows is float, wants an integer"),
        (dict(good, w=w), r"RmsNorm\.w is ndarray, wants an address"),
        (dict(good, eps=np.zeros(1)), r"RmsNorm\.eps is ndarray, wants a float"),
        (dict(good, x=0), r"RmsNorm\.x is the null address"),
    ]
    for fields, message in bad:
        with pytest.raises(TypeError, match=message):
            ct.pack(ct.RmsNorm(**fields))
    with pytest.raises(TypeError, match=r"Glu\.gelu is int, wants a bool"):
        ct.pack(ct.Glu(gate=1, up=2, T=1, n=1, gelu=1, out=3))
    with pytest.raises(TypeError, match="not a tape record"):
        ct.pack((ct.OP_ADD, 1, 2, 3, 4))
