//! The read-write lock commands: `RWLOCK.READ`, `RWLOCK.WRITE`, `RWLOCK.RELEASE`,
//! `RWLOCK.EXTEND`, `RWLOCK.INFO`. Many readers or one writer, each hold taken by a majority as
//! a lock is (rule 14: reader–writer and writer–writer are pairs; `crate::recipes::rwlock`).

use bytes::Bytes;

use crate::command::spec::*;
use crate::command::{Command, arity_error, nth, Recipe};
use crate::error::ClientError;
use crate::command::options::{acquire_options, ttl_ms};
use crate::recipes::rwlock::Mode;

use super::command::*;

/// Parses `RWLOCK.*` (the table has checked the arity: only the acquisitions take options).
pub fn parse(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let name = spec.name;
    let (key, token) = (nth(&args, 1)?.clone(), args.get(2).cloned().unwrap_or_default());
    let acquire = |mode| -> Result<RwCmd, ClientError> {
        let (keepalive, wait_ms) = acquire_options(args.get(4..).unwrap_or(&[]))?;
        Ok(RwCmd::Acquire {
            mode,
            key: key.clone(),
            token: token.clone(),
            ttl_ms: ttl_ms(name, nth(&args, 3)?)?,
            keepalive,
            wait_ms,
        })
    };
    let cmd = match name {
        "rwlock.read" => acquire(Mode::Read)?,
        "rwlock.write" => acquire(Mode::Write)?,
        "rwlock.extend" => RwCmd::Extend {
            key,
            token,
            ttl_ms: ttl_ms(name, nth(&args, 3)?)?,
        },
        "rwlock.release" => RwCmd::Release { key, token },
        "rwlock.info" => RwCmd::Info { key },
        _ => return Err(arity_error(&args)),
    };
    Ok(Command::Recipe(Recipe::RwLock(cmd)))
}

/// This recipe's rows of the command table ([`crate::command::table::TABLE`]): each command's
/// name, arity, flags, key positions, documentation, and its parser.
pub static ROWS: [Spec; 5] = [
    Spec::new("rwlock.extend", 4, Handler::Parse(parse))
        .flags(&["write", "module", "noscript"], &["@write", "@slow"])
        .keys(range(&["RW", "update"], 1, 0))
        .doc(
            "Extends the read or write hold of a token: the validity a majority guarantees, in ms, or 0",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), string("token"), integer("ttl_ms")]),
    Spec::new("rwlock.info", 2, Handler::Parse(parse))
        .flags(&["readonly", "module", "noscript"], &["@read", "@slow"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "A read-write lock's writer, readers, waiting writers, waiters and fencing token",
            PROXY_VERSION,
            "module",
            "O(readers) on each master, all masters at once",
        )
        .args(&[key("key")]),
    Spec::new("rwlock.read", -4, Handler::Parse(parse))
        .flags(
            &["write", "denyoom", "module", "noscript", "blocking"],
            &["@write", "@slow", "@blocking"],
        )
        .keys(range(&["RW", "insert"], 1, 0))
        .doc(
            "Takes a read hold of a read-write lock (any number of readers, no writer) on a majority: a fencing token, or nil",
            PROXY_VERSION,
            "module",
            "O(log(readers)) on each master, all masters at once; WAIT waits in a first-come-first-served queue",
        )
        .args(&[
            key("key"),
            string("token"),
            integer("ttl_ms"),
            integer("ms").after("WAIT").optional(),
            word("keepalive", "KEEPALIVE").optional(),
        ]),
    Spec::new("rwlock.release", 3, Handler::Parse(parse))
        .flags(&["write", "module", "noscript"], &["@write", "@slow"])
        .keys(range(&["RW", "access", "delete"], 1, 0))
        .doc(
            "Releases the read or write hold of a token: 1 when a majority released it, else 0",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), string("token")]),
    Spec::new("rwlock.write", -4, Handler::Parse(parse))
        .flags(
            &["write", "denyoom", "module", "noscript", "blocking"],
            &["@write", "@slow", "@blocking"],
        )
        .keys(range(&["OW", "insert"], 1, 0))
        .doc(
            "Takes the write hold of a read-write lock (no reader, no other writer) on a majority: a fencing token, or nil",
            PROXY_VERSION,
            "module",
            "O(log(readers)) on each master, all masters at once; WAIT waits in a first-come-first-served queue, where a waiting writer turns new readers away",
        )
        .args(&[
            key("key"),
            string("token"),
            integer("ttl_ms"),
            integer("ms").after("WAIT").optional(),
            word("keepalive", "KEEPALIVE").optional(),
        ]),
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
            parsed("rwlock.read d t 1000 keepalive WAIT 20"),
            Ok(Command::Recipe(Recipe::RwLock(RwCmd::Acquire {
                mode: Mode::Read,
                key: b("d"),
                token: b("t"),
                ttl_ms: 1000,
                keepalive: true,
                wait_ms: Some(20)
            })))
        );
        assert_eq!(
            parsed("RWLOCK.WRITE d t 10"),
            Ok(Command::Recipe(Recipe::RwLock(RwCmd::Acquire {
                mode: Mode::Write,
                key: b("d"),
                token: b("t"),
                ttl_ms: 10,
                keepalive: false,
                wait_ms: None
            })))
        );
        assert_eq!(
            parsed("RWLOCK.WRITE d t 0"),
            Err("ERR invalid expire time in 'rwlock.write' command".into())
        );
        assert_eq!(
            parsed("RWLOCK.READ d t x"),
            Err("ERR value is not an integer or out of range".into())
        );
        assert_eq!(parsed("RWLOCK.READ d t 10 WAIT"), Err("ERR syntax error".into()));
        assert_eq!(
            parsed("RWLOCK.READ d t 10 KEEPALIVE KEEPALIVE"),
            Err("ERR syntax error".into())
        );
        assert_eq!(
            parsed("RWLOCK.READ d t"),
            Err("ERR wrong number of arguments for 'rwlock.read' command".into())
        );
        assert_eq!(
            parsed("RWLOCK.EXTEND d t 5"),
            Ok(Command::Recipe(Recipe::RwLock(RwCmd::Extend {
                key: b("d"),
                token: b("t"),
                ttl_ms: 5
            })))
        );
        assert_eq!(
            parsed("RWLOCK.RELEASE d t"),
            Ok(Command::Recipe(Recipe::RwLock(RwCmd::Release {
                key: b("d"),
                token: b("t")
            })))
        );
        assert_eq!(
            parsed("RWLOCK.INFO d"),
            Ok(Command::Recipe(Recipe::RwLock(RwCmd::Info { key: b("d") })))
        );
        assert_eq!(
            parsed("RWLOCK.INFO d e"),
            Err("ERR wrong number of arguments for 'rwlock.info' command".into())
        );
        let command = Command::parse(args("RWLOCK.READ redlock-proxy:rw:{a}:a:w t 100")).unwrap();
        assert!(
            command.reserved_key().is_some(),
            "rule 11: the lock's keys cannot be named"
        );
    }
}
