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
//!   exactly it (rule 5a, see [`crate::lua::own::UNDO`]). The time is rule 15's clock reading,
//!   split off and judged by the backend ([`super::Request::timed`]).
//! - held: nil, as `SET NX` answers.
//! - a failure: the master's own error (`OOM`, `NOPERM`, `MOVED` ...), never a refusal.
//!
//! Acquisitions queued together on one connection share one transaction (the pipeline's
//! [`set_of`] and [`split`]): `MULTI`, a `TIME`, the `SET` of each, a second `TIME`, `EXEC`.
//! Each `SET` reads the master's clock when it runs (Redis 7.0; a later Redis reads it once for
//! the whole `EXEC`), and a master descheduled in the middle of a long transaction runs its
//! first `SET`s more than a millisecond before the last `TIME`: the two readings bracket every
//! write, and each member's answer carries both (`{{latest, earliest}, time}`), which the undo
//! checks the key's expiry against (`crate::lua::ScriptCall::undo_between`). With one reading
//! after the writes only, such an undo missed its own write (once in CI, under load) and left
//! the key to its TTL. A shared transaction costs a master 1.04-1.14× a lone `SET NX PX` per
//! acquisition where one each cost 1.5× (BENCHMARKS.md, "The masters' cost of exactness"); the
//! second `TIME` is one command more per transaction, not per acquisition.

use bytes::Bytes;

use super::wall_clock::parse_time;
use crate::reply::{Reply, bulk, header};
use crate::wire::encoded_len;

/// How many replies the transaction gets: `MULTI`'s, one per queued command, `EXEC`'s.
pub const REPLIES: usize = 4;

/// How every acquisition's transaction begins.
pub const MULTI: &[u8] = b"*1\r\n$5\r\nMULTI\r\n";

/// The clock reading a shared transaction gets before its writes, right after [`MULTI`].
pub const TIME: &[u8] = b"*1\r\n$4\r\nTIME\r\n";

/// How every acquisition's transaction ends: what a later acquisition that joins it is
/// written before.
pub const TIME_EXEC: &[u8] = b"*1\r\n$4\r\nTIME\r\n*1\r\n$4\r\nEXEC\r\n";

/// The `SET` of an [`encoded`] transaction, for another to take in: each `SET` more adds one
/// reply (`QUEUED`) and one place to `EXEC`'s array.
pub fn set_of(encoded: &[u8]) -> Option<&[u8]> {
    encoded.strip_prefix(MULTI)?.strip_suffix(TIME_EXEC)
}

/// The `EXEC` reply of a transaction `members` acquisitions share (`TIME`, their `SET`s,
/// `TIME`), as each one's answer: its `SET`'s result with the reading after the writes and the
/// one before. An error (an `EXECABORT`: nothing ran) is every member's answer; an array of
/// another length no member's (a failure for each).
pub fn split(exec: Reply, members: usize) -> Vec<Reply> {
    match exec {
        _ if members == 1 => vec![exec],
        Reply::Array(mut results) if results.len() == members + 2 => {
            let after = results.pop().unwrap_or(Reply::Nil);
            let mut results = results.into_iter();
            let before = results.next().unwrap_or(Reply::Nil);
            results
                .map(|set| Reply::Array(vec![set, after.clone(), before.clone()]))
                .collect()
        }
        error @ Reply::Error(_) => vec![error; members],
        _ => vec![unexpected(); members],
    }
}

/// The transaction for `SET key token NX PX ttl_ms`, RESP-encoded, in one allocation (sized
/// exactly: a full vector becomes `Bytes` without a second one).
pub fn encoded(key: &[u8], token: &[u8], ttl_ms: &[u8]) -> Bytes {
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
/// of `ttl_ms`, as the one answer described above. A lone write's answer is `EXEC`'s own
/// array, its first place given the expiry: no allocation. A shared transaction's member
/// ([`split`]: `{set, time after, time before}`) answers `{{latest, earliest}, time after}`.
pub fn fold(error: Option<Reply>, exec: Reply, ttl_ms: u64) -> Reply {
    match exec {
        Reply::Array(mut results) => {
            let expiry = match results.as_slice() {
                [Reply::Nil, _] | [Reply::Nil, _, _] => return Reply::Nil,
                // The `SET` itself failed: its error, never a refusal (rule 5a).
                [set @ Reply::Error(_), _] | [set @ Reply::Error(_), _, _] => return set.clone(),
                [Reply::Status(ok), time] if &ok[..] == b"OK" => expiry(time, ttl_ms).map(Reply::Int),
                // Rule 5a: the write's expiry lies between the two readings; readings out
                // of order name no write, and make no vote.
                [Reply::Status(ok), after, before] if &ok[..] == b"OK" => {
                    match (expiry(after, ttl_ms), expiry(before, ttl_ms)) {
                        (Some(latest), Some(earliest)) if earliest <= latest => {
                            Some(Reply::Array(vec![Reply::Int(latest), Reply::Int(earliest)]))
                        }
                        _ => None,
                    }
                }
                _ => None,
            };
            results.truncate(2);
            match (expiry, results.first_mut()) {
                (Some(expiry), Some(set)) => {
                    *set = expiry;
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
    fn a_shared_transaction_is_each_members_own() {
        let wire = encoded(b"k", b"t", b"10");
        let set = set_of(&wire).unwrap();
        assert_eq!(
            set,
            &crate::wire::encode([&b"SET"[..], b"k", b"t", b"NX", b"PX", b"10"].into_iter())[..]
        );
        assert_eq!(set_of(b"*1\r\n$4\r\nPING\r\n"), None);
        let before = Reply::Array(vec![bulk("1699999999"), bulk("998000")]);
        let shared = Reply::Array(vec![before.clone(), Reply::ok(), Reply::Nil, Reply::ok(), time()]);
        let parts = split(shared, 3);
        let member = |set| Reply::Array(vec![set, time(), before.clone()]);
        assert_eq!(
            parts,
            vec![member(Reply::ok()), member(Reply::Nil), member(Reply::ok())]
        );
        assert_eq!(fold(None, parts[1].clone(), 10), Reply::Nil);
        // Each written member's expiry lies between the two readings: both are its answer,
        // the clock reading after the writes splits off as a lone write's does.
        let written = fold(None, parts[0].clone(), 10_000);
        let (vote, at) = crate::backend::split_time(written);
        assert_eq!(
            vote,
            Reply::Array(vec![Reply::Int(1_700_000_010_123), Reply::Int(1_700_000_009_998)])
        );
        assert_eq!(at, Some(std::time::Duration::from_micros(1_700_000_000_123_456)));
        // Readings out of order are no answer at all.
        let backwards = Reply::Array(vec![Reply::ok(), before.clone(), time()]);
        assert!(fold(None, backwards, 10_000).is_error());
        assert!(
            fold(
                None,
                Reply::Array(vec![Reply::error("OOM"), time(), before.clone()]),
                10
            )
            .is_error()
        );
        let aborted = Reply::error("EXECABORT Transaction discarded because of previous errors.");
        assert_eq!(split(aborted.clone(), 2), vec![aborted.clone(), aborted]);
        assert_eq!(split(exec(Reply::ok()), 1), vec![exec(Reply::ok())]);
        // An array of the wrong length is no member's reply: each reads it as a failure.
        for part in split(Reply::Array(vec![Reply::ok(), time()]), 2)
            .into_iter()
            .chain(split(Reply::Nil, 2))
        {
            assert!(fold(None, part, 10).is_error());
        }
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
            expected.extend_from_slice(&crate::wire::encode(command.into_iter()));
        }
        assert_eq!(&wire[..], &expected[..]);
    }
}
