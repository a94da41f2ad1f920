//! Metric names, in one place, and the Prometheus exporter.
//!
//! Recording goes through the `metrics` facade: without an installed exporter (unit tests,
//! `metrics_listen` unset) every record is a no-op.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::error::StartError;

/// Commands processed, by `command` and `outcome` (acquired, contended, noquorum, error, ok).
pub const COMMANDS: &str = "redlock_commands_total";
/// Time to answer a lock acquisition (`SET NX`, `SETNX`).
pub const ACQUIRE_SECONDS: &str = "redlock_acquire_seconds";
/// Time to answer a release (`EVAL`/`EVALSHA` of a script that sets no TTL, `DELEX`, `DEL`).
pub const RELEASE_SECONDS: &str = "redlock_release_seconds";
/// Time to answer an extension (`PEXPIRE`, `SET IFEQ`, scripts that set a TTL).
pub const EXTEND_SECONDS: &str = "redlock_extend_seconds";
/// One master's answer time, by `backend`.
pub const BACKEND_REQUEST_SECONDS: &str = "redlock_backend_request_seconds";
/// Requests a master did not answer within `backend_timeout_ms`, by `backend`.
pub const BACKEND_TIMEOUTS: &str = "redlock_backend_timeouts_total";
/// Requests that failed on a master's connection, by `backend`.
pub const BACKEND_ERRORS: &str = "redlock_backend_errors_total";
/// A master's state, by `backend`: 0 down, 1 up, 2 quarantined, 3 duplicate of another member (rule 15).
pub const BACKEND_STATE: &str = "redlock_backend_state";
/// Time until a quarantined master votes again, by `backend`.
pub const BACKEND_QUARANTINE_REMAINING: &str = "redlock_backend_quarantine_remaining_seconds";
/// 1 for each member's current shape: `kind` (`redis`, `sentinel`, `cluster`, `embedded`) and `master`
/// (where a Sentinel group's master is now); 0 for the master it had before a failover.
pub const BACKEND_MASTER: &str = "redlock_backend_master";
/// A cluster member's shard master's state, by `backend` and `master`: 0 down, 1 up, 2
/// quarantined (a quarantine covers that shard's slots only).
pub const SHARD_STATE: &str = "redlock_shard_state";
/// Time until a cluster shard's quarantined master votes again, by `backend` and `master`.
pub const SHARD_QUARANTINE_REMAINING: &str = "redlock_shard_quarantine_remaining_seconds";
/// How many hash slots a cluster shard's master serves, by `backend` and `master` (0 once it
/// serves none).
pub const SHARD_SLOTS: &str = "redlock_shard_slots";
/// Lock replies whose validity ran out before they could be written (rule 4a): answered as
/// failures, and the grants undone.
pub const STALE_REPLIES: &str = "redlock_stale_replies_total";
/// Session locks held now (kept alive while their connection is open).
pub const SESSION_LOCKS: &str = "redlock_session_locks";
/// Session locks lost, by `reason` (`not-extended`, `max-hold`).
pub const SESSION_LOCKS_LOST: &str = "redlock_session_locks_lost_total";
/// Session locks released because their connection closed.
pub const SESSION_LOCKS_ENDED_BY_DISCONNECT: &str = "redlock_session_locks_ended_by_disconnect_total";
/// Requests waiting for a lock now (`LOCK.ACQUIRE ... WAIT`).
pub const WAITERS: &str = "redlock_waiters";
/// How long a waiting request waited before it got the lock.
pub const WAIT_SECONDS: &str = "redlock_wait_seconds";
/// Locks handed to a waiting request after a release or an expiry woke it.
pub const HANDOFFS: &str = "redlock_handoffs_total";
/// Clients connected now.
pub const CLIENT_CONNECTIONS: &str = "redlock_client_connections";
/// `AUTH`/`HELLO AUTH` attempts with wrong credentials.
pub const AUTH_FAILURES: &str = "redlock_auth_failures_total";

/// Histogram buckets, in seconds: lock operations take a few hundred microseconds on a LAN
/// and at most a couple of backend timeouts.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

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
        .install_recorder()
        .map_err(|e| fail(&e))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(UPKEEP);
        loop {
            ticker.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}
