/* NOT VERIFIED on Gaudi hardware, the TPC simulator or tpc-clang: see dc_tpc_elementwise.h. */
/* scale_bf16 (Gaudi 2 TPC-C): out = bf16(f32(x) * scale), computed in f32, rounded once
 * (SW_RHNE: round half to nearest even). Twin of dc_kernel_table.scale_bf16. */
#include "dc_tpc_elementwise.h"

void main(tensor x, tensor out, float scale) {
    DC_TPC_FOR_EACH(c, DC_TPC_LANES_BF16) {
        float128 v = convert_bfloat128_to_float128(v_bf16_ld_tnsr_b(c, x), SW_LINEAR);
        v.v1 = v_f32_mul_b(v.v1, scale);
        v.v2 = v_f32_mul_b(v.v2, scale);
        v_bf16_st_tnsr(c, out, convert_float128_to_bfloat128(v, SW_RHNE | SW_LINEAR));
    }
}
