//! The GUIDs the mock's graph compiler knows: their operand counts, parameter sizes, dtype and
//! shape rules (checked as the real compiler does, see `graph_api.md` §8), execution on the CPU
//! (`cpu.rs`) and the per-node cost model.
//!
//! Owns: [`Guid`] (a parsed GUID name), [`Operand`], the checks [`check_create`] (what
//! `synNodeCreate` rejects) and [`check_compile`] (what `synGraphCompile` rejects), [`run`] and
//! [`cost`]. Must not touch: graph records, memory or the registry.
//!
//! GUID names are the vendor's: TPC kernels `<op>_fwd_<dt>` / `<op>_bwd_<dt>` (dt `f32` or
//! `bf16` here), `cast_<a>_to_<b>`, `constant_<dt>`; graph-compiler nodes without suffix
//! (`gemm`, `gemm_dedx`, `gemm_dedw`, `batch_gemm`, `memset`, `transpose`, `reshape`; a
//! `_f32`/`_bf16` suffix is tolerated as by the real node factory). Dimensions are FCD first
//! and axis parameters are in TPC order (0 = fastest-changing).
//!
//! The transformer kernels (issue 26) and where their names, operand orders and parameter
//! structs come from (public sources; HabanaAI/gaudi-pytorch-bridge = PTB @ 5a56187 "Publish
//! 1.19.0", HabanaAI/Intel_Gaudi3_Software = G3; headers are not copied, only the facts):
//! - `layer_norm_fwd_<dt>`: inputs **(x, beta, gamma)** (bias before weight: PTB
//!   `hpu_ops/backend/layer_norm_gen.cpp` builds `{synInput, synBias, synWeight}`), outputs
//!   (y, mean, istd), mean/istd f32 with x's sizes and dimension 0 set to 1 (PTB
//!   `mean_rstd_shape`; G3 `pipeline_management_test.cpp`: x {96,200704,1,1}, mean
//!   {1,200704,1,1}); params `ns_LayerNormKernel::Params{epsValid bool @0, eps f32 @4}` = 8 B
//!   (G3 test bytes {1,0,0,0, 1e-5 as f32}); `ParamsNorm` (+NormAxisBmp i32, ParamAxisBmp i32)
//!   = 16 B and `ParamsPt` (+normalizedShapeDims u32) = 20 B are accepted with the normalized
//!   axis the FCD only (the mock normalizes dimension 0).
//! - `layer_norm_bwd_<dt>`: inputs **(x, dy, mean, istd, gamma)**, outputs **(dx, dbeta,
//!   dgamma)** (G3 `layer_norm_bwd_split_test.cpp`: ifm, gradIn, mean, lstd, gamma ->
//!   gradOut, gradBeta, gradGamma; PTB maps its outputs {0, 2, 1} to PyTorch's (dx, dgamma,
//!   dbeta)); dbeta/dgamma f32; same params.
//! - `gelu_fwd_<dt>`: (x) -> (y[, aux]) (PTB `gelu_gen.cpp` gives two outputs of x's shape;
//!   what the vendor writes into the second is not public: the mock writes x);
//!   `ns_GeluKernel::Params{approximation bool}` = 1 B, `ParamsV2` (+accuracy_mode u32) = 8 B,
//!   or none (erf form). `gelu_bwd_<dt>`: **(grad, x)** -> dx, same params. UNVERIFIED: PTB
//!   lowers `gelu_backward` to the complex GUID `cgelu_bwd`; the plain name and its input order
//!   are inferred from `relu_bwd`'s (grad, x).
//! - `embedding_pt_fwd_<dt>`: **(weight [D, V], indices i32 [T...])** -> [D, T...], no params
//!   (PTB `scripts/hpu_op.yaml` `embedding: guid: embedding_pt_fwd`, `EmbeddingMeta`).
//!   `embedding_dense_pt_bwd_<dt>`: **(grad [D, T...], indices)** -> dW [D, num_weights],
//!   `ns_EmbeddingDensePtBwdKernel::Params{num_weights i32 @0, padding_idx i32 @4,
//!   scaleGradByFreq bool @8}` = 12 B (PTB `embedding_dense_backward_gen.cpp`; the optional
//!   shape-tensor input PTB adds is not modelled, scaleGradByFreq is refused).
//! - `transpose` (internal): (x) -> y, `synTransposeParams{permutation [u32; 5], tensorDim
//!   u32}` = 24 B or `synTransposeParamsNDims{tensorDim u32, permutation [u32; 25]}` = 104 B;
//!   output dimension i is input dimension permutation[i] (G3 example: {96,7,8,7,512} with
//!   {0,1,3,2,4} -> {96,7,7,8,512}); any other size fails at synNodeCreate (`graph_api.md` §8
//!   2c). `reshape` (internal): (x) -> y of equal element count and dtype, no params (G3 passes
//!   null, 0).
//! - `div_fwd_<dt>` (a, b) -> a / b and `sqrt_fwd_<dt>` (x) -> sqrt(x), no params, for
//!   optimizers composed of elementwise nodes (names as the `*_fwd_<dt>` family; UNVERIFIED).

use habana_sys::synDataType;

use super::cpu::{self, Binary, CeMode, Mat};

/// What a GUID computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// add/sub/mult/max/min `_fwd`.
    Binary(Binary),
    /// `cast_<a>_to_<b>`.
    Cast,
    /// `constant_<dt>`.
    Constant,
    /// `memset`.
    Memset,
    /// `relu_fwd`.
    Relu,
    /// `relu_bwd` (grad, x).
    ReluBwd,
    /// `softmax_fwd`.
    Softmax,
    /// `softmax_bwd` (y, dy).
    SoftmaxBwd,
    /// `logsoftmax_fwd`.
    LogSoftmax,
    /// `softmax_cross_entropy_fwd` (logits, labels) -> (loss, log_softmax).
    CeFwd,
    /// `softmax_cross_entropy_bwd` (log_softmax, labels) -> dlogits.
    CeBwd,
    /// `reduce_sum_fwd`.
    ReduceSum,
    /// `reduce_sum_multi_dim_fwd`.
    ReduceSumMulti,
    /// `isfinite_fwd` -> int8.
    IsFinite,
    /// `gemm` (A, B[, bias]).
    Gemm,
    /// `gemm_dedx` (dC, B) -> dA.
    GemmDedx,
    /// `gemm_dedw` (dC, A) -> dB.
    GemmDedw,
    /// `batch_gemm` (A, B).
    BatchGemm,
    /// `layer_norm_fwd` (x, beta, gamma) -> (y, mean, istd).
    LayerNorm,
    /// `layer_norm_bwd` (x, dy, mean, istd, gamma) -> (dx, dbeta, dgamma).
    LayerNormBwd,
    /// `gelu_fwd` (x) -> (y[, aux]).
    Gelu,
    /// `gelu_bwd` (grad, x) -> dx.
    GeluBwd,
    /// `embedding_pt_fwd` (weight, indices) -> rows.
    Embedding,
    /// `embedding_dense_pt_bwd` (grad, indices) -> dW.
    EmbeddingBwd,
    /// `sqrt_fwd`.
    Sqrt,
    /// `transpose` (internal).
    Transpose,
    /// `reshape` (internal).
    Reshape,
}

/// A parsed GUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Guid {
    /// The operation.
    pub op: Op,
    /// The dtype suffix of a TPC kernel (the source type of a cast); `None` for graph-compiler
    /// nodes.
    pub dtype: Option<synDataType>,
    /// The target type of a cast.
    pub to: Option<synDataType>,
}

fn suffix(s: &str) -> Option<synDataType> {
    match s {
        "f32" => Some(synDataType::SINGLE),
        "bf16" => Some(synDataType::BF16),
        _ => None,
    }
}

/// Short name of a dtype for messages ("f32", "bf16", "i32", "i8", or the C name).
pub(crate) fn dtype_name(t: synDataType) -> String {
    match t {
        synDataType::SINGLE => "f32".into(),
        synDataType::BF16 => "bf16".into(),
        synDataType::INT32 => "i32".into(),
        synDataType::INT8 => "i8".into(),
        other => format!("{other}"),
    }
}

/// Bytes of one element of `t` (`None` for a type the mock cannot hold).
pub(crate) fn elem_size(t: synDataType) -> Option<u64> {
    match t {
        synDataType::SINGLE | synDataType::INT32 => Some(4),
        synDataType::BF16 => Some(2),
        synDataType::INT8 => Some(1),
        _ => None,
    }
}

impl Guid {
    /// Parses a GUID name; `None` when the mock has no kernel of that name.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        let internal = |op| Some(Self { op, dtype: None, to: None });
        let base = name.strip_suffix("_f32").or_else(|| name.strip_suffix("_bf16")).unwrap_or(name);
        match base {
            "gemm" => return internal(Op::Gemm),
            "gemm_dedx" => return internal(Op::GemmDedx),
            "gemm_dedw" => return internal(Op::GemmDedw),
            "batch_gemm" => return internal(Op::BatchGemm),
            "memset" => return internal(Op::Memset),
            "transpose" => return internal(Op::Transpose),
            "reshape" => return internal(Op::Reshape),
            _ => {}
        }
        if let Some(rest) = name.strip_prefix("cast_") {
            let (a, b) = rest.split_once("_to_")?;
            let (from, to) = (suffix(a)?, suffix(b)?);
            return (from != to).then_some(Self { op: Op::Cast, dtype: Some(from), to: Some(to) });
        }
        let (stem, dt) = name.rsplit_once('_')?;
        let dtype = suffix(dt)?;
        let op = match stem {
            "add_fwd" => Op::Binary(Binary::Add),
            "sub_fwd" => Op::Binary(Binary::Sub),
            "mult_fwd" => Op::Binary(Binary::Mult),
            "max_fwd" => Op::Binary(Binary::Max),
            "min_fwd" => Op::Binary(Binary::Min),
            "div_fwd" => Op::Binary(Binary::Div),
            "sqrt_fwd" => Op::Sqrt,
            "layer_norm_fwd" => Op::LayerNorm,
            "layer_norm_bwd" => Op::LayerNormBwd,
            "gelu_fwd" => Op::Gelu,
            "gelu_bwd" => Op::GeluBwd,
            "embedding_pt_fwd" => Op::Embedding,
            "embedding_dense_pt_bwd" => Op::EmbeddingBwd,
            "constant" => Op::Constant,
            "relu_fwd" => Op::Relu,
            "relu_bwd" => Op::ReluBwd,
            "softmax_fwd" => Op::Softmax,
            "softmax_bwd" => Op::SoftmaxBwd,
            "logsoftmax_fwd" => Op::LogSoftmax,
            "softmax_cross_entropy_fwd" => Op::CeFwd,
            "softmax_cross_entropy_bwd" => Op::CeBwd,
            "reduce_sum_fwd" => Op::ReduceSum,
            "reduce_sum_multi_dim_fwd" => Op::ReduceSumMulti,
            "isfinite_fwd" => Op::IsFinite,
            _ => return None,
        };
        Some(Self { op, dtype: Some(dtype), to: None })
    }

    /// True for the graph compiler's matrix-engine nodes (checked at node creation).
    pub(crate) fn is_mme(self) -> bool {
        matches!(self.op, Op::Gemm | Op::GemmDedx | Op::GemmDedw | Op::BatchGemm)
    }

    /// The parameter sizes (bytes) of the kernel's known versions; `None` when any size is
    /// accepted (the GEMM family reads two bytes whatever the size, as the real node factory).
    fn param_sizes(self) -> Option<&'static [usize]> {
        Some(match self.op {
            Op::Binary(_) | Op::Memset | Op::IsFinite | Op::Sqrt | Op::Embedding | Op::Reshape => &[0],
            Op::LayerNorm | Op::LayerNormBwd => &[LN_PARAMS, LN_PARAMS_NORM, LN_PARAMS_PT],
            Op::Gelu | Op::GeluBwd => &[0, 1, 8],
            Op::EmbeddingBwd => &[12],
            Op::Transpose => &[TRANSPOSE_PARAMS, TRANSPOSE_PARAMS_NDIMS],
            Op::Cast => &[0, 4, 8, 12, 16],
            Op::Constant => &[4],
            Op::Relu => &[0, 4, 8],
            Op::ReluBwd => &[0, 4],
            Op::Softmax | Op::SoftmaxBwd | Op::LogSoftmax | Op::ReduceSum => &[4],
            Op::CeFwd | Op::CeBwd | Op::ReduceSumMulti => &[8],
            Op::Gemm | Op::GemmDedx | Op::GemmDedw | Op::BatchGemm => return None,
        })
    }

    /// (inputs, outputs) the kernel takes, each as an inclusive range.
    fn arity(self) -> ((usize, usize), (usize, usize)) {
        match self.op {
            Op::Binary(_)
            | Op::ReluBwd
            | Op::SoftmaxBwd
            | Op::CeBwd
            | Op::GemmDedx
            | Op::GemmDedw
            | Op::BatchGemm
            | Op::GeluBwd
            | Op::Embedding
            | Op::EmbeddingBwd => ((2, 2), (1, 1)),
            Op::Cast
            | Op::Relu
            | Op::Softmax
            | Op::LogSoftmax
            | Op::ReduceSum
            | Op::ReduceSumMulti
            | Op::IsFinite
            | Op::Sqrt
            | Op::Transpose
            | Op::Reshape => ((1, 1), (1, 1)),
            Op::Constant | Op::Memset => ((0, 0), (1, 1)),
            Op::CeFwd => ((2, 2), (2, 2)),
            Op::Gemm => ((2, 3), (1, 1)),
            Op::LayerNorm => ((3, 3), (3, 3)),
            Op::LayerNormBwd => ((5, 5), (3, 3)),
            Op::Gelu => ((1, 1), (1, 2)),
        }
    }
}

/// One operand as the checks and kernels see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Element type.
    pub dtype: synDataType,
    /// Sizes, FCD first.
    pub sizes: &'a [u64],
}

fn u32_at(p: &[u8], at: usize) -> Option<u32> {
    p.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// `sizeof(ns_LayerNormKernel::Params)`: {epsValid bool @0, eps f32 @4}.
const LN_PARAMS: usize = 8;
/// `sizeof(ns_LayerNormKernel::ParamsNorm)`: Params + {NormAxisBmp i32 @8, ParamAxisBmp i32 @12}.
const LN_PARAMS_NORM: usize = 16;
/// `sizeof(ns_LayerNormKernel::ParamsPt)`: ParamsNorm + {normalizedShapeDims u32 @16}.
const LN_PARAMS_PT: usize = 20;
/// The epsilon of `layer_norm_*` when `epsValid` is false (PyTorch's default; the vendor's
/// default is not public: UNVERIFIED).
const LN_DEFAULT_EPS: f32 = 1e-5;
/// `sizeof(synTransposeParams)`: {permutation [u32; 5] @0, tensorDim u32 @20}.
const TRANSPOSE_PARAMS: usize = 24;
/// `sizeof(synTransposeParamsNDims)`: {tensorDim u32 @0, permutation [u32; 25] @4}.
const TRANSPOSE_PARAMS_NDIMS: usize = 104;

/// The epsilon of a `layer_norm_*` node's params.
fn ln_eps(p: &[u8]) -> f32 {
    if p.first().is_some_and(|&b| b != 0) {
        u32_at(p, 4).map_or(LN_DEFAULT_EPS, f32::from_bits)
    } else {
        LN_DEFAULT_EPS
    }
}

/// The tanh approximation flag of a `gelu_*` node's params (erf form without params).
fn gelu_tanh(p: &[u8]) -> bool {
    p.first().is_some_and(|&b| b != 0)
}

/// (tensorDim, permutation) of a `transpose` node's params (either struct version), or None
/// for another size.
fn transpose_params(p: &[u8]) -> Option<(usize, Vec<usize>)> {
    let read = |dim_at: usize, perm_at: usize, max: usize| {
        let dim = u32_at(p, dim_at)? as usize;
        let perm = (0..dim.min(max)).map(|k| u32_at(p, perm_at + 4 * k).map(|v| v as usize)).collect::<Option<_>>()?;
        Some((dim, perm))
    };
    match p.len() {
        TRANSPOSE_PARAMS => read(20, 0, 5),
        TRANSPOSE_PARAMS_NDIMS => read(0, 4, 25),
        _ => None,
    }
}

/// GEMM transposes from the parameter bytes (missing bytes read as false).
fn gemm_params(p: &[u8]) -> (bool, bool) {
    (p.first().is_some_and(|&b| b != 0), p.get(1).is_some_and(|&b| b != 0))
}

/// What `synNodeCreate` rejects for a known GUID (the real factory checks MME operand counts
/// and operand dtypes there, and a `transpose`'s params size (`graph_api.md` §8 2c: synFail);
/// TPC kernels are only looked up). Err: (is_invalid_argument, msg).
pub(crate) fn check_create(
    node: &str,
    g: Guid,
    params: &[u8],
    ins: &[Option<Operand<'_>>],
    outs: &[Operand<'_>],
) -> Result<(), (bool, String)> {
    if g.op == Op::Transpose && !matches!(params.len(), TRANSPOSE_PARAMS | TRANSPOSE_PARAMS_NDIMS) {
        return Err((
            false,
            format!(
                "node {node}: Invalid Size for Node Params! transpose takes {TRANSPOSE_PARAMS} (synTransposeParams) or {TRANSPOSE_PARAMS_NDIMS} (synTransposeParamsNDims) bytes, got {}",
                params.len()
            ),
        ));
    }
    if g.is_mme() {
        let present = ins.iter().filter(|i| i.is_some()).count();
        if present < 2 || outs.len() != 1 {
            return Err((
                true,
                format!(
                    "node {node}: Invalid number of operands (expecting 2-4 inputs and 1 output), got {present} inputs and {} outputs",
                    outs.len()
                ),
            ));
        }
        if let (Some(a), Some(b)) = (ins[0], ins[1])
            && a.dtype != b.dtype
        {
            return Err((
                false,
                format!(
                    "node {node}: Incompatible datatype {} for input tensor idx 1 ({}): input 0 ({}) is {}",
                    dtype_name(b.dtype),
                    b.name,
                    a.name,
                    dtype_name(a.dtype)
                ),
            ));
        }
    }
    Ok(())
}

fn expect_sizes(node: &str, t: &Operand<'_>, want: &[u64]) -> Result<(), String> {
    if t.sizes == want {
        Ok(())
    } else {
        Err(format!("node {node}: tensor {} has sizes {:?} (FCD first), expected {want:?}", t.name, t.sizes))
    }
}

fn expect_dtype(node: &str, t: &Operand<'_>, want: synDataType) -> Result<(), String> {
    if t.dtype == want {
        Ok(())
    } else {
        Err(format!(
            "node {node}: tensor {} is {}, expected {}: glue code error INCOMPATIBLE_DATA_TYPE",
            t.name,
            dtype_name(t.dtype),
            dtype_name(want)
        ))
    }
}

/// A float input of a `*_<dt>` TPC kernel: `dt` itself, or bf16 into an f32 kernel (the real
/// compiler recovers that by planting a cast); f32 into a bf16 kernel fails.
fn expect_float_input(node: &str, t: &Operand<'_>, dt: synDataType) -> Result<(), String> {
    if t.dtype == dt || (dt == synDataType::SINGLE && t.dtype == synDataType::BF16) {
        Ok(())
    } else {
        expect_dtype(node, t, dt)
    }
}

fn reduced(sizes: &[u64], mask: u32, keep: bool) -> Vec<u64> {
    let mut out: Vec<u64> = sizes
        .iter()
        .enumerate()
        .filter_map(|(d, &s)| if mask & (1 << d) != 0 { keep.then_some(1) } else { Some(s) })
        .collect();
    if out.is_empty() {
        out.push(1);
    }
    out
}

/// The reduction mask of a `reduce_sum_multi_dim` node (mask 0 = every dimension).
fn multi_mask(p: &[u8], rank: usize) -> (u32, bool) {
    let mask = u32_at(p, 0).unwrap_or(0);
    let keep = p.get(4).is_some_and(|&b| b != 0);
    (if mask == 0 { (1u32 << rank.min(31)) - 1 } else { mask }, keep)
}

fn dim_param(node: &str, p: &[u8], rank: usize) -> Result<usize, String> {
    let d = u32_at(p, 0).unwrap_or(0) as usize;
    if d < rank { Ok(d) } else { Err(format!("node {node}: dimension parameter {d} out of range for rank {rank}")) }
}

/// (M, K) of a GEMM's A operand (FCD-first sizes; `[K, M]`, or `[M, K]` transposed).
fn mk(a: &[u64], trans: bool) -> (u64, u64) {
    if trans { (a[0], a[1]) } else { (a[1], a[0]) }
}

/// (K, N) of a GEMM's B operand (`[N, K]`, or `[K, N]` transposed).
fn kn(b: &[u64], trans: bool) -> (u64, u64) {
    if trans { (b[0], b[1]) } else { (b[1], b[0]) }
}

/// What `synGraphCompile` rejects for a node (every such failure is synFail on the ≈1.16
/// runtime): operand counts, params size, dtypes, shapes. The message names the node and the
/// tensor.
pub(crate) fn check_compile(
    node: &str,
    guid: &str,
    g: Guid,
    params: &[u8],
    ins: &[Option<Operand<'_>>],
    outs: &[Operand<'_>],
) -> Result<(), String> {
    let ((lo, hi), (olo, ohi)) = g.arity();
    if ins.len() < lo || ins.len() > hi || ins[..lo].iter().any(Option::is_none) {
        return Err(format!(
            "Failed to load tpc kernel for node {node}, GUID {guid}. Got error: GLUE_INCOMPATIBLE_INPUT_COUNT ({} inputs, expected {lo}..={hi})",
            ins.len()
        ));
    }
    if outs.len() < olo || outs.len() > ohi {
        return Err(format!(
            "Failed to load tpc kernel for node {node}, GUID {guid}. Got error: GLUE_INCOMPATIBLE_OUTPUT_COUNT ({} outputs, expected {olo}..={ohi})",
            outs.len()
        ));
    }
    if let Some(sizes) = g.param_sizes()
        && !sizes.contains(&params.len())
    {
        return Err(format!(
            "Failed to load tpc kernel for node {node}, GUID {guid}. Got error: GLUE_FAILED (params size {} is not one of the kernel's versions {sizes:?})",
            params.len()
        ));
    }
    let i = |k: usize| ins[k].expect("arity checked");
    let o = &outs[0];
    let dt = g.dtype.unwrap_or(synDataType::SINGLE);
    match g.op {
        Op::Binary(_) => {
            expect_float_input(node, &i(0), dt)?;
            expect_float_input(node, &i(1), dt)?;
            expect_dtype(node, o, dt)?;
            let Some(shape) = cpu::broadcast_shape(i(0).sizes, i(1).sizes) else {
                return Err(format!(
                    "node {node}: tensors {} {:?} and {} {:?} are not broadcastable (FCD first): GLUE_UNSUPPORTED_BROADCAST_MODE",
                    i(0).name,
                    i(0).sizes,
                    i(1).name,
                    i(1).sizes
                ));
            };
            expect_sizes(node, o, &shape)
        }
        Op::Cast => {
            expect_dtype(node, &i(0), dt)?;
            expect_dtype(node, o, g.to.expect("casts have a target"))?;
            let mode = u32_at(params, 0).unwrap_or(0);
            if !matches!(mode, 0 | 4 | 5) {
                return Err(format!(
                    "node {node}: cast rounding mode {mode} is not implemented by the CPU mock (0, 4, 5 are)"
                ));
            }
            expect_sizes(node, o, i(0).sizes)
        }
        Op::Constant | Op::Memset => {
            if g.op == Op::Constant {
                expect_dtype(node, o, dt)?;
            }
            elem_size(o.dtype)
                .map(|_| ())
                .ok_or_else(|| format!("node {node}: tensor {} has unsupported dtype", o.name))
        }
        Op::Relu | Op::Softmax | Op::LogSoftmax => {
            expect_float_input(node, &i(0), dt)?;
            expect_dtype(node, o, dt)?;
            if g.op != Op::Relu {
                dim_param(node, params, i(0).sizes.len())?;
            }
            expect_sizes(node, o, i(0).sizes)
        }
        Op::ReluBwd | Op::SoftmaxBwd => {
            expect_float_input(node, &i(0), dt)?;
            expect_float_input(node, &i(1), dt)?;
            expect_dtype(node, o, dt)?;
            expect_sizes(node, &i(1), i(0).sizes)?;
            if g.op == Op::SoftmaxBwd {
                dim_param(node, params, i(0).sizes.len())?;
            }
            expect_sizes(node, o, i(0).sizes)
        }
        Op::IsFinite => {
            expect_float_input(node, &i(0), dt)?;
            expect_dtype(node, o, synDataType::INT8)?;
            expect_sizes(node, o, i(0).sizes)
        }
        Op::ReduceSum => {
            expect_float_input(node, &i(0), dt)?;
            expect_dtype(node, o, dt)?;
            let d = dim_param(node, params, i(0).sizes.len())?;
            expect_sizes(node, o, &reduced(i(0).sizes, 1 << d, true))
        }
        Op::ReduceSumMulti => {
            expect_float_input(node, &i(0), dt)?;
            expect_dtype(node, o, dt)?;
            let (mask, keep) = multi_mask(params, i(0).sizes.len());
            if mask >> i(0).sizes.len() != 0 {
                return Err(format!(
                    "node {node}: reduction mask {mask:#b} names a dimension beyond rank {}",
                    i(0).sizes.len()
                ));
            }
            expect_sizes(node, o, &reduced(i(0).sizes, mask, keep))
        }
        Op::CeFwd | Op::CeBwd => {
            let (logits, labels) = (i(0), i(1));
            expect_float_input(node, &logits, dt)?;
            expect_dtype(node, &labels, synDataType::INT32)?;
            if logits.sizes.len() != 2 {
                return Err(format!(
                    "node {node}: tensor {} must be [classes, batch], got {:?}",
                    logits.name, logits.sizes
                ));
            }
            expect_sizes(node, &labels, &logits.sizes[1..2])?;
            let mode = u32_at(params, 0).unwrap_or(u32::MAX);
            if mode > 2 {
                return Err(format!("node {node}: cross-entropy mode {mode} (0 SUM, 1 MEAN, 2 NO_REDUCTION)"));
            }
            for t in outs {
                expect_dtype(node, t, dt)?;
            }
            if g.op == Op::CeFwd {
                let loss = if mode == 2 { vec![logits.sizes[1]] } else { vec![1] };
                expect_sizes(node, &outs[0], &loss)?;
                expect_sizes(node, &outs[1], logits.sizes)
            } else {
                expect_sizes(node, o, logits.sizes)
            }
        }
        Op::Gemm | Op::GemmDedx | Op::GemmDedw | Op::BatchGemm => check_gemm(node, g, params, ins, o),
        Op::Sqrt => {
            expect_float_input(node, &i(0), dt)?;
            expect_dtype(node, o, dt)?;
            expect_sizes(node, o, i(0).sizes)
        }
        Op::LayerNorm | Op::LayerNormBwd => check_layer_norm(node, g, params, ins, outs),
        Op::Gelu | Op::GeluBwd => {
            for t in ins.iter().flatten() {
                expect_float_input(node, t, dt)?;
            }
            expect_sizes(node, &i(ins.len() - 1), i(0).sizes)?;
            for t in outs {
                expect_dtype(node, t, dt)?;
                expect_sizes(node, t, i(0).sizes)?;
            }
            Ok(())
        }
        Op::Embedding | Op::EmbeddingBwd => {
            let (x, idx) = (i(0), i(1));
            expect_float_input(node, &x, dt)?;
            expect_dtype(node, &idx, synDataType::INT32)?;
            expect_dtype(node, o, dt)?;
            let d = *x.sizes.first().unwrap_or(&0);
            if g.op == Op::Embedding {
                if x.sizes.len() != 2 {
                    return Err(format!(
                        "node {node}: table {} must be [dim, rows] (FCD first), got {:?}",
                        x.name, x.sizes
                    ));
                }
                let mut want = vec![d];
                want.extend_from_slice(idx.sizes);
                expect_sizes(node, o, &want)
            } else {
                if x.sizes.len() < 2 || x.sizes[1..] != *idx.sizes {
                    return Err(format!(
                        "node {node}: gradient {} {:?} must be [dim, indices' sizes...] for indices {} {:?}",
                        x.name, x.sizes, idx.name, idx.sizes
                    ));
                }
                let rows = i32::from_le_bytes(params[0..4].try_into().expect("12 bytes"));
                if params[8] != 0 {
                    return Err(format!("node {node}: scaleGradByFreq is not implemented by the CPU mock"));
                }
                if rows <= 0 {
                    return Err(format!("node {node}: num_weights {rows} must be positive"));
                }
                expect_sizes(node, o, &[d, rows as u64])
            }
        }
        Op::Transpose | Op::Reshape => {
            let x = i(0);
            if o.dtype != x.dtype {
                return Err(format!(
                    "node {node}: output {} is {}, input {} is {}",
                    o.name,
                    dtype_name(o.dtype),
                    x.name,
                    dtype_name(x.dtype)
                ));
            }
            if g.op == Op::Reshape {
                if cpu::numel(o.sizes) != cpu::numel(x.sizes) {
                    return Err(format!(
                        "node {node}: reshape of {} {:?} into {} {:?} changes the element count",
                        x.name, x.sizes, o.name, o.sizes
                    ));
                }
                return Ok(());
            }
            let (dim, perm) = transpose_params(params).expect("size checked");
            let mut seen = vec![false; x.sizes.len()];
            if dim != x.sizes.len()
                || perm.len() != dim
                || perm.iter().any(|&p| p >= dim || std::mem::replace(&mut seen[p], true))
            {
                return Err(format!(
                    "node {node}: permutation {perm:?} (tensorDim {dim}) is not a permutation of the {} dimensions of {}",
                    x.sizes.len(),
                    x.name
                ));
            }
            let want: Vec<u64> = perm.iter().map(|&p| x.sizes[p]).collect();
            expect_sizes(node, o, &want)
        }
    }
}

/// Compile checks of `layer_norm_fwd` (x, beta, gamma) -> (y, mean, istd) and `layer_norm_bwd`
/// (x, dy, mean, istd, gamma) -> (dx, dbeta, dgamma): x of rank >= 1 normalized over
/// dimension 0 (C values), beta/gamma/dbeta/dgamma `[C]` f32, mean/istd f32 of x's sizes with
/// dimension 0 set to 1.
fn check_layer_norm(
    node: &str,
    g: Guid,
    params: &[u8],
    ins: &[Option<Operand<'_>>],
    outs: &[Operand<'_>],
) -> Result<(), String> {
    let dt = g.dtype.unwrap_or(synDataType::SINGLE);
    let f32t = synDataType::SINGLE;
    let i = |k: usize| ins[k].expect("arity checked");
    let x = i(0);
    let Some(&c) = x.sizes.first() else {
        return Err(format!("node {node}: tensor {} has rank 0", x.name));
    };
    if params.len() >= LN_PARAMS_NORM && !matches!(u32_at(params, 8), Some(0 | 1)) {
        return Err(format!(
            "node {node}: NormAxisBmp {:#b}: the CPU mock normalizes over dimension 0 (the FCD) only",
            u32_at(params, 8).unwrap_or(0)
        ));
    }
    let mut stat = x.sizes.to_vec();
    stat[0] = 1;
    expect_float_input(node, &x, dt)?;
    let per_c = |t: &Operand<'_>| -> Result<(), String> {
        expect_float_input(node, t, f32t)?;
        expect_sizes(node, t, &[c])
    };
    if g.op == Op::LayerNorm {
        per_c(&i(1))?;
        per_c(&i(2))?;
        expect_dtype(node, &outs[0], dt)?;
        expect_sizes(node, &outs[0], x.sizes)?;
        for t in &outs[1..] {
            expect_dtype(node, t, f32t)?;
            expect_sizes(node, t, &stat)?;
        }
    } else {
        expect_float_input(node, &i(1), dt)?;
        expect_sizes(node, &i(1), x.sizes)?;
        for k in [2, 3] {
            expect_float_input(node, &i(k), f32t)?;
            expect_sizes(node, &i(k), &stat)?;
        }
        per_c(&i(4))?;
        expect_dtype(node, &outs[0], dt)?;
        expect_sizes(node, &outs[0], x.sizes)?;
        for t in &outs[1..] {
            expect_dtype(node, t, f32t)?;
            expect_sizes(node, t, &[c])?;
        }
    }
    Ok(())
}

fn check_gemm(node: &str, g: Guid, params: &[u8], ins: &[Option<Operand<'_>>], o: &Operand<'_>) -> Result<(), String> {
    let (ta, tb) = gemm_params(params);
    let (x, y) = (ins[0].expect("arity"), ins[1].expect("arity"));
    for t in [&x, &y, o] {
        if !matches!(t.dtype, synDataType::SINGLE | synDataType::BF16) {
            return Err(format!("node {node}: tensor {} is {}, GEMM takes f32 or bf16", t.name, dtype_name(t.dtype)));
        }
    }
    let rank_ok = |t: &Operand<'_>| if g.op == Op::BatchGemm { t.sizes.len() >= 3 } else { t.sizes.len() == 2 };
    for t in [&x, &y, o] {
        if !rank_ok(t) {
            return Err(format!(
                "node {node}: tensor {} has rank {}, Node {node} has invalid layout",
                t.name,
                t.sizes.len()
            ));
        }
    }
    let mismatch = |what: &str, a: u64, b: u64| {
        Err(format!(
            "node {node}: mismatch between common dimensions for gemm operation ({what}: {a} vs {b}); Node {node} has invalid layout"
        ))
    };
    match g.op {
        Op::Gemm | Op::BatchGemm => {
            let ((m, k), (k2, n)) = (mk(x.sizes, ta), kn(y.sizes, tb));
            if k != k2 {
                return mismatch(&format!("K of {} and {}", x.name, y.name), k, k2);
            }
            let mut want = vec![n, m];
            if g.op == Op::BatchGemm {
                let Some(batch) = cpu::broadcast_shape(&x.sizes[2..], &y.sizes[2..]) else {
                    return Err(format!("node {node}: batch dimensions of {} and {} do not broadcast", x.name, y.name));
                };
                want.extend(batch);
            }
            if let Some(Some(bias)) = ins.get(2) {
                expect_sizes(node, bias, &[n])?;
            }
            expect_sizes(node, o, &want)
        }
        Op::GemmDedx => {
            // (dC [N, M], B) -> dA in A's layout.
            let (n, m) = (x.sizes[0], x.sizes[1]);
            let (k, n2) = kn(y.sizes, tb);
            if n != n2 {
                return mismatch(&format!("N of {} and {}", x.name, y.name), n, n2);
            }
            expect_sizes(node, o, &if ta { [m, k] } else { [k, m] })
        }
        _ => {
            // gemm_dedw: (dC [N, M], A) -> dB in B's layout.
            let (n, m) = (x.sizes[0], x.sizes[1]);
            let (m2, k) = mk(y.sizes, ta);
            if m != m2 {
                return mismatch(&format!("M of {} and {}", x.name, y.name), m, m2);
            }
            expect_sizes(node, o, &if tb { [k, n] } else { [n, k] })
        }
    }
}

/// Runs a validated node on f32 values: `ins[k]` = (values, sizes), `outs[k]` = sizes.
/// Err: a runtime failure of the kernel (e.g. a label out of range).
pub(crate) fn run(
    g: Guid,
    params: &[u8],
    ins: &[Option<(&[f32], &[u64])>],
    outs: &[&[u64]],
) -> Result<Vec<Vec<f32>>, String> {
    let i = |k: usize| ins[k].expect("validated");
    let f32_at = |at| u32_at(params, at).map(f32::from_bits);
    let n_out = cpu::numel(outs[0]);
    Ok(match g.op {
        Op::Binary(b) => vec![cpu::binary(b, i(0).0, i(0).1, i(1).0, i(1).1, outs[0])],
        Op::Cast => {
            let x = i(0).0;
            // Round toward zero (mode 4) for f32 -> bf16 by truncating the low 16 bits; the
            // store rounds to nearest even otherwise.
            if u32_at(params, 0) == Some(4) && g.to == Some(synDataType::BF16) {
                vec![x.iter().map(|v| f32::from_bits(v.to_bits() & 0xFFFF_0000)).collect()]
            } else {
                vec![x.to_vec()]
            }
        }
        Op::Constant => vec![vec![f32_at(0).unwrap_or(0.0); n_out]],
        Op::Memset => vec![vec![0.0; n_out]],
        Op::Relu => vec![cpu::relu(i(0).0, f32_at(0).unwrap_or(0.0))],
        Op::ReluBwd => vec![cpu::relu_bwd(i(0).0, i(1).0, f32_at(0).unwrap_or(0.0))],
        Op::Softmax => vec![cpu::softmax(i(0).0, i(0).1, u32_at(params, 0).unwrap_or(0) as usize)],
        Op::LogSoftmax => vec![cpu::log_softmax(i(0).0, i(0).1, u32_at(params, 0).unwrap_or(0) as usize)],
        Op::SoftmaxBwd => vec![cpu::softmax_bwd(i(0).0, i(1).0, i(0).1, u32_at(params, 0).unwrap_or(0) as usize)],
        Op::IsFinite => vec![cpu::isfinite(i(0).0)],
        Op::ReduceSum => vec![cpu::reduce_sum(i(0).0, i(0).1, 1 << u32_at(params, 0).unwrap_or(0))],
        Op::ReduceSumMulti => vec![cpu::reduce_sum(i(0).0, i(0).1, multi_mask(params, i(0).1.len()).0)],
        Op::CeFwd | Op::CeBwd => {
            let (x, sizes) = i(0);
            let (c, b) = (sizes[0] as usize, sizes[1] as usize);
            let mode = match u32_at(params, 0) {
                Some(0) => CeMode::Sum,
                Some(1) => CeMode::Mean,
                _ => CeMode::None,
            };
            let bs = u32_at(params, 4).unwrap_or(0) as i32;
            if g.op == Op::CeFwd {
                let (loss, ls) = cpu::softmax_ce_fwd(x, i(1).0, c, b, mode, bs)?;
                vec![loss, ls]
            } else {
                vec![cpu::softmax_ce_bwd(x, i(1).0, c, b, mode, bs)?]
            }
        }
        Op::Gemm | Op::BatchGemm => vec![gemm(g, params, ins, outs[0])],
        Op::Sqrt => vec![i(0).0.iter().map(|v| v.sqrt()).collect()],
        Op::LayerNorm => {
            let (x, sizes) = i(0);
            let (y, mean, istd) = cpu::layer_norm(x, sizes[0] as usize, i(1).0, i(2).0, ln_eps(params));
            vec![y, mean, istd]
        }
        Op::LayerNormBwd => {
            let (x, sizes) = i(0);
            let (dx, dbeta, dgamma) = cpu::layer_norm_bwd(x, i(1).0, i(2).0, i(3).0, i(4).0, sizes[0] as usize);
            vec![dx, dbeta, dgamma]
        }
        Op::Gelu => {
            let y = cpu::gelu(i(0).0, gelu_tanh(params));
            // The second output's content is the vendor's (not public): the mock writes x.
            if outs.len() == 2 { vec![y, i(0).0.to_vec()] } else { vec![y] }
        }
        Op::GeluBwd => vec![cpu::gelu_bwd(i(0).0, i(1).0, gelu_tanh(params))],
        Op::Embedding => {
            let (w, ws) = i(0);
            vec![cpu::embedding(w, ws[0] as usize, ws[1] as usize, i(1).0)?]
        }
        Op::EmbeddingBwd => {
            let (grad, gs) = i(0);
            let rows = outs[0][1] as usize;
            let pad = u32_at(params, 4).map_or(-1, |v| v as i32);
            vec![cpu::embedding_bwd(grad, i(1).0, gs[0] as usize, rows, pad)?]
        }
        Op::Transpose => {
            let (x, sizes) = i(0);
            let (_, perm) = transpose_params(params).expect("validated");
            vec![cpu::transpose_nd(x, sizes, &perm)]
        }
        Op::Reshape => vec![i(0).0.to_vec()],
        Op::GemmDedx => {
            let (ta, tb) = gemm_params(params);
            let ((dc, dcs), (b, bs)) = (i(0), i(1));
            let (n, m) = (dcs[0] as usize, dcs[1] as usize);
            let k = kn(bs, tb).0 as usize;
            let mut da = vec![0f32; m * k];
            // dA (M×K) = dC (M×N) · Bᵀ, Bᵀ (N×K) stored transposed unless B was.
            cpu::matmul(
                Mat { data: dc, rows: m, cols: n, trans: false },
                Mat { data: b, rows: n, cols: k, trans: !tb },
                &mut da,
            );
            vec![if ta { cpu::transpose(&da, m, k) } else { da }]
        }
        Op::GemmDedw => {
            let (ta, tb) = gemm_params(params);
            let ((dc, dcs), (a, as_)) = (i(0), i(1));
            let (n, m) = (dcs[0] as usize, dcs[1] as usize);
            let k = mk(as_, ta).1 as usize;
            let mut db = vec![0f32; k * n];
            // dB (K×N) = Aᵀ (K×M) · dC (M×N).
            cpu::matmul(
                Mat { data: a, rows: k, cols: m, trans: !ta },
                Mat { data: dc, rows: m, cols: n, trans: false },
                &mut db,
            );
            vec![if tb { cpu::transpose(&db, k, n) } else { db }]
        }
    })
}

/// `gemm` (with optional bias) and `batch_gemm` (batch dimensions 2.., size 1 broadcast).
fn gemm(g: Guid, params: &[u8], ins: &[Option<(&[f32], &[u64])>], out: &[u64]) -> Vec<f32> {
    let (ta, tb) = gemm_params(params);
    let ((a, sa), (b, sb)) = (ins[0].expect("validated"), ins[1].expect("validated"));
    let (m, k) = mk(sa, ta);
    let n = kn(sb, tb).1;
    let (m, k, n) = (m as usize, k as usize, n as usize);
    let batch: Vec<u64> = out[2..].to_vec();
    let nb = cpu::numel(&batch);
    let mut c = vec![0f32; nb * m * n];
    let offset = |sizes: &[u64], mut idx: usize| -> usize {
        // Batch index (over `batch`, FCD first) -> matrix index of an operand whose size-1 batch
        // dimensions broadcast.
        let mut off = 0;
        let mut stride = 1;
        for (d, &bd) in batch.iter().enumerate() {
            let i = idx % bd as usize;
            idx /= bd as usize;
            let s = sizes.get(2 + d).copied().unwrap_or(1) as usize;
            off += if s == 1 { 0 } else { i * stride };
            stride *= s;
        }
        off
    };
    for bi in 0..nb {
        let (oa, ob) = (offset(sa, bi) * m * k, offset(sb, bi) * k * n);
        cpu::matmul(
            Mat { data: &a[oa..oa + m * k], rows: m, cols: k, trans: ta },
            Mat { data: &b[ob..ob + k * n], rows: k, cols: n, trans: tb },
            &mut c[bi * m * n..(bi + 1) * m * n],
        );
    }
    if g.op == Op::Gemm
        && let Some(Some((bias, _))) = ins.get(2)
    {
        for row in c.chunks_mut(n) {
            for (v, &bv) in row.iter_mut().zip(bias.iter()) {
                *v += bv;
            }
        }
    }
    c
}

/// (bytes read and written, floating-point operations) of one node, for the cost model.
pub(crate) fn cost(g: Guid, params: &[u8], ins: &[Option<Operand<'_>>], outs: &[Operand<'_>]) -> (u64, u64) {
    let bytes = |t: &Operand<'_>| cpu::numel(t.sizes) as u64 * elem_size(t.dtype).unwrap_or(4);
    let total: u64 = ins.iter().flatten().map(bytes).sum::<u64>() + outs.iter().map(bytes).sum::<u64>();
    let out_n = outs.first().map_or(0, |o| cpu::numel(o.sizes) as u64);
    let flops = match g.op {
        Op::Gemm | Op::BatchGemm | Op::GemmDedx | Op::GemmDedw => {
            // 2·M·N·K per matrix: the output has M·N (·batch) elements, K from the operands.
            let (ta, tb) = gemm_params(params);
            let k = match (g.op, ins[1]) {
                (Op::GemmDedx, _) => ins[0].map_or(1, |x| x.sizes[0]),
                (Op::GemmDedw, _) => ins[0].map_or(1, |x| x.sizes[1]),
                (_, Some(b)) => kn(b.sizes, tb).0,
                _ => 1,
            };
            let _ = ta;
            2 * out_n * k
        }
        Op::Softmax | Op::SoftmaxBwd | Op::LogSoftmax | Op::CeFwd | Op::CeBwd => 5 * out_n.max(1),
        // Per element: mean, variance, normalize, scale and shift (about 8 operations); the
        // backward about 12 (x̂, two row sums, dx, dbeta, dgamma).
        Op::LayerNorm => 8 * out_n,
        Op::LayerNormBwd => 12 * out_n,
        // erf / tanh and the polynomial around it, per element (an order of magnitude).
        Op::Gelu => 10 * out_n,
        Op::GeluBwd => 14 * out_n,
        // Data movement only.
        Op::Embedding | Op::Transpose | Op::Reshape => 0,
        _ => ins.iter().flatten().map(|t| cpu::numel(t.sizes) as u64).max().unwrap_or(0).max(out_n),
    };
    let total = match g.op {
        // A gather reads the indices and one table row per token, not the whole table.
        Op::Embedding => ins[1].as_ref().map_or(0, bytes) + 2 * outs.first().map_or(0, bytes),
        // A reshape is a view in the real graph compiler (no data moves) [I].
        Op::Reshape => 0,
        _ => total,
    };
    (total, flops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_names_parse_and_others_do_not() {
        assert_eq!(Guid::parse("add_fwd_f32").unwrap().op, Op::Binary(Binary::Add));
        assert_eq!(Guid::parse("mult_fwd_bf16").unwrap().dtype, Some(synDataType::BF16));
        let c = Guid::parse("cast_bf16_to_f32").unwrap();
        assert_eq!((c.op, c.dtype, c.to), (Op::Cast, Some(synDataType::BF16), Some(synDataType::SINGLE)));
        assert_eq!(Guid::parse("batch_gemm_f32").unwrap().op, Op::BatchGemm);
        assert!(Guid::parse("gemm").unwrap().is_mme());
        for bad in ["add_f32", "add_fwd_f64", "addfwd", "", "cast_f32_to_f32", "no_such_kernel_fwd_f32", "relu_fwd"] {
            assert_eq!(Guid::parse(bad), None, "{bad}");
        }
    }

    fn op<'a>(name: &'a str, dtype: synDataType, sizes: &'a [u64]) -> Operand<'a> {
        Operand { name, dtype, sizes }
    }

    #[test]
    fn compile_checks_name_node_and_tensor() {
        let f = synDataType::SINGLE;
        let b = synDataType::BF16;
        let add = Guid::parse("add_fwd_f32").unwrap();
        let (x, y) = (op("x", f, &[4, 2]), op("y", f, &[4, 1]));
        check_compile("n", "add_fwd_f32", add, &[], &[Some(x), Some(y)], &[op("o", f, &[4, 2])]).unwrap();
        let e =
            check_compile("n", "add_fwd_f32", add, &[], &[Some(x), Some(op("y", f, &[3, 2]))], &[op("o", f, &[4, 2])])
                .unwrap_err();
        assert!(e.contains("node n") && e.contains("not broadcastable"), "{e}");
        let e = check_compile("n", "add_fwd_f32", add, &[], &[Some(x)], &[op("o", f, &[4, 2])]).unwrap_err();
        assert!(e.contains("GLUE_INCOMPATIBLE_INPUT_COUNT"), "{e}");
        let e = check_compile("n", "add_fwd_f32", add, &[1, 2, 3, 4], &[Some(x), Some(y)], &[op("o", f, &[4, 2])])
            .unwrap_err();
        assert!(e.contains("params size 4"), "{e}");
        // bf16 into an f32 kernel is recovered; f32 into a bf16 kernel is not.
        check_compile("n", "add_fwd_f32", add, &[], &[Some(op("x", b, &[4, 2])), Some(y)], &[op("o", f, &[4, 2])])
            .unwrap();
        let addb = Guid::parse("add_fwd_bf16").unwrap();
        let e = check_compile(
            "n",
            "add_fwd_bf16",
            addb,
            &[],
            &[Some(x), Some(op("y", b, &[4, 1]))],
            &[op("o", b, &[4, 2])],
        )
        .unwrap_err();
        assert!(e.contains("tensor x is f32, expected bf16"), "{e}");
        let gemm = Guid::parse("gemm").unwrap();
        let e = check_compile(
            "g",
            "gemm",
            gemm,
            &[],
            &[Some(op("a", f, &[3, 2])), Some(op("b", f, &[5, 4]))],
            &[op("c", f, &[5, 2])],
        )
        .unwrap_err();
        assert!(e.contains("mismatch between common dimensions"), "{e}");
        let e = check_create(
            "g",
            gemm,
            &[],
            &[Some(op("a", f, &[3, 2])), Some(op("b", b, &[5, 3]))],
            &[op("c", f, &[5, 2])],
        )
        .unwrap_err();
        assert!(!e.0 && e.1.contains("Incompatible datatype"), "{e:?}");
        let e = check_create("g", gemm, &[], &[Some(op("a", f, &[3, 2]))], &[op("c", f, &[5, 2])]).unwrap_err();
        assert!(e.0, "{e:?}");
    }

    #[test]
    fn gemm_backward_matches_the_forward_definition() {
        // Row-major A 2×3, B 3×4 (FCD-first sizes A [3, 2], B [4, 3], C [4, 2]).
        let a: Vec<f32> = (0..6).map(|v| v as f32 - 2.0).collect();
        let b: Vec<f32> = (0..12).map(|v| (v as f32) * 0.5 - 3.0).collect();
        let dc: Vec<f32> = (0..8).map(|v| (v as f32) * 0.25 - 1.0).collect();
        let none: [u8; 2] = [0, 0];
        let da =
            run(Guid::parse("gemm_dedx").unwrap(), &none, &[Some((&dc, &[4, 2])), Some((&b, &[4, 3]))], &[&[3, 2]])
                .unwrap();
        let db =
            run(Guid::parse("gemm_dedw").unwrap(), &none, &[Some((&dc, &[4, 2])), Some((&a, &[3, 2]))], &[&[4, 3]])
                .unwrap();
        for i in 0..2 {
            for p in 0..3 {
                let w: f64 = (0..4).map(|j| f64::from(dc[i * 4 + j]) * f64::from(b[p * 4 + j])).sum();
                assert!((f64::from(da[0][i * 3 + p]) - w).abs() < 1e-5);
            }
        }
        for p in 0..3 {
            for j in 0..4 {
                let w: f64 = (0..2).map(|i| f64::from(a[i * 3 + p]) * f64::from(dc[i * 4 + j])).sum();
                assert!((f64::from(db[0][p * 4 + j]) - w).abs() < 1e-5);
            }
        }
        // transpose_b: B stored as row-major 4×3 (sizes [3, 4]); dB comes back in that layout.
        let bt = cpu::transpose(&b, 3, 4);
        let tb: [u8; 2] = [0, 1];
        let c =
            run(Guid::parse("gemm").unwrap(), &tb, &[Some((&a, &[3, 2])), Some((&bt, &[3, 4]))], &[&[4, 2]]).unwrap();
        let c0 =
            run(Guid::parse("gemm").unwrap(), &none, &[Some((&a, &[3, 2])), Some((&b, &[4, 3]))], &[&[4, 2]]).unwrap();
        assert_eq!(c, c0);
        let dbt = run(Guid::parse("gemm_dedw").unwrap(), &tb, &[Some((&dc, &[4, 2])), Some((&a, &[3, 2]))], &[&[3, 4]])
            .unwrap();
        assert_eq!(dbt[0], cpu::transpose(&db[0], 3, 4));
        let dat =
            run(Guid::parse("gemm_dedx").unwrap(), &tb, &[Some((&dc, &[4, 2])), Some((&bt, &[3, 4]))], &[&[3, 2]])
                .unwrap();
        assert_eq!(dat[0], da[0]);
    }

    #[test]
    fn batch_gemm_broadcasts_a_size_one_batch() {
        // A: 2 batches of 1×2, B: one 2×1 shared.
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [10.0f32, 100.0];
        let g = Guid::parse("batch_gemm").unwrap();
        let c = run(g, &[], &[Some((&a, &[2, 1, 2])), Some((&b, &[1, 2, 1]))], &[&[1, 1, 2]]).unwrap();
        assert_eq!(c[0], vec![210.0, 430.0]);
    }
}

/// The transformer kernels' GUID-level behaviour: refusals at create and compile, input-order
/// traps through [`run`], and costs.
#[cfg(test)]
mod transformer_tests {
    use super::*;

    const F: synDataType = synDataType::SINGLE;
    const B: synDataType = synDataType::BF16;
    const I: synDataType = synDataType::INT32;

    fn op<'a>(name: &'a str, dtype: synDataType, sizes: &'a [u64]) -> Operand<'a> {
        Operand { name, dtype, sizes }
    }

    /// `ns_LayerNormKernel::Params{epsValid, eps}` bytes.
    fn ln_params(eps: f32) -> Vec<u8> {
        let mut p = vec![1, 0, 0, 0];
        p.extend_from_slice(&eps.to_le_bytes());
        p
    }

    /// `synTransposeParams` bytes for `perm`.
    fn transpose_params_of(perm: &[u32]) -> Vec<u8> {
        let mut p = Vec::new();
        for k in 0..5 {
            p.extend_from_slice(&perm.get(k).copied().unwrap_or(k as u32).to_le_bytes());
        }
        p.extend_from_slice(&(perm.len() as u32).to_le_bytes());
        p
    }

    /// `ns_EmbeddingDensePtBwdKernel::Params` bytes.
    fn emb_params(rows: i32, pad: i32, freq: bool) -> Vec<u8> {
        let mut p = rows.to_le_bytes().to_vec();
        p.extend_from_slice(&pad.to_le_bytes());
        p.extend_from_slice(&[u8::from(freq), 0, 0, 0]);
        p
    }

    /// One node case: GUID, params, inputs, outputs.
    struct Case<'a> {
        guid: &'a str,
        params: Vec<u8>,
        ins: Vec<Option<Operand<'a>>>,
        outs: Vec<Operand<'a>>,
    }

    impl Case<'_> {
        fn compile(&self) -> Result<(), String> {
            let g = Guid::parse(self.guid).unwrap_or_else(|| panic!("{} parses", self.guid));
            check_create("n", g, &self.params, &self.ins, &self.outs).map_err(|e| e.1)?;
            check_compile("n", self.guid, g, &self.params, &self.ins, &self.outs)
        }
    }

    /// A valid case of every new GUID (f32 and bf16 where the kernel has both).
    fn valid_cases() -> Vec<Case<'static>> {
        const X: &[u64] = &[4, 3, 2];
        const C: &[u64] = &[4];
        const STAT: &[u64] = &[1, 3, 2];
        let (x, c, stat) = (X, C, STAT);
        let mut v = Vec::new();
        for (dt, sfx) in [(F, "f32"), (B, "bf16")] {
            let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
            v.push(Case {
                guid: leak(format!("layer_norm_fwd_{sfx}")),
                params: ln_params(1e-5),
                ins: vec![Some(op("x", dt, x)), Some(op("beta", F, c)), Some(op("gamma", F, c))],
                outs: vec![op("y", dt, x), op("mean", F, stat), op("istd", F, stat)],
            });
            v.push(Case {
                guid: leak(format!("layer_norm_bwd_{sfx}")),
                params: ln_params(1e-5),
                ins: vec![
                    Some(op("x", dt, x)),
                    Some(op("dy", dt, x)),
                    Some(op("mean", F, stat)),
                    Some(op("istd", F, stat)),
                    Some(op("gamma", F, c)),
                ],
                outs: vec![op("dx", dt, x), op("dbeta", F, c), op("dgamma", F, c)],
            });
            v.push(Case {
                guid: leak(format!("gelu_fwd_{sfx}")),
                params: vec![0],
                ins: vec![Some(op("x", dt, x))],
                outs: vec![op("y", dt, x), op("aux", dt, x)],
            });
            v.push(Case {
                guid: leak(format!("gelu_bwd_{sfx}")),
                params: vec![1],
                ins: vec![Some(op("grad", dt, x)), Some(op("x", dt, x))],
                outs: vec![op("dx", dt, x)],
            });
            v.push(Case {
                guid: leak(format!("embedding_pt_fwd_{sfx}")),
                params: vec![],
                ins: vec![Some(op("w", dt, &[4, 10])), Some(op("idx", I, &[3, 2]))],
                outs: vec![op("e", dt, x)],
            });
            v.push(Case {
                guid: leak(format!("embedding_dense_pt_bwd_{sfx}")),
                params: emb_params(10, -1, false),
                ins: vec![Some(op("grad", dt, x)), Some(op("idx", I, &[3, 2]))],
                outs: vec![op("dw", dt, &[4, 10])],
            });
            v.push(Case {
                guid: leak(format!("div_fwd_{sfx}")),
                params: vec![],
                ins: vec![Some(op("a", dt, x)), Some(op("b", dt, &[1]))],
                outs: vec![op("q", dt, x)],
            });
            v.push(Case {
                guid: leak(format!("sqrt_fwd_{sfx}")),
                params: vec![],
                ins: vec![Some(op("a", dt, x))],
                outs: vec![op("r", dt, x)],
            });
        }
        v.push(Case {
            guid: "transpose",
            params: transpose_params_of(&[0, 2, 1]),
            ins: vec![Some(op("x", F, x))],
            outs: vec![op("t", F, &[4, 2, 3])],
        });
        v.push(Case {
            guid: "reshape",
            params: vec![],
            ins: vec![Some(op("x", B, x))],
            outs: vec![op("r", B, &[12, 2])],
        });
        v
    }

    #[test]
    fn every_new_guid_compiles_its_valid_case_and_refuses_each_mistake_as_the_compiler_does() {
        for case in valid_cases() {
            case.compile().unwrap_or_else(|e| panic!("{}: {e}", case.guid));
            // One input too few and one too many: GLUE_INCOMPATIBLE_INPUT_COUNT.
            let mut fewer =
                Case { guid: case.guid, params: case.params.clone(), ins: case.ins.clone(), outs: case.outs.clone() };
            fewer.ins.pop();
            let e = fewer.compile().unwrap_err();
            assert!(e.contains("GLUE_INCOMPATIBLE_INPUT_COUNT"), "{}: {e}", case.guid);
            let mut more =
                Case { guid: case.guid, params: case.params.clone(), ins: case.ins.clone(), outs: case.outs.clone() };
            more.ins.push(case.ins[0]);
            assert!(more.compile().unwrap_err().contains("GLUE_INCOMPATIBLE_INPUT_COUNT"), "{}", case.guid);
            // An extra output: GLUE_INCOMPATIBLE_OUTPUT_COUNT.
            let mut outs = case.outs.clone();
            outs.push(case.outs[0]);
            let e = Case { guid: case.guid, params: case.params.clone(), ins: case.ins.clone(), outs }
                .compile()
                .unwrap_err();
            assert!(e.contains("GLUE_INCOMPATIBLE_OUTPUT_COUNT"), "{}: {e}", case.guid);
            // Params of a size no version has (3 bytes): refused at compile (TPC) or, for
            // transpose, at create with "Invalid Size for Node Params".
            let bad = Case { guid: case.guid, params: vec![0; 3], ins: case.ins.clone(), outs: case.outs.clone() };
            let e = bad.compile().unwrap_err();
            assert!(e.contains("params size 3") || e.contains("Invalid Size for Node Params"), "{}: {e}", case.guid);
            // A wrong output shape (dimension 0 doubled).
            let mut outs = case.outs.clone();
            let doubled: &'static [u64] = Box::leak(
                std::iter::once(outs[0].sizes[0] * 2)
                    .chain(outs[0].sizes[1..].iter().copied())
                    .collect::<Vec<_>>()
                    .into_boxed_slice(),
            );
            outs[0].sizes = doubled;
            let e = Case { guid: case.guid, params: case.params.clone(), ins: case.ins.clone(), outs }
                .compile()
                .unwrap_err();
            assert!(e.contains("expected") || e.contains("element count"), "{}: {e}", case.guid);
        }
    }

    #[test]
    fn dtype_rules_recover_bf16_into_f32_only_and_want_i32_indices() {
        let x: &[u64] = &[4, 3];
        // f32 into a bf16 kernel fails; bf16 into an f32 kernel is recovered (a planted cast).
        let e =
            Case { guid: "gelu_fwd_bf16", params: vec![], ins: vec![Some(op("x", F, x))], outs: vec![op("y", B, x)] }
                .compile()
                .unwrap_err();
        assert!(e.contains("tensor x is f32, expected bf16"), "{e}");
        Case { guid: "gelu_fwd_f32", params: vec![], ins: vec![Some(op("x", B, x))], outs: vec![op("y", F, x)] }
            .compile()
            .unwrap();
        // layer norm statistics are f32 even for the bf16 kernel.
        let e = Case {
            guid: "layer_norm_fwd_bf16",
            params: ln_params(1e-5),
            ins: vec![Some(op("x", B, x)), Some(op("beta", F, &[4])), Some(op("gamma", F, &[4]))],
            outs: vec![op("y", B, x), op("mean", B, &[1, 3]), op("istd", F, &[1, 3])],
        }
        .compile()
        .unwrap_err();
        assert!(e.contains("tensor mean is bf16, expected f32"), "{e}");
        // Embedding with its inputs swapped: the "table" is i32 and the "indices" f32: refused.
        let e = Case {
            guid: "embedding_pt_fwd_f32",
            params: vec![],
            ins: vec![Some(op("idx", I, &[3])), Some(op("w", F, &[4, 10]))],
            outs: vec![op("e", F, &[4, 3])],
        }
        .compile()
        .unwrap_err();
        assert!(e.contains("INCOMPATIBLE_DATA_TYPE"), "{e}");
        // Its backward with (indices, grad): refused the same way.
        let e = Case {
            guid: "embedding_dense_pt_bwd_f32",
            params: emb_params(10, -1, false),
            ins: vec![Some(op("idx", I, &[3])), Some(op("grad", F, &[4, 3]))],
            outs: vec![op("dw", F, &[4, 10])],
        }
        .compile()
        .unwrap_err();
        assert!(e.contains("INCOMPATIBLE_DATA_TYPE"), "{e}");
        // scaleGradByFreq and a normalized axis other than the FCD are not implemented.
        let e = Case {
            guid: "embedding_dense_pt_bwd_f32",
            params: emb_params(10, -1, true),
            ins: vec![Some(op("grad", F, &[4, 3])), Some(op("idx", I, &[3]))],
            outs: vec![op("dw", F, &[4, 10])],
        }
        .compile()
        .unwrap_err();
        assert!(e.contains("scaleGradByFreq"), "{e}");
        let mut p = ln_params(1e-5);
        p.extend_from_slice(&2u32.to_le_bytes());
        p.extend_from_slice(&1u32.to_le_bytes());
        let e = Case {
            guid: "layer_norm_fwd_f32",
            params: p,
            ins: vec![Some(op("x", F, x)), Some(op("beta", F, &[4])), Some(op("gamma", F, &[4]))],
            outs: vec![op("y", F, x), op("mean", F, &[1, 3]), op("istd", F, &[1, 3])],
        }
        .compile()
        .unwrap_err();
        assert!(e.contains("NormAxisBmp"), "{e}");
    }

    #[test]
    fn transpose_checks_its_params_at_create_and_its_permutation_at_compile() {
        let t = Guid::parse("transpose").unwrap();
        let x = [op("x", F, &[4, 3, 2])];
        let ins = [Some(x[0])];
        let out = [op("t", F, &[3, 4, 2])];
        // Wrong size: synFail (not synInvalidArgument) at synNodeCreate.
        for size in [0usize, 20, 25, 100] {
            let e = check_create("n", t, &vec![0; size], &ins, &out).unwrap_err();
            assert!(!e.0 && e.1.contains("Invalid Size for Node Params"), "{size}: {e:?}");
        }
        check_create("n", t, &transpose_params_of(&[1, 0, 2]), &ins, &out).unwrap();
        // The NDims version (tensorDim first, 25 slots).
        let mut nd = 3u32.to_le_bytes().to_vec();
        for k in [1u32, 0, 2].into_iter().chain(3..25) {
            nd.extend_from_slice(&k.to_le_bytes());
        }
        assert_eq!(nd.len(), TRANSPOSE_PARAMS_NDIMS);
        check_compile("n", "transpose", t, &nd, &ins, &out).unwrap();
        for (perm, what) in [(&[1u32, 1, 2][..], "repeated"), (&[1, 0][..], "rank"), (&[0, 1, 3][..], "out of range")] {
            let e = check_compile("n", "transpose", t, &transpose_params_of(perm), &ins, &out).unwrap_err();
            assert!(e.contains("is not a permutation"), "{what}: {e}");
        }
        // A huge tensorDim is refused without allocating for it.
        let mut huge = transpose_params_of(&[1, 0, 2]);
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(check_compile("n", "transpose", t, &huge, &ins, &out).is_err());
    }

    fn run1(guid: &str, params: &[u8], ins: &[(&[f32], &[u64])], outs: &[&[u64]]) -> Vec<Vec<f32>> {
        let ins: Vec<_> = ins.iter().map(|&(v, s)| Some((v, s))).collect();
        run(Guid::parse(guid).unwrap(), params, &ins, outs).unwrap()
    }

    #[test]
    fn layer_norm_takes_beta_before_gamma_and_its_backward_x_before_dy() {
        let x: Vec<f32> = (0..8).map(|v| (v * v) as f32 * 0.25 - 1.0).collect();
        let (beta, gamma) = ([0.5f32, -1.0, 2.0, 0.0], [2.0f32, 0.5, -1.0, 3.0]);
        let p = ln_params(1e-5);
        let out = run1(
            "layer_norm_fwd_f32",
            &p,
            &[(&x, &[4, 2]), (&beta, &[4]), (&gamma, &[4])],
            &[&[4, 2], &[1, 2], &[1, 2]],
        );
        let (want, _, _) = cpu::layer_norm(&x, 4, &beta, &gamma, 1e-5);
        assert_eq!(out[0], want);
        // Row 0 of y: x̂ · gamma + beta, with x̂ from an f64 reference.
        let m = x[..4].iter().map(|&v| f64::from(v)).sum::<f64>() / 4.0;
        let var = x[..4].iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / 4.0;
        for k in 0..4 {
            let w = (f64::from(x[k]) - m) / (var + 1e-5).sqrt() * f64::from(gamma[k]) + f64::from(beta[k]);
            assert!((f64::from(out[0][k]) - w).abs() < 1e-5, "{k}");
        }
        // (x, gamma, beta) — the PyTorch order — gives a different (wrong) y.
        let swapped = run1(
            "layer_norm_fwd_f32",
            &p,
            &[(&x, &[4, 2]), (&gamma, &[4]), (&beta, &[4])],
            &[&[4, 2], &[1, 2], &[1, 2]],
        );
        assert_ne!(swapped[0], out[0]);
        // eps from the params: epsValid false falls back to 1e-5; eps 1 changes the result.
        let no_eps = run1(
            "layer_norm_fwd_f32",
            &[0; 8],
            &[(&x, &[4, 2]), (&beta, &[4]), (&gamma, &[4])],
            &[&[4, 2], &[1, 2], &[1, 2]],
        );
        assert_eq!(no_eps[0], out[0]);
        let big = run1(
            "layer_norm_fwd_f32",
            &ln_params(1.0),
            &[(&x, &[4, 2]), (&beta, &[4]), (&gamma, &[4])],
            &[&[4, 2], &[1, 2], &[1, 2]],
        );
        assert_ne!(big[0], out[0]);
        let dy: Vec<f32> = (0..8).map(|v| v as f32 * 0.5 - 2.0).collect();
        let bwd = |a: &[f32], b: &[f32]| {
            run1(
                "layer_norm_bwd_f32",
                &p,
                &[(a, &[4, 2]), (b, &[4, 2]), (&out[1], &[1, 2]), (&out[2], &[1, 2]), (&gamma, &[4])],
                &[&[4, 2], &[4], &[4]],
            )
        };
        let good = bwd(&x, &dy);
        // Outputs are (dx, dbeta, dgamma): dbeta is the column sum of dy.
        for k in 0..4 {
            assert!((good[1][k] - (dy[k] + dy[4 + k])).abs() < 1e-6);
        }
        assert_ne!(bwd(&dy, &x)[0], good[0], "swapped (dy, x) must not give dx");
    }

    #[test]
    fn new_nodes_cost_by_bytes_and_flops() {
        let x = [op("x", F, &[64, 10])];
        let bytes = 64 * 10 * 4;
        let c = |guid: &str, params: &[u8], ins: &[Option<Operand<'_>>], outs: &[Operand<'_>]| {
            cost(Guid::parse(guid).unwrap(), params, ins, outs)
        };
        assert_eq!(c("gelu_fwd_f32", &[], &[Some(x[0])], &x), (2 * bytes, 10 * 640));
        assert_eq!(c("reshape", &[], &[Some(x[0])], &[op("r", F, &[640])]), (0, 0));
        assert_eq!(
            c("transpose", &transpose_params_of(&[1, 0]), &[Some(x[0])], &[op("t", F, &[10, 64])]),
            (2 * bytes, 0)
        );
        // A gather reads one row per token (3 tokens of 64 f32) and the indices, not the table.
        let e = c(
            "embedding_pt_fwd_f32",
            &[],
            &[Some(op("w", F, &[64, 1000])), Some(op("i", I, &[3]))],
            &[op("e", F, &[64, 3])],
        );
        assert_eq!(e, (3 * 4 + 2 * 3 * 64 * 4, 0));
        let ln = c(
            "layer_norm_fwd_f32",
            &ln_params(1e-5),
            &[Some(x[0]), Some(op("b", F, &[64])), Some(op("g", F, &[64]))],
            &[x[0], op("m", F, &[1, 10]), op("s", F, &[1, 10])],
        );
        assert_eq!(ln, (2 * bytes + 2 * 64 * 4 + 2 * 10 * 4, 8 * 640));
    }
}
