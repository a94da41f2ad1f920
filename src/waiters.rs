//! Waiting for a lock without retry storms: per-key FIFO queues of `LOCK.ACQUIRE ... WAIT`
//! requests in this proxy.
//!
//! Only the request at the head of a key's queue tries to take the lock, and only when the
//! lock can have become free: a release through this proxy, a release through another proxy
//! (announced on the masters, see `crate::proxy::wait`), or the holder's TTL running out. So
//! one hand-off costs one quorum round, not one per waiter. Fairness is first come, first
//! served within one proxy; across proxies it is best effort (each proxy's head tries when it
//! hears of the release, and the quorum decides).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{Notify, oneshot};

use crate::error::ClientError;
use crate::metrics as m;

/// Every queue of this proxy.
pub struct Waiters {
    inner: Mutex<Inner>,
    max_per_key: usize,
    max_total: usize,
}

#[derive(Default)]
struct Inner {
    queues: HashMap<(u32, Bytes), VecDeque<Arc<Slot>>>,
    total: usize,
    next_id: u64,
}

/// One waiting request: woken whenever its turn may have come or the lock may be free.
struct Slot {
    id: u64,
    wake: Notify,
    /// Its turn came because the request before it got the lock, with this TTL in ms (0:
    /// not so): nothing to try until that one releases it, or its TTL runs out.
    after_grant: AtomicU64,
}

/// A place in a key's queue; leaving it (a grant, the deadline, the client's disconnect: the
/// request's future is dropped) gives the turn to the next.
pub struct Ticket {
    waiters: Arc<Waiters>,
    db: u32,
    key: Bytes,
    slot: Arc<Slot>,
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

    /// Joins the back of `key`'s queue, or refuses when a bound is reached (before any
    /// memory is spent on the request).
    pub fn enqueue(self: &Arc<Self>, db: u32, key: &Bytes) -> Result<Ticket, ClientError> {
        let mut inner = self.lock();
        if inner.total >= self.max_total {
            return Err(ClientError::TooManyWaiters(format!("max_waiters ({})", self.max_total)));
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let queue = inner.queues.entry((db, key.clone())).or_default();
        if queue.len() >= self.max_per_key {
            return Err(ClientError::TooManyWaiters(format!(
                "max_waiters_per_key ({})",
                self.max_per_key
            )));
        }
        let slot = Arc::new(Slot {
            id,
            wake: Notify::new(),
            after_grant: AtomicU64::new(0),
        });
        queue.push_back(slot.clone());
        inner.total += 1;
        metrics::gauge!(m::WAITERS).increment(1.0);
        Ok(Ticket {
            waiters: self.clone(),
            db,
            key: key.clone(),
            slot,
            granted_ttl_ms: 0,
        })
    }

    /// The lock `key` may be free now (released through this proxy or another): its queue's
    /// head tries again.
    pub fn wake(&self, db: u32, key: &Bytes) {
        // Every release comes here: one map lookup (no queue: nothing to do).
        let inner = self.lock();
        if let Some(head) = inner.queues.get(&(db, key.clone())).and_then(VecDeque::front) {
            head.wake.notify_one();
        }
    }

    /// How many requests wait for `key` here.
    pub fn waiting(&self, db: u32, key: &Bytes) -> usize {
        self.lock().queues.get(&(db, key.clone())).map_or(0, VecDeque::len)
    }

    /// Every key with requests waiting here, and how many: for `PROXY LOCKS`.
    pub fn queues(&self) -> Vec<(u32, Bytes, usize)> {
        let inner = self.lock();
        inner
            .queues
            .iter()
            .map(|((db, key), queue)| (*db, key.clone(), queue.len()))
            .collect()
    }
}

impl Ticket {
    /// Whether this request is at the head of its queue: its turn to try.
    pub fn is_head(&self) -> bool {
        let inner = self.waiters.lock();
        inner
            .queues
            .get(&(self.db, self.key.clone()))
            .and_then(VecDeque::front)
            .is_some_and(|head| head.id == self.slot.id)
    }

    /// Resolves when this request is woken: its turn came, or the lock may be free.
    pub async fn woken(&self) {
        self.slot.wake.notified().await;
    }

    /// When this request's turn came because the one before it got the lock: that lock's TTL
    /// (nothing to try before its release or its expiry). Asking clears it.
    pub fn after_grant(&self) -> Option<std::time::Duration> {
        let ms = self.slot.after_grant.swap(0, Ordering::Relaxed);
        (ms > 0).then(|| std::time::Duration::from_millis(ms))
    }

    /// This request got the lock for `ttl`: it leaves the queue, and the next in line waits
    /// for this one's release (or expiry) instead of trying at once: one quorum round per
    /// hand-off.
    pub fn granted(mut self, ttl: std::time::Duration) {
        self.granted_ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = self.waiters.lock();
        let id = (self.db, self.key.clone());
        let Some(queue) = inner.queues.get_mut(&id) else {
            return;
        };
        let was_head = queue.front().is_some_and(|head| head.id == self.slot.id);
        queue.retain(|slot| slot.id != self.slot.id);
        // The next in line tries now: the lock may be free (a grant ends its waiting with the
        // lock held, and the next head then waits for its release as usual).
        if was_head && let Some(next) = queue.front() {
            next.after_grant.store(self.granted_ttl_ms, Ordering::Relaxed);
            next.wake.notify_one();
        }
        if queue.is_empty() {
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
    sleepers: Mutex<HashMap<(u32, Bytes), Line>>,
    next_id: AtomicU64,
}

/// The sleepers on one signal list, longest waiting first: their ids and wake-ups.
type Line = VecDeque<(u64, oneshot::Sender<()>)>;

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

    #[test]
    fn first_come_first_served_and_leaving_passes_the_turn() {
        let w = Arc::new(Waiters::new(10, 100));
        let a = w.enqueue(0, &key("k")).unwrap();
        let b = w.enqueue(0, &key("k")).unwrap();
        let other = w.enqueue(1, &key("k")).unwrap();
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
        let _a = w.enqueue(0, &key("a")).unwrap();
        assert!(matches!(w.enqueue(0, &key("a")), Err(ClientError::TooManyWaiters(_))));
        let _b = w.enqueue(0, &key("b")).unwrap();
        assert!(matches!(w.enqueue(0, &key("c")), Err(ClientError::TooManyWaiters(_))));
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
        let a = w.enqueue(0, &key("k")).unwrap();
        let b = w.enqueue(0, &key("k")).unwrap();
        w.wake(0, &key("k"));
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
