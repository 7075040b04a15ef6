/*
 * dc_tpc_elementwise.h: shared index-space loop of the dropcompute TPC-C kernels (Gaudi 2).
 *
 * NOT VERIFIED: none of the kernels in kernels/tpc has been compiled with tpc-clang or run on
 * Gaudi hardware or the TPC simulator. They follow the sketch and intrinsic signatures in
 * ../shared/reference/habana_api.md section 7 (from the HabanaAI Habana_Custom_Kernel
 * tpc-intrinsics.h and relu6 examples); names and signatures may need fixing on a real
 * toolchain. build.rs compiles them only when TPC_CLANG is set and never links them.
 *
 * Tensor layout assumed by every kernel: element-wise over a tensor of up to 5 dims whose dim 0
 * is the fastest. The glue code (not written yet) must set index-space dim 0 to
 * ceil(size0 / DC_TPC_LANES) with access pattern a = DC_TPC_LANES on dim 0 for every tensor,
 * dims 1..4 one-to-one, and pass the scale in scalarParams[0].
 *
 * DC_TPC_FOR_EACH(coords, LANES) { body } runs body once per vector of LANES elements of this
 * core's slice of the index space, with coords set to the first element of the vector.
 */
#ifndef DC_TPC_ELEMENTWISE_H
#define DC_TPC_ELEMENTWISE_H

/* Lanes per vector register: 64 f32 (float64) or 128 bf16 (bfloat128). */
#define DC_TPC_LANES_F32 64
#define DC_TPC_LANES_BF16 128

#define DC_TPC_FOR_EACH(coords, LANES)                                                     \
    const int5 dc_start = get_index_space_offset();                                        \
    const int5 dc_end = dc_start + get_index_space_size();                                 \
    int5 coords = {0, 0, 0, 0, 0};                                                         \
    for (int dc_d4 = dc_start[4]; dc_d4 < dc_end[4]; ++dc_d4)                              \
        for (int dc_d3 = dc_start[3]; dc_d3 < dc_end[3]; ++dc_d3)                          \
            for (int dc_d2 = dc_start[2]; dc_d2 < dc_end[2]; ++dc_d2)                      \
                for (int dc_d1 = dc_start[1]; dc_d1 < dc_end[1]; ++dc_d1)                  \
                    for (int dc_d0 = dc_start[0] * (LANES); dc_d0 < dc_end[0] * (LANES);   \
                         dc_d0 += (LANES))                                                 \
                        if ((coords[0] = dc_d0, coords[1] = dc_d1, coords[2] = dc_d2,      \
                             coords[3] = dc_d3, coords[4] = dc_d4, 1))

#endif /* DC_TPC_ELEMENTWISE_H */
