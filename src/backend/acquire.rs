//! The plain acquisition as a master runs it: plain commands, not a script.
//!
//! `MULTI`, `SET key token NX PX ttl`, `TIME`, `EXEC`: one transaction, so nothing runs on the
//! master between the write and the clock reading. It costs a master about 1.4× a lone `SET NX
//! PX` at the same pipeline depth, where the script it replaces (the write, a marker key and
//! the clock reading) cost 4× (BENCHMARKS.md, "The masters' cost of exactness").
//!
//! The four replies fold into the one answer the quorum engine reads ([`fold`]):
//! - written: `{expiry, {seconds, microseconds}}`. `expiry` is when the key this attempt wrote
//!   expires, in Unix milliseconds on the master's clock: the time read with nothing between
//!   it and the write, plus the TTL (how Redis sets an expiry), so one millisecond late at
//!   most. With the token, it names this write and no other, which is what lets an undo remove
//!   exactly it (rule 5a, see [`crate::scripts::UNDO`]). The time is rule 15's clock reading,
//!   split off and judged by the backend ([`super::Request::timed`]).
//! - held: nil, as `SET NX` answers.
//! - a failure: the master's own error (`OOM`, `NOPERM`, `MOVED` ...), never a refusal.

use bytes::Bytes;

use super::pipeline::encoded_len;
use super::wall_clock::parse_time;
use crate::reply::{Reply, bulk, header};

/// How many replies the transaction gets: `MULTI`'s, one per queued command, `EXEC`'s.
pub const REPLIES: usize = 4;

/// The transaction for `SET key token NX PX ttl_ms`, RESP-encoded, in one allocation (sized
/// exactly: a full vector becomes `Bytes` without a second one).
pub fn encoded(key: &[u8], token: &[u8], ttl_ms: &[u8]) -> Bytes {
    const MULTI: &[u8] = b"*1\r\n$5\r\nMULTI\r\n";
    const TIME_EXEC: &[u8] = b"*1\r\n$4\r\nTIME\r\n*1\r\n$4\r\nEXEC\r\n";
    let set: [&[u8]; 6] = [b"SET", key, token, b"NX", b"PX", ttl_ms];
    let mut wire = Vec::with_capacity(MULTI.len() + encoded_len(set.len(), 0, set.iter().copied()) + TIME_EXEC.len());
    wire.extend_from_slice(MULTI);
    header(&mut wire, b'*', set.len());
    for arg in set {
        bulk(&mut wire, arg);
    }
    wire.extend_from_slice(TIME_EXEC);
    Bytes::from(wire)
}

/// The transaction's reply (`exec`, and `error`: the first error reply before it) for a write
/// of `ttl_ms`, as the one answer described above. A write's answer is `EXEC`'s own array,
/// its first place given the expiry: no allocation.
pub fn fold(error: Option<Reply>, exec: Reply, ttl_ms: u64) -> Reply {
    match exec {
        Reply::Array(mut results) => {
            let expiry = match results.as_slice() {
                [Reply::Nil, _] => return Reply::Nil,
                // The `SET` itself failed: its error, never a refusal (rule 5a).
                [set @ Reply::Error(_), _] => return set.clone(),
                [Reply::Status(ok), time] if &ok[..] == b"OK" => expiry(time, ttl_ms),
                _ => None,
            };
            match (expiry, results.first_mut()) {
                (Some(expiry), Some(set)) => {
                    *set = Reply::Int(expiry);
                    Reply::Array(results)
                }
                _ => unexpected(),
            }
        }
        // `EXECABORT`: a command was refused when queued (`OOM`, `NOPERM`, a cluster's
        // `MOVED`): that command's error is the answer.
        Reply::Error(aborted) => error.unwrap_or(Reply::Error(aborted)),
        _ => unexpected(),
    }
}

/// When a key written `ttl_ms` long at the master's `time` (as `TIME` answers it) expires, in
/// Unix milliseconds; `None` when `time` is no time or the sum does not fit.
fn expiry(time: &Reply, ttl_ms: u64) -> Option<i64> {
    let at = i64::try_from(parse_time(time)?.as_millis()).ok()?;
    at.checked_add(i64::try_from(ttl_ms).ok()?)
}

/// A reply no Redis gives to this transaction: a failure of this master, never a vote.
fn unexpected() -> Reply {
    Reply::error("ERR unexpected reply to the acquisition transaction")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn time() -> Reply {
        Reply::Array(vec![bulk("1700000000"), bulk("123456")])
    }

    fn exec(set: Reply) -> Reply {
        Reply::Array(vec![set, time()])
    }

    #[test]
    fn a_write_is_read_as_its_expiry_and_the_clock() {
        assert_eq!(
            fold(None, exec(Reply::ok()), 10_000),
            Reply::Array(vec![Reply::Int(1_700_000_010_123), time()])
        );
    }

    #[test]
    fn the_clock_reading_splits_off_a_write_and_nothing_else() {
        let (vote, at) = crate::backend::split_time(fold(None, exec(Reply::ok()), 10_000));
        assert_eq!(vote, Reply::Int(1_700_000_010_123));
        assert_eq!(at, Some(std::time::Duration::from_micros(1_700_000_000_123_456)));
        for other in [
            Reply::Nil,
            Reply::Array(vec![Reply::Int(5)]),
            Reply::Array(vec![Reply::Int(5), bulk("not a time")]),
        ] {
            assert_eq!(crate::backend::split_time(other.clone()), (other, None));
        }
    }

    #[test]
    fn a_refusal_is_nil_as_set_nx_answers() {
        assert_eq!(fold(None, exec(Reply::Nil), 10_000), Reply::Nil);
    }

    #[test]
    fn a_refused_command_is_the_answer_of_an_aborted_transaction() {
        let oom = Reply::error("OOM command not allowed when used memory > 'maxmemory'.");
        let aborted = Reply::error("EXECABORT Transaction discarded because of previous errors.");
        assert_eq!(fold(Some(oom.clone()), aborted.clone(), 10_000), oom);
        assert_eq!(fold(None, aborted.clone(), 10_000), aborted);
        let wrongtype = Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value");
        assert_eq!(fold(None, exec(wrongtype.clone()), 10_000), wrongtype);
    }

    #[test]
    fn anything_else_is_a_failure_never_a_vote() {
        for exec_reply in [
            Reply::NilArray,
            Reply::Array(vec![Reply::ok()]),
            exec(Reply::Int(1)),
            Reply::Array(vec![Reply::ok(), Reply::Array(vec![bulk("x"), bulk("1")])]),
            Reply::Array(vec![Reply::ok(), bulk("1700000000")]),
        ] {
            assert!(fold(None, exec_reply.clone(), 10).is_error(), "{exec_reply:?}");
        }
        assert!(fold(None, exec(Reply::ok()), u64::MAX).is_error(), "a TTL past i64");
    }

    #[test]
    fn the_wire_is_the_four_commands_as_any_command_is_encoded() {
        let key = vec![b'k'; 300];
        let wire = encoded(&key, b"token", b"10000");
        let mut expected = Vec::new();
        for command in [
            vec![&b"MULTI"[..]],
            vec![b"SET", &key, b"token", b"NX", b"PX", b"10000"],
            vec![b"TIME"],
            vec![b"EXEC"],
        ] {
            expected.extend_from_slice(&super::super::pipeline::encode(command.into_iter()));
        }
        assert_eq!(&wire[..], &expected[..]);
    }
}
