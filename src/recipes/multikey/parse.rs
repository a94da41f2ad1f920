//! Several locks at once: `LOCK.ACQUIREALL token ttl_ms numkeys key [key ...] [WAIT ms]
//! [KEEPALIVE]` and `LOCK.RELEASEALL token numkeys key [key ...]`.

use bytes::Bytes;

use crate::command::spec::*;
use crate::command::{Command, arity_error, from, nth, parse_int, Recipe};
use crate::error::ClientError;
use crate::recipes::multikey::lua::MAX_KEYS;

use super::command::*;

/// Parses `LOCK.ACQUIREALL` and `LOCK.RELEASEALL` (the table has checked the least arity).
pub fn parse(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let token = nth(&args, 1)?.clone();
    let cmd = match spec.name {
        "lock.acquireall" => {
            let ttl_ms = crate::command::options::ttl_ms(spec.name, nth(&args, 2)?)?;
            let (keys, options) = keys_from(spec.name, &args, 3)?;
            let (keepalive, wait_ms) = crate::command::options::acquire_options(options)?;
            LockAllCmd::Acquire {
                token,
                ttl_ms,
                keys,
                keepalive,
                wait_ms,
            }
        }
        "lock.releaseall" => {
            let (keys, rest) = keys_from(spec.name, &args, 2)?;
            if !rest.is_empty() {
                return Err(ClientError::Syntax);
            }
            LockAllCmd::Release { token, keys }
        }
        _ => return Err(arity_error(&args)),
    };
    Ok(Command::Recipe(Recipe::LockAll(cmd)))
}

/// The keys counted by the argument at `at` (Redis's errors for a bad count, checked before
/// anything is copied), and the arguments after them. A count above [`MAX_KEYS`] and a key
/// named twice are errors too: every key is one lock of the set.
fn keys_from<'a>(name: &str, args: &'a [Bytes], at: usize) -> Result<(Vec<Bytes>, &'a [Bytes]), ClientError> {
    let numkeys = parse_int(nth(args, at)?)?;
    let numkeys = usize::try_from(numkeys).map_err(|_| ClientError::NegativeKeys)?;
    if numkeys == 0 {
        return Err(ClientError::Unsupported(format!(
            "at least 1 input key is needed for '{name}' command"
        )));
    }
    if numkeys > MAX_KEYS {
        return Err(ClientError::Unsupported(format!(
            "Number of keys can't be greater than {MAX_KEYS} in '{name}' command"
        )));
    }
    let rest = from(args, at.saturating_add(1));
    let (Some(keys), Some(after)) = (rest.get(..numkeys), rest.get(numkeys..)) else {
        return Err(ClientError::TooManyKeys);
    };
    let mut sorted: Vec<&Bytes> = keys.iter().collect();
    sorted.sort_unstable();
    if let Some([twice, _]) = sorted.windows(2).find(|pair| matches!(pair, [a, b] if a == b)) {
        return Err(ClientError::Unsupported(format!(
            "key '{}' is named twice in '{name}': each key is one lock of the set",
            String::from_utf8_lossy(twice)
        )));
    }
    Ok((keys.to_vec(), after))
}

/// This recipe's rows of the command table ([`crate::command::table::TABLE`]): each command's
/// name, arity, flags, key positions, documentation, and its parser.
pub static ROWS: [Spec; 2] = [
    Spec::new("lock.acquireall", -5, Handler::Parse(parse))
        .flags(
            &["write", "denyoom", "module", "noscript", "blocking", "movablekeys"],
            &["@write", "@slow", "@blocking"],
        )
        .keys(KeySpec {
            flags: &["OW", "insert"],
            begin: 3,
            find: Find::Keynum {
                keynumidx: 0,
                first: 1,
                step: 1,
            },
        })
        .doc(
            "Takes several locks at once, all or none, each on a majority: their fencing tokens, or nil",
            PROXY_VERSION,
            "module",
            "O(N) on each master where N is the number of keys, all masters at once; WAIT waits in the first key's queue",
        )
        .args(&[
            string("token"),
            integer("ttl_ms"),
            integer("numkeys"),
            key("key").multiple(),
            integer("ms").after("WAIT").optional(),
            word("keepalive", "KEEPALIVE").optional(),
        ]),
    Spec::new("lock.releaseall", -4, Handler::Parse(parse))
        .flags(&["write", "module", "noscript", "movablekeys"], &["@write", "@slow"])
        .keys(KeySpec {
            flags: &["RW", "access", "delete"],
            begin: 2,
            find: Find::Keynum {
                keynumidx: 0,
                first: 1,
                step: 1,
            },
        })
        .doc(
            "Releases several locks (one hold of each): how many of them a majority released",
            PROXY_VERSION,
            "module",
            "O(N) on each master where N is the number of keys",
        )
        .args(&[string("token"), integer("numkeys"), key("key").multiple()]),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args;

    fn parsed(line: &str) -> Result<Command, String> {
        Command::parse(args(line)).map_err(|e| e.to_string())
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn both_commands_and_their_errors() {
        assert_eq!(
            parsed("LOCK.ACQUIREALL t 1000 2 b a WAIT 50 KEEPALIVE"),
            Ok(Command::Recipe(Recipe::LockAll(LockAllCmd::Acquire {
                token: b("t"),
                ttl_ms: 1000,
                keys: vec![b("b"), b("a")],
                keepalive: true,
                wait_ms: Some(50),
            })))
        );
        assert_eq!(
            parsed("lock.releaseall t 2 a b"),
            Ok(Command::Recipe(Recipe::LockAll(LockAllCmd::Release {
                token: b("t"),
                keys: vec![b("a"), b("b")],
            })))
        );
        assert_eq!(
            parsed("LOCK.ACQUIREALL t 1000 -1 a"),
            Err("ERR Number of keys can't be negative".into())
        );
        assert_eq!(
            parsed("LOCK.ACQUIREALL t 1000 3 a b"),
            Err("ERR Number of keys can't be greater than number of args".into())
        );
        assert_eq!(
            parsed("LOCK.ACQUIREALL t 1000 0 a"),
            Err("ERR at least 1 input key is needed for 'lock.acquireall' command".into())
        );
        assert_eq!(
            parsed("LOCK.ACQUIREALL t 1000 99999999999 a"),
            Err("ERR Number of keys can't be greater than 64 in 'lock.acquireall' command".into())
        );
        assert_eq!(
            parsed("LOCK.ACQUIREALL t 1000 x a"),
            Err("ERR value is not an integer or out of range".into())
        );
        assert_eq!(
            parsed("LOCK.ACQUIREALL t 1000 2 a a"),
            Err("ERR key 'a' is named twice in 'lock.acquireall': each key is one lock of the set".into())
        );
        assert_eq!(
            parsed("LOCK.ACQUIREALL t 1000 1 a NOPE"),
            Err("ERR syntax error".into())
        );
        assert_eq!(
            parsed("LOCK.ACQUIREALL t 0 1 a"),
            Err("ERR invalid expire time in 'lock.acquireall' command".into())
        );
        assert_eq!(parsed("LOCK.RELEASEALL t 1 a b"), Err("ERR syntax error".into()));
        assert_eq!(
            parsed("LOCK.RELEASEALL t 1"),
            Err("ERR wrong number of arguments for 'lock.releaseall' command".into())
        );
    }
}
