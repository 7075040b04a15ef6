//! `dropcompute train`: trains the MLP on the digits (or `--data`) with N ranks on the CPU mock,
//! synchronous baseline vs DropCompute, and prints the comparison table.

use std::io::IsTerminal;

use dropcompute::launch::ChildSpec;
use dropcompute::train::args::TrainArgs;
use dropcompute::train::error::TrainError;
use dropcompute::train::job::Job;
use dropcompute::train::output::StagedOut;
use dropcompute::train::report::comparison_table;
use dropcompute::train::run;
use dropcompute::train::summary;

use super::CliError;

pub fn run(a: &TrainArgs) -> Result<(), CliError> {
    Ok(train(a)?)
}

/// One rank process of `train --launch processes` (see `dropcompute::launch`).
pub fn child(spec: &ChildSpec) -> Result<(), CliError> {
    dropcompute::train::ckpt::install_signal_handler();
    Ok(run::run_child(spec)?)
}

fn train(a: &TrainArgs) -> Result<(), TrainError> {
    // Pure validation first: bad flags, data and --out fail before any device call.
    let cfg = a.validate()?;
    let out = cfg.out.as_ref().map(|d| StagedOut::new(d)).transpose()?;
    let launch = cfg.launch;
    dropcompute::train::ckpt::install_signal_handler();
    let job = Job::prepare(cfg)?;
    let rt = run::mock_runtime(&job)?;
    let show = std::io::stdout().is_terminal();
    let (rank, outcomes) = run::run(&job, &rt, launch, show)?;
    if rank != 0 {
        return Ok(());
    }
    run::check_lockstep(&outcomes)?;
    let rep = summary::report(&job, &outcomes)?;
    println!("{}", comparison_table(&rep));
    if let Some(dc) = outcomes[0].last() {
        println!("threshold: {}", dc.threshold_source);
    }
    if job.cfg.time_mode == dropcompute::mock::TimeMode::Virtual {
        println!("virtual time: wall time and rates are in device (virtual) seconds");
    }
    if rep.predicted_speedup.is_none() && rep.baseline.is_none() {
        println!("predicted speedup: needs the baseline run's latencies (--compare)");
    }
    if let Some(out) = out {
        summary::write_outputs(&out, &rep, &outcomes)?;
        let files = out.commit()?;
        println!(
            "wrote {} files to {}",
            files.len(),
            job.cfg.out.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
        );
    }
    Ok(())
}
