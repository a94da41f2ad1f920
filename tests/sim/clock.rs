//! A master's clock that runs a little fast or slow.
//!
//! Redlock's safety argument assumes that clocks on the masters advance at nearly the same
//! rate as the proxy's; the engine's allowance for the difference is `ttl × drift_factor +
//! 2 ms`. A master whose clock runs fast expires keys early in real time, which is exactly
//! the danger that allowance exists for, so each simulated master gets its own rate.

use std::time::Duration;

use redlock_proxy::clock::Clock;
use tokio::time::Instant;

/// Simulated (paused tokio) time, scaled by a constant rate.
#[derive(Debug)]
pub struct DriftClock {
    origin: Instant,
    rate: f64,
}

impl DriftClock {
    /// A clock starting at zero now and advancing `rate` seconds per real second.
    pub fn new(rate: f64) -> DriftClock {
        DriftClock {
            origin: Instant::now(),
            rate,
        }
    }
}

impl Clock for DriftClock {
    fn now(&self) -> Duration {
        self.origin.elapsed().mul_f64(self.rate)
    }
}
