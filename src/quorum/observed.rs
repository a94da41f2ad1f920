//! What the engine sees of each master's requests: latency, timeouts, errors, for `INFO`
//! and the metrics. Observation only: nothing here decides anything.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Histogram};

use super::Answer;
use crate::backend::BackendError;
use crate::metrics::{BACKEND_ERRORS, BACKEND_REQUEST_SECONDS, BACKEND_TIMEOUTS};

/// One master's request statistics.
pub struct Observed {
    last_latency_us: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    latency: Histogram,
    timeout_counter: Counter,
    error_counter: Counter,
}

impl Observed {
    /// Statistics for the master named `backend` (its metrics carry that label).
    pub fn new(backend: &str) -> Observed {
        let label = backend.to_owned();
        Observed {
            last_latency_us: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency: metrics::histogram!(BACKEND_REQUEST_SECONDS, "backend" => label.clone()),
            timeout_counter: metrics::counter!(BACKEND_TIMEOUTS, "backend" => label.clone()),
            error_counter: metrics::counter!(BACKEND_ERRORS, "backend" => label),
        }
    }

    /// Records one request's answer and how long it took. A master skipped because it is
    /// known down or quarantined was not asked: nothing to record.
    pub fn record(&self, answer: &Answer, took: Duration) {
        match answer {
            Err(
                BackendError::Down
                | BackendError::Quarantined { .. }
                | BackendError::Duplicate { .. }
                | BackendError::Pending,
            ) => return,
            Err(BackendError::Timeout) => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                self.timeout_counter.increment(1);
            }
            Err(BackendError::Io(_) | BackendError::ClockAhead { .. }) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                self.error_counter.increment(1);
            }
            Ok(_) => {}
        }
        self.last_latency_us.store(took.as_micros() as u64, Ordering::Relaxed);
        self.latency.record(took.as_secs_f64());
    }

    /// The last request's latency.
    pub fn last_latency(&self) -> Duration {
        Duration::from_micros(self.last_latency_us.load(Ordering::Relaxed))
    }

    /// Requests that timed out.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }

    /// Requests whose connection failed.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}
