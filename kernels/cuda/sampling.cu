// On-device sampling support: the top-k candidates of each logits row, so only k ids and
// values per row leave the GPU (k = 1 is argmax). Order: value descending, then lower
// id first (numpy's stable argsort of -logits). NaN entries are never chosen.
//
// One block of TOPK_THREADS per row; k passes, each a block-wide argmax over the entries
// that rank after the previous pick. Simple and exact; O(k * V) reads per row, mostly
// from L2.

#include <math_constants.h>

#define TOPK_THREADS 1024

__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_rows(
    const float* __restrict__ logits, long long ld, int V, int k,
    long long* __restrict__ out_ids, float* __restrict__ out_vals) {  // [R, k] each
    __shared__ float s_v[TOPK_THREADS / 32];
    __shared__ int s_i[TOPK_THREADS / 32];
    __shared__ float prev_v;
    __shared__ int prev_i;
    const float* row = logits + (long long)blockIdx.x * ld;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) { prev_v = CUDART_INF_F; prev_i = -1; }
    __syncthreads();
    for (int r = 0; r < k; ++r) {
        const float pv = prev_v;
        const int pi = prev_i;
        float bv = -CUDART_INF_F;
        int bi = -1;
        for (int i = threadIdx.x; i < V; i += TOPK_THREADS) {
            const float v = row[i];
            if (v != v) continue;                       // NaN
            if (!ranks_before(pv, pi, v, i)) continue;  // already picked
            if (bi < 0 || ranks_before(v, i, bv, bi)) { bv = v; bi = i; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ranks_before(ov, oi, bv, bi))) { bv = ov; bi = oi; }
        }
        if (lane == 0) { s_v[warp] = bv; s_i[warp] = bi; }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < TOPK_THREADS / 32; ++w)
                if (s_i[w] >= 0 && (bi < 0 || ranks_before(s_v[w], s_i[w], bv, bi))) { bv = s_v[w]; bi = s_i[w]; }
            out_ids[(long long)blockIdx.x * k + r] = bi;
            out_vals[(long long)blockIdx.x * k + r] = bi >= 0 ? bv : -CUDART_INF_F;
            prev_v = bv;
            prev_i = bi;
        }
        __syncthreads();
    }
}
