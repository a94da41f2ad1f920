//! The plain acquisition as a master runs it: plain commands, not a script.
//!
//! `MULTI`, `SET key token NX PX ttl`, `PTTL key`, `TIME`, `EXEC`: one transaction, so nothing
//! runs on the master between the write and the two readings. It costs a master about 1.4× a
//! lone pipelined `SET NX PX`, where the script it replaces (the write, a marker key and the
//! clock reading) cost 3 to 5× (BENCHMARKS.md, "The masters' cost of exactness").
//!
//! The five replies fold into the one answer the quorum engine reads ([`fold`]):
//! - written: `{expiry, seconds, microseconds}`. `expiry` is when the key this attempt wrote
//!   expires, in Unix milliseconds on the master's clock (`TIME` + `PTTL`, read with nothing
//!   between them and the write): with the token, it names this write and no other, which is
//!   what lets an undo remove exactly it (rule 5a, see [`crate::scripts::UNDO`]). The time is
//!   rule 15's clock reading, split off and judged by the backend ([`super::Request::timed`]).
//! - held: `{pttl}`, how long the key is held here (what a waiting request needs to know).
//! - a failure: the master's own error (`OOM`, `NOPERM`, `MOVED` ...), never a refusal.

use bytes::{BufMut, Bytes, BytesMut};

use super::wall_clock::time_of;
use crate::reply::Reply;

/// How many replies the transaction gets: `MULTI`'s, one per queued command, `EXEC`'s.
pub const REPLIES: usize = 5;

/// The transaction for `SET key token NX PX ttl_ms`, RESP-encoded, in one allocation.
pub fn encoded(key: &[u8], token: &[u8], ttl_ms: &[u8]) -> Bytes {
    const MULTI: &[u8] = b"*1\r\n$5\r\nMULTI\r\n*6\r\n$3\r\nSET\r\n";
    const NX_PX: &[u8] = b"$2\r\nNX\r\n$2\r\nPX\r\n";
    const PTTL: &[u8] = b"*2\r\n$4\r\nPTTL\r\n";
    const TIME_EXEC: &[u8] = b"*1\r\n$4\r\nTIME\r\n*1\r\n$4\r\nEXEC\r\n";
    let bulk_len = |arg: &[u8]| arg.len() + 25; // `$<len>\r\n<arg>\r\n`, len up to 20 digits
    let capacity = MULTI.len()
        + NX_PX.len()
        + PTTL.len()
        + TIME_EXEC.len()
        + 2 * bulk_len(key)
        + bulk_len(token)
        + bulk_len(ttl_ms);
    let mut wire = BytesMut::with_capacity(capacity);
    wire.put_slice(MULTI);
    put_bulk(&mut wire, key);
    put_bulk(&mut wire, token);
    wire.put_slice(NX_PX);
    put_bulk(&mut wire, ttl_ms);
    wire.put_slice(PTTL);
    put_bulk(&mut wire, key);
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

/// The transaction's replies (`queued`: all but `EXEC`'s) as the one answer described above.
pub fn fold(queued: Vec<Reply>, exec: Reply) -> Reply {
    match exec {
        Reply::Array(results) => match <[Reply; 3]>::try_from(results) {
            Ok([set, Reply::Int(pttl), Reply::Array(time)]) => read(set, pttl, time),
            _ => unexpected(),
        },
        // `EXECABORT`: a command was refused when queued (`OOM`, `NOPERM`, a cluster's
        // `MOVED`): that command's error is the answer.
        Reply::Error(error) => queued.into_iter().find(Reply::is_error).unwrap_or(Reply::Error(error)),
        _ => unexpected(),
    }
}

/// One acquisition's results: the `SET`'s reply, the key's PTTL and the master's `TIME`.
fn read(set: Reply, pttl: i64, time: Vec<Reply>) -> Reply {
    match set {
        Reply::Nil => Reply::Array(vec![Reply::Int(pttl)]),
        Reply::Status(ok) if &ok[..] == b"OK" => {
            let Ok([secs, micros]) = <[Reply; 2]>::try_from(time) else {
                return unexpected();
            };
            // A written key has its TTL (`PTTL` ≥ 0): anything else cannot be read as a write.
            let expiry = time_of(&secs, &micros)
                .and_then(|at| i64::try_from(at.as_millis()).ok())
                .filter(|_| pttl >= 0)
                .and_then(|at| at.checked_add(pttl));
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
        vec![status("OK"), status("QUEUED"), status("QUEUED"), status("QUEUED")]
    }

    fn exec(set: Reply, pttl: i64) -> Reply {
        Reply::Array(vec![
            set,
            Reply::Int(pttl),
            Reply::Array(vec![bulk("1700000000"), bulk("123456")]),
        ])
    }

    #[test]
    fn a_write_is_read_as_its_expiry_and_the_clock() {
        assert_eq!(
            fold(queued(), exec(Reply::ok(), 10_000)),
            Reply::Array(vec![Reply::Int(1_700_000_010_123), bulk("1700000000"), bulk("123456")])
        );
    }

    #[test]
    fn a_refusal_is_read_as_the_time_it_is_held() {
        assert_eq!(
            fold(queued(), exec(Reply::Nil, 420)),
            Reply::Array(vec![Reply::Int(420)])
        );
    }

    #[test]
    fn a_refused_command_is_the_answer_of_an_aborted_transaction() {
        let mut replies = queued();
        replies[1] = Reply::error("OOM command not allowed when used memory > 'maxmemory'.");
        let answer = fold(
            replies,
            Reply::error("EXECABORT Transaction discarded because of previous errors."),
        );
        assert!(answer.is_error_code("OOM"), "{answer:?}");
    }

    #[test]
    fn anything_else_is_a_failure_never_a_vote() {
        for exec_reply in [
            Reply::NilArray,
            exec(Reply::ok(), -1),
            Reply::Array(vec![Reply::ok()]),
            exec(Reply::Int(1), 10),
        ] {
            assert!(fold(queued(), exec_reply.clone()).is_error(), "{exec_reply:?}");
        }
    }

    #[test]
    fn the_wire_is_the_five_commands() {
        let wire = encoded(b"k", b"t", b"100");
        let text = String::from_utf8_lossy(&wire);
        assert!(
            text.starts_with("*1\r\n$5\r\nMULTI\r\n*6\r\n$3\r\nSET\r\n$1\r\nk\r\n"),
            "{text}"
        );
        assert!(
            text.ends_with("*2\r\n$4\r\nPTTL\r\n$1\r\nk\r\n*1\r\n$4\r\nTIME\r\n*1\r\n$4\r\nEXEC\r\n"),
            "{text}"
        );
    }
}
