/* NOT VERIFIED on Gaudi hardware, the TPC simulator or tpc-clang: see dc_tpc_elementwise.h. */
/* scale_f32 (Gaudi 2 TPC-C): out = x * scale, f32. Twin of dc_kernel_table.scale_f32. */
#include "dc_tpc_elementwise.h"

void main(tensor x, tensor out, float scale) {
    DC_TPC_FOR_EACH(c, DC_TPC_LANES_F32) {
        float64 v = v_f32_ld_tnsr_b(c, x);
        v_f32_st_tnsr(c, out, v_f32_mul_b(v, scale));
    }
}
