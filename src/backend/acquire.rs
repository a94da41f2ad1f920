//! The plain acquisition as a master runs it: plain commands, not a script.
//!
//! `MULTI`, `SET key token NX PX ttl`, `TIME`, `EXEC`: one transaction, so nothing runs on the
//! master between the write and the clock reading. It costs a master about 1.4× a lone `SET NX
//! PX` at the same pipeline depth, where the script it replaces (the write, a marker key and
//! the clock reading) cost 4× (BENCHMARKS.md, "The masters' cost of exactness").
//!
//! The four replies fold into the one answer the quorum engine reads ([`fold`]):
//! - written: `{expiry, seconds, microseconds}`. `expiry` is when the key this attempt wrote
//!   expires, in Unix milliseconds on the master's clock: the time read with nothing between
//!   it and the write, plus the TTL (how Redis sets an expiry), so one millisecond late at
//!   most. With the token, it names this write and no other, which is what lets an undo remove
//!   exactly it (rule 5a, see [`crate::scripts::UNDO`]). The time is rule 15's clock reading,
//!   split off and judged by the backend ([`super::Request::timed`]).
//! - held: nil, as `SET NX` answers.
//! - a failure: the master's own error (`OOM`, `NOPERM`, `MOVED` ...), never a refusal.

use bytes::{BufMut, Bytes, BytesMut};

use super::wall_clock::time_of;
use crate::reply::Reply;

/// How many replies the transaction gets: `MULTI`'s, one per queued command, `EXEC`'s.
pub const REPLIES: usize = 4;

/// The transaction for `SET key token NX PX ttl_ms`, RESP-encoded, in one allocation.
pub fn encoded(key: &[u8], token: &[u8], ttl_ms: &[u8]) -> Bytes {
    const MULTI_SET: &[u8] = b"*1\r\n$5\r\nMULTI\r\n*6\r\n$3\r\nSET\r\n";
    const NX_PX: &[u8] = b"$2\r\nNX\r\n$2\r\nPX\r\n";
    const TIME_EXEC: &[u8] = b"*1\r\n$4\r\nTIME\r\n*1\r\n$4\r\nEXEC\r\n";
    // `$<len>\r\n<arg>\r\n`, the length up to 20 digits.
    let bulk_len = |arg: &[u8]| arg.len() + 25;
    let capacity = MULTI_SET.len() + NX_PX.len() + TIME_EXEC.len() + bulk_len(key) + bulk_len(token) + bulk_len(ttl_ms);
    let mut wire = BytesMut::with_capacity(capacity);
    wire.put_slice(MULTI_SET);
    put_bulk(&mut wire, key);
    put_bulk(&mut wire, token);
    wire.put_slice(NX_PX);
    put_bulk(&mut wire, ttl_ms);
    wire.put_slice(TIME_EXEC);
    wire.freeze()
}

/// Appends `arg` as a RESP bulk string.
fn put_bulk(wire: &mut BytesMut, arg: &[u8]) {
    let mut digits = itoa::Buffer::new();
    wire.put_u8(b'$');
    wire.put_slice(digits.format(arg.len()).as_bytes());
    wire.put_slice(b"\r\n");
    wire.put_slice(arg);
    wire.put_slice(b"\r\n");
}

/// The transaction's replies (`queued`: all but `EXEC`'s) for a write of `ttl_ms`, as the one
/// answer described above.
pub fn fold(queued: Vec<Reply>, exec: Reply, ttl_ms: u64) -> Reply {
    match exec {
        Reply::Array(results) => match <[Reply; 2]>::try_from(results) {
            Ok([set, Reply::Array(time)]) => read(set, time, ttl_ms),
            _ => unexpected(),
        },
        // `EXECABORT`: a command was refused when queued (`OOM`, `NOPERM`, a cluster's
        // `MOVED`): that command's error is the answer.
        Reply::Error(error) => queued.into_iter().find(Reply::is_error).unwrap_or(Reply::Error(error)),
        _ => unexpected(),
    }
}

/// One acquisition's results: the `SET`'s reply and the master's `TIME` after it.
fn read(set: Reply, time: Vec<Reply>, ttl_ms: u64) -> Reply {
    match set {
        Reply::Nil => Reply::Nil,
        Reply::Status(ok) if &ok[..] == b"OK" => {
            let Ok([secs, micros]) = <[Reply; 2]>::try_from(time) else {
                return unexpected();
            };
            let expiry = time_of(&secs, &micros)
                .and_then(|at| i64::try_from(at.as_millis()).ok())
                .zip(i64::try_from(ttl_ms).ok())
                .and_then(|(at, ttl)| at.checked_add(ttl));
            match expiry {
                Some(expiry) => Reply::Array(vec![Reply::Int(expiry), secs, micros]),
                None => unexpected(),
            }
        }
        error @ Reply::Error(_) => error,
        _ => unexpected(),
    }
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

    fn queued() -> Vec<Reply> {
        let status = |s: &'static str| Reply::Status(Bytes::from_static(s.as_bytes()));
        vec![status("OK"), status("QUEUED"), status("QUEUED")]
    }

    fn exec(set: Reply) -> Reply {
        Reply::Array(vec![set, Reply::Array(vec![bulk("1700000000"), bulk("123456")])])
    }

    #[test]
    fn a_write_is_read_as_its_expiry_and_the_clock() {
        assert_eq!(
            fold(queued(), exec(Reply::ok()), 10_000),
            Reply::Array(vec![Reply::Int(1_700_000_010_123), bulk("1700000000"), bulk("123456")])
        );
    }

    #[test]
    fn a_refusal_is_nil_as_set_nx_answers() {
        assert_eq!(fold(queued(), exec(Reply::Nil), 10_000), Reply::Nil);
    }

    #[test]
    fn a_refused_command_is_the_answer_of_an_aborted_transaction() {
        let mut replies = queued();
        replies[1] = Reply::error("OOM command not allowed when used memory > 'maxmemory'.");
        let answer = fold(
            replies,
            Reply::error("EXECABORT Transaction discarded because of previous errors."),
            10_000,
        );
        assert!(answer.is_error_code("OOM"), "{answer:?}");
    }

    #[test]
    fn anything_else_is_a_failure_never_a_vote() {
        for exec_reply in [
            Reply::NilArray,
            Reply::Array(vec![Reply::ok()]),
            exec(Reply::Int(1)),
            Reply::Array(vec![Reply::ok(), Reply::Array(vec![bulk("x"), bulk("1")])]),
        ] {
            assert!(fold(queued(), exec_reply.clone(), 10).is_error(), "{exec_reply:?}");
        }
        assert!(fold(queued(), exec(Reply::ok()), u64::MAX).is_error(), "a TTL past i64");
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
