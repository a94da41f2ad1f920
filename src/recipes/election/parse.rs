//! The leader election commands: `ELECT.CAMPAIGN`, `ELECT.LEADER`, `ELECT.RESIGN`,
//! `ELECT.OBSERVE`, `ELECT.UNOBSERVE`. Leadership of an election is a session lock on a
//! reserved key of the election (`crate::recipes::election`), its term the lock's fencing token.

use bytes::Bytes;

use crate::command::spec::Spec;
use crate::command::{Command, arity_error, from, nth, parse_int, Recipe};
use crate::error::ClientError;
use crate::recipes::lock::parse_native::ttl_ms;

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
