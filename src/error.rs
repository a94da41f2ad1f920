//! Errors, split by the side that caused them, each mapped to the Redis-style reply a
//! client sees.
//!
//! A client's bad input, an unavailable lock service and a bug in the proxy are different
//! answers: `-ERR`/`-WRONGPASS`/... for the first, `-NOQUORUM` for the second, and
//! `-ERR internal` for the third.
//!
//! Each layer owns its errors, converted where they cross a layer: the quorum layer's
//! [`crate::quorum::NoQuorum`] and [`crate::quorum::Unfenced`] live there and become replies
//! in the proxy. This module holds the client's and the start-up's, and uses neither the
//! quorum layer nor the backends.

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
    /// A subcommand Redis has and the proxy does not serve (`CONFIG SET`), with the reason
    /// and what it serves instead: a client learns why, not just "unknown".
    #[error("ERR {command} is not supported by the proxy: {why}; it serves {served}")]
    NotServed {
        /// The command as sent, upper case (`CONFIG SET`).
        command: String,
        /// Why the proxy does not serve it.
        why: &'static str,
        /// The container's subcommands it serves (`CONFIG GET, CONFIG HELP`).
        served: String,
    },
    /// `COMMAND GETKEYS` of a command the proxy does not serve.
    #[error("ERR Invalid command specified")]
    InvalidCommand,
    /// `COMMAND GETKEYS` of a command that takes no keys.
    #[error("ERR The command has no key arguments")]
    NoKeyArguments,
    /// `COMMAND GETKEYS` of a command with the wrong number of arguments.
    #[error("ERR Invalid number of arguments specified for command")]
    InvalidArgumentCount,
    /// `COMMAND GETKEYS` of a command whose key count does not fit its arguments.
    #[error("ERR Invalid arguments specified for command")]
    InvalidKeyArguments,
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
    /// A semaphore acquisition naming another count of permits than the one its live slots
    /// were taken with, on some master (the count is fixed while any permit is held).
    #[error(
        "ERR semaphore '{key}' is held with {held} permits, not {asked}: its count is fixed while any permit is held"
    )]
    PermitsMismatch {
        /// The semaphore.
        key: String,
        /// The count its holders took it with.
        held: u32,
        /// The count asked for.
        asked: u32,
    },
    /// A semaphore acquisition with a token that holds one of its slots already (on some
    /// master): a token holds one permit at most, never a second one silently.
    #[error(
        "ERR this token already holds slot {slot} of semaphore '{key}': a token holds one permit at most; release it \
         (SEM.RELEASE) or use a new token for each acquisition"
    )]
    AlreadyHolds {
        /// The semaphore.
        key: String,
        /// The slot it holds.
        slot: u32,
    },
    /// A read-write lock acquisition with a token that holds the lock already, in the same
    /// mode (no second hold: one release would end both) or the other (a reader asking to write
    /// would wait for itself; a writer asking to read holds more than it asks).
    #[error(
        "ERR this token already holds a {held} lock on '{key}': a token holds a read-write lock once, in one mode; \
         {hint}"
    )]
    AlreadyHoldsRw {
        /// The lock.
        key: String,
        /// `read` or `write`: the hold it has.
        held: &'static str,
        /// What to do instead.
        hint: &'static str,
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
         cannot judge (k permits over N masters need more than N*k/(k+1) votes per grant); for k permits use \
         SEM.ACQUIRE name token k ttl_ms [WAIT ms], which serves them as k mutexes (see PROXY HELP)"
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

impl From<ClientError> for Reply {
    fn from(e: ClientError) -> Reply {
        Reply::error(e.to_string())
    }
}

/// Errors that stop the proxy from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid; the message names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A listening socket could not be bound.
    #[error("cannot listen on {addr} (`{key}`): {source}")]
    Listen {
        /// The key that names it: `listen`, `tls_listen` or `metrics_listen`.
        key: &'static str,
        /// Its address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}
