//! Device and pinned host memory, and the copies between them.
//!
//! Owns: [`DeviceRepr`] (the element types a device buffer may hold), [`DeviceBuffer`],
//! [`HostBuffer`], and the stream-ordered copies `Stream::copy_*`.
//! Must not touch: launches or collectives (they only borrow buffers' device addresses).
//!
//! Soundness of asynchronous copies: a copy reads or writes the host buffer after the call
//! returns. Each copy therefore records an event on its stream, and every host access
//! (`as_slice`, `as_mut_slice`, drop) first waits for those events (the cudarc pinned-memory
//! rule).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::time::Duration;

use habana_sys::{synDataType, synDmaDir};

use super::error::{DropResult, Error, Result};
use super::result::{self, MemsetValue};
use super::runtime::Device;
use super::stream::{Event, Stream};

mod sealed {
    pub trait Sealed {}
}

/// Element types that may live in device memory: `f32`, `half::bf16`, `half::f16`, `i32`,
/// `u32` (the types HCCL reduces; the trait is sealed). Every bit pattern is a valid value, so
/// zero-filled or device-written memory can be read as `Self`.
pub trait DeviceRepr: sealed::Sealed + Copy + Send + Sync + Default + 'static {
    /// The Synapse data type tag.
    const SYN_TYPE: synDataType;
    /// Human-readable name ("f32", "bf16", ...).
    const NAME: &'static str;
    /// The bits of `self` as the device memset of its width (D8, D16 or D32).
    fn memset_value(self) -> MemsetValue;
}

macro_rules! device_repr {
    ($t:ty, $tag:ident, $name:literal, $fill:expr) => {
        impl sealed::Sealed for $t {}
        impl DeviceRepr for $t {
            const SYN_TYPE: synDataType = synDataType::$tag;
            const NAME: &'static str = $name;
            fn memset_value(self) -> MemsetValue {
                $fill(self)
            }
        }
    };
}
device_repr!(f32, SINGLE, "f32", |v: f32| MemsetValue::D32(v.to_bits()));
device_repr!(half::bf16, BF16, "bf16", |v: half::bf16| MemsetValue::D16(v.to_bits()));
device_repr!(half::f16, FP16, "f16", |v: half::f16| MemsetValue::D16(v.to_bits()));
device_repr!(i32, INT32, "i32", |v: i32| MemsetValue::D32(u32::from_ne_bytes(v.to_ne_bytes())));
device_repr!(u32, UINT32, "u32", MemsetValue::D32);
device_repr!(u8, UINT8, "u8", MemsetValue::D8);

/// Bytes to allocate for `len` elements of `T`.
///
/// # Errors
/// [`Error::InvalidArgument`] (named `what`) for `len == 0` or a byte size overflowing `usize`.
fn alloc_bytes<T>(what: &'static str, len: usize) -> Result<u64> {
    len.checked_mul(size_of::<T>())
        .filter(|&b| b > 0)
        .map(|b| b as u64)
        .ok_or_else(|| Error::InvalidArgument { what, value: len.to_string() })
}

/// `len` elements of `T` in device memory (`synDeviceMalloc`). The address is a device address
/// (`u64`), not a host pointer.
///
/// [`DeviceBuffer::free`] synchronizes the device first; `Drop` frees without waiting (best
/// effort; freeing memory that queued work still uses is a caller bug on hardware).
#[derive(Debug)]
pub struct DeviceBuffer<T: DeviceRepr> {
    dev: Device,
    addr: u64,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: DeviceRepr> DeviceBuffer<T> {
    /// Allocates `len` elements (`len * size_of::<T>()` bytes, 128-byte aligned) without
    /// initializing them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `len == 0` or a byte size overflowing u64;
    /// [`Error::Synapse`] (`synOutOfDeviceMemory`, ...) from the runtime.
    pub fn alloc(dev: &Device, len: usize) -> Result<Self> {
        let bytes = alloc_bytes::<T>("device buffer length", len)?;
        let addr = result::device_malloc(dev.api(), dev.id(), bytes)?;
        Ok(Self { dev: dev.clone(), addr, len, _t: PhantomData })
    }

    /// The device address of element 0.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (zero-length buffers cannot be allocated).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Waits for the device, then frees the memory.
    ///
    /// # Errors
    /// Hands the buffer back when synchronization or `synDeviceFree` fails.
    pub fn free(mut self) -> DropResult<Self> {
        if let Err(e) = self.dev.synchronize() {
            return Err((e, self));
        }
        match result::device_free(self.dev.api(), self.dev.id(), self.addr) {
            Ok(()) => {
                self.addr = 0;
                Ok(())
            }
            Err(e) => Err((e, self)),
        }
    }
}

impl<T: DeviceRepr> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.addr == 0 {
            return;
        }
        if let Err(e) = result::device_free(self.dev.api(), self.dev.id(), self.addr) {
            tracing::warn!(device = self.dev.id(), addr = self.addr, error = %e, "best-effort device free failed");
        }
    }
}

/// How long a host buffer's `Drop` waits for in-flight copies before leaking the memory rather
/// than freeing it under a running copy.
pub const HOST_DROP_TIMEOUT: Duration = Duration::from_secs(30);

/// `len` elements of pinned host memory (`synHostMalloc`), zero-initialized, usable as the host
/// side of asynchronous copies.
///
/// `Send` but not `Sync` (it tracks in-flight copies in a `RefCell`).
#[derive(Debug)]
pub struct HostBuffer<T: DeviceRepr> {
    dev: Device,
    ptr: *mut T,
    len: usize,
    pending: RefCell<Vec<Event>>,
}

// SAFETY: the buffer owns its memory exclusively (like a `Vec<T>` with `T: Send`); the pending
// events are `Send`; no `Sync`, so the `RefCell` is never shared.
unsafe impl<T: DeviceRepr> Send for HostBuffer<T> {}

impl<T: DeviceRepr> HostBuffer<T> {
    /// Allocates `len` zeroed elements of pinned host memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `len == 0` or overflow; [`Error::Synapse`]
    /// (`synOutOfHostMemory`, ...).
    pub fn zeroed(dev: &Device, len: usize) -> Result<Self> {
        let bytes = alloc_bytes::<T>("host buffer length", len)?;
        let p = result::host_malloc(dev.api(), dev.id(), bytes)?;
        if p.is_null() || !(p as usize).is_multiple_of(align_of::<T>()) {
            return Err(Error::InvalidArgument { what: "synHostMalloc result", value: format!("{p:p}") });
        }
        let ptr = p.cast::<T>();
        // SAFETY: `ptr` is a fresh, suitably aligned allocation of `len` elements (checked above);
        // zero bits are a valid `T` for every `DeviceRepr`.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(Self { dev: dev.clone(), ptr, len, pending: RefCell::new(Vec::new()) })
    }

    /// Allocates a buffer holding a copy of `data`.
    ///
    /// # Errors
    /// As [`HostBuffer::zeroed`].
    pub fn from_slice(dev: &Device, data: &[T]) -> Result<Self> {
        let mut b = Self::zeroed(dev, data.len())?;
        b.as_mut_slice()?.copy_from_slice(data);
        Ok(b)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (zero-length buffers cannot be allocated).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host address as the `u64` the copy API takes.
    pub fn host_addr(&self) -> u64 {
        self.ptr as u64
    }

    fn wait_pending(&self) -> Result<()> {
        let mut pending = self.pending.borrow_mut();
        for ev in pending.iter() {
            ev.synchronize()?;
        }
        pending.clear();
        Ok(())
    }

    /// The contents, after waiting for every copy that uses this buffer.
    ///
    /// # Errors
    /// The asynchronous error of a copy, if one failed.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.wait_pending()?;
        // SAFETY: no copy is in flight (waited above), `ptr` is valid for `len` initialized
        // elements, and the borrow of `self` keeps it alive and unmodified.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// The contents, mutably, after waiting for every copy that uses this buffer.
    ///
    /// # Errors
    /// The asynchronous error of a copy, if one failed.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.wait_pending()?;
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    /// Copies the contents into a `Vec`.
    ///
    /// # Errors
    /// As [`HostBuffer::as_slice`].
    pub fn to_vec(&self) -> Result<Vec<T>> {
        Ok(self.as_slice()?.to_vec())
    }

    fn track(&self, stream: &Stream) -> Result<()> {
        let ev = Event::new(stream.device(), false)?;
        ev.record(stream)?;
        self.pending.borrow_mut().push(ev);
        Ok(())
    }
}

impl<T: DeviceRepr> Drop for HostBuffer<T> {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + HOST_DROP_TIMEOUT;
        for ev in self.pending.get_mut().iter() {
            loop {
                match ev.is_complete() {
                    Ok(true) | Err(_) => break,
                    Ok(false) if std::time::Instant::now() > deadline => {
                        tracing::warn!(device = self.dev.id(), "host buffer still used by a copy; leaking it");
                        return;
                    }
                    Ok(false) => std::thread::sleep(Duration::from_micros(200)),
                }
            }
        }
        // SAFETY: allocated by synHostMalloc on this device; no copy is in flight (waited above).
        if let Err(e) = unsafe { result::host_free(self.dev.api(), self.dev.id(), self.ptr.cast()) } {
            tracing::warn!(device = self.dev.id(), error = %e, "best-effort host free failed");
        }
    }
}

fn same_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got { Ok(()) } else { Err(Error::SizeMismatch { what, expected, got }) }
}

fn same_device(stream: &Stream, dev: &Device) -> Result<()> {
    if stream.device().id() == dev.id() {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            what: "buffer device",
            value: format!("buffer on device {} used on a stream of device {}", dev.id(), stream.device().id()),
        })
    }
}

impl Stream {
    /// `synMemCopyAsync` of `bytes` bytes on this stream.
    ///
    /// # Safety
    /// As [`result::mem_copy_async`]: the host side (if any) is pinned and stays valid for the copy.
    unsafe fn enqueue_copy(&self, src: u64, bytes: usize, dst: u64, dir: synDmaDir) -> Result<()> {
        // SAFETY: the stream is live for the life of `self`; the rest is the caller's contract.
        unsafe { result::mem_copy_async(self.device().api(), self.raw(), src, bytes as u64, dst, dir) }
    }

    /// Enqueues a host-to-device copy of all of `src` into `dst` (same length).
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] when lengths differ, [`Error::InvalidArgument`] across devices
    /// (both checked before any C call); [`Error::Synapse`].
    pub fn copy_h2d<T: DeviceRepr>(&self, src: &HostBuffer<T>, dst: &mut DeviceBuffer<T>) -> Result<()> {
        same_len("copy_h2d element count", dst.len, src.len)?;
        same_device(self, &dst.dev)?;
        // SAFETY: `src` is pinned memory of `bytes` bytes that stays valid and unmodified until
        // the tracked event completes (see the module doc); `dst` is a live device allocation.
        unsafe { self.enqueue_copy(src.host_addr(), dst.bytes(), dst.addr, synDmaDir::HOST_TO_DRAM) }?;
        src.track(self)
    }

    /// Enqueues a device-to-host copy of all of `src` into `dst` (same length). Read `dst` with
    /// [`HostBuffer::as_slice`], which waits for the copy.
    ///
    /// # Errors
    /// As [`Stream::copy_h2d`].
    pub fn copy_d2h<T: DeviceRepr>(&self, src: &DeviceBuffer<T>, dst: &mut HostBuffer<T>) -> Result<()> {
        same_len("copy_d2h element count", dst.len, src.len)?;
        same_device(self, &src.dev)?;
        // SAFETY: as in `copy_h2d`; `&mut dst` plus the tracked event keep the host memory
        // exclusive to the copy until it completes.
        unsafe { self.enqueue_copy(src.addr, src.bytes(), dst.host_addr(), synDmaDir::DRAM_TO_HOST) }?;
        dst.track(self)
    }

    /// Enqueues a fill of elements `range` of `buf` with `value` on this stream
    /// (`synMemsetD8Async`, `synMemsetD16Async` or `synMemsetD32Async` by the element width:
    /// the value's bits are repeated, so `0.0f32` zeroes and `1.5f32` writes 1.5).
    ///
    /// # Errors
    /// Before any C call: [`Error::InvalidArgument`] for a range that is reversed or ends past
    /// `buf.len()` (naming both) or a buffer of another device. [`Error::Synapse`] when the
    /// runtime rejects the fill.
    pub fn fill<T: DeviceRepr>(
        &self,
        buf: &mut DeviceBuffer<T>,
        range: std::ops::Range<usize>,
        value: T,
    ) -> Result<()> {
        same_device(self, &buf.dev)?;
        if range.start > range.end || range.end > buf.len {
            return Err(Error::InvalidArgument {
                what: "fill range",
                value: format!("elements {range:?} of a {} buffer of {} elements", T::NAME, buf.len),
            });
        }
        let addr = buf.addr + (range.start * size_of::<T>()) as u64;
        // SAFETY: the stream is live for the life of `self`; the range lies inside the live
        // allocation `buf`, borrowed mutably for the call (checked above).
        unsafe { result::memset_async(self.device().api(), self.raw(), addr, value.memset_value(), range.len()) }
    }

    /// Enqueues a device-to-device copy of all of `src` into `dst` (same length).
    ///
    /// # Errors
    /// As [`Stream::copy_h2d`].
    pub fn copy_d2d<T: DeviceRepr>(&self, src: &DeviceBuffer<T>, dst: &mut DeviceBuffer<T>) -> Result<()> {
        same_len("copy_d2d element count", dst.len, src.len)?;
        same_device(self, &src.dev)?;
        same_device(self, &dst.dev)?;
        // SAFETY: both addresses are live device allocations of `bytes` bytes; no host memory.
        unsafe { self.enqueue_copy(src.addr, src.bytes(), dst.addr, synDmaDir::DRAM_TO_DRAM) }
    }
}
