//! The text job's transformer as device graphs (`train::transformer_graphs`) on the in-process
//! mock: the whole model's gradient and loss against an f64 reference written out here from the
//! model's definition (`train::transformer` module docs) by central finite differences, on
//! the tiny config with two buckets; AdamW against an f64 host update; one-rank training whose
//! held-out loss falls; and (ignored) the interpreter's host cost per micro-batch per bucket.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use rand::{Rng, SeedableRng};

use dropcompute::mock::{MockConfig, MockControl, TimeMode, api};
use dropcompute::sim::rng::StableRng;
use dropcompute::synapse::graph::{RecipeCache, RecipeOrigin};
use dropcompute::synapse::{Device, DeviceBuffer, HostBuffer, Runtime, Stream};
use dropcompute_train::text::{BatchShape, BucketPlan, Buckets, CLS, Corpus, PAD, TextBatch, VOCAB};
use dropcompute_train::transformer::{AdamW, LmInputs, TransformerConfig, init_params, stage_lm};
use dropcompute_train::transformer_graphs::{LN_EPS, MASKED, forward_backward_recipe_name};
use dropcompute_train::transformer_train::{TextModel, TextTrainConfig, train_steps};

/// The in-process mock is one per test process: tests take turns, each configures it first
/// (virtual time: no sleeping for the emulated latency). The configuration is given in full,
/// so the calling shell's mock variables do not reach it.
fn mock() -> (MutexGuard<'static, ()>, &'static Arc<Runtime>) {
    static L: Mutex<()> = Mutex::new(());
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    let g = L.lock().unwrap_or_else(PoisonError::into_inner);
    MockControl::in_process().configure(&MockConfig { time_mode: TimeMode::Virtual, ..MockConfig::default() }).unwrap();
    (g, RT.get_or_init(|| Runtime::new(api()).unwrap()))
}

fn upload(s: &Stream, d: &mut DeviceBuffer<f32>, v: &[f32]) {
    s.copy_h2d(&HostBuffer::from_slice(s.device(), v).unwrap(), d).unwrap();
    s.synchronize().unwrap();
}

/// A micro-batch of `rows.len()` rows of `len` tokens: row r holds CLS and `rows[r] - 1`
/// random bytes (0: a padding row).
fn batch(len: u32, rows: &[u32], seed: u64) -> LmInputs {
    let mut rng = StableRng::seed_from_u64(seed);
    let l = len as usize;
    let mut tokens = vec![PAD; rows.len() * l];
    for (r, &n) in rows.iter().enumerate() {
        for i in 0..n as usize {
            tokens[r * l + i] = if i == 0 { CLS } else { rng.random_range(32..127) };
        }
    }
    let real: u64 = rows.iter().map(|&n| u64::from(n)).sum();
    let shape = BatchShape {
        bucket: 0,
        len,
        rows: rows.len() as u32,
        samples: rows.iter().filter(|&&n| n > 0).count() as u32,
        tokens: real,
    };
    let b = TextBatch { shape, tokens, labels: rows.iter().map(|&n| if n > 0 { 0 } else { -1 }).collect() };
    let s = stage_lm(&b);
    assert_eq!(s.tokens_counted(), real);
    s
}

// ---------------------------------------------------------------------------------------------
// The f64 reference: the model of `train::transformer`'s module docs, written out per row.

struct Ref<'a> {
    cfg: TransformerConfig,
    p: &'a [f64],
    at: std::collections::HashMap<String, usize>,
}

impl<'a> Ref<'a> {
    fn new(cfg: TransformerConfig, p: &'a [f64]) -> Self {
        Self { cfg, p, at: cfg.blocks().into_iter().map(|b| (b.name, b.offset)).collect() }
    }

    fn blk(&self, name: &str) -> &'a [f64] {
        &self.p[self.at[name]..]
    }

    /// x [L][in] · W [in, out] (+ b).
    fn linear(&self, x: &[Vec<f64>], w: &str, b: Option<&str>, out: usize) -> Vec<Vec<f64>> {
        let w = self.blk(w);
        x.iter()
            .map(|r| {
                (0..out)
                    .map(|j| {
                        b.map_or(0.0, |b| self.blk(b)[j])
                            + r.iter().enumerate().map(|(i, v)| v * w[i * out + j]).sum::<f64>()
                    })
                    .collect()
            })
            .collect()
    }

    fn layer_norm(&self, x: &[Vec<f64>], beta: &str, gamma: &str) -> Vec<Vec<f64>> {
        let (be, ga) = (self.blk(beta), self.blk(gamma));
        x.iter()
            .map(|r| {
                let n = r.len() as f64;
                let m = r.iter().sum::<f64>() / n;
                let var = r.iter().map(|v| (v - m).powi(2)).sum::<f64>() / n;
                let istd = 1.0 / (var + f64::from(LN_EPS)).sqrt();
                r.iter().enumerate().map(|(i, v)| (v - m) * istd * ga[i] + be[i]).collect()
            })
            .collect()
    }

    /// The summed loss of one micro-batch.
    fn loss(&self, inp: &LmInputs) -> f64 {
        let c = self.cfg;
        let (l, d, nh, dh, ff, v) =
            (inp.len as usize, c.d_model as usize, c.heads as usize, c.head_dim() as usize, c.d_ff as usize, VOCAB);
        let mut total = 0.0;
        for r in 0..inp.rows as usize {
            let tok = &inp.tokens[r * l..(r + 1) * l];
            let (te, pe) = (self.blk("tok_emb"), self.blk("pos_emb"));
            let mut x: Vec<Vec<f64>> =
                (0..l).map(|i| (0..d).map(|k| te[tok[i] as usize * d + k] + pe[i * d + k]).collect()).collect();
            for k in 0..c.layers {
                let nm = |s: &str| format!("l{k}_{s}");
                let h = self.layer_norm(&x, &nm("ln1_beta"), &nm("ln1_gamma"));
                let (q, kk, vv) = (
                    self.linear(&h, &nm("wq"), None, d),
                    self.linear(&h, &nm("wk"), None, d),
                    self.linear(&h, &nm("wv"), None, d),
                );
                let mut ctx = vec![vec![0.0; d]; l];
                for hd in 0..nh {
                    let f = hd * dh..(hd + 1) * dh;
                    for i in 0..l {
                        let s: Vec<f64> = (0..l)
                            .map(|j| {
                                let dot: f64 = f.clone().map(|e| q[i][e] * kk[j][e]).sum();
                                dot / (dh as f64).sqrt() + if j > i { f64::from(MASKED) } else { 0.0 }
                            })
                            .collect();
                        let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = s.iter().map(|v| (v - mx).exp()).sum();
                        for j in 0..l {
                            let pj = (s[j] - mx).exp() / z;
                            for e in f.clone() {
                                ctx[i][e] += pj * vv[j][e];
                            }
                        }
                    }
                }
                let o = self.linear(&ctx, &nm("wo"), None, d);
                let x1: Vec<Vec<f64>> =
                    x.iter().zip(&o).map(|(a, b)| a.iter().zip(b).map(|(a, b)| a + b).collect()).collect();
                let h2 = self.layer_norm(&x1, &nm("ln2_beta"), &nm("ln2_gamma"));
                let u = self.linear(&h2, &nm("w1"), Some(&nm("b1")), ff);
                let a: Vec<Vec<f64>> = u
                    .iter()
                    .map(|r| {
                        r.iter().map(|&t| 0.5 * t * (1.0 + libm::erf(t * std::f64::consts::FRAC_1_SQRT_2))).collect()
                    })
                    .collect();
                let m = self.linear(&a, &nm("w2"), Some(&nm("b2")), d);
                x = x1.iter().zip(&m).map(|(a, b)| a.iter().zip(b).map(|(a, b)| a + b).collect()).collect();
            }
            let hf = self.layer_norm(&x, "lnf_beta", "lnf_gamma");
            let z = self.linear(&hf, "head_w", Some("head_b"), v);
            for i in 0..l {
                let w = f64::from(inp.mask[r * l + i]);
                if w == 0.0 {
                    continue;
                }
                let mx = z[i].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = mx + z[i].iter().map(|t| (t - mx).exp()).sum::<f64>().ln();
                total += w * (lse - z[i][inp.labels[r * l + i] as usize]);
            }
        }
        total
    }
}

/// Coordinates checked by finite differences: up to 24 per block (seeded), plus every
/// coordinate of the token-embedding rows the batches use.
fn coordinates(cfg: &TransformerConfig, batches: &[LmInputs]) -> Vec<usize> {
    let mut rng = StableRng::seed_from_u64(9);
    let mut out = Vec::new();
    for b in cfg.blocks() {
        for _ in 0..24.min(b.len()) {
            out.push(b.offset + rng.random_range(0..b.len()));
        }
    }
    let d = cfg.d_model as usize;
    let mut used: Vec<i32> = batches.iter().flat_map(|b| b.tokens.iter().copied()).filter(|&t| t != PAD).collect();
    used.sort_unstable();
    used.dedup();
    for &t in used.iter().take(6) {
        out.extend(t as usize * d..(t as usize + 1) * d);
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[test]
fn whole_model_gradient_and_loss_match_an_f64_finite_difference_reference_in_two_buckets() {
    let (_g, rt) = mock();
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let cfg = TransformerConfig::TINY;
    let lens = [8u32, 16];
    // Weights larger than the init (std 0.02) so that every path carries a visible gradient.
    let mut params = init_params(&cfg, 5);
    let mut rng = StableRng::seed_from_u64(6);
    for p in &mut params {
        *p = *p * 15.0 + if *p == 1.0 { rng.random_range(-0.3..0.3) } else { 0.0 };
    }
    let mut model = TextModel::new(&s, &cfg, &lens, 3, AdamW::default(), &params, None).unwrap();
    assert_eq!(model.graphs().forward_backward_recipe(1).unwrap().name(), forward_backward_recipe_name(&cfg, 16, 3));
    // Bucket 8: a full row (its last target is PAD), a short row, a padding row. Bucket 16: a
    // full row, a half row, a 2-token row.
    let batches = [batch(8, &[8, 5, 0], 1), batch(16, &[16, 9, 2], 2)];
    let p64: Vec<f64> = params.iter().map(|&v| f64::from(v)).collect();
    let coords = coordinates(&cfg, &batches);
    let d = cfg.d_model as usize;
    let pos = cfg.blocks().into_iter().find(|b| b.name == "pos_emb").unwrap();
    for inp in &batches {
        // The gradient buffer starts as NaN: the recipe must write every element.
        let mut grad = DeviceBuffer::alloc(&dev, params.len()).unwrap();
        upload(&s, &mut grad, &vec![f32::NAN; params.len()]);
        model.grad = grad;
        model.take_loss(&s).unwrap();
        model.forward_backward(&s, inp).unwrap();
        let g = model.grad(&s).unwrap();
        let (loss, tokens) = model.take_loss(&s).unwrap();
        assert_eq!(tokens, inp.tokens_counted());
        let want = Ref::new(cfg, &p64).loss(inp);
        assert!((loss - want).abs() <= 1e-5 * want.abs(), "bucket {}: loss {loss} vs f64 {want}", inp.len);
        assert!(g.iter().all(|v| v.is_finite()), "bucket {}: an element left unwritten", inp.len);
        // Position rows at and beyond the bucket's length get exactly zero.
        assert!(g[pos.offset + inp.len as usize * d..pos.range().end].iter().all(|&v| v == 0.0));
        let gmax = g.iter().fold(0f32, |m, v| m.max(v.abs()));
        let h = 1e-5;
        let mut worst = (0.0, 0usize);
        for &k in &coords {
            let mut pp = p64.clone();
            pp[k] += h;
            let up = Ref::new(cfg, &pp).loss(inp);
            pp[k] -= 2.0 * h;
            let down = Ref::new(cfg, &pp).loss(inp);
            let fd = (up - down) / (2.0 * h);
            let err = (f64::from(g[k]) - fd).abs() / (f64::from(gmax) * 1e-3 + fd.abs() * 1e-2);
            if err > worst.0 {
                worst = (err, k);
            }
        }
        let blk = cfg.blocks().into_iter().find(|b| b.range().contains(&worst.1)).unwrap();
        assert!(
            worst.0 <= 1.0,
            "bucket {}: gradient of {}[{}] off by {:.3} tolerances ({} coordinates checked, max |g| {gmax})",
            inp.len,
            blk.name,
            worst.1 - blk.offset,
            worst.0,
            coords.len()
        );
    }
}

#[test]
fn every_recipe_compiles_once_and_a_second_process_loads_it_from_the_recipe_cache() {
    let (_g, rt) = mock();
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let cfg = TransformerConfig::TINY;
    let dir = tempfile::tempdir().unwrap();
    let cache = RecipeCache::new(dir.path());
    let params = init_params(&cfg, 0);
    let origins = |m: &TextModel| {
        let g = m.graphs();
        let mut v: Vec<RecipeOrigin> = (0..2).map(|b| g.forward_backward_recipe(b).unwrap().origin()).collect();
        v.push(g.adamw_recipe().origin());
        v
    };
    let first = TextModel::new(&s, &cfg, &[8, 16], 2, AdamW::default(), &params, Some(&cache)).unwrap();
    assert!(origins(&first).iter().all(|o| matches!(o, RecipeOrigin::Compiled(_))), "{:?}", origins(&first));
    // One file per recipe: two buckets, AdamW, the accumulation.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4);
    let second = TextModel::new(&s, &cfg, &[8, 16], 2, AdamW::default(), &params, Some(&cache)).unwrap();
    assert!(origins(&second).iter().all(|o| matches!(o, RecipeOrigin::Cache(_))), "{:?}", origins(&second));
    // Another row count is another graph: compiled, not confused with the cached ones.
    let third = TextModel::new(&s, &cfg, &[8], 3, AdamW::default(), &params, Some(&cache)).unwrap();
    assert!(matches!(third.graphs().forward_backward_recipe(0).unwrap().origin(), RecipeOrigin::Compiled(_)));
}

#[test]
fn micro_batches_no_graph_takes_are_refused_before_the_launch() {
    let (_g, rt) = mock();
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let cfg = TransformerConfig::TINY;
    let mut model = TextModel::new(&s, &cfg, &[8, 16], 3, AdamW::default(), &init_params(&cfg, 0), None).unwrap();
    // A length that is no bucket's.
    let e = model.forward_backward(&s, &batch(12, &[12, 3, 0], 1)).unwrap_err().to_string();
    assert!(e.contains("12 tokens per row: no bucket"), "{e}");
    // Another row count: refused by the input copy (element counts differ).
    let e = model.forward_backward(&s, &batch(8, &[8, 3], 1)).unwrap_err().to_string();
    assert!(e.contains("stage") && e.contains("element count"), "{e}");
    // Nothing was launched: the loss accumulator is untouched.
    assert_eq!(model.take_loss(&s).unwrap(), (0.0, 0));
    // A model longer than its position table is refused with the field named.
    let long = TextTrainConfig { buckets: vec![8, 32], ..TextTrainConfig::tiny() };
    let e = train_steps(&s, &long, 1).unwrap_err().to_string();
    assert!(e.contains("bucket 32 tokens is longer than the model's max_len 16"), "{e}");
}

#[test]
fn adamw_graph_matches_an_f64_host_update_over_three_steps() {
    let (_g, rt) = mock();
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let cfg = TransformerConfig::TINY;
    let o = AdamW { lr: 0.05, beta1: 0.8, beta2: 0.95, eps: 1e-6, weight_decay: 0.1 };
    let params = init_params(&cfg, 1);
    let model = TextModel::new(&s, &cfg, &[8], 2, o, &params, None).unwrap();
    let n = params.len();
    let mut rng = StableRng::seed_from_u64(3);
    let (mut p, mut m, mut v): (Vec<f64>, Vec<f64>, Vec<f64>) =
        (params.iter().map(|&x| f64::from(x)).collect(), vec![0.0; n], vec![0.0; n]);
    let alloc = |init: &[f32]| {
        let mut d = DeviceBuffer::alloc(&dev, init.len()).unwrap();
        upload(&s, &mut d, init);
        d
    };
    let (dp, dm, dv) = (alloc(&params), alloc(&vec![0.0; n]), alloc(&vec![0.0; n]));
    for t in 1..=3u64 {
        let g: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        let scale = 0.25;
        let sc = o.step_scalars(t, scale);
        let (dg, dsc) = (alloc(&g), alloc(&sc)); // alive until the launch ran
        model.graphs().launch_adamw(&s, &dp, &dm, &dv, &dg, &dsc).unwrap();
        s.synchronize().unwrap();
        let (b1, b2, lr, wd) = (f64::from(o.beta1), f64::from(o.beta2), f64::from(o.lr), f64::from(o.weight_decay));
        for i in 0..n {
            let gi = f64::from(g[i]) * scale;
            m[i] = b1 * m[i] + (1.0 - b1) * gi;
            v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
            let mh = m[i] / (1.0 - b1.powi(t as i32));
            let vh = v[i] / (1.0 - b2.powi(t as i32));
            p[i] = p[i] * (1.0 - lr * wd) - lr * mh / (vh.sqrt() + f64::from(o.eps));
        }
    }
    let mut h = HostBuffer::zeroed(&dev, n).unwrap();
    s.copy_d2h(&dp, &mut h).unwrap();
    let got = h.to_vec().unwrap();
    let worst = got.iter().zip(&p).map(|(&a, b)| (f64::from(a) - b).abs()).fold(0.0, f64::max);
    // Each step moves a parameter by up to lr = 0.05; f32 rounding of 3 steps stays far below.
    assert!(worst < 1e-5, "max |device - f64| = {worst}");
}

#[test]
fn held_out_loss_falls_over_thirty_steps_at_the_tiny_size() {
    let (_g, rt) = mock();
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let log = train_steps(&s, &TextTrainConfig::tiny(), 30).unwrap();
    let h = &log.holdout_loss;
    assert_eq!(h.len(), 31);
    // Byte-level: uniform over 258 ids is ln 258 = 5.55 nats; a model that learnt the byte
    // frequencies of English text is near 3.5 or below.
    assert!((h[0] - (VOCAB as f64).ln()).abs() < 0.1, "initial held-out loss {}", h[0]);
    assert!(h[30] < h[0] - 1.0, "held-out loss {:.3} -> {:.3}", h[0], h[30]);
    assert!(log.train_tokens.iter().all(|&t| t > 0));
    let first: f64 = log.train_loss[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = log.train_loss[25..].iter().sum::<f64>() / 5.0;
    assert!(last < first - 1.0, "training loss {first:.3} -> {last:.3}");
}

/// The default size learns: held-out loss per token before and after 60 one-rank steps of
/// M = 8 (printed; run in release with `--ignored --nocapture`).
#[test]
#[ignore]
fn default_size_learns() {
    let (_g, rt) = mock();
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let t = std::time::Instant::now();
    let log = train_steps(&s, &TextTrainConfig::default(), 60).unwrap();
    let h = &log.holdout_loss;
    println!(
        "default size, 60 steps: held-out loss {:.3} -> {:.3} (step 20 {:.3}, 40 {:.3}) nats/token, {:.1} s",
        h[0],
        h[60],
        h[20],
        h[40],
        t.elapsed().as_secs_f64()
    );
    assert!(h[60] < h[0] - 1.0);
}

/// The mock interpreter's host cost per micro-batch per bucket (launch + synchronize in virtual
/// time: host work only; the fastest of 5 repetitions, the machine being shared) and its mean
/// over the embedded corpus' bucket mix (units per bucket of the plan at these rows), with the
/// 16-rank budget: steps of a baseline and a policy run (2 runs x 16 ranks x M = 8
/// micro-batches a step) that fit in 240 s on 2 cores. A measurement, not a check: run in
/// release with `--ignored --nocapture`, sizes in `HOST_COST_SIZES` as
/// `d,heads,layers,d_ff,rows;...` (module docs of `train::transformer_train`).
#[test]
#[ignore]
fn host_cost() {
    let (_g, rt) = mock();
    let dev = Device::acquire_any(rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let sizes: Vec<(TransformerConfig, u32)> = std::env::var("HOST_COST_SIZES")
        .ok()
        .map(|v| {
            v.split(';')
                .map(|c| {
                    let n: Vec<u32> = c.split(',').map(|x| x.trim().parse().unwrap()).collect();
                    (TransformerConfig { d_model: n[0], heads: n[1], layers: n[2], d_ff: n[3], max_len: 512 }, n[4])
                })
                .collect()
        })
        .unwrap_or_else(|| vec![(TransformerConfig::DEFAULT, TextTrainConfig::default().rows)]);
    let corpus = Corpus::embedded().unwrap();
    let buckets = Buckets::default();
    let lens = buckets.lengths().to_vec();
    for (cfg, rows) in sizes {
        let plan = BucketPlan::new(&corpus, buckets.clone(), rows, 1).unwrap();
        let mut units = vec![0u64; lens.len()];
        for u in 0..plan.units() {
            units[plan.unit(u).unwrap().bucket] += 1;
        }
        let params = init_params(&cfg, 0);
        let t0 = std::time::Instant::now();
        let mut model = TextModel::new(&s, &cfg, &lens, rows, AdamW::default(), &params, None).unwrap();
        let compile = t0.elapsed();
        print!("{} rows {rows} params {} compile {:.0} ms:", cfg.tag(), params.len(), compile.as_secs_f64() * 1e3);
        let mut mean = 0.0;
        for (k, &l) in lens.iter().enumerate() {
            let inp = batch(l, &vec![l; rows as usize], 7);
            model.forward_backward(&s, &inp).unwrap();
            s.synchronize().unwrap();
            let best = (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    model.forward_backward(&s, &inp).unwrap();
                    s.synchronize().unwrap();
                    t.elapsed().as_secs_f64() * 1e3
                })
                .fold(f64::INFINITY, f64::min);
            mean += best * units[k] as f64 / plan.units() as f64;
            print!(" L{l} {best:.1} ms");
        }
        let steps = 240.0 * 2.0 * 1e3 / (2.0 * 16.0 * 8.0 * mean);
        println!(" | mix mean {mean:.1} ms, 16 ranks x M 8, 2 runs: {steps:.0} steps in 240 s on 2 cores");
    }
}
