use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;

#[test]
fn reference_pmf_matches_published_statistics() {
    let p = reference_multiplier_pmf();
    assert_eq!(p.lengths.len(), 999);
    assert!((p.probs.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    // Digest §4: mean length 87.63; multiplier std 1.16, median 0.62, max 11.4.
    assert!((p.mean_length - 87.63).abs() < 0.01, "{}", p.mean_length);
    let var: f64 = (0..999).map(|i| p.probs[i] * (p.multiplier(i) - 1.0).powi(2)).sum();
    assert!((var.sqrt() - 1.16).abs() < 0.005, "{}", var.sqrt());
    let mut c = 0.0;
    let median = (0..999)
        .find(|&i| {
            c += p.probs[i];
            c >= 0.5
        })
        .map(|i| p.multiplier(i))
        .unwrap_or(f64::NAN);
    assert!((median - 0.62).abs() < 0.01, "{median}");
    assert!((p.multiplier(998) - 11.4).abs() < 0.05);
    // The closed-form std of the reference factor agrees with the direct sum.
    assert!((Noise::Reference { delay_factor: 2.0 }.std() - var.sqrt()).abs() < 1e-12);
}

#[test]
fn alias_sampler_reproduces_weights() {
    let w = [1.0, 0.0, 3.0, 6.0];
    let s = DiscreteSampler::new(&w).expect("valid weights");
    let mut r = StdRng::seed_from_u64(3);
    let mut counts = [0u32; 4];
    let n = 100_000;
    for _ in 0..n {
        counts[s.sample(&mut r)] += 1;
    }
    for (c, w) in counts.iter().zip(w) {
        let p = f64::from(*c) / f64::from(n);
        // binomial se <= 0.0016: 5 sigma.
        assert!((p - w / 10.0).abs() < 0.008, "{counts:?}");
    }
    assert!(DiscreteSampler::new(&[]).is_err());
    assert!(DiscreteSampler::new(&[0.0, 0.0]).is_err());
    assert!(DiscreteSampler::new(&[1.0, -1.0]).is_err());
}

#[test]
fn sample_moments_match_the_closed_forms() {
    let models = [
        Noise::None,
        Noise::Reference { delay_factor: 1.0 },
        Noise::lognormal_mean_one(0.5),
        Noise::LogNormal { mu: 0.3, sigma: 0.2 },
        Noise::Normal { cv: 0.2 },
        Noise::Exponential { mean: 0.5 },
        Noise::SeqLen { samples: 4 },
    ];
    for m in models {
        let s = m.sampler().expect("valid model");
        let mut r = StdRng::seed_from_u64(11);
        let n = 400_000;
        let xs: Vec<f64> = (0..n).map(|_| s.sample(&mut r)).collect();
        assert!(xs.iter().all(|x| x.is_finite() && *x > 0.0), "{m:?}");
        let mean = xs.iter().sum::<f64>() / f64::from(n);
        let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / f64::from(n)).sqrt();
        // Factor cv <= ~2.5: se of the mean <= 0.4 %; the std estimate is looser (heavy tails).
        assert!((mean - m.mean()).abs() <= 0.02 * m.mean(), "{m:?}: mean {mean} vs {}", m.mean());
        assert!((std - m.std()).abs() <= 0.05 * m.std().max(1e-9), "{m:?}: std {std} vs {}", m.std());
    }
}

#[test]
fn reference_factor_is_one_plus_half_delay_factor_times_the_multiplier() {
    let p = reference_multiplier_pmf();
    let s = Noise::Reference { delay_factor: 2.0 }.sampler().unwrap();
    let mut r = StdRng::seed_from_u64(5);
    for _ in 0..1000 {
        let f = s.sample(&mut r);
        // f = 1 + mult with delay factor 2; mult = k / E[k] for an integer k in 1..=999.
        let k = (f - 1.0) * p.mean_length;
        assert!((k - k.round()).abs() < 1e-9 && (1.0..=999.0).contains(&k.round()), "{f}");
    }
}

#[test]
fn command_line_forms_parse_to_the_documented_models() {
    let cases = [
        ("none", Noise::None),
        ("reference", Noise::Reference { delay_factor: 1.0 }),
        ("Reference:2.5", Noise::Reference { delay_factor: 2.5 }),
        ("reference:0", Noise::Reference { delay_factor: 0.0 }),
        ("lognormal:0.5", Noise::LogNormal { mu: -0.125, sigma: 0.5 }),
        ("normal:0.2", Noise::Normal { cv: 0.2 }),
        ("exponential:0.25", Noise::Exponential { mean: 0.25 }),
        ("seqlen:16", Noise::SeqLen { samples: 16 }),
    ];
    for (s, want) in cases {
        assert_eq!(s.parse::<Noise>(), Ok(want.clone()), "{s}");
        assert_eq!(want.to_string().parse::<Noise>(), Ok(want), "{s} round trip");
    }
    for bad in [
        "",
        "gauss",
        "lognormal",
        "lognormal:0",
        "lognormal:5",
        "normal:-1",
        "exponential:0",
        "exponential:nan",
        "reference:101",
        "seqlen:0",
        "seqlen:1.5",
        "none:1",
    ] {
        let e = bad.parse::<Noise>().unwrap_err();
        assert_eq!(e.spec, bad);
        assert!(e.why.contains("expected"), "{e}");
    }
}

#[test]
fn invalid_models_have_no_sampler() {
    for m in [
        Noise::Reference { delay_factor: -1.0 },
        Noise::LogNormal { mu: f64::NAN, sigma: 1.0 },
        Noise::Normal { cv: f64::INFINITY },
        Noise::Exponential { mean: 0.0 },
        Noise::SeqLen { samples: 0 },
    ] {
        assert!(!m.is_valid(), "{m:?}");
        assert!(m.sampler().is_err(), "{m:?}");
    }
}

proptest! {
    #[test]
    fn display_parses_back(df in 0.0f64..=100.0, sigma in 1e-6f64..=4.0, cv in 0.0f64..=10.0,
                           mean in 1e-6f64..=100.0, samples in 1u32..=4096) {
        for m in [
            Noise::Reference { delay_factor: df },
            Noise::lognormal_mean_one(sigma),
            Noise::Normal { cv },
            Noise::Exponential { mean },
            Noise::SeqLen { samples },
        ] {
            prop_assert_eq!(m.to_string().parse::<Noise>(), Ok(m.clone()));
        }
    }
}

#[test]
fn sample_skewness_matches_the_closed_forms() {
    let models = [
        Noise::None,
        Noise::Reference { delay_factor: 1.0 },
        Noise::LogNormal { mu: 0.3, sigma: 0.2 },
        Noise::Normal { cv: 0.1 },
        Noise::Exponential { mean: 0.5 },
        Noise::SeqLen { samples: 16 },
    ];
    for m in models {
        let s = m.sampler().expect("valid model");
        let mut r = StdRng::seed_from_u64(5);
        let n = 400_000;
        let xs: Vec<f64> = (0..n).map(|_| s.sample(&mut r)).collect();
        let mean = xs.iter().sum::<f64>() / f64::from(n);
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / f64::from(n);
        let m3 = xs.iter().map(|x| (x - mean).powi(3)).sum::<f64>() / f64::from(n);
        let skew = if var > 0.0 { m3 / var.powf(1.5) } else { 0.0 };
        assert!((skew - m.skewness()).abs() <= 0.03 + 0.1 * m.skewness().abs(), "{m:?}: {skew} vs {}", m.skewness());
    }
    // Closed forms: exponential 2; log-normal σ = 1: (e + 2)·√(e - 1) = 6.1849.
    assert_eq!(Noise::Exponential { mean: 3.0 }.skewness(), 2.0);
    assert!((Noise::lognormal_mean_one(1.0).skewness() - 6.184_877).abs() < 1e-5);
    assert!(Noise::lognormal_mean_one(4.0).skewness() > 1e10);
}
