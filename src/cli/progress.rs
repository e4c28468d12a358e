//! Progress bars on stderr for long work (verify, repair, compact, export), shown only when
//! stderr is a terminal; silent otherwise, so logs and pipes stay clean.

use std::cell::Cell;
use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar (or spinner) that exists only on a terminal.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    /// A bar stays hidden until its total is known, so it never flashes "0/0" as done.
    shown: Cell<bool>,
}

impl Progress {
    /// A bar counting `unit`s, for work whose total is reported as it goes.
    pub(crate) fn bar(message: &str, unit: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress::off();
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        let template = format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{eta}})");
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(message.to_string());
        Progress {
            bar: Some(bar),
            shown: Cell::new(false),
        }
    }

    fn off() -> Progress {
        Progress {
            bar: None,
            shown: Cell::new(false),
        }
    }

    /// Draws on stderr from now on (the first time the total is known).
    fn show(&self, bar: &ProgressBar) {
        if !self.shown.replace(true) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    /// A spinner, for work that reports no progress of its own.
    pub(crate) fn spinner(message: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress::off();
        }
        let bar = ProgressBar::new_spinner();
        bar.set_message(message.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress {
            bar: Some(bar),
            shown: Cell::new(true),
        }
    }

    /// Reports `done` of `total`.
    pub(crate) fn set(&self, done: u64, total: u64) {
        if let Some(bar) = &self.bar {
            self.show(bar);
            bar.set_length(total.max(done));
            bar.set_position(done);
        }
    }

    /// Advances by one.
    pub(crate) fn tick(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Sets the total for [`Progress::tick`].
    pub(crate) fn total(&self, total: u64) {
        if let Some(bar) = &self.bar {
            self.show(bar);
            bar.set_length(total);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
