//! Tests of `train::mlp`: an independent f64 reference (plain loops), finite differences,
//! padding, SGD, and a short training run on the embedded digits.

// The f64 reference is written as plain index loops on purpose (readable next to the formulas).
#![allow(clippy::needless_range_loop)]

use proptest::prelude::*;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_distr::{Distribution, Uniform};

use super::*;
use crate::data::Dataset;

/// f64 reference of loss_sum and summed gradient, straight from the formulas in the module docs.
fn reference(shape: MlpShape, p: &[f32], x: &[f32], labels: &[i32]) -> (f64, Vec<f64>) {
    let MlpShape { input: ni, hidden: nh, classes: nc } = shape;
    let p: Vec<f64> = p.iter().map(|&v| f64::from(v)).collect();
    let (w1, b1, w2, b2) = (&p[shape.w1()], &p[shape.b1()], &p[shape.w2()], &p[shape.b2()]);
    let mut g = vec![0.0f64; p.len()];
    let mut loss = 0.0;
    for (r, &l) in labels.iter().enumerate() {
        if l < 0 {
            continue;
        }
        let xr: Vec<f64> = x[r * ni..(r + 1) * ni].iter().map(|&v| f64::from(v)).collect();
        let pre: Vec<f64> = (0..nh).map(|j| b1[j] + (0..ni).map(|i| xr[i] * w1[i * nh + j]).sum::<f64>()).collect();
        let h: Vec<f64> = pre.iter().map(|&v| v.max(0.0)).collect();
        let z: Vec<f64> = (0..nc).map(|c| b2[c] + (0..nh).map(|j| h[j] * w2[j * nc + c]).sum::<f64>()).collect();
        let zmax = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = z.iter().map(|v| (v - zmax).exp()).sum();
        loss += zmax + sum.ln() - z[l as usize];
        let dz: Vec<f64> =
            (0..nc).map(|c| (z[c] - zmax).exp() / sum - if c == l as usize { 1.0 } else { 0.0 }).collect();
        for j in 0..nh {
            let mut dh = 0.0;
            for c in 0..nc {
                g[shape.w2().start + j * nc + c] += h[j] * dz[c];
                dh += dz[c] * w2[j * nc + c];
            }
            let dpre = if pre[j] > 0.0 { dh } else { 0.0 };
            g[shape.b1().start + j] += dpre;
            for i in 0..ni {
                g[i * nh + j] += xr[i] * dpre;
            }
        }
        for c in 0..nc {
            g[shape.b2().start + c] += dz[c];
        }
    }
    (loss, g)
}

/// Random parameters (biases non-zero too) and a micro-batch with labels drawn from `labels`.
fn case(shape: MlpShape, b: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<i32>) {
    let mut rng = StableRng::seed_from_u64(seed);
    let u = Uniform::new(-1.0f32, 1.0).unwrap();
    let p: Vec<f32> = (0..shape.param_len()).map(|_| u.sample(&mut rng)).collect();
    let x: Vec<f32> = (0..b * shape.input).map(|_| u.sample(&mut rng)).collect();
    let y: Vec<i32> = (0..b).map(|r| (r as i32 * 7 + seed as i32) % shape.classes as i32).collect();
    (p, x, y)
}

fn assert_close(got: &[f32], want: &[f64], rel: f64) {
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(*g) - w).abs() <= rel * (w.abs() + scale + 1e-12), "element {i}: {g} vs {w}");
    }
}

const SHAPE: MlpShape = MlpShape { input: 7, hidden: 5, classes: 4 };

#[test]
fn layout_offsets() {
    let s = MlpShape { input: 3, hidden: 2, classes: 4 };
    assert_eq!((s.w1(), s.b1(), s.w2(), s.b2()), (0..6, 6..8, 8..16, 16..20));
    assert_eq!(s.param_len(), 20);
    assert!(MlpShape { input: 3, hidden: 2, classes: 1 }.validate().is_err());
    assert!(MlpShape { input: usize::MAX, hidden: usize::MAX, classes: 2 }.validate().is_err());
}

#[test]
fn matches_f64_reference() {
    let (p, x, mut y) = case(SHAPE, 9, 3);
    y[4] = -1;
    let mut g = vec![f32::NAN; SHAPE.param_len()];
    let (loss, valid) = forward_backward(SHAPE, &p, &x, &y, &mut g, &mut MlpScratch::default()).unwrap();
    let (rl, rg) = reference(SHAPE, &p, &x, &y);
    assert_eq!(valid, 8);
    assert!((loss - rl).abs() <= 1e-4 * rl.abs(), "{loss} vs {rl}");
    assert_close(&g, &rg, 1e-4);
}

#[test]
fn reference_gradient_matches_finite_differences() {
    let (p, x, y) = case(SHAPE, 5, 11);
    let (_, g) = reference(SHAPE, &p, &x, &y);
    // Central differences in f64 on the reference loss (parameters perturbed in f64).
    let loss_at = |k: usize, d: f64| {
        let mut q: Vec<f64> = p.iter().map(|&v| f64::from(v)).collect();
        q[k] += d;
        reference_f64(SHAPE, &q, &x, &y)
    };
    for k in 0..SHAPE.param_len() {
        let fd = (loss_at(k, 1e-6) - loss_at(k, -1e-6)) / 2e-6;
        assert!((fd - g[k]).abs() <= 1e-5 * (1.0 + g[k].abs()), "param {k}: fd {fd} vs {}", g[k]);
    }
    // And the f32 implementation's loss, on the smooth output biases (no ReLU kink), coarsely.
    let f32_loss = |c: usize, d: f32| {
        let mut q = p.clone();
        q[SHAPE.b2().start + c] += d;
        let mut g = vec![0.0; q.len()];
        forward_backward(SHAPE, &q, &x, &y, &mut g, &mut MlpScratch::default()).unwrap().0
    };
    for c in 0..SHAPE.classes {
        let fd = (f32_loss(c, 1e-2) - f32_loss(c, -1e-2)) / 2e-2;
        let want = g[SHAPE.b2().start + c];
        assert!((fd - want).abs() <= 1e-2 * (1.0 + want.abs()), "b2[{c}]: {fd} vs {want}");
    }
}

/// The reference loss with f64 parameters (for finite differences below f32 resolution).
fn reference_f64(shape: MlpShape, p: &[f64], x: &[f32], labels: &[i32]) -> f64 {
    let MlpShape { input: ni, hidden: nh, classes: nc } = shape;
    let (w1, b1, w2, b2) = (&p[shape.w1()], &p[shape.b1()], &p[shape.w2()], &p[shape.b2()]);
    let mut loss = 0.0;
    for (r, &l) in labels.iter().enumerate().filter(|(_, l)| **l >= 0) {
        let h: Vec<f64> = (0..nh)
            .map(|j| (b1[j] + (0..ni).map(|i| f64::from(x[r * ni + i]) * w1[i * nh + j]).sum::<f64>()).max(0.0))
            .collect();
        let z: Vec<f64> = (0..nc).map(|c| b2[c] + (0..nh).map(|j| h[j] * w2[j * nc + c]).sum::<f64>()).collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        loss += m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - z[l as usize];
    }
    loss
}

#[test]
fn padding_rows_contribute_nothing() {
    let (p, x, y) = case(SHAPE, 4, 5);
    let mut s = MlpScratch::default();
    let mut plain = vec![0.0; SHAPE.param_len()];
    let r_plain = forward_backward(SHAPE, &p, &x, &y, &mut plain, &mut s).unwrap();
    // Interleave padding rows full of NaN: ignored bit for bit.
    let (mut xp, mut yp) = (Vec::new(), Vec::new());
    for r in 0..4 {
        xp.extend(std::iter::repeat_n(f32::NAN, SHAPE.input));
        yp.push(-1);
        xp.extend_from_slice(&x[r * SHAPE.input..(r + 1) * SHAPE.input]);
        yp.push(y[r]);
    }
    let mut padded = vec![0.0; SHAPE.param_len()];
    let r_padded = forward_backward(SHAPE, &p, &xp, &yp, &mut padded, &mut s).unwrap();
    assert_eq!(r_padded.1, 4);
    assert_eq!(r_padded.0.to_bits(), r_plain.0.to_bits());
    assert_eq!(
        padded.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // All padding: zero gradient, zero loss.
    let mut g = vec![1.0; SHAPE.param_len()];
    assert_eq!(forward_backward(SHAPE, &p, &xp[..SHAPE.input], &[-1], &mut g, &mut s).unwrap(), (0.0, 0));
    assert!(g.iter().all(|&v| v == 0.0));
}

#[test]
fn bad_inputs_are_refused_without_writing() {
    let (p, x, y) = case(SHAPE, 3, 1);
    let mut s = MlpScratch::default();
    let mut g = vec![7.0f32; SHAPE.param_len()];
    let mut call = |p: &[f32], x: &[f32], y: &[i32], g: &mut [f32]| forward_backward(SHAPE, p, x, y, g, &mut s);
    assert_eq!(call(&p, &x, &[0, 4, 1], &mut g), Err(MlpError::Label { row: 1, label: 4, classes: 4 }));
    assert!(matches!(call(&p, &x, &[0, -2, 1], &mut g), Err(MlpError::Label { label: -2, .. })));
    assert!(matches!(call(&p, &x[1..], &y, &mut g), Err(MlpError::Length { what: "x", .. })));
    assert!(matches!(call(&p[1..], &x, &y, &mut g), Err(MlpError::Length { what: "params", .. })));
    assert!(matches!(call(&p, &x, &y, &mut g[1..]), Err(MlpError::Length { what: "grad", .. })));
    assert!(g.iter().all(|&v| v == 7.0));
    let bad = MlpShape { input: 0, hidden: 1, classes: 2 };
    assert_eq!(init_params(bad, 0), Err(MlpError::Shape(bad)));
}

#[test]
fn scratch_reuse_is_bitwise_deterministic() {
    let (p, x, y) = case(SHAPE, 6, 9);
    let (p2, x2, y2) = case(SHAPE, 13, 2);
    let mut fresh = vec![0.0; SHAPE.param_len()];
    let a = forward_backward(SHAPE, &p, &x, &y, &mut fresh, &mut MlpScratch::default()).unwrap();
    let mut s = MlpScratch::default();
    let mut g = vec![0.0; SHAPE.param_len()];
    forward_backward(SHAPE, &p2, &x2, &y2, &mut g, &mut s).unwrap();
    let b = forward_backward(SHAPE, &p, &x, &y, &mut g, &mut s).unwrap();
    assert_eq!(a.0.to_bits(), b.0.to_bits());
    assert!(fresh.iter().zip(&g).all(|(u, v)| u.to_bits() == v.to_bits()));
}

#[test]
fn sgd_momentum_matches_f64_formula() {
    let (mut p, _, _) = case(SHAPE, 0, 4);
    let (g, _, _) = case(SHAPE, 0, 8);
    let mut v = vec![0.0f32; p.len()];
    let (mut pr, mut vr): (Vec<f64>, Vec<f64>) = (p.iter().map(|&a| f64::from(a)).collect(), vec![0.0; p.len()]);
    let (lr, mu, wd) = (0.05f32, 0.9f32, 1e-3f32);
    for _ in 0..3 {
        sgd_momentum(&mut p, &mut v, &g, lr, mu, wd).unwrap();
        for i in 0..pr.len() {
            vr[i] = f64::from(mu) * vr[i] + (f64::from(g[i]) + f64::from(wd) * pr[i]);
            pr[i] -= f64::from(lr) * vr[i];
        }
    }
    assert_close(&p, &pr, 1e-6);
    assert_close(&v, &vr, 1e-6);
    assert!(matches!(
        sgd_momentum(&mut p, &mut v[1..], &g, lr, mu, wd),
        Err(MlpError::Length { what: "velocity", .. })
    ));
    assert!(matches!(sgd_momentum(&mut p, &mut v, &g[1..], lr, mu, wd), Err(MlpError::Length { what: "grad", .. })));
}

#[test]
fn he_init_is_seeded_with_zero_biases_and_right_spread() {
    let shape = MlpShape { input: 64, hidden: 128, classes: 10 };
    let p = init_params(shape, 42).unwrap();
    assert_eq!(p, init_params(shape, 42).unwrap());
    assert_ne!(p, init_params(shape, 43).unwrap());
    assert!(p[shape.b1()].iter().chain(&p[shape.b2()]).all(|&b| b == 0.0));
    for (r, fan_in) in [(shape.w1(), 64.0f64), (shape.w2(), 128.0)] {
        let w = &p[r];
        let var = w.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / w.len() as f64;
        let want = 2.0 / fan_in;
        assert!((var - want).abs() < 0.1 * want, "variance {var} vs {want}");
    }
}

#[test]
fn evaluate_agrees_with_predict_and_forward_backward() {
    let data = Dataset::embedded_digits().unwrap();
    let shape = MlpShape { input: 64, hidden: 16, classes: 10 };
    let p = init_params(shape, 1).unwrap();
    let (mean_loss, acc) = evaluate(shape, &p, &data).unwrap();
    let pred = predict(shape, &p, &data.features, &mut MlpScratch::default()).unwrap();
    let correct = pred.iter().zip(&data.labels).filter(|(a, b)| a == b).count();
    assert_eq!(acc, correct as f64 / data.len() as f64);
    let y: Vec<i32> = data.labels.iter().map(|&l| l as i32).collect();
    let mut g = vec![0.0; shape.param_len()];
    let (sum, n) = forward_backward(shape, &p, &data.features, &y, &mut g, &mut MlpScratch::default()).unwrap();
    assert!((mean_loss - sum / n as f64).abs() < 1e-5 * mean_loss);
    let wrong = MlpShape { input: 63, ..shape };
    assert!(matches!(evaluate(wrong, &init_params(wrong, 1).unwrap(), &data), Err(MlpError::Dataset { .. })));
}

/// Mini-batch SGD on the host (the computation the train job distributes): >= 90% held out.
#[test]
fn host_training_on_digits_generalises() {
    let data = Dataset::embedded_digits().unwrap();
    let (train, holdout) = data.split(0.2, 1).unwrap();
    let shape = MlpShape { input: 64, hidden: 64, classes: 10 };
    let mut p = init_params(shape, 7).unwrap();
    let mut v = vec![0.0; p.len()];
    let mut g = vec![0.0; p.len()];
    let mut s = MlpScratch::default();
    let (loss0, _) = evaluate(shape, &p, &holdout).unwrap();
    let mut rng = StableRng::seed_from_u64(3);
    let mut ids: Vec<u64> = (0..train.len() as u64).collect();
    for _epoch in 0..5 {
        ids.shuffle(&mut rng);
        for batch in ids.chunks(32) {
            let (x, y) = train.rows_padded(batch, 32).unwrap();
            let (_, n) = forward_backward(shape, &p, &x, &y, &mut g, &mut s).unwrap();
            g.iter_mut().for_each(|v| *v /= n as f32);
            sgd_momentum(&mut p, &mut v, &g, 0.05, 0.9, 1e-4).unwrap();
        }
    }
    let (loss, acc) = evaluate(shape, &p, &holdout).unwrap();
    eprintln!("host training: holdout loss {loss0:.3} -> {loss:.3}, accuracy {acc:.4}");
    assert!(acc >= 0.9, "holdout accuracy {acc}");
    assert!(loss < 0.5 * loss0, "loss {loss0} -> {loss}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any small shape and micro-batch (padding anywhere) agrees with the f64 reference.
    #[test]
    fn random_shapes_match_reference(
        input in 1usize..6, hidden in 1usize..6, classes in 2usize..5, b in 0usize..6, seed in 0u64..1000,
        pad_mask in 0u32..64,
    ) {
        let shape = MlpShape { input, hidden, classes };
        let (p, x, mut y) = case(shape, b, seed);
        for (r, l) in y.iter_mut().enumerate() {
            if pad_mask >> r & 1 == 1 {
                *l = -1;
            }
        }
        let mut g = vec![0.0; shape.param_len()];
        let (loss, n) = forward_backward(shape, &p, &x, &y, &mut g, &mut MlpScratch::default()).unwrap();
        let (rl, rg) = reference(shape, &p, &x, &y);
        prop_assert_eq!(n, y.iter().filter(|&&l| l >= 0).count());
        prop_assert!((loss - rl).abs() <= 1e-4 * (1.0 + rl.abs()));
        let scale = rg.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (a, w) in g.iter().zip(&rg) {
            prop_assert!((f64::from(*a) - w).abs() <= 1e-4 * (w.abs() + scale + 1e-12));
        }
    }
}
