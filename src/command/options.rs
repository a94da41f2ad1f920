//! The arguments every recipe's acquisition reads alike: its options (`KEEPALIVE`, `WAIT ms`)
//! and a TTL. Each recipe's parser (`recipes/*/parse.rs`) uses them.

use bytes::Bytes;

use super::parse_int;
use crate::error::ClientError;

/// An acquisition's options (`LOCK.ACQUIRE`'s, `SEM.ACQUIRE`'s), in any order, each once:
/// `KEEPALIVE`, `WAIT ms`. Returns whether it keeps the lock alive, and how long it waits.
pub fn acquire_options(options: &[Bytes]) -> Result<(bool, Option<u64>), ClientError> {
    let (mut keepalive, mut wait_ms) = (false, None);
    let mut rest = options;
    while let [option, tail @ ..] = rest {
        rest = tail;
        if option.eq_ignore_ascii_case(b"KEEPALIVE") && !keepalive {
            keepalive = true;
        } else if option.eq_ignore_ascii_case(b"WAIT") && wait_ms.is_none() {
            let [ms, tail @ ..] = rest else {
                return Err(ClientError::Syntax);
            };
            rest = tail;
            wait_ms = Some(u64::try_from(parse_int(ms)?).map_err(|_| ClientError::NotInteger)?);
        } else {
            return Err(ClientError::Syntax);
        }
    }
    Ok((keepalive, wait_ms))
}

/// A TTL argument of command `name`: a positive number of milliseconds.
pub fn ttl_ms(name: &str, arg: &[u8]) -> Result<u64, ClientError> {
    match parse_int(arg)? {
        ms if ms > 0 => Ok(ms.unsigned_abs()),
        _ => Err(ClientError::InvalidExpire(name.to_owned())),
    }
}
