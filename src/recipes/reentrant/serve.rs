//! Reentrant locks as the client sees them (`LOCK.ACQUIRE ... REENTRANT`, `LOCK.RELEASE`,
//! `LOCK.INFO`'s `holds`): a hold is an identifier placed on a quorum
//! (`crate::recipes::reentrant::lua`), a release gives one back, and the lock is freed with
//! its last one. The argument is in docs/recipes-quorum.md ("Reentrancy").

use std::time::Duration;

use bytes::Bytes;

use crate::proxy::{Outcome, Proxy};
use crate::quorum::{Extension, LockInfo, NoQuorum};
use crate::recipes::reentrant::engine as reentrant;
use crate::reply::Reply;

impl Proxy {
    /// `LOCK.RELEASE`: one hold of `token` given back. The first round is the release itself
    /// on every master, except that a master keeping extra holds of the token answers them
    /// and releases nothing; when a quorum released, the lock is free (1, and the next turn is
    /// given). Otherwise a second round removes one of the holds reported (rule 14: chosen by
    /// the proxy, by name, never "one less" per master): 1 once a quorum answered that it is
    /// gone. A hold that could not be given back on a quorum is an error that says to count it
    /// as given back: it may be gone from some masters, which must never leave the holder
    /// counting it (docs/recipes-quorum.md).
    pub(crate) async fn release_hold(&self, db: u32, key: Bytes, token: Bytes) -> GivenBack {
        let (released, answers) = self.release_by(db, key.clone(), token.clone()).await;
        if released == Reply::Int(1) {
            return GivenBack {
                reply: released,
                freed: true,
            };
        }
        GivenBack {
            reply: self.second_round(db, &key, token, released, &answers).await,
            freed: false,
        }
    }

    /// A release's second round (see [`Proxy::release_hold`]), after a first round that
    /// released no quorum (`first`, its combined reply, and every master's `answers`): one of
    /// the holds the masters reported removed, or `first` when none reported one.
    pub(crate) async fn second_round(
        &self,
        db: u32,
        key: &Bytes,
        token: Bytes,
        first: Reply,
        answers: &[crate::quorum::Answer],
    ) -> Reply {
        let reports: Vec<Vec<Bytes>> = answers.iter().filter_map(reentrant::reported_holds).collect();
        let Some(hold) = reentrant::chosen_hold(&reports) else {
            return first;
        };
        match self.engine.drop_hold(db, key, token, hold).await {
            Ok(()) => Reply::Int(1),
            Err(e) => Reply::error(format!(
                "NOQUORUM hold not given back on a quorum of masters ({e}): count it as given back; \
                 the lock may stay held until its TTL"
            )),
        }
    }

    /// `LOCK.EXTEND` and a session's keepalive: the lock extended with its holds (a hold
    /// must live as long as its lock: else a release would find none and free the lock while
    /// its holder still holds one). Cluster members run no script across two slots: there
    /// the lock alone, as `SET IFEQ` (a reentrant acquisition is fenced, and fenced
    /// acquisitions are not served by cluster members, so such a lock has no holds).
    pub(crate) async fn extend_native(&self, db: u32, key: Bytes, token: Bytes, ttl: Duration) -> Extension {
        // A read-write lock's hold (a session's writer key or reader's hold name) has no
        // holds: the engine routes it to its own extension.
        let (k, t) = (key.clone(), token.clone());
        let masters = async move {
            if self.clustered || key.starts_with(crate::recipes::rwlock::PREFIX) {
                return self.engine.extend_held(db, key, token, ttl).await;
            }
            self.engine.extend_with_holds(db, key, token, ttl).await
        };
        // A bridged key is extended on the legacy member too (`crate::quorum::Legacy`).
        self.engine.extend_bridged(db, &k, &t, ttl, masters).await
    }

    /// `LOCK.INFO`'s figures: the lock's, and how many holds its holder has (the lock's own
    /// and the extra ones a quorum keeps; 0 when nobody holds it).
    pub(crate) async fn lock_info_with_holds(&self, db: u32, key: &Bytes) -> Result<(LockInfo, usize), NoQuorum> {
        let info = self.engine.lock_info(db, key.clone()).await?;
        let Some(holder) = info.holder.clone() else {
            return Ok((info, 0));
        };
        if self.clustered {
            return Ok((info, 1));
        }
        let read_at = std::time::Instant::now();
        let holds = self.engine.holds(db, key, &holder).await?;
        // Rule 4a: the validity was figured before this second read, which waits for the
        // slowest master: what is left of it now (the reply's figure counts from here on).
        let validity = info.validity.saturating_sub(read_at.elapsed());
        Ok((LockInfo { validity, ..info }, 1 + holds.extra))
    }
}

/// What giving back one hold did.
#[derive(Debug)]
pub struct GivenBack {
    /// 1 when the hold was given back, 0 when the token held none, or why it could not be.
    pub reply: Reply,
    /// It was the last hold: the lock is free on a quorum. Only then does a session lock of
    /// the token on it end as its holder's release (rule 13); one hold of several given back
    /// (another connection's reentry, say) leaves the lock held and its session kept.
    pub freed: bool,
}

impl GivenBack {
    /// The reply as a command's outcome, marked freed when it freed the lock.
    pub fn outcome(self) -> Outcome {
        let outcome = Outcome::plain(self.reply);
        if self.freed { outcome.freed() } else { outcome }
    }
}

/// A count-up whose new hold reached fewer than a quorum of masters in time: told as such
/// (`NOQUORUM`: a waiting request tries again), never as a grant.
pub(crate) fn not_placed(placed: usize, quorum: usize) -> Reply {
    Reply::error(format!(
        "NOQUORUM reentry not counted: the new hold reached {placed} of the {quorum} masters needed in time; \
         the lock is held as before"
    ))
}
