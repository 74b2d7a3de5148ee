"""The replay of a recorded decode round: one numba call runs every op of it (devices/cpu_graph.py).

A decode round of a small model is hundreds of short ops (SmolLM2: ~390 per token, most
of them a few microseconds of work), and from Python each costs its dispatch, its
argument checks and its output allocation: ~2.5 of 7.7 ms per token on a 2-core host.
So cpu-fast records a decode round once as a tape of nodes, each an int64 row naming a
kernel and the addresses, sizes and scalars it is called with, and later rounds run
the whole tape in `replay`, with no Python between the kernels (the CPU analogue of a
CUDA graph). Every array a node names must outlive the tape and keep its address: the
recorder pins them.

A node: [opcode, args...] padded to WIDTH columns; floats travel as their f32 bits.
The kernels are those the eager ops call (kernels/cpu_ops.py, cpu_int8.py), so a replay
computes what the same op sequence computes eagerly, up to how numba optimizes a callee
inside its caller (fastmath reductions may round 1 ulp apart).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit
from numba import types as nt
from numba.extending import intrinsic

from zinfer.kernels import cpu_int8 as ci
from zinfer.kernels import cpu_ops as ops
from zinfer.kernels.cpu_ops import PARALLEL_ROWS, _f32_from_bits

WIDTH = 24  # int64 columns per node
JOB_COLUMNS = ci.JOB_COLUMNS  # cpu_int8's job table rows

# opcodes; each comment lists the node's arguments after the opcode
RMS_NORM = 1  # x, w, out, rows, n, eps
LINEARS = 2  # jobs, njobs, x, T, cols, order, group, nsteps, nchunks, out, out_floats
BIAS = 3  # out, b, T, n: out[t] += b
ROPE_TABLE = 4  # positions, T, inv_freq, half, cos, sin, mscale
ROPE = 5  # x, T, H, hd, cos, sin, half, interleaved, out
STORE_KV = 6  # pool, width, slots, T, x, f16: pool[slots[t]] = x[t] (pool rows of `width` values)
ATTENTION = 7  # q, T, H, hd, k_pool, v_pool, nslots, Hkv, f16, rows, nrows, positions, row_seq, tables, S, B, block_size, scale, window, out
GLU = 8  # gate, up, T, n, gelu, out
ADD = 9  # a, b, out, n
SCALE = 10  # x, s, out, n
TAKE_ROWS = 11  # x, rows, S, d, out: out[i] = x[rows[i]]


def f32_bits(v: float) -> int:
    """v as float32, its bits as a (signed) int: how nodes carry floats."""
    return int(np.float32(v).view(np.int32))


def _pointer(nbtype):
    @intrinsic
    def pointer(typingctx, addr):
        """The int64 address `addr` as a pointer to {nbtype}, for numba.carray."""
        sig = nt.CPointer(nbtype)(nt.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    return pointer


_f32p, _u16p, _i64p, _i32p = (_pointer(t) for t in (nt.float32, nt.uint16, nt.int64, nt.int32))


@njit(inline="always")
def _f32(bits):
    return _f32_from_bits(np.int32(bits))


@njit(cache=True, nogil=True)
def replay(nodes):
    """Run nodes [n, WIDTH] int64 in order (the opcodes above)."""
    for i in range(nodes.shape[0]):
        a = nodes[i]
        op = a[0]
        if op == RMS_NORM:
            rows, n = a[4], a[5]
            x, w, out = carray(_f32p(a[1]), (rows, n)), carray(_f32p(a[2]), (n,)), carray(_f32p(a[3]), (rows, n))
            if rows >= PARALLEL_ROWS:
                ops.rms_norm(x, w, _f32(a[6]), out)
            else:
                ops.rms_norm_one(x, w, _f32(a[6]), out)
        elif op == LINEARS:
            jobs = carray(_i64p(a[1]), (a[2], JOB_COLUMNS))
            x = carray(_f32p(a[3]), (a[4], a[5]))
            ci._product(jobs, x, a[6], a[7], a[8], a[9], carray(_f32p(a[10]), (a[11],)))
        elif op == BIAS:
            T, n = a[3], a[4]
            out, b = carray(_f32p(a[1]), (T, n)), carray(_f32p(a[2]), (n,))
            for t in range(T):
                out[t] += b
        elif op == ROPE_TABLE:
            T, half = a[2], a[4]
            cos, sin = carray(_f32p(a[5]), (T, half)), carray(_f32p(a[6]), (T, half))
            ops.rope_table(carray(_i64p(a[1]), (T,)), carray(_f32p(a[3]), (half,)), cos, sin)
            m = _f32(a[7])
            if m != 1:
                cos *= m
                sin *= m
        elif op == ROPE:
            T, H, hd, half = a[2], a[3], a[4], a[7]
            x, out = carray(_f32p(a[1]), (T, H, hd)), carray(_f32p(a[9]), (T, H, hd))
            cos, sin = carray(_f32p(a[5]), (T, half)), carray(_f32p(a[6]), (T, half))
            if T >= PARALLEL_ROWS:
                ops.rope(x, cos, sin, a[8] != 0, out)
            else:
                ops.rope_one(x, cos, sin, a[8] != 0, out)
        elif op == STORE_KV:
            width, T = a[2], a[4]
            slots, x = carray(_i64p(a[3]), (T,)), carray(_f32p(a[5]), (T, width))
            if a[6]:
                ops.store_f16_one(carray(_u16p(a[1]), (a[7], width)), slots, x)
            else:
                pool = carray(_f32p(a[1]), (a[7], width))
                for t in range(T):
                    pool[slots[t]] = x[t]
        elif op == ATTENTION:
            T, H, hd, nslots, Hkv, nrows, S, B = a[2], a[3], a[4], a[7], a[8], a[11], a[15], a[16]
            q, out = carray(_f32p(a[1]), (T, H, hd)), carray(_f32p(a[20]), (T, H, hd))
            rows, positions, row_seq = carray(_i64p(a[10]), (nrows,)), carray(_i64p(a[12]), (T,)), carray(_i64p(a[13]), (T,))
            tables = carray(_i32p(a[14]), (S, B))
            if a[9]:
                kp, vp = carray(_u16p(a[5]), (nslots, Hkv, hd)), carray(_u16p(a[6]), (nslots, Hkv, hd))
                ops.paged_attention(q, kp, vp, rows, positions, row_seq, tables, a[17], _f32(a[18]), a[19], out)
            else:
                kf, vf = carray(_f32p(a[5]), (nslots, Hkv, hd)), carray(_f32p(a[6]), (nslots, Hkv, hd))
                ops.paged_attention(q, kf, vf, rows, positions, row_seq, tables, a[17], _f32(a[18]), a[19], out)
        elif op == GLU:
            T, n = a[3], a[4]
            gate, up, out = carray(_f32p(a[1]), (T, n)), carray(_f32p(a[2]), (T, n)), carray(_f32p(a[6]), (T, n))
            if T >= PARALLEL_ROWS:
                ops.glu(gate, up, a[5] != 0, out)
            else:
                ops.glu_one(gate, up, a[5] != 0, out)
        elif op == ADD:
            n = a[4]
            x, y, out = carray(_f32p(a[1]), (n,)), carray(_f32p(a[2]), (n,)), carray(_f32p(a[3]), (n,))
            for j in range(n):
                out[j] = x[j] + y[j]
        elif op == SCALE:
            n = a[4]
            x, out = carray(_f32p(a[1]), (n,)), carray(_f32p(a[3]), (n,))
            s = _f32(a[2])
            for j in range(n):
                out[j] = x[j] * s
        elif op == TAKE_ROWS:
            S, d = a[3], a[4]
            rows, out = carray(_i64p(a[2]), (S,)), carray(_f32p(a[5]), (S, d))
            for r in range(S):
                out[r] = carray(_f32p(a[1] + rows[r] * d * 4), (d,))
        else:
            raise ValueError("unknown tape opcode")
