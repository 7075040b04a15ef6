//! One rank's row of the per-step count matrix: what a rank tells every other rank about its
//! step through the u32 all-reduce (the gather, `step.rs` phase 3).
//!
//! Owns: [`CountRow`], its wire layout ([`CountRow::encode`] / [`CountRow::decode`] /
//! [`CountRow::len`]) and [`CountRowError`]. Must not touch: devices, collectives, the
//! normalization rule (`divisor.rs`).
//!
//! Wire layout of one row for M micro-batches, `18 + 2·M` u32 entries, each 64-bit value as a
//! (low 32 bits, high 32 bits) pair:
//!
//! | index        | field                                   |
//! |--------------|-----------------------------------------|
//! | 0            | `nonfinite` (0 or 1)                    |
//! | 1            | `computed` (micro-batches)              |
//! | 2            | `dropped` (micro-batches)               |
//! | 3, 4         | `samples` lo, hi                        |
//! | 5, 6         | `tokens` lo, hi                         |
//! | 7, 8         | `compute_ns` lo, hi                     |
//! | 9, 10        | `overhead_ns` lo, hi                    |
//! | 11, 12       | `dropped_samples` lo, hi                |
//! | 13           | `stop_requested` (0 or 1)               |
//! | 14, 15       | `clock_start_ns` lo, hi                 |
//! | 16, 17       | `dropped_tokens` lo, hi                 |
//! | 18 + 2i, +1  | `latencies_ns[i]` lo, hi (i < M)        |
//!
//! Every rank fills only its own row of an N x `len(M)` zero matrix and the matrix is summed,
//! so a decoded row is exactly what its rank encoded.

use super::report::RankStepStats;

/// Entries of a row before the 2·M latency entries.
const FIXED: usize = 18;

/// One rank's counts and timings for one step, as carried in its row of the gathered count
/// matrix (identical on every rank after the all-reduce).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountRow {
    /// The rank's accumulated gradient had a NaN or infinity.
    pub nonfinite: bool,
    /// Micro-batches computed.
    pub computed: u32,
    /// Micro-batches scheduled but not started (dropped).
    pub dropped: u32,
    /// Samples computed.
    pub samples: u64,
    /// Tokens computed (0 unless micro-batches carry token counts).
    pub tokens: u64,
    /// Compute phase on the device (ns): end of the last computed micro-batch minus the end of
    /// the previous optimizer update.
    pub compute_ns: u64,
    /// The rank's previous step time minus its compute phase (ns; 0 at the first step).
    pub overhead_ns: u64,
    /// Samples of the dropped micro-batches.
    pub dropped_samples: u64,
    /// Tokens of the dropped micro-batches (0 unless micro-batches carry token counts, as
    /// `tokens`).
    pub dropped_tokens: u64,
    /// The rank asked every rank to stop after this step.
    pub stop_requested: bool,
    /// Device timestamp (ns) of this step's compute clock start on the rank (the end of its
    /// previous update): the other ranks' rows give each rank's clock skew
    /// (`schedule::auto::trace_of_reports`), meaningful where the ranks' device clocks share an
    /// epoch (the mock's, real or virtual).
    pub clock_start_ns: u64,
    /// Device duration (ns) of each of the M micro-batch slots, in schedule order;
    /// [`CountRow::NOT_COMPUTED`] for a slot not computed. Its length is M.
    pub latencies_ns: Vec<u64>,
}

/// A count row that cannot be encoded or decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CountRowError {
    /// The row (or the output slice) has the wrong number of u32 entries for M micro-batches.
    #[error("count row: expected {expected} u32 entries (18 + 2·M, M = {micro_batches}), got {got}")]
    Length {
        /// `CountRow::len(micro_batches)`.
        expected: usize,
        /// Entries given.
        got: usize,
        /// M.
        micro_batches: usize,
    },
    /// A flag entry is neither 0 nor 1 (two ranks wrote the same row, or the row is garbled).
    #[error("count row: flag {field} is {value}, expected 0 or 1")]
    Flag {
        /// `nonfinite` or `stop_requested`.
        field: &'static str,
        /// The entry.
        value: u32,
    },
    /// More micro-batches computed plus dropped than the M slots of a step.
    #[error("count row: computed {computed} + dropped {dropped} exceeds M = {micro_batches}")]
    Counts {
        /// Micro-batches computed.
        computed: u32,
        /// Micro-batches dropped.
        dropped: u32,
        /// M.
        micro_batches: usize,
    },
}

fn split(v: u64) -> [u32; 2] {
    [v as u32, (v >> 32) as u32]
}

fn join(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

fn flag(field: &'static str, value: u32) -> Result<bool, CountRowError> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(CountRowError::Flag { field, value }),
    }
}

impl CountRow {
    /// Latency entry of a micro-batch slot that was not computed (dropped, or never planned
    /// because the data ran out).
    pub const NOT_COMPUTED: u64 = u64::MAX;

    /// Entries (u32) of a row for `micro_batches` = M micro-batches: `18 + 2·M`.
    pub const fn len(micro_batches: usize) -> usize {
        FIXED + 2 * micro_batches
    }

    /// Writes this row into `out` (`len(latencies_ns.len())` entries) in the wire layout of the
    /// module documentation, overwriting every entry.
    ///
    /// # Errors
    /// [`CountRowError::Length`] when `out` does not have `len(M)` entries, M being
    /// `latencies_ns.len()` (nothing is written).
    pub fn encode(&self, out: &mut [u32]) -> Result<(), CountRowError> {
        let m = self.latencies_ns.len();
        if out.len() != Self::len(m) {
            return Err(CountRowError::Length { expected: Self::len(m), got: out.len(), micro_batches: m });
        }
        out[0] = u32::from(self.nonfinite);
        out[1] = self.computed;
        out[2] = self.dropped;
        out[3..5].copy_from_slice(&split(self.samples));
        out[5..7].copy_from_slice(&split(self.tokens));
        out[7..9].copy_from_slice(&split(self.compute_ns));
        out[9..11].copy_from_slice(&split(self.overhead_ns));
        out[11..13].copy_from_slice(&split(self.dropped_samples));
        out[13] = u32::from(self.stop_requested);
        out[14..16].copy_from_slice(&split(self.clock_start_ns));
        out[16..18].copy_from_slice(&split(self.dropped_tokens));
        for (pair, d) in out[FIXED..].chunks_exact_mut(2).zip(&self.latencies_ns) {
            pair.copy_from_slice(&split(*d));
        }
        Ok(())
    }

    /// Reads a row of `micro_batches` = M latency slots written by [`CountRow::encode`].
    ///
    /// # Errors
    /// [`CountRowError::Length`] when `row` does not have `len(M)` entries;
    /// [`CountRowError::Flag`] when a flag entry is not 0 or 1; [`CountRowError::Counts`] when
    /// computed + dropped exceeds M.
    pub fn decode(row: &[u32], micro_batches: usize) -> Result<Self, CountRowError> {
        let m = micro_batches;
        if row.len() != Self::len(m) {
            return Err(CountRowError::Length { expected: Self::len(m), got: row.len(), micro_batches: m });
        }
        let (computed, dropped) = (row[1], row[2]);
        if u64::from(computed) + u64::from(dropped) > m as u64 {
            return Err(CountRowError::Counts { computed, dropped, micro_batches: m });
        }
        Ok(Self {
            nonfinite: flag("nonfinite", row[0])?,
            computed,
            dropped,
            samples: join(row[3], row[4]),
            tokens: join(row[5], row[6]),
            compute_ns: join(row[7], row[8]),
            overhead_ns: join(row[9], row[10]),
            dropped_samples: join(row[11], row[12]),
            stop_requested: flag("stop_requested", row[13])?,
            clock_start_ns: join(row[14], row[15]),
            dropped_tokens: join(row[16], row[17]),
            latencies_ns: row[FIXED..].chunks_exact(2).map(|p| join(p[0], p[1])).collect(),
        })
    }

    /// The report's per-rank counts and clock start (everything but the overhead, the stop flag and the
    /// latencies, which the report carries globally).
    pub fn stats(&self) -> RankStepStats {
        RankStepStats {
            nonfinite: self.nonfinite,
            computed: self.computed,
            dropped: self.dropped,
            samples: self.samples,
            tokens: self.tokens,
            compute_ns: self.compute_ns,
            dropped_samples: self.dropped_samples,
            dropped_tokens: self.dropped_tokens,
            clock_start_ns: self.clock_start_ns,
        }
    }

    /// The latencies as the tuner reads them (ns as f64, NaN for a slot not computed).
    pub fn latencies_f64(&self) -> impl Iterator<Item = f64> + '_ {
        self.latencies_ns.iter().map(|&d| if d == Self::NOT_COMPUTED { f64::NAN } else { d as f64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_row() -> CountRow {
        CountRow {
            nonfinite: true,
            computed: 2,
            dropped: 1,
            samples: 0x1111_2222_3333_4444,
            tokens: 0x5555_6666_7777_8888,
            compute_ns: 0x0000_0001_0000_0002,
            overhead_ns: 0x9999_aaaa_bbbb_cccc,
            dropped_samples: 0xdddd_eeee_ffff_0001,
            dropped_tokens: 0x0fed_cba9_8765_4321,
            stop_requested: true,
            clock_start_ns: 0x0abc_def0_1234_5678,
            latencies_ns: vec![0x0102_0304_0506_0708, 7, CountRow::NOT_COMPUTED],
        }
    }

    #[test]
    fn layout_is_pinned_index_by_index() {
        let r = sample_row();
        let mut out = vec![0xdead_beef; CountRow::len(3)];
        r.encode(&mut out).unwrap();
        #[rustfmt::skip]
        let expected: Vec<u32> = vec![
            1, 2, 1,
            0x3333_4444, 0x1111_2222,
            0x7777_8888, 0x5555_6666,
            0x0000_0002, 0x0000_0001,
            0xbbbb_cccc, 0x9999_aaaa,
            0xffff_0001, 0xdddd_eeee,
            1,
            0x1234_5678, 0x0abc_def0,
            0x8765_4321, 0x0fed_cba9,
            0x0506_0708, 0x0102_0304,
            7, 0,
            u32::MAX, u32::MAX,
        ];
        assert_eq!(out, expected);
        assert_eq!(CountRow::len(0), 18);
        assert_eq!(CountRow::len(8), 34);
    }

    #[test]
    fn false_flags_encode_as_zero() {
        let r = CountRow { latencies_ns: vec![CountRow::NOT_COMPUTED; 2], ..Default::default() };
        let mut out = vec![9; CountRow::len(2)];
        r.encode(&mut out).unwrap();
        assert_eq!(&out[..18], &[0; 18]);
        assert_eq!(&out[18..], &[u32::MAX; 4]);
    }

    #[test]
    fn wrong_lengths_are_errors_naming_expected_and_got() {
        let r = sample_row();
        let mut short = vec![0; 23];
        assert_eq!(r.encode(&mut short), Err(CountRowError::Length { expected: 24, got: 23, micro_batches: 3 }));
        assert_eq!(short, vec![0; 23], "nothing written on error");
        let e = CountRow::decode(&[0; 25], 3).unwrap_err();
        assert_eq!(e, CountRowError::Length { expected: 24, got: 25, micro_batches: 3 });
        let msg = e.to_string();
        assert!(msg.contains("expected 24") && msg.contains("got 25") && msg.contains("18 + 2·M"), "{msg}");
        assert!(CountRow::decode(&[], 0).is_err());
    }

    #[test]
    fn garbled_flags_and_counts_are_rejected() {
        let mut row = vec![0; CountRow::len(3)];
        sample_row().encode(&mut row).unwrap();
        let mut bad = row.clone();
        bad[0] = 2;
        assert_eq!(CountRow::decode(&bad, 3), Err(CountRowError::Flag { field: "nonfinite", value: 2 }));
        let mut bad = row.clone();
        bad[13] = 3;
        assert_eq!(CountRow::decode(&bad, 3), Err(CountRowError::Flag { field: "stop_requested", value: 3 }));
        let mut bad = row.clone();
        bad[1] = 3; // 3 computed + 1 dropped > M = 3
        assert_eq!(CountRow::decode(&bad, 3), Err(CountRowError::Counts { computed: 3, dropped: 1, micro_batches: 3 }));
        let mut bad = row;
        bad[1] = u32::MAX; // no overflow in the check
        bad[2] = u32::MAX;
        assert!(matches!(CountRow::decode(&bad, 3), Err(CountRowError::Counts { .. })));
    }

    #[test]
    fn stats_and_latencies_view_the_row() {
        let r = sample_row();
        let s = r.stats();
        assert_eq!((s.nonfinite, s.computed, s.dropped), (true, 2, 1));
        assert_eq!((s.samples, s.tokens), (r.samples, r.tokens));
        assert_eq!((s.compute_ns, s.dropped_samples), (r.compute_ns, r.dropped_samples));
        assert_eq!(s.dropped_tokens, 0x0fed_cba9_8765_4321);
        assert_eq!(s.clock_start_ns, 0x0abc_def0_1234_5678);
        let l: Vec<f64> = r.latencies_f64().collect();
        assert_eq!(l[0], 0x0102_0304_0506_0708u64 as f64);
        assert_eq!(l[1], 7.0);
        assert!(l[2].is_nan());
    }

    fn any_row() -> impl Strategy<Value = CountRow> {
        (0usize..12)
            .prop_flat_map(|m| {
                let lat = prop_oneof![Just(CountRow::NOT_COMPUTED), any::<u64>()];
                (
                    (any::<bool>(), 0..=m as u32, any::<bool>()),
                    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
                    proptest::collection::vec(lat, m),
                )
            })
            .prop_map(|((nonfinite, computed, stop_requested), (s, t, c, o, d, dt, k), latencies_ns)| {
                let m = latencies_ns.len() as u32;
                CountRow {
                    nonfinite,
                    computed,
                    dropped: m - computed,
                    samples: s,
                    tokens: t,
                    compute_ns: c,
                    overhead_ns: o,
                    dropped_samples: d,
                    dropped_tokens: dt,
                    stop_requested,
                    clock_start_ns: k,
                    latencies_ns,
                }
            })
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_the_identity(r in any_row()) {
            let m = r.latencies_ns.len();
            let mut out = vec![0u32; CountRow::len(m)];
            r.encode(&mut out).unwrap();
            prop_assert_eq!(CountRow::decode(&out, m).unwrap(), r);
        }

        #[test]
        fn decode_never_panics(row in proptest::collection::vec(any::<u32>(), 0..44), m in 0usize..14) {
            if let Ok(r) = CountRow::decode(&row, m) {
                let mut out = vec![0u32; row.len()];
                r.encode(&mut out).unwrap();
                prop_assert_eq!(out, row);
            }
        }
    }
}
