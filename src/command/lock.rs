//! `SET ... NX` (acquire) and the key commands forwarded to every master.

use bytes::Bytes;

use super::{Command, arity_error, parse_int};
use crate::error::ClientError;

/// `SET key token NX [PX ms | EX s]`: take a lock.
#[derive(Clone, Debug, PartialEq)]
pub struct Acquire {
    /// The lock's key.
    pub key: Bytes,
    /// The caller's token; unique per acquisition (rule 1).
    pub token: Bytes,
    /// The TTL asked for; `None` when the client sent none (the proxy applies `default_ttl_ms`).
    pub ttl_ms: Option<u64>,
}

/// A key command sent as is to every master; the replies are combined by the majority rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    /// The command exactly as the client sent it.
    pub args: Vec<Bytes>,
    /// The keys it touches.
    pub keys: Vec<Bytes>,
}

/// Which arguments of a forwarded command are keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keys {
    /// Only the first argument.
    First,
    /// Every argument after the name.
    All,
}

/// Arity (Redis convention: positive exact, negative minimum) and key positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardSpec {
    arity: i32,
    keys: Keys,
}

/// The forwarded commands. The majority rule gives each its lock meaning: `GET` is the
/// value a quorum holds, `PTTL` the TTL a quorum still guarantees, `DEL` the count a quorum
/// deleted.
pub fn forward_spec(upper_name: &[u8]) -> Option<ForwardSpec> {
    let (arity, keys) = match upper_name {
        b"GET" | b"PTTL" | b"TTL" => (2, Keys::First),
        b"PEXPIRE" | b"EXPIRE" => (-3, Keys::First),
        b"EXISTS" | b"DEL" | b"UNLINK" => (-2, Keys::All),
        _ => return None,
    };
    Some(ForwardSpec { arity, keys })
}

/// Checks arity and collects the keys of a forwarded command.
pub fn parse_forward(spec: ForwardSpec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let n = args.len() as i32;
    let arity_ok = if spec.arity >= 0 {
        n == spec.arity
    } else {
        n >= -spec.arity
    };
    if !arity_ok {
        return Err(arity_error(&args));
    }
    let keys = match spec.keys {
        Keys::First => vec![args[1].clone()],
        Keys::All => args[1..].to_vec(),
    };
    Ok(Command::Forward(Forward { args, keys }))
}

/// Parses `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT ts|PXAT ms-ts|KEEPTTL]`.
///
/// `SET ... NX` is the lock acquisition; a `SET` without `NX` is forwarded to every master.
pub fn parse_set(args: Vec<Bytes>) -> Result<Command, ClientError> {
    if args.len() < 3 {
        return Err(arity_error(&args));
    }
    let options = SetOptions::parse(&args[3..])?;
    if !options.nx {
        let keys = vec![args[1].clone()];
        return Ok(Command::Forward(Forward { args, keys }));
    }
    if options.get {
        return Err(ClientError::Unsupported(
            "SET with NX and GET is not supported by the proxy".into(),
        ));
    }
    let ttl_ms = match options.expiry {
        Expiry::None | Expiry::KeepTtl => None,
        Expiry::Px(ms) => Some(ms),
        Expiry::At => {
            return Err(ClientError::Unsupported(
                "SET with NX and EXAT/PXAT is not supported by the proxy: use PX or EX".into(),
            ));
        }
    };
    Ok(Command::Acquire(Acquire {
        key: args[1].clone(),
        token: args[2].clone(),
        ttl_ms,
    }))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expiry {
    None,
    KeepTtl,
    /// A relative TTL in milliseconds (from `PX`, or `EX` × 1000).
    Px(u64),
    /// An absolute time (`EXAT`/`PXAT`).
    At,
}

#[derive(Clone, Copy, Debug)]
struct SetOptions {
    nx: bool,
    xx: bool,
    get: bool,
    expiry: Expiry,
}

impl SetOptions {
    /// Parses the options after `SET key value`, accepting any order and case, with the
    /// same conflicts Redis refuses.
    fn parse(options: &[Bytes]) -> Result<SetOptions, ClientError> {
        let mut o = SetOptions {
            nx: false,
            xx: false,
            get: false,
            expiry: Expiry::None,
        };
        let mut i = 0;
        while i < options.len() {
            let word = options[i].to_ascii_uppercase();
            let needs_value = matches!(word.as_slice(), b"EX" | b"PX" | b"EXAT" | b"PXAT");
            let value = if needs_value {
                options.get(i + 1)
            } else {
                None
            };
            match (word.as_slice(), value) {
                (b"NX", _) if !o.xx => o.nx = true,
                (b"XX", _) if !o.nx => o.xx = true,
                (b"GET", _) => o.get = true,
                (b"KEEPTTL", _) if o.expiry == Expiry::None => o.expiry = Expiry::KeepTtl,
                (b"EX" | b"PX" | b"EXAT" | b"PXAT", Some(v)) if o.expiry == Expiry::None => {
                    o.expiry = parse_expiry(&word, v)?;
                    i += 1;
                }
                _ => return Err(ClientError::Syntax),
            }
            i += 1;
        }
        Ok(o)
    }
}

fn parse_expiry(unit: &[u8], value: &[u8]) -> Result<Expiry, ClientError> {
    let n = parse_int(value)?;
    let invalid = || ClientError::InvalidExpire("set".into());
    if n <= 0 {
        return Err(invalid());
    }
    match unit {
        b"EX" => n
            .checked_mul(1000)
            .map(|ms| Expiry::Px(ms as u64))
            .ok_or_else(invalid),
        b"PX" => Ok(Expiry::Px(n as u64)),
        _ => Ok(Expiry::At),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args;

    fn acquire(line: &str) -> Acquire {
        match Command::parse(args(line)).unwrap() {
            Command::Acquire(a) => a,
            other => panic!("{line} parsed as {other:?}"),
        }
    }

    fn error(line: &str) -> String {
        Command::parse(args(line)).unwrap_err().to_string()
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
            let a = acquire(line);
            assert_eq!(
                (&a.key[..], &a.token[..], a.ttl_ms),
                (&b"k"[..], &b"t"[..], Some(10_000)),
                "{line}"
            );
        }
    }

    #[test]
    fn acquire_without_ttl_leaves_it_to_the_proxy() {
        assert_eq!(acquire("SET k t NX").ttl_ms, None);
    }

    #[test]
    fn set_errors_match_redis() {
        assert_eq!(error("SET k t NX XX"), "ERR syntax error");
        assert_eq!(error("SET k t PX 1 EX 1"), "ERR syntax error");
        assert_eq!(error("SET k t PX"), "ERR syntax error");
        assert_eq!(
            error("SET k t PX 0 NX"),
            "ERR invalid expire time in 'set' command"
        );
        assert_eq!(
            error("SET k t PX -5 NX"),
            "ERR invalid expire time in 'set' command"
        );
        assert_eq!(
            error("SET k t PX ten NX"),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            error("SET k t EX 9223372036854775807 NX"),
            "ERR invalid expire time in 'set' command"
        );
        assert_eq!(
            error("SET k"),
            "ERR wrong number of arguments for 'set' command"
        );
    }

    #[test]
    fn set_without_nx_is_forwarded() {
        assert!(matches!(
            Command::parse(args("SET k v PX 100")).unwrap(),
            Command::Forward(_)
        ));
    }

    #[test]
    fn forwarded_keys_and_arity() {
        let Command::Forward(f) = Command::parse(args("DEL a b")).unwrap() else {
            panic!()
        };
        assert_eq!(f.keys, args("a b"));
        assert_eq!(
            error("GET a b"),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(
            error("pexpire a"),
            "ERR wrong number of arguments for 'pexpire' command"
        );
    }
}
