//! Terminal progress of a `train` run: an indicatif bar over steps with the last step time,
//! drop rate and loss.
//!
//! Owns: [`Progress`] and its message format ([`step_message`]). Must not touch: the training
//! state, logging (tracing goes to stderr independently) or the report. The bar draws on
//! stderr, so stdout keeps only the comparison table; it is hidden unless asked for *and*
//! stdout is a terminal (a redirected run, e.g. `train > log`, gets no bar), and indicatif
//! itself hides it when stderr is not a terminal.
#![forbid(unsafe_code)]

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Bar layout: label, elapsed time, bar, steps done / total, ETA, then the [`step_message`].
pub const TEMPLATE: &str = "{prefix:>12} {elapsed_precise} [{bar:30}] {pos}/{len} steps (eta {eta}) {msg}";

/// Whether a bar is drawn: `asked` (the caller's choice, e.g. not `--verbose`) and stdout is a
/// terminal (`stdout_is_terminal`, from [`IsTerminal`]).
pub fn should_show(asked: bool, stdout_is_terminal: bool) -> bool {
    asked && stdout_is_terminal
}

/// The live message: `step 12.3 ms | drop 5.2% | loss 0.4321`. `drop_rate` is a fraction in
/// [0, 1] shown as %, `step_ms` in ms; non-finite values print as `NaN`/`inf` (never panics).
pub fn step_message(step_ms: f64, drop_rate: f64, loss: f64) -> String {
    format!("step {step_ms:.1} ms | drop {:.1}% | loss {loss:.4}", drop_rate * 100.0)
}

/// A progress bar over the steps of one run.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `total_steps` steps labelled `label` (e.g. "baseline"). Drawn on stderr when
    /// [`should_show`]`(visible, stdout is a terminal)`, else hidden (updates are then cheap
    /// no-ops on the display but still tracked).
    pub fn new(total_steps: u64, label: &str, visible: bool) -> Self {
        let target = if should_show(visible, std::io::stdout().is_terminal()) {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total_steps), target);
        // The template is a constant; should indicatif reject it, keep its default style.
        if let Ok(style) = ProgressStyle::with_template(TEMPLATE) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(label.to_owned());
        Self { bar }
    }

    /// Record that step `step` (0-based) completed in `step_ms` ms with `drop_rate` (fraction
    /// of this step's micro-batches dropped, [0, 1]) and training loss `loss`: the bar moves to
    /// `step + 1` (saturating) and shows [`step_message`].
    pub fn update(&self, step: u64, step_ms: f64, drop_rate: f64, loss: f64) {
        self.bar.set_position(step.saturating_add(1));
        self.bar.set_message(step_message(step_ms, drop_rate, loss));
    }

    /// Leave the bar at its last state (done).
    pub fn finish(&self) {
        self.bar.finish();
    }

    /// Steps recorded so far.
    pub fn position(&self) -> u64 {
        self.bar.position()
    }

    /// The current message.
    pub fn message(&self) -> String {
        self.bar.message()
    }

    /// Whether the bar is drawn nowhere.
    pub fn is_hidden(&self) -> bool {
        self.bar.is_hidden()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_shows_ms_percent_and_loss() {
        assert_eq!(step_message(12.345, 0.052, 0.43216), "step 12.3 ms | drop 5.2% | loss 0.4322");
        assert_eq!(step_message(f64::NAN, 0.0, f64::INFINITY), "step NaN ms | drop 0.0% | loss inf");
    }

    #[test]
    fn shown_only_when_asked_and_stdout_is_a_terminal() {
        assert!(should_show(true, true));
        assert!(!should_show(true, false));
        assert!(!should_show(false, true));
        assert!(!should_show(false, false));
    }

    #[test]
    fn hidden_bar_tracks_steps_and_message() {
        let p = Progress::new(10, "baseline", false);
        assert!(p.is_hidden());
        p.update(0, 40.0, 0.0, 2.3);
        p.update(6, 31.25, 0.125, 0.5);
        assert_eq!(p.position(), 7);
        assert_eq!(p.message(), "step 31.2 ms | drop 12.5% | loss 0.5000");
        p.update(u64::MAX, 1.0, 1.0, 0.0);
        assert_eq!(p.position(), u64::MAX);
        p.finish();
    }

    #[test]
    fn the_template_is_accepted() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
    }
}
