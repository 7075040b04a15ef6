//! `dropcompute train`: trains the MLP on the digits (or `--data`) with N ranks on the CPU mock,
//! synchronous baseline vs DropCompute, and prints the comparison table.

use std::io::IsTerminal;

use dropcompute::train::args::{LaunchMode, TrainArgs};
use dropcompute::train::error::TrainError;
use dropcompute::train::job::Job;
use dropcompute::train::output::StagedOut;
use dropcompute::train::report::comparison_table;
use dropcompute::train::run;
use dropcompute::train::summary;

use super::CliError;

/// This process's arguments after the `train` subcommand (handed to rank processes).
fn train_args() -> Vec<String> {
    std::env::args().skip_while(|a| a != "train").skip(1).collect()
}

pub fn run(a: &TrainArgs) -> Result<(), CliError> {
    Ok(train(a)?)
}

fn train(a: &TrainArgs) -> Result<(), TrainError> {
    // Pure validation first: bad flags, data and --out fail before any device call.
    let cfg = a.validate()?;
    let out = match (&cfg.out, &a.child) {
        (Some(d), None) => Some(StagedOut::new(d)?),
        _ => None,
    };
    let launch = cfg.launch;
    dropcompute::train::ckpt::install_signal_handler();
    let job = Job::prepare(cfg)?;
    let rt = run::mock_runtime(&job)?;
    if let Some(child) = &a.child {
        let result = a.child_result.clone().unwrap_or_else(|| std::env::temp_dir().join("dropcompute-rank.json"));
        return run::run_child(&job, &rt, child, &result);
    }
    let show = std::io::stdout().is_terminal();
    let outcomes = match launch {
        LaunchMode::Threads => run::run_threads(&job, &rt, show)?,
        LaunchMode::Processes => run::run_processes(&job, &rt, &train_args())?,
        LaunchMode::Env => {
            let (rank, o) = run::run_env(&job, &rt, show)?;
            if rank != 0 {
                return Ok(());
            }
            vec![o]
        }
    };
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
