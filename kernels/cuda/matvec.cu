// Quantized matrix-vector products for decode: y[t, n] = sum_k W[n, k] * x[t, k] (+ b[n])
// for up to MV_MAX_COLS activation rows t, reading W in its GGUF block format.
//
// W is [N rows, row_stride bytes]: each row is K/QK whole GGUF blocks, padded to a
// 16-byte multiple so every row starts 16-byte aligned. One warp owns one output row:
// it streams the row through shared memory in tiles of 32 segments with coalesced
// 16-byte loads (ld.global.nc), then each lane dequantizes one segment in registers and
// dots it with the activations (f32, accumulated in f32). No atomics: each warp writes
// its own outputs after a shuffle reduction.
#include "dequant.cuh"

#define MV_WARPS 4
#define MV_MAX_COLS 8

template <int QT>
__device__ __forceinline__ void matvec_impl(
    const u8* __restrict__ W, long long row_stride, int K, int N,
    const float* __restrict__ x, int ldx,  // [ncols, ldx] f32, 16-byte aligned rows
    float* __restrict__ y, int ldy,        // [ncols, ldy] f32
    int ncols, const float* __restrict__ bias) {
    constexpr int QK = QTraits<QT>::QK, BB = QTraits<QT>::BB, PARTS = QTraits<QT>::PARTS;
    constexpr int SEG = QK / PARTS;
    constexpr int NB = 32 / PARTS;               // blocks per tile: one segment per lane
    constexpr int TILE16 = NB * BB / 16;         // tile size in 16-byte words
    static_assert((NB * BB) % 16 == 0, "tile must be whole 16-byte words");
    __shared__ uint4 tile[MV_WARPS][TILE16];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row = blockIdx.x * MV_WARPS + warp;
    if (row >= N) return;  // the whole warp leaves; only __syncwarp below
    const u8* wrow = W + (long long)row * row_stride;
    const int nbr = K / QK;  // blocks per row
    const int blk = lane / PARTS, part = lane % PARTS;

    float acc[MV_MAX_COLS];
#pragma unroll
    for (int t = 0; t < MV_MAX_COLS; ++t) acc[t] = 0.f;

    for (int b0 = 0; b0 < nbr; b0 += NB) {
        const int nblk = min(NB, nbr - b0);
        const int n16 = (nblk * BB + 15) / 16;  // stays inside the padded row
        const uint4* src = (const uint4*)(wrow + (long long)b0 * BB);
        for (int i = lane; i < n16; i += 32) tile[warp][i] = __ldg(src + i);
        __syncwarp();
        if (blk < nblk) {
            float v[SEG];
            dequant_seg<QT>((const u8*)tile[warp] + blk * BB, part, v);
            const long long k0 = (long long)(b0 + blk) * QK;
#pragma unroll
            for (int t = 0; t < MV_MAX_COLS; ++t) {
                if (t < ncols) {
                    const float* xr = x + (long long)t * ldx + k0;
                    float s = 0.f;
#pragma unroll
                    for (int i = 0; i < SEG; i += 4) {
                        // 4 consecutive outputs of a segment are 4 consecutive elements
                        const float4 xv = *(const float4*)(xr + seg_elem<QT>(part, i));
                        s += v[i] * xv.x + v[i + 1] * xv.y + v[i + 2] * xv.z + v[i + 3] * xv.w;
                    }
                    acc[t] += s;
                }
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int t = 0; t < MV_MAX_COLS; ++t) {
        if (t < ncols) {
            float s = acc[t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) y[(long long)t * ldy + row] = bias ? s + bias[row] : s;
        }
    }
}

#define MATVEC(name, QT)                                                                    \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) name(                       \
        const u8* W, long long row_stride, int K, int N, const float* x, int ldx, float* y, \
        int ldy, int ncols, const float* bias) {                                            \
        matvec_impl<QT>(W, row_stride, K, N, x, ldx, y, ldy, ncols, bias);                  \
    }

MATVEC(mv_f32, QT_F32)
MATVEC(mv_f16, QT_F16)
MATVEC(mv_bf16, QT_BF16)
MATVEC(mv_q4_0, QT_Q4_0)
MATVEC(mv_q4_1, QT_Q4_1)
MATVEC(mv_q5_0, QT_Q5_0)
MATVEC(mv_q8_0, QT_Q8_0)
MATVEC(mv_q4_k, QT_Q4_K)
MATVEC(mv_q6_k, QT_Q6_K)
