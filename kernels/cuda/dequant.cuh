// Dequantization of one "segment" of a GGUF block to float32, shared by every kernel
// that reads quantized weights (matvec, dequantize, embedding rows).
//
// Byte layouts follow ggml's block_* structs, as kernels/quants.py documents them.
// A type is described by QK (elements per block), BB (bytes per block) and PARTS
// (segments per block). A segment is SEG = QK / PARTS consecutive elements, the unit
// one thread decodes: 32 for the 32-element types, 64 for the 256-element K-quants.
// Float types (F16, BF16, F32) are treated as 32-element "blocks" of plain values.
#pragma once

#include <cuda_fp16.h>

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

// ggml type ids
#define QT_F32 0
#define QT_F16 1
#define QT_Q4_0 2
#define QT_Q4_1 3
#define QT_Q5_0 6
#define QT_Q8_0 8
#define QT_Q4_K 12
#define QT_Q6_K 14
#define QT_BF16 30

template <int QT> struct QTraits;
template <> struct QTraits<QT_F32>  { enum { QK = 32,  BB = 128, PARTS = 1 }; };
template <> struct QTraits<QT_F16>  { enum { QK = 32,  BB = 64,  PARTS = 1 }; };
template <> struct QTraits<QT_BF16> { enum { QK = 32,  BB = 64,  PARTS = 1 }; };
template <> struct QTraits<QT_Q4_0> { enum { QK = 32,  BB = 18,  PARTS = 1 }; };
template <> struct QTraits<QT_Q4_1> { enum { QK = 32,  BB = 20,  PARTS = 1 }; };
template <> struct QTraits<QT_Q5_0> { enum { QK = 32,  BB = 22,  PARTS = 1 }; };
template <> struct QTraits<QT_Q8_0> { enum { QK = 32,  BB = 34,  PARTS = 1 }; };
template <> struct QTraits<QT_Q4_K> { enum { QK = 256, BB = 144, PARTS = 4 }; };
template <> struct QTraits<QT_Q6_K> { enum { QK = 256, BB = 210, PARTS = 4 }; };

// Little-endian loads at any alignment (blocks of 18, 22, 34, 210 bytes are only
// 2-byte aligned, or not at all).
__device__ __forceinline__ float ld_f16(const u8* p) {
    u16 bits = (u16)p[0] | ((u16)p[1] << 8);
    return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ float ld_bf16(const u8* p) {
    u32 bits = ((u32)p[0] << 16) | ((u32)p[1] << 24);
    return __uint_as_float(bits);
}
__device__ __forceinline__ float ld_f32(const u8* p) {
    u32 bits = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
    return __uint_as_float(bits);
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
__device__ __forceinline__ void k4_scale_min(const u8* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// out[0..SEG) = values of segment `part` of the block at `b`, in element order.
template <int QT> __device__ __forceinline__ void dequant_seg(const u8* b, int part, float* out);

template <> __device__ __forceinline__ void dequant_seg<QT_F32>(const u8* b, int, float* out) {
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = ld_f32(b + 4 * j);
}
template <> __device__ __forceinline__ void dequant_seg<QT_F16>(const u8* b, int, float* out) {
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = ld_f16(b + 2 * j);
}
template <> __device__ __forceinline__ void dequant_seg<QT_BF16>(const u8* b, int, float* out) {
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = ld_bf16(b + 2 * j);
}
// block_q4_0: d, qs[16]; element j low nibble of qs[j], j+16 high; y = (q - 8) * d
template <> __device__ __forceinline__ void dequant_seg<QT_Q4_0>(const u8* b, int, float* out) {
    const float d = ld_f16(b);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int q = b[2 + j];
        out[j] = (float)((q & 0x0F) - 8) * d;
        out[j + 16] = (float)((q >> 4) - 8) * d;
    }
}
// block_q4_1: d, m, qs[16]; y = q * d + m
template <> __device__ __forceinline__ void dequant_seg<QT_Q4_1>(const u8* b, int, float* out) {
    const float d = ld_f16(b), m = ld_f16(b + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int q = b[4 + j];
        out[j] = __fadd_rn(__fmul_rn((float)(q & 0x0F), d), m);  // no FMA: same rounding as ggml
        out[j + 16] = __fadd_rn(__fmul_rn((float)(q >> 4), d), m);
    }
}
// block_q5_0: d, qh[4] (bit j = bit 4 of element j), qs[16]; y = (q - 16) * d
template <> __device__ __forceinline__ void dequant_seg<QT_Q5_0>(const u8* b, int, float* out) {
    const float d = ld_f16(b);
    const u32 qh = (u32)b[2] | ((u32)b[3] << 8) | ((u32)b[4] << 16) | ((u32)b[5] << 24);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int q = b[6 + j];
        const int lo = (q & 0x0F) | (((qh >> j) & 1) << 4);
        const int hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
        out[j] = (float)(lo - 16) * d;
        out[j + 16] = (float)(hi - 16) * d;
    }
}
// block_q8_0: d, qs int8[32]; y = q * d
template <> __device__ __forceinline__ void dequant_seg<QT_Q8_0>(const u8* b, int, float* out) {
    const float d = ld_f16(b);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = (float)(signed char)b[2 + j] * d;
}
// block_q4_K: d, dmin, scales[12], qs[128]. Segment c (0..3) is elements c*64 .. c*64+63:
// element c*64 + h*32 + l is nibble h of qs[c*32 + l], sub-block 2c + h;
// y = d*sc * q - dmin*mn.
template <> __device__ __forceinline__ void dequant_seg<QT_Q4_K>(const u8* b, int c, float* out) {
    const float d = ld_f16(b), dmin = ld_f16(b + 2);
    int sc0, mn0, sc1, mn1;
    k4_scale_min(b + 4, 2 * c, sc0, mn0);
    k4_scale_min(b + 4, 2 * c + 1, sc1, mn1);
    const float s0 = d * (float)sc0, m0 = dmin * (float)mn0;
    const float s1 = d * (float)sc1, m1 = dmin * (float)mn1;
    const u8* qs = b + 16 + 32 * c;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        const int q = qs[l];
        out[l] = __fsub_rn(__fmul_rn(s0, (float)(q & 0x0F)), m0);  // no FMA: ggml's rounding
        out[l + 32] = __fsub_rn(__fmul_rn(s1, (float)(q >> 4)), m1);
    }
}
// block_q6_K: ql[128], qh[64], scales int8[16], d. Element h*128 + g*32 + l (h half,
// g 0..3, l 0..31): nibble (g >= 2) of ql[h*64 + (g%2)*32 + l], bits 2g.. of qh[h*32 + l];
// q - 32; sub-block = element / 16. Segment c = (h = c/2, l in (c%2)*16 .. +16, all g):
// its 64 values are written as out[g*16 + (l - l0)], i.e. NOT in element order; the
// element index of out[i] is q6k_elem(c, i).
__device__ __forceinline__ int q6k_elem(int c, int i) {
    const int h = c >> 1, l0 = (c & 1) * 16, g = i >> 4, l = l0 + (i & 15);
    return h * 128 + g * 32 + l;
}
template <> __device__ __forceinline__ void dequant_seg<QT_Q6_K>(const u8* b, int c, float* out) {
    const float d = ld_f16(b + 208);
    const signed char* sc = (const signed char*)(b + 192);
    const int h = c >> 1, l0 = (c & 1) * 16;
    const u8* ql = b + h * 64;
    const u8* qh = b + 128 + h * 32;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        // sub-block of element h*128 + g*32 + l is h*8 + g*2 + l/16; l/16 == c&1 here
        const float s = d * (float)sc[h * 8 + g * 2 + (c & 1)];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int l = l0 + i;
            const int lo = (g < 2) ? (ql[(g & 1) * 32 + l] & 0x0F) : (ql[(g & 1) * 32 + l] >> 4);
            const int q = lo | (((qh[l] >> (2 * g)) & 3) << 4);
            out[g * 16 + i] = s * (float)(q - 32);
        }
    }
}

// Element offset (within the block) of out[i] of segment `part`.
template <int QT> __device__ __forceinline__ int seg_elem(int part, int i) {
    return part * (QTraits<QT>::QK / QTraits<QT>::PARTS) + i;
}
template <> __device__ __forceinline__ int seg_elem<QT_Q6_K>(int part, int i) { return q6k_elem(part, i); }
