//! Helpers for the mock HCCL tests: ranks as threads (each acquires its own mock module),
//! device upload/download of raw bytes, element encodings of every HCCL datatype, f64
//! references, and child processes (the test binary re-executed with a role in the
//! environment).
#![allow(dead_code)]

use std::ffi::{CStr, c_void};
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dropcompute::mock::{self, MockConfig, MockControl};
use habana_sys::*;

use super::{Dev, ok};

/// Modules configured for the test process (thread-ranks take fresh ones).
pub const MODULES: u32 = 1024;

/// The in-process table, configured once (before any device is acquired in this process) with
/// [`MODULES`] modules: in a test process, the default configuration whatever the calling shell
/// exports (the product's variables are removed first: `hermetic::scrub_process_env`); in a
/// child role, `$DROPCOMPUTE_MOCK_CONFIG` as its parent test set it (e.g. virtual time).
pub fn setup() -> SynapseApi {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        super::hermetic::scrub_process_env();
        let mut cfg = if super::hermetic::is_test_child() {
            MockConfig::from_env().expect("valid DROPCOMPUTE_MOCK_CONFIG from the parent test")
        } else {
            MockConfig::default()
        };
        cfg.devices = MODULES;
        MockControl::in_process().configure(&cfg).expect("configure");
    });
    mock::api()
}

/// A 64-bit hash of `b` (to compare results across ranks).
pub fn hash(b: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// A fresh module id.
pub fn next_module() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed) % MODULES
}

/// This thread's HCCL last error message.
pub fn hccl_msg(api: &SynapseApi) -> String {
    // SAFETY: returns NULL or a NUL-terminated thread-local string.
    unsafe {
        let p = (api.hccl_get_last_error_message.unwrap())();
        if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
    }
}

/// Asserts hcclSuccess.
#[track_caller]
pub fn hok(api: &SynapseApi, r: hcclResult_t) {
    assert_eq!(r, hcclResult_t::SUCCESS, "{}", hccl_msg(api));
}

/// A new unique id (coordinator in this process).
pub fn unique_id(api: &SynapseApi) -> hcclUniqueId {
    let mut id = hcclUniqueId::default();
    // SAFETY: valid out-pointer.
    hok(api, unsafe { (api.hccl_get_unique_id)(&mut id) });
    id
}

/// One rank: its device, stream and communicator.
pub struct Rank {
    pub api: SynapseApi,
    pub dev: Dev,
    pub stream: synStreamHandle,
    /// The stream as the `void*` HCCL takes.
    pub hs: *mut c_void,
    pub comm: hcclComm_t,
    pub rank: usize,
    pub n: usize,
}

impl Rank {
    /// Acquires a fresh module and joins `id` as `rank` of `n` (panics on failure).
    pub fn join(api: &SynapseApi, id: hcclUniqueId, rank: usize, n: usize) -> Self {
        let dev = Dev::acquire(api, next_module());
        let stream = dev.stream();
        let mut comm = std::ptr::null_mut();
        // SAFETY: valid out-pointer; id by value.
        hok(api, unsafe { (api.hccl_comm_init_rank)(&mut comm, n as i32, id, rank as i32) });
        Self { api: api.clone(), dev, stream, hs: stream.cast(), comm, rank, n }
    }

    /// Device buffer holding `bytes` (at least 1 byte allocated).
    pub fn upload(&self, bytes: &[u8]) -> u64 {
        let a = self.dev.malloc(bytes.len().max(1) as u64);
        if !bytes.is_empty() {
            let h = self.host(bytes.len());
            h.copy_from_slice(bytes);
            ok(
                &self.api,
                self.dev.copy(self.stream, h.as_ptr() as u64, bytes.len() as u64, a, synDmaDir::HOST_TO_DRAM),
            );
            ok(&self.api, self.dev.sync(self.stream));
            self.free_host(h);
        }
        a
    }

    /// `len` bytes at device address `a` (synchronizes the stream; panics on its error).
    pub fn download(&self, a: u64, len: usize) -> Vec<u8> {
        if len == 0 {
            return Vec::new();
        }
        let h = self.host(len);
        ok(&self.api, self.dev.copy(self.stream, a, len as u64, h.as_ptr() as u64, synDmaDir::DRAM_TO_HOST));
        ok(&self.api, self.dev.sync(self.stream));
        let v = h.to_vec();
        self.free_host(h);
        v
    }

    fn host(&self, n: usize) -> &'static mut [u8] {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the returned block holds `n` bytes until freed.
        unsafe {
            ok(&self.api, (self.api.syn_host_malloc)(self.dev.id, n as u64, 0, &mut p));
            std::slice::from_raw_parts_mut(p.cast(), n)
        }
    }

    fn free_host(&self, h: &mut [u8]) {
        // SAFETY: allocated by `host`.
        unsafe { ok(&self.api, (self.api.syn_host_free)(self.dev.id, h.as_ptr().cast(), 0)) };
    }

    /// synStreamSynchronize.
    pub fn sync(&self) -> synStatus {
        self.dev.sync(self.stream)
    }

    /// (hcclCommGetAsyncError's error, hcclCommGetAsyncErrorMessage).
    pub fn async_error(&self) -> (hcclResult_t, String) {
        let mut e = hcclResult_t::SUCCESS;
        // SAFETY: live comm, valid out-pointer; the message is copied at once.
        unsafe {
            hok(&self.api, (self.api.hccl_comm_get_async_error)(self.comm, &mut e));
            let m = CStr::from_ptr((self.api.hccl_comm_get_async_error_message.unwrap())(self.comm));
            (e, m.to_string_lossy().into_owned())
        }
    }

    /// hcclAllReduce on device buffers.
    pub fn all_reduce(&self, s: u64, r: u64, n: usize, t: hcclDataType_t, op: hcclRedOp_t) -> hcclResult_t {
        // SAFETY: device addresses cast to pointers, as the HCCL API expects.
        unsafe { (self.api.hccl_all_reduce)(s as *const c_void, r as *mut c_void, n, t, op, self.comm, self.hs) }
    }

    /// hcclCommDestroy.
    pub fn destroy(&self) -> hcclResult_t {
        // SAFETY: a comm of this table.
        unsafe { (self.api.hccl_comm_destroy)(self.comm) }
    }
}

/// Runs `f` on `n` thread-ranks (`dropcompute::launch::threads`) of one fresh communicator and
/// returns their results in rank order. Communicators are destroyed afterwards.
pub fn world<R: Send>(n: usize, f: impl Fn(&Rank) -> R + Sync) -> Vec<R> {
    let api = setup();
    let id = unique_id(&api);
    let n32 = u32::try_from(n).expect("world size fits u32");
    dropcompute::launch::threads(n32, |r| {
        let rank = Rank::join(&api, id, r as usize, n);
        let out = f(&rank);
        let _ = rank.destroy();
        out
    })
    .into_iter()
    .map(|r| r.expect("rank thread panicked"))
    .collect()
}

/// Every HCCL datatype the mock supports.
pub const DTYPES: [hcclDataType_t; 10] = [
    hcclDataType_t::FLOAT32,
    hcclDataType_t::BFLOAT16,
    hcclDataType_t::FLOAT16,
    hcclDataType_t::INT32,
    hcclDataType_t::UINT32,
    hcclDataType_t::INT8,
    hcclDataType_t::UINT8,
    hcclDataType_t::INT64,
    hcclDataType_t::UINT64,
    hcclDataType_t::FLOAT64,
];

/// Sum, Min, Max.
pub const OPS: [hcclRedOp_t; 3] = [hcclRedOp_t::SUM, hcclRedOp_t::MIN, hcclRedOp_t::MAX];

/// Bytes per element.
pub fn size_of(t: hcclDataType_t) -> usize {
    match t {
        hcclDataType_t::INT8 | hcclDataType_t::UINT8 => 1,
        hcclDataType_t::FLOAT16 | hcclDataType_t::BFLOAT16 => 2,
        hcclDataType_t::INT64 | hcclDataType_t::UINT64 | hcclDataType_t::FLOAT64 => 8,
        _ => 4,
    }
}

/// True for floating-point types.
pub fn is_float(t: hcclDataType_t) -> bool {
    matches!(t, hcclDataType_t::FLOAT32 | hcclDataType_t::BFLOAT16 | hcclDataType_t::FLOAT16 | hcclDataType_t::FLOAT64)
}

/// Deterministic test value of element `i` on rank `r` for type `t`, exactly representable in
/// `t` (floats in [-1, 1) on a 2^-12 grid scaled per rank, ints small).
pub fn value(t: hcclDataType_t, r: usize, i: usize) -> f64 {
    let h = (r as u64 * 0x9E37_79B9 + i as u64 * 0x85EB_CA6B + 12345).wrapping_mul(0xC2B2_AE35) >> 7;
    let k = (h % 4096) as f64;
    match t {
        hcclDataType_t::UINT8 | hcclDataType_t::UINT32 | hcclDataType_t::UINT64 => (h % 100) as f64,
        hcclDataType_t::INT8 | hcclDataType_t::INT32 | hcclDataType_t::INT64 => (h % 100) as f64 - 50.0,
        hcclDataType_t::BFLOAT16 => half::bf16::from_f64((k - 2048.0) / 2048.0 * (1.0 + r as f64 / 7.0)).to_f64(),
        hcclDataType_t::FLOAT16 => half::f16::from_f64((k - 2048.0) / 2048.0 * (1.0 + r as f64 / 7.0)).to_f64(),
        hcclDataType_t::FLOAT32 => ((k - 2048.0) / 2048.0 * (1.0 + r as f64 / 7.0) + 1e-3) as f32 as f64,
        _ => (k - 2048.0) / 2048.0 * (1.0 + r as f64 / 7.0) + 1e-9,
    }
}

/// Encodes `v` as type `t` (native endianness).
pub fn encode(t: hcclDataType_t, v: &[f64]) -> Vec<u8> {
    let mut b = Vec::with_capacity(v.len() * size_of(t));
    for &x in v {
        match t {
            hcclDataType_t::INT8 => b.extend_from_slice(&(x as i64 as i8).to_ne_bytes()),
            hcclDataType_t::UINT8 => b.extend_from_slice(&(x as i64 as u8).to_ne_bytes()),
            hcclDataType_t::INT32 => b.extend_from_slice(&(x as i64 as i32).to_ne_bytes()),
            hcclDataType_t::UINT32 => b.extend_from_slice(&(x as i64 as u32).to_ne_bytes()),
            hcclDataType_t::INT64 => b.extend_from_slice(&(x as i64).to_ne_bytes()),
            hcclDataType_t::UINT64 => b.extend_from_slice(&(x as i64 as u64).to_ne_bytes()),
            hcclDataType_t::FLOAT16 => b.extend_from_slice(&half::f16::from_f64(x).to_ne_bytes()),
            hcclDataType_t::BFLOAT16 => b.extend_from_slice(&half::bf16::from_f64(x).to_ne_bytes()),
            hcclDataType_t::FLOAT32 => b.extend_from_slice(&(x as f32).to_ne_bytes()),
            _ => b.extend_from_slice(&x.to_ne_bytes()),
        }
    }
    b
}

/// Decodes type-`t` elements to f64.
pub fn decode(t: hcclDataType_t, b: &[u8]) -> Vec<f64> {
    b.chunks_exact(size_of(t))
        .map(|c| match t {
            hcclDataType_t::INT8 => c[0] as i8 as f64,
            hcclDataType_t::UINT8 => c[0] as f64,
            hcclDataType_t::INT32 => i32::from_ne_bytes(c.try_into().unwrap()) as f64,
            hcclDataType_t::UINT32 => u32::from_ne_bytes(c.try_into().unwrap()) as f64,
            hcclDataType_t::INT64 => i64::from_ne_bytes(c.try_into().unwrap()) as f64,
            hcclDataType_t::UINT64 => u64::from_ne_bytes(c.try_into().unwrap()) as f64,
            hcclDataType_t::FLOAT16 => half::f16::from_ne_bytes([c[0], c[1]]).to_f64(),
            hcclDataType_t::BFLOAT16 => half::bf16::from_ne_bytes([c[0], c[1]]).to_f64(),
            hcclDataType_t::FLOAT32 => f32::from_ne_bytes(c.try_into().unwrap()) as f64,
            _ => f64::from_ne_bytes(c.try_into().unwrap()),
        })
        .collect()
}

/// Rank `r`'s input of `count` elements.
pub fn input(t: hcclDataType_t, r: usize, count: usize) -> Vec<f64> {
    (0..count).map(|i| value(t, r, i)).collect()
}

/// The f64 reference of reducing element `i` over `n` ranks, wrapped to the integer type's
/// range for integer sums (two's complement, as the device).
pub fn reference(t: hcclDataType_t, op: hcclRedOp_t, n: usize, i: usize) -> f64 {
    let xs: Vec<f64> = (0..n).map(|r| value(t, r, i)).collect();
    match op {
        hcclRedOp_t::MIN => xs.iter().cloned().fold(f64::INFINITY, f64::min),
        hcclRedOp_t::MAX => xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        _ if is_float(t) => xs.iter().sum(),
        _ => {
            let s: i64 = xs.iter().map(|&x| x as i64).sum();
            decode(t, &encode(t, &[s as f64]))[0]
        }
    }
}

/// Allowed |result - reference| for a sum of `n` values of type `t`: f32 accumulation error
/// n·2^-24·Σ|x| (f64: 2^-53), plus one final rounding to `t` (half an ulp, relative 2^-8 for
/// bf16, 2^-11 for f16) and f16's subnormal spacing. Integers, Min and Max: exact.
pub fn tolerance(t: hcclDataType_t, op: hcclRedOp_t, n: usize, i: usize) -> f64 {
    if op != hcclRedOp_t::SUM || !is_float(t) {
        return 0.0;
    }
    let abs: f64 = (0..n).map(|r| value(t, r, i).abs()).sum();
    let refv = reference(t, op, n, i).abs();
    let (acc, out, floor) = match t {
        hcclDataType_t::FLOAT64 => (2f64.powi(-53), 0.0, 0.0),
        hcclDataType_t::BFLOAT16 => (2f64.powi(-24), 2f64.powi(-8), 1e-38),
        hcclDataType_t::FLOAT16 => (2f64.powi(-24), 2f64.powi(-11), 6e-8),
        _ => (2f64.powi(-24), 2f64.powi(-24), 0.0),
    };
    n as f64 * acc * abs + out * refv + floor
}

/// Spawns this test binary running test `test` with `env` (a child role) and none of the
/// product's other variables (`hermetic::test_child`).
pub fn spawn_child(test: &str, env: &[(&str, String)]) -> Child {
    let mut c = super::hermetic::test_child();
    c.args(["--exact", test, "--ignored", "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().expect("spawn child test process")
}

/// Waits for `child` up to `limit`, killing it past that; returns (exit code, success, output).
pub fn wait_child(mut child: Child, limit: Duration) -> (Option<i32>, bool, String) {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            return (st.code(), st.success(), text);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            panic!("child did not finish within {limit:?}:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Hex of a raw unique id's used bytes (the length is the digit count / 2) for a child's
/// environment: the same text as `dropcompute::hccl::UniqueId`'s `Display`, via the `hex` crate
/// because these tests hold the raw `hcclUniqueId` of the C API.
pub fn id_hex(id: &hcclUniqueId) -> String {
    hex::encode(&id.internal[..id.length])
}

/// Inverse of [`id_hex`].
pub fn id_from_hex(s: &str) -> hcclUniqueId {
    let mut id = hcclUniqueId::default();
    let bytes = hex::decode(s).expect("hex unique id");
    id.internal[..bytes.len()].copy_from_slice(&bytes);
    id.length = bytes.len();
    id
}
