/* NOT VERIFIED on Gaudi hardware, the TPC simulator or tpc-clang: see dc_tpc_elementwise.h. */
/* accumulate_bf16_to_f32 (Gaudi 2 TPC-C): acc_out = acc_in + f32(x); x is a bf16 gradient,
 * acc an f32 accumulator. One bf16 vector (128 lanes) covers two f32 vectors (64 lanes each):
 * the f32 tensors are addressed at c[0] and c[0] + 64. Twin of accumulate_bf16_to_f32. */
#include "dc_tpc_elementwise.h"

void main(tensor x, tensor acc_in, tensor acc_out) {
    DC_TPC_FOR_EACH(c, DC_TPC_LANES_BF16) {
        float128 g = convert_bfloat128_to_float128(v_bf16_ld_tnsr_b(c, x), SW_LINEAR);
        int5 hi = c;
        hi[0] += DC_TPC_LANES_F32;
        v_f32_st_tnsr(c, acc_out, v_f32_add_b(v_f32_ld_tnsr_b(c, acc_in), g.v1));
        v_f32_st_tnsr(hi, acc_out, v_f32_add_b(v_f32_ld_tnsr_b(hi, acc_in), g.v2));
    }
}
