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
//! (`gemm`, `gemm_dedx`, `gemm_dedw`, `batch_gemm`, `memset`; a `_f32`/`_bf16` suffix is
//! tolerated as by the real node factory). Dimensions are FCD first and axis parameters are in
//! TPC order (0 = fastest-changing).

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
            Op::Binary(_) | Op::Memset | Op::IsFinite => &[0],
            Op::Cast => &[0, 4, 8, 12, 16],
            Op::Constant => &[4],
            Op::Relu => &[0, 4, 8],
            Op::ReluBwd => &[0, 4],
            Op::Softmax | Op::SoftmaxBwd | Op::LogSoftmax | Op::ReduceSum => &[4],
            Op::CeFwd | Op::CeBwd | Op::ReduceSumMulti => &[8],
            Op::Gemm | Op::GemmDedx | Op::GemmDedw | Op::BatchGemm => return None,
        })
    }

    /// (inputs, outputs) the kernel takes: inputs as an inclusive range.
    fn arity(self) -> ((usize, usize), usize) {
        match self.op {
            Op::Binary(_) | Op::ReluBwd | Op::SoftmaxBwd | Op::CeBwd | Op::GemmDedx | Op::GemmDedw | Op::BatchGemm => {
                ((2, 2), 1)
            }
            Op::Cast | Op::Relu | Op::Softmax | Op::LogSoftmax | Op::ReduceSum | Op::ReduceSumMulti | Op::IsFinite => {
                ((1, 1), 1)
            }
            Op::Constant | Op::Memset => ((0, 0), 1),
            Op::CeFwd => ((2, 2), 2),
            Op::Gemm => ((2, 3), 1),
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

/// GEMM transposes from the parameter bytes (missing bytes read as false).
fn gemm_params(p: &[u8]) -> (bool, bool) {
    (p.first().is_some_and(|&b| b != 0), p.get(1).is_some_and(|&b| b != 0))
}

/// What `synNodeCreate` rejects for a known GUID (the real factory checks MME operand counts
/// and operand dtypes there; TPC kernels are only looked up). Err: (is_invalid_argument, msg).
pub(crate) fn check_create(
    node: &str,
    g: Guid,
    ins: &[Option<Operand<'_>>],
    outs: &[Operand<'_>],
) -> Result<(), (bool, String)> {
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
    let ((lo, hi), n_out) = g.arity();
    if ins.len() < lo || ins.len() > hi || ins[..lo].iter().any(Option::is_none) {
        return Err(format!(
            "Failed to load tpc kernel for node {node}, GUID {guid}. Got error: GLUE_INCOMPATIBLE_INPUT_COUNT ({} inputs, expected {lo}..={hi})",
            ins.len()
        ));
    }
    if outs.len() != n_out {
        return Err(format!(
            "Failed to load tpc kernel for node {node}, GUID {guid}. Got error: GLUE_INCOMPATIBLE_OUTPUT_COUNT ({} outputs, expected {n_out})",
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
    }
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
        _ => ins.iter().flatten().map(|t| cpu::numel(t.sizes) as u64).max().unwrap_or(0).max(out_n),
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
        let e =
            check_create("g", gemm, &[Some(op("a", f, &[3, 2])), Some(op("b", b, &[5, 3]))], &[op("c", f, &[5, 2])])
                .unwrap_err();
        assert!(!e.0 && e.1.contains("Incompatible datatype"), "{e:?}");
        let e = check_create("g", gemm, &[Some(op("a", f, &[3, 2]))], &[op("c", f, &[5, 2])]).unwrap_err();
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
