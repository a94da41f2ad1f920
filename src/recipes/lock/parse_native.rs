//! The native lock commands for new code: `LOCK.ACQUIRE`, `LOCK.EXTEND`, `LOCK.RELEASE`,
//! `LOCK.INFO` and `LOCK.FENCE`. Unmodified clients keep using `SET NX PX` and scripts.

use bytes::Bytes;

use crate::command::spec::*;
use crate::command::{Command, Recipe, arity_error, nth};
use crate::error::ClientError;

use super::command::*;
use crate::command::options::{acquire_options, ttl_ms};

/// Parses `LOCK.*` (the table has checked the arity: only `LOCK.ACQUIRE` takes options).
pub fn parse(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let name = spec.name;
    let options = args.get(4..).filter(|_| name == "lock.acquire").unwrap_or(&[]);
    let (reentrant, options) = reentrant_option(options);
    let (keepalive, wait_ms) = acquire_options(&options)?;
    let ttl = |arg: &[u8]| ttl_ms(name, arg);
    let (key, token) = (nth(&args, 1)?.clone(), args.get(2).cloned().unwrap_or_default());
    let cmd = match name {
        "lock.acquire" => LockCmd::Acquire {
            key,
            token,
            ttl_ms: ttl(nth(&args, 3)?)?,
            keepalive,
            wait_ms,
            reentrant,
        },
        "lock.extend" => LockCmd::Extend {
            key,
            token,
            ttl_ms: ttl(nth(&args, 3)?)?,
        },
        "lock.release" => LockCmd::Release { key, token },
        "lock.fence" => LockCmd::Fence { key, token },
        "lock.info" => LockCmd::Info { key },
        _ => return Err(arity_error(&args)),
    };
    Ok(Command::Recipe(Recipe::Lock(cmd)))
}

/// `LOCK.ACQUIRE`'s `REENTRANT` (once, anywhere among the options): whether it was given,
/// and the other options. Given twice, the second is left among the others, a syntax error.
fn reentrant_option(options: &[Bytes]) -> (bool, Vec<Bytes>) {
    let at = options.iter().position(|o| o.eq_ignore_ascii_case(b"REENTRANT"));
    let mut rest = options.to_vec();
    if let Some(at) = at {
        rest.remove(at);
    }
    (at.is_some(), rest)
}

/// This recipe's rows of the command table ([`crate::command::table::TABLE`]): each command's
/// name, arity, flags, key positions, documentation, and its parser.
pub static ROWS: [Spec; 5] = [
    Spec::new("lock.acquire", -4, Handler::Parse(parse))
        .flags(
            &["write", "denyoom", "module", "noscript", "blocking"],
            &["@write", "@slow", "@blocking"],
        )
        .keys(range(&["OW", "insert"], 1, 0))
        .doc(
            "Takes a lock on a majority of masters: its fencing token, or nil when held",
            PROXY_VERSION,
            "module",
            "O(1) on each master, all masters at once; WAIT waits in a first-come-first-served queue",
        )
        .args(&[
            key("key"),
            string("token"),
            integer("ttl_ms"),
            integer("ms").after("WAIT").optional(),
            word("keepalive", "KEEPALIVE").optional(),
            word("reentrant", "REENTRANT").optional(),
        ]),
    Spec::new("lock.extend", 4, Handler::Parse(parse))
        .flags(&["write", "module", "noscript"], &["@write", "@slow"])
        .keys(range(&["RW", "update"], 1, 0))
        .doc(
            "Extends a lock its holder holds: the validity a majority guarantees, in ms, or 0",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), string("token"), integer("ttl_ms")]),
    Spec::new("lock.fence", 3, Handler::Parse(parse))
        .flags(&["write", "denyoom", "module", "noscript"], &["@write", "@slow"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "A fencing token for the holder of a lock taken with SET NX PX, or nil",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), string("token")]),
    Spec::new("lock.info", 2, Handler::Parse(parse))
        .flags(&["readonly", "module", "noscript"], &["@read", "@slow"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "A lock's holder, validity, last fencing token, waiters, session and holds",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[key("key")]),
    Spec::new("lock.release", 3, Handler::Parse(parse))
        .flags(&["write", "module", "noscript"], &["@write", "@slow"])
        .keys(range(&["RW", "access", "delete"], 1, 0))
        .doc(
            "Releases a lock (one hold of a reentrant lock): 1 when a majority released it, else 0",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), string("token")]),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args;

    fn parsed(line: &str) -> Result<Command, String> {
        Command::parse(args(line)).map_err(|e| e.to_string())
    }

    #[test]
    fn every_command_and_its_errors() {
        let b = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        assert_eq!(
            parsed("lock.acquire k t 1000"),
            Ok(Command::Recipe(Recipe::Lock(LockCmd::Acquire {
                key: b("k"),
                token: b("t"),
                ttl_ms: 1000,
                keepalive: false,
                wait_ms: None,
                reentrant: false
            })))
        );
        assert_eq!(
            parsed("LOCK.ACQUIRE k t 1000 keepalive WAIT 500"),
            Ok(Command::Recipe(Recipe::Lock(LockCmd::Acquire {
                key: b("k"),
                token: b("t"),
                ttl_ms: 1000,
                keepalive: true,
                wait_ms: Some(500),
                reentrant: false
            })))
        );
        assert_eq!(
            parsed("LOCK.ACQUIRE k t 1000 WAIT 5 reentrant"),
            Ok(Command::Recipe(Recipe::Lock(LockCmd::Acquire {
                key: b("k"),
                token: b("t"),
                ttl_ms: 1000,
                keepalive: false,
                wait_ms: Some(5),
                reentrant: true
            })))
        );
        assert_eq!(
            parsed("LOCK.ACQUIRE k t 1000 REENTRANT REENTRANT"),
            Err("ERR syntax error".into())
        );
        assert_eq!(parsed("LOCK.ACQUIRE k t 1000 FOREVER"), Err("ERR syntax error".into()));
        assert_eq!(parsed("LOCK.ACQUIRE k t 1000 WAIT"), Err("ERR syntax error".into()));
        assert_eq!(
            parsed("LOCK.ACQUIRE k t 1000 WAIT 1 WAIT 2"),
            Err("ERR syntax error".into())
        );
        assert_eq!(
            parsed("LOCK.ACQUIRE k t 1000 WAIT -1"),
            Err("ERR value is not an integer or out of range".into())
        );
        assert_eq!(
            parsed("LOCK.RELEASE k t x"),
            Err("ERR wrong number of arguments for 'lock.release' command".into())
        );
        assert_eq!(
            parsed("LOCK.EXTEND k t 5"),
            Ok(Command::Recipe(Recipe::Lock(LockCmd::Extend {
                key: b("k"),
                token: b("t"),
                ttl_ms: 5
            })))
        );
        assert_eq!(
            parsed("LOCK.RELEASE k t"),
            Ok(Command::Recipe(Recipe::Lock(LockCmd::Release {
                key: b("k"),
                token: b("t")
            })))
        );
        assert_eq!(parsed("LOCK.INFO k"), Ok(Command::Recipe(Recipe::Lock(LockCmd::Info { key: b("k") }))));
        assert_eq!(
            parsed("LOCK.FENCE k t"),
            Ok(Command::Recipe(Recipe::Lock(LockCmd::Fence {
                key: b("k"),
                token: b("t")
            })))
        );
        assert_eq!(
            parsed("LOCK.ACQUIRE k t"),
            Err("ERR wrong number of arguments for 'lock.acquire' command".into())
        );
        assert_eq!(
            parsed("LOCK.ACQUIRE k t 0"),
            Err("ERR invalid expire time in 'lock.acquire' command".into())
        );
        assert_eq!(
            parsed("LOCK.EXTEND k t x"),
            Err("ERR value is not an integer or out of range".into())
        );
        assert!(parsed("LOCK.NOPE k").unwrap_err().starts_with("ERR unknown command"));
    }
}
