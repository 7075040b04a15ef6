//! Fault injection at the collectives and device level, through the safe layer
//! (`hccl::Comm`, `synapse::Device`), with real threads and processes on the CPU mock. Every
//! scenario asserts a typed error, no panic, a bound on the time to surface it (a hang guard:
//! timeout + generous slack, not a timing goal), and, where a collective was in flight, that the
//! flight recorder dump names its sequence number. Elapsed times are printed (`--nocapture`).
//!
//! Scenarios of issue 7 already covered elsewhere (not repeated here):
//! - peer that never joins comm init, raw table: `mock_hccl_procs::rank_that_never_joins_fails_init_within_the_timeout`
//!   (here: the same through `Comm::init_rank`, typed error, in a child process);
//! - peer dying mid-collective, ranks as threads: `hccl_comm::a_peer_that_dies_mid_collective_is_reported_on_every_survivor`;
//!   peer *process* killed, raw table: `mock_hccl_procs::killed_peer_process_gives_survivors_a_socket_error`
//!   (here: a killed process through `Comm`, with the flight record);
//! - asynchronous error between collectives: `hccl_comm::an_asynchronous_error_mid_step_fails_the_communicator_with_its_code`
//!   (here: one raised while a collective is in flight, with the flight record);
//! - a rank that skips a collective (watchdog timeout): `hccl_comm::a_rank_that_skips_a_collective_trips_the_watchdog_on_every_rank_with_the_flight_record`
//!   (here: a rank that is merely slower than the timeout);
//! - count and dtype mismatch, raw table: `mock_hccl::mismatched_counts_fail_every_rank`,
//!   `mock_hccl::mismatched_dtypes_fail_every_rank` (here: through `Comm`, with the flight record);
//! - runtime library missing and missing symbol: `habana-sys/tests/abi.rs`
//!   (`missing_library_is_a_typed_error_not_a_panic`, `a_library_that_is_not_synapse_names_the_missing_symbol`);
//!   CLI exit code for missing and too old: `tests/cli_exit.rs` (here: too old, as a typed `LoadError`);
//! - abort of one rank mid-collective releasing the others, raw: `mock_hccl::abort_of_one_rank_mid_collective_releases_everyone`
//!   (here: an abort that itself blocks, abandoned after `abort_deadline`).
//!
//! New here: the device already held by another process (`DROPCOMPUTE_MOCK_LOCK_DIR`).
#![cfg(feature = "mock")] // runs on the CPU mock device

#[path = "support/mock_library.rs"]
mod mock_library;

mod common;
use common::hermetic;

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::hccl::{spawn_child, wait_child};
use dropcompute::hccl::{Comm, CommOptions, HcclError, ReduceOp, UniqueId};
use dropcompute::mock::{self, Fault, MockControl};
use dropcompute::synapse::{Device, Runtime, Stream};
use habana_sys::{LoadError, SynapseApi, hcclComm_t, hcclResult_t, synStatus};

const CHILD: &str = "DC_FAULT_CHILD";
/// Slack on top of a configured timeout before a scenario counts as hung.
const SLACK: Duration = Duration::from_secs(10);

#[path = "support/ranks.rs"]
mod ranks;
use ranks::{runtime, serial, upload, with_ranks};

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

fn opts(timeout_ms: u64) -> CommOptions {
    CommOptions {
        timeout: Duration::from_millis(timeout_ms),
        abort_deadline: Duration::from_secs(2),
        ..CommOptions::default()
    }
}

/// The dump must name collective `seq` (`op`) as failed or still pending, never as a clean
/// completion (the watchdog marks a completion with a stream error as FAILED).
fn assert_named(dump: &str, seq: u64, op: &str) {
    let line = dump.lines().find(|l| l.starts_with(&format!("seq={seq} op={op} ")));
    assert!(
        line.is_some_and(|l| l.contains("completed=FAILED") || l.ends_with("completed=PENDING")),
        "seq {seq} not failed or pending in:\n{dump}"
    );
}

/// The flight-recorder line of collective `seq`, which must still be pending (watchdog timeout).
fn assert_pending(dump: &str, seq: u64, op: &str) {
    let line = dump.lines().find(|l| l.starts_with(&format!("seq={seq} op={op}")));
    assert!(line.is_some_and(|l| l.ends_with("completed=PENDING")), "seq {seq} not pending in:\n{dump}");
}

// ---------------------------------------------------------------- in-process scenarios

#[test]
fn a_rank_slower_than_the_collective_timeout_fails_the_waiting_rank_with_its_seq() {
    let _g = serial();
    let timeout = Duration::from_millis(500);
    // Rank 1 arrives only once rank 0's watchdog has fired (a readiness signal, not a sleep):
    // slower than the timeout by construction, whatever the machine's load.
    let (fired, wait_fired) = std::sync::mpsc::channel::<()>();
    let wait_fired = Mutex::new(wait_fired);
    let t0 = Instant::now();
    let out = with_ranks(runtime(), 2, opts(500), |rank, comm, s| {
        let mut buf = upload(s, &[1.0f32; 256]);
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
        comm.synchronize(s).unwrap();
        if rank == 1 {
            let _ = wait_fired.lock().unwrap().recv_timeout(Duration::from_secs(300)); // hang guard
        }
        let issued = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s);
        let e = issued.and_then(|_| comm.synchronize(s)).err();
        if rank == 0 {
            fired.send(()).unwrap();
        }
        (e, t0.elapsed(), comm.flight_recorder().dump())
    });
    let (e0, at0, dump0) = &out[0];
    match e0 {
        Some(HcclError::Timeout { op: "all_reduce", seq: 2, after }) => assert_eq!(*after, timeout),
        other => panic!("rank 0: expected the watchdog timeout of seq 2, got {other:?}"),
    }
    assert_pending(dump0, 2, "all_reduce");
    assert!(*at0 < timeout + SLACK, "rank 0 took {at0:?}");
    assert!(*at0 >= timeout, "the watchdog fired before the timeout: {at0:?}");
    // The late rank finds its peer gone: a typed Peer error, not a hang and not a wrong result.
    let (e1, at1, _) = &out[1];
    match e1 {
        Some(HcclError::Peer { code, rank: blamed, reason }) => {
            assert!(!code.is_success(), "{reason}");
            assert!(blamed.is_none_or(|b| b == 0), "rank 1 blames {blamed:?}: {reason}");
        }
        other => panic!("rank 1: expected a Peer error once rank 0 aborted, got {other:?}"),
    }
    assert!(*at1 < *at0 + SLACK, "rank 1 took {at1:?}");
    println!("slow rank: rank 0 failed after {at0:?} (timeout {timeout:?}); rank 1 after {at1:?}: {e1:?}");
}

#[test]
fn an_async_error_while_a_collective_is_in_flight_fails_it_with_its_code_and_seq() {
    let _g = serial();
    let gate = Barrier::new(2);
    let t0 = Instant::now();
    let out = with_ranks(runtime(), 2, opts(20_000), |rank, comm, s| {
        let mut buf = upload(s, &vec![1.0f32; 1 << 12]);
        let first = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).and_then(|_seq| comm.synchronize(s));
        // The injected error reaches every communicator of the process: rank 1 must have
        // finished collective #1 first (under load it once had not: its synchronize failed,
        // its thread panicked before the last gate and rank 0 waited there forever). No
        // unwrap before a gate: a rank that fails still passes both.
        gate.wait();
        if let Err(e) = first {
            gate.wait();
            return (Some(e), t0.elapsed(), format!("rank {rank}: collective #1 failed"));
        }
        if rank == 0 {
            // Rank 0's collective #2 is in flight: issued, and it cannot complete, since rank 1
            // never issues it (no sleep needed to make it "in flight").
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap();
            let code = hcclResult_t::PORT_DOWN.0;
            MockControl::in_process().inject_fault(&Fault::HcclAsyncError { code }).unwrap();
        }
        let e = comm.synchronize(s).err();
        gate.wait(); // rank 1 keeps its communicator until rank 0 has its result
        (e, t0.elapsed(), comm.flight_recorder().dump())
    });
    let (e0, at0, dump0) = &out[0];
    match e0 {
        Some(HcclError::Peer { code, .. }) => assert_eq!(*code, hcclResult_t::PORT_DOWN),
        other => panic!("rank 0: expected the asynchronous PORT_DOWN, got {other:?}"),
    }
    assert_named(dump0, 2, "all_reduce");
    assert!(*at0 < SLACK, "took {at0:?}");
    println!("async error mid-collective: surfaced after {at0:?}");
}

#[test]
fn a_count_or_dtype_mismatch_on_one_rank_fails_every_rank_with_the_seq() {
    let _g = serial();
    for case in ["count", "dtype"] {
        let t0 = Instant::now();
        let out = with_ranks(runtime(), 2, opts(20_000), |rank, comm, s| {
            // Buffers live until the stream is synchronized.
            let (mut short, mut ints, mut full) =
                (upload(s, &[1.0f32; 32]), upload(s, &[1i32; 64]), upload(s, &[1.0f32; 64]));
            let r = match (case, rank) {
                ("count", 1) => comm.all_reduce_in_place(&mut short, ReduceOp::Sum, s),
                ("dtype", 1) => comm.all_reduce_in_place(&mut ints, ReduceOp::Sum, s),
                _ => comm.all_reduce_in_place(&mut full, ReduceOp::Sum, s),
            };
            let e = r.and_then(|_| comm.synchronize(s)).err();
            (e, comm.flight_recorder().dump())
        });
        for (rank, (e, dump)) in out.iter().enumerate() {
            match e {
                Some(HcclError::Peer { code, reason, .. }) => {
                    assert_eq!(*code, hcclResult_t::INVALID_USAGE, "{case} rank {rank}: {reason}");
                }
                other => panic!("{case} mismatch, rank {rank}: expected a typed Peer error, got {other:?}"),
            }
            assert_named(dump, 1, "all_reduce");
        }
        let took = t0.elapsed();
        assert!(took < SLACK, "{case}: took {took:?}");
        println!("{case} mismatch: every rank failed after {took:?}");
    }
}

static ABORT_CALLED: AtomicBool = AtomicBool::new(false);
static ABORT_RETURNED: AtomicBool = AtomicBool::new(false);
/// Set (and notified) by the test once it has checked that the abort was abandoned.
static ABORT_RELEASE: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// An `hcclCommAbort` that blocks (as the real one may, behind a dead peer) until the test
/// releases it through [`ABORT_RELEASE`] (or 300 s pass: a hang guard), then really aborts so
/// the mock's state is cleaned up.
unsafe extern "C" fn blocking_abort(c: hcclComm_t) -> hcclResult_t {
    ABORT_CALLED.store(true, Ordering::SeqCst);
    let (m, cv) = &ABORT_RELEASE;
    let released = m.lock().unwrap_or_else(|p| p.into_inner());
    drop(cv.wait_timeout_while(released, Duration::from_secs(300), |r| !*r));
    // SAFETY: forwards the same handle to the mock's own abort, the function this one replaces.
    let r = unsafe { (mock::api().hccl_comm_abort)(c) };
    ABORT_RETURNED.store(true, Ordering::SeqCst);
    r
}

#[test]
fn an_abort_that_blocks_is_abandoned_after_the_abort_deadline() {
    let _g = serial();
    let mut fns = *mock::api();
    fns.hccl_comm_abort = blocking_abort;
    // SAFETY: the mock's table with one function replaced by one of the same prototype that
    // never unwinds and forwards to the mock's abort.
    let api = unsafe { SynapseApi::from_fns(fns, "cpu-mock-blocking-abort") };
    let rt = Runtime::new(api).unwrap();
    let o = CommOptions { timeout: Duration::from_millis(400), abort_deadline: Duration::from_millis(300), ..opts(0) };
    let gate = Barrier::new(2);
    let t0 = Instant::now();
    let out = with_ranks(&rt, 2, o.clone(), |rank, comm, s| {
        let mut buf = upload(s, &[1.0f32; 64]);
        if rank == 0 {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, s).unwrap(); // rank 1 never joins
        }
        let e = comm.synchronize(s).err();
        let dump = comm.flight_recorder().dump();
        gate.wait();
        (e, dump)
    });
    let took = t0.elapsed(); // includes both Comm drops
    match &out[0].0 {
        Some(HcclError::Timeout { seq: 1, .. }) => {}
        other => panic!("rank 0: expected the timeout of seq 1, got {other:?}"),
    }
    assert_pending(&out[0].1, 1, "all_reduce");
    assert!(ABORT_CALLED.load(Ordering::SeqCst), "the watchdog must call hcclCommAbort");
    // The abort blocks until released below: had the teardown awaited it, we would not be here
    // before the hang guard, and it would have returned.
    assert!(!ABORT_RETURNED.load(Ordering::SeqCst), "the blocked abort must have been abandoned, not awaited");
    println!("blocking abort: error and teardown after {took:?} while the abort was still blocked");
    let (m, cv) = &ABORT_RELEASE;
    *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
    cv.notify_all();
    // Let the abandoned abort finish before the next test (it cleans up the mock's state).
    let done = hermetic::wait_until(Duration::from_secs(300), || ABORT_RETURNED.load(Ordering::SeqCst).then_some(()));
    assert!(done.is_some(), "the released abort must return");
}

// ---------------------------------------------------------------- child processes

/// Child role dispatcher (run only by the process scenarios through `spawn_child`).
#[test]
#[ignore = "child role: run by the process scenarios"]
fn child_role() {
    match env(CHILD).as_str() {
        "never_joins" => child_never_joins(),
        "killed" => child_killed(),
        "hold" => {
            let rt = Runtime::new(mock::api()).unwrap();
            let _dev = Device::acquire(&rt, env("DC_MODULE").parse().unwrap()).unwrap();
            println!("HELD");
            std::thread::sleep(Duration::from_secs(120)); // until the parent kills us
        }
        "contend" => child_contend(),
        "old_library" => {
            let lib = mock_library::shared_library_path().unwrap();
            match SynapseApi::load_path(&lib) {
                Err(LoadError::UnsupportedVersion { path, version }) => {
                    assert_eq!((path, version.as_str()), (lib, "1.15.0"));
                    println!("OLD_OK");
                }
                other => panic!("expected UnsupportedVersion, got {other:?}"),
            }
        }
        _ => println!("no child role set"),
    }
}

/// Two of three ranks join through `Comm::init_rank`; the mock's init timeout is set by the
/// parent in `DROPCOMPUTE_MOCK_HCCL_TIMEOUT_MS`.
fn child_never_joins() {
    let rt = Runtime::new(mock::api()).unwrap();
    let id = Comm::unique_id(&rt).unwrap();
    let t0 = Instant::now();
    let errs: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (rt, id) = (&rt, &id);
                s.spawn(move || {
                    let dev = Device::acquire_any(rt).unwrap();
                    Comm::init_rank(&dev, 3, id, rank, opts(20_000)).map(|_| ()).unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errs {
        match e {
            HcclError::Hccl { call: "hcclCommInitRank", code, message, .. } => {
                assert_eq!(*code, hcclResult_t::SOCKET_ERROR);
                assert!(message.as_deref().is_some_and(|m| m.contains("missing [2]")), "{e}");
            }
            other => panic!("expected a typed hcclCommInitRank error, got {other:?}"),
        }
    }
    println!("NEVER_JOINS_OK {:?}", t0.elapsed());
}

/// Rank `DC_RANK` of a 3-process communicator; rank 1 aborts its process inside the first
/// all-reduce, the survivors must report a typed peer error with the flight record.
fn child_killed() {
    let rank: u32 = env("DC_RANK").parse().unwrap();
    let id: UniqueId = env("DC_ID").parse().unwrap();
    let rt = Runtime::new(mock::api()).unwrap();
    let dev = Device::acquire_any(&rt).unwrap();
    let s = Stream::new(&dev).unwrap();
    let comm = Comm::init_rank(&dev, 3, &id, rank, opts(20_000)).unwrap();
    if rank == 1 {
        MockControl::in_process().inject_fault(&Fault::HcclKillRank { rank: 1, abort_process: true }).unwrap();
    }
    let mut buf = upload(&s, &vec![1.0f32; 1 << 20]);
    let t0 = Instant::now();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s).unwrap();
    match comm.synchronize(&s) {
        Err(HcclError::Peer { code, rank: blamed, reason }) => {
            assert_eq!(code, hcclResult_t::SOCKET_ERROR, "{reason}");
            assert!(blamed.is_none_or(|b| b == 1), "blames {blamed:?}: {reason}");
        }
        other => panic!("rank {rank}: expected a Peer error, got {other:?}"),
    }
    assert_named(&comm.flight_recorder().dump(), 1, "all_reduce");
    println!("SURVIVOR_OK {:?}", t0.elapsed());
}

/// Module `DC_MODULE` is held by another process: acquiring it fails with
/// synDeviceAlreadyAcquired; `acquire_any` picks another module.
fn child_contend() {
    let m: u32 = env("DC_MODULE").parse().unwrap();
    let rt = Runtime::new(mock::api()).unwrap();
    let t0 = Instant::now();
    match Device::acquire(&rt, m) {
        Err(e) => {
            assert_eq!(e.status(), Some(synStatus::DEVICE_ALREADY_ACQUIRED), "{e}");
            assert!(e.to_string().contains("another process"), "{e}");
        }
        Ok(_) => panic!("module {m} acquired while another process holds it"),
    }
    let elapsed = t0.elapsed();
    let other = Device::acquire_any(&rt).unwrap();
    assert_ne!(other.module_id(), Some(m));
    if env("DC_EXPECT_FREE") == "1" {
        drop(other);
    }
    println!("CONTEND_OK {elapsed:?}");
}

#[test]
fn a_peer_that_never_joins_fails_comm_init_with_a_typed_error_within_the_timeout() {
    let kid = spawn_child("child_role", &[(CHILD, "never_joins".into()), (mock::hccl::ENV_TIMEOUT_MS, "1500".into())]);
    let (_, ok, out) = wait_child(kid, Duration::from_millis(1500) + SLACK + Duration::from_secs(20));
    assert!(ok && out.contains("NEVER_JOINS_OK"), "{out}");
    println!("{}", out.lines().find(|l| l.contains("NEVER_JOINS_OK")).unwrap_or_default());
}

#[test]
fn a_peer_process_killed_mid_collective_gives_survivors_a_peer_error_and_the_flight_record() {
    let rt = runtime();
    let id = Comm::unique_id(rt).unwrap().to_string();
    let kids: Vec<_> = (0..3)
        .map(|r| {
            let e = [
                (CHILD, "killed".to_string()),
                ("DC_RANK", r.to_string()),
                ("DC_ID", id.clone()),
                (mock::hccl::ENV_TIMEOUT_MS, "20000".to_string()),
            ];
            spawn_child("child_role", &e)
        })
        .collect();
    let res: Vec<_> = kids.into_iter().map(|k| wait_child(k, Duration::from_secs(20) + SLACK * 3)).collect();
    assert!(!res[1].1, "rank 1 should have aborted:\n{}", res[1].2);
    for r in [0, 2] {
        assert!(res[r].1 && res[r].2.contains("SURVIVOR_OK"), "rank {r}:\n{}", res[r].2);
        println!("killed peer: rank {r} {}", res[r].2.lines().find(|l| l.contains("SURVIVOR_OK")).unwrap_or(""));
    }
}

#[test]
fn the_device_held_by_another_process_is_refused_until_that_process_exits() {
    let tmp = hermetic::temp_dir("faults-lock");
    let dir = tmp.path();
    let lock_env = |role: &str| {
        vec![(CHILD, role.to_string()), ("DC_MODULE", "5".to_string()), (mock::ENV_LOCK_DIR, dir.display().to_string())]
    };
    let mut holder = spawn_child("child_role", &lock_env("hold"));
    let mut line = String::new();
    let mut stdout = BufReader::new(holder.stdout.take().unwrap());
    while !line.contains("HELD") {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            let _ = holder.kill();
            panic!("holder exited before acquiring: {:?}", holder.wait_with_output());
        }
    }
    let (_, ok, out) = wait_child(spawn_child("child_role", &lock_env("contend")), SLACK * 3);
    assert!(ok && out.contains("CONTEND_OK"), "{out}");
    println!("device held: {}", out.lines().find(|l| l.contains("CONTEND_OK")).unwrap_or(""));
    holder.kill().unwrap(); // the holder dies: the OS drops its lock
    holder.wait().unwrap();
    let rt_env = lock_env("hold");
    let mut again = spawn_child("child_role", &rt_env);
    let mut line = String::new();
    let mut stdout = BufReader::new(again.stdout.take().unwrap());
    while !line.contains("HELD") {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            break;
        }
    }
    let _ = again.kill();
    let _ = again.wait();
    assert!(line.contains("HELD"), "module 5 must be free once its holder exited: {line:?}");
}

#[test]
fn a_runtime_library_older_than_supported_is_a_typed_load_error() {
    let kid = spawn_child("child_role", &[(CHILD, "old_library".into()), (mock::ENV_VERSION, "1.15.0".into())]);
    let (_, ok, out) = wait_child(kid, Duration::from_secs(300));
    assert!(ok && out.contains("OLD_OK"), "{out}");
}
