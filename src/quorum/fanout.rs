//! One request's fan-out: the record every master's answer lands in.
//!
//! The engine starts a request on its masters with one [`FanOut`]; each master's backend
//! completes its [`Place`] from wherever the reply is decoded. The record keeps the answers in
//! arrival order and wakes the waiting client only when enough of them are in for the engine
//! to decide (no outcome is possible with fewer than a quorum of answers), or at the fan-out's
//! one deadline (rule 3), where every master still silent counts as timed out. Answers that
//! arrive after the engine decided are still recorded (latency, late replies) and passed to
//! the engine's hook for them (fencing's repair requests), without anyone waiting.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use smallvec::SmallVec;
use tokio::time::{Instant, Sleep};

use super::Answer;
use super::observed::Observed;
use crate::backend::{BackendError, Place, Sink};

/// What to do with each answer as it lands, whoever waits (fencing's repair requests).
pub type OnAnswer = Box<dyn Fn(&Answer) + Send + Sync>;

/// Where the answers go once the engine stopped reading them ([`FanOut::hand_over`]): master
/// index and answer, in time or after the deadline.
pub type Late = Box<dyn Fn(usize, Answer) + Send + Sync>;

/// The shared record of one fan-out.
pub struct FanOut {
    state: Mutex<State>,
    /// When the requests went out: latencies are measured from here (tokio's clock, so
    /// simulated under simulation).
    start: Instant,
    /// Rule 3: every master has until here, then counts as timed out.
    deadline: Instant,
    /// Each master's statistics, in configuration order.
    observed: Arc<[Arc<Observed>]>,
    on_answer: Option<OnAnswer>,
}

/// How many masters' places a record keeps inline, in its own allocation: Redlock
/// deployments have 3, 5 or 7 masters. More are kept on the heap.
const INLINE: usize = 8;

#[derive(Default)]
struct State {
    /// Which masters' answers are in (or timed out), by index.
    answered: SmallVec<[bool; INLINE]>,
    /// How many are in, including the masters not asked.
    count: usize,
    /// Masters not asked (not targets of this fan-out): in from the start, never answering.
    skipped: usize,
    /// Answers in, not yet read by the engine, in arrival order (at most one per master).
    inbox: SmallVec<[(usize, Answer); INLINE]>,
    /// How many answers must be in before the waiting engine is woken.
    wake_at: usize,
    waker: Option<Waker>,
    /// Past the deadline: the masters still silent timed out, later answers are late.
    expired: bool,
    /// Takes every answer from now on, instead of the inbox ([`FanOut::hand_over`]).
    late: Option<Arc<Late>>,
}

impl State {
    fn all_in(&self) -> bool {
        self.count == self.answered.len()
    }
}

impl FanOut {
    /// A record for `n` masters, started now and lasting until `deadline`.
    pub fn new(n: usize, deadline: Instant, observed: Arc<[Arc<Observed>]>, on_answer: Option<OnAnswer>) -> FanOut {
        FanOut {
            state: Mutex::new(State {
                answered: SmallVec::from_elem(false, n),
                inbox: SmallVec::with_capacity(n),
                ..State::default()
            }),
            start: Instant::now(),
            deadline,
            observed,
            on_answer,
        }
    }

    /// The place of master `index` in `fan_out`.
    pub fn place(fan_out: &Arc<FanOut>, index: usize) -> Place {
        Place::new(fan_out.clone(), index)
    }

    /// Rule 3's deadline shared by every master of this fan-out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Marks master `index` as not asked (it has no place to wait for).
    pub fn skip(&self, index: usize) {
        let mut state = self.state();
        if let Some(answered) = state.answered.get_mut(index).filter(|a| !**a) {
            *answered = true;
            state.count += 1;
            state.skipped += 1;
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a store or a read of plain values: nothing to poison.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next answer in arrival order, waiting for it only once at least `at_least` of the
    /// asked masters have answered (the caller cannot decide with fewer), or until the deadline: `None` when every
    /// answer has been read. `deadline` is the timer for [`FanOut::deadline`], made once by
    /// the caller and polled only while it waits.
    pub async fn next(&self, at_least: usize, mut deadline: Pin<&mut Sleep>) -> Option<(usize, Answer)> {
        poll_fn(|cx| self.poll_next(cx, at_least, deadline.as_mut())).await
    }

    /// Hands every answer not read yet, and every one still to come (in time, or after the
    /// deadline when a silent master answers at last), to `late`: an undo, for the writes
    /// the engine learns of only then (rule 5a). Nothing reads the record afterwards.
    pub fn hand_over(&self, late: Late) {
        let late = Arc::new(late);
        let unread = {
            let mut state = self.state();
            state.late = Some(late.clone());
            std::mem::take(&mut state.inbox)
        };
        for (index, answer) in unread {
            late(index, answer);
        }
    }

    fn poll_next(
        &self,
        cx: &mut Context<'_>,
        at_least: usize,
        deadline: Pin<&mut Sleep>,
    ) -> Poll<Option<(usize, Answer)>> {
        let mut state = self.state();
        let at_least = at_least + state.skipped;
        let ready = !state.inbox.is_empty() && state.count >= at_least;
        if !ready && !state.all_in() {
            if deadline.poll(cx).is_pending() {
                state.wake_at = at_least.max(state.count + 1);
                state.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            self.expire(&mut state);
        }
        Poll::Ready((!state.inbox.is_empty()).then(|| state.inbox.remove(0)))
    }

    /// Rule 3: past the deadline, every master still silent has timed out.
    fn expire(&self, state: &mut State) {
        state.expired = true;
        let took = self.start.elapsed();
        for index in 0..state.answered.len() {
            if !state.answered[index] {
                let answer = Err(BackendError::Timeout);
                self.record(index, &answer, took);
                state.answered[index] = true;
                state.count += 1;
                state.inbox.push((index, answer));
            }
        }
    }

    fn record(&self, index: usize, answer: &Answer, took: std::time::Duration) {
        if let Some(observed) = self.observed.get(index) {
            observed.record(answer, took);
        }
        if let Some(on_answer) = &self.on_answer {
            on_answer(answer);
        }
    }
}

impl Sink for FanOut {
    fn complete(&self, index: usize, answer: Answer) {
        let took = self.start.elapsed();
        let mut state = self.state();
        if state.answered.get(index) != Some(&false) {
            // Late (already counted as timed out), or not a place of this fan-out. An answer
            // that comes at last still goes where the engine handed the rest over: a write
            // the engine learns of only now is undone all the same (rule 5a).
            let late = state.late.clone().filter(|_| state.answered.get(index).is_some());
            drop(state);
            if let Some(late) = late {
                late(index, answer);
            }
            return;
        }
        // An answer after the deadline that nobody waited out (the engine had decided) is
        // recorded as what it would have been for a waiting engine: a timeout.
        let late = Err(BackendError::Timeout);
        let recorded = if self.start + took >= self.deadline {
            &late
        } else {
            &answer
        };
        self.record(index, recorded, took);
        state.answered[index] = true;
        state.count += 1;
        if let Some(late) = state.late.clone() {
            drop(state);
            late(index, answer);
            return;
        }
        state.inbox.push((index, answer));
        let wake = state.count >= state.wake_at || state.all_in();
        let waker = if wake { state.waker.take() } else { None };
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn is_open(&self, index: usize) -> bool {
        let state = self.state();
        !state.expired && Instant::now() < self.deadline && state.answered.get(index) == Some(&false)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::Duration;

    use super::*;
    use crate::reply::Reply;

    /// Counts how often the waiting task is woken.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn record(n: usize, timeout: Duration) -> Arc<FanOut> {
        let observed: Arc<[Arc<Observed>]> = (0..n).map(|i| Arc::new(Observed::new(&format!("m{i}")))).collect();
        Arc::new(FanOut::new(n, Instant::now() + timeout, observed, None))
    }

    #[tokio::test]
    async fn the_waiting_task_is_woken_once_when_a_quorum_of_answers_is_in() {
        let fan_out = record(5, Duration::from_secs(60));
        let places: Vec<Place> = (0..5).map(|i| FanOut::place(&fan_out, i)).collect();
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let deadline = tokio::time::sleep_until(fan_out.deadline());
        tokio::pin!(deadline);
        let mut places = places.into_iter();
        assert!(fan_out.poll_next(&mut cx, 3, deadline.as_mut()).is_pending());
        for place in places.by_ref().take(2) {
            place.complete(Ok(Reply::Int(1)));
        }
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "two answers of five decide nothing");
        assert!(fan_out.poll_next(&mut cx, 3, deadline.as_mut()).is_pending());
        places.next().expect("a place").complete(Ok(Reply::Int(1)));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the third answer wakes it");
        for _ in 0..3 {
            let next = fan_out.poll_next(&mut cx, 3, deadline.as_mut());
            assert!(matches!(next, Poll::Ready(Some((_, Ok(Reply::Int(1)))))));
        }
        // Past the quorum, each further answer wakes it.
        assert!(fan_out.poll_next(&mut cx, 3, deadline.as_mut()).is_pending());
        places.next().expect("a place").complete(Ok(Reply::Int(0)));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn masters_not_asked_do_not_count_towards_waking() {
        let fan_out = record(5, Duration::from_secs(60));
        fan_out.skip(3);
        fan_out.skip(4);
        let mut places = (0..3).map(|i| FanOut::place(&fan_out, i));
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let deadline = tokio::time::sleep_until(fan_out.deadline());
        tokio::pin!(deadline);
        assert!(fan_out.poll_next(&mut cx, 2, deadline.as_mut()).is_pending());
        places.next().expect("a place").complete(Ok(Reply::Int(1)));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "one answer of the three asked");
        assert!(fan_out.poll_next(&mut cx, 2, deadline.as_mut()).is_pending());
        places.next().expect("a place").complete(Ok(Reply::Int(1)));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "two of the three asked");
        assert!(fan_out.poll_next(&mut cx, 2, deadline.as_mut()).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_deadline_the_silent_masters_time_out_and_later_answers_are_dropped() {
        let fan_out = record(3, Duration::from_millis(50));
        let places: Vec<Place> = (0..3).map(|i| FanOut::place(&fan_out, i)).collect();
        let mut places = places.into_iter();
        places.next().expect("a place").complete(Ok(Reply::ok()));
        let deadline = tokio::time::sleep_until(fan_out.deadline());
        tokio::pin!(deadline);
        let mut answers = Vec::new();
        while let Some(answer) = fan_out.next(3, deadline.as_mut()).await {
            answers.push(answer);
        }
        assert_eq!(answers.len(), 3);
        assert_eq!(answers[0], (0, Ok(Reply::ok())));
        assert!(answers[1..].iter().all(|(_, a)| *a == Err(BackendError::Timeout)));
        let late = places.next().expect("a place");
        assert!(!late.is_open(), "past the deadline a script is not re-sent");
        late.complete(Ok(Reply::ok()));
        assert_eq!(
            fan_out.next(3, deadline.as_mut()).await,
            None,
            "a late answer is not read"
        );
        assert_eq!(fan_out.observed[1].timeouts(), 1);
    }

    #[tokio::test]
    async fn a_place_dropped_unanswered_fails_its_master() {
        let fan_out = record(1, Duration::from_secs(60));
        drop(FanOut::place(&fan_out, 0));
        let deadline = tokio::time::sleep_until(fan_out.deadline());
        tokio::pin!(deadline);
        let answer = fan_out.next(1, deadline.as_mut()).await;
        assert!(matches!(answer, Some((0, Err(BackendError::Io(_))))));
    }
}
