//! Terminal progress of a `train` run: an indicatif bar over steps with the last step time,
//! drop rate and loss.
//!
//! Owns: [`Progress`] and its message format ([`step_message`]). Must not touch: the training
//! state, logging (tracing goes to stderr independently) or the report. The bar draws on
//! stderr, so stdout keeps only the comparison table; it is drawn whenever it is asked for and
//! stderr is a terminal, wherever stdout goes (`train > log` still shows the bar; `2> err`
//! does not).
#![forbid(unsafe_code)]

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Bar layout: label, elapsed time, bar, steps done / total, ETA, then the [`step_message`].
pub const TEMPLATE: &str = "{prefix:>12} {elapsed_precise} [{bar:30}] {pos}/{len} steps (eta {eta}) {msg}";

/// Whether a bar is drawn: `asked` (the caller's choice) and stderr, where it draws, is a
/// terminal (`stderr_is_terminal`, from [`IsTerminal`]).
pub fn should_show(asked: bool, stderr_is_terminal: bool) -> bool {
    asked && stderr_is_terminal
}

/// The live message: `step 12.3 ms | drop 5.2% | loss 0.4321`. `drop_rate` is a fraction in
/// [0, 1] shown as %, `step_ms` in ms. The loss part is left out while there is no loss yet
/// (`loss` not finite: the global loss of a step is read one step later); a non-finite step
/// time prints as `NaN`/`inf` (never panics).
pub fn step_message(step_ms: f64, drop_rate: f64, loss: f64) -> String {
    let head = format!("step {step_ms:.1} ms | drop {:.1}%", drop_rate * 100.0);
    if loss.is_finite() { format!("{head} | loss {loss:.4}") } else { head }
}

/// A progress bar over the steps of one run.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `total_steps` steps labelled `label` (e.g. "baseline"), starting at
    /// `done_steps` (a resumed run). Drawn on stderr when [`should_show`]`(visible, stderr is a
    /// terminal)`, else hidden (updates are then cheap no-ops on the display but still
    /// tracked).
    pub fn new(total_steps: u64, done_steps: u64, label: &str, visible: bool) -> Self {
        let target = if should_show(visible, std::io::stderr().is_terminal()) {
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
        bar.set_position(done_steps);
        Self { bar }
    }

    /// Record that step `step` (0-based) completed in `step_ms` ms with `drop_rate` (fraction
    /// of this step's micro-batches dropped, [0, 1]) and the latest training loss `loss` (NaN:
    /// none yet): the bar shows `step + 1` steps done (saturating) and [`step_message`].
    pub fn step_done(&self, step: u64, step_ms: f64, drop_rate: f64, loss: f64) {
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
        assert_eq!(step_message(f64::NAN, 0.0, 1.0), "step NaN ms | drop 0.0% | loss 1.0000");
        // No loss yet (the first step's loss is read after the second): no "loss NaN".
        assert_eq!(step_message(3.0, 0.0, f64::NAN), "step 3.0 ms | drop 0.0%");
    }

    /// Steps 0..6 of a 6-step run end at 6/6 (it showed 2/6 after the first step and 7/6 at
    /// the end: the caller passed step + 1, which the bar incremented again).
    #[test]
    fn a_run_ends_at_n_of_n() {
        let p = Progress::new(6, 0, "dropcompute", false);
        p.step_done(0, 1.0, 0.0, f64::NAN);
        assert_eq!(p.position(), 1);
        for s in 1..6 {
            p.step_done(s, 1.0, 0.0, 0.5);
        }
        assert_eq!(p.position(), 6);
        let resumed = Progress::new(6, 3, "dropcompute", false);
        assert_eq!(resumed.position(), 3);
        resumed.step_done(3, 1.0, 0.0, 0.5);
        assert_eq!(resumed.position(), 4);
    }

    #[test]
    fn shown_only_when_asked_and_stderr_is_a_terminal() {
        assert!(should_show(true, true));
        assert!(!should_show(true, false));
        assert!(!should_show(false, true));
        assert!(!should_show(false, false));
    }

    #[test]
    fn hidden_bar_tracks_steps_and_message() {
        let p = Progress::new(10, 0, "baseline", false);
        assert!(p.is_hidden());
        p.step_done(0, 40.0, 0.0, 2.3);
        p.step_done(6, 31.25, 0.125, 0.5);
        assert_eq!(p.position(), 7);
        assert_eq!(p.message(), "step 31.2 ms | drop 12.5% | loss 0.5000");
        p.step_done(u64::MAX, 1.0, 1.0, 0.0);
        assert_eq!(p.position(), u64::MAX);
        p.finish();
    }

    #[test]
    fn the_template_is_accepted() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
    }
}
