//! The Lua the masters run for the proxy: how a script is called on one master
//! ([`ScriptCall`]: by SHA1 with its source to fall back on, or in full and in order), the
//! proxy's own scripts on plain keys ([`own`]) and the fenced acquisition with its counters
//! ([`fence`]). Each recipe's own scripts are in its folder (`recipes/*/lua.rs`).

// Shared by the scripts of this module and of the recipes (`#[macro_use]` in `lib.rs`).
/// `expiry(k)`: key `k`'s expiry in Unix ms on this master's clock, as two bounds (`lo`, `hi`).
/// On Redis 7.0 and later both are `PEXPIRETIME`, the expiry exactly as the master keeps it. A
/// master without it (6.2) reads `TIME`, `PTTL` and `TIME` again: the `PTTL` was read between
/// the two clock readings, so the expiry lies between their sums; read again (up to three
/// times) while they differ. One `TIME + PTTL` read as a point, as before, is early by however
/// long the master was descheduled between its two reads (a loaded machine): judged against a
/// stamp within 1 ms, a live holds hash looked stale, a release then freed the lock on that
/// master while its holder still held extra holds, and with the lock on a bare quorum the lock
/// was lost (the fault checker's overlap of a reentrant holder and a fenced client;
/// `tests/reentrant_clock_reads.rs`). An undo read the same way was skipped, and the key it
/// should have deleted stayed until its TTL ([`own::UNDO`]). `near(at, k, from)`: whether
/// `k` expires at `at` or, given `from`, between `from` and `at` (a write between two clock
/// readings, rule 5a), within the millisecond either reading may have rounded.
macro_rules! expiry_lua {
    () => {
        "local function expiry(k) \
           local e = redis.pcall('pexpiretime', k) \
           if type(e) == 'number' then return e, e end \
           local lo, hi \
           for _ = 1, 3 do \
             local t = redis.call('time') local p = redis.call('pttl', k) local u = redis.call('time') \
             lo = t[1] * 1000 + math.floor(t[2] / 1000) + p \
             hi = u[1] * 1000 + math.floor(u[2] / 1000) + p \
             if hi == lo then break end \
           end \
           return lo, hi end \
         local function near(at, k, from) local lo, hi = expiry(k) return at >= lo - 1 and (from or at) <= hi + 1 end "
    };
}

#[macro_use]
pub mod fence;
pub mod legacy;
pub mod own;

use std::sync::{Arc, LazyLock, OnceLock};

use bytes::Bytes;

use crate::backend::{Backend, BackendError, Request};
use crate::reply::Reply;
use crate::wire::encode_head;
use crate::wire::number;
use own::{DELEX, DELEX_SHA, EXEC, EXEC_SHA, SET_IFEQ, SET_IFEQ_SHA, UNDO, UNDO_SHA};

/// One of the proxy's scripts sent in full and in order (`ScriptCall::in_order`): its
/// source, its number of keys, and the encoding of `EVAL <source> <numkeys>`, made once.
/// The source is most of every acquisition's request; encoding it again for each one cost
/// more than anything else in building the request (BENCHMARKS.md).
pub(crate) struct Ordered {
    body: &'static str,
    numkeys: usize,
    head: OnceLock<Vec<u8>>,
}

impl Ordered {
    pub(crate) const fn new(body: &'static str, numkeys: usize) -> Ordered {
        Ordered {
            body,
            numkeys,
            head: OnceLock::new(),
        }
    }

    fn head(&self) -> &[u8] {
        self.head.get_or_init(|| {
            let numkeys = number(self.numkeys);
            encode_head([&b"EVAL"[..], self.body.as_bytes(), &numkeys].into_iter())
        })
    }
}

/// A script run on one master: usually by SHA1 first, and by source when the master answers
/// `NOSCRIPT` (it restarted, or never saw the script) and the proxy knows the source; a
/// script sent in order (`ScriptCall::in_order`) by source at once, without a fallback.
#[derive(Clone, Debug, PartialEq)]
pub struct ScriptCall {
    /// The request sent: `EVALSHA`, or `EVAL` for a script sent in order.
    first: Request,
    /// The `EVAL` sent instead when the master answers `first` with `NOSCRIPT` (`None`: the
    /// source is unknown, or `first` is already an `EVAL`).
    by_source: Option<Request>,
}

impl ScriptCall {
    /// `EVALSHA sha numkeys keys_and_args...`, falling back to `EVAL body ...` when `body` is known.
    pub fn new(db: u32, sha: Bytes, body: Option<Bytes>, numkeys: usize, keys_and_args: &[Bytes]) -> ScriptCall {
        let request = |name: &'static str, script: Bytes| {
            let mut args = Vec::with_capacity(keys_and_args.len() + 3);
            args.push(Bytes::from_static(name.as_bytes()));
            args.push(script);
            args.push(number(numkeys));
            args.extend_from_slice(keys_and_args);
            Request::new(db, args)
        };
        ScriptCall {
            first: request("EVALSHA", sha),
            by_source: body.map(|b| request("EVAL", b)),
        }
    }

    /// Rule 1's release of `key` if it still holds `token`: a cleanup request, sent also to
    /// masters marked down (see [`Request::cleanup`]).
    pub fn release(db: u32, key: Bytes, token: Bytes) -> ScriptCall {
        let mut call = Self::own(own::RELEASE, &own::RELEASE_SHA, db, 1, &[key, token]);
        call.mark_cleanup();
        call
    }

    /// One of the proxy's scripts that must run exactly where it was sent in the connection's
    /// order: as `EVAL` with its source, never `EVALSHA` with a fallback. An acquisition that
    /// met `NOSCRIPT` (a master that restarted or flushed its scripts) and was re-sent as
    /// `EVAL` after the answer would land behind requests sent meanwhile, such as the holder's
    /// release, and write a lock nobody holds.
    pub(crate) fn in_order<const K: usize>(script: &Ordered, db: u32, keys_and_args: [Bytes; K]) -> ScriptCall {
        // `first` is an `EVAL`: the source where an `EVALSHA` has the SHA1. The arguments are
        // moved, not shared: sharing a freshly made `Bytes` costs an allocation.
        let mut args = Vec::with_capacity(K + 3);
        args.extend([
            Bytes::from_static(b"EVAL"),
            Bytes::from_static(script.body.as_bytes()),
            number(script.numkeys),
        ]);
        args.extend(keys_and_args);
        ScriptCall {
            first: Request::after_head(db, args, script.head(), 3),
            by_source: None,
        }
    }

    /// [`UNDO`]: deletes `key` where it holds `token` and expires at `expiry` (Unix ms on
    /// the master's clock, as the attempt read it there). A cleanup request (see
    /// [`Request::cleanup`]), sent by SHA1: the script is loaded on every connection, and
    /// where a master lost it, the source sent after `NOSCRIPT` is as exact, wherever it
    /// lands in the connection's order.
    pub fn undo(db: u32, key: Bytes, token: Bytes, expiry: i64) -> ScriptCall {
        let mut call = Self::own(UNDO, &UNDO_SHA, db, 1, &[key, token, number(expiry)]);
        call.mark_cleanup();
        call
    }

    /// [`UNDO`] of a write whose expiry is known to lie between `from` and `to` (two clock
    /// readings of the master around it: an acquisition that shared its transaction with
    /// others, `crate::backend::acquire::split`).
    pub fn undo_between(db: u32, key: Bytes, token: Bytes, from: i64, to: i64) -> ScriptCall {
        let mut call = Self::own(UNDO, &UNDO_SHA, db, 1, &[key, token, number(to), number(from)]);
        call.mark_cleanup();
        call
    }

    /// `ScriptCall::in_order` for a script whose number of keys varies per call (several
    /// locks at once): `EVAL body numkeys keys_and_args...`, encoded per call.
    pub(crate) fn eval_in_order(body: &'static str, db: u32, numkeys: usize, keys_and_args: Vec<Bytes>) -> ScriptCall {
        let mut args = Vec::with_capacity(keys_and_args.len() + 3);
        args.extend([
            Bytes::from_static(b"EVAL"),
            Bytes::from_static(body.as_bytes()),
            number(numkeys),
        ]);
        args.extend(keys_and_args);
        ScriptCall {
            first: Request::new(db, args),
            by_source: None,
        }
    }

    /// Marks the call as a read of the server's own data (see [`Request::inspect`]).
    pub(crate) fn inspecting(mut self) -> ScriptCall {
        self.first.inspect = true;
        if let Some(by_source) = &mut self.by_source {
            by_source.inspect = true;
        }
        self
    }

    /// Marks the call as one whose reply carries the master's clock (rule 15, see
    /// [`Request::timed`]).
    pub(crate) fn timed(mut self) -> ScriptCall {
        self.first.timed = true;
        if let Some(by_source) = &mut self.by_source {
            by_source.timed = true;
        }
        self
    }

    /// The call marked as a cleanup request (see [`Request::cleanup`]): a release or an undo,
    /// sent also to masters marked down.
    pub(crate) fn cleanup(mut self) -> ScriptCall {
        self.mark_cleanup();
        self
    }

    /// Marks both forms of the call as cleanup requests.
    pub(crate) fn mark_cleanup(&mut self) {
        self.first.cleanup = true;
        if let Some(by_source) = &mut self.by_source {
            by_source.cleanup = true;
        }
    }

    /// `DELEX key [condition value]`.
    pub fn delex(db: u32, key: Bytes, condition: &'static str, value: Bytes) -> ScriptCall {
        Self::own(
            DELEX,
            &DELEX_SHA,
            db,
            1,
            &[key, Bytes::from_static(condition.as_bytes()), value],
        )
    }

    /// `SET key new IFEQ old PX ttl_ms`.
    pub fn set_ifeq(db: u32, key: Bytes, old: Bytes, new: Bytes, ttl_ms: u64) -> ScriptCall {
        Self::own(
            SET_IFEQ,
            &SET_IFEQ_SHA,
            db,
            1,
            &[key, old, new, Bytes::from(ttl_ms.to_string())],
        )
    }

    /// A transaction: `watched` keys with the value each held at `WATCH` (`None`: absent),
    /// then the queued commands, as one atomic script. The keys the queued commands name
    /// (`queued_keys`) are declared after the watched ones, so that a cluster member runs the
    /// script on their shard; the script reads only the first `ARGV[1]` (the watched count)
    /// of its `KEYS`.
    pub fn exec(
        db: u32,
        watched: &[(Bytes, Option<Bytes>)],
        queued_keys: &[Bytes],
        queued: &[Vec<Bytes>],
    ) -> ScriptCall {
        let mut keys_and_args: Vec<Bytes> = watched.iter().map(|(k, _)| k.clone()).collect();
        keys_and_args.extend(queued_keys.iter().cloned());
        keys_and_args.push(Bytes::from(watched.len().to_string()));
        for (_, value) in watched {
            keys_and_args.push(match value {
                None => Bytes::from_static(b"0"),
                Some(v) => Bytes::from([&b"1"[..], v].concat()),
            });
        }
        for command in queued {
            keys_and_args.push(Bytes::from(command.len().to_string()));
            keys_and_args.extend(command.iter().cloned());
        }
        Self::own(EXEC, &EXEC_SHA, db, watched.len() + queued_keys.len(), &keys_and_args)
    }

    /// One of the proxy's own scripts.
    pub(crate) fn own(
        body: &'static str,
        sha: &LazyLock<Bytes>,
        db: u32,
        numkeys: usize,
        keys_and_args: &[Bytes],
    ) -> ScriptCall {
        let body = Bytes::from_static(body.as_bytes());
        ScriptCall::new(db, (**sha).clone(), Some(body), numkeys, keys_and_args)
    }

    /// The request to send, and the one to send instead on `NOSCRIPT`.
    pub fn parts(&self) -> (&Request, Option<&Request>) {
        (&self.first, self.by_source.as_ref())
    }

    /// Runs the script on one master.
    pub async fn run<B: Backend>(&self, backend: &Arc<B>) -> Result<Reply, BackendError> {
        crate::backend::call(backend, &self.first, self.by_source.as_ref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_sent_in_order_are_encoded_as_their_arguments_say() {
        let key = Bytes::from_static(b"lock:a");
        let token = Bytes::from_static(b"t");
        for _ in 0..2 {
            // Twice: the first call makes the head, the second uses it.
            let calls = [crate::lua::fence::acquire(3, &key, token.clone(), 10_000)];
            for call in calls {
                let plain = Request::new(3, call.first.args.clone());
                assert_eq!(call.first.wire(), plain.wire(), "{:?}", call.first.args);
            }
        }
    }
}
