//! `dropcompute info`: which backend is in use, its version and devices, and a short self-check
//! that drives one device through the function table (copy round trip through a one-node device
//! graph: compile time, recipe cache load time, launch device time).
//!
//! Owns: [`Args`], [`run`] and the self-check's output. Must not touch: backend selection rules
//! (`synapse::BackendChoice`) or the devices beyond this read-only check.
#![forbid(unsafe_code)]

use std::time::Duration;

use super::{BackendArgs, BoxError, CommandError};
#[cfg(feature = "mock")]
use dropcompute::mock::MockControl;
use dropcompute::synapse::graph::{DType, GraphArg, GraphBuilder, Op, RecipeCache, RecipeOrigin, TensorId};
use dropcompute::synapse::{Device, DeviceBuffer, Event, HostBuffer, Runtime, Stream};

/// Arguments of `dropcompute info`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Backend selection.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Skip the device self-check.
    #[arg(long)]
    pub no_check: bool,
}

/// Prints the backend, its version, the devices and one device's type and memory, then runs the
/// self-check unless `--no-check`.
///
/// # Errors
/// Backend selection ([`BackendArgs::select`]); [`CommandError::Env`] for a `LOCAL_RANK` that is
/// not a number when `HLS_MODULE_ID`/`HABANA_VISIBLE_MODULES` pin the device; `synapse::Error`
/// from the runtime and device calls; [`CommandError::SelfCheck`] when the copy round trip
/// returns different data.
pub fn run(args: &Args) -> Result<(), BoxError> {
    let backend = args.backend.select()?;
    // The mock's environment (DROPCOMPUTE_MOCK_*) is checked before any device call, so a bad
    // value is a usage error naming the variable (exit 2), not a failed synInitialize.
    #[cfg(feature = "mock")]
    if backend.is_mock() || backend.library_path().is_some_and(|p| MockControl::from_library(p).is_ok()) {
        dropcompute::mock::MockConfig::from_env()?;
    }
    super::say(&format!("backend:  {}\n", backend.describe()))?;
    if let Some(note) = &backend.note {
        super::say(&format!("note:     {note}\n"))?;
    }
    super::say(&format!(
        "version:  {}\n",
        backend.api.version().unwrap_or("unknown (synDriverGetVersion not exported)")
    ))?;
    let rt = Runtime::new(backend.api.clone())?;
    let ids = rt.module_ids()?;
    let shown: Vec<String> = ids.iter().take(16).map(u32::to_string).collect();
    let more = if ids.len() > 16 { format!(", ... {} more", ids.len() - 16) } else { String::new() };
    super::say(&format!("devices:  {} (module ids {}{more})\n", rt.device_count()?, shown.join(", ")))?;
    // The vendor's selection (HLS_MODULE_ID, else HABANA_VISIBLE_MODULES[LOCAL_RANK]) when set.
    let pinned = ["HLS_MODULE_ID", "HABANA_VISIBLE_MODULES"].iter().any(|v| std::env::var_os(v).is_some());
    let dev = if pinned {
        let local_rank = match std::env::var("LOCAL_RANK") {
            // The launcher's one parser (the environment table checked it before this call).
            Ok(v) => dropcompute::hccl::bootstrap::parse_count(&v).map_err(|_| CommandError::Env {
                variable: "LOCAL_RANK",
                value: v.clone(),
                why: "not a rank",
            })?,
            Err(_) => 0,
        };
        Device::acquire_for_local_rank(&rt, local_rank)?
    } else {
        // The first free module by id, so the module id is known and shown (module ids start at
        // 0 on Gaudi); when none can be acquired, `synDeviceAcquire` reports why.
        match ids.iter().find_map(|&m| Device::acquire(&rt, m).ok()) {
            Some(d) => d,
            None => Device::acquire_any(&rt)?,
        }
    };
    let info = dev.info()?;
    let (free, total) = dev.memory_info()?;
    super::say(&format!(
        "device:   id {} module {} type {} HBM {:.1} GiB ({:.1} GiB free)\n",
        dev.id(),
        dev.module_id().map_or("?".to_string(), |m| m.to_string()),
        info.device_type.name().unwrap_or("unknown"),
        total as f64 / (1u64 << 30) as f64,
        free as f64 / (1u64 << 30) as f64
    ))?;
    if args.no_check {
        return Ok(());
    }
    let check = self_check(&rt, &dev)?;
    super::say(&format!("check:    {check}\n"))?;
    Ok(())
}

/// Copies 1 MiB host -> device, runs it through a one-node device graph (relu of non-negative
/// values: the identity) into a second buffer, copies it back and compares. The graph is
/// compiled through a recipe cache in a temporary directory, then built again and loaded from
/// the cache, so the report gives the compile time, the cache load time and the launch's
/// device time from events (on any backend: the real runtime compiles the vendor GUID).
fn self_check(rt: &std::sync::Arc<Runtime>, dev: &Device) -> Result<String, BoxError> {
    let n = 1 << 18;
    let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let s = Stream::new(dev)?;
    let host = HostBuffer::from_slice(dev, &data)?;
    let mut a = DeviceBuffer::<f32>::alloc(dev, n)?;
    let b = DeviceBuffer::<f32>::alloc(dev, n)?;
    let (t0, t1, t2) = (Event::new(dev, true)?, Event::new(dev, true)?, Event::new(dev, true)?);
    let cache_dir = std::env::temp_dir().join(format!("dropcompute-info-cache-{}", std::process::id()));
    let cache = RecipeCache::new(&cache_dir);
    let device_type = dev.info()?.device_type;
    let build = || -> Result<(GraphBuilder, TensorId, TensorId), dropcompute::synapse::Error> {
        let mut g = GraphBuilder::new(rt, device_type)?;
        let x = g.persistent("src", DType::F32, &[n as u64])?;
        let y = g.persistent("dst", DType::F32, &[n as u64])?;
        g.node("identity_relu", &Op::Relu, &[x], &[y])?;
        Ok((g, x, y))
    };
    let compiled = build().and_then(|(g, ..)| g.compile_cached("info_check", &cache));
    let loaded = compiled.and_then(|first| {
        let (g, x, y) = build()?;
        Ok((first.origin(), g.compile_cached("info_check", &cache)?, x, y))
    });
    let _ = std::fs::remove_dir_all(&cache_dir);
    let (first, recipe, x, y) = loaded?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let compile = match first {
        RecipeOrigin::Compiled(t) => format!("graph compile {:.2} ms", ms(t)),
        RecipeOrigin::Cache(t) => format!("graph found in a fresh cache ({:.2} ms)", ms(t)),
    };
    let origin = match recipe.origin() {
        RecipeOrigin::Cache(t) => format!("cache load {:.2} ms", ms(t)),
        RecipeOrigin::Compiled(t) => format!("cache not used (compiled again in {:.2} ms)", ms(t)),
    };
    t0.record(&s)?;
    s.copy_h2d(&host, &mut a)?;
    t1.record(&s)?;
    let ws = match recipe.workspace_size() {
        0 => None,
        w => Some(DeviceBuffer::<u8>::alloc(dev, w as usize)?),
    };
    recipe.launch(&s, &[GraphArg::new(x, &a), GraphArg::new(y, &b)], ws.as_ref(), &[&t2])?;
    let mut back = HostBuffer::<f32>::zeroed(dev, n)?;
    s.copy_d2h(&b, &mut back)?;
    if back.as_slice()? != &data[..] {
        return Err(CommandError::SelfCheck("data came back different".into()).into());
    }
    let h2d: Duration = t1.elapsed_since(&t0)?;
    let launch: Duration = t2.elapsed_since(&t1)?;
    Ok(format!(
        "OK: 1 MiB round trip intact; H2D {:.1} us device time ({:.2} GB/s); {compile}, {origin}, graph launch {:.1} us device time",
        h2d.as_secs_f64() * 1e6,
        (n * 4) as f64 / h2d.as_secs_f64().max(1e-12) / 1e9,
        launch.as_secs_f64() * 1e6
    ))
}
