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

#[test]
fn a_rank_that_skips_a_collective_trips_the_watchdog_on_every_rank_with_the_flight_record() {
    let _g = serial();
    let opts = CommOptions { timeout: Duration::from_millis(400), ..quick() };
    let t0 = Instant::now();
    let errs = with_ranks(2, opts, |rank, comm, s| {
        let mut buf = upload(s, &[1.0f32; 64]);
        comm.synchronize(s).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
        // Rank 1 never issues the second collective: rank 0 waits for it.
        if rank == 0 {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
        }
        let e = comm.synchronize(s).err();
        (rank, e, comm.flight_recorder().dump())
    });
    let (_, e0, dump0) = &errs[0];
    match e0 {
        Some(HcclError::Timeout { op, seq, after }) => {
            assert_eq!((*op, *seq, *after), ("all_reduce", 2, Duration::from_millis(400)));
        }
        Some(HcclError::Peer { .. }) => {} // the mock may report the missing peer first
        other => panic!("rank 0: expected a timeout, got {other:?}"),
    }
    assert!(dump0.contains("seq=2 op=all_reduce"), "{dump0}");
    assert!(t0.elapsed() < Duration::from_secs(15), "fault containment took {:?}", t0.elapsed());
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
    let errs = with_ranks(2, quick(), |rank, comm, s| {
        let mut buf = upload(s, &[1.0f32; 32]);
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
        comm.synchronize(s).unwrap();
        if rank == 0 {
            MockControl::in_process()
                .inject_fault(&Fault::HcclAsyncError { code: habana_sys::hcclResult_t::PORT_DOWN.0 })
                .unwrap();
        }
        let _ = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s);
        let deadline = Instant::now() + Duration::from_secs(10);
        while comm.error().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        comm.error()
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
