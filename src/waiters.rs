//! Waiting for a lock without retry storms: per-key FIFO queues of `LOCK.ACQUIRE ... WAIT`
//! requests in this proxy, and whose turn it is across proxies.
//!
//! Only the request at the head of a key's queue tries to take the lock, and only when the
//! lock can have become free: a release through this proxy, a release through another proxy
//! (announced on the masters, see `crate::proxy::wait`), or the holder's TTL running out. So
//! one hand-off costs one quorum round, not one per waiter.
//!
//! Across proxies, a release names whose turn it is ([`Turn`]): of this proxy's head and the
//! proxies known to have waiters for the key (they announce it when their head is refused,
//! and with each of their releases), the one whose last turn is oldest. Only that proxy's head
//! tries, so two proxies' heads do not race for one release (a race costs a quorum round
//! more). Fairness is first come, first served within one proxy and turn by turn across
//! proxies; it is best effort: a proxy that is given the turn but no longer has waiters
//! passes it on, and one that went away is passed over once its waiters' deadlines have gone
//! by, or as soon as a request of the proxy that gave it the turn got the lock instead.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::error::ClientError;
use crate::metrics as m;

/// Every queue of this proxy, and what it heard of the other proxies' queues.
pub struct Waiters {
    inner: Mutex<Inner>,
    max_per_key: usize,
    max_total: usize,
}

#[derive(Default)]
struct Inner {
    queues: HashMap<(u32, Bytes), Waitlist>,
    total: usize,
    next_id: u64,
    /// Per key, the other proxies that announced waiters for it.
    elsewhere: HashMap<(u32, Bytes), Elsewhere>,
    /// Entries in `elsewhere`, bounded by `max_total`.
    elsewhere_total: usize,
}

/// One key's queue in this proxy: its waiters, first come first served.
struct Waitlist {
    waiters: VecDeque<Arc<Waiter>>,
    /// When this proxy last had the turn for the key (a grant here, or a turn given to it).
    turn_at: Instant,
}

/// The other proxies with waiters for one key.
#[derive(Default)]
struct Elsewhere {
    proxies: Vec<Remote>,
    /// The proxy this one gave the turn to last, until it is heard from again.
    given_to: Option<Bytes>,
}

/// Another proxy with waiters for a key.
struct Remote {
    proxy: Bytes,
    /// When it last had the turn (or first announced its waiters).
    turn_at: Instant,
    /// When its last waiter's deadline passes, as it announced: forgotten then.
    until: Instant,
}

/// One waiting request: woken whenever its turn may have come or the lock may be free.
struct Waiter {
    id: u64,
    wake: Notify,
    /// Its turn came because the request before it got the lock, with this TTL in ms (0:
    /// not so): nothing to try until that one releases it, or its TTL runs out.
    after_grant: AtomicU64,
    enqueued: Instant,
    deadline: Instant,
}

/// Whose turn it is to try for a lock just released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// The head of this proxy's queue.
    Here,
    /// The head of that proxy's queue (its run id).
    To(Bytes),
    /// Nobody is known to wait: any proxy's head may try.
    Anyone,
}

/// A release announced by another proxy, as it names the next turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// This proxy's turn.
    Me,
    /// Another proxy's turn (its run id).
    Other(&'a [u8]),
    /// Anyone's.
    Anyone,
}

/// A request's entry in a key's queue; leaving it (a grant, the deadline, the client's
/// disconnect: the request's future is dropped) gives the turn to the next.
pub struct Ticket {
    waiters: Arc<Waiters>,
    db: u32,
    key: Bytes,
    waiter: Arc<Waiter>,
    /// This request got the lock, with this TTL in ms (0: it did not).
    granted_ttl_ms: u64,
}

impl Waiters {
    /// Queues bounded by `max_per_key` requests per key and `max_total` in all.
    pub fn new(max_per_key: usize, max_total: usize) -> Waiters {
        Waiters {
            inner: Mutex::new(Inner::default()),
            max_per_key,
            max_total,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves the maps consistent before it can panic.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Joins the back of `key`'s queue until `deadline`, or refuses when a bound is reached
    /// (before any memory is spent on the request).
    pub fn enqueue(self: &Arc<Self>, db: u32, key: &Bytes, deadline: Instant) -> Result<Ticket, ClientError> {
        let mut inner = self.lock();
        if inner.total >= self.max_total {
            return Err(ClientError::TooManyWaiters(format!("max_waiters ({})", self.max_total)));
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let now = Instant::now();
        let queue = inner.queues.entry((db, key.clone())).or_insert_with(|| Waitlist {
            waiters: VecDeque::new(),
            turn_at: now,
        });
        if queue.waiters.len() >= self.max_per_key {
            return Err(ClientError::TooManyWaiters(format!(
                "max_waiters_per_key ({})",
                self.max_per_key
            )));
        }
        let waiter = Arc::new(Waiter {
            id,
            wake: Notify::new(),
            after_grant: AtomicU64::new(0),
            enqueued: now,
            deadline,
        });
        queue.waiters.push_back(waiter.clone());
        inner.total += 1;
        metrics::gauge!(m::WAITERS).increment(1.0);
        Ok(Ticket {
            waiters: self.clone(),
            db,
            key: key.clone(),
            waiter,
            granted_ttl_ms: 0,
        })
    }

    /// Whose turn it is now that `key` was released through this proxy: this proxy's head or
    /// another proxy's, whichever had its last turn longest ago (ties stay here), or anyone's
    /// when nobody is known to wait. Changes nothing: see [`Waiters::give`].
    pub fn choose(&self, db: u32, key: &Bytes) -> Turn {
        let inner = self.lock();
        let id = (db, key.clone());
        let now = Instant::now();
        let here = inner
            .queues
            .get(&id)
            .and_then(|q| Some(q.turn_at.max(q.waiters.front()?.enqueued)));
        let there = inner
            .elsewhere
            .get(&id)
            .into_iter()
            .flat_map(|e| &e.proxies)
            .filter(|r| r.until > now)
            .min_by_key(|r| r.turn_at);
        match (here, there) {
            (Some(here), Some(there)) if there.turn_at < here => Turn::To(there.proxy.clone()),
            (Some(_), _) => Turn::Here,
            (None, Some(there)) => Turn::To(there.proxy.clone()),
            (None, None) => Turn::Anyone,
        }
    }

    /// Gives the turn for `key` (released through this proxy, as [`Waiters::choose`] chose at
    /// `chosen`): wakes the head here, or notes that the other proxy had its turn.
    ///
    /// The release itself carries the announcement that gives another proxy its turn, so
    /// that proxy may take the turn and release, handing it back here, before the release's
    /// answers are in and this runs. When it had a turn since `chosen` (its release, heard
    /// here), that was this turn: it is not noted again. Noted again, it would be dated after
    /// this proxy's next grant and mark that proxy as one that did not take its turn: that
    /// grant would forget it, and this proxy's next head would take the turn that was its.
    pub fn give(&self, db: u32, key: &Bytes, turn: &Turn, chosen: Instant) {
        let mut inner = self.lock();
        let now = Instant::now();
        match turn {
            Turn::Here => {
                if let Some(queue) = inner.queues.get_mut(&(db, key.clone())) {
                    queue.turn_at = now;
                }
                inner.wake_head(db, key);
            }
            Turn::To(proxy) => {
                if let Some(elsewhere) = inner.elsewhere.get_mut(&(db, key.clone()))
                    && !elsewhere.had_turn_since(proxy, chosen)
                {
                    elsewhere.had_turn(proxy, now);
                    elsewhere.given_to = Some(proxy.clone());
                }
            }
            Turn::Anyone => inner.wake_head(db, key),
        }
    }

    /// How much longer requests wait for `key` here (zero: none wait).
    pub fn waiting_for(&self, db: u32, key: &Bytes) -> Duration {
        let inner = self.lock();
        let last = inner
            .queues
            .get(&(db, key.clone()))
            .and_then(|q| q.waiters.iter().map(|w| w.deadline).max());
        last.map_or(Duration::ZERO, |last| last.saturating_duration_since(Instant::now()))
    }

    /// Proxy `from` announced that requests wait for `key` there for up to `waiting`.
    pub fn waiting_elsewhere(&self, db: u32, key: &Bytes, from: &[u8], waiting: Duration) {
        let mut inner = self.lock();
        inner.heard_from(db, key, from, waiting, false, self.max_total);
    }

    /// Proxy `from` released `key` and named the next turn; it still has waiters for up to
    /// `waiting`. Wakes the head here when the turn is this proxy's or anyone's. Returns
    /// `false` when the turn was given to this proxy and nobody waits here any more: the
    /// caller passes it on to anyone.
    pub fn released_elsewhere(&self, db: u32, key: &Bytes, from: &[u8], next: Next<'_>, waiting: Duration) -> bool {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.heard_from(db, key, from, waiting, true, self.max_total);
        let id = (db, key.clone());
        match next {
            Next::Me => match inner.queues.get_mut(&id) {
                Some(queue) => {
                    queue.turn_at = now;
                    inner.wake_head(db, key);
                }
                None => return false,
            },
            Next::Other(proxy) => {
                if let Some(elsewhere) = inner.elsewhere.get_mut(&id) {
                    elsewhere.had_turn(proxy, now);
                }
            }
            Next::Anyone => inner.wake_head(db, key),
        }
        true
    }

    /// How many requests wait for `key` here.
    pub fn waiting(&self, db: u32, key: &Bytes) -> usize {
        self.lock()
            .queues
            .get(&(db, key.clone()))
            .map_or(0, |q| q.waiters.len())
    }

    /// How many other proxies announced requests waiting for `key` (and still wait).
    pub fn proxies_waiting(&self, db: u32, key: &Bytes) -> usize {
        let now = Instant::now();
        let inner = self.lock();
        inner
            .elsewhere
            .get(&(db, key.clone()))
            .map_or(0, |e| e.proxies.iter().filter(|r| r.until > now).count())
    }

    /// Every key with requests waiting here, and how many: for `PROXY LOCKS`.
    pub fn queues(&self) -> Vec<(u32, Bytes, usize)> {
        let inner = self.lock();
        inner
            .queues
            .iter()
            .map(|((db, key), queue)| (*db, key.clone(), queue.waiters.len()))
            .collect()
    }
}

impl Inner {
    /// The lock `key` may be free now: its queue's head here tries again. One map lookup (every
    /// release comes here; no queue: nothing to do).
    fn wake_head(&self, db: u32, key: &Bytes) {
        if let Some(head) = self.queues.get(&(db, key.clone())).and_then(|q| q.waiters.front()) {
            head.wake.notify_one();
        }
    }

    /// Notes what proxy `from` announced for `key`: waiters for up to `waiting` (none when
    /// zero); `released`: it has just had its turn. At most `bound` proxies' queues are
    /// remembered (beyond it, they are heard only through their releases).
    fn heard_from(&mut self, db: u32, key: &Bytes, from: &[u8], waiting: Duration, released: bool, bound: usize) {
        let now = Instant::now();
        let id = (db, key.clone());
        if self.elsewhere_total >= bound {
            self.forget_expired(now);
        }
        let full = self.elsewhere_total >= bound;
        let elsewhere = self.elsewhere.entry(id.clone()).or_default();
        if elsewhere.given_to.as_deref() == Some(from) {
            elsewhere.given_to = None;
        }
        let before = elsewhere.proxies.len();
        elsewhere
            .proxies
            .retain(|r| r.until > now && (r.proxy != from || !waiting.is_zero()));
        match elsewhere.proxies.iter_mut().find(|r| r.proxy == from) {
            Some(remote) => {
                remote.until = now + waiting;
                if released {
                    remote.turn_at = now;
                }
            }
            None if !waiting.is_zero() && !full => elsewhere.proxies.push(Remote {
                proxy: Bytes::copy_from_slice(from),
                turn_at: now,
                until: now + waiting,
            }),
            None => {}
        }
        let after = elsewhere.proxies.len();
        if after == 0 {
            self.elsewhere.remove(&id);
        }
        self.elsewhere_total = self.elsewhere_total + after - before;
    }

    /// Forgets every other proxy whose waiters' deadlines have passed.
    fn forget_expired(&mut self, now: Instant) {
        self.elsewhere.retain(|_, e| {
            e.proxies.retain(|r| r.until > now);
            !e.proxies.is_empty()
        });
        self.elsewhere_total = self.elsewhere.values().map(|e| e.proxies.len()).sum();
    }

    /// A request here got the lock for `key`: this proxy had its turn. A proxy the turn was
    /// given to, and that was not heard from since, did not take it: it is forgotten (it
    /// announces itself again when its head is refused).
    fn granted_here(&mut self, db: u32, key: &Bytes) {
        let id = (db, key.clone());
        if let Some(queue) = self.queues.get_mut(&id) {
            queue.turn_at = Instant::now();
        }
        if let Some(elsewhere) = self.elsewhere.get_mut(&id)
            && let Some(gone) = elsewhere.given_to.take()
        {
            let before = elsewhere.proxies.len();
            elsewhere.proxies.retain(|r| r.proxy != gone);
            self.elsewhere_total -= before - elsewhere.proxies.len();
        }
    }
}

impl Elsewhere {
    /// `proxy` has the turn from `now`.
    fn had_turn(&mut self, proxy: &[u8], now: Instant) {
        if let Some(remote) = self.proxies.iter_mut().find(|r| r.proxy == proxy) {
            remote.turn_at = now;
        }
    }

    /// Whether `proxy` had a turn after `since` (its release was heard, or another proxy's
    /// release gave it the turn).
    fn had_turn_since(&self, proxy: &[u8], since: Instant) -> bool {
        self.proxies.iter().any(|r| r.proxy == proxy && r.turn_at > since)
    }
}

impl Ticket {
    /// Whether this request is at the head of its queue: its turn to try.
    pub fn is_head(&self) -> bool {
        let inner = self.waiters.lock();
        inner
            .queues
            .get(&(self.db, self.key.clone()))
            .and_then(|q| q.waiters.front())
            .is_some_and(|head| head.id == self.waiter.id)
    }

    /// Resolves when this request is woken: its turn came, or the lock may be free.
    pub async fn woken(&self) {
        self.waiter.wake.notified().await;
    }

    /// When this request's turn came because the one before it got the lock: that lock's TTL
    /// (nothing to try before its release or its expiry). Asking clears it.
    pub fn after_grant(&self) -> Option<Duration> {
        let ms = self.waiter.after_grant.swap(0, Ordering::Relaxed);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// This request got the lock for `ttl`: it leaves the queue, and the next in line waits
    /// for this one's release (or expiry) instead of trying at once: one quorum round per
    /// hand-off.
    pub fn granted(mut self, ttl: Duration) {
        self.granted_ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.waiters.lock().granted_here(self.db, &self.key);
    }
}

impl Ticket {
    /// This request got one of a semaphore's permits: it leaves the queue and this proxy had
    /// its turn, but unlike [`Ticket::granted`] the next in line tries at once: another
    /// permit may be free.
    pub fn granted_permit(self) {
        self.waiters.lock().granted_here(self.db, &self.key);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = self.waiters.lock();
        let id = (self.db, self.key.clone());
        let Some(queue) = inner.queues.get_mut(&id) else {
            return;
        };
        let was_head = queue.waiters.front().is_some_and(|head| head.id == self.waiter.id);
        queue.waiters.retain(|waiter| waiter.id != self.waiter.id);
        // The next in line tries now: the lock may be free (a grant ends its waiting with the
        // lock held, and the next head then waits for its release as usual).
        if was_head && let Some(next) = queue.waiters.front() {
            next.after_grant.store(self.granted_ttl_ms, Ordering::Relaxed);
            next.wake.notify_one();
        }
        if queue.waiters.is_empty() {
            inner.queues.remove(&id);
        }
        inner.total -= 1;
        metrics::gauge!(m::WAITERS).decrement(1.0);
    }
}

/// Clients blocked in `BLPOP` on signal lists (python-redis-lock's wake-up signal): each
/// signal wakes the longest-waiting one. A wake-up is never a grant: the woken client takes
/// the lock by the quorum `SET NX` as usual.
#[derive(Default)]
pub struct Signals {
    sleepers: Mutex<HashMap<(u32, Bytes), Sleepers>>,
    next_id: AtomicU64,
}

/// The sleepers on one signal list, longest waiting first: their ids and wake-ups.
type Sleepers = VecDeque<(u64, oneshot::Sender<()>)>;

impl Signals {
    /// Waits for a signal on `key` (of `db`); dropping the future leaves the line.
    pub fn wait(self: &Arc<Self>, db: u32, key: &Bytes) -> Sleeper {
        let (tx, rx) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut sleepers = self.sleepers.lock().unwrap_or_else(|p| p.into_inner());
        sleepers.entry((db, key.clone())).or_default().push_back((id, tx));
        Sleeper {
            signals: self.clone(),
            db,
            key: key.clone(),
            id,
            woken: rx,
        }
    }

    /// A signal on `key`: the longest-waiting sleeper wakes.
    pub fn signal(&self, db: u32, key: &Bytes) {
        let mut sleepers = self.sleepers.lock().unwrap_or_else(|p| p.into_inner());
        let id = (db, key.clone());
        if let Some(line) = sleepers.get_mut(&id) {
            while let Some((_, tx)) = line.pop_front() {
                if tx.send(()).is_ok() {
                    break;
                }
            }
            if line.is_empty() {
                sleepers.remove(&id);
            }
        }
    }
}

/// One client blocked on a signal list.
pub struct Sleeper {
    signals: Arc<Signals>,
    db: u32,
    key: Bytes,
    id: u64,
    /// Resolves when a signal woke this sleeper.
    pub woken: oneshot::Receiver<()>,
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let mut sleepers = self.signals.sleepers.lock().unwrap_or_else(|p| p.into_inner());
        let id = (self.db, self.key.clone());
        if let Some(line) = sleepers.get_mut(&id) {
            line.retain(|(i, _)| *i != self.id);
            if line.is_empty() {
                sleepers.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    async fn tick() {
        tokio::time::advance(Duration::from_millis(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_turn_goes_to_whoever_had_it_longest_ago() {
        let w = Arc::new(Waiters::new(10, 100));
        let k = key("k");
        assert_eq!(w.choose(0, &k), Turn::Anyone, "nobody waits");
        let _a = w.enqueue(0, &k, later()).unwrap();
        tick().await;
        w.waiting_elsewhere(0, &k, b"p2", Duration::from_secs(10));
        assert_eq!(w.choose(0, &k), Turn::Here, "this proxy's head waited first");
        tick().await;
        w.give(0, &k, &Turn::Here, Instant::now());
        tick().await;
        assert_eq!(w.choose(0, &k), Turn::To(key("p2")), "then the other proxy's turn");
        w.give(0, &k, &Turn::To(key("p2")), Instant::now());
        tick().await;
        assert_eq!(w.choose(0, &k), Turn::Here, "and back: turn by turn");
        // A release by p2 that says it has nobody waiting any more forgets it.
        assert!(w.released_elsewhere(0, &k, b"p2", Next::Me, Duration::ZERO));
        w.give(0, &k, &Turn::Here, Instant::now());
        tick().await;
        assert_eq!(w.choose(0, &k), Turn::Here);
    }

    #[tokio::test(start_paused = true)]
    async fn other_proxies_are_forgotten_when_their_waiters_deadlines_pass() {
        let w = Arc::new(Waiters::new(10, 100));
        let k = key("k");
        w.waiting_elsewhere(0, &k, b"p2", Duration::from_millis(10));
        assert_eq!(w.choose(0, &k), Turn::To(key("p2")));
        tokio::time::advance(Duration::from_millis(11)).await;
        assert_eq!(w.choose(0, &k), Turn::Anyone);
    }

    #[tokio::test(start_paused = true)]
    async fn a_proxy_that_did_not_take_its_turn_is_passed_over() {
        let w = Arc::new(Waiters::new(10, 100));
        let k = key("k");
        w.waiting_elsewhere(0, &k, b"p2", Duration::from_secs(10));
        let a = w.enqueue(0, &k, later()).unwrap();
        let _b = w.enqueue(0, &k, later()).unwrap();
        tick().await;
        w.give(0, &k, &Turn::To(key("p2")), Instant::now());
        // p2 never took it (it went away): the head here got the lock when its wait for the
        // holder's TTL ran out. p2 does not get the next turn.
        a.granted(Duration::from_secs(1));
        tick().await;
        assert_eq!(w.choose(0, &k), Turn::Here);
    }

    /// The release that gives p2 the turn carries its announcement on the masters: p2 can
    /// take the turn and hand it back (its release heard here) before the release's answers
    /// are in here. The turn given late is not p2's next one: p2 keeps its place, and its
    /// turn comes after the next grant here.
    #[tokio::test(start_paused = true)]
    async fn a_turn_taken_before_it_is_noted_is_not_noted_again() {
        let w = Arc::new(Waiters::new(10, 100));
        let k = key("k");
        let a1 = w.enqueue(0, &k, later()).unwrap();
        let a2 = w.enqueue(0, &k, later()).unwrap();
        let _a3 = w.enqueue(0, &k, later()).unwrap();
        tick().await;
        w.waiting_elsewhere(0, &k, b"p2", Duration::from_secs(10));
        tick().await;
        a1.granted(Duration::from_secs(1));
        tick().await;
        // a1 releases: p2's turn, chosen before the release is sent.
        let chosen = Instant::now();
        assert_eq!(w.choose(0, &k), Turn::To(key("p2")));
        tick().await;
        // The release is on the masters: p2's head took the lock and released it, giving the
        // turn back here, before the release's answers came back.
        assert!(w.released_elsewhere(0, &k, b"p2", Next::Me, Duration::from_secs(10)));
        tick().await;
        w.give(0, &k, &Turn::To(key("p2")), chosen);
        tick().await;
        a2.granted(Duration::from_secs(1));
        tick().await;
        assert_eq!(
            w.choose(0, &k),
            Turn::To(key("p2")),
            "a2's release: p2's turn, not a3's"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_given_here_with_nobody_waiting_is_passed_on() {
        let w = Arc::new(Waiters::new(10, 100));
        let k = key("k");
        assert!(!w.released_elsewhere(0, &k, b"p2", Next::Me, Duration::ZERO));
        let a = w.enqueue(0, &k, later()).unwrap();
        assert!(w.released_elsewhere(0, &k, b"p2", Next::Me, Duration::ZERO));
        tokio::time::timeout(Duration::from_millis(100), a.woken())
            .await
            .expect("the head is woken for its turn");
        w.released_elsewhere(0, &k, b"p2", Next::Other(b"p3"), Duration::ZERO);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), a.woken())
                .await
                .is_err(),
            "another proxy's turn does not wake the head here"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn other_proxies_remembered_are_bounded() {
        let w = Arc::new(Waiters::new(10, 2));
        for p in ["p1", "p2", "p3"] {
            w.waiting_elsewhere(0, &key(p), p.as_bytes(), Duration::from_secs(10));
        }
        assert_eq!(w.choose(0, &key("p3")), Turn::Anyone, "the third is not remembered");
        tokio::time::advance(Duration::from_secs(11)).await;
        w.waiting_elsewhere(0, &key("p3"), b"p3", Duration::from_secs(10));
        assert_eq!(w.choose(0, &key("p3")), Turn::To(key("p3")), "expired ones make room");
    }

    #[test]
    fn first_come_first_served_and_leaving_passes_the_turn() {
        let w = Arc::new(Waiters::new(10, 100));
        let a = w.enqueue(0, &key("k"), later()).unwrap();
        let b = w.enqueue(0, &key("k"), later()).unwrap();
        let other = w.enqueue(1, &key("k"), later()).unwrap();
        assert!(
            a.is_head() && !b.is_head() && other.is_head(),
            "queues are per database and key"
        );
        assert_eq!(w.waiting(0, &key("k")), 2);
        drop(a);
        assert!(b.is_head());
        drop(b);
        assert_eq!(w.waiting(0, &key("k")), 0);
        drop(other);
        assert!(w.queues().is_empty());
    }

    #[test]
    fn bounds_refuse_before_queueing() {
        let w = Arc::new(Waiters::new(1, 2));
        let _a = w.enqueue(0, &key("a"), later()).unwrap();
        assert!(matches!(
            w.enqueue(0, &key("a"), later()),
            Err(ClientError::TooManyWaiters(_))
        ));
        let _b = w.enqueue(0, &key("b"), later()).unwrap();
        assert!(matches!(
            w.enqueue(0, &key("c"), later()),
            Err(ClientError::TooManyWaiters(_))
        ));
    }

    #[tokio::test]
    async fn a_signal_wakes_the_longest_waiting_sleeper() {
        let s = Arc::new(Signals::default());
        let first = s.wait(0, &key("sig"));
        let second = s.wait(0, &key("sig"));
        s.signal(0, &key("sig"));
        let mut first = first;
        (&mut first.woken).await.expect("the first is woken");
        drop(second);
        s.signal(0, &key("sig"));
        assert!(s.sleepers.lock().unwrap().is_empty(), "a sleeper that left is gone");
    }

    #[tokio::test]
    async fn a_wake_reaches_the_head_only() {
        let w = Arc::new(Waiters::new(10, 100));
        let a = w.enqueue(0, &key("k"), later()).unwrap();
        let b = w.enqueue(0, &key("k"), later()).unwrap();
        w.give(0, &key("k"), &Turn::Anyone, Instant::now());
        tokio::time::timeout(std::time::Duration::from_millis(100), a.woken())
            .await
            .expect("the head is woken");
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), b.woken())
                .await
                .is_err(),
            "the second waits for its turn"
        );
    }
}
