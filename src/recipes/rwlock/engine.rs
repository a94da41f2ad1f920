//! A read-write lock's holds on the masters (docs/recipes-quorum.md, "Read-write locks"):
//! taking a read or a write hold, exactly as a fenced lock is taken (rules 1–9, F1–F5), and
//! releasing, extending and undoing one, and reading what the masters hold.
//!
//! Rule 14: a majority bounds pairs. Each master's script refuses a writer while it holds a
//! live reader or writer, and a reader while it holds a live writer: reader–writer and
//! writer–writer pairs conflict, and two majorities share a master that refused the later one.
//! Nothing here counts readers.

use std::time::Duration;

use bytes::Bytes;

use crate::backend::Backend;
use crate::clock::Clock;
use crate::lua::ScriptCall;
use crate::quorum::{
    Acquisition, Answer, Attempt, Engine, Extension, Fenced, Lock, NoQuorum, Op, Recoverable, Vote, fenced_vote,
    quorum_th_largest,
};
use crate::recipes::rwlock::{Hold, Names, lua};
use crate::reply::Reply;

/// A mode of a read-write lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One of any number of readers.
    Read,
    /// The one writer.
    Write,
}

/// What taking a hold came to.
#[derive(Clone, Debug, PartialEq)]
pub enum RwTaken {
    /// As a lock's fenced acquisition comes to: granted with the lock's fencing token, refused
    /// or not valid in time, or undecided (`NoQuorum`, `Unfenced`).
    Lock(Fenced),
    /// Some master holds the lock for this very token already, in this mode: nothing was
    /// written there (no second hold, no upgrade).
    Holds(Mode),
}

/// A read-write lock's reader ([`super::lua::ACQUIRE_READ`]): the key is the reader's
/// hold name ([`crate::recipes::rwlock::Names::reader_hold`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reader;

/// A read-write lock's writer ([`super::lua::ACQUIRE_WRITE`]) on its writer key; a
/// waiting writer refused leaves an intent for `intent_ms` (0: none).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Writer {
    /// How long the intent of a refused writer lives.
    pub(crate) intent_ms: u64,
}

impl Acquisition for Reader {
    /// The mode in which a quorum holds the lock for this very token already.
    type Refusal = Mode;

    fn op(&self, db: u32, key: &Bytes, token: &Bytes, ttl: Duration) -> Op {
        Op::Script(lua::acquire_read(db, key, token.clone(), ttl.as_millis()))
    }

    fn vote(&self, reply: &Reply) -> Option<Vote> {
        rw_vote(reply)
    }

    /// A reader's fencing token is vouched for in the readers' set.
    fn write_back(&self, db: u32, key: &Bytes, token: Bytes, fence: u64) -> crate::lua::ScriptCall {
        lua::write_back_read(db, key, token, fence)
    }

    /// A reader's write is its entry in the readers' set ([`lua::undo_read`]).
    fn undo(&self, (db, key, token): &Lock, answer: &Answer) -> Option<crate::lua::ScriptCall> {
        let expiry = self.written(answer)?;
        Some(lua::undo_read(*db, key, token.clone(), expiry))
    }

    fn refusal(&self, answers: &[Answer], quorum: usize) -> Option<Mode> {
        conflict_of(answers, quorum)
    }
}

impl Acquisition for Writer {
    /// The mode in which a quorum holds the lock for this very token already.
    type Refusal = Mode;

    fn op(&self, db: u32, key: &Bytes, token: &Bytes, ttl: Duration) -> Op {
        Op::Script(lua::acquire_write(
            db,
            key,
            token.clone(),
            ttl.as_millis(),
            self.intent_ms,
        ))
    }

    fn vote(&self, reply: &Reply) -> Option<Vote> {
        rw_vote(reply)
    }

    fn refusal(&self, answers: &[Answer], quorum: usize) -> Option<Mode> {
        conflict_of(answers, quorum)
    }
}

/// A reader's or writer's vote: a conflict of the token's own is a refusal; anything else
/// reads as the fenced acquisition's.
fn rw_vote(reply: &Reply) -> Option<Vote> {
    match reply {
        Reply::Array(answer) if conflict(answer).is_some() => Some(Vote::Refused),
        reply @ Reply::Status(_)
        | reply @ Reply::Error(_)
        | reply @ Reply::Int(_)
        | reply @ Reply::Bulk(_)
        | reply @ Reply::Nil
        | reply @ Reply::NilArray
        | reply @ Reply::Array(_)
        | reply @ Reply::Map(_)
        | reply @ Reply::Set(_)
        | reply @ Reply::Double(_)
        | reply @ Reply::Bool(_)
        | reply @ Reply::Push(_) => fenced_vote(reply),
    }
}

impl Recoverable for RwTaken {
    fn unfenced(&self) -> bool {
        matches!(self, RwTaken::Lock(fenced) if fenced.unfenced())
    }
}

/// Whether a master's answer to a read or write acquisition is a refusal for a conflict of
/// the token's own ([`super::lua::ACQUIRE_READ`]): `{'reads', 0}` or `{'writes', 0}`.
pub(crate) fn conflict(answer: &[Reply]) -> Option<Mode> {
    match answer {
        [Reply::Bulk(what), Reply::Int(_)] => match &what[..] {
            b"reads" => Some(Mode::Read),
            b"writes" => Some(Mode::Write),
            _ => None,
        },
        _ => None,
    }
}

/// The token's own hold that a quorum of masters reported, if any: the token holds the lock.
/// Fewer than a quorum is no hold but a copy an earlier attempt of the same token left on a
/// minority (an undo still on its way, as after a `WAIT`'s try met a paused master): a
/// refusal, never the client's error.
pub(crate) fn conflict_of(answers: &[Answer], quorum: usize) -> Option<Mode> {
    let reported = |mode: Mode| {
        answers
            .iter()
            .filter(|a| matches!(a, Ok(Reply::Array(parts)) if conflict(parts) == Some(mode)))
            .count()
    };
    [Mode::Read, Mode::Write]
        .into_iter()
        .find(|mode| reported(*mode) >= quorum)
}

/// What `RWLOCK.INFO` reports from the masters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RwInfo {
    /// The writer a quorum holds with validity left, if any.
    pub writer: Option<Bytes>,
    /// The readers a quorum holds live with validity left.
    pub readers: Vec<Bytes>,
    /// Writers whose intent some master that answered holds live (each master keeps the latest
    /// waiting writer's).
    pub writers_waiting: usize,
    /// The highest trusted counter among the masters that answered.
    pub last_token: Option<u64>,
}

/// One master's answer to [`super::lua::INFO_RW`].
struct InfoRow {
    writer: Option<(Bytes, i64)>,
    counter: i64,
    readers: Vec<(Bytes, i64)>,
    intents: Vec<Bytes>,
}

impl InfoRow {
    fn read(parts: &[Reply]) -> Option<InfoRow> {
        let [
            writer,
            Reply::Int(pttl),
            Reply::Int(counter),
            Reply::Array(readers),
            Reply::Array(intents),
        ] = parts
        else {
            return None;
        };
        let pairs = |items: &[Reply]| -> Vec<(Bytes, i64)> {
            items
                .chunks(2)
                .filter_map(|pair| match pair {
                    [Reply::Bulk(token), Reply::Int(ms)] => Some((token.clone(), *ms)),
                    _ => None,
                })
                .collect()
        };
        Some(InfoRow {
            writer: match writer {
                Reply::Bulk(token) => Some((token.clone(), *pttl)),
                Reply::Status(_)
                | Reply::Error(_)
                | Reply::Int(_)
                | Reply::Nil
                | Reply::NilArray
                | Reply::Array(_)
                | Reply::Map(_)
                | Reply::Set(_)
                | Reply::Double(_)
                | Reply::Bool(_)
                | Reply::Push(_) => None,
            },
            counter: *counter,
            readers: pairs(readers),
            intents: pairs(intents).into_iter().map(|(token, _)| token).collect(),
        })
    }
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// `LOCK.EXTEND` of whatever `key` names: a read-write lock's hold (a writer's key, a
    /// reader's hold name) extended in the lock's own keys, whichever the token holds (1 where
    /// it was); any other key as a lock ([`Engine::extend_lock`]).
    pub async fn extend_held(&self, db: u32, key: Bytes, token: Bytes, ttl: Duration) -> Extension {
        match crate::recipes::rwlock::split(&key) {
            Some((names, _)) => {
                let call = lua::extend_rw(db, &names, token, ttl);
                self.extend(Op::Script(call), |r| (*r == Reply::Int(1)).then_some(ttl))
                    .await
            }
            None => self.extend_lock(db, key, token, ttl).await,
        }
    }
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// Takes a read (`Mode::Read`) or write hold of the lock `names` for `token`: the fenced
    /// acquisition of a lock (F1–F5, rules 3–5a) whose masters also judge the lock's
    /// conflicts. A waiting writer's `intent` (how long its intent lives, when it is refused)
    /// makes the refusing masters turn new readers away meanwhile. As
    /// [`Engine::acquire_fenced`], masters that cannot vouch for their counters are recovered
    /// (F4, F5) after a failure, and it is tried once more.
    pub async fn acquire_rw(
        &self,
        db: u32,
        names: &Names,
        mode: Mode,
        token: Bytes,
        ttl: Duration,
        intent: Duration,
    ) -> RwTaken {
        let token = &token;
        self.recovering(db, move || async move {
            // A reader's hold has a name of its own (its undo, write-back, keepalive and release
            // find the readers' set and the token from it); a writer's is the writer key.
            let (key, attempt) = match mode {
                Mode::Read => {
                    let key = names.reader_hold(token);
                    let attempt = self.take_fenced(Reader, db, &key, token, ttl).await;
                    (key, attempt)
                }
                Mode::Write => {
                    let intent_ms = u64::try_from(intent.as_millis()).unwrap_or(u64::MAX);
                    let key = names.writer();
                    (
                        key.clone(),
                        self.take_fenced(Writer { intent_ms }, db, &key, token, ttl).await,
                    )
                }
            };
            match attempt {
                Attempt::Granted(grant) => RwTaken::Lock(self.fenced_grant(db, &key, token, ttl, grant).await),
                Attempt::Refused(mode) => RwTaken::Holds(mode),
                Attempt::Failed(fenced) => RwTaken::Lock(fenced),
            }
        })
        .await
    }

    /// Releases whatever hold `token` has of the lock `names` on every master (rules 1, 6):
    /// which hold a quorum released (none: `Ok(None)`), or `NoQuorum` when fewer than a quorum
    /// answered.
    pub async fn release_rw(&self, db: u32, names: &Names, token: Bytes) -> Result<Option<Hold>, NoQuorum> {
        let answers = self
            .broadcast(Op::Script(lua::release_rw_call(db, names, token.clone(), None)))
            .await;
        self.released_hold(&answers, token)
    }

    /// [`Engine::release_rw`], with the masters `on` also publishing `announce` (channel,
    /// message) where the lock is free of writers afterwards: the release carries its own
    /// announcement (one request per master in all), as [`Engine::release_announcing`].
    pub async fn release_rw_announcing(
        &self,
        db: u32,
        names: &Names,
        token: Bytes,
        on: &[usize],
        announce: (Bytes, Bytes),
    ) -> Result<Option<Hold>, NoQuorum> {
        let plain = lua::release_rw_call(db, names, token.clone(), None);
        let announcing = lua::release_rw_call(db, names, token.clone(), Some(announce));
        let answers = self.release_announcing(plain, on, announcing).await;
        self.released_hold(&answers, token)
    }

    /// Which hold of `token` a quorum of `answers` (to [`RELEASE_RW`]) released.
    fn released_hold(&self, answers: &[Answer], token: Bytes) -> Result<Option<Hold>, NoQuorum> {
        let pairs: Vec<(i64, i64)> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Reply::Array(items)) => match items.as_slice() {
                    [Reply::Int(w), Reply::Int(r)] => Some((*w, *r)),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        let q = self.quorum();
        if pairs.len() < q {
            return Err(NoQuorum::of(answers, |r| matches!(r, Reply::Array(_))));
        }
        let released = if pairs.iter().filter(|(w, _)| *w == 1).count() >= q {
            Some(Hold::Writer)
        } else if pairs.iter().filter(|(_, r)| *r == 1).count() >= q {
            Some(Hold::Reader(token))
        } else {
            None
        };
        Ok(released)
    }

    /// Forgets the waiting writer `token`'s intent on every master (it was granted, or gave
    /// up). Nobody waits for it: an intent only ever turns readers away, and expires anyway.
    pub fn forget_intent(&self, db: u32, names: &Names, token: Bytes) {
        let args = [names.intents(), token];
        let op = Op::Script(ScriptCall::own(
            lua::FORGET_INTENT,
            &lua::FORGET_INTENT_SHA,
            db,
            1,
            &args,
        ));
        for i in 0..self.backends.len() {
            self.send_to(i, op.clone());
        }
    }

    /// `RWLOCK.INFO`: the writer and the readers a quorum holds with validity left (rule 4 on
    /// the quorum-th largest time left, from before the request), the writers waiting, and the
    /// highest trusted counter.
    pub async fn rw_info(&self, db: u32, names: &Names) -> Result<RwInfo, NoQuorum> {
        let start = self.clock.now();
        let answers = self.broadcast(Op::Script(lua::info_rw(db, names))).await;
        let rows: Vec<InfoRow> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Reply::Array(parts)) => InfoRow::read(parts),
                _ => None,
            })
            .collect();
        let q = self.quorum();
        if rows.len() < q {
            return Err(NoQuorum::of(&answers, |r| matches!(r, Reply::Array(_))));
        }
        let elapsed = self.clock.now() - start;
        // A holder counts when a quorum of the masters holds it with validity left.
        let valid = |times: Vec<i64>| {
            let times = times.into_iter().filter_map(|ms| u64::try_from(ms).ok()).collect();
            quorum_th_largest(times, q)
                .and_then(|ms| self.validity(Duration::from_millis(ms), elapsed))
                .is_some()
        };
        let writer = rows
            .iter()
            .filter_map(|row| row.writer.as_ref().map(|(token, _)| token))
            .find(|token| {
                valid(
                    rows.iter()
                        .filter_map(|row| row.writer.as_ref().filter(|(t, _)| t == *token).map(|(_, ms)| *ms))
                        .collect(),
                )
            })
            .cloned();
        let mut readers: Vec<Bytes> = rows
            .iter()
            .flat_map(|row| row.readers.iter().map(|(t, _)| t.clone()))
            .collect();
        readers.sort_unstable();
        readers.dedup();
        readers.retain(|token| {
            valid(
                rows.iter()
                    .filter_map(|row| row.readers.iter().find(|(t, _)| t == token).map(|(_, ms)| *ms))
                    .collect(),
            )
        });
        let mut intents: Vec<&Bytes> = rows.iter().flat_map(|row| row.intents.iter()).collect();
        intents.sort_unstable();
        intents.dedup();
        let last_token = rows
            .iter()
            .filter_map(|row| u64::try_from(row.counter).ok())
            .filter(|n| *n > 0)
            .max();
        Ok(RwInfo {
            writer,
            readers,
            writers_waiting: intents.len(),
            last_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::sha1_hex;

    /// F2 for a reader: its token is vouched for where the token is a live reader (the readers'
    /// set), never by the lock's write-back, which would find no key of that name and refuse
    /// every reader whose counters disagree.
    #[test]
    fn a_readers_token_is_vouched_for_in_the_readers_set_a_writers_as_a_locks() {
        let names = Names::of(b"d");
        let token = Bytes::from_static(b"t");
        let sha_of = |call: crate::lua::ScriptCall| call.parts().0.args.get(1).cloned();
        let reader = Reader.write_back(0, &names.reader_hold(&token), token.clone(), 7);
        assert_eq!(sha_of(reader), Some(sha1_hex(lua::WRITE_BACK_READ.as_bytes())));
        let writer = Writer { intent_ms: 0 }.write_back(0, &names.writer(), token, 7);
        assert_eq!(sha_of(writer), Some(sha1_hex(crate::lua::fence::WRITE_BACK.as_bytes())));
    }
}
