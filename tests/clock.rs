//! Issue #27, part 1: Redis expires keys by its wall clock. Three masters, quorum 2; master 3
//! holds a foreign value under a short TTL, so A's `SET lock:c a NX PX ttl` rests on masters 1
//! and 2. Then master 1's wall clock jumps forward past the TTL, or runs 10 % or 50 % fast
//! (from just after A's grant): A's key expires there while A's validity still runs.
//! Once the foreign value on master 3 has expired too, B tries `SET lock:c b NX PX ttl` until
//! A's validity ends.
//!
//! - With the tests' usual configuration (the defence on) B must be refused, and `INFO
//!   backends` must show master 1 `quarantined`.
//! - With `quarantine = "off"`, the unprotected control, B is granted while A's validity runs:
//!   two holders, which proves that each scenario breaks a proxy that trusts the master's clock.
//!
//! Each runs on Redis 6.2 and 7.0, built with the libc allocator to run under libfaketime
//! (`bash tests/clock/build-redis.sh`). Every scenario prints its figures (run with
//! `--nocapture` to see them): times are in ms from A's send, A's validity is counted from its
//! send (`ttl - ttl × 0.01 - 2 ms`, the earliest it can end). Two more tests per version
//! check the fault itself: a jump expires a key on the master, a speed runs `PTTL` down faster.

mod support;

use std::time::{Duration, Instant};

use support::clock::{FakeClockMaster, Version, plain_master, pttl};
use support::{ProxyProcess, RedisServer, acquire, backend_line, query};

const KEY: &str = "lock:c";

/// The foreign value's TTL on master 3: past A's acquisition, well before B's attempts.
const FOREIGN_TTL_MS: u64 = 500;

/// How often a condition on a master is polled, and B retries.
const POLL: Duration = Duration::from_millis(5);
const RETRY: Duration = Duration::from_millis(25);

/// What happens to master 1's clock.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// A jump forward, after A's grant.
    Jump(Duration),
    /// The clock runs this many times as fast as the machine's, from just before A's send.
    Fast(f64),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Jump(by) => write!(f, "jump +{} s", by.as_secs()),
            Fault::Fast(speed) => write!(f, "{:.0} % fast", (speed - 1.0) * 100.0),
        }
    }
}

/// The proxy's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Config {
    /// The tests' usual configuration: the defence on.
    Defended,
    /// The defence on, with probes a minute apart: only the reading taken when the proxy
    /// connected and the readings inside the acquisitions' votes can show the fault, so B's
    /// refusal shows that the vote itself is judged, not only the probe after it.
    VotesOnly,
    /// `quarantine = "off"`: no defence.
    Unprotected,
}

/// Polls `condition` until it holds (`Some` of when) or `deadline` passes (`None`).
fn poll_until(deadline: Instant, mut condition: impl FnMut() -> bool) -> Option<Instant> {
    loop {
        if condition() {
            return Some(Instant::now());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// `SET key value PX ttl` directly on a master.
fn set_px(server: &RedisServer, key: &str, value: &str, ttl_ms: u64) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(ttl_ms)
        .query(&mut server.client())
        .expect("SET PX");
}

/// `GET lock:c` through a direct connection to a master.
fn get(connection: &mut redis::Connection) -> Option<String> {
    redis::cmd("GET").arg(KEY).query(connection).expect("GET")
}

/// ms from `origin` to `at`.
fn ms(origin: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(origin).as_secs_f64() * 1000.0
}

/// One scenario: A's grant on masters 1 and 2, `fault` on master 1, B's attempts until A's
/// validity ends.
fn scenario(version: Version, fault: Fault, ttl_ms: u64, config: Config) {
    let mut m1 = FakeClockMaster::start(version);
    let (m2, m3) = (plain_master(version), plain_master(version));
    let urls = [m1.url(), m2.url(), m3.url()];
    let proxy = ProxyProcess::start(
        &urls,
        match config {
            Config::Defended => "",
            Config::VotesOnly => "probe_interval_ms = 60000",
            Config::Unprotected => "quarantine = \"off\"",
        },
    );
    let ready = poll_until(Instant::now() + Duration::from_secs(10), || {
        (0..3).all(|i| backend_line(&proxy, i).contains("state=up"))
    });
    assert!(ready.is_some(), "the proxy does not see its three masters up");
    let (mut a, mut b) = (proxy.client(), proxy.client());
    // Direct connections to the masters, opened once (see `pttl`).
    let (mut c1, mut c2, mut c3) = (m1.client(), m2.client(), m3.client());
    let label = format!(
        "{} {fault}, {}",
        version.full(),
        match config {
            Config::Defended => "default config",
            Config::VotesOnly => "judged by the votes alone (probe every 60 s)",
            Config::Unprotected => "quarantine = \"off\"",
        }
    );

    // A's acquisition, on clocks that all run at the machine's rate; on a loaded machine a
    // master may miss the backend timeout, and A tries again, as a lock client does. A fast clock
    // starts only once A holds: set before, one missed try left master 1 running fast long
    // enough for the probe to quarantine it, and every retry was refused (CI, 7.0 at 50 %).
    let mut tries = 0;
    let mut replies = Vec::new();
    let (sent, a_replied) = loop {
        tries += 1;
        set_px(&m3, KEY, "foreign", FOREIGN_TTL_MS);
        let sent = Instant::now();
        let granted = acquire(&mut a, KEY, "a", ttl_ms);
        let a_replied = Instant::now();
        if granted.as_deref() == Some("OK") {
            break (sent, a_replied);
        }
        replies.push(granted);
        assert!(
            tries < 3,
            "[{label}] A must be granted: the scenario rests on it ({tries} tries, replies {replies:?})"
        );
        std::thread::sleep(RETRY);
    };
    let ttl = Duration::from_millis(ttl_ms);
    let validity = ttl - ttl / 100 - Duration::from_millis(2);
    let valid_until = sent + validity;
    assert_eq!(
        (get(&mut c1), get(&mut c2), get(&mut c3)),
        (Some("a".to_owned()), Some("a".to_owned()), Some("foreign".to_owned())),
        "[{label}] A's grant must rest on masters 1 and 2"
    );
    match fault {
        Fault::Jump(by) => m1.jump_forward(by),
        Fault::Fast(speed) => m1.set_speed(speed),
    }
    let fault_at = Instant::now();

    // Master 1 drops A's key before A's validity ends; master 3's foreign value expires (each
    // time is when a poll first saw it gone).
    let (mut m1_dropped, mut m3_free) = (None, None);
    poll_until(valid_until, || {
        if m1_dropped.is_none() && pttl(&mut c1, KEY) == -2 {
            m1_dropped = Some(Instant::now());
        }
        if m3_free.is_none() && pttl(&mut c3, KEY) == -2 {
            m3_free = Some(Instant::now());
        }
        m1_dropped.is_some() && m3_free.is_some()
    });
    let m1_ahead = m1.clock_ahead_ms();
    let m1_dropped = m1_dropped.unwrap_or_else(|| {
        panic!("[{label}] master 1 kept A's key for all of A's validity: the scenario needs a shorter TTL")
    });
    let m3_free = m3_free.unwrap_or_else(|| panic!("[{label}] master 3's foreign value outlived A's validity"));

    // B tries until A's validity ends (its last send leaves the reply time to arrive within it).
    let mut attempts = 0;
    let mut refusals = Vec::new();
    let (mut first_attempt, mut last_attempt, mut b_granted) = (None, None, None);
    let mut m1_line = String::new();
    while Instant::now() + Duration::from_millis(5) < valid_until {
        let b_sent = Instant::now();
        let reply = query(&mut b, &["SET", KEY, "b", "NX", "PX", &ttl_ms.to_string()]);
        let replied = Instant::now();
        attempts += 1;
        first_attempt.get_or_insert(b_sent);
        last_attempt = Some(b_sent);
        if m1_line.is_empty() {
            m1_line = backend_line(&proxy, 0);
        }
        if reply == Ok(redis::Value::Okay) {
            b_granted = Some(replied);
            break;
        }
        refusals.push(reply);
        std::thread::sleep(RETRY);
    }
    let refused_nil = refusals.iter().filter(|r| **r == Ok(redis::Value::Nil)).count();

    let expected_drop = match fault {
        Fault::Jump(_) => String::new(),
        Fault::Fast(speed) => format!(" (ttl / speed: {:.0})", ttl_ms as f64 / speed),
    };
    println!(
        "[{label}] A: ttl {ttl_ms}, granted at {:.1} (try {tries}), validity until {:.0}; fault at {:.1}; \
         master 1 dropped A's key at {:.0}{expected_drop}, its clock {m1_ahead} ms ahead; \
         master 3's foreign value gone at {:.0}",
        ms(sent, a_replied),
        ms(sent, valid_until),
        ms(sent, fault_at),
        ms(sent, m1_dropped),
        ms(sent, m3_free),
    );
    match b_granted {
        Some(at) => println!(
            "[{label}] B: GRANTED at {:.0}, {:.0} ms before A's validity ends, after {} refusals: two holders",
            ms(sent, at),
            ms(at, valid_until),
            attempts - 1
        ),
        None => println!(
            "[{label}] B: {attempts} attempts from {:.0} to {:.0}, all refused ({refused_nil} nil, others {:?})",
            first_attempt.map_or(f64::NAN, |t| ms(sent, t)),
            last_attempt.map_or(f64::NAN, |t| ms(sent, t)),
            refusals
                .iter()
                .filter(|r| **r != Ok(redis::Value::Nil))
                .collect::<Vec<_>>()
        ),
    }
    println!("[{label}] INFO backends, master 1: {m1_line}");

    assert!(attempts > 0, "[{label}] B made no attempt within A's validity");
    match config {
        Config::Defended | Config::VotesOnly => {
            assert!(
                b_granted.is_none(),
                "[{label}] B was granted the lock while A's validity ran: two holders"
            );
            assert_eq!(
                refused_nil, attempts,
                "[{label}] every attempt of B must be refused with nil: {refusals:?}"
            );
            assert!(
                m1_line.contains("state=quarantined"),
                "[{label}] INFO backends must show master 1 quarantined: {m1_line}"
            );
        }
        Config::Unprotected => {
            let at = b_granted.unwrap_or_else(|| {
                panic!("[{label}] the unprotected control refused B: the scenario does not break an unprotected proxy")
            });
            assert!(at < valid_until, "[{label}] B's grant came after A's validity");
        }
    }
}

/// A jump forward on the master expires a key at once.
fn jump_expires_a_key(version: Version) {
    let mut m = FakeClockMaster::start(version);
    set_px(&m, "k", "v", 10_000);
    let before = m.clock_ahead_bounds();
    m.jump_forward(Duration::from_secs(30));
    let after = m.clock_ahead_bounds();
    let (value, left) = (m.get("k"), pttl(&mut m.client(), "k"));
    println!(
        "[{}] TIME ahead by {before:?} ms, after +30 s by {after:?} ms; PTTL {left}",
        version.full()
    );
    assert!(
        before.0 <= 0 && 0 <= before.1,
        "the master starts at the machine's time: {before:?} ms ahead"
    );
    assert!(
        after.0 <= 30_000 && 30_000 <= after.1,
        "the jump moves TIME by 30 s: {after:?} ms ahead"
    );
    assert_eq!((value, left), (None, -2), "the jump expires the key");
}

/// A speed of 1.5 runs the master's clock, and `PTTL`, down 1.5 times as fast, from the change
/// on (no jump). Each instant the master saw is bracketed by the test's clock: the TTL consumed
/// must lie between what the earliest and the latest of them give.
fn speed_runs_pttl_down_faster(version: Version) {
    const SPEED: f64 = 1.5;
    let mut m = FakeClockMaster::start(version);
    let mut c = m.client();
    let set_sent = Instant::now();
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .arg("PX")
        .arg(10_000)
        .query(&mut c)
        .expect("SET");
    let set_replied = Instant::now();
    let speed_set = Instant::now();
    m.set_speed(SPEED);
    // libfaketime applies the new speed at the master's next clock read: this one at the latest,
    // or an earlier one of the master's own (its cron reads the clock ten times a second). From
    // then on the clock runs fast, so at this read it can be ahead by at most what the new speed
    // gained since the change was asked for; never more (a jump).
    let at_change = m.clock_ahead_bounds();
    let changed_by = Instant::now();
    let gained = (SPEED - 1.0) * ms(speed_set, changed_by);
    // The fast clock running is what is measured.
    std::thread::sleep(Duration::from_millis(1000));
    let pttl_sent = Instant::now();
    let left = pttl(&mut c, "k");
    let pttl_replied = Instant::now();
    // Least consumed: SET, the change and PTTL as late, as late and as early as can be; most:
    // as early, as early and as late.
    let least = ms(set_replied, changed_by) + SPEED * ms(changed_by, pttl_sent);
    let most = ms(set_sent, set_replied) + SPEED * ms(set_replied, pttl_replied);
    let consumed = 10_000 - left;
    println!(
        "[{}] speed {SPEED}: TIME ahead by {at_change:?} ms at the change; {:.0} ms later PTTL {left}: \
         {consumed} ms consumed (bounds {least:.0} to {most:.0})",
        version.full(),
        ms(set_replied, pttl_sent),
    );
    assert!(
        at_change.0 as f64 <= gained + 1.0 && 0 <= at_change.1,
        "a new speed must not jump: {at_change:?} ms ahead, {gained:.0} ms at most gained since the change"
    );
    assert!(
        least - 2.0 <= consumed as f64 && consumed as f64 <= most + 2.0,
        "PTTL {left} at speed {SPEED}: {consumed} ms consumed, not within {least:.0} to {most:.0}"
    );
}

/// A speed set back to 1 after a fast spell keeps the clock where the spell left it, running
/// at the machine's rate again (the safety run alternates the two).
fn speed_back_to_normal(version: Version) {
    let mut m = FakeClockMaster::start(version);
    m.set_speed(1.5);
    std::thread::sleep(Duration::from_millis(1000));
    m.set_speed(1.0);
    let after_spell = m.clock_ahead_bounds();
    std::thread::sleep(Duration::from_millis(1000));
    let later = m.clock_ahead_bounds();
    println!(
        "[{}] ahead after a 1 s spell at 1.5: {after_spell:?} ms, 1 s later: {later:?} ms",
        version.full()
    );
    assert!((400..=600).contains(&after_spell.0), "the spell: {after_spell:?}");
    // Back to the machine's rate: a second later the offset is where it was, that is, the two
    // readings' bounds overlap (within 5 ms of scheduling). Still at 1.5 it would be 500 ms on.
    assert!(
        later.0 <= after_spell.1 + 5 && after_spell.0 <= later.1 + 5,
        "not back to the machine's rate: {after_spell:?} then {later:?}"
    );
}

macro_rules! per_version {
    ($($module:ident => $version:expr),* $(,)?) => {$(
        mod $module {
            use super::*;

            #[test]
            fn faketime_jump_expires_a_key() {
                jump_expires_a_key($version);
            }

            #[test]
            fn faketime_speed_runs_pttl_down_faster() {
                speed_runs_pttl_down_faster($version);
            }

            #[test]
            fn faketime_speed_back_to_normal() {
                speed_back_to_normal($version);
            }

            #[test]
            fn jump_defended() {
                scenario($version, Fault::Jump(Duration::from_secs(30)), 2_000, Config::Defended);
            }

            #[test]
            fn jump_defended_by_the_votes_alone() {
                scenario($version, Fault::Jump(Duration::from_secs(30)), 2_000, Config::VotesOnly);
            }

            #[test]
            fn fast_10_percent_defended_by_the_votes_alone() {
                scenario($version, Fault::Fast(1.1), 3_000, Config::VotesOnly);
            }

            #[test]
            fn jump_unprotected() {
                scenario($version, Fault::Jump(Duration::from_secs(30)), 2_000, Config::Unprotected);
            }

            #[test]
            fn fast_10_percent_defended() {
                scenario($version, Fault::Fast(1.1), 3_000, Config::Defended);
            }

            #[test]
            fn fast_10_percent_unprotected() {
                scenario($version, Fault::Fast(1.1), 3_000, Config::Unprotected);
            }

            #[test]
            fn fast_50_percent_defended() {
                scenario($version, Fault::Fast(1.5), 1_500, Config::Defended);
            }

            #[test]
            fn fast_50_percent_unprotected() {
                scenario($version, Fault::Fast(1.5), 1_500, Config::Unprotected);
            }
        }
    )*};
}

per_version!(redis_6_2 => Version::V6_2, redis_7_0 => Version::V7_0);
