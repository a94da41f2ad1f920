//! Several locks at once (`LOCK.ACQUIREALL`; docs/recipes-quorum.md, "Several locks at
//! once"): a set of keys taken by one script per master that grants every key of the set or
//! none there ([`crate::recipes::multikey::lua::ACQUIRE_ALL`]), decided at a majority like one lock.
//!
//! Each key stays an ordinary fenced lock: a master that granted the set holds each key for
//! the token, as a single acquisition would, so any two grants of a key (by a set or alone)
//! meet on a master that refuses the later one (rule 2). Nothing waits while holding: a master
//! that cannot grant every key grants none, and an attempt not granted is undone (rules 5,
//! 5a), so overlapping sets cannot deadlock.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::backend::Backend;
use crate::clock::Clock;
use crate::lua::ScriptCall;
use crate::quorum::{
    Acquisition, Answer, Attempt, Engine, Fenced, Grant, Lock, NoQuorum, Op, Recoverable, Undo, Unfenced, Vote,
};
use crate::recipes::reentrant::lua;
use crate::reply::Reply;

/// What an acquisition of several locks came to.
#[derive(Clone, Debug, PartialEq)]
pub enum AllFenced {
    /// Every key granted by a quorum within the validity, each with its fencing token.
    Yes {
        /// The tokens, one per key, in the order of the keys given.
        tokens: Vec<u64>,
        /// Rule 4's validity of the whole set, after every write-back (F2).
        validity: Duration,
        /// Takes the whole grant back (rule 4a).
        undo: Undo,
    },
    /// A key of the set is held, or the set was not granted in time; undone.
    No {
        /// When the whole set can be free at the latest, as far as the answers tell.
        free_in: Option<Duration>,
    },
    /// Fewer than a quorum of masters could vote; undone.
    NoQuorum(NoQuorum),
    /// A quorum granted the set, but fewer than a quorum vouched for every key's counter (F3);
    /// undone.
    Unfenced(Unfenced),
}

/// Several locks at once ([`super::lua::ACQUIRE_ALL`]): every key of the set taken by one script per
/// master, or none there; each key fenced by its own counter.
#[derive(Clone, Debug)]
pub(crate) struct All {
    /// The set, sorted (shared with the attempt's undo).
    pub(crate) keys: Arc<Vec<Bytes>>,
}

impl Acquisition for All {
    type Refusal = std::convert::Infallible;

    fn op(&self, db: u32, _first: &Bytes, token: &Bytes, ttl: Duration) -> Op {
        Op::Script(super::lua::acquire_all(db, &self.keys, token.clone(), ttl.as_millis()))
    }

    /// Every key of the set.
    fn keys(&self, _first: &Bytes) -> Vec<Bytes> {
        self.keys.to_vec()
    }

    fn vote(&self, reply: &Reply) -> Option<Vote> {
        match reply {
            Reply::Array(answer) => vote(answer, self.keys.len()),
            Reply::Status(_)
            | Reply::Error(_)
            | Reply::Int(_)
            | Reply::Bulk(_)
            | Reply::Nil
            | Reply::NilArray
            | Reply::Map(_)
            | Reply::Set(_)
            | Reply::Double(_)
            | Reply::Bool(_)
            | Reply::Push(_) => None,
        }
    }

    /// Every key of the set, each where it holds the token and expires as written.
    fn undo(&self, (db, _, token): &Lock, answer: &Answer) -> Option<ScriptCall> {
        let expiry = self.written(answer)?;
        Some(super::lua::undo_all(*db, &self.keys, token.clone(), expiry))
    }
}

/// How one master's answer to [`crate::recipes::multikey::lua::ACQUIRE_ALL`] votes, for a set of `k` keys:
/// a refusal is `{pttl}`; a grant `{'all', expiry, n1, ..., nk}`, trusted (F3) only when
/// every key's counter is (a master that cannot vouch for one of the keys does not vote on
/// the set's tokens). Anything else is no vote (rule 5a: a failure, never a refusal).
pub(crate) fn vote(answer: &[Reply], k: usize) -> Option<Vote> {
    match answer {
        [Reply::Int(_)] => Some(Vote::Refused),
        [Reply::Bulk(tag), Reply::Int(expiry), counters @ ..] if &tag[..] == b"all" && *expiry > 0 => {
            let counters = counters_of(counters, k)?;
            let trusted = counters.iter().all(|n| *n > 0);
            Some(Vote::Granted {
                fence: counters
                    .iter()
                    .copied()
                    .min()
                    .filter(|_| trusted)
                    .and_then(|n| u64::try_from(n).ok()),
                expiry: *expiry,
            })
        }
        _ => None,
    }
}

/// The `k` counters of a grant, or `None` when the answer is malformed.
fn counters_of(counters: &[Reply], k: usize) -> Option<Vec<i64>> {
    if counters.len() != k {
        return None;
    }
    counters
        .iter()
        .map(|n| match n {
            Reply::Int(n) => Some(*n),
            Reply::Status(_)
            | Reply::Error(_)
            | Reply::Bulk(_)
            | Reply::Nil
            | Reply::NilArray
            | Reply::Array(_)
            | Reply::Map(_)
            | Reply::Set(_)
            | Reply::Double(_)
            | Reply::Bool(_)
            | Reply::Push(_) => None,
        })
        .collect()
}

/// The counters of a grant whose every counter is trusted (F3), as F1 counts them.
fn trusted_counters(answer: &Answer, k: usize) -> Option<Vec<u64>> {
    let Ok(Reply::Array(parts)) = answer else {
        return None;
    };
    let [Reply::Bulk(tag), Reply::Int(_), counters @ ..] = parts.as_slice() else {
        return None;
    };
    if &tag[..] != b"all" {
        return None;
    }
    counters_of(counters, k)?
        .into_iter()
        .map(|n| u64::try_from(n).ok().filter(|n| *n > 0))
        .collect()
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// `LOCK.ACQUIREALL`: every key of `keys` (sorted, no two equal) taken for `token`, each
    /// with its own fencing token (F1, F2 per key), or none. As [`Engine::acquire_fenced`],
    /// masters that cannot vouch for their counters are recovered (F4, F5) after a failure,
    /// and it is tried once more.
    pub async fn acquire_all(&self, db: u32, keys: Vec<Bytes>, token: Bytes, ttl: Duration) -> AllFenced {
        let keys = Arc::new(keys);
        let first = keys.first().cloned().unwrap_or_default();
        let (keys, first, token) = (&keys, &first, &token);
        self.recovering(db, move || async move {
            let all = All { keys: keys.clone() };
            match self.take_fenced(all, db, first, token, ttl).await {
                Attempt::Granted(grant) => self.all_granted(db, keys, token, ttl, grant).await,
                Attempt::Refused(never) => match never {},
                Attempt::Failed(fenced) => failed(fenced),
            }
        })
        .await
    }

    /// F2 for each key of a set a quorum granted with trusted counters: each key's token (the
    /// largest of its counters among those grants, F1) once a quorum vouches for it, then the
    /// validity of the whole set (rule 4, counted from `start` of the one attempt); if any
    /// key fails, the whole attempt is undone (rules 5, 5a).
    async fn all_granted(
        &self,
        db: u32,
        keys: &[Bytes],
        token: &Bytes,
        ttl: Duration,
        Grant { start, undo, .. }: Grant,
    ) -> AllFenced {
        let k = keys.len();
        let rows: Vec<Vec<u64>> = undo
            .answers
            .iter()
            .flatten()
            .filter_map(|a| trusted_counters(a, k))
            .collect();
        // Each key's write-back only where its counters disagree; the keys at once.
        let outcomes = futures_util::future::join_all(keys.iter().enumerate().map(|(j, key)| {
            let fences: Vec<u64> = rows.iter().filter_map(|row| row.get(j).copied()).collect();
            async move {
                let call = |fence| crate::lua::fence::write_back(db, key, token.clone(), fence);
                self.write_back(db, &call, ttl, &fences, start).await
            }
        }))
        .await;
        let mut tokens = Vec::with_capacity(k);
        for outcome in outcomes {
            match outcome {
                Fenced::Yes { token, .. } => tokens.push(token),
                refused @ Fenced::No { .. } | refused @ Fenced::NoQuorum(_) | refused @ Fenced::Unfenced(_) => {
                    Box::pin(self.undo(&undo)).await;
                    return match refused {
                        Fenced::NoQuorum(e) => AllFenced::NoQuorum(e),
                        Fenced::Unfenced(e) => AllFenced::Unfenced(e),
                        Fenced::Yes { .. } | Fenced::No { .. } => AllFenced::No { free_in: None },
                    };
                }
            }
        }
        // Rule 4 for the whole set, over every round trip it took.
        match self.validity(ttl, self.clock.now() - start) {
            Some(validity) => AllFenced::Yes { tokens, validity, undo },
            None => {
                Box::pin(self.undo(&undo)).await;
                AllFenced::No { free_in: None }
            }
        }
    }
}

/// The release announcements a set's release carries ([`Engine::give_back_all`]): the masters
/// that publish them (as [`Engine::release_announcing`]), the channel, one message per key.
pub struct SetAnnouncement {
    /// The announcing masters.
    pub on: Vec<usize>,
    /// The channel.
    pub channel: Bytes,
    /// One message per key, in the order of the keys.
    pub messages: Vec<Bytes>,
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// `LOCK.RELEASEALL`'s first round: one hold of `token` given back on each of `keys` by
    /// one script per master for the whole set ([`lua::GIVE_BACK_ALL`]), its announcements, if
    /// any, published by the announcing masters' scripts. Per key, every master's answer
    /// for that key alone, as [`lua::GIVE_BACK`] would have answered it (rules 1, 6: sent to
    /// every master).
    pub async fn give_back_all(
        &self,
        db: u32,
        keys: &[Bytes],
        token: Bytes,
        announced: Option<SetAnnouncement>,
    ) -> Vec<Vec<Answer>> {
        let answers = match announced {
            None => self.release_with(lua::give_back_all(db, keys, token, None)).await,
            Some(a) => {
                let plain = lua::give_back_all(db, keys, token.clone(), None);
                let announcing = lua::give_back_all(db, keys, token, Some((a.channel, a.messages)));
                self.release_announcing(plain, &a.on, announcing).await
            }
        };
        per_key(&answers, keys.len())
    }
}

/// Every master's answer to [`lua::GIVE_BACK_ALL`] split by key: key j's answers are each
/// master's j-th. A master that gave no reply, or an error reply, gives the same to every
/// key; an answer of another shape is an error for every key (never read as a release).
fn per_key(answers: &[Answer], k: usize) -> Vec<Vec<Answer>> {
    (0..k)
        .map(|j| {
            answers
                .iter()
                .map(|answer| match answer {
                    Ok(Reply::Array(parts)) if parts.len() == k => Ok(parts[j].clone()),
                    Ok(error @ Reply::Error(_)) => Ok(error.clone()),
                    Ok(_) => Ok(Reply::error("ERR unexpected answer to a set's release")),
                    Err(e) => Err(e.clone()),
                })
                .collect()
        })
        .collect()
}

/// A refusal for too few trusted counters, as a set's outcome.
/// A set's outcome for the fenced acquisition's failure.
fn failed(fenced: Fenced) -> AllFenced {
    match fenced {
        Fenced::No { free_in } => AllFenced::No { free_in },
        Fenced::NoQuorum(e) => AllFenced::NoQuorum(e),
        Fenced::Unfenced(e) => AllFenced::Unfenced(e),
        Fenced::Yes { .. } => AllFenced::No { free_in: None },
    }
}

impl Recoverable for AllFenced {
    fn unfenced(&self) -> bool {
        matches!(self, AllFenced::Unfenced(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(counters: &[i64]) -> Vec<Reply> {
        let mut parts = vec![Reply::bulk("all"), Reply::Int(1_700_000_000_000)];
        parts.extend(counters.iter().map(|n| Reply::Int(*n)));
        parts
    }

    #[test]
    fn a_grant_votes_with_a_trusted_counter_only_when_every_key_has_one() {
        assert_eq!(
            vote(&grant(&[3, 9]), 2),
            Some(Vote::Granted {
                fence: Some(3),
                expiry: 1_700_000_000_000
            })
        );
        assert_eq!(
            vote(&grant(&[3, 0]), 2),
            Some(Vote::Granted {
                fence: None,
                expiry: 1_700_000_000_000
            })
        );
        assert_eq!(vote(&grant(&[3]), 2), None, "a counter missing: no vote");
        assert_eq!(vote(&[Reply::Int(500)], 2), Some(Vote::Refused));
        assert_eq!(vote(&[Reply::Int(3), Reply::Int(5)], 2), None, "a single lock's grant");
        assert_eq!(trusted_counters(&Ok(Reply::Array(grant(&[3, 9]))), 2), Some(vec![3, 9]));
        assert_eq!(trusted_counters(&Ok(Reply::Array(grant(&[3, -1]))), 2), None);
    }

    #[test]
    fn a_sets_release_is_split_by_key_and_a_strange_answer_is_no_release() {
        let holds = Reply::Array(vec![Reply::bulk("holds"), Reply::bulk("00ff")]);
        let answers = vec![
            Ok(Reply::Array(vec![Reply::Int(1), holds.clone()])),
            Ok(Reply::error("ERR boom")),
            Err(crate::backend::BackendError::Pending),
            Ok(Reply::Int(1)),
        ];
        let split = per_key(&answers, 2);
        assert_eq!(split.len(), 2);
        assert_eq!(split[0][0], Ok(Reply::Int(1)));
        assert_eq!(split[1][0], Ok(holds));
        assert_eq!(split[0][1], Ok(Reply::error("ERR boom")));
        assert_eq!(split[1][2], Err(crate::backend::BackendError::Pending));
        assert!(
            matches!(&split[0][3], Ok(Reply::Error(_))),
            "a bare 1 is not a set's answer"
        );
    }
}
