/* NOT VERIFIED on Gaudi hardware, the TPC simulator or tpc-clang: see dc_tpc_elementwise.h. */
/* accumulate_bf16 (Gaudi 2 TPC-C): acc_out = bf16(f32(acc_in) + f32(x)), one rounding per
 * element. Twin of dc_kernel_table.accumulate_bf16. */
#include "dc_tpc_elementwise.h"

void main(tensor x, tensor acc_in, tensor acc_out) {
    DC_TPC_FOR_EACH(c, DC_TPC_LANES_BF16) {
        float128 g = convert_bfloat128_to_float128(v_bf16_ld_tnsr_b(c, x), SW_LINEAR);
        float128 a = convert_bfloat128_to_float128(v_bf16_ld_tnsr_b(c, acc_in), SW_LINEAR);
        a.v1 = v_f32_add_b(a.v1, g.v1);
        a.v2 = v_f32_add_b(a.v2, g.v2);
        v_bf16_st_tnsr(c, acc_out, convert_float128_to_bfloat128(a, SW_RHNE | SW_LINEAR));
    }
}
