//! The leader election commands: `ELECT.CAMPAIGN`, `ELECT.LEADER`, `ELECT.RESIGN`,
//! `ELECT.OBSERVE`, `ELECT.UNOBSERVE`. Leadership of an election is a session lock on a
//! reserved key of the election (`crate::recipes::election`), its term the lock's fencing token.

use bytes::Bytes;

use crate::command::spec::*;
use crate::command::{Command, arity_error, from, nth, parse_int, Recipe};
use crate::error::ClientError;
use crate::command::options::ttl_ms;

use super::command::*;

/// Parses `ELECT.*` (the table has checked the arity).
pub fn parse(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let name = spec.name;
    let election = nth(&args, 1)?.clone();
    let cmd = match name {
        "elect.campaign" => ElectCmd::Campaign {
            election,
            value: nth(&args, 2)?.clone(),
            ttl_ms: ttl_ms(name, nth(&args, 3)?)?,
            wait_ms: wait(from(&args, 4))?,
        },
        "elect.leader" => ElectCmd::Leader { election },
        "elect.resign" => ElectCmd::Resign {
            election,
            value: nth(&args, 2)?.clone(),
        },
        "elect.observe" => ElectCmd::Observe {
            election,
            after: after(from(&args, 2))?,
        },
        "elect.unobserve" => ElectCmd::Unobserve { election },
        _ => return Err(arity_error(&args)),
    };
    Ok(Command::Recipe(Recipe::Elect(cmd)))
}

/// A non-negative integer argument.
fn count(arg: &[u8]) -> Result<u64, ClientError> {
    u64::try_from(parse_int(arg)?).map_err(|_| ClientError::NotInteger)
}

/// `[WAIT ms]`.
fn wait(options: &[Bytes]) -> Result<Option<u64>, ClientError> {
    match options {
        [] => Ok(None),
        [word, ms] if word.eq_ignore_ascii_case(b"WAIT") => Ok(Some(count(ms)?)),
        _ => Err(ClientError::Syntax),
    }
}

/// `[AFTER term TIMEOUT ms]`.
fn after(options: &[Bytes]) -> Result<Option<(u64, u64)>, ClientError> {
    match options {
        [] => Ok(None),
        [a, term, t, ms] if a.eq_ignore_ascii_case(b"AFTER") && t.eq_ignore_ascii_case(b"TIMEOUT") => {
            Ok(Some((count(term)?, count(ms)?)))
        }
        _ => Err(ClientError::Syntax),
    }
}

/// This recipe's rows of the command table ([`crate::command::table::TABLE`]): each command's
/// name, arity, flags, key positions, documentation, and its parser.
pub static ROWS: [Spec; 5] = [
    Spec::new("elect.campaign", -4, Handler::Parse(parse))
        .flags(
            &["write", "denyoom", "module", "noscript", "blocking"],
            &["@write", "@slow", "@blocking"],
        )
        .keys(range(&["OW", "insert"], 1, 0))
        .doc(
            "Campaigns for leadership of an election (a session lock on a majority): the term (a fencing token) once leader, or nil",
            PROXY_VERSION,
            "module",
            "O(1) on each master, all masters at once; WAIT waits in a first-come-first-served queue",
        )
        .args(&[
            key("election"),
            string("value"),
            integer("ttl_ms"),
            integer("ms").after("WAIT").optional(),
        ]),
    Spec::new("elect.leader", 2, Handler::Parse(parse))
        .flags(&["readonly", "module", "noscript"], &["@read", "@slow"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "The leader a majority holds: [value, term], or nil",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[key("election")]),
    Spec::new("elect.observe", -2, Handler::Parse(parse))
        .flags(&["readonly", "module", "noscript", "blocking"], &["@read", "@slow", "@blocking"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "The current leader, then (RESP3) a push on every change; with AFTER, a long poll for a change",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[
            key("election"),
            block("after", &[integer("term").after("AFTER"), integer("ms").after("TIMEOUT")]).optional(),
        ]),
    Spec::new("elect.resign", 3, Handler::Parse(parse))
        .flags(&["write", "module", "noscript"], &["@write", "@slow"])
        .keys(range(&["RW", "access", "delete"], 1, 0))
        .doc(
            "Gives up the leadership of value: 1 when a majority released it, else 0",
            PROXY_VERSION,
            "module",
            ON_EACH_MASTER,
        )
        .args(&[key("election"), string("value")]),
    Spec::new("elect.unobserve", 2, Handler::Parse(parse))
        .flags(&["module", "noscript", "fast"], &["@fast"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "Stops this connection's pushes of an election's leader: 1 when it observed it, else 0",
            PROXY_VERSION,
            "module",
            "O(1)",
        )
        .args(&[key("election")]),
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
            parsed("elect.campaign e 10.0.0.1:80 1000 WAIT 50"),
            Ok(Command::Recipe(Recipe::Elect(ElectCmd::Campaign {
                election: b("e"),
                value: b("10.0.0.1:80"),
                ttl_ms: 1000,
                wait_ms: Some(50)
            })))
        );
        assert_eq!(
            parsed("ELECT.CAMPAIGN e v 0"),
            Err("ERR invalid expire time in 'elect.campaign' command".into())
        );
        assert_eq!(parsed("ELECT.CAMPAIGN e v 10 WAIT"), Err("ERR syntax error".into()));
        assert_eq!(
            parsed("ELECT.CAMPAIGN e v 10 KEEPALIVE"),
            Err("ERR syntax error".into())
        );
        assert_eq!(
            parsed("ELECT.CAMPAIGN e v 10 WAIT -1"),
            Err("ERR value is not an integer or out of range".into())
        );
        assert_eq!(
            parsed("ELECT.CAMPAIGN e v"),
            Err("ERR wrong number of arguments for 'elect.campaign' command".into())
        );
        assert_eq!(
            parsed("ELECT.LEADER e"),
            Ok(Command::Recipe(Recipe::Elect(ElectCmd::Leader { election: b("e") })))
        );
        assert_eq!(
            parsed("ELECT.RESIGN e v"),
            Ok(Command::Recipe(Recipe::Elect(ElectCmd::Resign {
                election: b("e"),
                value: b("v")
            })))
        );
        assert_eq!(
            parsed("ELECT.OBSERVE e"),
            Ok(Command::Recipe(Recipe::Elect(ElectCmd::Observe {
                election: b("e"),
                after: None
            })))
        );
        assert_eq!(
            parsed("ELECT.OBSERVE e after 3 timeout 500"),
            Ok(Command::Recipe(Recipe::Elect(ElectCmd::Observe {
                election: b("e"),
                after: Some((3, 500))
            })))
        );
        assert_eq!(parsed("ELECT.OBSERVE e AFTER 3"), Err("ERR syntax error".into()));
        assert_eq!(
            parsed("ELECT.UNOBSERVE e"),
            Ok(Command::Recipe(Recipe::Elect(ElectCmd::Unobserve { election: b("e") })))
        );
        let command = Command::parse(args("ELECT.LEADER redlock-proxy:elect:{e}:e")).unwrap();
        assert!(
            command.reserved_key().is_some(),
            "rule 11: the lock's key cannot be named"
        );
    }
}
