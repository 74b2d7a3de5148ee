"""cpu-fast's ops while a decode round is being recorded (devices/cpu_graph.py): each
appends its node to the tape (kernels/cpu_tape.py) and returns outputs the tape owns.

They mirror FastCpuDevice's eager ops for the rounds a graph takes (one token per
sequence, every row short, so attention is the one paged kernel). An activation not
made by the tape raises cpu_graph.NotRecordable (Tape.act).
"""

from __future__ import annotations

import numpy as np

from zinfer.devices.cpu_graph import NotRecordable, Tape
from zinfer.kernels import cpu_int8 as ci
from zinfer.kernels import cpu_tape as ct


def embed(tape: Tape, dev, table, token_ids: np.ndarray, width: int) -> np.ndarray:
    """A Python step: the rows of `table` for the ctx's token ids [T] -> [T, width]."""
    tape.act(token_ids)
    out = tape.out((token_ids.shape[0], width))
    tape.python(lambda: np.copyto(out, dev.embed_eager(table, token_ids)))
    return out


def rms_norm(tape: Tape, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    out = tape.out(x.shape)
    n = x.shape[-1]
    tape.node(ct.RMS_NORM, tape.act(x), tape.pin(w), tape.act(out), x.size // n, n, ct.f32_bits(eps))
    return out


def linears(tape: Tape, dev, x: np.ndarray, ws: tuple, bs: tuple) -> list:
    """Each int8 group one LINEARS node (one rounding of x, one launch); other kernels a
    Python step into an owned output; biases a BIAS node each."""
    T, cols = x.shape
    x_at = tape.act(x)
    outs: list = [None] * len(ws)
    for jobs, members in dev._int8_jobs(ws):
        w0 = jobs.weights[0]
        flat = tape.out((T * jobs.rows,))
        tape.node(ct.LINEARS, tape.pin(jobs.table), len(jobs.table), x_at, T, cols, ci.activation_order(w0), ci.rounding_group(w0),
                  w0.nsteps, w0.nchunks, tape.act(flat), flat.size)
        for i, (a, b) in zip(members, jobs.bounds):
            outs[i] = flat[T * a : T * b].reshape(T, b - a)
    for i, (w, b) in enumerate(zip(ws, bs)):
        if outs[i] is None:
            out = outs[i] = tape.out((T, w.shape[0]))
            tape.python(lambda w=w, out=out: np.copyto(out, w.compute(x)))
        if b is not None:
            tape.node(ct.BIAS, tape.act(outs[i]), tape.pin(b), T, outs[i].shape[1])
    return outs


def rope_table(tape: Tape, positions: np.ndarray, inv_freq: np.ndarray, mscale: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, rope_dim/2] of the ctx's positions, scaled by YaRN's mscale."""
    T, half = positions.shape[0], inv_freq.shape[0]
    cos, sin = tape.out((T, half)), tape.out((T, half))
    inv_freq = np.ascontiguousarray(inv_freq, dtype=np.float32)
    tape.node(ct.ROPE_TABLE, tape.act(positions), T, tape.pin(inv_freq), half, tape.act(cos), tape.act(sin), ct.f32_bits(mscale))
    return cos, sin


def rope(tape: Tape, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    T, H, hd = x.shape
    out = tape.out(x.shape)
    tape.node(ct.ROPE, tape.act(x), T, H, hd, tape.act(cos), tape.act(sin), cos.shape[1], int(bool(interleaved)), tape.act(out))
    return out


def write_kv(tape: Tape, kv, layer: int, k: np.ndarray, v: np.ndarray, slots: np.ndarray) -> None:
    for pool, x in ((kv.k[layer], k), (kv.v[layer], v)):
        tape.node(ct.STORE_KV, tape.pin(pool), pool[0].size, tape.act(slots), x.shape[0], tape.act(x), int(pool.dtype == np.float16), pool.shape[0])


def attention(tape: Tape, q: np.ndarray, kv, layer: int, ctx, scale: float, window: int) -> np.ndarray:
    """Every row through the paged kernel: row i is sequence i, its table row i of the ctx's."""
    T, H, hd = q.shape
    kp, vp = kv.k[layer], kv.v[layer]
    b = ctx.buffers
    out = tape.out(q.shape)
    tape.node(ct.ATTENTION, tape.act(q), T, H, hd, tape.pin(kp), tape.pin(vp), kp.shape[0], kp.shape[1], int(kp.dtype == np.float16),
              tape.act(b.rows), b.S, tape.act(ctx.positions), tape.act(b.rows), tape.act(b.tables), b.S, b.width, kv.block_size,
              ct.f32_bits(scale), int(window), tape.act(out))
    return out


def glu(tape: Tape, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
    out = tape.out(gate.shape)
    tape.node(ct.GLU, tape.act(gate), tape.act(up), gate.shape[0], gate.shape[1], int(act != "silu"), tape.act(out))
    return out


def add(tape: Tape, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.shape != y.shape:
        raise NotRecordable(f"a broadcasting add {x.shape} + {y.shape}")
    out = tape.out(x.shape)
    tape.node(ct.ADD, tape.act(x), tape.act(y), tape.act(out), x.size)
    return out


def scale(tape: Tape, x: np.ndarray, s: float) -> np.ndarray:
    out = tape.out(x.shape)
    tape.node(ct.SCALE, tape.act(x), ct.f32_bits(s), tape.act(out), x.size)
    return out


def take_rows(tape: Tape, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    d = x.shape[1]
    out = tape.out((rows.shape[0], d))
    tape.node(ct.TAKE_ROWS, tape.act(x), tape.act(rows), rows.shape[0], d, tape.act(out))
    return out
