//! Rule 15: a master whose wall clock ran ahead may have dropped keys early, so it must not vote.
//!
//! Redis expires a key when its *wall clock* passes the key's deadline. A master whose clock
//! jumps forward 30 s expires at once every lock it holds with less than 30 s left, and one
//! whose clock runs 10 % fast expires a 10 s lock after 9.1 s, while its holder was promised
//! `ttl − elapsed − drift` (rule 4: 9.9 s with `drift_factor = 0.01`). Either way a second
//! client can then win that master's vote for a lock the first still holds.
//!
//! The proxy cannot read a master's clock without a round trip, but it can bound it: a reading
//! `T` of the master's `TIME` taken in a round trip that left at `s` and came back at `r` on
//! the proxy's monotonic clock was made at some instant in `[s, r]`. The master's clock is
//! ahead of the proxy's by `T − t` at the instant `t` it was read, so by at least `T − r` and at
//! most `T − s`. Between two readings `i` (earlier) and `j`, the master's clock gained on the
//! proxy's at least `(T_j − r_j) − (T_i − s_i)`. Rule 4 allows a clock to run fast by
//! `drift_factor` over the time between them (at most `r_j − s_i`) plus rule 4's fixed 2 ms;
//! a gain beyond that against *any* earlier reading is a clock that jumped or runs fast
//! beyond the drift, and every key the master holds may expire early by that much.
//!
//! The test against every earlier reading costs one number: the gain exceeds the allowance
//! iff `(T_j − r_j − f·r_j) − (T_i − s_i − f·s_i) > 2 ms` for some `i` (`f` the drift
//! factor), so only the least `T_i − s_i − f·s_i` seen (the *floor*) is kept. A clock that
//! steps back lowers the floor (keys live longer there: safe, and later readings are judged
//! against the new time); a clock that runs slow never raises an alarm (the same).
//!
//! What this cannot see, stated in docs/safety.md ("What it does not guarantee"): a jump before the proxy's
//! first reading of that master (a proxy has no history of a master it just met); a jump
//! forward and back again between two readings (a probe interval apart at most); a gain
//! within the drift allowance, which rule 4 already pays for.

use std::time::Duration;

use crate::reply::Reply;

/// Rule 4's fixed part of the drift allowance: a gain up to this is within the allowance at
/// any TTL (the validity already subtracts it).
const ALLOWED: i128 = 2_000;

/// One master's clock history, as the floor described in the module's documentation.
#[derive(Debug)]
pub struct WallClock {
    drift_factor: f64,
    /// The least `T − s − f·s` of the readings since the last alarm, in microseconds.
    floor: Option<i128>,
}

/// One reading of a master's wall clock and the round trip it was taken in.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    /// When the request left, on the proxy's monotonic clock.
    pub sent: Duration,
    /// When its reply was read, on the same clock.
    pub received: Duration,
    /// The master's `TIME`, since the Unix epoch.
    pub master: Duration,
}

impl WallClock {
    /// A history with no readings, judged with rule 4's `drift_factor`.
    pub fn new(drift_factor: f64) -> WallClock {
        WallClock {
            drift_factor,
            floor: None,
        }
    }

    /// Takes a reading; `Some(gain)` when the master's clock gained on the proxy's more than
    /// rule 4 allows since an earlier reading (by `gain` beyond the allowance, at least). The
    /// history then starts again from this reading: the caller keeps the master out until
    /// every key it held before has expired, and the readings after that are judged afresh.
    pub fn read(&mut self, reading: Reading) -> Option<Duration> {
        let micros = |d: Duration| i128::try_from(d.as_micros()).unwrap_or(i128::MAX);
        let (sent, received, master) = (micros(reading.sent), micros(reading.received), micros(reading.master));
        // f·t in microseconds; a factor is small and t a monotonic time, so f64 is exact enough.
        let drift = |t: i128| (t as f64 * self.drift_factor) as i128;
        // This reading as a later one (least ahead it can be) and as an earlier one (most).
        let least = master - received - drift(received);
        let most = master - sent - drift(sent);
        if let Some(floor) = self.floor {
            let gain = least - floor;
            if gain > ALLOWED {
                self.floor = Some(most);
                let beyond = u64::try_from(gain - ALLOWED).unwrap_or(u64::MAX);
                return Some(Duration::from_micros(beyond));
            }
        }
        self.floor = Some(self.floor.map_or(most, |floor| floor.min(most)));
        None
    }
}

/// Reads `TIME`'s reply: seconds and microseconds, as bulk strings.
pub fn parse_time(reply: &Reply) -> Option<Duration> {
    match reply {
        Reply::Array(parts) => match parts.as_slice() {
            [secs, micros] => time_of(secs, micros),
            _ => None,
        },
        _ => None,
    }
}

/// The time `TIME` answers as its two parts (integers too, as a script may return them).
pub fn time_of(secs: &Reply, micros: &Reply) -> Option<Duration> {
    let number = |r: &Reply| match r {
        Reply::Bulk(b) => digits(b),
        Reply::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    };
    let micros = number(micros).filter(|m| *m < 1_000_000)?;
    // Checked: whatever a reply says (up to `u64::MAX` seconds), never a panic.
    Duration::from_secs(number(secs)?).checked_add(Duration::from_micros(micros))
}

/// `text` as a number when it is only decimal digits (as `TIME` writes its parts), within
/// `u64`. One pass over the bytes: every acquisition's vote carries a clock reading, and
/// `str::parse` (UTF-8 check, sign, then digits) cost about 230 instructions a part
/// (BENCHMARKS.md, "Instructions per acquisition").
fn digits(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0u64, |n, &b| {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPOCH: Duration = Duration::from_secs(1_800_000_000);

    fn scaled(t: Duration, rate: f64) -> Duration {
        Duration::try_from_secs_f64(t.as_secs_f64() * rate).expect("a test time")
    }

    /// Readings of a master whose clock, at proxy time `t`, reads `clock(t)`; each round
    /// trip takes 200 µs and the master reads its clock in the middle.
    fn run(
        drift: f64,
        from_ms: u64,
        to_ms: u64,
        every_ms: u64,
        clock: impl Fn(Duration) -> Duration,
    ) -> Vec<(u64, Duration)> {
        let mut history = WallClock::new(drift);
        let mut alarms = Vec::new();
        let mut t = from_ms;
        while t <= to_ms {
            let sent = Duration::from_millis(t);
            let reading = Reading {
                sent,
                received: sent + Duration::from_micros(200),
                master: clock(sent + Duration::from_micros(100)),
            };
            if let Some(gain) = history.read(reading) {
                alarms.push((t, gain));
            }
            t += every_ms;
        }
        alarms
    }

    #[test]
    fn a_steady_clock_is_never_flagged() {
        assert!(run(0.01, 0, 600_000, 100, |t| EPOCH + t).is_empty());
    }

    #[test]
    fn a_forward_jump_is_flagged_at_the_first_reading_after_it() {
        let alarms = run(0.01, 0, 10_000, 100, |t| {
            if t >= Duration::from_millis(5_050) {
                EPOCH + t + Duration::from_secs(30)
            } else {
                EPOCH + t
            }
        });
        assert_eq!(alarms.len(), 1, "{alarms:?}");
        let (at, gain) = alarms[0];
        assert_eq!(at, 5_100);
        assert!(gain > Duration::from_millis(29_900), "{gain:?}");
    }

    #[test]
    fn a_jump_within_the_fixed_allowance_is_not_flagged_and_one_beyond_it_is() {
        let step = |ms: u64| {
            move |t: Duration| {
                if t >= Duration::from_millis(1_050) {
                    EPOCH + t + Duration::from_millis(ms)
                } else {
                    EPOCH + t
                }
            }
        };
        // Between two probes 100 ms apart, 2 ms plus 1 % of 100 ms is allowed, less the round
        // trip's 200 µs of uncertainty, which is the master's to get: 1 ms passes, 5 ms not.
        assert!(run(0.01, 0, 2_000, 100, step(1)).is_empty());
        assert_eq!(run(0.01, 0, 2_000, 100, step(5)).len(), 1);
    }

    #[test]
    fn a_backward_jump_is_safe_and_judged_afresh() {
        // Back 10 s, then forward 10 s again: the return is a jump forward for keys written
        // in between, which would expire 10 s early.
        let alarms = run(0.01, 0, 3_000, 100, |t| {
            let ms = t.as_millis();
            if (1_000..2_000).contains(&ms) {
                EPOCH + t - Duration::from_secs(10)
            } else {
                EPOCH + t
            }
        });
        assert_eq!(alarms.len(), 1, "{alarms:?}");
        assert_eq!(alarms[0].0, 2_000);
    }

    #[test]
    fn a_clock_fast_beyond_the_drift_factor_is_flagged_within_a_probe_or_two() {
        for rate in [1.10, 1.50] {
            let alarms = run(0.01, 0, 10_000, 100, |t| EPOCH + scaled(t, rate));
            let first = alarms.first().expect("flagged").0;
            assert!(first <= 200, "rate {rate}: first flagged at {first} ms");
            // Judged afresh after each alarm, it keeps being flagged: it never votes.
            assert!(alarms.len() >= 40, "rate {rate}: {} alarms", alarms.len());
        }
    }

    #[test]
    fn a_clock_fast_within_the_drift_factor_or_slow_is_never_flagged() {
        assert!(run(0.01, 0, 600_000, 100, |t| EPOCH + scaled(t, 1.009)).is_empty());
        assert!(run(0.01, 0, 600_000, 100, |t| EPOCH + scaled(t, 0.5)).is_empty());
    }

    #[test]
    fn time_replies_are_read() {
        let reply = Reply::Array(vec![Reply::bulk("1800000000"), Reply::bulk("250000")]);
        assert_eq!(parse_time(&reply), Some(EPOCH + Duration::from_millis(250)));
        assert_eq!(
            parse_time(&Reply::Array(vec![Reply::bulk("1"), Reply::bulk("1000000")])),
            None
        );
        assert_eq!(parse_time(&Reply::Int(1)), None);
        // Only digits: no sign, no space, nothing empty, nothing past u64.
        let part = |secs: &str| {
            let secs = Reply::Bulk(bytes::Bytes::copy_from_slice(secs.as_bytes()));
            parse_time(&Reply::Array(vec![secs, Reply::bulk("0")]))
        };
        for bad in ["", "+1", "-1", " 1", "1 ", "1a", "18446744073709551616"] {
            assert_eq!(part(bad), None, "{bad:?}");
        }
        assert_eq!(part("0"), Some(Duration::ZERO));
        assert_eq!(part("007"), Some(Duration::from_secs(7)));
        // The largest reading a reply can carry is read and judged without a panic: far ahead.
        let huge = Reply::Array(vec![Reply::bulk(u64::MAX.to_string()), Reply::bulk("999999")]);
        let master = parse_time(&huge).expect("a Duration holds it");
        let mut history = WallClock::new(0.01);
        let at = |ms| Duration::from_millis(ms);
        assert_eq!(
            history.read(Reading {
                sent: at(0),
                received: at(1),
                master: EPOCH
            }),
            None
        );
        assert!(
            history
                .read(Reading {
                    sent: at(100),
                    received: at(101),
                    master
                })
                .is_some()
        );
        let negative = Reply::Array(vec![Reply::bulk("-1"), Reply::bulk("0")]);
        assert_eq!(parse_time(&negative), None);
    }
}
