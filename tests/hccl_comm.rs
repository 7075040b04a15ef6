//! The safe HCCL layer over the CPU mock's collectives, ranks as threads: results against an
//! f64 reference and identical on every rank, groups, argument checks before any C call, and
//! fault containment (watchdog timeout with flight recorder, asynchronous errors, mismatched
//! collectives) bounded in time.
#![cfg(feature = "mock")] // runs on the CPU mock device

use std::time::{Duration, Instant};

use dropcompute::hccl::{Comm, CommOptions, HcclError, HcclType, ReduceOp, UniqueId};
use dropcompute::mock::{Fault, MockControl};
use dropcompute::synapse::{Device, DeviceBuffer, Stream};
use half::bf16;

#[path = "support/hermetic.rs"]
mod hermetic;
#[path = "support/ranks.rs"]
mod ranks;
use ranks::{download, runtime, serial, upload};

fn quick() -> CommOptions {
    CommOptions { timeout: Duration::from_secs(20), abort_deadline: Duration::from_secs(5), ..CommOptions::default() }
}

/// Runs `f(rank, comm, stream)` on `n` threads, each with its own device and communicator.
fn with_ranks<R: Send>(n: u32, opts: CommOptions, f: impl Fn(u32, &Comm, &Stream) -> R + Sync) -> Vec<R> {
    ranks::with_ranks(runtime(), n, opts, f)
}

fn input(rank: u32, i: usize) -> f64 {
    ((rank as f64 + 1.0) * 0.37 + i as f64 * 0.011).sin() * 8.0
}

fn check_all_reduce<T: HcclType + PartialEq + std::fmt::Debug>(
    n: u32,
    count: usize,
    to: impl Fn(f64) -> T + Sync,
    from: impl Fn(T) -> f64,
    tol: f64,
) {
    for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
        let outs = with_ranks(n, quick(), |rank, comm, s| {
            let data: Vec<T> = (0..count).map(|i| to(input(rank, i))).collect();
            let send = upload(s, &data);
            let mut recv = DeviceBuffer::<T>::alloc(s.device(), count).unwrap();
            comm.all_reduce(&send, &mut recv, op, s).unwrap();
            comm.synchronize(s).unwrap();
            download(s, &recv)
        });
        // Bitwise identical on every rank.
        assert!(outs.windows(2).all(|w| w[0] == w[1]), "{op:?} n={n}: ranks disagree");
        for (i, got) in outs[0].iter().enumerate() {
            let vals: Vec<f64> = (0..n).map(|r| from(to(input(r, i)))).collect();
            let want = match op {
                ReduceOp::Sum => vals.iter().sum::<f64>(),
                ReduceOp::Min => vals.iter().cloned().fold(f64::INFINITY, f64::min),
                ReduceOp::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            };
            let bound =
                if op == ReduceOp::Sum { tol * n as f64 * vals.iter().map(|v| v.abs()).sum::<f64>() } else { 0.0 };
            assert!((from(*got) - want).abs() <= bound, "{op:?} n={n} element {i}: {} vs {want}", from(*got));
        }
    }
}

#[test]
fn all_reduce_matches_f64_reference_for_each_dtype() {
    let _g = serial();
    for n in [1, 2, 3, 4] {
        check_all_reduce::<f32>(n, 1031, |v| v as f32, |v| v as f64, f32::EPSILON as f64);
        check_all_reduce::<bf16>(n, 77, bf16::from_f64, |v| v.to_f64(), 2f64.powi(-8));
        check_all_reduce::<i32>(n, 7, |v| (v * 1000.0) as i32, |v| v as f64, 0.0);
    }
}

#[test]
fn group_of_collectives_and_in_place() {
    let _g = serial();
    let outs = with_ranks(3, quick(), |rank, comm, s| {
        let mut a = upload(s, &vec![rank as f32 + 1.0; 100]);
        let b = upload(s, &[rank as i32 * 10; 5]);
        let mut gathered = DeviceBuffer::<i32>::alloc(s.device(), 15).unwrap();
        let mut root_copy = DeviceBuffer::<f32>::alloc(s.device(), 100).unwrap();
        comm.group(s, |c| {
            c.all_reduce_in_place(&mut a, ReduceOp::Max, s)?;
            c.all_gather(&b, &mut gathered, s)
        })
        .unwrap();
        comm.broadcast(&a, &mut root_copy, 2, s).unwrap();
        comm.synchronize(s).unwrap();
        assert_eq!(comm.last_seq(), 3);
        assert!(comm.flight_recorder().entries().iter().all(|e| e.completed.is_some()) || comm.error().is_none());
        (download(s, &a), download(s, &gathered), download(s, &root_copy))
    });
    for (a, g, r) in &outs {
        assert!(a.iter().all(|&v| v == 3.0));
        assert_eq!(g, &[0, 0, 0, 0, 0, 10, 10, 10, 10, 10, 20, 20, 20, 20, 20]);
        assert!(r.iter().all(|&v| v == 3.0));
    }
}

#[test]
fn arguments_are_checked_before_any_call() {
    let _g = serial();
    let rt = runtime();
    let dev = Device::acquire_any(rt).unwrap();
    let id = Comm::unique_id(rt).unwrap();
    assert!(matches!(Comm::init_rank(&dev, 2, &id, 2, quick()), Err(HcclError::InvalidArgument { .. })));
    assert!(matches!(Comm::init_rank(&dev, 0, &id, 0, quick()), Err(HcclError::InvalidArgument { .. })));
    assert!(matches!(UniqueId::from_bytes(&[0u8; 1025]), Err(HcclError::InvalidArgument { .. })));
    let back = UniqueId::from_bytes(&id.to_bytes()).unwrap();
    assert_eq!(back.to_bytes(), id.to_bytes());
    let comm = Comm::init_rank(&dev, 1, &id, 0, quick()).unwrap();
    let s = Stream::new(&dev).unwrap();
    let a = DeviceBuffer::<f32>::alloc(&dev, 4).unwrap();
    let mut b = DeviceBuffer::<f32>::alloc(&dev, 5).unwrap();
    assert!(matches!(comm.all_reduce(&a, &mut b, ReduceOp::Sum, &s), Err(HcclError::InvalidArgument { .. })));
    assert!(matches!(
        comm.broadcast(&a, &mut b, 1, &s),
        Err(HcclError::InvalidArgument { what: "broadcast root", .. })
    ));
    assert!(matches!(comm.all_gather(&a, &mut b, &s), Err(HcclError::InvalidArgument { .. })));
    assert_eq!(comm.last_seq(), 0, "rejected calls take no sequence number");
    comm.destroy().map_err(|b| b.0).unwrap();
}

/// Rank 1 skips collective #2: rank 0, the rank waiting in it, trips its watchdog with exactly
/// `Timeout { all_reduce, seq 2, the configured timeout }` (rank 1 keeps its communicator open
/// meanwhile, so the only possible outcome is the timeout, never a "peer gone"), and the
/// flight record names seq 2 as pending. Rank 1, issuing collective #2 once rank 0 has failed
/// it, gets exactly a `Peer` error blaming rank 0 (its peer aborted the communicator): the
/// Timeout is visible only after the abort, which withdraws rank 0 from the pending collective,
/// so no completion and no other error kind is accepted.
#[test]
fn a_rank_that_skips_a_collective_trips_the_watchdog_on_every_rank_with_the_flight_record() {
    let _g = serial();
    let opts = CommOptions { timeout: Duration::from_millis(400), ..quick() };
    let gate = std::sync::Barrier::new(2);
    let t0 = Instant::now();
    let errs = with_ranks(2, opts, |rank, comm, s| {
        let mut buf = upload(s, &[1.0f32; 64]);
        comm.synchronize(s).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
        comm.synchronize(s).unwrap();
        let e = if rank == 0 {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
            let e = comm.synchronize(s).err();
            gate.wait();
            e
        } else {
            gate.wait(); // rank 0 has its result: collective #2 was skipped until then
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).and_then(|_| comm.synchronize(s)).err()
        };
        (e, comm.flight_recorder().dump())
    });
    let (e0, dump0) = &errs[0];
    match e0 {
        Some(HcclError::Timeout { op, seq, after }) => {
            assert_eq!((*op, *seq, *after), ("all_reduce", 2, Duration::from_millis(400)));
        }
        other => panic!("rank 0: expected the watchdog timeout of seq 2, got {other:?}"),
    }
    let line = dump0.lines().find(|l| l.starts_with("seq=2 op=all_reduce"));
    assert!(line.is_some_and(|l| l.ends_with("completed=PENDING")), "{dump0}");
    let (e1, dump1) = &errs[1];
    match e1 {
        // Rank 0's Timeout is visible only after its hcclCommAbort returned, and the abort
        // withdraws rank 0 from every pending collective (the mock's meet, under its lock): rank
        // 1, issuing collective #2 after that, can never complete it.
        Some(HcclError::Peer { code, rank: blamed, reason }) => {
            assert!(!code.is_success(), "{reason}");
            assert_eq!(*blamed, Some(0), "rank 1 must blame rank 0: {reason}");
        }
        other => panic!("rank 1: expected a Peer error blaming rank 0 after rank 0 aborted, got {other:?}"),
    }
    assert!(dump1.contains("seq=2 op=all_reduce"), "{dump1}");
    assert!(t0.elapsed() < Duration::from_secs(60), "hang guard: fault containment took {:?}", t0.elapsed());
}

/// A deterministic f32 in ±[2^-12, 2^12) with a random mantissa (splitmix64 of `key`): sums of
/// two such values are exact in f64, so rounding an f64 partial sum to f32 is the f32 addition.
fn spread(key: u64) -> f32 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let mantissa = 1.0 + (z & 0xff_ffff) as f64 / (1u64 << 24) as f64;
    let exp = ((z >> 24) % 25) as i32 - 12;
    let sign = if (z >> 40) & 1 == 1 { -1.0 } else { 1.0 };
    (sign * mantissa * 2f64.powi(exp)) as f32
}

/// The f32 sum of `vals` in the given order, each partial sum rounded to f32 (an f64 reference:
/// every partial sum of two `spread` values is exact in f64 before the rounding).
fn ordered_sum(vals: impl Iterator<Item = f32>) -> f32 {
    let mut acc: Option<f64> = None;
    for v in vals {
        acc = Some(acc.map_or(f64::from(v), |a| ((a + f64::from(v)) as f32).into()));
    }
    acc.unwrap_or(0.0) as f32
}

/// The documented summation order of the same-process all-reduce (`habana-mock`
/// `hccl/shm.rs`: each element is reduced by one rank in rank order 0, 1, ..., n-1): every
/// element equals, bit for bit and on every rank, the f32 sum in that order. The inputs make
/// the order visible: in every one of the n segments the ranks reduce, some elements differ
/// between rank order and reverse rank order, so reducing any rank's segment in another order
/// fails. (With 2 ranks the order cannot matter: f32 addition is commutative.)
#[test]
fn all_reduce_sums_every_segment_in_rank_order_bitwise() {
    let _g = serial();
    let count = 3000usize;
    for n in [3u32, 4, 5] {
        let input = |rank: u32, i: usize| spread(u64::from(n) << 48 | u64::from(rank) << 32 | i as u64);
        let outs = with_ranks(n, quick(), |rank, comm, s| {
            let data: Vec<f32> = (0..count).map(|i| input(rank, i)).collect();
            let mut buf = upload(s, &data);
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
            comm.synchronize(s).unwrap();
            download(s, &buf)
        });
        let forward: Vec<f32> = (0..count).map(|i| ordered_sum((0..n).map(|r| input(r, i)))).collect();
        let reverse: Vec<f32> = (0..count).map(|i| ordered_sum((0..n).rev().map(|r| input(r, i)))).collect();
        for (rank, got) in outs.iter().enumerate() {
            for i in 0..count {
                assert_eq!(
                    got[i].to_bits(),
                    forward[i].to_bits(),
                    "n={n} rank {rank} element {i}: {} vs {}",
                    got[i],
                    forward[i]
                );
            }
        }
        // Segment s of n nearly equal parts is [count·s/n, count·(s+1)/n) (shm.rs `seg`).
        for seg in 0..n as usize {
            let r = count * seg / n as usize..count * (seg + 1) / n as usize;
            let differ = r.clone().filter(|&i| forward[i].to_bits() != reverse[i].to_bits()).count();
            assert!(
                differ * 10 >= r.len(),
                "n={n} segment {seg}: only {differ} of {} elements depend on the order",
                r.len()
            );
        }
    }
}

#[test]
fn a_peer_that_dies_mid_collective_is_reported_on_every_survivor() {
    let _g = serial();
    MockControl::in_process().inject_fault(&Fault::HcclKillRank { rank: 2, abort_process: false }).unwrap();
    let t0 = Instant::now();
    let errs = with_ranks(3, quick(), |_, comm, s| {
        let mut buf = upload(s, &vec![1.0f32; 1 << 16]);
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
        let e = comm.synchronize(s).err();
        // Once failed, every later call returns the recorded error without touching the library.
        let again = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).err();
        (e, again)
    });
    for (rank, (e, again)) in errs.iter().enumerate() {
        match e {
            Some(HcclError::Peer { code, reason, rank: blamed }) => {
                assert!(!code.is_success());
                assert!(!reason.is_empty());
                if rank != 2 {
                    assert!(blamed.is_none_or(|b| b == 2), "rank {rank} blames {blamed:?}: {reason}");
                }
            }
            other => panic!("rank {rank}: expected a Peer error, got {other:?}"),
        }
        assert_eq!(again.as_ref().map(|e| e.to_string()), e.as_ref().map(|e| e.to_string()));
    }
    assert!(t0.elapsed() < Duration::from_secs(15), "took {:?}", t0.elapsed());
}

#[test]
fn an_asynchronous_error_mid_step_fails_the_communicator_with_its_code() {
    let _g = serial();
    let gate = std::sync::Barrier::new(2);
    let errs = with_ranks(2, quick(), |rank, comm, s| {
        let mut buf = upload(s, &[1.0f32; 32]);
        let first = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).and_then(|_seq| comm.synchronize(s));
        // The injected error reaches every communicator of the process: both ranks must have
        // finished collective #1 before rank 0 injects it (no unwrap before the gate: a rank
        // that fails still passes it, and the assert below names its error).
        gate.wait();
        first.unwrap_or_else(|e| panic!("rank {rank}: collective #1: {e}"));
        if rank == 0 {
            MockControl::in_process()
                .inject_fault(&Fault::HcclAsyncError { code: habana_sys::hcclResult_t::PORT_DOWN.0 })
                .unwrap();
        }
        let _ = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s);
        // Readiness: the error reaches every rank's communicator (300 s: a hang guard).
        hermetic::wait_until(Duration::from_secs(300), || comm.error())
    });
    assert!(
        errs.iter()
            .any(|e| matches!(e, Some(HcclError::Peer { code, .. }) if *code == habana_sys::hcclResult_t::PORT_DOWN)),
        "{errs:?}"
    );
    assert!(errs.iter().all(|e| e.is_some()), "every rank must fail: {errs:?}");
}

#[test]
fn the_unique_id_coordinator_binds_loopback_unless_told_otherwise() {
    let _g = serial();
    // HCCL_COMM_ID (the "told otherwise") is not set in the test environment.
    assert!(std::env::var_os("HCCL_COMM_ID").is_none());
    let id = Comm::unique_id(runtime()).unwrap();
    let text = String::from_utf8_lossy(&id.to_bytes()).into_owned();
    assert!(text.contains("127.0.0.1:"), "coordinator address in the id: {text:?}");
    assert!(!text.contains("0.0.0.0"));
}
