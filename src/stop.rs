//! The signal that stops one client connection: `CLIENT KILL ID` from another connection, or
//! the proxy shutting down.
//!
//! Why not a `Notify` and a `watch`: a connection's loop polls its stop signal on every turn
//! (a `select!` polls every branch whenever any of them woke it), two or more turns per
//! request. Polling a registered `Notified` takes its waiter list's lock, and a `watch`
//! adds its own `Notified`; together they were about 5% of a `SET NX`'s instructions. A
//! flag and one registered waker cost a load and a compare on each turn.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

/// Raised once; stays raised. Whoever raises it before the connection waits is not lost:
/// the flag is the permit.
#[derive(Default)]
pub struct Stop {
    raised: AtomicBool,
    waker: AtomicWaker,
}

impl Stop {
    /// Stops the connection (it finishes what is in flight, then closes).
    pub fn raise(&self) {
        self.raised.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Resolves once [`Stop::raise`] was called, before or after this was first polled.
    pub fn raised(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| self.poll_raised(cx))
    }

    fn poll_raised(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.raised.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // Raised between the load and the registration: its wake may have found no waker.
        if self.raised.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_raise_before_the_wait_is_kept() {
        let stop = Stop::default();
        stop.raise();
        stop.raised().await;
    }

    #[tokio::test]
    async fn a_raise_wakes_the_waiter() {
        let stop = Arc::new(Stop::default());
        let waiter = tokio::spawn({
            let stop = stop.clone();
            async move { stop.raised().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "nothing raised yet");
        stop.raise();
        let woken = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await;
        assert!(matches!(woken, Ok(Ok(()))), "the waiter ends once raised");
    }

    #[test]
    fn not_raised_is_pending() {
        let stop = Stop::default();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(stop.poll_raised(&mut cx).is_pending());
        stop.raise();
        assert!(stop.poll_raised(&mut cx).is_ready());
    }
}
