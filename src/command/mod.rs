//! Parsing a request (a list of arguments) into a typed [`Command`]: a command the connection
//! answers itself, or a call of a recipe.
//!
//! [`connection`] holds the commands answered by the proxy itself, [`script`] `EVAL`,
//! `EVALSHA` and `SCRIPT`; each recipe's commands are typed and parsed in its folder
//! (`crate::recipes::*::{command, parse}`). [`table`] is the one table of every command served,
//! through which a request finds its parser and from which `COMMAND` and `HELP` are answered;
//! [`spec`] says what a row of it holds. Parsing knows nothing of configuration or backends; it
//! only checks syntax, the way Redis does, with Redis's error texts.

// A forgotten variant must not skip the session bounds or the value-size limit: every match
// on a command names each variant (no `_ =>`).
#![cfg_attr(not(test), deny(clippy::wildcard_enum_match_arm))]

pub mod call;
pub mod connection;
pub mod options;
pub mod recipe;
pub mod script;
pub mod spec;
pub mod table;

use bytes::Bytes;

pub use crate::recipes::lock::command::{Condition, DelCondition, DelEx, Expire, Expiry, Forward, ForwardKind, Set};
pub use call::{Call, LockOp, LossOf, Released, Serve};
pub use recipe::Recipe;
pub use connection::{ClientCmd, CommandCmd, Hello, ListFilter, Local, ProxyCmd};
pub use script::{Eval, ScriptCmd};
pub use spec::Spec;

use crate::error::ClientError;

/// A parsed client command.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// A command the connection answers itself, without the masters.
    Local(Local),
    /// `SET key token NX ...`: take a lock on a majority. Its own kind, decided here once:
    /// the grant path, the metrics, transactions and sessions read the kind, not the options.
    Acquire(Set),
    /// `SET` without `NX` (and `GETSET`): a write sent to every master, or with `IFEQ` an
    /// owner-checked extension.
    Set(Set),
    /// `SETNX key value`: the legacy lock, decided by a majority.
    SetNx {
        /// The key.
        key: Bytes,
        /// The value (in the legacy pattern, an expiry timestamp).
        value: Bytes,
    },
    /// `DELEX key [IFEQ v | IFNE v]`.
    DelEx(DelEx),
    /// `PEXPIRE`/`EXPIRE`.
    Expire(Expire),
    /// `EVAL` / `EVALSHA`: run a script on every master and combine the replies.
    Eval(Eval),
    /// `SCRIPT LOAD | EXISTS | FLUSH`.
    Script(ScriptCmd),
    /// A key command sent to every master, replies combined by the majority rule.
    Forward(Forward),
    /// `MULTI`: start queueing.
    Multi,
    /// `EXEC`: run the queue atomically on each master.
    Exec,
    /// `DISCARD`: drop the queue.
    Discard,
    /// `WATCH key ...`: abort the next `EXEC` if these keys change.
    Watch(Vec<Bytes>),
    /// `UNWATCH`.
    Unwatch,
    /// `PROXY BACKENDS | CONFIG | QUARANTINE`: the operator's commands.
    Proxy(ProxyCmd),
    /// A call of one of the recipes' native commands (`LOCK.*`, `SEM.*`, `RWLOCK.*`, `ELECT.*`).
    Recipe(Recipe),
    /// `BLPOP key [key ...] timeout`: a wake-up signal (python-redis-lock's), never a grant.
    BlPop {
        /// The signal lists.
        keys: Vec<Bytes>,
        /// How long to wait; `None`: for ever (a timeout of 0).
        timeout: Option<std::time::Duration>,
    },
}

impl Command {
    /// The keys this command names (`WATCH`'s too): what permissions, reserved keys, size
    /// limits and cluster slots are judged on.
    pub fn keys(&self) -> &[Bytes] {
        match self {
            Command::Set(Set { key, .. })
            | Command::Acquire(Set { key, .. })
            | Command::SetNx { key, .. }
            | Command::DelEx(DelEx { key, .. })
            | Command::Expire(Expire { key, .. }) => std::slice::from_ref(key),
            Command::Recipe(r) => r.call().keys(),
            Command::Eval(e) => e.keys(),
            Command::Forward(f) => &f.keys,
            Command::BlPop { keys, .. } | Command::Watch(keys) => keys,
            Command::Local(_)
            | Command::Script(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Unwatch
            | Command::Proxy(_) => &[],
        }
    }

    /// Whether this command runs alone, after every command of its connection before it and
    /// before any after it: it changes the connection's state, or may touch any key (a script
    /// that declares none). Any other runs concurrently with the commands of its connection
    /// that name other keys.
    pub fn runs_alone(&self) -> bool {
        match self {
            Command::Set(_)
            | Command::Acquire(_)
            | Command::SetNx { .. }
            | Command::DelEx(_)
            | Command::Expire(_)
            | Command::Recipe(_)
            | Command::Forward(_)
            | Command::BlPop { .. }
            | Command::Local(Local::Ping(_) | Local::Echo(_)) => false,
            Command::Eval(e) => e.numkeys == 0,
            Command::Local(
                Local::Quit
                | Local::Reset
                | Local::Hello(_)
                | Local::Auth { .. }
                | Local::Select(_)
                | Local::Client(_)
                | Local::Info(_)
                | Local::Command(_)
                | Local::Help(_)
                | Local::ConfigGet(_)
            )
            | Command::Script(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Watch(_)
            | Command::Unwatch
            | Command::Proxy(_) => true,
        }
    }
}

impl Command {
    /// When this command takes a session lock (a lock without a TTL in `SET`'s syntax, with or
    /// without `GET`, `LOCK.ACQUIRE ... KEEPALIVE`, or a permit of `SEM.ACQUIRE ... KEEPALIVE`:
    /// its slot is a session lock): the TTL each extension writes. The
    /// one place that decides it; the grant path (`Proxy::set_nx`, `Proxy::acquire_native`)
    /// follows the same rule.
    pub fn session_ttl(&self, default_ttl_ms: u64) -> Option<u64> {
        match self {
            Command::Acquire(Set {
                expiry: Expiry::None, ..
            }) => Some(default_ttl_ms),
            Command::Recipe(r) => r.call().session_ttl(),
            Command::Local(_)
            | Command::Acquire(_)
            | Command::Set(_)
            | Command::SetNx { .. }
            | Command::DelEx(_)
            | Command::Expire(_)
            | Command::Eval(_)
            | Command::Script(_)
            | Command::Forward(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Watch(_)
            | Command::Unwatch
            | Command::Proxy(_)
            | Command::BlPop { .. } => None,
        }
    }

    /// How many session locks this command takes when granted, if [`Command::session_ttl`]
    /// says it takes any: one per key of several locks at once, else one. Each counts against
    /// the bounds (`crate::sessions::SessionLocks::admit`).
    pub fn session_locks(&self) -> usize {
        match self {
            Command::Recipe(r) => r.call().session_locks(),
            Command::Local(_)
            | Command::Acquire(_)
            | Command::Set(_)
            | Command::SetNx { .. }
            | Command::DelEx(_)
            | Command::Expire(_)
            | Command::Eval(_)
            | Command::Script(_)
            | Command::Forward(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Watch(_)
            | Command::Unwatch
            | Command::Proxy(_)
            | Command::BlPop { .. } => 1,
        }
    }

    /// How many waits this command leaves in the proxy while it runs (`crate::waiting`): one
    /// for a request that waits (`WAIT ms`, a long poll) or observes, one per key of a `BLPOP`.
    pub fn waits(&self) -> usize {
        match self {
            Command::BlPop { keys, .. } => keys.len(),
Command::Recipe(r) => r.call().waits(),
            Command::Local(_)
            | Command::Acquire(_)
            | Command::Set(_)
            | Command::SetNx { .. }
            | Command::DelEx(_)
            | Command::Expire(_)
            | Command::Eval(_)
            | Command::Script(_)
            | Command::Forward(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Watch(_)
            | Command::Unwatch
            | Command::Proxy(_) => 0,
        }
    }

    /// The value this command writes under its key, if it writes one (each master stores a
    /// copy: bounded by `max_value_len`).
    pub fn written_value(&self) -> Option<&Bytes> {
        match self {
            Command::Set(set) | Command::Acquire(set) => Some(&set.value),
            Command::SetNx { value, .. } => Some(value),
            Command::Recipe(r) => r.call().written_value(),
            Command::Local(_)
            | Command::DelEx(_)
            | Command::Expire(_)
            | Command::Eval(_)
            | Command::Script(_)
            | Command::Forward(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Watch(_)
            | Command::Unwatch
            | Command::Proxy(_)
            | Command::BlPop { .. } => None,
        }
    }

    /// Whether this command may delete, overwrite or re-time its keys whatever they hold (no
    /// token check): `SET` without `NX`, `GETSET`, `DEL`, `UNLINK`, `DELEX` without `IFEQ`,
    /// `PEXPIRE`/`EXPIRE`.
    pub fn writes(&self) -> bool {
        match self {
            Command::Set(set) => matches!(set.condition, Condition::Always | Condition::Xx),
            Command::Expire(_) => true,
            Command::DelEx(d) => !matches!(d.condition, DelCondition::IfEq(_)),
            Command::Forward(f) => f.deletes(),
            Command::Local(_)
            | Command::Acquire(_)
            | Command::SetNx { .. }
            | Command::Eval(_)
            | Command::Script(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Watch(_)
            | Command::Unwatch
            | Command::Proxy(_)
            | Command::Recipe(_)
            | Command::BlPop { .. } => false,
        }
    }

    /// Rule 11: the first key this command names under the proxy's own prefix, if any. Such
    /// keys hold the proxy's state on the masters (fencing counters and epochs); a client that
    /// could write, delete or watch them could make fencing tokens go backwards.
    pub fn reserved_key(&self) -> Option<&Bytes> {
        self.keys().iter().find(|k| k.starts_with(crate::keys::OWN_PREFIX))
    }
}

/// `ERR wrong number of arguments for '<name>' command`, named as Redis does (lower case).
pub(crate) fn arity_error(args: &[Bytes]) -> ClientError {
    ClientError::WrongArity(String::from_utf8_lossy(name(args)).to_lowercase())
}

/// The command's name (empty for an empty request, which the connection skips).
fn name(args: &[Bytes]) -> &[u8] {
    args.first().map_or(&[], |name| name.as_ref())
}

/// The argument at `i`, or an arity error. Parsers check a command's arity first, so this
/// never answers the error in practice; it makes a missing argument an error rather than an
/// indexing panic by construction (the parsers deny `clippy::indexing_slicing`).
pub(crate) fn nth(args: &[Bytes], i: usize) -> Result<&Bytes, ClientError> {
    args.get(i).ok_or_else(|| arity_error(args))
}

/// The arguments from `i` on (none past the end).
pub(crate) fn from(args: &[Bytes], i: usize) -> &[Bytes] {
    args.get(i..).unwrap_or(&[])
}

/// Parses a decimal integer argument like Redis (`ERR value is not an integer ...`).
pub(crate) fn parse_int(arg: &[u8]) -> Result<i64, ClientError> {
    crate::protocol::whole_number(arg).ok_or(ClientError::NotInteger)
}

/// The error for a command the proxy does not know, worded as Redis 7 words it.
pub(crate) fn unknown_command(args: &[Bytes]) -> ClientError {
    let mut quoted = String::new();
    for arg in from(args, 1) {
        if quoted.len() >= 128 {
            break;
        }
        let text = String::from_utf8_lossy(arg);
        let room = 128usize.saturating_sub(quoted.len());
        quoted.push('\'');
        quoted.extend(text.chars().take(room));
        quoted.push_str("' ");
    }
    ClientError::UnknownCommand {
        name: String::from_utf8_lossy(name(args)).chars().take(128).collect(),
        args: quoted,
    }
}

#[cfg(test)]
pub(crate) fn args(line: &str) -> Vec<Bytes> {
    line.split_whitespace()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxys_own_keys_are_reserved() {
        for line in [
            "DEL redlock-proxy:fence:c:lock",
            "SET redlock-proxy:fence:epoch x",
            "WATCH a redlock-proxy:a:{k}k",
            "EVAL x 1 redlock-proxy:x",
            "LOCK.ACQUIRE redlock-proxy:l t 100",
        ] {
            let command = Command::parse(args(line)).unwrap();
            assert!(command.reserved_key().is_some(), "{line}");
        }
        let command = Command::parse(args("SET lock:redlock-proxy: t NX")).unwrap();
        assert_eq!(command.reserved_key(), None);
    }

    #[test]
    fn names_are_case_insensitive() {
        assert_eq!(Command::parse(args("pInG")).unwrap(), Command::Local(Local::Ping(None)));
    }

    #[test]
    fn unknown_command_is_worded_like_redis() {
        let e = Command::parse(args("FOO a b")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ERR unknown command 'FOO', with args beginning with: 'a' 'b' "
        );
        let e = Command::parse(args("FOO")).unwrap_err();
        assert_eq!(e.to_string(), "ERR unknown command 'FOO', with args beginning with: ");
    }

    #[test]
    fn integers_parse_strictly() {
        // The rule itself is tested on `protocol::whole_number`; here its error.
        assert_eq!(parse_int(b"-3").unwrap(), -3);
        assert_eq!(parse_int(b"-0"), Err(ClientError::NotInteger));
    }
}
