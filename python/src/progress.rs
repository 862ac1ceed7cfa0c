//! Progress for Python: a thread reads a counter the work advances and calls the user's
//! callable with `(stage, done, total)` about ten times a second, taking the GIL only for the
//! call (the work itself runs without it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::prelude::*;

const PERIOD: Duration = Duration::from_millis(100);

/// A running progress reporter; [`Progress::finish`] makes the last call and stops it.
pub struct Progress {
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts calling `callback` (nothing at all without one).
    pub fn start(
        callback: Option<Py<PyAny>>,
        stage: &'static str,
        total: u64,
        counter: Arc<AtomicU64>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let Some(callback) = callback else {
            return Self { stop, worker: None };
        };
        let flag = Arc::clone(&stop);
        let worker = std::thread::spawn(move || {
            let mut failed = false;
            loop {
                // Read the flag before the counter, so the last call sees the final count.
                let last = flag.load(Ordering::Acquire);
                let done = counter.load(Ordering::Relaxed);
                if !failed {
                    Python::attach(|py| {
                        if let Err(err) = callback.call1(py, (stage, done, total)) {
                            // A callback that raises is reported once and not called again;
                            // the work goes on.
                            err.write_unraisable(py, Some(callback.bind(py)));
                            failed = true;
                        }
                    });
                }
                if last {
                    break;
                }
                std::thread::sleep(PERIOD);
            }
            Python::attach(move |_| drop(callback));
        });
        Self {
            stop,
            worker: Some(worker),
        }
    }

    /// Makes the last call (with the counter's final value) and waits for it. Call it without
    /// the GIL, as the reporter needs it.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.worker.take() {
            w.join().ok();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}
