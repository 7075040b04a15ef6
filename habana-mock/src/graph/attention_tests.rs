//! The attention block of a pre-LN transformer encoder layer (issue 26) as a mock graph, built
//! from records and compiled and run in-process: its output against an f64 reference, its
//! modelled cost at several sequence lengths (the quadratic part of attention), and the host
//! cost of the interpreter (an ignored measurement, no timing assert).
//!
//! The block, FCD-first sizes, N = L·B tokens, D = H·Dh:
//! `xn = layer_norm_fwd(x [D, L, B], beta, gamma)`; `q|k|v = gemm(reshape(xn) [D, N], W
//! [D, D], transpose_b)` (PyTorch `Linear` weights); each `transpose(reshape(·) [Dh, H, L, B],
//! {0, 2, 1, 3})` to `[Dh, L, H, B]`; `s = batch_gemm(q, k, transpose_b)` `[L, L, H, B]`;
//! `mult_fwd(s, scale [1])`; `add_fwd(·, mask [L, 1, 1, B])` (0 on tokens, −1e9 on padding);
//! `softmax_fwd(·, dim 0)`; `ctx = batch_gemm(p, v)` `[Dh, L, H, B]`; transpose and reshape
//! back to `[D, N]`; `gemm(ctx, Wo, transpose_b)`; `y = add_fwd(x, reshape(·) [D, L, B])`.

use habana_sys::{synDataType, synDeviceType, synTensorType};

use super::guid::Guid;
use super::program::{self, Program};
use super::records::{GraphRec, NodeRec, SectionRec, TensorRec};

const F: synDataType = synDataType::SINGLE;

/// A graph built from records: persistent tensors get a section each.
struct Builder {
    g: GraphRec,
}

impl Builder {
    fn new() -> Self {
        Self {
            g: GraphRec {
                device_type: synDeviceType::GAUDI2,
                sections: Vec::new(),
                tensors: Vec::new(),
                nodes: Vec::new(),
                compiled: false,
            },
        }
    }

    fn tensor(&mut self, name: &str, sizes: &[u64], persistent: bool) -> usize {
        let section = persistent.then(|| {
            self.g.sections.push(SectionRec {
                handle: 0,
                persistent: true,
                konst: false,
                rmw: false,
                group: 0,
                locked: true,
            });
            (self.g.sections.len() - 1, 0)
        });
        self.g.tensors.push(TensorRec {
            handle: 0,
            name: name.to_string(),
            ty: synTensorType::DATA_TENSOR,
            section,
            sizes: Some(sizes.to_vec()),
            min_sizes: None,
            dtype: F,
            locked: true,
            external: false,
        });
        self.g.tensors.len() - 1
    }

    fn node(&mut self, guid: &str, ins: &[usize], outs: &[usize], params: &[u8]) {
        self.g.nodes.push(NodeRec {
            name: format!("{guid}_{}", self.g.nodes.len()),
            guid_name: guid.to_string(),
            guid: Guid::parse(guid).expect("a mock GUID"),
            inputs: ins.iter().map(|&i| Some(i)).collect(),
            outputs: outs.to_vec(),
            params: params.to_vec(),
            after: Vec::new(),
        });
    }

    /// A workspace tensor produced by one node from `ins`.
    fn op(&mut self, guid: &str, ins: &[usize], sizes: &[u64], params: &[u8]) -> usize {
        let o = self.tensor(&format!("t{}", self.g.tensors.len()), sizes, false);
        self.node(guid, ins, &[o], params);
        o
    }
}

/// Model dimensions.
#[derive(Clone, Copy)]
struct Dims {
    d: u64,
    h: u64,
    l: u64,
    b: u64,
}

/// `synTransposeParams` swapping dimensions 1 and 2 of a rank-4 tensor.
fn swap12() -> Vec<u8> {
    let mut p = Vec::new();
    for v in [0u32, 2, 1, 3, 4, 4] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

/// The attention block's graph; persistent tensors in the order x, beta, gamma, wq, wk, wv,
/// wo, mask, scale, y.
fn attention_graph(m: Dims) -> GraphRec {
    let Dims { d, h, l, b } = m;
    let (dh, n) = (d / h, l * b);
    let mut g = Builder::new();
    let x = g.tensor("x", &[d, l, b], true);
    let beta = g.tensor("beta", &[d], true);
    let gamma = g.tensor("gamma", &[d], true);
    let w: Vec<usize> = ["wq", "wk", "wv", "wo"].iter().map(|w| g.tensor(w, &[d, d], true)).collect();
    let mask = g.tensor("mask", &[l, 1, 1, b], true);
    let scale = g.tensor("scale", &[1], true);
    let y = g.tensor("y", &[d, l, b], true);
    let (mean, istd) = (g.tensor("mean", &[1, l, b], false), g.tensor("istd", &[1, l, b], false));
    let xn = g.tensor("xn", &[d, l, b], false);
    let mut ln_params = vec![1u8, 0, 0, 0];
    ln_params.extend_from_slice(&1e-5f32.to_le_bytes());
    g.node("layer_norm_fwd_f32", &[x, beta, gamma], &[xn, mean, istd], &ln_params);
    let xn2 = g.op("reshape", &[xn], &[d, n], &[]);
    let tb = [0u8, 1];
    let heads: Vec<usize> = (0..3)
        .map(|k| {
            let p = g.op("gemm", &[xn2, w[k]], &[d, n], &tb);
            let p4 = g.op("reshape", &[p], &[dh, h, l, b], &[]);
            g.op("transpose", &[p4], &[dh, l, h, b], &swap12())
        })
        .collect();
    let s = g.op("batch_gemm", &[heads[0], heads[1]], &[l, l, h, b], &tb);
    let s2 = g.op("mult_fwd_f32", &[s, scale], &[l, l, h, b], &[]);
    let s3 = g.op("add_fwd_f32", &[s2, mask], &[l, l, h, b], &[]);
    let p = g.op("softmax_fwd_f32", &[s3], &[l, l, h, b], &0u32.to_le_bytes());
    let ctx = g.op("batch_gemm", &[p, heads[2]], &[dh, l, h, b], &[0, 0]);
    let ct = g.op("transpose", &[ctx], &[dh, h, l, b], &swap12());
    let c2 = g.op("reshape", &[ct], &[d, n], &[]);
    let o2 = g.op("gemm", &[c2, w[3]], &[d, n], &tb);
    let o = g.op("reshape", &[o2], &[d, l, b], &[]);
    g.node("add_fwd_f32", &[x, o], &[y], &[]);
    g.g
}

fn vals(n: u64, seed: u32, amp: f32) -> Vec<f32> {
    super::cpu::transformer_tests::scaled_vals(n as usize, seed, amp)
}

/// Host buffers for a program's persistent tensors (in launch order) and its workspace.
struct Buffers {
    persistent: Vec<Vec<f32>>,
    workspace: Vec<u64>,
}

impl Buffers {
    fn run(&mut self, p: &Program) {
        let mut regions: Vec<*mut u8> = self.persistent.iter_mut().map(|b| b.as_mut_ptr().cast::<u8>()).collect();
        regions.push(self.workspace.as_mut_ptr().cast::<u8>());
        // SAFETY: each persistent tensor is alone in its section at offset 0, so region k holds
        // exactly its elements; the workspace buffer holds workspace_bytes (rounded up to 8);
        // all are distinct live allocations used by this thread only.
        unsafe { p.execute(&regions) }.expect("the block runs");
    }
}

/// The block's inputs for `m`: sample b has `lens[b]` tokens, the rest padding.
fn inputs(m: Dims, lens: &[u64]) -> Vec<Vec<f32>> {
    let Dims { d, h, l, b } = m;
    let mut mask = vec![0f32; (l * b) as usize];
    for (bi, &len) in lens.iter().enumerate() {
        for k in len..l {
            mask[bi * l as usize + k as usize] = -1e9;
        }
    }
    vec![
        vals(d * l * b, 1, 1.0),
        vals(d, 2, 0.5),
        vals(d, 3, 1.0).iter().map(|v| v + 1.0).collect(),
        vals(d * d, 4, 0.3),
        vals(d * d, 5, 0.3),
        vals(d * d, 6, 0.3),
        vals(d * d, 7, 0.3),
        mask,
        vec![1.0 / ((d / h) as f32).sqrt()],
        vec![0.0; (d * l * b) as usize],
    ]
}

/// The block in f64 from the same inputs (row-major PyTorch terms: x[b][l][i]).
fn reference(m: Dims, inp: &[Vec<f32>]) -> Vec<f64> {
    let Dims { d, h, l, b } = m;
    let (d, h, l, b) = (d as usize, h as usize, l as usize, b as usize);
    let dh = d / h;
    let f = |v: &Vec<f32>| v.iter().map(|&a| f64::from(a)).collect::<Vec<f64>>();
    let (x, beta, gamma) = (f(&inp[0]), f(&inp[1]), f(&inp[2]));
    let w: Vec<Vec<f64>> = (3..7).map(|k| f(&inp[k])).collect();
    let (mask, scale) = (f(&inp[7]), f64::from(inp[8][0]));
    let lin =
        |w: &[f64], v: &[f64]| -> Vec<f64> { (0..d).map(|j| (0..d).map(|i| w[j * d + i] * v[i]).sum()).collect() };
    let mut y = vec![0f64; d * l * b];
    for bi in 0..b {
        let tok = |t: usize| &x[(bi * l + t) * d..(bi * l + t + 1) * d];
        let xn: Vec<Vec<f64>> = (0..l)
            .map(|t| {
                let r = tok(t);
                let mu = r.iter().sum::<f64>() / d as f64;
                let var = r.iter().map(|a| (a - mu).powi(2)).sum::<f64>() / d as f64;
                r.iter().enumerate().map(|(i, a)| (a - mu) / (var + 1e-5).sqrt() * gamma[i] + beta[i]).collect()
            })
            .collect();
        let proj = |k: usize| -> Vec<Vec<f64>> { xn.iter().map(|v| lin(&w[k], v)).collect() };
        let (q, k, v) = (proj(0), proj(1), proj(2));
        for t in 0..l {
            let mut ctx = vec![0f64; d];
            for hh in 0..h {
                let sc: Vec<f64> = (0..l)
                    .map(|u| {
                        (0..dh).map(|e| q[t][hh * dh + e] * k[u][hh * dh + e]).sum::<f64>() * scale + mask[bi * l + u]
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|s| (s - mx).exp()).sum();
                for u in 0..l {
                    let p = (sc[u] - mx).exp() / z;
                    for e in 0..dh {
                        ctx[hh * dh + e] += p * v[u][hh * dh + e];
                    }
                }
            }
            let o = lin(&w[3], &ctx);
            for i in 0..d {
                y[(bi * l + t) * d + i] = tok(t)[i] + o[i];
            }
        }
    }
    y
}

fn compiled(m: Dims) -> Program {
    program::compile(&attention_graph(m), "attention").expect("the block compiles")
}

fn buffers(p: &Program, inp: Vec<Vec<f32>>) -> Buffers {
    assert_eq!(p.persistent.len(), inp.len());
    Buffers { persistent: inp, workspace: vec![0u64; (p.workspace_bytes as usize).div_ceil(8)] }
}

#[test]
fn the_masked_attention_block_matches_an_f64_reference() {
    let m = Dims { d: 16, h: 2, l: 6, b: 3 };
    let lens = [6, 4, 1];
    let p = compiled(m);
    let mut buf = buffers(&p, inputs(m, &lens));
    let want = reference(m, &buf.persistent);
    buf.run(&p);
    let got = &buf.persistent[9];
    let err = got.iter().zip(&want).map(|(&g, w)| (f64::from(g) - w).abs()).fold(0.0, f64::max);
    assert!(err < 1e-4, "max |y - y64| = {err}");
    // The mask matters: with every token visible, sample 1's output differs.
    let mut all = buffers(&p, inputs(m, &[6, 6, 6]));
    all.run(&p);
    let (d, l) = (m.d as usize, m.l as usize);
    let s1 = l * d..2 * l * d;
    assert!(all.persistent[9][s1.clone()].iter().zip(&got[s1]).any(|(a, b)| (a - b).abs() > 1e-3));
    // Padding positions of sample 2 do not leak into its one real token.
    let mut other = inputs(m, &lens);
    for t in 1..l {
        for i in 0..d {
            other[0][(2 * l + t) * d + i] = 5.0;
        }
    }
    let mut o = buffers(&p, other);
    o.run(&p);
    assert_eq!(o.persistent[9][2 * l * d..2 * l * d + d], got[2 * l * d..2 * l * d + d]);
}

#[test]
fn attention_cost_is_quadratic_in_the_sequence_length_as_the_flop_byte_model_says() {
    let (d, h, b, l) = (64u64, 4u64, 8u64, 32u64);
    let at = |l: u64| compiled(Dims { d, h, l, b });
    let (p1, p2, p3) = (at(l), at(2 * l), at(3 * l));
    // Every node's flops by hand, N = L·B: layer norm 8·D·N, four projections 2·D²·N each,
    // the residual add D·N; scores 2·L²·B·D (2·L·L·H·B·Dh), scale and mask L²·H·B each,
    // softmax 5·L²·H·B, context 2·L²·B·D; reshapes and transposes none.
    let flops = |l: u64| l * b * (8 * d + 8 * d * d + d) + l * l * b * (4 * d + 7 * h);
    for (p, l) in [(&p1, l), (&p2, 2 * l), (&p3, 3 * l)] {
        assert_eq!(p.work.1, flops(l), "flops at L = {l}");
    }
    // The second difference f(3L) - 2 f(2L) + f(L) cancels constant and linear terms and
    // leaves 2·c·L², c the coefficient of L².
    let second = |f: &dyn Fn(&Program) -> f64| f(&p3) - 2.0 * f(&p2) + f(&p1);
    let c_flops = (b * (4 * d + 7 * h)) as f64;
    assert_eq!(second(&|p: &Program| p.work.1 as f64), 2.0 * c_flops * (l * l) as f64);
    // Bytes: the L×L score tensor (4 bytes an element, H·B of them) is written by the scores
    // GEMM, read and written by scale, mask and softmax, and read by the context GEMM: 8 times.
    let c_bytes = (8 * 4 * h * b) as f64;
    assert_eq!(second(&|p: &Program| p.work.0 as f64), 2.0 * c_bytes * (l * l) as f64);
    // Modelled device time at the default rates: the same quadratic term (the per-node
    // overhead is the same at every length), up to the rounding to whole ns.
    let cfg = crate::config::MockConfig::default();
    let ns = |p: &Program| p.cost_ns(cfg.graph_hbm_gbps, cfg.graph_gflops, cfg.graph_node_overhead_ns) as f64;
    let c_ns = c_bytes / cfg.graph_hbm_gbps + c_flops / cfg.graph_gflops;
    let want = 2.0 * c_ns * (l * l) as f64;
    assert!((second(&ns) - want).abs() <= 2.0, "{} vs {want}", second(&ns));
    // The quadratic part's share of the device time grows with the length.
    let share = |p: &Program, l: u64| c_ns * (l * l) as f64 / ns(p);
    assert!(share(&p2, 2 * l) > share(&p1, l) && share(&p3, 3 * l) > share(&p2, 2 * l));
}

#[test]
fn masked_mean_pooling_and_its_backward_are_batch_gemms_with_a_weight_row() {
    // pooled [D, 1, B] = batch_gemm(w [L, 1, B], h [D, L, B]), w = 1/len on tokens and 0 on
    // padding; dh [D, L, B] = batch_gemm(w, dpooled [D, 1, B], transpose_a) (= wᵀ · dpooled).
    let (d, l, b) = (5u64, 4u64, 3u64);
    let lens = [4u64, 2, 1];
    let mut g = Builder::new();
    let w = g.tensor("w", &[l, 1, b], true);
    let hid = g.tensor("h", &[d, l, b], true);
    let dp = g.tensor("dpooled", &[d, 1, b], true);
    let pooled = g.tensor("pooled", &[d, 1, b], true);
    let dh = g.tensor("dh", &[d, l, b], true);
    g.node("batch_gemm", &[w, hid], &[pooled], &[0, 0]);
    g.node("batch_gemm", &[w, dp], &[dh], &[1, 0]);
    let p = program::compile(&g.g, "pool").expect("compiles");
    let mut wv = vec![0f32; (l * b) as usize];
    for (bi, &n) in lens.iter().enumerate() {
        for t in 0..n {
            wv[bi * l as usize + t as usize] = 1.0 / n as f32;
        }
    }
    let hv = vals(d * l * b, 21, 1.0);
    let dpv = vals(d * b, 22, 1.0);
    let mut buf =
        buffers(&p, vec![wv, hv.clone(), dpv.clone(), vec![0.0; (d * b) as usize], vec![0.0; (d * l * b) as usize]]);
    buf.run(&p);
    let (d, l) = (d as usize, l as usize);
    for (bi, &n) in lens.iter().enumerate() {
        for i in 0..d {
            let want: f64 = (0..n as usize).map(|t| f64::from(hv[(bi * l + t) * d + i])).sum::<f64>() / n as f64;
            assert!((f64::from(buf.persistent[3][bi * d + i]) - want).abs() < 1e-6, "pooled b{bi} i{i}");
            for t in 0..l {
                let want = if (t as u64) < n { f64::from(dpv[bi * d + i]) / n as f64 } else { 0.0 };
                assert!((f64::from(buf.persistent[4][(bi * l + t) * d + i]) - want).abs() < 1e-6, "dh b{bi} t{t} i{i}");
            }
        }
    }
}

/// Host cost of the interpreter for one micro-batch of the attention block (run with
/// `cargo test --release -p habana-mock --lib attention -- --ignored --nocapture`); prints, no
/// assert on time.
#[test]
#[ignore = "a measurement: run in release with --nocapture"]
fn measure_interpreter_host_cost_per_node_and_per_micro_batch() {
    for m in [Dims { d: 64, h: 4, l: 32, b: 8 }, Dims { d: 64, h: 4, l: 128, b: 8 }, Dims { d: 4, h: 1, l: 2, b: 1 }] {
        let p = compiled(m);
        let lens = vec![m.l; m.b as usize];
        let mut buf = buffers(&p, inputs(m, &lens));
        buf.run(&p);
        let reps = 50;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            buf.run(&p);
        }
        let per = t.elapsed().as_secs_f64() / f64::from(reps);
        println!(
            "D={} H={} L={} B={}: {} nodes, {:.1} us per micro-batch, {:.2} us per node; work {} bytes, {} flops",
            m.d,
            m.h,
            m.l,
            m.b,
            p.nodes.len(),
            per * 1e6,
            per * 1e6 / p.nodes.len() as f64,
            p.work.0,
            p.work.1
        );
    }
}
