// Dequantize whole rows of a GGUF-block weight to f32 or f16: the prefill path
// (dequantize into a reused scratch, then a cuBLAS GEMM) and embedding lookups
// (rows = token ids). One thread per segment (32 or 64 values).
#include "dequant.cuh"

template <int QT, typename OutT>
__device__ __forceinline__ void dequant_rows_impl(
    const u8* __restrict__ W, long long row_stride, int K, int n_rows,
    const long long* __restrict__ rows,  // [n_rows] source rows, or null for 0..n_rows-1
    OutT* __restrict__ out, long long ldo) {  // [n_rows, ldo]
    constexpr int QK = QTraits<QT>::QK, BB = QTraits<QT>::BB, PARTS = QTraits<QT>::PARTS;
    constexpr int SEG = QK / PARTS;
    const long long segs_per_row = (long long)(K / QK) * PARTS;
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= segs_per_row * n_rows) return;
    const long long r = id / segs_per_row;
    const int s = (int)(id % segs_per_row), blk = s / PARTS, part = s % PARTS;
    const long long src = rows ? rows[r] : r;
    float v[SEG];
    dequant_seg<QT>(W + src * row_stride + (long long)blk * BB, part, v);
    OutT* o = out + r * ldo + (long long)blk * QK;
#pragma unroll
    for (int i = 0; i < SEG; ++i) o[seg_elem<QT>(part, i)] = (OutT)v[i];
}

#define DEQUANT(name, QT)                                                                     \
    extern "C" __global__ void name##_f32(const u8* W, long long row_stride, int K, int n_rows, \
                                          const long long* rows, float* out, long long ldo) {   \
        dequant_rows_impl<QT, float>(W, row_stride, K, n_rows, rows, out, ldo);                 \
    }                                                                                           \
    extern "C" __global__ void name##_f16(const u8* W, long long row_stride, int K, int n_rows, \
                                          const long long* rows, __half* out, long long ldo) {  \
        dequant_rows_impl<QT, __half>(W, row_stride, K, n_rows, rows, out, ldo);                \
    }

DEQUANT(dq_f32, QT_F32)
DEQUANT(dq_f16, QT_F16)
DEQUANT(dq_bf16, QT_BF16)
DEQUANT(dq_q4_0, QT_Q4_0)
DEQUANT(dq_q4_1, QT_Q4_1)
DEQUANT(dq_q5_0, QT_Q5_0)
DEQUANT(dq_q8_0, QT_Q8_0)
DEQUANT(dq_q4_k, QT_Q4_K)
DEQUANT(dq_q6_k, QT_Q6_K)
