//! `--check-config`: the configuration in force and where it came from, its warnings, and
//! what the masters' round trips, measured from here, say of its timeouts.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::backend::locate::sentinel_url;
use crate::backend::url::{cluster_url, describe_url, mask_url};
use crate::config::Config;

/// How many `PING`s measure a master's round trip (the slowest counts).
const PINGS: usize = 3;

/// How long the measurement of one master may take in all: a master that does not answer
/// by then is reported unreachable.
const MEASURE_FOR: Duration = Duration::from_secs(3);

/// Prints the configuration `config` (read from `source`) to stdout, and to stderr where it
/// came from, each member, the session bounds, the warnings and the verdict.
pub fn run(config: &Config, source: &str) -> ExitCode {
    // The configuration goes to stdout and the verdict to stderr. The configuration ends
    // with a newline and is flushed before the verdict, so that on a terminal (or with
    // `2>&1`) `configuration OK` is a line of its own, whichever field comes last.
    let mut text = config.to_toml();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        eprintln!("redlock-proxy: cannot print the configuration: {e}");
        return ExitCode::FAILURE;
    }
    drop(stdout);
    eprintln!("configuration from {source}");
    for (i, url) in config.backends.iter().enumerate() {
        eprintln!("member {i}: {}", describe_url(url));
    }
    eprintln!("{}", config.session_bounds());
    let mut warnings = config.warnings();
    warnings.extend(round_trips(config));
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
    eprintln!("configuration OK");
    ExitCode::SUCCESS
}

/// What one master's measurement found.
#[derive(Debug)]
enum Measured {
    /// Connected (TCP, TLS, `AUTH`) in `connect`; the slowest `PING` took `round_trip`.
    Answered { connect: Duration, round_trip: Duration },
    /// Not reachable from here, or no answer within [`MEASURE_FOR`].
    Unreachable(String),
}

/// Measures, concurrently, each single master's round trip from this host and warns where
/// a timeout cannot fit it: a handshake or request that needs longer than its bound keeps
/// the master down for ever (`connect timed out`, `probe timed out`). Sentinel groups and
/// clusters are not measured (their masters move).
fn round_trips(config: &Config) -> Vec<String> {
    let plain: Vec<(usize, &String)> = config
        .backends
        .iter()
        .enumerate()
        .filter(|(_, url)| cluster_url(url).is_none() && sentinel_url(url).is_none())
        .collect();
    if plain.is_empty() {
        return Vec::new();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return vec![format!("the masters' round trips were not measured: {e}")],
    };
    let tls = match config.tls_ca_file.as_deref().map(crate::tls::connector).transpose() {
        Ok(tls) => tls,
        Err(e) => return vec![format!("the masters' round trips were not measured: {e}")],
    };
    let measured = runtime.block_on(async {
        let each = plain.iter().map(|(_, url)| measure(url, tls.as_ref()));
        futures_util::future::join_all(each).await
    });
    // A name lookup still running (it has no timeout of its own) is not waited for.
    runtime.shutdown_background();
    let timeouts = (
        Duration::from_millis(config.connect_timeout_ms),
        Duration::from_millis(config.backend_timeout_ms),
    );
    plain
        .iter()
        .zip(measured)
        .filter_map(|((i, url), measured)| judge(*i, &mask_url(url), &measured, timeouts))
        .collect()
}

/// Connects to the master at `url` and times `PING`s.
async fn measure(url: &str, tls: Option<&tokio_rustls::TlsConnector>) -> Measured {
    let timed = async {
        let started = Instant::now();
        let conn = crate::backend::redis::open_url(url, tls).await?;
        let connect = started.elapsed();
        let mut round_trip = Duration::ZERO;
        for _ in 0..PINGS {
            let sent = Instant::now();
            conn.command(&[b"PING"]).await.map_err(|e| e.to_string())?;
            round_trip = round_trip.max(sent.elapsed());
        }
        Ok::<_, String>(Measured::Answered { connect, round_trip })
    };
    match tokio::time::timeout(MEASURE_FOR, timed).await {
        Ok(Ok(measured)) => measured,
        Ok(Err(e)) => Measured::Unreachable(e),
        Err(_) => Measured::Unreachable(format!("no answer within {} s", MEASURE_FOR.as_secs())),
    }
}

/// The warning for member `i` at `addr`, if its measurement does not fit the timeouts
/// (`connect_timeout_ms`, `backend_timeout_ms`). A request is one round trip; the margin of
/// half the timeout leaves room for the master's own work and the network's jitter.
fn judge(
    i: usize,
    addr: &str,
    measured: &Measured,
    (connect_timeout, backend_timeout): (Duration, Duration),
) -> Option<String> {
    match *measured {
        Measured::Unreachable(ref why) => Some(format!(
            "member {i} ({addr}) is not reachable from this host ({why}): it stays down until it is"
        )),
        Measured::Answered { round_trip, .. } if round_trip * 2 > backend_timeout => Some(format!(
            "member {i} ({addr}): round trip {} ms measured, and backend_timeout_ms = {} leaves it less than \
             twice that: every request and probe that meets a little jitter times out (the master is then \
             marked down); raise backend_timeout_ms above {} ms",
            round_trip.as_millis(),
            backend_timeout.as_millis(),
            (round_trip * 2).as_millis()
        )),
        Measured::Answered { connect, .. } if connect > connect_timeout => Some(format!(
            "member {i} ({addr}): connecting (TCP, TLS, AUTH) took {} ms, over connect_timeout_ms = {}: \
             every connection attempt times out; raise connect_timeout_ms",
            connect.as_millis(),
            connect_timeout.as_millis()
        )),
        Measured::Answered { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: (Duration, Duration) = (Duration::from_millis(250), Duration::from_millis(250));

    fn answered(connect_ms: u64, round_trip_ms: u64) -> Measured {
        Measured::Answered {
            connect: Duration::from_millis(connect_ms),
            round_trip: Duration::from_millis(round_trip_ms),
        }
    }

    #[test]
    fn a_round_trip_that_fits_twice_in_the_timeout_is_fine() {
        assert_eq!(judge(0, "h:1", &answered(1, 100), TIMEOUTS), None);
    }

    #[test]
    fn a_round_trip_near_the_timeout_is_named_with_the_fix() {
        let warning = judge(2, "h:1", &answered(1, 200), TIMEOUTS).expect("a warning");
        assert!(
            warning.starts_with("member 2 (h:1): round trip 200 ms measured"),
            "{warning}"
        );
        assert!(warning.contains("raise backend_timeout_ms above 400 ms"), "{warning}");
    }

    #[test]
    fn a_slow_connect_and_an_unreachable_master_are_named() {
        let slow = judge(1, "h:1", &answered(400, 10), TIMEOUTS).expect("a warning");
        assert!(slow.contains("took 400 ms, over connect_timeout_ms = 250"), "{slow}");
        let gone = judge(1, "h:1", &Measured::Unreachable("refused".into()), TIMEOUTS).expect("a warning");
        assert!(gone.contains("not reachable from this host (refused)"), "{gone}");
    }
}
