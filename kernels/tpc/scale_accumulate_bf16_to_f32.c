/* NOT VERIFIED on Gaudi hardware, the TPC simulator or tpc-clang: see dc_tpc_elementwise.h. */
/* scale_accumulate_bf16_to_f32 (Gaudi 2 TPC-C): acc_out = acc_in + scale * f32(x) with a bf16
 * gradient x and an f32 accumulator, via v_bf16_mac_acc32_b (bf16 x bf16 products accumulated
 * in f32). The scale is therefore rounded to bf16 first; a caller needing an exact f32 scale
 * should use convert + v_f32_mac_b as in scale_accumulate_bf16.c. The float128 accumulator is
 * assumed to be laid out as v1 = lanes 0..63, v2 = lanes 64..127 (SW_LINEAR order). */
#include "dc_tpc_elementwise.h"

void main(tensor x, tensor acc_in, tensor acc_out, float scale) {
    const bf16 scale_bf16 = (bf16)scale;
    DC_TPC_FOR_EACH(c, DC_TPC_LANES_BF16) {
        int5 hi = c;
        hi[0] += DC_TPC_LANES_F32;
        float128 a;
        a.v1 = v_f32_ld_tnsr_b(c, acc_in);
        a.v2 = v_f32_ld_tnsr_b(hi, acc_in);
        a = v_bf16_mac_acc32_b(v_bf16_ld_tnsr_b(c, x), scale_bf16, a);
        v_f32_st_tnsr(c, acc_out, a.v1);
        v_f32_st_tnsr(hi, acc_out, a.v2);
    }
}
