//! `dropcompute info`: which backend is in use, its version and devices, and a short self-check
//! that drives one device through the function table (copy round trip, and on the mock a recipe
//! launch timed by device events).
//!
//! Owns: [`Args`], [`run`] and the self-check's output. Must not touch: backend selection rules
//! (`synapse::BackendChoice`) or the devices beyond this read-only check.
#![forbid(unsafe_code)]

use std::time::Duration;

use super::{BackendArgs, BoxError, CommandError};
#[cfg(feature = "mock")]
use crate::mock::{MockControl, MockRecipe};
use crate::synapse::{Device, DeviceBuffer, Event, HostBuffer, Runtime, Stream};
#[cfg(feature = "mock")]
use crate::synapse::{LaunchTensor, Recipe};

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
    #[cfg(feature = "mock")]
    let is_mock_library = backend.library_path().is_some_and(|p| MockControl::from_library(p).is_ok());
    #[cfg(not(feature = "mock"))]
    let is_mock_library = false;
    // The mock's environment (DROPCOMPUTE_MOCK_*) is checked before any device call, so a bad
    // value is a usage error naming the variable (exit 2), not a failed synInitialize.
    #[cfg(feature = "mock")]
    if backend.is_mock() || is_mock_library {
        crate::mock::MockConfig::from_env()?;
    }
    println!("backend:  {}", backend.describe());
    if let Some(note) = &backend.note {
        println!("note:     {note}");
    }
    println!("version:  {}", backend.api.version().unwrap_or("unknown (synDriverGetVersion not exported)"));
    let rt = Runtime::new(backend.api.clone())?;
    let ids = rt.module_ids()?;
    let shown: Vec<String> = ids.iter().take(16).map(u32::to_string).collect();
    let more = if ids.len() > 16 { format!(", ... {} more", ids.len() - 16) } else { String::new() };
    println!("devices:  {} (module ids {}{more})", rt.device_count()?, shown.join(", "));
    // The vendor's selection (HLS_MODULE_ID, else HABANA_VISIBLE_MODULES[LOCAL_RANK]) when set.
    let pinned = ["HLS_MODULE_ID", "HABANA_VISIBLE_MODULES"].iter().any(|v| std::env::var_os(v).is_some());
    let dev = if pinned {
        let local_rank = match std::env::var("LOCAL_RANK") {
            Ok(v) => v.trim().parse::<u32>().map_err(|_| CommandError::Env {
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
    println!(
        "device:   id {} module {} type {} HBM {:.1} GiB ({:.1} GiB free)",
        dev.id(),
        dev.module_id().map_or("?".to_string(), |m| m.to_string()),
        info.device_type.name().unwrap_or("unknown"),
        total as f64 / (1u64 << 30) as f64,
        free as f64 / (1u64 << 30) as f64
    );
    if args.no_check {
        return Ok(());
    }
    let check = self_check(&rt, &dev, backend.is_mock() || is_mock_library)?;
    println!("check:    {check}");
    Ok(())
}

/// Copies 1 MiB host -> device -> device -> host and compares; on the mock also launches a copy
/// recipe and reports its device time from events.
#[cfg_attr(not(feature = "mock"), allow(unused_variables))]
fn self_check(rt: &std::sync::Arc<Runtime>, dev: &Device, mock: bool) -> Result<String, BoxError> {
    let n = 1 << 18;
    let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let s = Stream::new(dev)?;
    let host = HostBuffer::from_slice(dev, &data)?;
    let mut a = DeviceBuffer::<f32>::alloc(dev, n)?;
    let mut b = DeviceBuffer::<f32>::alloc(dev, n)?;
    let (t0, t1, t2) = (Event::new(dev, true)?, Event::new(dev, true)?, Event::new(dev, true)?);
    t0.record(&s)?;
    s.copy_h2d(&host, &mut a)?;
    t1.record(&s)?;
    #[cfg_attr(not(feature = "mock"), allow(unused_mut))]
    let mut launch_note = String::from("no recipe launched (real runtime: needs a compiled recipe)");
    #[cfg(feature = "mock")]
    if mock {
        let path = std::env::temp_dir().join(format!("dropcompute-info-{}.json", std::process::id()));
        MockRecipe::new("info_copy", "copy")
            .tensor("src", (n * 4) as u64)
            .tensor("dst", (n * 4) as u64)
            .base_latency_ns(100_000)
            .write(&path)?;
        let recipe = Recipe::load(rt, &path)?;
        let _ = std::fs::remove_file(&path);
        let ids = recipe.tensor_ids(&["src", "dst"])?;
        s.launch(&recipe, &[LaunchTensor::by_id(ids[0], &a), LaunchTensor::by_id(ids[1], &b)], None, &[&t2])?;
        t2.synchronize()?;
        launch_note = format!("recipe launch {:.1} us device time", t2.elapsed_since(&t1)?.as_secs_f64() * 1e6);
    }
    if !mock || cfg!(not(feature = "mock")) {
        s.copy_d2d(&a, &mut b)?;
        t2.record(&s)?;
    }
    let mut back = HostBuffer::<f32>::zeroed(dev, n)?;
    s.copy_d2h(&b, &mut back)?;
    if back.as_slice()? != &data[..] {
        return Err(CommandError::SelfCheck("data came back different".into()).into());
    }
    let h2d: Duration = t1.elapsed_since(&t0)?;
    Ok(format!(
        "OK: 1 MiB round trip intact; H2D {:.1} us device time ({:.2} GB/s); {launch_note}",
        h2d.as_secs_f64() * 1e6,
        (n * 4) as f64 / h2d.as_secs_f64().max(1e-12) / 1e9
    ))
}
