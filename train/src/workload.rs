//! The MLP as the scheduler drives it: per-rank device state (parameters, momentum, input
//! staging, loss accumulator) and the launches of the forward/backward and SGD graphs
//! (`model_graphs`). The data it is fed is dealt by the core's `dropcompute::deal`.
//!
//! Owns: [`MlpWorkload`] (implements `schedule::Workload`). Must not touch: the data dealing, the deadline, the collectives of the step (the
//! scheduler owns them), the graphs themselves (`model_graphs`), or host-side model math
//! (`mlp`, the reference the graphs are tested against).
#![forbid(unsafe_code)]

use std::sync::Arc;

use super::model_graphs::{MlpGraphs, stage_labels};
use dropcompute::schedule::{GradientScratch, MicroBatch, Workload, WorkloadError};
use dropcompute::synapse::{DeviceBuffer, HostBuffer, Result, Stream};

use super::data::Dataset;
use super::mlp::MlpShape;

/// Hyper-parameters of the model and its optimizer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlpHyper {
    /// Layer sizes.
    pub shape: MlpShape,
    /// Rows per micro-batch (b).
    pub micro_batch_size: usize,
    /// SGD learning rate.
    pub lr: f32,
    /// SGD momentum.
    pub momentum: f32,
    /// Weight decay.
    pub weight_decay: f32,
    /// The tail shape's split S (`policy::TailShape`): with S > 1 a second forward/backward
    /// graph is compiled for b/S rows and runs every micro-batch of at most b/S samples. 1 (or
    /// 0): one shape.
    pub tail_split: usize,
}

/// One rank's MLP on its device.
pub struct MlpWorkload {
    /// This rank (for the test crash hook only).
    pub rank: u32,
    hyper: MlpHyper,
    data: Arc<Dataset>,
    graphs: MlpGraphs,
    params: DeviceBuffer<f32>,
    velocity: DeviceBuffer<f32>,
    x: DeviceBuffer<f32>,
    labels: DeviceBuffer<i32>,
    /// 1 for a sample, 0 for a padding row ([`stage_labels`]).
    mask: DeviceBuffer<f32>,
    /// The tail shape (`MlpHyper::tail_split` > 1): its graphs and input buffers of b/S rows.
    tail: Option<TailModel>,
    /// `[loss sum, rows]` accumulated by the forward/backward graph since the last read.
    pub loss: DeviceBuffer<f32>,
    staged: Vec<(HostBuffer<f32>, HostBuffer<i32>, HostBuffer<f32>)>,
}

impl MlpWorkload {
    /// Builds and compiles the graphs ([`MlpGraphs::build`]) for `stream`'s device, allocates
    /// the device state there and uploads `params` and `velocity` (each `shape.param_len()`
    /// f32).
    ///
    /// # Errors
    /// [`dropcompute::synapse::Error`] from building or compiling the graphs, allocation or the
    /// copies; `InvalidArgument` when a state vector has the wrong length.
    pub fn new(stream: &Stream, hyper: MlpHyper, data: Arc<Dataset>, params: &[f32], velocity: &[f32]) -> Result<Self> {
        let p = hyper.shape.param_len();
        if params.len() != p || velocity.len() != p {
            return Err(dropcompute::synapse::Error::InvalidArgument {
                what: "model state length",
                value: format!("{} params, {} velocity, expected {p}", params.len(), velocity.len()),
            });
        }
        let dev = stream.device();
        let b = hyper.micro_batch_size;
        let graphs = MlpGraphs::build(dev, hyper.shape, b, hyper.lr, hyper.momentum, hyper.weight_decay)?;
        let tail = match hyper.tail_split {
            s if s > 1 => {
                let rows = (b / s).max(1);
                Some(TailModel {
                    graphs: MlpGraphs::build(dev, hyper.shape, rows, hyper.lr, hyper.momentum, hyper.weight_decay)?,
                    rows,
                    x: DeviceBuffer::alloc(dev, rows * hyper.shape.input)?,
                    labels: DeviceBuffer::alloc(dev, rows)?,
                    mask: DeviceBuffer::alloc(dev, rows)?,
                })
            }
            _ => None,
        };
        let mut w = Self {
            graphs,
            params: DeviceBuffer::alloc(dev, p)?,
            velocity: DeviceBuffer::alloc(dev, p)?,
            x: DeviceBuffer::alloc(dev, b * hyper.shape.input)?,
            labels: DeviceBuffer::alloc(dev, b)?,
            mask: DeviceBuffer::alloc(dev, b)?,
            tail,
            loss: DeviceBuffer::alloc(dev, 2)?,
            staged: Vec::new(),
            rank: 0,
            hyper,
            data,
        };
        w.set_state(stream, params, velocity)?;
        w.zero_loss(stream)?;
        Ok(w)
    }

    /// Overwrites parameters and momentum (e.g. from a checkpoint) and waits for the copies.
    ///
    /// # Errors
    /// [`dropcompute::synapse::Error`] from the copies.
    pub fn set_state(&mut self, stream: &Stream, params: &[f32], velocity: &[f32]) -> Result<()> {
        let dev = stream.device();
        stream.copy_h2d(&HostBuffer::from_slice(dev, params)?, &mut self.params)?;
        stream.copy_h2d(&HostBuffer::from_slice(dev, velocity)?, &mut self.velocity)?;
        stream.synchronize()
    }

    /// Reads parameters and momentum back (waits for the stream).
    ///
    /// # Errors
    /// [`dropcompute::synapse::Error`] from the copies.
    pub fn state(&self, stream: &Stream) -> Result<(Vec<f32>, Vec<f32>)> {
        let dev = stream.device();
        let p = self.hyper.shape.param_len();
        let (mut hp, mut hv) = (HostBuffer::zeroed(dev, p)?, HostBuffer::zeroed(dev, p)?);
        stream.copy_d2h(&self.params, &mut hp)?;
        stream.copy_d2h(&self.velocity, &mut hv)?;
        Ok((hp.to_vec()?, hv.to_vec()?))
    }

    /// Enqueues `loss = [0, 0]`.
    ///
    /// # Errors
    /// [`dropcompute::synapse::Error`] from the copy.
    pub fn zero_loss(&mut self, stream: &Stream) -> Result<()> {
        let h = HostBuffer::from_slice(stream.device(), &[0f32, 0f32])?;
        stream.copy_h2d(&h, &mut self.loss)?;
        stream.synchronize()
    }
}

/// The second compiled shape of [`MlpWorkload`]: the forward/backward graph and its inputs for
/// `rows` = b/S rows.
struct TailModel {
    graphs: MlpGraphs,
    rows: usize,
    x: DeviceBuffer<f32>,
    labels: DeviceBuffer<i32>,
    mask: DeviceBuffer<f32>,
}

fn mb_error(e: impl std::error::Error + Send + Sync + 'static) -> WorkloadError {
    Box::new(e)
}

impl Workload for MlpWorkload {
    fn launch_micro_batch(
        &mut self,
        stream: &Stream,
        step: u64,
        index: u32,
        mb: &MicroBatch,
        grad: &mut GradientScratch,
    ) -> std::result::Result<(), WorkloadError> {
        crash_hook(self.rank, step, index);
        let dev = stream.device();
        set_latency_key(dev.module_id(), step, index)?;
        // A micro-batch that fits the tail shape runs on it (fewer rows: less device time).
        let tail = self.tail.as_mut().filter(|t| mb.sample_ids.len() <= t.rows);
        let rows = tail.as_ref().map_or(self.hyper.micro_batch_size, |t| t.rows);
        let (x, y) = self.data.rows_padded(&mb.sample_ids, rows).map_err(mb_error)?;
        if self.staged.len() >= 16 {
            self.staged.clear(); // each drop waits for its copy: bounded host memory
        }
        let (y, mask) = stage_labels(&y);
        let (hx, hy, hm) =
            (HostBuffer::from_slice(dev, &x)?, HostBuffer::from_slice(dev, &y)?, HostBuffer::from_slice(dev, &mask)?);
        let g = grad.as_f32_mut().ok_or("the MLP writes f32 gradients")?;
        let (graphs, x, labels, mask) = match tail {
            Some(t) => (&t.graphs, &mut t.x, &mut t.labels, &mut t.mask),
            None => (&self.graphs, &mut self.x, &mut self.labels, &mut self.mask),
        };
        stream.copy_h2d(&hx, x)?;
        stream.copy_h2d(&hy, labels)?;
        stream.copy_h2d(&hm, mask)?;
        graphs.launch_forward_backward(stream, &self.params, x, labels, mask, g, &self.loss)?;
        self.staged.push((hx, hy, hm));
        Ok(())
    }

    fn launch_optimizer(
        &mut self,
        stream: &Stream,
        _step: u64,
        grad: &DeviceBuffer<f32>,
    ) -> std::result::Result<(), WorkloadError> {
        self.graphs.launch_sgd(stream, &self.params, &self.velocity, grad)?;
        Ok(())
    }

    fn compute_done(&mut self, stream: &Stream, step: u64) -> std::result::Result<(), WorkloadError> {
        // The step's end launches (non-finite check, rescale, update) draw under one key,
        // whichever micro-batch this run launched last.
        set_latency_key(stream.device().module_id(), step, STEP_END)?;
        Ok(())
    }
}

/// Test hook: `$DROPCOMPUTE_TEST_SIGKILL_AT=STEP[:RANK]` makes the process SIGKILL itself
/// while rank RANK (any rank if omitted) launches the first micro-batch of step STEP (0-based),
/// i.e. after STEP steps completed, in the middle of its compute phase. Used by the
/// crash-and-resume and killed-rank tests: no handler runs, nothing is flushed.
/// `micro_batch` value of the latency key that covers a step's launches before its first
/// micro-batch (gradient zeroing).
pub const STEP_START: u32 = u32::MAX;

/// `micro_batch` value of the latency key that covers a step's launches after its last
/// micro-batch (non-finite check, rescale, optimizer update: `Workload::compute_done`).
pub const STEP_END: u32 = u32::MAX - 1;

/// Where [`set_latency_key`] sends the keys: the emulated device `train::run::runtime`
/// selected. One backend per process (every rank of a process shares it).
#[derive(Clone, Copy, Debug)]
pub enum LatencyKeys {
    /// The in-process mock (a lock and a store per key; the default).
    InProcess,
    /// The mock shared library loaded as libSynapse, through its `dcmock_inject_fault`
    /// (`Fault::LatencyKey` as JSON).
    Library(dropcompute::mock::MockControl),
    /// A real device: no keys.
    Off,
}

static LATENCY_KEYS: std::sync::RwLock<LatencyKeys> = std::sync::RwLock::new(LatencyKeys::InProcess);

/// Sets where this process's latency keys go (called by `train::run::runtime` and
/// `train::run::mock_runtime` when they select the device).
pub fn route_latency_keys(to: LatencyKeys) {
    *LATENCY_KEYS.write().unwrap_or_else(std::sync::PoisonError::into_inner) = to;
}

/// Common random numbers: tells the mock that what follows on `module_id` belongs to
/// micro-batch `micro_batch` of `step` ([`STEP_START`]: the step's start), so its latencies are
/// a pure function of (seed, module, step, micro-batch, recipe): the baseline and DropCompute
/// runs see the same latency for every micro-batch both compute, whatever was dropped before,
/// in both time modes and across a resume (`habana_mock` `Fault::LatencyKey`). The key goes to
/// the emulated device the job runs on ([`route_latency_keys`]); a real device, or a device
/// without a module id, is left alone.
///
/// # Errors
/// The mock's rejection (a module id it does not have), as a message.
pub fn set_latency_key(module_id: Option<u32>, step: u64, micro_batch: u32) -> Result<(), String> {
    let Some(module_id) = module_id else { return Ok(()) };
    let to = *LATENCY_KEYS.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    match to {
        LatencyKeys::InProcess => dropcompute::mock::set_latency_key(module_id, step, micro_batch),
        LatencyKeys::Library(c) => {
            c.inject_fault(&dropcompute::mock::Fault::LatencyKey { module_id, step, micro_batch })
        }
        LatencyKeys::Off => return Ok(()),
    }
    .map_err(|e| format!("latency key: {e}"))
}

fn crash_hook(rank: u32, step: u64, micro_batch: u32) {
    static AT: std::sync::OnceLock<Option<(u64, Option<u32>)>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        let v = std::env::var(dropcompute::environment::ENV_TEST_SIGKILL_AT).ok()?;
        dropcompute::environment::parse_sigkill_at(&v).ok()
    });
    if let Some((s, r)) = *at
        && s == step
        && micro_batch == 0
        && r.is_none_or(|r| r == rank)
    {
        let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
        std::thread::sleep(std::time::Duration::from_secs(5));
    }
}
