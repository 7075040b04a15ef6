/*
 * dispatch.c: instantiates kernels_body.inc once per instruction set and picks one at run time.
 *
 * Owns: the per-ISA kernel tables and the CPU feature query. Must not: use -march=native or
 * any ISA beyond the baseline outside a variant compiled with a target attribute, so the
 * library runs on any x86-64 (or other C11 target) and uses AVX2 / AVX-512 only when the
 * running CPU reports them (__builtin_cpu_supports, GCC >= 4.8 and clang).
 */
#include "dc_kernels.h"

#include <string.h>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define DC_X86_DISPATCH 1
#else
#define DC_X86_DISPATCH 0
#endif

#define DC_ATTR
#define DC_NAME(n) dc_generic_##n
#define DC_TABLE dc_table_generic
#include "kernels_body.inc"
#undef DC_ATTR
#undef DC_NAME
#undef DC_TABLE

#if DC_X86_DISPATCH
#define DC_ATTR __attribute__((target("avx2")))
#define DC_NAME(n) dc_avx2_##n
#define DC_TABLE dc_table_avx2
#include "kernels_body.inc"
#undef DC_ATTR
#undef DC_NAME
#undef DC_TABLE

#define DC_ATTR __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#define DC_NAME(n) dc_avx512_##n
#define DC_TABLE dc_table_avx512
#include "kernels_body.inc"
#undef DC_ATTR
#undef DC_NAME
#undef DC_TABLE
#endif

static int dc_isa_supported(int isa) {
    switch (isa) {
    case DC_ISA_GENERIC:
        return 1;
#if DC_X86_DISPATCH
    case DC_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2");
    case DC_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
    default:
        return 0;
    }
}

int dc_kernels_best_isa(void) {
    for (int isa = DC_ISA_COUNT - 1; isa > DC_ISA_GENERIC; --isa) {
        if (dc_isa_supported(isa)) {
            return isa;
        }
    }
    return DC_ISA_GENERIC;
}

const dc_kernel_table *dc_kernels_table(int isa) {
    if (!dc_isa_supported(isa)) {
        return NULL;
    }
    switch (isa) {
    case DC_ISA_GENERIC:
        return &dc_table_generic;
#if DC_X86_DISPATCH
    case DC_ISA_AVX2:
        return &dc_table_avx2;
    case DC_ISA_AVX512:
        return &dc_table_avx512;
#endif
    default:
        return NULL;
    }
}
