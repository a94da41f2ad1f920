//! The semaphore commands: `SEM.ACQUIRE`, `SEM.RELEASE`, `SEM.EXTEND`, `SEM.INFO`. A
//! semaphore of k permits is k mutex slots, each taken by a majority as a lock is (rule 14:
//! `crate::recipes::semaphore`).

use bytes::Bytes;

use crate::command::spec::*;
use crate::command::{Command, arity_error, nth, parse_int, Recipe};
use crate::error::ClientError;
use crate::command::options::{acquire_options, ttl_ms};
use crate::recipes::semaphore::MAX_PERMITS;

use super::command::*;

/// Parses `SEM.*` (the table has checked the arity: only `SEM.ACQUIRE` takes options).
pub fn parse(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let name = spec.name;
    let (key, token) = (nth(&args, 1)?.clone(), args.get(2).cloned().unwrap_or_default());
    let cmd = match name {
        "sem.acquire" => {
            let (keepalive, wait_ms) = acquire_options(args.get(5..).unwrap_or(&[]))?;
            SemCmd::Acquire {
                key,
                token,
                permits: permits(nth(&args, 3)?)?,
                ttl_ms: ttl_ms(name, nth(&args, 4)?)?,
                keepalive,
                wait_ms,
            }
        }
        "sem.extend" => SemCmd::Extend {
            key,
            token,
            ttl_ms: ttl_ms(name, nth(&args, 3)?)?,
        },
        "sem.release" => SemCmd::Release { key, token },
        "sem.info" => SemCmd::Info { key },
        _ => return Err(arity_error(&args)),
    };
    Ok(Command::Recipe(Recipe::Sem(cmd)))
}

/// A count of permits: 1 to [`MAX_PERMITS`] (each master reads every slot of a semaphore in
/// one step of an acquisition: the count bounds that work).
fn permits(arg: &[u8]) -> Result<u32, ClientError> {
    match u32::try_from(parse_int(arg)?) {
        Ok(n) if (1..=MAX_PERMITS).contains(&n) => Ok(n),
        _ => Err(ClientError::Unsupported(format!(
            "permits must be between 1 and {MAX_PERMITS}"
        ))),
    }
}

/// This recipe's rows of the command table ([`crate::command::table::TABLE`]): each command's
/// name, arity, flags, key positions, documentation, and its parser.
pub static ROWS: [Spec; 4] = [
    Spec::new("sem.acquire", -5, Handler::Parse(parse))
        .flags(
            &["write", "denyoom", "module", "noscript", "blocking"],
            &["@write", "@slow", "@blocking"],
        )
        .keys(range(&["OW", "insert"], 1, 0))
        .doc(
            "Takes a permit of a semaphore (one of its slots, each a lock on a majority): [slot, fencing token], or nil",
            PROXY_VERSION,
            "module",
            "O(permits) on each master, all masters at once, per slot tried; WAIT waits in a first-come-first-served queue",
        )
        .args(&[
            key("key"),
            string("token"),
            integer("permits"),
            integer("ttl_ms"),
            integer("ms").after("WAIT").optional(),
            word("keepalive", "KEEPALIVE").optional(),
        ]),
    Spec::new("sem.extend", 4, Handler::Parse(parse))
        .flags(&["write", "module", "noscript"], &["@write", "@slow"])
        .keys(range(&["RW", "update"], 1, 0))
        .doc(
            "Extends the permit a token holds: the validity a majority guarantees, in ms, or 0",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), string("token"), integer("ttl_ms")]),
    Spec::new("sem.info", 2, Handler::Parse(parse))
        .flags(&["readonly", "module", "noscript"], &["@read", "@slow"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "A semaphore's permits, holders, free slots and waiters",
            PROXY_VERSION,
            "module",
            "O(permits) on each master, all masters at once",
        )
        .args(&[key("key")]),
    Spec::new("sem.release", 3, Handler::Parse(parse))
        .flags(&["write", "module", "noscript"], &["@write", "@slow"])
        .keys(range(&["RW", "access", "delete"], 1, 0))
        .doc(
            "Releases the permit a token holds: 1 when a majority released it, else 0",
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
            parsed("sem.acquire s t 3 1000 keepalive WAIT 20"),
            Ok(Command::Recipe(Recipe::Sem(SemCmd::Acquire {
                key: b("s"),
                token: b("t"),
                permits: 3,
                ttl_ms: 1000,
                keepalive: true,
                wait_ms: Some(20)
            })))
        );
        assert_eq!(
            parsed("SEM.ACQUIRE s t 0 1000"),
            Err("ERR permits must be between 1 and 1024".into())
        );
        assert_eq!(
            parsed("SEM.ACQUIRE s t 1025 1000"),
            Err("ERR permits must be between 1 and 1024".into())
        );
        assert_eq!(
            parsed("SEM.ACQUIRE s t x 1000"),
            Err("ERR value is not an integer or out of range".into())
        );
        assert_eq!(
            parsed("SEM.ACQUIRE s t 2 0"),
            Err("ERR invalid expire time in 'sem.acquire' command".into())
        );
        assert_eq!(parsed("SEM.ACQUIRE s t 2 10 WAIT"), Err("ERR syntax error".into()));
        assert_eq!(
            parsed("SEM.ACQUIRE s t 2"),
            Err("ERR wrong number of arguments for 'sem.acquire' command".into())
        );
        assert_eq!(
            parsed("SEM.EXTEND s t 5"),
            Ok(Command::Recipe(Recipe::Sem(SemCmd::Extend {
                key: b("s"),
                token: b("t"),
                ttl_ms: 5
            })))
        );
        assert_eq!(
            parsed("SEM.RELEASE s t"),
            Ok(Command::Recipe(Recipe::Sem(SemCmd::Release {
                key: b("s"),
                token: b("t")
            })))
        );
        assert_eq!(parsed("SEM.INFO s"), Ok(Command::Recipe(Recipe::Sem(SemCmd::Info { key: b("s") }))));
        assert_eq!(
            parsed("SEM.RELEASE s"),
            Err("ERR wrong number of arguments for 'sem.release' command".into())
        );
        let command = Command::parse(args("SEM.ACQUIRE redlock-proxy:sem:{a}:a:0 t 1 100")).unwrap();
        assert!(
            command.reserved_key().is_some(),
            "rule 11: a slot's key cannot be named"
        );
    }
}
