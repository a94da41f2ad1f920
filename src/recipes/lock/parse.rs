//! The lock commands: `SET` in all its forms, `SETNX`, `GETSET`, `DELEX`, and the key
//! commands forwarded to every master.

use bytes::Bytes;

use crate::command::spec::Spec;
use crate::command::{Command, arity_error, from, nth, parse_int};
use crate::error::ClientError;
use crate::protocol::Upper;

use super::command::*;

/// The forwarded commands. The majority rule gives each its lock meaning: `GET` is the
/// value a quorum holds, `PTTL` the TTL a quorum still guarantees, `DEL` the count a quorum
/// deleted, `ZREM key member...` the count of members a quorum removed (a holder leaving a
/// sorted set of holders, as redis-semaphore releases: it can only free capacity, so it is
/// served like `DEL`, and announced as a possible release). Their arity and keys are the
/// command table's (`crate::command::table`).
fn forward_kind(name: &str) -> Option<ForwardKind> {
    Some(match name {
        "get" => ForwardKind::Get,
        "pttl" => ForwardKind::Pttl,
        "ttl" => ForwardKind::Ttl,
        "llen" => ForwardKind::Llen,
        "exists" => ForwardKind::Exists,
        "del" => ForwardKind::Del,
        "unlink" => ForwardKind::Unlink,
        "zrem" => ForwardKind::Zrem,
        _ => return None,
    })
}

/// `BLPOP key [key ...] timeout`: the timeout in seconds, decimals allowed, 0 for ever.
pub fn parse_blpop(args: Vec<Bytes>) -> Result<Command, ClientError> {
    let [_, keys @ .., last] = args.as_slice() else {
        return Err(arity_error(&args));
    };
    if keys.is_empty() {
        return Err(arity_error(&args));
    }
    let timeout = blpop_timeout(last, unix_ms())?;
    Ok(Command::BlPop {
        keys: keys.to_vec(),
        timeout,
    })
}

/// A blocking command's timeout in seconds (0: none), checked as Redis checks it
/// (`getTimeoutFromObjectOrReply`): not a number → "not a float or out of range"; more
/// milliseconds than fit in a signed 64-bit deadline from now (`now_ms`, Unix time) → "out of
/// range" (infinity too); below 0 → "negative". The conversion is checked: a timeout Redis
/// accepts can still be beyond what a `Duration` holds.
pub fn blpop_timeout(arg: &[u8], now_ms: i64) -> Result<Option<std::time::Duration>, ClientError> {
    let error = |why: &str| ClientError::Unsupported(format!("timeout is {why}"));
    let seconds = std::str::from_utf8(arg)
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .filter(|s| !s.is_nan())
        .ok_or_else(|| error("not a float or out of range"))?;
    let ms = seconds * 1000.0;
    if ms > i64::MAX as f64 || ms.ceil() > i64::MAX.saturating_sub(now_ms) as f64 {
        return Err(error("out of range"));
    }
    if ms.ceil() < 0.0 {
        return Err(error("negative"));
    }
    if ms <= 0.0 {
        return Ok(None);
    }
    std::time::Duration::try_from_secs_f64(seconds)
        .map(Some)
        .map_err(|_| error("out of range"))
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Parses a forwarded command (the table has checked the arity); its keys are where the
/// table's key spec says.
pub fn parse_forward(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let kind = forward_kind(spec.name).ok_or_else(|| arity_error(&args))?;
    let keys = crate::command::spec::keys_of(spec, &args);
    Ok(Command::Forward(Forward { kind, args, keys }))
}

/// Parses `PEXPIRE`/`EXPIRE`.
pub fn parse_expire(args: Vec<Bytes>) -> Result<Command, ClientError> {
    if !(3..=4).contains(&args.len()) {
        return Err(arity_error(&args));
    }
    let n = parse_int(nth(&args, 2)?)?;
    let seconds = nth(&args, 0)?.eq_ignore_ascii_case(b"EXPIRE");
    let invalid = || {
        ClientError::InvalidExpire(
            String::from_utf8_lossy(nth(&args, 0).map_or(&[][..], |a| a.as_ref())).to_lowercase(),
        )
    };
    let ttl_ms = if seconds {
        n.checked_mul(1000).ok_or_else(invalid)?
    } else {
        n
    };
    let flag = match args.get(3) {
        None => None,
        Some(f) if matches!(f.to_ascii_uppercase().as_slice(), b"NX" | b"XX" | b"GT" | b"LT") => Some(f.clone()),
        Some(f) => {
            return Err(ClientError::Unsupported(format!(
                "Unsupported option {}",
                String::from_utf8_lossy(f)
            )));
        }
    };
    Ok(Command::Expire(Expire {
        key: nth(&args, 1)?.clone(),
        ttl_ms,
        flag,
    }))
}

/// Parses `SET key value [options]`.
pub fn parse_set(args: Vec<Bytes>) -> Result<Command, ClientError> {
    if args.len() < 3 {
        return Err(arity_error(&args));
    }
    let mut set = Set {
        key: nth(&args, 1)?.clone(),
        value: nth(&args, 2)?.clone(),
        condition: Condition::Always,
        get: false,
        expiry: Expiry::None,
    };
    // Each option, and the word after it for those that take one.
    let mut rest = from(&args, 3);
    while let [option, tail @ ..] = rest {
        let word = Upper::of(option);
        rest = tail;
        let value = tail.first();
        match (&*word, value) {
            (b"NX", _) if set.condition == Condition::Always => set.condition = Condition::Nx,
            (b"XX", _) if set.condition == Condition::Always => set.condition = Condition::Xx,
            (b"IFEQ", Some(old)) if set.condition == Condition::Always => {
                set.condition = Condition::IfEq(old.clone());
                rest = from(tail, 1);
            }
            (b"GET", _) => set.get = true,
            (b"KEEPTTL", _) if set.expiry == Expiry::None => set.expiry = Expiry::KeepTtl,
            (b"EX" | b"PX" | b"EXAT" | b"PXAT", Some(v)) if set.expiry == Expiry::None => {
                set.expiry = parse_expiry(&word, v)?;
                rest = from(tail, 1);
            }
            _ => return Err(ClientError::Syntax),
        }
    }
    Ok(if set.condition == Condition::Nx {
        Command::Acquire(set)
    } else {
        Command::Set(set)
    })
}

/// Parses `GETSET key value`: a `SET key value GET`.
pub fn parse_getset(args: Vec<Bytes>) -> Result<Command, ClientError> {
    if args.len() != 3 {
        return Err(arity_error(&args));
    }
    Ok(Command::Set(Set {
        key: nth(&args, 1)?.clone(),
        value: nth(&args, 2)?.clone(),
        condition: Condition::Always,
        get: true,
        expiry: Expiry::None,
    }))
}

/// Parses `SETNX key value`.
pub fn parse_setnx(args: Vec<Bytes>) -> Result<Command, ClientError> {
    if args.len() != 3 {
        return Err(arity_error(&args));
    }
    Ok(Command::SetNx {
        key: nth(&args, 1)?.clone(),
        value: nth(&args, 2)?.clone(),
    })
}

/// Parses `DELEX key [IFEQ value | IFNE value]`.
pub fn parse_delex(args: Vec<Bytes>) -> Result<Command, ClientError> {
    let condition = match args.len() {
        2 => DelCondition::Always,
        4 => match nth(&args, 2)?.to_ascii_uppercase().as_slice() {
            b"IFEQ" => DelCondition::IfEq(nth(&args, 3)?.clone()),
            b"IFNE" => DelCondition::IfNe(nth(&args, 3)?.clone()),
            b"IFDEQ" | b"IFDNE" => {
                return Err(ClientError::Unsupported(
                    "DELEX with a digest condition is not supported by the proxy: use IFEQ/IFNE".into(),
                ));
            }
            _ => return Err(ClientError::Syntax),
        },
        1 => return Err(arity_error(&args)),
        _ => return Err(ClientError::Syntax),
    };
    Ok(Command::DelEx(DelEx {
        key: nth(&args, 1)?.clone(),
        condition,
    }))
}

fn parse_expiry(unit: &[u8], value: &[u8]) -> Result<Expiry, ClientError> {
    let n = parse_int(value)?;
    let invalid = || ClientError::InvalidExpire("set".into());
    if n <= 0 {
        return Err(invalid());
    }
    let ms = match unit {
        b"EX" | b"EXAT" => n.checked_mul(1000).ok_or_else(invalid)?,
        _ => n,
    }
    .unsigned_abs();
    Ok(match unit {
        b"EX" | b"PX" => Expiry::Px(ms),
        _ => Expiry::AtMs(ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args;

    #[test]
    fn blpop_timeouts_out_of_range_are_errors_not_panics() {
        for line in ["BLPOP k 1e20", "BLPOP k 9.3e15", "BLPOP k 1e308"] {
            assert_eq!(
                Command::parse(args(line)).map_err(|e| e.to_string()),
                Err("ERR timeout is out of range".into()),
                "{line}"
            );
        }
        assert!(matches!(
            Command::parse(args("BLPOP k 0.5")),
            Ok(Command::BlPop { timeout: Some(_), .. })
        ));
        assert!(matches!(
            Command::parse(args("BLPOP k 0")),
            Ok(Command::BlPop { timeout: None, .. })
        ));
    }

    fn set(line: &str) -> Set {
        match Command::parse(args(line)).unwrap() {
            Command::Set(s) | Command::Acquire(s) => s,
            other => panic!("{line} parsed as {other:?}"),
        }
    }

    fn error(line: &str) -> String {
        Command::parse(args(line)).unwrap_err().to_string()
    }

    #[test]
    fn blpop_timeouts_are_checked_as_redis_checks_them() {
        use std::time::Duration;
        let now = 1_700_000_000_000;
        let timeout = |t: &str| blpop_timeout(t.as_bytes(), now).map_err(|e| e.to_string());
        assert_eq!(timeout("0"), Ok(None));
        assert_eq!(timeout("1.5"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(timeout("-0.0001"), Ok(None), "rounds up to 0 ms, as Redis does");
        let out = Err("ERR timeout is out of range".to_owned());
        assert_eq!(timeout("1e20"), out, "beyond a signed 64-bit count of ms");
        assert_eq!(timeout("inf"), out);
        assert_eq!(
            timeout(&(i64::MAX / 1000).to_string()),
            out,
            "the deadline from now overflows"
        );
        assert!(timeout("1e15").is_ok(), "a deadline Redis accepts");
        assert_eq!(timeout("-1"), Err("ERR timeout is negative".to_owned()));
        let nan = Err("ERR timeout is not a float or out of range".to_owned());
        assert_eq!(timeout("nan"), nan);
        assert_eq!(timeout("soon"), nan);
        assert_eq!(error("BLPOP k 1e20"), "ERR timeout is out of range");
    }

    #[test]
    fn acquire_in_every_client_spelling() {
        for line in [
            "SET k t NX PX 10000",
            "SET k t PX 10000 NX",
            "set k t px 10000 nx",
            "SET k t nx ex 10",
            "set k t ex 10 nx",
        ] {
            let s = set(line);
            assert_eq!((&s.key[..], &s.value[..]), (&b"k"[..], &b"t"[..]), "{line}");
            assert_eq!(
                (s.condition, s.expiry, s.get),
                (Condition::Nx, Expiry::Px(10_000), false),
                "{line}"
            );
        }
    }

    #[test]
    fn every_set_option() {
        assert_eq!(set("SET k t NX").expiry, Expiry::None);
        assert_eq!(set("SET k t XX KEEPTTL").expiry, Expiry::KeepTtl);
        assert_eq!(set("SET k t EXAT 10").expiry, Expiry::AtMs(10_000));
        assert_eq!(set("SET k t PXAT 10").expiry, Expiry::AtMs(10));
        assert!(set("SET k t NX GET").get);
        assert_eq!(
            set("SET k t IFEQ old PX 5").condition,
            Condition::IfEq(Bytes::from_static(b"old"))
        );
    }

    #[test]
    fn set_errors_match_redis() {
        assert_eq!(error("SET k t NX XX"), "ERR syntax error");
        assert_eq!(error("SET k t NX IFEQ v"), "ERR syntax error");
        assert_eq!(error("SET k t PX 1 EX 1"), "ERR syntax error");
        assert_eq!(error("SET k t PX"), "ERR syntax error");
        assert_eq!(error("SET k t PX 0 NX"), "ERR invalid expire time in 'set' command");
        assert_eq!(error("SET k t PX -5 NX"), "ERR invalid expire time in 'set' command");
        assert_eq!(
            error("SET k t PX ten NX"),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            error("SET k t EX 9223372036854775807 NX"),
            "ERR invalid expire time in 'set' command"
        );
        assert_eq!(error("SET k"), "ERR wrong number of arguments for 'set' command");
    }

    #[test]
    fn getset_is_set_get() {
        let s = set("GETSET k v");
        assert!(s.get);
        assert_eq!(s.condition, Condition::Always);
    }

    #[test]
    fn delex_conditions() {
        let Command::DelEx(d) = Command::parse(args("DELEX k IFEQ t")).unwrap() else {
            panic!()
        };
        assert_eq!(d.condition, DelCondition::IfEq(Bytes::from_static(b"t")));
        assert_eq!(error("DELEX k IFXX t"), "ERR syntax error");
        assert!(error("DELEX k IFDEQ d").contains("digest"));
    }

    #[test]
    fn expire_parsing() {
        let Command::Expire(e) = Command::parse(args("EXPIRE k 10 GT")).unwrap() else {
            panic!()
        };
        assert_eq!((e.ttl_ms, e.flag.as_deref()), (10_000, Some(&b"GT"[..])));
        assert_eq!(
            error("pexpire a"),
            "ERR wrong number of arguments for 'pexpire' command"
        );
    }

    #[test]
    fn forwarded_keys_and_arity() {
        let Command::Forward(f) = Command::parse(args("DEL a b")).unwrap() else {
            panic!()
        };
        assert_eq!(f.keys, args("a b"));
        assert_eq!(error("GET a b"), "ERR wrong number of arguments for 'get' command");
    }
}
