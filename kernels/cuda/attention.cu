// Paged KV cache writes and attention over it.
//
// KV pools per layer are [n_slots, Hkv, hd] f32; slot = block_id * block_size + offset.
// Round metadata lives on the device (so a captured CUDA graph reads new values each
// replay): positions [T] int64, seq context lengths [S] int32, block tables [S, stride]
// int32. Key j is visible to a query at position p when j <= p and (window == 0 or
// p - j < window), as kernels/reference.attention says. GQA: head h reads KV head
// h / (H / Hkv).

#include <math_constants.h>

// kc[slots[t], :] = k[t, :] and the same for v; k, v [T, width = Hkv * hd].
extern "C" __global__ void write_kv(const float* __restrict__ k, const float* __restrict__ v,
                                    const long long* __restrict__ slots, float* __restrict__ kc,
                                    float* __restrict__ vc, int T, int width) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)T * width) return;
    const long long t = id / width, e = id % width;
    const long long dst = slots[t] * width + e;
    kc[dst] = k[id];
    vc[dst] = v[id];
}

__device__ __forceinline__ long long kv_slot(const int* table, int j, int block_size) {
    return (long long)table[j / block_size] * block_size + j % block_size;
}

#define DEC_WARPS 4
#define MAX_HD 256
#define DPL (MAX_HD / 32)  // head dims per lane

// Decode: one block per (query token, head); grid (n_dec, H). dec_rows[i] is the token
// row of the i-th decode query and dec_seq[i] its sequence. Each warp walks every
// DEC_WARPS-th visible key with an online softmax; the warps merge at the end.
extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_decode(
    const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
    float* __restrict__ out,  // q, out [T, H, hd]
    const int* __restrict__ dec_rows, const int* __restrict__ dec_seq,
    const long long* __restrict__ positions, const int* __restrict__ tables, int table_stride,
    int block_size, int H, int Hkv, int hd, float scale, int window) {
    __shared__ float s_m[DEC_WARPS], s_l[DEC_WARPS];
    __shared__ float s_acc[DEC_WARPS][MAX_HD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long t = dec_rows[blockIdx.x];
    const int s = dec_seq[blockIdx.x], h = blockIdx.y, g = h / (H / Hkv);
    const int* table = tables + (long long)s * table_stride;
    const int pos = (int)positions[t];
    const int j_lo = window > 0 ? max(0, pos - window + 1) : 0;

    float qv[DPL], acc[DPL];
    const float* qr = q + (t * H + h) * hd;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        qv[i] = d < hd ? qr[d] : 0.f;
        acc[i] = 0.f;
    }
    float m = -CUDART_INF_F, l = 0.f;
    for (int j = j_lo + warp; j <= pos; j += DEC_WARPS) {
        const long long base = (kv_slot(table, j, block_size) * Hkv + g) * hd;
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            const int d = lane + 32 * i;
            if (d < hd) dot += qv[i] * kc[base + d];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const float sc = dot * scale;
        const float m_new = fmaxf(m, sc);
        const float corr = expf(m - m_new), p = expf(sc - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            const int d = lane + 32 * i;
            if (d < hd) acc[i] = acc[i] * corr + p * vc[base + d];
        }
        m = m_new;
    }
    if (lane == 0) { s_m[warp] = m; s_l[warp] = l; }
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) s_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float M = -CUDART_INF_F;
    for (int w = 0; w < DEC_WARPS; ++w) M = fmaxf(M, s_m[w]);
    float L = 0.f, f[DEC_WARPS];
    for (int w = 0; w < DEC_WARPS; ++w) {
        f[w] = s_m[w] == -CUDART_INF_F ? 0.f : expf(s_m[w] - M);  // a warp with no keys
        L += s_l[w] * f[w];
    }
    float* o = out + (t * H + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < DEC_WARPS; ++w) a += s_acc[w][d] * f[w];
        o[d] = a / L;
    }
}

#define PQ 16        // queries per prefill tile
#define PK 16        // keys per step
#define P_THREADS 128
#define P_OREG (PQ * MAX_HD / P_THREADS)  // output values each thread owns

// Prefill: one block per (query tile, head); grid (n_tiles, H). tile_seq[i] is the
// tile's sequence, tile_q0[i] its first query within that sequence's chunk
// (rows seq_start[s] + tile_q0[i] ...). Causal + sliding window + GQA, online softmax
// over key steps staged in shared memory. Dynamic shared memory:
// (PQ + PK) * (hd + 1) + PQ * PK + 3 * PQ floats.
extern "C" __global__ void __launch_bounds__(P_THREADS) attn_prefill(
    const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
    float* __restrict__ out, const int* __restrict__ tile_seq, const int* __restrict__ tile_q0,
    const int* __restrict__ seq_start, const int* __restrict__ seq_ntok,
    const long long* __restrict__ positions, const int* __restrict__ tables, int table_stride,
    int block_size, int H, int Hkv, int hd, float scale, int window) {
    extern __shared__ float smem[];
    const int HP = hd + 1;  // padded rows: no bank conflicts on column walks
    float* Qs = smem;                 // [PQ, HP]
    float* KVs = Qs + PQ * HP;        // [PK, HP]: K, then V of the current step
    float* S = KVs + PK * HP;         // [PQ, PK] scores, then probabilities
    float* s_m = S + PQ * PK;         // [PQ]
    float* s_l = s_m + PQ;            // [PQ]
    float* s_alpha = s_l + PQ;        // [PQ]

    const int s = tile_seq[blockIdx.x], q0 = tile_q0[blockIdx.x];
    const int h = blockIdx.y, g = h / (H / Hkv);
    const int start = seq_start[s], nq = min(PQ, seq_ntok[s] - q0);
    const int* table = tables + (long long)s * table_stride;
    const int p_first = (int)positions[start + q0];
    const int p_last = (int)positions[start + q0 + nq - 1];
    const int j_lo = window > 0 ? max(0, p_first - window + 1) : 0;

    for (int e = threadIdx.x; e < PQ * hd; e += P_THREADS) {
        const int qi = e / hd, d = e % hd;
        Qs[qi * HP + d] = qi < nq ? q[((long long)(start + q0 + qi) * H + h) * hd + d] : 0.f;
    }
    if (threadIdx.x < PQ) { s_m[threadIdx.x] = -CUDART_INF_F; s_l[threadIdx.x] = 0.f; }
    float o[P_OREG];
#pragma unroll
    for (int r = 0; r < P_OREG; ++r) o[r] = 0.f;
    __syncthreads();

    for (int j0 = j_lo; j0 <= p_last; j0 += PK) {
        for (int e = threadIdx.x; e < PK * hd; e += P_THREADS) {
            const int kk = e / hd, d = e % hd, j = j0 + kk;
            KVs[kk * HP + d] = j <= p_last ? kc[(kv_slot(table, j, block_size) * Hkv + g) * hd + d] : 0.f;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < PQ * PK; e += P_THREADS) {
            const int qi = e / PK, kk = e % PK, j = j0 + kk;
            float sc = -CUDART_INF_F;
            if (qi < nq) {
                const int p = (int)positions[start + q0 + qi];
                if (j <= p && (window == 0 || p - j < window)) {
                    float dot = 0.f;
                    for (int d = 0; d < hd; ++d) dot += Qs[qi * HP + d] * KVs[kk * HP + d];
                    sc = dot * scale;
                }
            }
            S[e] = sc;
        }
        __syncthreads();
        if (threadIdx.x < PQ) {
            const int qi = threadIdx.x;
            float mx = -CUDART_INF_F;
            for (int kk = 0; kk < PK; ++kk) mx = fmaxf(mx, S[qi * PK + kk]);
            const float m_old = s_m[qi], m_new = fmaxf(m_old, mx);
            float alpha = 1.f, sum = 0.f;
            if (m_new != -CUDART_INF_F) {
                alpha = m_old == -CUDART_INF_F ? 0.f : expf(m_old - m_new);
                for (int kk = 0; kk < PK; ++kk) {
                    const float sc = S[qi * PK + kk];
                    const float p = sc == -CUDART_INF_F ? 0.f : expf(sc - m_new);
                    S[qi * PK + kk] = p;
                    sum += p;
                }
            } else {
                for (int kk = 0; kk < PK; ++kk) S[qi * PK + kk] = 0.f;
            }
            s_l[qi] = s_l[qi] * alpha + sum;
            s_m[qi] = m_new;
            s_alpha[qi] = alpha;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < PK * hd; e += P_THREADS) {
            const int kk = e / hd, d = e % hd, j = j0 + kk;
            KVs[kk * HP + d] = j <= p_last ? vc[(kv_slot(table, j, block_size) * Hkv + g) * hd + d] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < P_OREG; ++r) {
            const int e = threadIdx.x + r * P_THREADS;
            if (e < PQ * hd) {
                const int qi = e / hd, d = e % hd;
                float a = o[r] * s_alpha[qi];
                for (int kk = 0; kk < PK; ++kk) a += S[qi * PK + kk] * KVs[kk * HP + d];
                o[r] = a;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < P_OREG; ++r) {
        const int e = threadIdx.x + r * P_THREADS;
        if (e < PQ * hd) {
            const int qi = e / hd, d = e % hd;
            if (qi < nq) out[((long long)(start + q0 + qi) * H + h) * hd + d] = o[r] / s_l[qi];
        }
    }
}
