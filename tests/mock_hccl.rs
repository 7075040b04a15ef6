//! The CPU mock's HCCL through the raw function table, ranks as threads (each on its own mock
//! module): correctness against f64 references, bitwise agreement across ranks, lockstep
//! mismatches, abort. Multi-process runs and process-global fault knobs: `mock_hccl_procs.rs`.
#![cfg(feature = "mock")] // runs on the CPU mock device

mod common;

use std::ffi::c_void;

use common::hccl::*;
use dropcompute::mock::{Fault, MockControl};
use habana_sys::*;

/// Runs every dtype × op × count case of an all-reduce on `n` thread-ranks; checks each result
/// against the f64 reference and that all ranks hold the same bytes.
fn all_reduce_sweep(n: usize) {
    let mut cases = Vec::new();
    for t in DTYPES {
        for op in OPS {
            for count in [0usize, 1, 7, 1000] {
                cases.push((t, op, count));
            }
        }
    }
    // Several 1 MiB chunks per ring segment (f32 partials for bf16 too).
    for t in [hcclDataType_t::FLOAT32, hcclDataType_t::BFLOAT16] {
        cases.push((t, hcclRedOp_t::SUM, n * 300_000 + 3));
    }
    let hashes = world(n, |rk| {
        let mut out = Vec::new();
        for &(t, op, count) in &cases {
            let len = count * size_of(t);
            let s = rk.upload(&encode(t, &input(t, rk.rank, count)));
            let r = rk.dev.malloc(len.max(1) as u64);
            hok(&rk.api, rk.all_reduce(s, r, count, t, op));
            let bytes = rk.download(r, len);
            let got = decode(t, &bytes);
            for (i, g) in got.iter().enumerate() {
                let (want, tol) = (reference(t, op, n, i), tolerance(t, op, n, i));
                assert!((g - want).abs() <= tol, "n={n} {t} {op} count={count} [{i}]: {g} vs {want} (tol {tol})");
            }
            out.push(hash(&bytes));
            rk.dev.free(s);
            rk.dev.free(r);
        }
        out
    });
    for (r, h) in hashes.iter().enumerate() {
        assert_eq!(h, &hashes[0], "rank {r} differs from rank 0 bitwise");
    }
}

#[test]
fn all_reduce_world_1() {
    all_reduce_sweep(1);
}

#[test]
fn all_reduce_world_2() {
    all_reduce_sweep(2);
}

#[test]
fn all_reduce_world_3() {
    all_reduce_sweep(3);
}

#[test]
fn all_reduce_world_4() {
    all_reduce_sweep(4);
}

#[test]
fn all_reduce_world_8() {
    all_reduce_sweep(8);
}

#[test]
fn all_reduce_in_place_matches_reference() {
    let t = hcclDataType_t::FLOAT32;
    let n = 3;
    world(n, |rk| {
        let a = rk.upload(&encode(t, &input(t, rk.rank, 5000)));
        hok(&rk.api, rk.all_reduce(a, a, 5000, t, hcclRedOp_t::SUM));
        let got = decode(t, &rk.download(a, 5000 * 4));
        for (i, g) in got.iter().enumerate() {
            let tol = tolerance(t, hcclRedOp_t::SUM, n, i);
            assert!((g - reference(t, hcclRedOp_t::SUM, n, i)).abs() <= tol);
        }
    });
}

fn p(a: u64) -> *mut c_void {
    a as *mut c_void
}

#[test]
fn other_collectives_match_references() {
    let n = 4;
    let t = hcclDataType_t::BFLOAT16;
    let sz = size_of(t);
    world(n, |rk| {
        let (api, r) = (&rk.api, rk.rank);
        // SAFETY (all raw calls): device addresses of this rank's buffers cast to pointers;
        // comm and stream of this table.
        // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
        unsafe {
            // reduce-scatter: rank r receives elements r*rc.. of the sum
            let rc = 333;
            let s = rk.upload(&encode(t, &input(t, r, n * rc)));
            let o = rk.dev.malloc((rc * sz) as u64);
            hok(api, (api.hccl_reduce_scatter)(p(s), p(o), rc, t, hcclRedOp_t::SUM, rk.comm, rk.hs));
            let got = decode(t, &rk.download(o, rc * sz));
            for (j, g) in got.iter().enumerate() {
                let i = r * rc + j;
                let tol = tolerance(t, hcclRedOp_t::SUM, n, i);
                assert!((g - reference(t, hcclRedOp_t::SUM, n, i)).abs() <= tol, "reduce-scatter [{i}]");
            }
            // all-gather
            let c = 101;
            let s = rk.upload(&encode(t, &input(t, r, c)));
            let o = rk.dev.malloc((n * c * sz) as u64);
            hok(api, (api.hccl_all_gather)(p(s), p(o), c, t, rk.comm, rk.hs));
            let got = decode(t, &rk.download(o, n * c * sz));
            for q in 0..n {
                assert_eq!(&got[q * c..(q + 1) * c], &input(t, q, c)[..], "all-gather block {q}");
            }
            // broadcast from root 1 (non-roots pass an unused send buffer)
            let s = rk.upload(&encode(t, &input(t, r, c)));
            let o = rk.dev.malloc((c * sz) as u64);
            hok(api, (api.hccl_broadcast)(p(s), p(o), c, t, 1, rk.comm, rk.hs));
            assert_eq!(decode(t, &rk.download(o, c * sz)), input(t, 1, c));
            // reduce (max) to root 2; other ranks' receive buffers untouched
            let marker = vec![0xABu8; c * sz];
            let o = rk.upload(&marker);
            hok(api, (api.hccl_reduce)(p(s), p(o), c, t, hcclRedOp_t::MAX, 2, rk.comm, rk.hs));
            let got = rk.download(o, c * sz);
            if r == 2 {
                let want: Vec<f64> = (0..c).map(|i| reference(t, hcclRedOp_t::MAX, n, i)).collect();
                assert_eq!(decode(t, &got), want);
            } else {
                assert_eq!(got, marker);
            }
            // all-to-all: block q of rank r's input goes to rank q
            let b = 10;
            let s = rk.upload(&encode(t, &input(t, r, n * b)));
            let o = rk.dev.malloc((n * b * sz) as u64);
            hok(api, (api.hccl_all_to_all)(p(s), p(o), n * b, t, rk.comm, rk.hs));
            let got = decode(t, &rk.download(o, n * b * sz));
            for q in 0..n {
                assert_eq!(&got[q * b..(q + 1) * b], &input(t, q, n * b)[r * b..(r + 1) * b], "all-to-all from {q}");
            }
            // barrier
            hok(api, (api.hccl_barrier)(rk.comm, rk.hs));
            assert_eq!(rk.sync(), synStatus::SUCCESS);
            let (e, _) = rk.async_error();
            assert_eq!(e, hcclResult_t::SUCCESS);
        }
    });
}

#[test]
fn send_recv_ungrouped_pair_and_grouped_ring() {
    let t = hcclDataType_t::INT32;
    // Two ranks: rank 0 sends then receives, rank 1 receives then sends, ungrouped.
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    world(2, |rk| unsafe {
        let (api, r) = (&rk.api, rk.rank);
        let s = rk.upload(&encode(t, &input(t, r, 64)));
        let o = rk.dev.malloc(256);
        // SAFETY: device addresses of this rank; comm and stream of this table.
        if r == 0 {
            hok(api, (api.hccl_send)(p(s), 64, t, 1, rk.comm, rk.hs));
            hok(api, (api.hccl_recv)(p(o), 64, t, 1, rk.comm, rk.hs));
        } else {
            hok(api, (api.hccl_recv)(p(o), 64, t, 0, rk.comm, rk.hs));
            hok(api, (api.hccl_send)(p(s), 64, t, 0, rk.comm, rk.hs));
        }
        assert_eq!(decode(t, &rk.download(o, 256)), input(t, 1 - r, 64));
    });
    // Four ranks, grouped: everyone receives from its predecessor before sending (would
    // deadlock without group semantics).
    let n = 4;
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    world(n, |rk| unsafe {
        let (api, r) = (&rk.api, rk.rank);
        let s = rk.upload(&encode(t, &input(t, r, 9)));
        let o = rk.dev.malloc(36);
        // SAFETY: as above.
        hok(api, (api.hccl_group_start)());
        hok(api, (api.hccl_recv)(p(o), 9, t, ((r + n - 1) % n) as i32, rk.comm, rk.hs));
        hok(api, (api.hccl_send)(p(s), 9, t, ((r + 1) % n) as i32, rk.comm, rk.hs));
        hok(api, (api.hccl_group_end)());
        assert_eq!(decode(t, &rk.download(o, 36)), input(t, (r + n - 1) % n, 9));
    });
}

#[test]
fn group_of_several_collectives() {
    let n = 3;
    let t = hcclDataType_t::FLOAT32;
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    world(n, |rk| unsafe {
        let (api, r) = (&rk.api, rk.rank);
        let a = rk.upload(&encode(t, &input(t, r, 50)));
        let g = rk.dev.malloc((n * 50 * 4) as u64);
        let b = rk.upload(&encode(hcclDataType_t::UINT32, &input(hcclDataType_t::UINT32, r, 20)));
        let o = rk.dev.malloc(80);
        // SAFETY: device addresses of this rank; comm and stream of this table.
        hok(api, (api.hccl_group_start)());
        hok(api, (api.hccl_all_gather)(p(a), p(g), 50, t, rk.comm, rk.hs));
        hok(api, (api.hccl_group_start)()); // nested
        hok(api, (api.hccl_all_reduce)(p(b), p(o), 20, hcclDataType_t::UINT32, hcclRedOp_t::MAX, rk.comm, rk.hs));
        hok(api, (api.hccl_group_end)());
        hok(api, (api.hccl_all_reduce)(p(a), p(a), 50, t, hcclRedOp_t::MIN, rk.comm, rk.hs));
        hok(api, (api.hccl_group_end)());
        let got = decode(t, &rk.download(g, n * 50 * 4));
        for q in 0..n {
            assert_eq!(&got[q * 50..(q + 1) * 50], &input(t, q, 50)[..]);
        }
        let mx = decode(hcclDataType_t::UINT32, &rk.download(o, 80));
        let want: Vec<f64> = (0..20).map(|i| reference(hcclDataType_t::UINT32, hcclRedOp_t::MAX, n, i)).collect();
        assert_eq!(mx, want);
        let mn = decode(t, &rk.download(a, 200));
        let want: Vec<f64> = (0..50).map(|i| reference(t, hcclRedOp_t::MIN, n, i)).collect();
        assert_eq!(mn, want);
        assert_eq!((api.hccl_group_end)(), hcclResult_t::INVALID_USAGE);
    });
}

#[test]
fn synchronous_argument_errors() {
    let api = setup();
    // SAFETY (all raw calls): valid out-pointers; deliberately invalid handles and values.
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    unsafe {
        let mut c: hcclComm_t = std::ptr::null_mut();
        let id = unique_id(&api);
        assert_eq!((api.hccl_comm_init_rank)(&mut c, 0, id, 0), hcclResult_t::INVALID_ARGUMENT);
        assert_eq!((api.hccl_comm_init_rank)(&mut c, 2, id, 2), hcclResult_t::INVALID_ARGUMENT);
        assert!(hccl_msg(&api).contains("rank 2"), "{}", hccl_msg(&api));
        let mut bad = id;
        bad.internal[0] ^= 0xFF;
        assert_eq!((api.hccl_comm_init_rank)(&mut c, 2, bad, 0), hcclResult_t::INVALID_ARGUMENT);
        let mut e = hcclResult_t::SUCCESS;
        assert_eq!((api.hccl_comm_get_async_error)(0x40 as hcclComm_t, &mut e), hcclResult_t::INVALID_ARGUMENT);
    }
    // SAFETY: a call through the mock C function table with arguments matching its prototype: handles this test created and pointers to live buffers of the stated sizes.
    world(1, |rk| unsafe {
        let api = &rk.api;
        let a = rk.upload(&[0u8; 64]);
        let f = hcclDataType_t::FLOAT32;
        // SAFETY: comm/stream of this table; addresses deliberately out of range below.
        for op in [hcclRedOp_t::PROD, hcclRedOp_t::AVG] {
            assert_eq!(rk.all_reduce(a, a, 4, f, op), hcclResult_t::UNSUPPORTED);
        }
        assert_eq!(rk.all_reduce(a, a, 17, f, hcclRedOp_t::SUM), hcclResult_t::INVALID_ARGUMENT);
        assert!(hccl_msg(api).contains("exceeds"), "{}", hccl_msg(api));
        assert_eq!(rk.all_reduce(a, a, 4, hcclDataType_t(42), hcclRedOp_t::SUM), hcclResult_t::INVALID_ARGUMENT);
        assert_eq!(rk.all_reduce(a, a, 4, f, hcclRedOp_t(9)), hcclResult_t::INVALID_ARGUMENT);
        assert_eq!((api.hccl_broadcast)(p(a), p(a), 4, f, 1, rk.comm, rk.hs), hcclResult_t::INVALID_ARGUMENT);
        assert_eq!((api.hccl_send)(p(a), 4, f, 0, rk.comm, rk.hs), hcclResult_t::INVALID_ARGUMENT);
        let bogus_stream = 0x1_0000_0000usize as *mut c_void;
        let r = (api.hccl_all_reduce)(p(a), p(a), 4, f, hcclRedOp_t::SUM, rk.comm, bogus_stream);
        assert_eq!(r, hcclResult_t::INVALID_ARGUMENT);
        let (mut cnt, mut me, mut dev) = (0, 0, 0);
        hok(api, (api.hccl_comm_count)(rk.comm, &mut cnt));
        hok(api, (api.hccl_comm_user_rank)(rk.comm, &mut me));
        hok(api, (api.hccl_comm_syn_device)(rk.comm, &mut dev));
        assert_eq!((cnt, me, dev), (1, 0, rk.dev.id as i32));
        // count 0: no-op success even with null buffers
        hok(api, (api.hccl_all_reduce)(std::ptr::null(), std::ptr::null_mut(), 0, f, hcclRedOp_t::SUM, rk.comm, rk.hs));
        assert_eq!(rk.sync(), synStatus::SUCCESS);
    });
}

/// Runs ops on 3 ranks where `bad_rank` issues something else; every rank must fail with
/// hcclInvalidUsage (not a timeout) and a message naming `field`.
fn mismatch(field: &str, issue: impl Fn(&Rank, u64, u64) + Sync) {
    let res = world(3, |rk| {
        let a = rk.upload(&[0u8; 64]);
        let o = rk.dev.malloc(64);
        issue(rk, a, o);
        let st = rk.sync();
        (st, rk.async_error())
    });
    for (r, (st, (e, msg))) in res.iter().enumerate() {
        assert_eq!(*st, synStatus::FAIL_HCCL, "rank {r}");
        assert_eq!(*e, hcclResult_t::INVALID_USAGE, "rank {r}: {msg}");
        assert!(msg.contains(field) && msg.contains("lockstep mismatch"), "rank {r}: {msg}");
    }
}

#[test]
fn mismatched_counts_fail_every_rank() {
    mismatch("count=7", |rk, a, o| {
        let c = if rk.rank == 2 { 8 } else { 7 };
        hok(&rk.api, rk.all_reduce(a, o, c, hcclDataType_t::FLOAT32, hcclRedOp_t::SUM));
    });
}

#[test]
fn mismatched_dtypes_fail_every_rank() {
    mismatch("datatype", |rk, a, o| {
        let t = if rk.rank == 1 { hcclDataType_t::INT32 } else { hcclDataType_t::FLOAT32 };
        hok(&rk.api, rk.all_reduce(a, o, 4, t, hcclRedOp_t::SUM));
    });
}

#[test]
fn a_rank_skipping_a_collective_fails_every_rank() {
    mismatch("op=hcclAllReduce", |rk, a, o| {
        let t = hcclDataType_t::FLOAT32;
        if rk.rank != 2 {
            hok(&rk.api, rk.all_reduce(a, o, 4, t, hcclRedOp_t::SUM));
        }
        // SAFETY: device addresses of this rank; comm and stream of this table.
        hok(&rk.api, unsafe { (rk.api.hccl_broadcast)(p(a), p(o), 4, t, 0, rk.comm, rk.hs) });
    });
}

#[test]
fn abort_of_one_rank_mid_collective_releases_everyone() {
    // Every rank has issued its collective before rank 0 aborts (no fixed sleep).
    let issued = std::sync::Barrier::new(3);
    let res = world(3, |rk| {
        let a = rk.upload(&[0u8; 4096]);
        if rk.rank == 0 {
            // Rank 0's collective sits behind a stall, so it is queued when the comm is aborted.
            let ctl = MockControl::in_process();
            ctl.inject_fault(&Fault::StallStream { module_id: rk.dev.module, duration_ms: None }).unwrap();
            hok(&rk.api, rk.all_reduce(a, a, 1024, hcclDataType_t::FLOAT32, hcclRedOp_t::SUM));
            issued.wait();
            // SAFETY: a live comm of this table.
            hok(&rk.api, unsafe { (rk.api.hccl_comm_abort)(rk.comm) });
            ctl.inject_fault(&Fault::ReleaseStall { module_id: rk.dev.module }).unwrap();
            return (rk.sync(), (hcclResult_t::SUCCESS, String::new()));
        }
        hok(&rk.api, rk.all_reduce(a, a, 1024, hcclDataType_t::FLOAT32, hcclRedOp_t::SUM));
        issued.wait();
        (rk.sync(), rk.async_error())
    });
    assert_eq!(res[0].0, synStatus::FAIL_HCCL, "the aborted rank's queued collective fails");
    for (st, (e, msg)) in &res[1..] {
        assert_eq!(*st, synStatus::FAIL_HCCL);
        assert_eq!(*e, hcclResult_t::SOCKET_ERROR, "{msg}");
        // Whether a peer's worker had sent to rank 0 before the abort (it then reads rank 0's
        // abort notice) or sends after it (rank 0's inbox is closed) is scheduling; both name
        // rank 0 as the cause. (The old fixed 200 ms sleep made the first merely likely.)
        assert!(msg.contains("rank 0") && (msg.contains("aborted") || msg.contains("is gone")), "{msg}");
    }
}

/// Two ranks join one id with `(nranks, rank)` each; returns their results and messages.
fn init_pair(a: (i32, i32), b: (i32, i32)) -> Vec<(hcclResult_t, String)> {
    let api = setup();
    let id = unique_id(&api);
    std::thread::scope(|s| {
        let hs: Vec<_> = [a, b]
            .into_iter()
            .map(|(n, r)| {
                let api = &api;
                s.spawn(move || {
                    let mut c = std::ptr::null_mut();
                    // SAFETY: valid out-pointer; id by value.
                    let res = unsafe { (api.hccl_comm_init_rank)(&mut c, n, id, r) };
                    (res, hccl_msg(api))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn init_rejects_nranks_disagreement_and_duplicate_ranks_on_every_rank() {
    for (res, msg) in init_pair((2, 0), (3, 1)) {
        assert_eq!(res, hcclResult_t::INVALID_USAGE, "{msg}");
        assert!(msg.contains("nranks disagreement"), "{msg}");
    }
    let res = init_pair((2, 0), (2, 0));
    for (res, msg) in &res {
        assert_eq!(*res, hcclResult_t::INVALID_USAGE, "{msg}");
    }
    assert!(res.iter().any(|(_, m)| m.contains("duplicate rank")), "{res:?}");
}

#[test]
fn coordinator_refuses_a_wrong_token_and_keeps_serving() {
    use std::io::{Read, Write};
    let api = setup();
    let id = unique_id(&api);
    // Layout (documented in the mock): magic, version, token [12..28], address length, address.
    let l = u16::from_le_bytes([id.internal[28], id.internal[29]]) as usize;
    let addr = std::str::from_utf8(&id.internal[30..30 + l]).unwrap().to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let mut join = vec![0xEEu8; 16]; // wrong token
    for v in [0u32, 2, 1] {
        join.extend_from_slice(&v.to_le_bytes());
    }
    join.extend_from_slice(&7u64.to_le_bytes());
    join.extend_from_slice(&0u16.to_le_bytes());
    s.write_all(&(join.len() as u32).to_le_bytes()).unwrap();
    s.write_all(&join).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert_eq!(reply[4], 3, "an error message");
    assert_eq!(i32::from_le_bytes(reply[5..9].try_into().unwrap()), hcclResult_t::INVALID_USAGE.0);
    assert!(String::from_utf8_lossy(&reply).contains("wrong unique id token"));
    // The real ranks still complete the rendezvous on the same id.
    let api2 = api.clone();
    let ranks: Vec<i32> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let api = &api2;
                sc.spawn(move || {
                    let rk = Rank::join(api, id, r, 2);
                    let mut me = -1;
                    // SAFETY: live comm, valid out-pointer.
                    hok(api, unsafe { (api.hccl_comm_user_rank)(rk.comm, &mut me) });
                    hok(api, rk.destroy());
                    me
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(ranks, vec![0, 1]);
}
