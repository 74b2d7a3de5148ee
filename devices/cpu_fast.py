"""The fast CPU device: GGUF blocks kept as blocks, numba kernels over all cores.

Same protocol as the numpy oracle (devices/cpu.py) and its numbers up to f32
summation order, except where the int8 kernels round activations as llama.cpp does.

Linears: each matrix's kernel is chosen once, at upload (devices/cpu_fast_linears.py):
int8 kernels (VNNI, else AVX2) where the CPU has them (activations rounded to int8 per 32 values, per
256 for K-quants, as llama.cpp computes), else the float quantized kernel for small rounds and BLAS for
larger ones, else (types without a packed kernel) f32 through BLAS.

Attention: one numba kernel over every short row of the round (decode, small appends),
and for a sequence's long chunk a blocked kernel over the causal triangle
(kernels/cpu_fast/cpu_prefill_attention.py). Neither uses BLAS.

Threads: OpenBLAS's workers spin for a while after each call, and numba's parallel
kernels then fight them for the same cores. So in a round whose linears go through BLAS,
the numba kernels run on one thread;
every other round uses every core and no BLAS, unless its shape ran faster on one
thread lately: when other processes take cores, a team waits at every parallel region
for the thread that lost its core (devices/cpu_team.py times the rounds and chooses).

Decode graphs (decode_graphs=True, the engine's default): a decode round of up to 16
sequences is recorded once per bucket and then replayed in one numba call, with no Python
between its kernels (devices/cpu_graph.py). run_round records it by running the forward
on a GraphRecorder (devices/cpu_graph_recorder.py) instead of this device: the ops below
always compute.
"""

from __future__ import annotations

import time

import numba
import numpy as np
from gguf import GGMLQuantizationType as QT

from zinfer.devices.base import DeviceBase, Layers
from zinfer.devices.batch import ForwardBatch
from zinfer.devices.cpu import CpuKV
from zinfer.devices.cpu_fast_linears import SMALL_BATCH, F32Budget, F32Linear, FastWeight, linear_for
from zinfer.devices.cpu_fast_round import FastRoundCtx
from zinfer.devices.cpu_graph import DecodeGraphs, GraphKV, ReplayCompile
from zinfer.devices.cpu_team import ThreadGovernor
from zinfer.devices.fallback import F32Fallbacks
from zinfer.devices.memory_populate import Populate
from zinfer.kernels.cpu_fast.int8 import products as ci
from zinfer.kernels.cpu_fast import compile_cache
from zinfer.kernels.cpu_fast import cpu_ops as ops
from zinfer.kernels.cpu_fast import cpu_prefill_attention as prefill
from zinfer.kernels.cpu_fast import gemm_ir
from zinfer.kernels.tensor import TensorData
from zinfer.kernels.oracle.quants import dequantize
from zinfer.kernels.oracle.rope import RopeScaling


class FastCpuDevice(DeviceBase):
    """Numba CPU device. `threads`: numba threads (default: all); `f32_cache_bytes`:
    memory allowed for f32 copies of quantized matrices (used for large batches);
    `int8`: use the int8 kernels (default: where the CPU has VNNI or AVX2); `kv_f16`: keep K and V
    in f16, as llama.cpp does by default (half the bytes that attention reads; at 16
    streams those are as many as the weights), else f32 as the oracle does;
    `decode_graphs`: each pool alloc_kv makes records and replays its decode rounds
    (devices/cpu_graph.py; off here, the engine's CpuFastConfig turns it on);
    `adaptive_threads`: each round shape runs on 1 thread instead of all while that is
    faster (devices/cpu_team.py), else always on all."""

    name = "cpu-fast"

    def __init__(self, threads: int | None = None, f32_cache_bytes: int = 1 << 30, int8: bool | None = None,
                 kv_f16: bool = True, decode_graphs: bool = False, adaptive_threads: bool = True) -> None:
        if threads is not None:
            numba.set_num_threads(threads)
        self.threads = numba.get_num_threads()
        self.team = ThreadGovernor(self.threads if adaptive_threads else 1, time.perf_counter)
        self.round_threads = self.threads  # numba threads of the round being run (run_round sets it)
        self.f32_budget = F32Budget(f32_cache_bytes)  # spent by uploads on f32 copies
        self.fallbacks = F32Fallbacks("cpu-fast")  # types without a packed kernel, warned once each
        compile_cache.route_compiles()  # numba kernels missing from the cache compile in its helper
        self.int8 = ci.available() if int8 is None else int8 and ci.available()
        # the int8 kernels asked for (amx, vnni, avx2): what upload makes follows it, so the weight cache keys it
        self.int8_kernels = ci.kernels_choice() if self.int8 else "float"
        gemm_ir.address()  # the decode GEMM kernel, compiled here on the constructing thread, not in a round
        gemm_ir.prefill_rows()  # and the prefill one
        self.kv_dtype = np.float16 if kv_f16 else np.float32
        self._jobs: dict[tuple[int, ...], tuple[tuple[FastWeight, ...], list[Int8Group]]] = {}  # ids -> (ws, groups)
        self.decode_graphs = decode_graphs
        self.replay_compile = ReplayCompile()  # started by the first eager decode round on a GraphKV
        self._populating: list[Populate] = []  # the KV pools' background page population
        self.last_round_replayed = False  # whether the last run_round replayed a graph (traces/kernels.py)

    # ---- weights and KV ----

    def upload(self, name: str, tensor: TensorData) -> np.ndarray | FastWeight:
        """Vectors (and tensors of other ranks) as f32 arrays; matrices as a FastWeight
        carrying the kernel chosen for it here (devices/cpu_fast_linears.py). A type with
        no packed kernel becomes f32, warned once per type; one kernels.oracle.quants cannot
        read raises UnsupportedTensorType (the loader adds the tensor's name)."""
        qt = QT(tensor.qtype)
        if len(tensor.shape) != 2:
            return np.ascontiguousarray(dequantize(tensor.data, qt, tensor.shape), dtype=np.float32)
        w = linear_for(qt, tensor.data, (int(tensor.shape[0]), int(tensor.shape[1])), self.int8, self.f32_budget)
        if isinstance(w, F32Linear) and qt != QT.F32:
            values = tensor.shape[0] * tensor.shape[1]
            why = "no packed cpu-fast kernel for this type"
            self.fallbacks.note(name, qt.name, values, np.asarray(tensor.data).nbytes, why)
        return w

    def alloc_kv(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int) -> CpuKV:
        """A zeroed pool, its pages populated in the background (devices/memory_populate.py);
        with decode graphs a GraphKV, which carries the graphs recorded over it."""
        if not self.decode_graphs:
            kv = CpuKV.zeros(n_layers, n_kv_heads, head_dim, num_blocks, block_size, self.kv_dtype)
        else:
            kv = GraphKV.allocate(n_layers, n_kv_heads, head_dim, num_blocks, block_size, self.kv_dtype)
        self._populating.append(Populate(kv.k + kv.v))
        return kv

    # ---- rounds ----

    def run_round(self, layers: Layers[CpuKV, FastRoundCtx], batch: ForwardBatch, kv: CpuKV) -> np.ndarray:
        """layers(self, ctx) -> logits [S, vocab]; on a GraphKV, a decode round replays the
        graph that pool recorded for its bucket (recording it the first time, with layers on
        a GraphRecorder). Until the replay kernel is compiled (on a thread, after the first
        eager decode round) rounds run eagerly. The round runs on the thread count
        self.team chooses for its shape, and its time is reported back to it."""
        graphs = kv.graphs if isinstance(kv, GraphKV) else None
        eligible = graphs is not None and graphs.eligible(batch)
        replay = graphs if eligible and self.replay_compile.ready else None
        if replay is not None:
            key: tuple[object, ...] = ("graph", DecodeGraphs.bucket(len(batch.seqs)))
        else:
            key = ("eager", batch.n_tokens.bit_length(), len(batch.seqs) == batch.n_tokens)
        self.round_threads = self.team.choose(key) if self.team.threads > 1 else self.threads
        self.last_round_replayed = False
        start = time.perf_counter()
        if replay is not None:
            self._threads_for(batch.n_tokens)
            out = replay.run(self, layers, batch)
            self.last_round_replayed = replay.last_replayed
        else:
            out = layers(self, self.begin_round(batch))
            if eligible:
                self.replay_compile.start()
        self.team.record(key, self.round_threads, time.perf_counter() - start)
        return out

    def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the background work (the replay compile, the KV pools'
        population); whether it is done."""
        deadline = time.monotonic() + timeout
        done = self.replay_compile.wait(timeout)
        return all(p.wait(max(0.0, deadline - time.monotonic())) for p in self._populating) and done

    # ---- ops ----

    def _blas_round(self, rows: int) -> bool:
        """Whether a round of `rows` token rows computes its linears through BLAS."""
        return not self.int8 and rows > SMALL_BATCH

    def _threads_for(self, rows: int) -> None:
        """Numba threads for a round of `rows` token rows: round_threads (all of them unless
        one was faster lately) unless BLAS is busy too."""
        want = 1 if self._blas_round(rows) else self.round_threads
        if numba.get_num_threads() != want:
            numba.set_num_threads(want)

    def begin_round(self, batch: ForwardBatch) -> FastRoundCtx:
        """The round's ctx; sets numba's thread count for a round of this many rows."""
        self._threads_for(batch.n_tokens)
        arrays = (batch.token_ids, batch.positions, batch.slots, batch.logits_rows)
        return FastRoundCtx(batch, *(np.ascontiguousarray(a, dtype=np.int64) for a in arrays))

    def embed(self, table: np.ndarray | FastWeight, token_ids: np.ndarray) -> np.ndarray:
        """Rows of table (an f32 array or a FastWeight) for token_ids [T] -> a new [T, d] array."""
        ids = np.ascontiguousarray(token_ids, dtype=np.int64)
        f32 = table if isinstance(table, np.ndarray) else table.f32
        if f32 is not None:
            rows: np.ndarray = f32[ids]  # [T, d]
            return rows
        assert isinstance(table, FastWeight)
        out = np.empty((ids.shape[0], table.shape[1]), np.float32)  # [T, d]
        table.dequantize_rows(ids, out)  # packed blocks, or the int8 kernels' own layout (Q5_0, Q6_K)
        return out

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(x)
        n = x.shape[-1]
        rows = x.size // n
        kernel = ops.rms_norm if rows >= ops.PARALLEL_ROWS else ops.rms_norm_one
        kernel(x.reshape(rows, n), w, np.float32(eps), out.reshape(rows, n))
        return out

    def linear(self, x: np.ndarray, w: FastWeight, b: np.ndarray | None = None) -> np.ndarray:
        return self.linears(x, (w,), (b,))[0]

    def linears(self, x: np.ndarray, ws: tuple[FastWeight, ...], bs: tuple[np.ndarray | None, ...]) -> list[np.ndarray]:
        """Each weight computes with its own kernel; Int8Linear matrices of one layout
        (q/k/v, gate/up) share one rounding of x and one launch."""
        x = np.ascontiguousarray(x, dtype=np.float32)  # [T, in]
        done: dict[int, np.ndarray] = {}  # index in ws -> its output [T, rows]
        for jobs, members in self.int8_jobs(ws):
            done.update(zip(members, ci.matmul_many(jobs, x)))
        outs = [done[i] if i in done else w.compute(x) for i, w in enumerate(ws)]
        for out, b in zip(outs, bs):
            if b is not None:
                out += b
        return outs

    def int8_jobs(self, ws: tuple[FastWeight, ...]) -> list[Int8Group]:
        """ws's int8 matrices grouped by activation layout: [(their jobs, their indices in ws)]."""
        key = tuple(map(id, ws))
        cached = self._jobs.get(key)
        if cached is None:
            groups = [(ci.jobs_for([_int8_of(ws[i]) for i in idx]), idx) for idx in _int8_groups(ws)]
            self._jobs[key] = cached = (ws, groups)  # ws pinned: their ids stay theirs
        return cached[1]

    def rope(self, x: np.ndarray, ctx: FastRoundCtx, base: float, rope_dim: int, interleaved: bool,
             scaling: RopeScaling | None = None) -> np.ndarray:
        cos, sin = ctx.rope(base, rope_dim, scaling)  # [T, rope_dim/2] each
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(x)
        (ops.rope if x.shape[0] >= ops.PARALLEL_ROWS else ops.rope_one)(x, cos, sin, bool(interleaved), out)
        return out

    def write_kv(self, kv: CpuKV, layer: int, k: np.ndarray, v: np.ndarray, ctx: FastRoundCtx) -> None:
        slots = ctx.slots  # [T] int64, contiguous
        if kv.k[layer].dtype != np.float16:
            kv.k[layer][slots] = k
            kv.v[layer][slots] = v
            return
        store = ops.store_f16 if k.shape[0] >= ops.PARALLEL_ROWS else ops.store_f16_one  # not numpy's f16 cast (slow)
        for pool, x in ((kv.k[layer], k), (kv.v[layer], v)):
            store(pool.view(np.uint16), slots, np.ascontiguousarray(x, dtype=np.float32))

    def attention(self, q: np.ndarray, kv: CpuKV, layer: int, ctx: FastRoundCtx, scale: float,
                  window: int) -> np.ndarray:
        q = np.ascontiguousarray(q, dtype=np.float32)  # [T, H, hd]
        out = np.empty_like(q)
        kp, vp = (a.view(np.uint16) if a.dtype == np.float16 else a for a in (kv.k[layer], kv.v[layer]))
        split = ctx.attention_split(prefill.supported(q.shape[2]))
        for s in split.long:
            rows = slice(s.start, s.start + s.n_tokens)
            self._chunk_attention(q[rows], kp, vp, kv.block_size, s.block_table, ctx.positions[rows], scale, window,
                                  out[rows])
        if split.short is not None:
            short_rows, row_seq, tables = split.short
            ops.paged_attention(gemm_ir.compiled_address(), q, kp, vp, short_rows, ctx.positions, row_seq, tables,
                                kv.block_size, np.float32(scale), int(window), out)
        return out

    @staticmethod
    def _chunk_attention(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, block_size: int,
                         block_table: np.ndarray, positions: np.ndarray, scale: float, window: int,
                         out: np.ndarray) -> None:
        """One sequence's chunk q, out [n, H, hd] at `positions` (increasing), its keys
        gathered once from the pools (k_pool, v_pool [slots, Hkv, hd], f32 or f16 bits) into
        f32 scratch."""
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        k0 = max(0, int(positions[0]) - window + 1) if window else 0  # the first key any row sees
        n_keys = int(positions[-1]) + 1 - k0
        Hkv, hd = k_pool.shape[1], k_pool.shape[2]
        kt = np.zeros((Hkv, hd, n_keys + gemm_ir.NR), np.float32)  # keys transposed, zero-padded
        v = np.zeros((Hkv, n_keys + gemm_ir.NR, hd), np.float32)
        prefill.gather_keys_values(k_pool, v_pool, np.asarray(block_table, np.int32), block_size, k0, kt, v)
        mr = gemm_ir.prefill_rows()
        prefill.chunk_attention(gemm_ir.compiled_address(mr), mr, q, kt, v, positions, k0, np.float32(scale),
                                int(window), out)

    def glu(self, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
        gate = np.ascontiguousarray(gate, dtype=np.float32)  # strided rows would not vectorize
        up = np.ascontiguousarray(up, dtype=np.float32)
        out = np.empty_like(gate)
        (ops.glu if gate.shape[0] >= ops.PARALLEL_ROWS else ops.glu_one)(gate, up, act != "silu", out)
        return out



Int8Group = tuple[ci.Jobs, list[int]]  # one launch's jobs, and the indices of its matrices in the ws given


def _int8_of(w: FastWeight) -> ci.Int8Weight:
    if w.int8 is None:
        raise ValueError(f"{type(w).__name__} has no int8 view")
    return w.int8


def _int8_groups(ws: tuple[FastWeight, ...]) -> list[list[int]]:
    """Indices of the matrices with int8 kernels, grouped by activation layout."""
    groups: list[list[int]] = []
    for i, w in enumerate(ws):
        if w.int8 is not None:
            group = next((g for g in groups if ci.same_layout(_int8_of(ws[g[0]]), w.int8)), None)
            if group is None:
                groups.append([i])
            else:
                group.append(i)
    return groups
