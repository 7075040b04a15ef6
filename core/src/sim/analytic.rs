//! Analytic model of step time, drop rate and effective speedup for N workers with i.i.d. normal
//! micro-batch latencies.
//!
//! Owns: closed forms and numerical integrals; must not touch sampling or traces.
//!
//! Derivation (`../shared/reference/dropcompute.md` §3.1-3.2; extreme-value theory, e.g. David
//! and Nagaraja, "Order Statistics", 3rd ed., §4.5 and §10.5):
//! - Micro-batch latencies t_{n,m} ~ N(μ, σ²) i.i.d., so S_k = Σ_{m≤k} t_m ~ N(kμ, kσ²) and the
//!   worker compute time T_n = S_M ~ N(Mμ, Mσ²).
//! - E[max_n T_n] = ∫_0^∞ (1 - F(t)^N) dt for T >= 0 (exact order-statistics integral; the normal
//!   puts negligible mass below 0 for σ√M << Mμ), evaluated with Simpson's rule on a grid.
//!   1 - F^N is computed as -expm1(N·ln1p(-(1-F))) to keep the upper tail accurate at large N.
//! - Gaussian approximation: E[max] ≈ Mμ + σ√M·a_N with
//!   a_N = √(2 ln N) - (ln ln N + ln 4π)/(2√(2 ln N)).
//! - With a threshold τ under [`crate::policy::CheckMode::BeforeMicroBatch`] (min one
//!   micro-batch): micro-batch k (1-based) starts iff S_{k-1} < τ, so
//!   E[started] = Σ_{k=1..M} P(S_{k-1} < τ) and d(τ) = 1 - E[started]/M. The compute time
//!   T = S_K (K = micro-batches started) has, for t < τ, P(T <= t) = P(S_M <= t), and for t >= τ,
//!   P(T > t) = Σ_{k=1..M} P(S_{k-1} < τ, S_k > t)
//!   = Σ_k ∫_{-∞}^{τ} φ_{k-1}(x)·(1 - Φ((t - x - μ)/σ)) dx
//!   (the k-th micro-batch is the first to end past t and it started before τ; the events are
//!   disjoint). The oracle model of §3.2 (stop exactly at τ) gives d(τ) = 1 - Σ_k Φ((τ-kμ)/(σ√k))/M.
//! - Effective speedup (§3.2): S_eff = (1 - d)·E[T_step]/E[T_step^τ] - 1, T_step = max_n T_n + T_c.

use super::SimError;
use super::special::{norm_cdf, norm_pdf, norm_sf, simpson};

/// Parameters of the normal model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormalModel {
    /// Mean micro-batch latency μ (ns).
    pub mu_ns: f64,
    /// Standard deviation σ (ns).
    pub sigma_ns: f64,
    /// Micro-batches per step M.
    pub micro_batches: u32,
    /// Per-step overhead T_c (ns): all-reduce, optimizer.
    pub overhead_ns: f64,
}

/// Survival function 1 - F(t) of one worker's compute time on a uniform grid [t0, t1].
#[derive(Clone, Debug)]
pub struct ComputeTimeDistribution {
    t0: f64,
    h: f64,
    sf: Vec<f64>,
}

impl ComputeTimeDistribution {
    /// E[max of n i.i.d. copies] (ns) = t0 + ∫_{t0}^{t1} (1 - F^n) dt (F(t) = 0 below t0 and 1
    /// above t1 by construction of the grid). n = 0 is treated as 1.
    pub fn expected_max(&self, n: u64) -> f64 {
        let n = n.max(1) as f64;
        let k = self.sf.len() - 1;
        let g = |i: usize| -(n * (-self.sf[i]).ln_1p()).exp_m1();
        let mut s = g(0) + g(k);
        for i in 1..k {
            s += if i % 2 == 1 { 4.0 } else { 2.0 } * g(i);
        }
        self.t0 + s * self.h / 3.0
    }
}

/// a_N of the Gaussian approximation (0 for N <= 1). Source: module doc.
pub fn gaussian_a_n(n: u64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let l = 2.0 * (n as f64).ln();
    let r = l.sqrt();
    r - ((n as f64).ln().ln() + (4.0 * std::f64::consts::PI).ln()) / (2.0 * r)
}

const GRID: usize = 1600;
const INNER: usize = 160;

impl NormalModel {
    /// Validate: μ > 0, σ >= 0, M >= 1, T_c >= 0, all finite.
    /// Errors: [`SimError::InvalidParameter`] naming the field.
    pub fn new(mu_ns: f64, sigma_ns: f64, micro_batches: u32, overhead_ns: f64) -> Result<Self, SimError> {
        let chk = |what, v: f64, ok: bool| {
            if v.is_finite() && ok { Ok(()) } else { Err(SimError::InvalidParameter { what, value: v.to_string() }) }
        };
        chk("mu_ns", mu_ns, mu_ns > 0.0)?;
        chk("sigma_ns", sigma_ns, sigma_ns >= 0.0)?;
        chk("micro_batches", f64::from(micro_batches), micro_batches >= 1)?;
        chk("overhead_ns", overhead_ns, overhead_ns >= 0.0)?;
        Ok(Self { mu_ns, sigma_ns, micro_batches, overhead_ns })
    }

    fn m(&self) -> f64 {
        f64::from(self.micro_batches)
    }

    /// Distribution of one worker's compute time without a threshold (T = S_M).
    pub fn baseline_distribution(&self) -> ComputeTimeDistribution {
        let (mean, sd) = (self.m() * self.mu_ns, self.sigma_ns.max(1e-9) * self.m().sqrt());
        let (t0, t1) = ((mean - 12.0 * sd).max(0.0), mean + 12.0 * sd);
        let h = (t1 - t0) / GRID as f64;
        let sf = (0..=GRID).map(|i| norm_sf((t0 + h * i as f64 - mean) / sd)).collect();
        ComputeTimeDistribution { t0, h, sf }
    }

    /// P(S_{k-1} < τ, S_k > t) for k >= 1 (S_0 = 0).
    fn p_cross(&self, k: u32, tau: f64, t: f64) -> f64 {
        let s = self.sigma_ns.max(1e-9);
        if k == 1 {
            return if tau > 0.0 { norm_sf((t - self.mu_ns) / s) } else { 0.0 };
        }
        let km = f64::from(k - 1);
        let (mean, sd) = (km * self.mu_ns, s * km.sqrt());
        let lo = mean - 10.0 * sd;
        if tau <= lo {
            return 0.0;
        }
        let hi = tau.min(mean + 10.0 * sd);
        simpson(|x| norm_pdf((x - mean) / sd) / sd * norm_sf((t - x - self.mu_ns) / s), lo, hi, INNER)
    }

    /// Distribution of one worker's compute time under threshold `tau_ns` with the
    /// BeforeMicroBatch check and at least one micro-batch (see module doc).
    pub fn threshold_distribution(&self, tau_ns: f64) -> ComputeTimeDistribution {
        let (mean, sd) = (self.m() * self.mu_ns, self.sigma_ns.max(1e-9) * self.m().sqrt());
        let s = self.sigma_ns.max(1e-9);
        let t0 = 0.0_f64.max((self.mu_ns - 12.0 * s).min(mean - 12.0 * sd));
        let t1 = (mean + 12.0 * sd).min(tau_ns.max(0.0) + self.mu_ns + 12.0 * s).max(t0 + 1.0);
        let h = (t1 - t0) / GRID as f64;
        let sf = (0..=GRID)
            .map(|i| {
                let t = t0 + h * i as f64;
                if t < tau_ns {
                    norm_sf((t - mean) / sd)
                } else {
                    (1..=self.micro_batches).map(|k| self.p_cross(k, tau_ns, t)).sum::<f64>().min(1.0)
                }
            })
            .collect();
        ComputeTimeDistribution { t0, h, sf }
    }

    /// E[T_step] without a threshold for `n` workers (ns), exact integral.
    pub fn expected_step_time(&self, n: u64) -> f64 {
        self.baseline_distribution().expected_max(n) + self.overhead_ns
    }

    /// E[T_step] by the Gaussian approximation Mμ + σ√M·a_N + T_c (ns).
    pub fn expected_step_time_gaussian(&self, n: u64) -> f64 {
        self.m() * self.mu_ns + self.sigma_ns * self.m().sqrt() * gaussian_a_n(n) + self.overhead_ns
    }

    /// E[T_step^τ] for `n` workers under the BeforeMicroBatch policy (ns).
    pub fn expected_step_time_threshold(&self, n: u64, tau_ns: f64) -> f64 {
        self.threshold_distribution(tau_ns).expected_max(n) + self.overhead_ns
    }

    /// Drop rate d(τ) under the BeforeMicroBatch policy with min one micro-batch.
    pub fn drop_rate_before_micro_batch(&self, tau_ns: f64) -> f64 {
        let s = self.sigma_ns.max(1e-9);
        let started: f64 = 1.0
            + (2..=self.micro_batches)
                .map(|k| {
                    let km = f64::from(k - 1);
                    norm_cdf((tau_ns - km * self.mu_ns) / (s * km.sqrt()))
                })
                .sum::<f64>();
        1.0 - started / self.m()
    }

    /// Drop rate d(τ) of the oracle model (§3.2): 1 - Σ_k Φ((τ - kμ)/(σ√k))/M.
    pub fn drop_rate_oracle(&self, tau_ns: f64) -> f64 {
        let s = self.sigma_ns.max(1e-9);
        let done: f64 = (1..=self.micro_batches)
            .map(|k| {
                let k = f64::from(k);
                norm_cdf((tau_ns - k * self.mu_ns) / (s * k.sqrt()))
            })
            .sum();
        1.0 - done / self.m()
    }

    /// Effective speedup S_eff(τ, N) = (1 - d)·E[T_step]/E[T_step^τ] - 1 under the
    /// BeforeMicroBatch policy.
    pub fn effective_speedup(&self, n: u64, tau_ns: f64) -> f64 {
        let d = self.drop_rate_before_micro_batch(tau_ns);
        (1.0 - d) * self.expected_step_time(n) / self.expected_step_time_threshold(n, tau_ns) - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> NormalModel {
        NormalModel::new(100.0, 20.0, 12, 50.0).expect("valid")
    }

    #[test]
    fn expected_max_matches_known_normal_order_statistics() {
        // E[max of N standard normals]: N=2: 1/√π; N=3: 3/(2√π); N=5: 1.162964 (tables).
        let m = NormalModel::new(1.0, 1.0, 1, 0.0).expect("valid");
        // Shift to a positive mean so the grid does not clip at 0: mean 100, sd 1.
        let shifted = NormalModel { mu_ns: 100.0, ..m };
        let e = |n| shifted.expected_step_time(n) - 100.0;
        assert!((e(1)).abs() < 1e-6, "{}", e(1));
        assert!((e(2) - 1.0 / std::f64::consts::PI.sqrt()).abs() < 1e-6);
        assert!((e(3) - 1.5 / std::f64::consts::PI.sqrt()).abs() < 1e-6);
        assert!((e(5) - 1.162_964).abs() < 1e-5);
        // Gaussian approximation is within 5 % of the exact value at N = 10^4.
        let ex = e(10_000);
        let ap = shifted.expected_step_time_gaussian(10_000) - 100.0;
        assert!((ap / ex - 1.0).abs() < 0.05, "{ap} vs {ex}");
    }

    #[test]
    fn threshold_far_above_is_baseline_and_drop_rates_are_consistent() {
        let m = model();
        let tau = 1e9;
        assert!(m.drop_rate_before_micro_batch(tau) < 1e-12);
        assert!(m.drop_rate_oracle(tau) < 1e-12);
        let a = m.expected_step_time(64);
        let b = m.expected_step_time_threshold(64, tau);
        assert!((a / b - 1.0).abs() < 1e-4, "{a} {b}");
        // Stopping exactly at the deadline drops at least as much as checking before.
        for tau in [300.0, 700.0, 1000.0, 1150.0] {
            assert!(m.drop_rate_oracle(tau) >= m.drop_rate_before_micro_batch(tau) - 1e-12);
        }
        // τ = 0 with min one micro-batch: only the first is started.
        assert!((m.drop_rate_before_micro_batch(0.0) - 11.0 / 12.0).abs() < 1e-6);
    }

    #[test]
    fn speedup_grows_with_workers() {
        let m = model();
        let tau = 1100.0;
        let s: Vec<f64> = [16u64, 64, 1000, 10_000].iter().map(|&n| m.effective_speedup(n, tau)).collect();
        assert!(s.windows(2).all(|w| w[1] > w[0]), "{s:?}");
    }
}
