//! Tests of `habana_mock::kernels` (the C kernels of the CPU mock device) against `half` and
//! against Rust / f64 references, on every instruction-set variant the running CPU supports.
//!
//! Owns: numerical correctness tests of the kernels. Must not: time anything (timing lives in
//! `dropcompute::bench::kernels`).

use habana_mock::kernels::{self, Isa, KernelError, Kernels};
use half::bf16;
use proptest::collection::vec;
use proptest::prelude::*;

/// Lengths around the 4-, 8-, 16- and 32-lane vector widths and a long odd one (vector tails).
const LENS: [usize; 13] = [0, 1, 2, 7, 8, 15, 16, 17, 31, 33, 64, 65, 1031];

/// Kernel sets for every ISA the running CPU supports (always includes the generic one).
fn all_kernels() -> Vec<Kernels> {
    let ks: Vec<Kernels> = kernels::supported_isas().into_iter().filter_map(Kernels::for_isa).collect();
    assert_eq!(ks[0].isa(), Isa::Generic);
    ks
}

/// Equal bits, or both NaN (the CPU picks the payload of a NaN produced by arithmetic).
fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn same_bf16(a: bf16, b: bf16) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Bits of `f`, with every NaN mapped to one marker (itself a NaN pattern, so no collision).
fn canon_f32(f: f32) -> u32 {
    if f.is_nan() { u32::MAX } else { f.to_bits() }
}

/// [`canon_f32`] for bf16.
fn canon_bf16(f: bf16) -> u16 {
    if f.is_nan() { u16::MAX } else { f.to_bits() }
}

/// Spacing of bf16 values in the binade of `v` (8 significant bits, min exponent -126).
fn ulp_bf16(v: f64) -> f64 {
    let e = if v == 0.0 { -126 } else { (v.abs().log2().floor() as i32).max(-126) };
    2f64.powi(e - 7)
}

/// Low halves of an f32 that probe bf16 rounding: exact, around and at the tie, extremes.
const LOWS: [u32; 9] = [0x0000, 0x0001, 0x4000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFE, 0xFFFF];

/// f32 bit patterns: half uniformly random, half a random high half with a [`LOWS`] low half
/// (uniform bits alone hit an exact tie once in 65536 draws).
fn rounding_probe_bits() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        (any::<u16>(), prop::sample::select(LOWS.to_vec())).prop_map(|(hi, lo)| (u32::from(hi) << 16) | lo),
    ]
}

/// Any f32 bit pattern: NaNs, infinities, subnormals, zeros of both signs.
fn any_f32() -> impl Strategy<Value = f32> + Clone {
    any::<u32>().prop_map(f32::from_bits)
}

/// Finite values of ordinary magnitude, for the f64 reference bounds.
fn moderate_f32() -> impl Strategy<Value = f32> + Clone {
    prop_oneof![-1.0e4f32..1.0e4, -1.0f32..1.0, Just(0.0f32), Just(-0.0f32)]
}

/// (acc, x, a) with acc and x of one length from [`LENS`].
fn operands<S: Strategy<Value = f32> + Clone>(elem: S) -> impl Strategy<Value = (Vec<f32>, Vec<f32>, f32)> {
    prop::sample::select(LENS.to_vec())
        .prop_flat_map(move |n| (vec(elem.clone(), n), vec(elem.clone(), n), elem.clone()))
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&f| bf16::from_f32(f)).collect()
}

/// Runs the three f32 kernels with `k`: returns (scale(x, a), accumulate(acc, x),
/// scale_accumulate(acc, x, a)).
fn run_f32(k: Kernels, acc: &[f32], x: &[f32], a: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut scaled = x.to_vec();
    k.scale_f32(&mut scaled, a);
    let mut summed = acc.to_vec();
    k.accumulate_f32(&mut summed, x).unwrap();
    let mut fused = acc.to_vec();
    k.scale_accumulate_f32(&mut fused, x, a).unwrap();
    (scaled, summed, fused)
}

/// [`run_f32`] for the bf16 kernels.
fn run_bf16(k: Kernels, acc: &[bf16], x: &[bf16], a: f32) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
    let mut scaled = x.to_vec();
    k.scale_bf16(&mut scaled, a);
    let mut summed = acc.to_vec();
    k.accumulate_bf16(&mut summed, x).unwrap();
    let mut fused = acc.to_vec();
    k.scale_accumulate_bf16(&mut fused, x, a).unwrap();
    (scaled, summed, fused)
}

/// Runs the bf16-into-f32 kernels: returns (accumulate(acc, x), scale_accumulate(acc, x, a)).
fn run_bf16_to_f32(k: Kernels, acc: &[f32], x: &[bf16], a: f32) -> (Vec<f32>, Vec<f32>) {
    let mut summed = acc.to_vec();
    k.accumulate_bf16_to_f32(&mut summed, x).unwrap();
    let mut fused = acc.to_vec();
    k.scale_accumulate_bf16_to_f32(&mut fused, x, a).unwrap();
    (summed, fused)
}

proptest! {
    #[test]
    fn f32_to_bf16_matches_half_bit_for_bit(bits in vec(rounding_probe_bits(), 0..300)) {
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        for k in all_kernels() {
            let mut dst = vec![bf16::from_bits(0xDEAD); src.len()];
            k.f32_to_bf16(&mut dst, &src).unwrap();
            for (s, d) in src.iter().zip(&dst) {
                prop_assert_eq!(d.to_bits(), bf16::from_f32(*s).to_bits(),
                    "isa {} input {:#010x}", k.isa(), s.to_bits());
            }
        }
    }

    #[test]
    fn f32_kernels_equal_rust_f32_arithmetic((acc, x, a) in operands(any_f32())) {
        for k in all_kernels() {
            let (scaled, summed, fused) = run_f32(k, &acc, &x, a);
            for i in 0..x.len() {
                prop_assert!(same_f32(scaled[i], x[i] * a), "scale isa {} i {}", k.isa(), i);
                prop_assert!(same_f32(summed[i], acc[i] + x[i]), "acc isa {} i {}", k.isa(), i);
                prop_assert!(same_f32(fused[i], acc[i] + a * x[i]), "saxpy isa {} i {}", k.isa(), i);
            }
        }
    }

    #[test]
    fn f32_kernels_within_rounding_of_f64((acc, x, a) in operands(moderate_f32())) {
        let eps = f64::from(f32::EPSILON); // 2^-23 = 2 units of f32 rounding error
        for k in all_kernels() {
            let (scaled, summed, fused) = run_f32(k, &acc, &x, a);
            for i in 0..x.len() {
                let (c, v, s) = (f64::from(acc[i]), f64::from(x[i]), f64::from(a));
                prop_assert!((f64::from(scaled[i]) - v * s).abs() <= eps * (v * s).abs());
                prop_assert!((f64::from(summed[i]) - (c + v)).abs() <= eps * (c + v).abs());
                let bound = eps * (c.abs() + 2.0 * (s * v).abs());
                prop_assert!((f64::from(fused[i]) - (c + s * v)).abs() <= bound,
                    "isa {} i {}: {} vs {}", k.isa(), i, fused[i], c + s * v);
            }
        }
    }

    #[test]
    fn bf16_kernels_equal_half_of_rust_f32((acc, x, a) in operands(any_f32())) {
        let (acc, x) = (to_bf16(&acc), to_bf16(&x));
        for k in all_kernels() {
            let (scaled, summed, fused) = run_bf16(k, &acc, &x, a);
            for i in 0..x.len() {
                let (c, v) = (acc[i].to_f32(), x[i].to_f32());
                prop_assert!(same_bf16(scaled[i], bf16::from_f32(v * a)));
                prop_assert!(same_bf16(summed[i], bf16::from_f32(v + c)));
                prop_assert!(same_bf16(fused[i], bf16::from_f32(a * v + c)),
                    "isa {} i {}: {:#06x}", k.isa(), i, fused[i].to_bits());
            }
        }
    }

    #[test]
    fn bf16_kernels_within_one_bf16_ulp_of_f64((acc, x, a) in operands(moderate_f32())) {
        let (acc, x) = (to_bf16(&acc), to_bf16(&x));
        let eps = f64::from(f32::EPSILON);
        for k in all_kernels() {
            let (scaled, summed, fused) = run_bf16(k, &acc, &x, a);
            for i in 0..x.len() {
                let (c, v, s) = (acc[i].to_f64(), x[i].to_f64(), f64::from(a));
                let checks = [
                    (scaled[i], v * s, (v * s).abs()),
                    (summed[i], c + v, c.abs() + v.abs()),
                    (fused[i], c + s * v, c.abs() + (s * v).abs()),
                ];
                for (got, reference, magnitude) in checks {
                    // 1 bf16 ulp for the final rounding, plus the f32 intermediate roundings,
                    // which cancellation can make large relative to the result.
                    let bound = ulp_bf16(reference) + eps * magnitude;
                    prop_assert!((got.to_f64() - reference).abs() <= bound,
                        "isa {} i {}: {} vs {}", k.isa(), i, got, reference);
                }
            }
        }
    }

    #[test]
    fn bf16_into_f32_kernels_exact_and_near_f64((acc, x, a) in operands(any_f32())) {
        let x = to_bf16(&x);
        for k in all_kernels() {
            let (summed, fused) = run_bf16_to_f32(k, &acc, &x, a);
            for i in 0..x.len() {
                prop_assert!(same_f32(summed[i], acc[i] + x[i].to_f32()));
                prop_assert!(same_f32(fused[i], acc[i] + a * x[i].to_f32()));
                let (c, v, s) = (f64::from(acc[i]), x[i].to_f64(), f64::from(a));
                let reference = c + s * v;
                // Only where no f32 intermediate can overflow (the f64 reference never does).
                let limit = f64::from(f32::MAX) / 2.0;
                if c.abs() < limit && (s * v).abs() < limit {
                    let bound = f64::from(f32::EPSILON) * (c.abs() + 2.0 * (s * v).abs())
                        + f64::from(f32::from_bits(1)); // subnormal results: 1 f32 ulp
                    prop_assert!((f64::from(fused[i]) - reference).abs() <= bound);
                }
            }
        }
    }

    /// Bits are identical across variants for every non-NaN result. When both operands of an
    /// addition or product are NaN, IEEE leaves the propagated payload open and the compiler
    /// may order operands differently in vector and scalar code, so NaNs compare as "NaN".
    #[test]
    fn every_isa_gives_identical_bits((acc, x, a) in operands(any_f32())) {
        let (acc_h, x_h) = (to_bf16(&acc), to_bf16(&x));
        let ks = all_kernels();
        let f32_bits = |v: (Vec<f32>, Vec<f32>, Vec<f32>)| -> Vec<u32> {
            [v.0, v.1, v.2].concat().iter().map(|f| canon_f32(*f)).collect()
        };
        let bf16_bits = |v: (Vec<bf16>, Vec<bf16>, Vec<bf16>)| -> Vec<u16> {
            [v.0, v.1, v.2].concat().iter().map(|f| canon_bf16(*f)).collect()
        };
        let mixed_bits = |v: (Vec<f32>, Vec<f32>)| -> Vec<u32> {
            [v.0, v.1].concat().iter().map(|f| canon_f32(*f)).collect()
        };
        let base = ks[0];
        for k in &ks[1..] {
            prop_assert_eq!(f32_bits(run_f32(*k, &acc, &x, a)), f32_bits(run_f32(base, &acc, &x, a)));
            prop_assert_eq!(bf16_bits(run_bf16(*k, &acc_h, &x_h, a)),
                bf16_bits(run_bf16(base, &acc_h, &x_h, a)));
            prop_assert_eq!(mixed_bits(run_bf16_to_f32(*k, &acc, &x_h, a)),
                mixed_bits(run_bf16_to_f32(base, &acc, &x_h, a)));
        }
    }
}

/// Every high half with the [`LOWS`] low halves that probe rounding: exact, just above/below
/// and exactly at the tie, and the extremes. Covers ±0, subnormals, ties to even, overflow of the largest
/// finite values to ±inf, ±inf and signalling and quiet NaNs with all payload shapes.
#[test]
fn f32_to_bf16_edge_sweep_matches_half() {
    const LOWS: [u32; 9] = [0x0000, 0x0001, 0x4000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFE, 0xFFFF];
    let src: Vec<f32> =
        (0u32..=0xFFFF).flat_map(|hi| LOWS.iter().map(move |&lo| f32::from_bits((hi << 16) | lo))).collect();
    // Spot checks written from the bf16 format itself, independent of `half`.
    let spot = [
        (0x3F80_8000u32, 0x3F80u16), // tie, even kept bit: stays
        (0x3F81_8000, 0x3F82),       // tie, odd kept bit: rounds up to even
        (0x3F80_8001, 0x3F81),       // above tie: up
        (0x7F7F_8000, 0x7F80),       // tie at the largest finite: overflows to +inf
        (0xFF7F_FFFF, 0xFF80),       // -> -inf
        (0x7F80_0001, 0x7FC0),       // signalling NaN with low payload: quiet bit set
        (0x0000_8001, 0x0001),       // subnormal rounds up to the smallest bf16 subnormal
    ];
    for k in all_kernels() {
        let mut dst = vec![bf16::ZERO; src.len()];
        k.f32_to_bf16(&mut dst, &src).unwrap();
        for (s, d) in src.iter().zip(&dst) {
            assert_eq!(d.to_bits(), bf16::from_f32(*s).to_bits(), "isa {} {:#010x}", k.isa(), s.to_bits());
        }
        let (inputs, expected): (Vec<f32>, Vec<u16>) = spot.iter().map(|&(i, o)| (f32::from_bits(i), o)).unzip();
        let mut out = vec![bf16::ZERO; inputs.len()];
        k.f32_to_bf16(&mut out, &inputs).unwrap();
        let got: Vec<u16> = out.iter().map(|b| b.to_bits()).collect();
        assert_eq!(got, expected, "isa {}", k.isa());
    }
}

#[test]
fn bf16_to_f32_exhaustive_matches_half() {
    let src: Vec<bf16> = (0u16..=0xFFFF).map(bf16::from_bits).collect();
    for k in all_kernels() {
        let mut dst = vec![0.0f32; src.len()];
        k.bf16_to_f32(&mut dst, &src).unwrap();
        for (s, d) in src.iter().zip(&dst) {
            assert_eq!(d.to_bits(), s.to_f32().to_bits(), "isa {} {:#06x}", k.isa(), s.to_bits());
        }
    }
}

#[test]
fn length_mismatch_is_typed_and_writes_nothing() {
    let mut acc = vec![1.0f32; 5];
    let x = vec![2.0f32; 4];
    let err = kernels::scale_accumulate_f32(&mut acc, &x, 3.0).unwrap_err();
    assert_eq!(err, KernelError::LengthMismatch { kernel: "scale_accumulate_f32", output_len: 5, input_len: 4 });
    let msg = err.to_string();
    assert!(msg.contains("scale_accumulate_f32") && msg.contains('5') && msg.contains('4'), "{msg}");
    assert_eq!(acc, vec![1.0f32; 5]);

    let mut acc_h = vec![bf16::ONE; 3];
    let x_h = vec![bf16::ONE; 7];
    assert!(matches!(
        kernels::accumulate_bf16(&mut acc_h, &x_h),
        Err(KernelError::LengthMismatch { output_len: 3, input_len: 7, .. })
    ));
    assert_eq!(acc_h, vec![bf16::ONE; 3]);
    assert!(kernels::scale_accumulate_bf16_to_f32(&mut acc, &x_h, 1.0).is_err());
    assert!(kernels::f32_to_bf16(&mut acc_h, &x).is_err());
    assert!(kernels::bf16_to_f32(&mut acc, &x_h).is_err());
    assert_eq!(acc, vec![1.0f32; 5]);
}

#[test]
fn best_is_the_widest_supported_isa_and_free_functions_use_it() {
    let supported = kernels::supported_isas();
    assert_eq!(Some(&Kernels::best().isa()), supported.iter().max());
    // The x86-64 baseline always has the generic set; AVX2 implies the CPU flag.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(supported.contains(&Isa::Avx2), std::arch::is_x86_feature_detected!("avx2"));

    // Free functions: in-place scale of a long odd buffer, then a scaled accumulation.
    let mut x: Vec<f32> = (0..1031).map(|i| i as f32 * 0.5 - 100.0).collect();
    kernels::scale_f32(&mut x, -2.0);
    let mut acc = vec![1.0f32; x.len()];
    kernels::scale_accumulate_f32(&mut acc, &x, 0.25).unwrap();
    for (i, v) in acc.iter().enumerate() {
        let expected = 1.0 + 0.25 * (-2.0 * (i as f64 * 0.5 - 100.0));
        assert_eq!(f64::from(*v), expected, "i {i}"); // all values exact in f32
    }
    let mut h = to_bf16(&[1.5, -3.0, 0.0, 1.0e30]);
    kernels::scale_bf16(&mut h, 2.0);
    assert_eq!(h, to_bf16(&[3.0, -6.0, 0.0, 2.0e30]));
}
