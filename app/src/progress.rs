//! Progress bars on stderr for long loads, only when stderr is a terminal.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Files smaller than this load too fast for a bar to help.
const MIN_BYTES_FOR_BAR: u64 = 8 << 20;

/// A bar that follows a byte counter from a background thread until dropped.
pub struct ByteProgress {
    done: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

impl ByteProgress {
    /// Starts a bar for `total_bytes` that polls `counter`, or does nothing when stderr is not
    /// a terminal or the file is small.
    pub fn start(label: &str, total_bytes: u64, counter: Arc<AtomicU64>) -> Self {
        let shown = total_bytes >= MIN_BYTES_FOR_BAR;
        Self::with_template(
            label,
            total_bytes,
            counter,
            shown,
            "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
    }

    /// [`Self::start`] for a count of events (shown from a million on).
    pub fn start_events(label: &str, total_events: u64, counter: Arc<AtomicU64>) -> Self {
        Self::with_template(
            label,
            total_events,
            counter,
            total_events >= 1 << 20,
            // No rate or time left: what reads the events may run ahead of what uses them.
            "{msg} [{bar:40}] {human_pos}/{human_len} events read",
        )
    }

    /// A counter of replays with no total known ahead (a search), shown when `shown` (a long
    /// input) and stderr is a terminal.
    pub fn start_counting(label: &str, counter: Arc<AtomicU64>, shown: bool) -> Self {
        Self::with_template(
            label,
            0,
            counter,
            shown,
            "{spinner} {msg}: {pos} replays ({elapsed})",
        )
    }

    fn with_template(
        label: &str,
        total: u64,
        counter: Arc<AtomicU64>,
        shown: bool,
        template: &str,
    ) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        if !std::io::stderr().is_terminal() || !shown {
            return Self { done, worker: None };
        }
        let bar = if total == 0 {
            ProgressBar::new_spinner()
        } else {
            ProgressBar::new(total)
        };
        let style = ProgressStyle::with_template(template)
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(label.to_owned());
        let flag = Arc::clone(&done);
        let worker = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                bar.set_position(counter.load(Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(100));
            }
            bar.finish_and_clear();
        });
        Self {
            done,
            worker: Some(worker),
        }
    }
}

impl Drop for ByteProgress {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            w.join().ok();
        }
    }
}
