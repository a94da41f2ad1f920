//! Monotonic time, behind a trait so the quorum engine and the embedded store can run on
//! simulated time in tests.
//!
//! Rule 4 (validity, docs/safety-rules.md) needs a monotonic clock started before the first send;
//! wall-clock time would let an NTP step shorten or lengthen a lock's validity.

use std::time::Duration;

/// A monotonic clock: `now()` never goes backwards.
pub trait Clock: Send + Sync + 'static {
    /// Time elapsed since an arbitrary, fixed origin.
    fn now(&self) -> Duration;
}

/// The process's monotonic clock, read through tokio so that tests running on a paused
/// runtime (`tokio::time::pause`) see simulated time.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    pub fn new() -> TokioClock {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}
