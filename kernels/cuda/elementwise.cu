// Row and element kernels of the forward pass: RMSNorm, RoPE (both layouts), GLU.
// All f32, with the rounding order of kernels/reference.py where it is cheap to keep
// (explicit _rn intrinsics stop nvcc from fusing a*b - c into one FMA).

#define GELU_C 0.7978845608028654f  // sqrt(2 / pi)

// y[r, :] = x[r, :] * (1 / sqrt(mean(x[r, :]^2) + eps)) * w. One block per row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ y, int n, float eps) {
    __shared__ float partial[32];
    const float* xr = x + (long long)blockIdx.x * n;
    float* yr = y + (long long)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < (int)(blockDim.x / 32) ? partial[lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) partial[0] = s;
    }
    __syncthreads();
    const float inv = 1.0f / sqrtf(partial[0] / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
}

// Rotary embedding of x [T, heads, hd] at positions [T] into y (same shape); dims past
// rope_dim are copied. interleaved: pairs (2i, 2i+1); else halves (i, i + rope_dim/2).
// One thread per element.
extern "C" __global__ void rope(const float* __restrict__ x, const long long* __restrict__ positions,
                                float* __restrict__ y, int T, int heads, int hd, int rope_dim,
                                float base, int interleaved) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)T * heads * hd) return;
    const int j = (int)(id % hd);
    const long long t = id / ((long long)heads * hd);
    if (j >= rope_dim) {
        y[id] = x[id];
        return;
    }
    const long long row = id - j;  // start of this head's vector
    const int half = rope_dim / 2;
    int i, ia, ib;
    bool first;
    if (interleaved) {
        i = j / 2; ia = 2 * i; ib = 2 * i + 1; first = (j % 2) == 0;
    } else {
        i = j % half; ia = i; ib = i + half; first = j < half;
    }
    const float inv_freq = powf(base, -(float)(2 * i) / (float)rope_dim);
    const float theta = __fmul_rn((float)positions[t], inv_freq);
    float s, c;
    sincosf(theta, &s, &c);
    const float a = x[row + ia], b = x[row + ib];
    y[id] = first ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

// out = act(gate) * up over n elements; act 0 = silu, 1 = gelu (tanh approximation).
extern "C" __global__ void glu(const float* __restrict__ gate, const float* __restrict__ up,
                               float* __restrict__ out, long long n, int act) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    float a;
    if (act == 0) {
        a = g / (1.0f + expf(-g));
    } else {
        const float inner = GELU_C * (g + 0.044715f * g * g * g);
        a = 0.5f * g * (1.0f + tanhf(inner));
    }
    out[i] = a * up[i];
}
