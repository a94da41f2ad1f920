//! Metric names, in one place, and the Prometheus exporter.
//!
//! Recording goes through the `metrics` facade: without an installed exporter (unit tests,
//! `metrics_listen` unset) every record is a no-op.
//!
//! Each metric is declared once, below, with its kind and unit: its doc comment is also its
//! `# HELP` text on `/metrics` ([`describe`]), so what the code says and what an operator
//! reads cannot drift apart. docs/operations.md lists the same metrics (a test compares it with
//! what a proxy exports).

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::error::StartError;

/// What kind of series a metric is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets (`_bucket`, `_sum`, `_count`).
    Histogram,
}

/// One exported metric: its name, kind, unit and description.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// The name on `/metrics`.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// What a value counts or measures (`None`: a code, such as a state).
    pub unit: Option<metrics::Unit>,
    /// The declaration's doc comment, as written (Markdown).
    pub doc: &'static str,
}

impl Metric {
    /// The `# HELP` text: the doc comment on one line, without its Markdown backticks.
    pub fn help(&self) -> String {
        self.doc
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('`', "")
    }
}

/// Declares each metric's name constant, and [`ALL`], from one list: `kind(unit) NAME =
/// "name";` under the doc comment that describes it.
macro_rules! declare {
    (@unit) => { None };
    (@unit $unit:ident) => { Some(metrics::Unit::$unit) };
    ($( $(#[doc = $doc:literal])+ $kind:ident($($unit:ident)?) $name:ident = $metric:literal; )+) => {
        $(
            $(#[doc = $doc])+
            pub const $name: &str = $metric;
        )+

        /// Every metric the proxy exports, with what [`describe`] tells about it.
        pub const ALL: &[Metric] = &[$(
            Metric {
                name: $metric,
                kind: Kind::$kind,
                unit: declare!(@unit $($unit)?),
                doc: concat!($($doc, "\n"),+),
            },
        )+];
    };
}

declare! {
    /// Commands answered, by `command` and `outcome`. `command` names what the client sent:
    /// `set_nx` (`SET ... NX`), `set_ifeq` (`SET ... IFEQ`), `set` (other `SET`s, `GETSET`),
    /// `setnx`, `delex`, `pexpire` (`PEXPIRE` and `EXPIRE`), `eval`, `evalsha`, `script`,
    /// `get`, `pttl`, `ttl`, `llen`, `exists`, `del`, `unlink`, `zrem`, `blpop`, and each
    /// recipe command by its name: `lock.acquire`, `lock.extend`, `lock.release`, `lock.info`,
    /// `lock.fence`, `lock.acquireall`, `lock.releaseall`, `sem.acquire`, `sem.extend`,
    /// `sem.release`, `sem.info`, `rwlock.read`, `rwlock.write`, `rwlock.extend`,
    /// `rwlock.release`, `rwlock.info`, `elect.campaign`, `elect.resign`, `elect.leader`,
    /// `elect.observe`, `elect.unobserve`. `outcome`:
    /// `acquired`, `contended` (an acquisition refused: the lock is held, or a wait ran out),
    /// `noquorum`, `noscript` (an `EVALSHA` of a script the proxy has not seen: the client
    /// sends it with `EVAL` next), `error`, `ok`.
    Counter(Count) COMMANDS = "redlock_commands_total";
    /// Time of one quorum round of a lock acquisition (`SET NX`, `SETNX`, `LOCK.ACQUIRE`): one
    /// observation per attempt, so a `LOCK.ACQUIRE ... WAIT` adds one per try and none for the
    /// time it waits between tries (that is `redlock_wait_seconds`).
    Histogram(Seconds) ACQUIRE_SECONDS = "redlock_acquire_seconds";
    /// Time to answer a release (`LOCK.RELEASE`, `DELEX`, `DEL`, `UNLINK`, `ZREM`, and
    /// `EVAL`/`EVALSHA` of a script that sets no TTL).
    Histogram(Seconds) RELEASE_SECONDS = "redlock_release_seconds";
    /// Time to answer an extension (`LOCK.EXTEND`, `PEXPIRE`, `SET IFEQ`, scripts that set a
    /// TTL).
    Histogram(Seconds) EXTEND_SECONDS = "redlock_extend_seconds";
    /// One master's answer time, by `backend`.
    Histogram(Seconds) BACKEND_REQUEST_SECONDS = "redlock_backend_request_seconds";
    /// Requests a master did not answer within `backend_timeout_ms`, by `backend`.
    Counter(Count) BACKEND_TIMEOUTS = "redlock_backend_timeouts_total";
    /// Requests that failed on a master's connection, by `backend`.
    Counter(Count) BACKEND_ERRORS = "redlock_backend_errors_total";
    /// A master's state, by `backend`: 0 down, 1 up, 2 quarantined, 3 duplicate (the same
    /// server as another member, counted once: rule 15).
    Gauge() BACKEND_STATE = "redlock_backend_state";
    /// Time until a quarantined master votes again, by `backend` (0 when it is not quarantined).
    Gauge(Seconds) BACKEND_QUARANTINE_REMAINING = "redlock_backend_quarantine_remaining_seconds";
    /// 1 for each member's current shape: `kind` (`redis`, `sentinel`, `cluster`, `embedded`)
    /// and `master` (where a Sentinel group's master is now); 0 for the master it had before a
    /// failover.
    Gauge() BACKEND_MASTER = "redlock_backend_master";
    /// A cluster member's shard master's state, by `backend` and `master`: 0 down, 1 up, 2
    /// quarantined (a quarantine covers that shard's slots only).
    Gauge() SHARD_STATE = "redlock_shard_state";
    /// Time until a cluster shard's quarantined master votes again, by `backend` and `master`.
    Gauge(Seconds) SHARD_QUARANTINE_REMAINING = "redlock_shard_quarantine_remaining_seconds";
    /// How many hash slots a cluster shard's master serves, by `backend` and `master` (0 once
    /// it serves none).
    Gauge(Count) SHARD_SLOTS = "redlock_shard_slots";
    /// Lock replies whose validity ran out before they could be written (rule 4a): answered
    /// as failures, and the grants undone.
    Counter(Count) STALE_REPLIES = "redlock_stale_replies_total";
    /// Grants whose masters' fencing counters disagreed, so that the token took one more
    /// round trip, written back to every master (F2). A master that missed acquisitions
    /// (down, slow, or still holding the previous holder's lock when the next one was
    /// granted) catches up this way; a steady rise says a master keeps falling behind.
    Counter(Count) FENCE_WRITE_BACKS = "redlock_fence_write_backs_total";
    /// Acquisitions the legacy member refused while a quorum of masters granted them: almost
    /// always locks the old code holds on the legacy server during a rollout (a proxy client's
    /// own lock refuses too for the milliseconds its copy there outlives the masters'); 0
    /// without `legacy_backend`.
    Counter(Count) LEGACY_REFUSALS = "redlock_legacy_refusals_total";
    /// Locks on bridged keys that the legacy member holds and the masters do not (the old
    /// code's), as its watch last counted them; 0 without `legacy_backend`.
    Gauge(Count) LEGACY_OLD_CODE_LOCKS = "redlock_legacy_old_code_locks";
    /// Session locks held now (kept alive while their connection is open).
    Gauge(Count) SESSION_LOCKS = "redlock_session_locks";
    /// Session locks lost, by `reason`: `not-extended` (no quorum extended it in time),
    /// `lost-on-legacy` (the legacy member of a rollout answered that the old code holds it),
    /// `max-hold` (held longer than `max_hold_ms`), or a command without the holder's token
    /// that succeeded on it: `deleted`, `overwritten`, `expire-changed`, or `released` (with
    /// the holder's token, through another connection).
    Counter(Count) SESSION_LOCKS_LOST = "redlock_session_locks_lost_total";
    /// Session locks released because their connection closed.
    Counter(Count) SESSION_LOCKS_ENDED_BY_DISCONNECT = "redlock_session_locks_ended_by_disconnect_total";
    /// Requests waiting for a lock now (`LOCK.ACQUIRE ... WAIT`).
    Gauge(Count) WAITERS = "redlock_waiters";
    /// How long a `LOCK.ACQUIRE ... WAIT` request waited, from its arrival to its answer, by
    /// `outcome`: `acquired`, `timeout` (its `WAIT` ran out first), `noquorum` (it ran out
    /// while the masters could not decide), `disconnected` (the client went away), `error`.
    Histogram(Seconds) WAIT_SECONDS = "redlock_wait_seconds";
    /// Locks handed to a waiting request after a release or an expiry woke it.
    Counter(Count) HANDOFFS = "redlock_handoffs_total";
    /// Clients connected now.
    Gauge(Count) CLIENT_CONNECTIONS = "redlock_client_connections";
    /// Clients dropped past a bound, by `limit`: `client_output_buffer_limit` (replies left
    /// unread past it) or `client_stall_timeout_ms` (no reply byte taken, or input stuck past
    /// `client_query_buffer_limit`, for that long).
    Counter(Count) CLIENTS_DROPPED = "redlock_clients_dropped_total";
    /// `AUTH`/`HELLO AUTH` attempts with wrong credentials.
    Counter(Count) AUTH_FAILURES = "redlock_auth_failures_total";
    /// Log lines dropped because stderr was not read fast enough (a pipe nobody reads, a
    /// stalled journal): the proxy never waits for its log.
    Counter(Count) LOG_LINES_DROPPED = "redlock_log_lines_dropped_total";
}

/// Histogram buckets, in seconds: lock operations take a few hundred microseconds on a LAN
/// and at most a couple of backend timeouts.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Buckets of [`WAIT_SECONDS`]: a wait lasts as long as another client holds the lock, often
/// seconds; with the lock operations' buckets every wait past 2.5 s would fall in `+Inf`.
const WAIT_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The log writer's count of dropped lines, once logging is set up
/// ([`count_dropped_log_lines`]).
static DROPPED_LOG_LINES: std::sync::OnceLock<tracing_appender::non_blocking::ErrorCounter> =
    std::sync::OnceLock::new();

/// Exports the log writer's count of dropped lines as [`LOG_LINES_DROPPED`] (read at each
/// upkeep of the recorder).
pub fn count_dropped_log_lines(counter: tracing_appender::non_blocking::ErrorCounter) {
    let _ = DROPPED_LOG_LINES.set(counter);
}

/// How often the recorder's upkeep runs (drains histogram data: without it memory grows);
/// the exporter's own listener ran it at this interval.
const UPKEEP: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the Prometheus recorder and returns the handle that renders `/metrics` (served by
/// [`crate::status`] on `metrics_listen`, with the status page). Must run inside the runtime:
/// the recorder's upkeep runs in a task of its own.
pub fn install() -> Result<PrometheusHandle, StartError> {
    let fail = |e: &dyn std::fmt::Display| StartError::Config(format!("metrics_listen: {e}"));
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
        .map_err(|e| fail(&e))?
        .set_buckets_for_metric(Matcher::Full(WAIT_SECONDS.into()), &WAIT_BUCKETS)
        .map_err(|e| fail(&e))?
        .install_recorder()
        .map_err(|e| fail(&e))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(UPKEEP);
        loop {
            ticker.tick().await;
            upkeep.run_upkeep();
            if let Some(dropped) = DROPPED_LOG_LINES.get() {
                metrics::counter!(LOG_LINES_DROPPED).absolute(dropped.dropped_lines() as u64);
            }
        }
    });
    describe();
    Ok(handle)
}

/// Gives the installed exporter every metric's `# HELP` text and unit (from [`ALL`]), and
/// exports the metrics without labels at 0 from the start: a series that appears only at its
/// first event makes `rate()` and alerts blind to that event, and leaves an operator unsure
/// whether the metric exists at all.
pub fn describe() {
    for metric in ALL {
        let (name, help) = (metric.name, metric.help());
        match (metric.kind, metric.unit) {
            (Kind::Counter, Some(unit)) => metrics::describe_counter!(name, unit, help),
            (Kind::Counter, None) => metrics::describe_counter!(name, help),
            (Kind::Gauge, Some(unit)) => metrics::describe_gauge!(name, unit, help),
            (Kind::Gauge, None) => metrics::describe_gauge!(name, help),
            (Kind::Histogram, Some(unit)) => metrics::describe_histogram!(name, unit, help),
            (Kind::Histogram, None) => metrics::describe_histogram!(name, help),
        }
    }
    for counter in [
        STALE_REPLIES,
        FENCE_WRITE_BACKS,
        LEGACY_REFUSALS,
        SESSION_LOCKS_ENDED_BY_DISCONNECT,
        HANDOFFS,
        AUTH_FAILURES,
        LOG_LINES_DROPPED,
    ] {
        metrics::counter!(counter).increment(0);
    }
    for gauge in [SESSION_LOCKS, WAITERS, CLIENT_CONNECTIONS, LEGACY_OLD_CODE_LOCKS] {
        metrics::gauge!(gauge).increment(0.0);
    }
    // Registered, so that their buckets are exported at 0 too.
    for histogram in [ACQUIRE_SECONDS, RELEASE_SECONDS, EXTEND_SECONDS] {
        let _ = metrics::histogram!(histogram);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_named_once_and_described() {
        let mut names: Vec<&str> = ALL.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a name declared twice");
        for metric in ALL {
            assert!(metric.name.starts_with("redlock_"), "{}", metric.name);
            assert!(
                !metric.help().is_empty() && !metric.help().contains('`'),
                "{}",
                metric.name
            );
            // Prometheus conventions: counters end in `_total`, times are in seconds.
            assert_eq!(
                metric.kind == Kind::Counter,
                metric.name.ends_with("_total"),
                "{}",
                metric.name
            );
            assert_eq!(
                metric.unit == Some(metrics::Unit::Seconds),
                metric.name.ends_with("_seconds"),
                "{}",
                metric.name
            );
        }
    }

    #[test]
    fn help_is_the_doc_comment_on_one_line() {
        let state = ALL.iter().find(|m| m.name == BACKEND_STATE).unwrap();
        assert_eq!(
            state.help(),
            "A master's state, by backend: 0 down, 1 up, 2 quarantined, 3 duplicate (the same server as another member, \
             counted once: rule 15)."
        );
    }
}
