//! The leader election commands, `ELECT.*`: leadership is a session lock on the election's
//! reserved key (`crate::recipes::election::lock_key`) taken by the fenced acquisition, waited for in
//! the lock's queue (`WAIT`), kept alive while the connection is open and released when it
//! ends, exactly as `LOCK.ACQUIRE ... KEEPALIVE` (rules 1–9, 13; F1–F5). The term is the grant's
//! fencing token.
//!
//! Observers are told by this proxy's reader of the election (one per election watched here,
//! `crate::recipes::election::WatchedElection`), which reads the leader from a quorum when it may have changed:
//! - a grant or a release of the election's lock through this proxy (the campaign's grant, a
//!   resignation, a session's end);
//! - the same through another proxy: each proxy announces a change of an election's lock on
//!   every master that is up (`PUBLISH redlock-proxy:leader:<db> <run id> <key>`), besides the
//!   release announcement the waiting queues already hear;
//! - the lease of the leader last read running out (a quorum's copies can have expired): how a
//!   leader whose proxy died, and so announced nothing, is seen gone. Not a poll: one read per
//!   lease of a leader that is kept alive, none while nobody leads.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::command::ElectCmd;
use crate::backend::health::State;
use crate::proxy::wait::Line;
use crate::proxy::{Outcome, Proxy};
use crate::recipes::election::{Reading, Seen, WatchedElection, lock_key};
use crate::reply::Reply;

/// The channel prefix of leader announcements; the database number follows.
pub(crate) const LEADER: &str = "redlock-proxy:leader:";

/// How soon a reader that found no quorum reads again, at the least.
const NO_QUORUM_RETRY: Duration = Duration::from_millis(100);

impl Proxy {
    /// Every `ELECT.*` command but an observation on RESP3 (the connection serves that one:
    /// [`Proxy::watch_election`]). `closed`: the client went away (a campaign or a long poll
    /// stops waiting).
    pub(crate) async fn elect_cmd(
        self: &Arc<Self>,
        db: u32,
        command: ElectCmd,
        closed: watch::Receiver<bool>,
    ) -> Outcome {
        match command {
            ElectCmd::Campaign {
                election,
                value,
                ttl_ms,
                wait_ms,
            } => self.campaign(db, &election, value, ttl_ms, wait_ms, closed).await,
            ElectCmd::Leader { election } => match self.engine.leader(db, lock_key(&election)).await {
                // A read: true when the quorum answered; the term tells a newer from an older.
                Ok(leader) => crate::recipes::election::leader_reply(leader.map(seen).as_ref()).into(),
                Err(e) => Reply::from(e).into(),
            },
            // A release as `LOCK.RELEASE`'s (rules 1, 6): the next campaigner in line is given
            // its turn, here and in every proxy, and observers are told (`released`).
            ElectCmd::Resign { election, value } => self.release_lock(db, lock_key(&election), value).await.outcome(),
            ElectCmd::Observe {
                election,
                after: Some((term, timeout_ms)),
            } => {
                let timeout = Duration::from_millis(timeout_ms);
                self.observe_after(db, &election, term, timeout, closed).await
            }
            ElectCmd::Observe { after: None, .. } => Reply::error(
                "ERR ELECT.OBSERVE pushes changes on RESP3 only (HELLO 3); on RESP2 long-poll with ELECT.OBSERVE election AFTER term TIMEOUT ms",
            )
            .into(),
            // The connection answers it; never observed through here.
            ElectCmd::Unobserve { .. } => Reply::Int(0).into(),
        }
    }

    /// `ELECT.CAMPAIGN`: the fenced acquisition of the election's lock as a session lock,
    /// waiting in its queue for up to `wait_ms`. A grant is announced as a change of leader.
    async fn campaign(
        &self,
        db: u32,
        election: &Bytes,
        value: Bytes,
        ttl_ms: u64,
        wait_ms: Option<u64>,
        closed: watch::Receiver<bool>,
    ) -> Outcome {
        let key = lock_key(election);
        let try_once = || {
            let (key, value) = (key.clone(), value.clone());
            async move {
                let (outcome, free_in) = self.acquire_native(db, key.clone(), value, ttl_ms, (true, false)).await;
                if matches!(outcome.reply, Reply::Int(_)) {
                    self.election_changed(db, &key);
                }
                (outcome, free_in)
            }
        };
        match wait_ms {
            None => Box::pin(try_once()).await.0,
            Some(wait) => {
                let line = Line::Lock {
                    ttl: Duration::from_millis(ttl_ms),
                };
                let wait = Duration::from_millis(wait);
                Box::pin(self.wait_in_line(db, &key, line, wait, closed, try_once)).await
            }
        }
    }

    /// `ELECT.OBSERVE election AFTER term TIMEOUT ms`: the first reading taken after the
    /// request whose term differs from `term` (0: no leader), or, when `timeout` passes first,
    /// the last reading (the leader as last read, which every change makes this proxy read).
    async fn observe_after(
        self: &Arc<Self>,
        db: u32,
        election: &Bytes,
        term: u64,
        timeout: Duration,
        mut closed: watch::Receiver<bool>,
    ) -> Outcome {
        let mut readings = self.watch_election(db, election);
        let after = readings.borrow_and_update().seq;
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or(now + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut last: Option<Reading> = None;
        loop {
            tokio::select! {
                changed = readings.changed() => {
                    if changed.is_err() {
                        return Reply::error("ERR the election's reader ended").into();
                    }
                }
                () = sleep_until(deadline) => break,
                _ = closed.wait_for(|closed| *closed) => return Reply::Nil.into(),
            }
            let reading = readings.borrow_and_update().clone();
            if reading.seq <= after {
                continue;
            }
            match reading.term() {
                // No quorum answered the first reading: said at once, as any read would.
                None if last.is_none() => return reading.reply().into(),
                None => continue,
                Some(now) if now != term => return reading.reply().into(),
                Some(_) => last = Some(reading),
            }
        }
        match last {
            Some(reading) => reading.reply().into(),
            // Not even one reading within the timeout (masters slower than it): the leader
            // read now, as `ELECT.LEADER`.
            None => match self.engine.leader(db, lock_key(election)).await {
                Ok(leader) => crate::recipes::election::leader_reply(leader.map(seen).as_ref()).into(),
                Err(e) => Reply::from(e).into(),
            },
        }
    }

    /// Watches election `election`'s leader: its readings, a new one asked for now; the
    /// election's reader is started when nobody watched it here.
    pub fn watch_election(self: &Arc<Self>, db: u32, election: &Bytes) -> watch::Receiver<Reading> {
        let key = lock_key(election);
        let (readings, new) = self.elections.watch(db, &key);
        if let Some(watched) = new {
            tokio::spawn(read_leader(Arc::downgrade(self), db, key, watched));
        }
        readings
    }

    /// The lock `key` was granted or released through this proxy: if it is an election's,
    /// its observers here are given a new reading, and every other proxy hears of it on every
    /// master that is up (one `PUBLISH` each: a change of leader is rare, and an announcement
    /// lost with one master must not leave other proxies' observers behind until the lease).
    pub(crate) fn election_changed(&self, db: u32, key: &Bytes) {
        if !key.starts_with(crate::recipes::election::PREFIX) {
            return;
        }
        self.elections.changed(db, key);
        if !self.announces {
            return;
        }
        let channel = Bytes::from(format!("{LEADER}{db}"));
        let message = Bytes::from([self.run_id.as_bytes(), key].join(&b' '));
        for (i, backend) in self.engine.backends().iter().enumerate() {
            if backend.state() == State::Up {
                self.publish_on(i, channel.clone(), message.clone());
            }
        }
    }
}

/// The engine's leader as observers see it.
fn seen(leader: crate::recipes::election::Leader) -> Seen {
    Seen {
        value: leader.value,
        term: leader.term,
    }
}

/// The reader of one election watched through this proxy: reads the leader from a quorum at
/// once, then whenever it is asked to (a change here or announced by another proxy) or the
/// lease of the leader it read can have run out; each reading numbered and handed to the
/// observers. Ends when nobody watches the election any more (or the proxy is gone).
async fn read_leader(proxy: Weak<Proxy>, db: u32, key: Bytes, watched: Arc<WatchedElection>) {
    let mut seq = 0;
    loop {
        let Some(p) = proxy.upgrade() else { return };
        let started = Instant::now();
        let (leader, recheck) = match p.engine.leader(db, key.clone()).await {
            Ok(Some(leader)) => {
                // The PTTLs were read after `started`: looking again at `started` plus the
                // quorum's PTTL (and drift) is not too early for a lease that was not extended.
                let recheck = started + leader.recheck_in + Duration::from_millis(2);
                (Ok(Some(seen(leader))), Some(recheck))
            }
            Ok(None) => (Ok(None), None),
            Err(e) => {
                let retry = p.config.backend_timeout().max(NO_QUORUM_RETRY);
                (Err(e.to_string()), Some(Instant::now() + retry))
            }
        };
        drop(p);
        seq += 1;
        watched.readings.send_replace(Reading { seq, leader });
        let recheck = async {
            match recheck {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = watched.wake.notified() => {}
            () = recheck => {}
            () = watched.readings.closed() => {
                let Some(p) = proxy.upgrade() else { return };
                if p.elections.unwatched(db, &key) {
                    return;
                }
            }
        }
    }
}

impl crate::command::Serve<Proxy, futures_util::future::BoxFuture<'static, Outcome>> for ElectCmd {
    /// Serves `ELECT.*`: the command's future, metered as `name` of `kind`
    /// ([`Proxy::execute`] dispatches here, through `Recipe::serve`).
    fn serve(
        self,
        proxy: &Arc<Proxy>,
        db: u32,
        closed: &tokio::sync::watch::Sender<bool>,
        (name, kind): (&'static str, crate::command::LockOp),
    ) -> futures_util::future::BoxFuture<'static, Outcome> {
        let (p, command) = (proxy.clone(), self);
        let closed = closed.subscribe();
        // F5: a campaign is a fenced acquisition.
        let fenced = matches!(command, ElectCmd::Campaign { .. });
        let run = async move { p.elect_cmd(db, command, closed).await };
        if fenced {
            proxy.metered_fenced((name, kind), db, run)
        } else {
            proxy.metered(name, kind, run)
        }
    }
}
