//! `LOCK.ACQUIRE ... WAIT ms`: waiting in this proxy's per-key FIFO queue
//! ([`crate::waiters`]), and the release announcements that wake waiters in every proxy.
//!
//! A waiting request tries to take the lock only at the head of its queue and only when the
//! lock can have become free:
//! - a release through this proxy (`LOCK.RELEASE`, `DEL`/`UNLINK`, `DELEX`, a script whose
//!   declared keys are gone from a quorum afterwards, the end of a session lock) wakes the
//!   head here at once;
//! - the same releases are announced on a master that is up (`PUBLISH
//!   redlock-proxy:released:<db> <proxy run id> <key>`, one master per release, in turn), and every proxy
//!   listens on every master (`PSUBSCRIBE`), so a release through another proxy wakes this
//!   one's head too; a client's own release script is covered the same way, since it runs
//!   through a proxy;
//! - the holder's TTL running out: a refusal tells, in the same round trip, how long each
//!   master still holds the lock (the acquisition script answers `{pttl}` when the key is
//!   held); the head tries again once a quorum's copies can have expired.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::backend::health::State;
use crate::backend::{AnyBackend, Request};
use crate::command::LockCmd;
use crate::metrics as m;
use crate::quorum::Op;
use crate::reply::Reply;

use super::{Outcome, Proxy, request};

/// The channel prefix of release announcements; the database number follows.
const RELEASED: &str = "redlock-proxy:released:";

/// The channel prefix of signal announcements (a script pushed to a list); the database
/// number follows.
const SIGNALLED: &str = "redlock-proxy:signalled:";

impl Proxy {
    /// `LOCK.ACQUIRE key token ttl_ms WAIT ms [KEEPALIVE]`: the token as soon as this request
    /// gets the lock, nil when `wait` has passed first (or the client went away: `closed`).
    pub async fn acquire_waiting(
        &self,
        db: u32,
        acquire: LockCmd,
        wait: Duration,
        mut closed: watch::Receiver<bool>,
    ) -> Outcome {
        let LockCmd::Acquire {
            key,
            token,
            ttl_ms,
            keepalive,
            ..
        } = acquire
        else {
            return Reply::error("ERR internal: only LOCK.ACQUIRE waits").into();
        };
        let ttl = Duration::from_millis(ttl_ms);
        let started = Instant::now();
        let deadline = started + wait;
        let ticket = match self.waiters.enqueue(db, &key) {
            Ok(ticket) => ticket,
            Err(e) => return Reply::from(e).into(),
        };
        // The head tries at once; the others when their turn comes.
        let mut waited = false;
        // The service could not decide (`-NOQUORUM`): tried again after a backend timeout, and
        // answered if it still cannot at the deadline (a wait does not hide an outage).
        let mut unavailable: Option<Outcome> = None;
        loop {
            let mut retry_at = deadline;
            let head = ticket.is_head();
            if let Some(ttl) = ticket.after_grant().filter(|_| head) {
                // The request before this one just got the lock for `ttl`: wait for its
                // release, or for that TTL to run out (no command to the masters).
                retry_at = (Instant::now() + ttl).min(deadline);
            } else if head {
                let (outcome, free_in) = self
                    .acquire_native(db, key.clone(), token.clone(), ttl_ms, keepalive)
                    .await;
                match &outcome.reply {
                    Reply::Int(_) => {
                        metrics::histogram!(m::WAIT_SECONDS).record(started.elapsed().as_secs_f64());
                        if waited {
                            metrics::counter!(m::HANDOFFS).increment(1);
                        }
                        ticket.granted(ttl);
                        return outcome;
                    }
                    Reply::Nil => {
                        unavailable = None;
                        // The refusal told how long a quorum still holds the lock; when it
                        // could not (masters without an answer), the lock's TTL is read.
                        let free_at = match free_in {
                            Some(free_in) => Instant::now() + free_in,
                            None => self.held_until(db, &key).await,
                        };
                        retry_at = free_at.min(deadline);
                    }
                    reply if reply.is_error_code("NOQUORUM") => {
                        retry_at = (Instant::now() + self.config.backend_timeout()).min(deadline);
                        unavailable = Some(outcome);
                    }
                    // Any other answer (a bad TTL, an internal error) is final.
                    _ => return outcome,
                }
            }
            if Instant::now() >= deadline {
                return unavailable.unwrap_or_else(|| Reply::Nil.into());
            }
            tokio::select! {
                () = ticket.woken() => {}
                () = sleep_until(retry_at) => {}
                _ = closed.wait_for(|closed| *closed) => return Reply::Nil.into(),
            }
            waited = true;
        }
    }

    /// When the lock `key`, just refused, can be free at the latest, read from the masters
    /// (when the refusal could not tell): when the TTL a quorum still guarantees its holder
    /// has passed. A key gone from a quorum already is tried again after one backend timeout.
    async fn held_until(&self, db: u32, key: &Bytes) -> Instant {
        let pttl = self.engine.execute(Op::Command(request(db, [&b"PTTL"[..], key]))).await;
        let now = Instant::now();
        match pttl {
            Reply::Int(ms) if ms > 0 => now + Duration::from_millis(ms.unsigned_abs()),
            Reply::Int(-1) => now + Duration::from_millis(self.config.max_ttl_ms),
            _ => now + self.config.backend_timeout(),
        }
    }

    /// The lock `key` was released through this proxy: the head of its queue here tries
    /// again now, and every other proxy hears of it through the masters.
    pub fn announce_release(&self, db: u32, key: &Bytes) {
        self.waiters.wake(db, key);
        self.signals.signal(db, key);
        self.announce(RELEASED, db, key);
    }

    /// A script pushed to `key` through this proxy (a wake-up signal list): a client blocked
    /// in `BLPOP` on it wakes, here and in every other proxy.
    pub fn announce_signal(&self, db: u32, key: &Bytes) {
        self.signals.signal(db, key);
        self.announce(SIGNALLED, db, key);
    }

    /// Tells the other proxies, through one master, of `kind` (a channel prefix) for `key`.
    fn announce(&self, kind: &str, db: u32, key: &Bytes) {
        if !self.announces {
            return;
        }
        // The payload names this proxy, which has woken its own waiters already.
        let mut payload = Vec::with_capacity(self.run_id.len() + 1 + key.len());
        payload.extend_from_slice(self.run_id.as_bytes());
        payload.push(b' ');
        payload.extend_from_slice(key);
        let publish = Request::new(
            db,
            vec![
                Bytes::from_static(b"PUBLISH"),
                Bytes::from(format!("{kind}{db}")),
                Bytes::from(payload),
            ],
        );
        // Every proxy listens on every master, so one master that is up carries the news:
        // one command per release, taken from the masters in turn. Should it be lost, the
        // waiters elsewhere still wake when the holder's TTL runs out.
        let backends = self.engine.backends();
        let first = self.announcements.fetch_add(1, Ordering::Relaxed);
        let up = (0..backends.len())
            .map(|i| (first + i) % backends.len())
            .find(|&i| backends[i].state() == State::Up);
        if let Some(i) = up {
            self.engine.send_to(i, Op::Command(publish));
        }
    }

    /// Listens on every real master for release announcements (of this proxy and the
    /// others) and wakes the heads of the queues they name.
    pub(super) fn listen_for_releases(self: &Arc<Self>) {
        for backend in self.engine.backends() {
            let AnyBackend::Redis(redis) = &**backend else {
                continue;
            };
            let target = redis.subscription_target();
            let (alive, wake) = (Arc::downgrade(self), Arc::downgrade(self));
            tokio::spawn(crate::backend::subscriber::run(
                target,
                "redlock-proxy:*",
                move || alive.strong_count() > 0,
                move |channel, key| on_release(&wake, channel, &key),
            ));
        }
    }
}

/// One announcement: `channel` is `redlock-proxy:released:<db>` or
/// `redlock-proxy:signalled:<db>`, the payload `<run id of the announcing proxy> <key>`. A
/// proxy's own announcements are ignored: it woke its waiters when it made them (a second
/// wake would send its next head to try for a lock just handed on).
fn on_release(proxy: &Weak<Proxy>, channel: &[u8], payload: &Bytes) {
    let db_of = |prefix: &str| {
        channel
            .strip_prefix(prefix.as_bytes())
            .and_then(|db| std::str::from_utf8(db).ok())
            .and_then(|db| db.parse::<u32>().ok())
    };
    let Some(proxy) = proxy.upgrade() else { return };
    let Some(space) = payload.iter().position(|&b| b == b' ') else {
        return;
    };
    if &payload[..space] == proxy.run_id.as_bytes() {
        return;
    }
    let key = &payload.slice(space + 1..);
    if let Some(db) = db_of(RELEASED) {
        proxy.waiters.wake(db, key);
        proxy.signals.signal(db, key);
    } else if let Some(db) = db_of(SIGNALLED) {
        proxy.signals.signal(db, key);
    }
}

impl Proxy {
    /// `BLPOP key [key ...] timeout`, for libraries that wait on a signal list their release
    /// script fills (python-redis-lock): a signal already on a master answers at once;
    /// otherwise the client sleeps until a script pushes to one of the keys through any proxy
    /// (or a lock of that name is released), or the timeout. The answer is `[key, value]` or
    /// nil, as Redis's; it is a wake-up, never a grant: the client then takes the lock with the
    /// quorum `SET NX` as usual.
    pub(super) async fn blpop(
        &self,
        db: u32,
        keys: Vec<Bytes>,
        timeout: Option<Duration>,
        mut closed: watch::Receiver<bool>,
    ) -> Outcome {
        let sleepers: Vec<_> = keys.iter().map(|key| self.signals.wait(db, key)).collect();
        for key in &keys {
            let popped = self
                .engine
                .broadcast(Op::Command(request(db, [&b"LPOP"[..], key])))
                .await;
            if let Some(value) = popped.into_iter().find_map(|a| match a {
                Ok(Reply::Bulk(v)) => Some(v),
                _ => None,
            }) {
                return Reply::Array(vec![Reply::Bulk(key.clone()), Reply::Bulk(value)]).into();
            }
        }
        let woken = futures_util::future::select_all(
            sleepers
                .into_iter()
                .enumerate()
                .map(|(i, mut s)| Box::pin(async move { (&mut s.woken).await.map(|()| i) })),
        );
        let deadline = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            (Ok(i), _, _) = woken => {
                let key = keys.get(i).cloned().unwrap_or_default();
                Reply::Array(vec![Reply::Bulk(key), Reply::bulk("1")]).into()
            }
            () = deadline => Reply::NilArray.into(),
            _ = closed.wait_for(|closed| *closed) => Reply::NilArray.into(),
        }
    }
}
