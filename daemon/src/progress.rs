//! Progress of a long command (`pack`, `export`, a resume's fast-forward in `serve`): a spinner
//! line on a terminal, and on anything else (a Slurm log, a pipe) a plain log line every 30
//! seconds (`DSPREP_PROGRESS_SECS` sets the interval; 0 logs every update), so a batch job's log
//! shows how far it got.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Seconds between plain progress lines when stderr is not a terminal.
const PLAIN_EVERY_SECS: u64 = 30;
const PLAIN_EVERY_ENV: &str = "DSPREP_PROGRESS_SECS";

pub struct Progress {
    label: &'static str,
    shown: Shown,
}

enum Shown {
    Hidden,
    Bar(ProgressBar),
    /// When the last plain line was written (none yet: the start), and the interval.
    Plain(Mutex<Instant>, Duration),
}

impl Progress {
    /// Progress of the command `label`; `enabled = false` (`--quiet`) shows nothing.
    pub fn new(label: &'static str, enabled: bool) -> Self {
        let shown = if !enabled {
            Shown::Hidden
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            Shown::Bar(bar)
        } else {
            Shown::Plain(Mutex::new(Instant::now()), plain_every())
        };
        Self { label, shown }
    }

    /// The current state, e.g. "1200 docs · 3.1M tokens": shown at once on a terminal, logged
    /// when the interval has passed otherwise. `message` is only built when it is shown.
    pub fn update(&self, message: impl FnOnce() -> String) {
        match &self.shown {
            Shown::Hidden => {}
            Shown::Bar(bar) => bar.set_message(message()),
            Shown::Plain(last, every) => {
                let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                if last.elapsed() >= *every {
                    *last = Instant::now();
                    tracing::info!("{} progress: {}", self.label, message());
                }
            }
        }
    }

    /// Take the spinner off the terminal (before a summary is printed).
    pub fn finish(&self) {
        if let Shown::Bar(bar) = &self.shown {
            bar.finish_and_clear();
        }
    }
}

/// The interval between plain progress lines (`DSPREP_PROGRESS_SECS`, else 30 s): also what
/// code without a [`Progress`] of its own (a Hub listing's pages) logs at.
pub(crate) fn plain_every() -> Duration {
    let secs = std::env::var(PLAIN_EVERY_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(PLAIN_EVERY_SECS);
    Duration::from_secs(secs)
}

/// A resume's fast-forward: the windows recomputed and dropped before the first one served,
/// `what` naming the daemon or lane. Shows how far it is ([`Progress`]), and logs once when done.
pub struct FastForward {
    progress: Progress,
    what: String,
    total: u64,
    began: Instant,
    done: bool,
}

impl FastForward {
    /// `total` windows to recompute (0: nothing to show).
    pub fn new(what: String, total: u64) -> Self {
        Self {
            progress: Progress::new("resume", total > 0),
            what,
            total,
            began: Instant::now(),
            done: total == 0,
        }
    }

    /// `windows` of the total have been recomputed.
    pub fn advance(&mut self, windows: u64) {
        if self.done {
            return;
        }
        if windows >= self.total {
            self.done = true;
            self.progress.finish();
            tracing::info!(
                "{}: fast-forward of {} windows done in {:.1} s",
                self.what,
                self.total,
                self.began.elapsed().as_secs_f64()
            );
            return;
        }
        self.progress.update(|| {
            format!(
                "{}: fast-forwarding, window {windows} of {} ({:.0} %)",
                self.what,
                self.total,
                100.0 * windows as f64 / self.total as f64
            )
        });
    }
}
