//! Errors, split by the side that caused them, each mapped to the Redis-style reply a
//! client sees.
//!
//! A client's bad input, an unavailable lock service and a bug in the proxy are different
//! answers: `-ERR`/`-WRONGPASS`/... for the first, `-NOQUORUM` for the second, and
//! `-ERR internal` for the third.

use std::time::Duration;

use crate::backend::BackendError;
use crate::quorum::Answer;
use crate::reply::Reply;

/// Something the client sent that the proxy refuses. The connection stays open unless
/// the error is [`ClientError::Protocol`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Unparseable RESP: the connection is closed after this reply.
    #[error("ERR Protocol error: {0}")]
    Protocol(String),
    /// A command the proxy does not implement.
    #[error("ERR unknown command '{name}', with args beginning with: {args}")]
    UnknownCommand {
        /// The command name as sent.
        name: String,
        /// The first arguments, each quoted and followed by a space, as Redis words it.
        args: String,
    },
    /// An unknown subcommand of a container command (`CLIENT`, `SCRIPT`, ...).
    #[error("ERR unknown subcommand '{sub}'. Try {cmd} HELP.")]
    UnknownSubcommand {
        /// The container command, upper case.
        cmd: String,
        /// The subcommand as sent.
        sub: String,
    },
    /// Wrong number of arguments.
    #[error("ERR wrong number of arguments for '{0}' command")]
    WrongArity(String),
    /// Options that do not combine.
    #[error("ERR syntax error")]
    Syntax,
    /// A number that is not an integer.
    #[error("ERR value is not an integer or out of range")]
    NotInteger,
    /// A TTL of zero, negative, or overflowing.
    #[error("ERR invalid expire time in '{0}' command")]
    InvalidExpire(String),
    /// A TTL beyond `max_ttl_ms`: the restart quarantine is only as long as the longest lock.
    #[error("ERR lock TTL {ttl_ms} ms exceeds max_ttl_ms ({max_ttl_ms} ms)")]
    TtlTooLong {
        /// What the client asked for.
        ttl_ms: u64,
        /// The configured maximum.
        max_ttl_ms: u64,
    },
    /// A command option the proxy refuses, with the reason.
    #[error("ERR {0}")]
    Unsupported(String),
    /// `EVALSHA` of a script neither the proxy nor a quorum of masters knows.
    #[error("NOSCRIPT No matching script. Please use EVAL.")]
    NoScript,
    /// A command before `AUTH` when a password is configured.
    #[error("NOAUTH Authentication required.")]
    NoAuth,
    /// Wrong credentials.
    #[error("WRONGPASS invalid username-password pair or user is disabled.")]
    WrongPass,
    /// A named user touching a key outside its patterns.
    #[error("NOPERM User {user} has no permissions to access the '{key}' key")]
    NoPermKey {
        /// The user.
        user: String,
        /// The key.
        key: String,
    },
    /// A named user running a command it may not.
    #[error("NOPERM User {user} has no permissions to run the '{command}' command")]
    NoPermCommand {
        /// The user.
        user: String,
        /// The command.
        command: String,
    },
    /// A session lock of this connection was lost (told to a RESP2 client at its next `LOCK.*`
    /// command on the key).
    #[error("LOCKLOST the session lock on '{key}' held by this connection was lost: {reason}")]
    LockLost {
        /// The lock.
        key: String,
        /// `not-extended` or `max-hold`.
        reason: &'static str,
    },
    /// A waiting queue is full (`max_waiters_per_key` or `max_waiters`).
    #[error("ERR too many requests waiting for locks: {0} reached")]
    TooManyWaiters(String),
    /// A key under the proxy's own prefix (rule 11).
    #[error("NOPERM key '{0}' is reserved: the prefix 'redlock-proxy:' holds the proxy's own state on the masters")]
    ReservedKey(String),
    /// Keys in different hash slots, where a member is a Redis Cluster (which runs a
    /// script, a transaction or a multi-key command on one shard only).
    #[error("CROSSSLOT Keys in request don't hash to the same slot")]
    CrossSlot,
    /// A script outside the allowlist (`script_policy = "allowlist"`).
    #[error("NOPERM script {0} is not in the script allowlist")]
    NoPermScript(String),
    /// A script whose success depends on counting holders (it calls this command, see
    /// `scripts::counts`): a majority bounds one holder, not k (rule 14).
    #[error(
        "ERR script refused: it calls {0}, so its success depends on counting holders, which a majority of masters \
         cannot judge (k permits over N masters need more than N*k/(k+1) votes per grant); use a mutex per slot \
         instead: k lock keys name:1 .. name:k, each taken with SET NX"
    )]
    CountingScript(&'static str),
    /// `AUTH` while no password is configured.
    #[error(
        "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"
    )]
    AuthNotConfigured,
    /// `HELLO` with a protocol version other than 2 or 3.
    #[error("NOPROTO unsupported protocol version")]
    NoProto,
    /// `EVAL` with a negative key count.
    #[error("ERR Number of keys can't be negative")]
    NegativeKeys,
    /// `EVAL` with more keys than arguments.
    #[error("ERR Number of keys can't be greater than number of args")]
    TooManyKeys,
    /// `MULTI` inside `MULTI`.
    #[error("ERR MULTI calls can not be nested")]
    NestedMulti,
    /// `EXEC` with no `MULTI`.
    #[error("ERR EXEC without MULTI")]
    ExecWithoutMulti,
    /// `DISCARD` with no `MULTI`.
    #[error("ERR DISCARD without MULTI")]
    DiscardWithoutMulti,
    /// `WATCH` inside `MULTI`.
    #[error("ERR WATCH inside MULTI is not allowed")]
    WatchInMulti,
    /// `EXEC` after a command failed to queue.
    #[error("EXECABORT Transaction discarded because of previous errors.")]
    ExecAbort,
    /// `SELECT` of a database index out of range.
    #[error("ERR DB index is out of range")]
    DbOutOfRange,
}

/// The lock service could not decide: fewer than a quorum of masters could vote. The reply
/// says why the others could not, so a client's error is enough to tell a newcomer's
/// quarantined masters from a dead network (`PROXY BACKENDS` has the details).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NoQuorum {
    /// Masters that gave a reply that counts (for an acquisition: a grant or a refusal).
    pub answered: usize,
    /// All configured masters.
    pub total: usize,
    /// Masters quarantined after a (possible) restart (rule 8).
    pub quarantined: usize,
    /// The shortest quarantine left among them.
    pub votes_again_in: Option<Duration>,
    /// Masters known to be down (nothing was sent).
    pub down: usize,
    /// Masters that are another member's server under a second URL (rule 15; nothing sent).
    pub duplicates: usize,
    /// Masters whose wall clock was just seen to have jumped ahead (rule 15): their answers
    /// are no votes, and they are quarantined from now on.
    pub clocks_ahead: usize,
    /// Masters that did not answer within `backend_timeout_ms`, or whose connection failed.
    pub no_reply: usize,
    /// Masters that answered an error reply (`OOM`, `NOPERM`, `READONLY`, ...): a failure, not
    /// a vote (rule 5a).
    pub errors: usize,
    /// The first of those errors, to show the client.
    pub error: Option<String>,
}

impl NoQuorum {
    /// Why fewer than a quorum of `answers` could vote; `votes(reply)` says whether a reply
    /// counts.
    pub fn of<'a>(answers: impl IntoIterator<Item = &'a Answer>, votes: impl Fn(&Reply) -> bool) -> NoQuorum {
        let mut why = NoQuorum::default();
        for answer in answers {
            why.total += 1;
            match answer {
                Ok(reply) if votes(reply) => why.answered += 1,
                Ok(reply) => {
                    why.errors += 1;
                    if why.error.is_none() {
                        why.error = Some(reply_text(reply));
                    }
                }
                Err(BackendError::Quarantined { remaining }) => {
                    why.quarantined += 1;
                    why.votes_again_in = Some(why.votes_again_in.map_or(*remaining, |r| r.min(*remaining)));
                }
                Err(BackendError::Down) => why.down += 1,
                Err(BackendError::Duplicate { .. }) => why.duplicates += 1,
                Err(BackendError::ClockAhead { .. }) => why.clocks_ahead += 1,
                Err(BackendError::Timeout | BackendError::Pending | BackendError::Io(_)) => why.no_reply += 1,
            }
        }
        why
    }
}

/// A reply as one line of text for an error message.
fn reply_text(reply: &Reply) -> String {
    match reply {
        Reply::Error(e) | Reply::Status(e) | Reply::Bulk(e) => String::from_utf8_lossy(e).into_owned(),
        other => format!("{other:?}"),
    }
}

impl std::fmt::Display for NoQuorum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NOQUORUM {} of {} masters can vote", self.answered, self.total)?;
        let mut reasons = Vec::new();
        if self.quarantined > 0 {
            let mut r = format!("{} quarantined after a (possible) restart", self.quarantined);
            if let Some(left) = self.votes_again_in {
                r.push_str(&format!(
                    ", the first votes again in {} s",
                    left.as_millis().div_ceil(1000)
                ));
            }
            reasons.push(r);
        }
        if self.down > 0 {
            reasons.push(format!("{} down", self.down));
        }
        if self.duplicates > 0 {
            reasons.push(format!(
                "{} the same server (same run_id) as another member",
                self.duplicates
            ));
        }
        if self.clocks_ahead > 0 {
            reasons.push(format!(
                "{} whose wall clock jumped ahead, now quarantined",
                self.clocks_ahead
            ));
        }
        if self.no_reply > 0 {
            reasons.push(format!("{} did not answer in time", self.no_reply));
        }
        if let Some(error) = &self.error {
            reasons.push(format!("{} answered an error ({error})", self.errors));
        }
        if !reasons.is_empty() {
            write!(f, ": {}; see PROXY BACKENDS", reasons.join(", "))?;
        }
        Ok(())
    }
}

impl std::error::Error for NoQuorum {}

/// A quorum answered, but fewer than a quorum of masters had fencing counters they can vouch
/// for (they lost their data and have not been rewritten yet; `docs/fencing.md`, F3).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("NOQUORUM fencing: {trusted} of {total} backends have current fencing counters, a quorum is needed")]
pub struct Unfenced {
    /// Masters with trusted counters among those that answered.
    pub trusted: usize,
    /// All configured masters.
    pub total: usize,
}

impl From<Unfenced> for Reply {
    fn from(e: Unfenced) -> Reply {
        Reply::error(e.to_string())
    }
}

impl From<ClientError> for Reply {
    fn from(e: ClientError) -> Reply {
        Reply::error(e.to_string())
    }
}

impl From<NoQuorum> for Reply {
    fn from(e: NoQuorum) -> Reply {
        Reply::error(e.to_string())
    }
}

/// Errors that stop the proxy from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid; the message names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address from `listen`.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}
