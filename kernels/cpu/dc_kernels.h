/*
 * dc_kernels.h: element-wise kernels of the dropcompute CPU mock device.
 *
 * Owns: the C ABI shared by the C files in kernels/cpu and src/kernels.rs (the Rust declarations must
 * match this header field for field). Must not: allocate, print, or touch global state other
 * than the read-only CPU feature query used for dispatch.
 *
 * Types: f32 is `float`; bf16 is stored as its raw bits in `uint16_t` (the layout of
 * `half::bf16`). Element counts are `size_t` elements, not bytes.
 *
 * Numerics: every kernel computes in f32 with IEEE round-to-nearest-even and no FMA
 * contraction (built with -ffp-contract=off), so `acc + a*x` is two f32 roundings. bf16 results
 * are produced by one final rounding f32 -> bf16 per element using the exact rule of
 * `half::bf16::from_f32` (half 2.7, src/bfloat/convert.rs): NaN -> (bits >> 16) | 0x0040,
 * otherwise round to nearest, ties to even, overflow to +-inf. bf16 -> f32 widening follows
 * `half::bf16::to_f32`: exact, with signalling NaNs quieted (bit 0x0040 of the bf16 set).
 *
 * Aliasing: `scale_*` work in place on one buffer. In every other kernel the output buffer must
 * not overlap the input buffer (the pointers are `restrict`).
 */
#ifndef DC_KERNELS_H
#define DC_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Instruction-set variants, in increasing order of preference. Values are part of the ABI. */
#define DC_ISA_GENERIC 0 /* baseline of the target (SSE2 on x86-64) */
#define DC_ISA_AVX2 1    /* x86-64 AVX2 */
#define DC_ISA_AVX512 2  /* x86-64 AVX-512 F+BW+DQ+VL (the AVX-512 part of x86-64-v4) */
#define DC_ISA_COUNT 3

/* One set of kernels compiled for one instruction set. Field order is part of the ABI. */
typedef struct dc_kernel_table {
    /* x[i] = x[i] * a */
    void (*scale_f32)(float *x, size_t n, float a);
    /* acc[i] = acc[i] + x[i] */
    void (*accumulate_f32)(float *acc, const float *x, size_t n);
    /* acc[i] = acc[i] + a * x[i]  (product rounded to f32, then sum rounded to f32) */
    void (*scale_accumulate_f32)(float *acc, const float *x, size_t n, float a);
    /* x[i] = bf16(f32(x[i]) * a) */
    void (*scale_bf16)(uint16_t *x, size_t n, float a);
    /* acc[i] = bf16(f32(acc[i]) + f32(x[i])) */
    void (*accumulate_bf16)(uint16_t *acc, const uint16_t *x, size_t n);
    /* acc[i] = bf16(f32(acc[i]) + a * f32(x[i])) */
    void (*scale_accumulate_bf16)(uint16_t *acc, const uint16_t *x, size_t n, float a);
    /* acc[i] = acc[i] + f32(x[i]) */
    void (*accumulate_bf16_to_f32)(float *acc, const uint16_t *x, size_t n);
    /* acc[i] = acc[i] + a * f32(x[i]) */
    void (*scale_accumulate_bf16_to_f32)(float *acc, const uint16_t *x, size_t n, float a);
    /* dst[i] = bf16(src[i]) */
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
    /* dst[i] = f32(src[i]) */
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
} dc_kernel_table;

/* Best DC_ISA_* supported by the running CPU (DC_ISA_GENERIC off x86-64). */
int dc_kernels_best_isa(void);

/* Kernels compiled for `isa`, or NULL when `isa` is out of range, was not compiled for this
 * target, or is not supported by the running CPU. The table is static; never free it. */
const dc_kernel_table *dc_kernels_table(int isa);

#ifdef __cplusplus
}
#endif

#endif /* DC_KERNELS_H */
