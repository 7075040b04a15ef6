/* NOT VERIFIED on Gaudi hardware, the TPC simulator or tpc-clang: see dc_tpc_elementwise.h. */
/* scale_accumulate_f32 (Gaudi 2 TPC-C): acc_out = acc_in + scale * x, f32.
 * v_f32_mac_b is a fused multiply-add (one rounding); the CPU twin rounds twice, so results
 * may differ in the last bit. */
#include "dc_tpc_elementwise.h"

void main(tensor x, tensor acc_in, tensor acc_out, float scale) {
    DC_TPC_FOR_EACH(c, DC_TPC_LANES_F32) {
        float64 g = v_f32_ld_tnsr_b(c, x);
        float64 a = v_f32_ld_tnsr_b(c, acc_in);
        v_f32_st_tnsr(c, acc_out, v_f32_mac_b(g, scale, a));
    }
}
