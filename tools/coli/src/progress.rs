//! Progress bars for the long parts of a start (reading and quantizing a checkpoint, uploading
//! weights, warming the expert tier): drawn on stderr when it is a terminal, and nothing
//! otherwise, so logs and pipes stay clean. Must not: print to stdout.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A bar that counts `what` (its unit, e.g. "tensors"), or nothing off a terminal.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar for a count of items; hidden when stderr is not a terminal.
    pub fn new(what: &str) -> Progress {
        Progress::with_target(what, std::io::stderr().is_terminal())
    }

    /// A bar for bytes of work (quantizing at load), with rate and time left.
    pub fn bytes(msg: &'static str) -> Progress {
        let p = Progress::styled(
            "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)".into(),
            std::io::stderr().is_terminal(),
        );
        p.step(msg);
        p
    }

    /// The bar as a hook the runtime calls from its worker threads: `(done, total)`.
    pub fn hook(&self) -> std::sync::Arc<dyn Fn(u64, u64) + Send + Sync> {
        let bar = self.bar.clone();
        std::sync::Arc::new(move |done, total| {
            if let Some(b) = &bar {
                b.set_length(total);
                b.set_position(done);
                if total > 0 && done >= total {
                    b.finish_and_clear();
                }
            }
        })
    }

    fn with_target(what: &str, visible: bool) -> Progress {
        Progress::styled(format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {what} ({{per_sec}}, {{eta}} left)"), visible)
    }

    fn styled(template: String, visible: bool) -> Progress {
        if !visible {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("#>-"));
        }
        Progress { bar: Some(bar) }
    }

    /// Names the step the bar counts.
    pub fn step(&self, msg: &'static str) {
        if let Some(b) = &self.bar {
            b.set_message(msg);
        }
    }

    /// `done` of `total` items are through; the bar ends when they all are.
    pub fn update(&self, done: usize, total: usize) {
        let Some(b) = &self.bar else { return };
        b.set_length(total as u64);
        b.set_position(done as u64);
        if total > 0 && done >= total {
            b.finish_and_clear();
        }
    }

    /// Whether anything is drawn.
    pub fn visible(&self) -> bool {
        self.bar.is_some()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_a_terminal_nothing_is_drawn_and_updates_are_harmless() {
        let p = Progress::with_target("tensors", false);
        assert!(!p.visible());
        p.step("loading");
        p.update(3, 10);
        p.update(10, 10);
        let hook = Progress { bar: None }.hook();
        hook(5, 10);
    }
}
