"""The replay of a recorded decode round: one numba call runs every op of it (devices/cpu_graph.py).

A decode round of a small model is hundreds of short ops (SmolLM2: ~390 per token, most
of them a few microseconds of work), and from Python each costs its dispatch, its
argument checks and its output allocation. So cpu-fast records a decode round once as a
tape of nodes, each an int64 row naming a kernel and the addresses, sizes and scalars
it is called with, and later rounds run the whole tape in `replay`, with no Python
between the kernels (the CPU analogue of a CUDA graph). Every array a node names must
outlive the tape and keep its address: the recorder pins them.

A node is one typed record per opcode (the NamedTuples below): `pack` writes it as a row
[opcode, fields...] padded to WIDTH columns, checking every field against its type
(an Address, an int, a bool flag, a float carried as its f32 bits), and `replay` reads
each field at the column its record declares (RMS_NORM.eps and so on, constants numba
folds). Writer and reader both derive from the record, so a missing, unknown or wrongly
typed field is a TypeError when the tape is built, never a wild pointer in nogil code.

The kernels are those the eager ops call (cpu_ops.py, int8/products.py, int8/amx_products.py), so a replay
computes what the same op sequence computes eagerly, up to how numba optimizes a callee
inside its caller (fastmath reductions may round 1 ulp apart).
"""

from __future__ import annotations

import numbers
import typing
from collections.abc import Callable
from typing import Any, NamedTuple, NewType

import numpy as np
from numba import njit
from numba import types as nt

from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast.numba_types import Int, Typing, carray, intrinsic
from zinfer.kernels.cpu_fast.int8 import amx_products
from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast.int8 import row_driver
from zinfer.kernels.cpu_fast import cpu_ops as ops
from zinfer.kernels.cpu_fast.cpu_ops import PARALLEL_ROWS, _f32_from_bits

Address = NewType("Address", int)  # a pinned array's data address (array.ctypes.data); never 0


class RmsNorm(NamedTuple):
    """out [rows, n] = rms_norm(x [rows, n]) * w [n]."""

    x: Address
    w: Address
    out: Address
    rows: int
    n: int
    eps: float


class Linears(NamedTuple):
    """out [out_floats] = the int8 jobs [njobs, JOB_COLUMNS] applied to x [T, cols] (products._product)."""

    jobs: Address
    njobs: int
    x: Address
    T: int
    cols: int
    order: int
    group: int
    nsteps: int
    nchunks: int
    out: Address
    out_floats: int


class AmxLinears(NamedTuple):
    """out [out_floats] = the AMX jobs [njobs, amx_products.JOB_COLUMNS] applied to x [T, cols]
    (amx_products.product_in), x rounded per `group` columns into the scratch a, s, n, cs
    (amx_products.activations_for(T, cols, group))."""

    jobs: Address
    njobs: int
    x: Address
    T: int
    cols: int
    group: int
    a: Address
    s: Address
    n: Address
    cs: Address
    out: Address
    out_floats: int


class Bias(NamedTuple):
    """out [T, n] += b [n] in place."""

    out: Address
    b: Address
    T: int
    n: int


class RopeTable(NamedTuple):
    """cos, sin [T, half] of positions [T] at inv_freq [half], both scaled by mscale."""

    positions: Address
    T: int
    inv_freq: Address
    half: int
    cos: Address
    sin: Address
    mscale: float


class Rope(NamedTuple):
    """out [T, H, hd] = x rotated by cos, sin [T, half] (interleaved pairs or halves)."""

    x: Address
    T: int
    H: int
    hd: int
    cos: Address
    sin: Address
    half: int
    interleaved: bool
    out: Address


class StoreKv(NamedTuple):
    """pool [nslots, width][slots[t]] = x [T, width][t], the pool f16 (as uint16) or f32."""

    pool: Address
    width: int
    slots: Address
    T: int
    x: Address
    f16: bool
    nslots: int


class Attention(NamedTuple):
    """out [T, H, hd] = paged attention of q over k_pool, v_pool [nslots, Hkv, hd] (cpu_ops.paged_attention)."""

    q: Address
    T: int
    H: int
    hd: int
    k_pool: Address
    v_pool: Address
    nslots: int
    Hkv: int
    f16: bool
    rows: Address  # [nrows] int64
    nrows: int
    positions: Address  # [T] int64
    row_seq: Address  # [T] int64
    tables: Address  # [S, B] int32
    S: int
    B: int
    block_size: int
    scale: float
    window: int
    out: Address
    gemm: int  # the address of gemm_ir's kernel (cpu_ops.paged_attention's scores): machine code, not an array


class Glu(NamedTuple):
    """out [T, n] = act(gate) * up, act silu or (gelu) tanh-GELU."""

    gate: Address
    up: Address
    T: int
    n: int
    gelu: bool
    out: Address


class Add(NamedTuple):
    """out [n] = x + y."""

    x: Address
    y: Address
    out: Address
    n: int


class Scale(NamedTuple):
    """out [n] = x * s."""

    x: Address
    s: float
    out: Address
    n: int


class TakeRows(NamedTuple):
    """out [S, d] = x [?, d][rows [S]]."""

    x: Address
    rows: Address
    S: int
    d: int
    out: Address


_RECORDS: list[type] = []  # opcode i + 1 is _RECORDS[i]
_FIELDS: dict[type, tuple[tuple[str, object], ...]] = {}  # record -> its fields' (name, type), in column order


def _opcode(record: type) -> tuple[int, typing.Any]:
    """Register record as the next opcode: (the opcode, a record whose fields are their columns)."""
    _RECORDS.append(record)
    _FIELDS[record] = tuple(typing.get_type_hints(record).items())
    return len(_RECORDS), record(*range(1, 1 + len(_FIELDS[record])))


OP_RMS_NORM, RMS_NORM = _opcode(RmsNorm)
OP_LINEARS, LINEARS = _opcode(Linears)
OP_BIAS, BIAS = _opcode(Bias)
OP_ROPE_TABLE, ROPE_TABLE = _opcode(RopeTable)
OP_ROPE, ROPE = _opcode(Rope)
OP_STORE_KV, STORE_KV = _opcode(StoreKv)
OP_ATTENTION, ATTENTION = _opcode(Attention)
OP_GLU, GLU = _opcode(Glu)
OP_ADD, ADD = _opcode(Add)
OP_SCALE, SCALE = _opcode(Scale)
OP_TAKE_ROWS, TAKE_ROWS = _opcode(TakeRows)
OP_AMX_LINEARS, AMX_LINEARS = _opcode(AmxLinears)

WIDTH = 1 + max(len(fields) for fields in _FIELDS.values())  # int64 columns per node
JOB_COLUMNS = row_driver.JOB_COLUMNS  # products' job table rows
AMX_JOB_COLUMNS = amx_products.JOB_COLUMNS


def f32_bits(v: float) -> int:
    """v as float32, its bits as a (signed) int: how nodes carry floats."""
    return int(np.float32(v).view(np.int32))


def pack(node: tuple[object, ...]) -> np.ndarray:
    """The row [WIDTH] int64 of a node, one of the records above. TypeError naming the
    field for a value that is not its type: an Address a nonzero integer, an int an
    integer, a bool a bool, a float a real number (stored as its f32 bits)."""
    fields = _FIELDS.get(type(node))
    if fields is None:
        raise TypeError(f"{type(node).__name__} is not a tape record")
    row = np.zeros(WIDTH, np.int64)
    row[0] = _RECORDS.index(type(node)) + 1
    for col, ((name, kind), value) in enumerate(zip(fields, node), start=1):
        row[col] = _column(f"{type(node).__name__}.{name}", kind, value)
    return row


def _column(where: str, kind: object, value: object) -> int:
    """value as the int64 its column holds, or TypeError saying what `where` wants."""
    is_bool = isinstance(value, (bool, np.bool_))
    if kind is bool:
        if not is_bool:
            raise TypeError(f"{where} is {type(value).__name__}, wants a bool")
        return int(bool(value))
    if kind is float:
        if is_bool or not isinstance(value, numbers.Real):
            raise TypeError(f"{where} is {type(value).__name__}, wants a float")
        return f32_bits(float(value))
    if is_bool or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where} is {type(value).__name__}, wants {'an address' if kind is Address else 'an integer'}")
    if kind is Address and value == 0:
        raise TypeError(f"{where} is the null address")
    return int(value)


def _pointer(nbtype: Any) -> Callable[..., Any]:
    """An intrinsic of compiled code: an int64 address as a pointer to `nbtype`, for carray."""

    @intrinsic
    def pointer(typingctx: Any, addr: Any) -> Typing:
        """The int64 address `addr` as a pointer to {nbtype}, for numba.carray."""
        sig = nt.CPointer(nbtype)(nt.int64)  # type: ignore[no-untyped-call]  # numba's, untyped

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    return pointer


_f32p, _u16p, _i64p, _i32p, _i8p = (_pointer(t) for t in (nt.float32, nt.uint16, nt.int64, nt.int32, nt.int8))


@njit(inline="always")
def _f32(bits: Int) -> np.float32:
    """The float32 a node's column carries as its bits."""
    value: np.float32 = _f32_from_bits(np.int32(bits))
    return value


@cached_njit(nogil=True)
def replay(nodes: np.ndarray) -> None:
    """Run nodes [n, WIDTH] int64 (rows `pack` made) in order."""
    for i in range(nodes.shape[0]):
        a = nodes[i]
        op = a[0]
        if op == OP_RMS_NORM:
            rows, n = a[RMS_NORM.rows], a[RMS_NORM.n]
            x, out = carray(_f32p(a[RMS_NORM.x]), (rows, n)), carray(_f32p(a[RMS_NORM.out]), (rows, n))
            w = carray(_f32p(a[RMS_NORM.w]), (n,))
            if rows >= PARALLEL_ROWS:
                ops.rms_norm(x, w, _f32(a[RMS_NORM.eps]), out)
            else:
                ops.rms_norm_one(x, w, _f32(a[RMS_NORM.eps]), out)
        elif op == OP_LINEARS:
            jobs = carray(_i64p(a[LINEARS.jobs]), (a[LINEARS.njobs], JOB_COLUMNS))
            x = carray(_f32p(a[LINEARS.x]), (a[LINEARS.T], a[LINEARS.cols]))
            ci._product(jobs, x, a[LINEARS.order], a[LINEARS.group], a[LINEARS.nsteps], a[LINEARS.nchunks],
                        carray(_f32p(a[LINEARS.out]), (a[LINEARS.out_floats],)))
        elif op == OP_AMX_LINEARS:
            T, cols, group = a[AMX_LINEARS.T], a[AMX_LINEARS.cols], a[AMX_LINEARS.group]
            tp = amx_products.padded_rows(T)  # the scratch's rows
            amx_products.product_in(
                carray(_i64p(a[AMX_LINEARS.jobs]), (a[AMX_LINEARS.njobs], AMX_JOB_COLUMNS)),
                carray(_f32p(a[AMX_LINEARS.x]), (T, cols)), group, carray(_i8p(a[AMX_LINEARS.a]), (tp, cols)),
                carray(_f32p(a[AMX_LINEARS.s]), (tp, cols // group)), carray(_f32p(a[AMX_LINEARS.n]), (tp, cols // 32)),
                carray(_i8p(a[AMX_LINEARS.cs]), (tp, max(cols // 256, 1), 2, 64)),
                carray(_f32p(a[AMX_LINEARS.out]), (a[AMX_LINEARS.out_floats],)))
        elif op == OP_BIAS:
            T, n = a[BIAS.T], a[BIAS.n]
            out, b = carray(_f32p(a[BIAS.out]), (T, n)), carray(_f32p(a[BIAS.b]), (n,))
            for t in range(T):
                out[t] += b
        elif op == OP_ROPE_TABLE:
            T, half = a[ROPE_TABLE.T], a[ROPE_TABLE.half]
            cos, sin = carray(_f32p(a[ROPE_TABLE.cos]), (T, half)), carray(_f32p(a[ROPE_TABLE.sin]), (T, half))
            positions = carray(_i64p(a[ROPE_TABLE.positions]), (T,))
            inv_freq = carray(_f32p(a[ROPE_TABLE.inv_freq]), (half,))
            ops.rope_table(positions, inv_freq, cos, sin)
            m = _f32(a[ROPE_TABLE.mscale])
            if m != 1:
                cos *= m
                sin *= m
        elif op == OP_ROPE:
            T, H, hd, half = a[ROPE.T], a[ROPE.H], a[ROPE.hd], a[ROPE.half]
            x, out = carray(_f32p(a[ROPE.x]), (T, H, hd)), carray(_f32p(a[ROPE.out]), (T, H, hd))
            cos, sin = carray(_f32p(a[ROPE.cos]), (T, half)), carray(_f32p(a[ROPE.sin]), (T, half))
            if T >= PARALLEL_ROWS:
                ops.rope(x, cos, sin, a[ROPE.interleaved] != 0, out)
            else:
                ops.rope_one(x, cos, sin, a[ROPE.interleaved] != 0, out)
        elif op == OP_STORE_KV:
            width, T, nslots = a[STORE_KV.width], a[STORE_KV.T], a[STORE_KV.nslots]
            slots, x = carray(_i64p(a[STORE_KV.slots]), (T,)), carray(_f32p(a[STORE_KV.x]), (T, width))
            if a[STORE_KV.f16]:
                ops.store_f16_one(carray(_u16p(a[STORE_KV.pool]), (nslots, width)), slots, x)
            else:
                pool = carray(_f32p(a[STORE_KV.pool]), (nslots, width))
                for t in range(T):
                    pool[slots[t]] = x[t]
        elif op == OP_ATTENTION:
            T, H, hd = a[ATTENTION.T], a[ATTENTION.H], a[ATTENTION.hd]
            nslots, Hkv = a[ATTENTION.nslots], a[ATTENTION.Hkv]
            q, out = carray(_f32p(a[ATTENTION.q]), (T, H, hd)), carray(_f32p(a[ATTENTION.out]), (T, H, hd))
            rows = carray(_i64p(a[ATTENTION.rows]), (a[ATTENTION.nrows],))
            positions, row_seq = carray(_i64p(a[ATTENTION.positions]), (T,)), carray(_i64p(a[ATTENTION.row_seq]), (T,))
            tables = carray(_i32p(a[ATTENTION.tables]), (a[ATTENTION.S], a[ATTENTION.B]))
            block_size, scale, window = a[ATTENTION.block_size], _f32(a[ATTENTION.scale]), a[ATTENTION.window]
            if a[ATTENTION.f16]:
                kp = carray(_u16p(a[ATTENTION.k_pool]), (nslots, Hkv, hd))
                vp = carray(_u16p(a[ATTENTION.v_pool]), (nslots, Hkv, hd))
                ops.paged_attention(a[ATTENTION.gemm], q, kp, vp, rows, positions, row_seq, tables, block_size, scale,
                                    window, out)
            else:
                kf = carray(_f32p(a[ATTENTION.k_pool]), (nslots, Hkv, hd))
                vf = carray(_f32p(a[ATTENTION.v_pool]), (nslots, Hkv, hd))
                ops.paged_attention(a[ATTENTION.gemm], q, kf, vf, rows, positions, row_seq, tables, block_size, scale,
                                    window, out)
        elif op == OP_GLU:
            T, n = a[GLU.T], a[GLU.n]
            gate, up = carray(_f32p(a[GLU.gate]), (T, n)), carray(_f32p(a[GLU.up]), (T, n))
            out = carray(_f32p(a[GLU.out]), (T, n))
            if T >= PARALLEL_ROWS:
                ops.glu(gate, up, a[GLU.gelu] != 0, out)
            else:
                ops.glu_one(gate, up, a[GLU.gelu] != 0, out)
        elif op == OP_ADD:
            n = a[ADD.n]
            x, y, out = carray(_f32p(a[ADD.x]), (n,)), carray(_f32p(a[ADD.y]), (n,)), carray(_f32p(a[ADD.out]), (n,))
            for j in range(n):
                out[j] = x[j] + y[j]
        elif op == OP_SCALE:
            n = a[SCALE.n]
            x, out = carray(_f32p(a[SCALE.x]), (n,)), carray(_f32p(a[SCALE.out]), (n,))
            s = _f32(a[SCALE.s])
            for j in range(n):
                out[j] = x[j] * s
        elif op == OP_TAKE_ROWS:
            S, d = a[TAKE_ROWS.S], a[TAKE_ROWS.d]
            rows, out = carray(_i64p(a[TAKE_ROWS.rows]), (S,)), carray(_f32p(a[TAKE_ROWS.out]), (S, d))
            for r in range(S):
                out[r] = carray(_f32p(a[TAKE_ROWS.x] + rows[r] * d * 4), (d,))
        else:
            raise ValueError("unknown tape opcode")
