//! Graph-builder inputs from arbitrary bytes: the one body of the cargo-fuzz target
//! `graph_builder` (`fuzz/fuzz_targets/graph_builder.rs`) and of the proptest that runs it in
//! `cargo test` (`tests/parsers_arbitrary_bytes.rs`).
//!
//! Owns: [`node_from_bytes`] (a decoder: bytes -> an [`Op`] with parameters and operand
//! dtypes/shapes), [`build_and_compile`] (the whole builder path on a runtime) and
//! [`graph_builder_case`] (the properties both drivers check). Must not touch: anything else;
//! product code never calls it.

use std::sync::Arc;

use super::super::error::Result;
use super::super::runtime::Runtime;
use super::builder::GraphBuilder;
use super::layout::DType;
use super::op::{CastRounding, Op, Operand, Reduction};
use crate::synapse::Error;

/// One operand: dtype and row-major shape.
pub type OperandSpec = (DType, Vec<u64>);

/// Decodes `data` into an operation (any variant, any parameters) and its input and output
/// operands (0..=3 inputs, 1..=2 outputs, rank 0..=4, dimensions 0..=6); `None` when `data` is
/// too short.
pub fn node_from_bytes(data: &[u8]) -> Option<(Op, Vec<OperandSpec>, Vec<OperandSpec>)> {
    let mut it = data.iter().copied();
    let mut next = || it.next();
    let b = |v: u8| v & 1 == 1;
    let axis = |v: u8| usize::from(v % 5);
    let (kind, p0, p1) = (next()?, next()?, next()?);
    let op = match kind % 22 {
        0 => Op::Add,
        1 => Op::Sub,
        2 => Op::Mul,
        3 => Op::Max,
        4 => Op::Min,
        5 => Op::Cast { rounding: if b(p0) { CastRounding::TowardZero } else { CastRounding::NearestEven } },
        6 => Op::Constant { value: f32::from(p0) - 128.0 },
        7 => Op::Zero,
        8 => Op::Relu,
        9 => Op::ReluBackward,
        10 => Op::Softmax { axis: axis(p0) },
        11 => Op::SoftmaxBackward { axis: axis(p0) },
        12 => Op::LogSoftmax { axis: axis(p0) },
        13 | 14 => {
            let reduction = [Reduction::Sum, Reduction::Mean, Reduction::None][usize::from(p0 % 3)];
            if kind % 22 == 13 {
                Op::SoftmaxCrossEntropy { reduction }
            } else {
                Op::SoftmaxCrossEntropyBackward { reduction }
            }
        }
        15 => Op::ReduceSum { axis: axis(p0) },
        16 => Op::ReduceSumAxes { axes: (0..5).filter(|i| p0 & (1 << i) != 0).collect(), keep_dims: b(p1) },
        17 => Op::IsFinite,
        18 => Op::Gemm { transpose_a: b(p0), transpose_b: b(p1) },
        19 => Op::GemmDx { transpose_a: b(p0), transpose_b: b(p1) },
        20 => Op::GemmDw { transpose_a: b(p0), transpose_b: b(p1) },
        _ => Op::BatchGemm { transpose_a: b(p0), transpose_b: b(p1) },
    };
    let counts = next()?;
    let (n_in, n_out) = (usize::from(counts % 4), usize::from(1 + (counts >> 2) % 2));
    let mut operand = || -> Option<OperandSpec> {
        let d = next()?;
        let dtype = [DType::F32, DType::Bf16, DType::I32, DType::I8][usize::from(d % 4)];
        let rank = usize::from((d >> 2) % 5);
        let shape = (0..rank).map(|_| next().map(|v| u64::from(v % 7))).collect::<Option<Vec<_>>>()?;
        Some((dtype, shape))
    };
    let ins = (0..n_in).map(|_| operand()).collect::<Option<Vec<_>>>()?;
    let outs = (0..n_out).map(|_| operand()).collect::<Option<Vec<_>>>()?;
    Some((op, ins, outs))
}

/// Builds a graph with one persistent tensor per operand and the node, then compiles it.
///
/// # Errors
/// The first typed error of the builder, the node checks or the compiler.
pub fn build_and_compile(rt: &Arc<Runtime>, op: &Op, ins: &[OperandSpec], outs: &[OperandSpec]) -> Result<()> {
    let mut g = GraphBuilder::new(rt, habana_sys::synDeviceType::GAUDI2)?;
    let mut tensor = |k: usize, (dt, shape): &OperandSpec| g.persistent(&format!("t{k}"), *dt, shape);
    let i = ins.iter().enumerate().map(|(k, o)| tensor(k, o)).collect::<Result<Vec<_>>>()?;
    let o = outs.iter().enumerate().map(|(k, s)| tensor(k + ins.len(), s)).collect::<Result<Vec<_>>>()?;
    g.node("fuzz", op, &i, &o)?;
    g.compile("fuzz").map(|_| ())
}

/// The fuzz case: decodes `data` ([`node_from_bytes`]), checks the node with [`Op::check`] and
/// builds and compiles it on `rt` ([`build_and_compile`]). `Err` describes a violated property:
/// - what the safe layer's checks accept (no 0 dimension) builds and compiles;
/// - a runtime rejection (`Error::Synapse`) only comes after the checks accepted the node (the
///   checks catch shape and dtype mistakes before the C call);
/// - no error reports a panic caught at the C ABI (the mock's guard turns one into synFail with
///   "internal error (panic)").
///
/// Too short an input is `Ok` (nothing to build).
///
/// # Errors
/// The property violated, with the op and operands.
pub fn graph_builder_case(rt: &Arc<Runtime>, data: &[u8]) -> std::result::Result<(), String> {
    let Some((op, ins, outs)) = node_from_bytes(data) else { return Ok(()) };
    fn operand(k: usize, (dtype, shape): &OperandSpec) -> Operand<'_> {
        Operand { name: ["a", "b", "c", "d", "e"][k], dtype: *dtype, shape }
    }
    let i: Vec<_> = ins.iter().enumerate().map(|(k, o)| operand(k, o)).collect();
    let o: Vec<_> = outs.iter().enumerate().map(|(k, o)| operand(k + ins.len(), o)).collect();
    let checked = op.check("fuzz", &i, &o);
    let built = build_and_compile(rt, &op, &ins, &outs);
    let case = || format!("{op:?} inputs {ins:?} outputs {outs:?}");
    let zero_dim = ins.iter().chain(&outs).any(|(_, s)| s.contains(&0));
    match (&checked, &built) {
        (Ok(_), Err(e)) if !zero_dim => return Err(format!("{}: the checks passed, the build failed: {e}", case())),
        (Err(c), Err(e @ Error::Synapse { .. })) => {
            return Err(format!("{}: the runtime rejected ({e}) what the checks should have caught ({c})", case()));
        }
        _ => {}
    }
    match built {
        Err(e) if e.to_string().contains("(panic)") => Err(format!("{}: a panic was caught at the C ABI: {e}", case())),
        _ => Ok(()),
    }
}
