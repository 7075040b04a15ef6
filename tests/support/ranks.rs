//! Thread-ranks over the safe collectives layer, shared by the HCCL test files: each rank
//! acquires its own mock device, creates a stream and joins one communicator.
//!
//! The including test file must have a `hermetic` module (`support/hermetic.rs`) at its root:
//! [`serial`] and [`runtime`] remove the product's variables from the process first, so the
//! calling shell's `DROPCOMPUTE_MOCK_DEVICES`, `HLS_MODULE_ID`... do not reach the mock.
#![allow(dead_code)]

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use dropcompute::hccl::{Comm, CommOptions, HcclType};
use dropcompute::mock::{self, Fault, MockControl};
use dropcompute::synapse::{Device, DeviceBuffer, HostBuffer, Runtime, Stream};

/// The mock is process-global: tests take turns; each turn starts with no fault armed.
pub fn serial() -> MutexGuard<'static, ()> {
    super::hermetic::scrub_process_env();
    static L: Mutex<()> = Mutex::new(());
    let g = L.lock().unwrap_or_else(|p| p.into_inner());
    MockControl::in_process().inject_fault(&Fault::ClearAll).unwrap();
    g
}

/// The process's runtime over the in-process mock.
pub fn runtime() -> &'static Arc<Runtime> {
    static RT: OnceLock<Arc<Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        super::hermetic::scrub_process_env();
        Runtime::new(mock::api()).unwrap()
    })
}

/// Runs `f(rank, comm, stream)` on `n` thread-ranks of `rt` (`dropcompute::launch::threads`),
/// each on its own device.
pub fn with_ranks<R: Send>(
    rt: &Arc<Runtime>,
    n: u32,
    o: CommOptions,
    f: impl Fn(u32, &Comm, &Stream) -> R + Sync,
) -> Vec<R> {
    let id = Comm::unique_id(rt).unwrap();
    dropcompute::launch::threads(n, |rank| {
        let dev = Device::acquire_any(rt).unwrap();
        let stream = Stream::new(&dev).unwrap();
        let comm = Comm::init_rank(&dev, n, &id, rank, o.clone()).unwrap();
        f(rank, &comm, &stream)
    })
    .into_iter()
    .map(|r| r.expect("rank thread panicked"))
    .collect()
}

/// A device copy of `data` (waits for nothing: the stream orders later work after it).
pub fn upload<T: HcclType>(stream: &Stream, data: &[T]) -> DeviceBuffer<T> {
    let dev = stream.device();
    let mut d = DeviceBuffer::alloc(dev, data.len()).unwrap();
    stream.copy_h2d(&HostBuffer::from_slice(dev, data).unwrap(), &mut d).unwrap();
    d
}

/// The host copy of `d` (waits for the stream).
pub fn download<T: HcclType>(stream: &Stream, d: &DeviceBuffer<T>) -> Vec<T> {
    let mut h = HostBuffer::zeroed(stream.device(), d.len()).unwrap();
    stream.copy_d2h(d, &mut h).unwrap();
    h.to_vec().unwrap()
}
