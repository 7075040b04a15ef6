/* NOT VERIFIED on Gaudi hardware, the TPC simulator or tpc-clang: see dc_tpc_elementwise.h. */
/* accumulate_f32 (Gaudi 2 TPC-C): acc_out = acc_in + x, f32. Twin of accumulate_f32. */
#include "dc_tpc_elementwise.h"

void main(tensor x, tensor acc_in, tensor acc_out) {
    DC_TPC_FOR_EACH(c, DC_TPC_LANES_F32) {
        float64 g = v_f32_ld_tnsr_b(c, x);
        float64 a = v_f32_ld_tnsr_b(c, acc_in);
        v_f32_st_tnsr(c, acc_out, v_f32_add_b(a, g));
    }
}
