//! The engine without sockets: in-process fake masters with scripted delays and failures,
//! on tokio's paused clock, so every timing below is exact and deterministic.

use std::collections::HashMap;
use std::sync::Mutex;

use super::*;
use crate::backend::Form;
use crate::backend::{Place, complete_with};
use crate::clock::TokioClock;
use crate::lua::own::{RELEASE_SHA, UNDO};
use crate::wire::sha1_hex;

/// A master that knows the proxy's acquisition, undo and release, with a scripted
/// reply delay, or down, or answering every request with an error. Like a real master on a
/// pipelined connection, it executes a request when it arrives, whether or not the caller is
/// still waiting for the reply: only the reply is delayed.
struct Fake {
    name: String,
    delay: Duration,
    down: bool,
    error: Option<&'static str>,
    /// Runs every request, but its connection breaks before the reply comes back.
    breaks: bool,
    /// Each key's value and the expiry its write was given (a number unique per write, as
    /// a real master's expiry in milliseconds names a write, rule 5a).
    keys: Mutex<HashMap<Bytes, (Bytes, i64)>>,
    /// Requests that reached it (a master down reports it before anything is sent).
    received: std::sync::atomic::AtomicUsize,
}

impl Fake {
    fn up() -> Fake {
        Fake {
            name: "fake".into(),
            delay: Duration::ZERO,
            down: false,
            error: None,
            breaks: false,
            keys: Mutex::new(HashMap::new()),
            received: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn slow(delay_ms: u64) -> Fake {
        Fake {
            delay: Duration::from_millis(delay_ms),
            ..Fake::up()
        }
    }

    fn down() -> Fake {
        Fake {
            down: true,
            ..Fake::up()
        }
    }

    fn failing(error: &'static str) -> Fake {
        Fake {
            error: Some(error),
            ..Fake::up()
        }
    }

    fn holding(key: &str, token: &str) -> Fake {
        let fake = Fake::up();
        fake.keys.lock().unwrap().insert(bytes(key), (bytes(token), 1));
        fake
    }

    fn value(&self, key: &str) -> Option<Bytes> {
        self.keys.lock().unwrap().get(key.as_bytes()).map(|(v, _)| v.clone())
    }

    fn apply(&self, request: &Request) -> Reply {
        static WRITES: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1_000);
        let args = &request.args;
        if let Some(error) = self.error {
            return Reply::error(error);
        }
        let mut keys = self.keys.lock().unwrap();
        let script = |body: &str| {
            (args[0] == "EVALSHA" && args[1] == sha1_hex(body.as_bytes())) || (args[0] == "EVAL" && args[1] == body)
        };
        match &args[0][..] {
            // The acquisition: SET key token NX PX ttl; its answer as the backend hands it on.
            _ if matches!(request.form, Form::Acquisition { .. }) => {
                if keys.contains_key(&args[1]) {
                    Reply::Nil
                } else {
                    let expiry = WRITES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    keys.insert(args[1].clone(), (args[2].clone(), expiry));
                    Reply::Int(expiry)
                }
            }
            // UNDO: KEYS = lock; ARGV = token, expiry.
            _ if script(UNDO) => {
                let ours = keys
                    .get(&args[3])
                    .is_some_and(|(v, e)| *v == args[4] && e.to_string().as_bytes() == &args[5][..]);
                if ours {
                    keys.remove(&args[3]);
                }
                Reply::Int(i64::from(ours))
            }
            b"EVALSHA" if args[1] == *RELEASE_SHA => {
                let owned = keys.get(&args[3]).is_some_and(|(v, _)| *v == args[4]);
                if owned {
                    keys.remove(&args[3]);
                }
                Reply::Int(i64::from(owned))
            }
            other => Reply::error(format!("ERR fake does not know {}", String::from_utf8_lossy(other))),
        }
    }
}

impl Backend for Fake {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(self: &Arc<Self>, request: &Request, _: Option<&Request>, place: Place) {
        let (fake, request) = (self.clone(), request.clone());
        complete_with(place, async move { fake.answer(&request).await });
    }
}

impl Fake {
    async fn answer(&self, request: &Request) -> Result<Reply, BackendError> {
        // As a real master marked down: requests are refused before sending, but a cleanup
        // (an owner-checked delete) still goes out over a connection that is open.
        if self.down && !request.cleanup {
            return Err(BackendError::Down);
        }
        self.received.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let reply = self.apply(request);
        tokio::time::sleep(self.delay).await;
        if self.breaks {
            return Err(BackendError::Io("connection lost".into()));
        }
        Ok(reply)
    }
}

fn bytes(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn engine(backends: Vec<Fake>, timeout_ms: u64) -> Engine<Fake, TokioClock> {
    let settings = Settings {
        backend_timeout: Duration::from_millis(timeout_ms),
        drift_factor: 0.01,
    };
    Engine::new(backends, TokioClock::new(), settings)
}

async fn acquire(engine: &Engine<Fake, TokioClock>, ttl_ms: u64) -> Acquired {
    engine
        .acquire(0, bytes("lock"), bytes("me"), Duration::from_millis(ttl_ms))
        .await
}

fn holders(engine: &Engine<Fake, TokioClock>, token: &str) -> usize {
    engine
        .backends()
        .iter()
        .filter(|b| b.value("lock").as_deref() == Some(token.as_bytes()))
        .count()
}

#[test]
fn quorum_is_a_strict_majority() {
    assert_eq!([1, 2, 3, 4, 5, 6, 7].map(quorum), [1, 2, 2, 3, 3, 4, 4]);
}

#[test]
fn validity_subtracts_elapsed_and_drift() {
    let e = engine(vec![Fake::up()], 50);
    let ttl = Duration::from_millis(10_000);
    // drift = 10 000 × 0.01 + 2 = 102 ms
    assert_eq!(e.validity(ttl, Duration::ZERO), Some(Duration::from_millis(9_898)));
    assert_eq!(
        e.validity(ttl, Duration::from_millis(898)),
        Some(Duration::from_millis(9_000))
    );
    assert_eq!(e.validity(ttl, Duration::from_millis(9_898)), None);
    assert_eq!(e.validity(ttl, Duration::from_millis(20_000)), None);
}

#[tokio::test(start_paused = true)]
async fn all_up_grants_with_full_validity() {
    let e = engine((0..5).map(|_| Fake::up()).collect(), 50);
    let Acquired::Yes { validity, .. } = acquire(&e, 10_000).await else {
        panic!("not granted");
    };
    assert_eq!(validity, Duration::from_millis(9_898));
    tokio::task::yield_now().await;
    assert!(holders(&e, "me") >= 3);
}

#[tokio::test(start_paused = true)]
async fn two_of_five_down_still_grants() {
    let e = engine(vec![Fake::down(), Fake::down(), Fake::up(), Fake::up(), Fake::up()], 50);
    assert!(matches!(acquire(&e, 10_000).await, Acquired::Yes { .. }));
}

#[tokio::test(start_paused = true)]
async fn three_of_five_down_is_noquorum_and_undone() {
    let e = engine(
        vec![Fake::down(), Fake::down(), Fake::down(), Fake::up(), Fake::up()],
        50,
    );
    let Acquired::NoQuorum(why) = acquire(&e, 10_000).await else {
        panic!("not NOQUORUM");
    };
    assert_eq!((why.answered, why.down, why.total), (2, 3, 5));
    assert_eq!(
        why.to_string(),
        "NOQUORUM 2 of 5 masters can vote: 3 down; see PROXY BACKENDS"
    );
    assert_eq!(holders(&e, "me"), 0, "the two grants were undone");
}

#[tokio::test(start_paused = true)]
async fn held_by_a_majority_is_refused_and_partial_keys_undone() {
    let e = engine(
        vec![
            Fake::holding("lock", "other"),
            Fake::holding("lock", "other"),
            Fake::holding("lock", "other"),
            Fake::up(),
            Fake::up(),
        ],
        50,
    );
    assert!(matches!(acquire(&e, 10_000).await, Acquired::No { .. }));
    assert_eq!(holders(&e, "me"), 0);
    assert_eq!(holders(&e, "other"), 3, "undo never touches another owner's key");
}

#[tokio::test(start_paused = true)]
async fn quorum_reached_too_late_is_no_lock() {
    // Three masters answer after 9 950 ms of a 10 000 ms lock: past ttl − drift (9 898 ms).
    let e = engine(
        vec![
            Fake::slow(9_950),
            Fake::slow(9_950),
            Fake::slow(9_950),
            Fake::down(),
            Fake::down(),
        ],
        20_000,
    );
    assert!(matches!(acquire(&e, 10_000).await, Acquired::No { .. }));
    assert_eq!(holders(&e, "me"), 0, "the late grants were undone");
}

#[tokio::test(start_paused = true)]
async fn answers_at_quorum_without_waiting_for_stragglers() {
    let e = engine(
        vec![Fake::up(), Fake::up(), Fake::up(), Fake::slow(40), Fake::slow(40)],
        50,
    );
    let start = tokio::time::Instant::now();
    assert!(matches!(acquire(&e, 10_000).await, Acquired::Yes { .. }));
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the reply waited for the slow minority"
    );
    // The stragglers still get the key, in the background.
    tokio::time::sleep(Duration::from_millis(41)).await;
    assert_eq!(holders(&e, "me"), 5);
}

#[tokio::test(start_paused = true)]
async fn a_master_slower_than_the_timeout_counts_as_failed() {
    let e = engine(vec![Fake::slow(1_000), Fake::slow(1_000), Fake::up()], 50);
    let start = tokio::time::Instant::now();
    let Acquired::NoQuorum(why) = acquire(&e, 10_000).await else {
        panic!("not NOQUORUM");
    };
    assert_eq!((why.answered, why.no_reply, why.total), (1, 2, 3));
    // One timeout for the fan-out, one for the undo: never more.
    assert!(
        start.elapsed() <= Duration::from_millis(100),
        "took {:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn no_wait_longer_than_the_ttl() {
    let e = engine(vec![Fake::slow(1_000), Fake::slow(1_000), Fake::slow(1_000)], 5_000);
    let start = tokio::time::Instant::now();
    assert!(matches!(acquire(&e, 100).await, Acquired::NoQuorum(_)));
    // The fan-out is cut at the TTL (100 ms); the undo is bounded by the backend timeout.
    assert!(
        start.elapsed() < Duration::from_millis(100 + 1_001),
        "took {:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn execute_combines_replies() {
    let e = engine(
        vec![Fake::holding("lock", "me"), Fake::holding("lock", "me"), Fake::up()],
        50,
    );
    let release = Op::Script(ScriptCall::release(0, bytes("lock"), bytes("me")));
    assert_eq!(e.execute(release).await, Reply::Int(1), "a quorum (2 of 3) deleted");
}

#[tokio::test(start_paused = true)]
async fn retrying_with_the_same_token_keeps_the_lock() {
    let e = engine((0..5).map(|_| Fake::up()).collect(), 50);
    assert!(matches!(acquire(&e, 10_000).await, Acquired::Yes { .. }));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(holders(&e, "me"), 5);
    // The same acquisition sent again (a client retrying after a lost reply): Redis says nil
    // and keeps the key; so must the proxy.
    assert!(matches!(acquire(&e, 10_000).await, Acquired::No { .. }));
    assert_eq!(
        holders(&e, "me"),
        5,
        "the undo of the retry deleted the lock it already held"
    );
}

#[tokio::test(start_paused = true)]
async fn an_undo_never_touches_an_equal_value_another_acquisition_wrote() {
    // Rule 5a. The holder took "lock" with "me" on masters 0-3 (an earlier acquisition, whose
    // write no answer of this attempt names). It re-sends `SET NX` with its own token while master 3 is slow
    // and master 4 lost its key: 0-2 refuse, 3 refuses too but only after the timeout, 4
    // grants. The attempt fails and is undone on 3 and 4; on 3 the key holds an equal value
    // that this attempt did not write, and it must survive.
    let e = engine(
        vec![
            Fake::holding("lock", "me"),
            Fake::holding("lock", "me"),
            Fake::holding("lock", "me"),
            Fake {
                delay: Duration::from_millis(60),
                ..Fake::holding("lock", "me")
            },
            Fake::up(),
        ],
        50,
    );
    assert!(matches!(acquire(&e, 10_000).await, Acquired::No { .. }));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        holders(&e, "me"),
        4,
        "the holder keeps masters 0-3; only this attempt's own write on 4 is undone"
    );
    assert_eq!(e.backends()[4].value("lock"), None);
}

#[test]
fn a_refusal_tells_when_the_lock_can_be_free() {
    let held = |ms: i64| Ok(Reply::Array(vec![Reply::Int(ms)]));
    let granted = || Ok(Reply::Int(1));
    // Free once three of five are: the undone grant now, then 300 ms, then 500 ms.
    let answers = [granted(), held(300), held(500), held(900), Err(BackendError::Timeout)];
    assert_eq!(free_in(&answers, 3), Some(Duration::from_millis(500)));
    // A master with no TTL, or silent, cannot tell.
    let answers = [held(-1), held(300), Err(BackendError::Down)];
    assert_eq!(free_in(&answers, 2), None);
    assert_eq!(
        free_in(&[held(-2), held(100), held(-1)], 2),
        Some(Duration::from_millis(100))
    );
    // A key at PTTL 0 still exists: free in a millisecond, not now (a waiter told "now" went
    // round again at once, in a loop, until the masters' clocks moved on).
    assert_eq!(free_in(&[held(0), held(0), held(0)], 2), Some(Duration::from_millis(1)));
}

#[tokio::test(start_paused = true)]
async fn an_undo_goes_only_where_the_attempt_was_sent() {
    // Rule 5a: two masters refuse, one grants, two are marked down (the attempt was not sent
    // to them, though a cleanup could still go out over their connections). The undo goes to
    // the one that granted, and to nobody else: not to those that refused (our script wrote
    // nothing there), not to those the attempt never reached.
    let e = engine(
        vec![
            Fake::holding("lock", "other"),
            Fake::holding("lock", "other"),
            Fake::up(),
            Fake::down(),
            Fake::down(),
        ],
        50,
    );
    // Three masters voted (two refusals, one grant): not acquired.
    assert!(matches!(acquire(&e, 10_000).await, Acquired::No { .. }));
    let received: Vec<usize> = e
        .backends()
        .iter()
        .map(|b| b.received.load(std::sync::atomic::Ordering::SeqCst))
        .collect();
    assert_eq!(
        received,
        [1, 1, 2, 0, 0],
        "the attempt where it could go, the undo once"
    );
    assert_eq!(holders(&e, "me"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_grant_taken_back_is_undone_only_where_the_attempt_was_sent() {
    // Rules 4a and 5a: a grant whose reply went stale before it was written is taken back on
    // the masters the attempt reached, and on no other: two masters marked down never had
    // the attempt, so they get no undo (a cleanup would still reach them, see `Fake::answer`).
    let received = |e: &Engine<Fake, TokioClock>| -> Vec<usize> {
        e.backends()
            .iter()
            .map(|b| b.received.load(std::sync::atomic::Ordering::SeqCst))
            .collect()
    };
    let e = engine(vec![Fake::up(), Fake::up(), Fake::up(), Fake::down(), Fake::down()], 50);
    let Acquired::Yes { undo, .. } = acquire(&e, 10_000).await else {
        panic!("three of five masters up grant the lock");
    };
    e.undo(&undo).await;
    assert_eq!(
        received(&e),
        [2, 2, 2, 0, 0],
        "the attempt and its undo, where it was sent"
    );
    assert_eq!(holders(&e, "me"), 0);

    // Sent to every master (the usual grant, which keeps no list): undone on every one.
    let e = engine((0..5).map(|_| Fake::up()).collect(), 50);
    let Acquired::Yes { undo, .. } = acquire(&e, 10_000).await else {
        panic!("five masters up grant the lock");
    };
    e.undo(&undo).await;
    assert_eq!(received(&e), [2; 5]);
    assert_eq!(holders(&e, "me"), 0);
}

#[tokio::test(start_paused = true)]
async fn an_error_reply_is_a_failure_not_a_refusal() {
    // Rule 5a: three masters out of memory (or demoted to replicas by a failover the proxy
    // has not heard of yet: READONLY), two holding the lock for another client. Counting the
    // error as "held" would answer nil (held by a majority); three masters could not vote.
    let errors = [
        "OOM command not allowed when used memory > 'maxmemory'.",
        "READONLY You can't write against a read only replica.",
    ];
    for error in errors {
        let e = engine(
            vec![
                Fake::failing(error),
                Fake::failing(error),
                Fake::failing(error),
                Fake::holding("lock", "other"),
                Fake::holding("lock", "other"),
            ],
            50,
        );
        let Acquired::NoQuorum(why) = acquire(&e, 10_000).await else {
            panic!("an error reply was read as a vote: {error}");
        };
        assert_eq!((why.answered, why.errors), (2, 3));
        assert!(why.to_string().contains(error), "{why}");
    }
}

#[tokio::test(start_paused = true)]
async fn undo_reaches_masters_that_timed_out() {
    // Two masters grant, one refuses, two answer only after the timeout: their SET landed,
    // so they are undone too (rules 5 and 5a), behind it.
    let e = engine(
        vec![
            Fake::up(),
            Fake::up(),
            Fake::holding("lock", "other"),
            Fake::slow(60),
            Fake::slow(60),
        ],
        50,
    );
    assert!(matches!(acquire(&e, 10_000).await, Acquired::No { .. }));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(holders(&e, "me"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_write_whose_reply_never_comes_is_left_to_its_ttl() {
    // Rule 5a where the proxy cannot know: master 2 ran the attempt, but its connection broke
    // before the reply said so. Without the reply's word that this attempt wrote there, no
    // undo is sent: the key (this attempt's, as it happens) lives out its TTL. Liveness for
    // one TTL, never a delete of a key another acquisition may own.
    let e = engine(
        vec![
            Fake::holding("lock", "other"),
            Fake::up(),
            Fake {
                breaks: true,
                ..Fake::up()
            },
        ],
        50,
    );
    assert!(matches!(acquire(&e, 10_000).await, Acquired::No { .. }));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let values: Vec<Option<Bytes>> = e.backends().iter().map(|b| b.value("lock")).collect();
    assert_eq!(values, [Some(bytes("other")), None, Some(bytes("me"))]);
    let received: Vec<usize> = e
        .backends()
        .iter()
        .map(|b| b.received.load(std::sync::atomic::Ordering::SeqCst))
        .collect();
    assert_eq!(received, [1, 2, 1], "an undo only where a reply said the attempt wrote");
}

#[tokio::test(start_paused = true)]
async fn a_grant_taken_back_reaches_the_stragglers_when_they_answer() {
    // Rules 4a and 5a: a grant is taken back before two slow masters answered; their writes
    // are undone once their replies come and name them.
    let e = engine(
        vec![Fake::up(), Fake::up(), Fake::up(), Fake::slow(30), Fake::slow(30)],
        50,
    );
    let Acquired::Yes { undo, .. } = acquire(&e, 10_000).await else {
        panic!("three of five masters grant at once");
    };
    e.undo(&undo).await;
    assert_eq!(holders(&e, "me"), 2, "the stragglers have not answered yet");
    tokio::time::sleep(Duration::from_millis(31)).await;
    assert_eq!(holders(&e, "me"), 0);
}

#[tokio::test(start_paused = true)]
async fn execute_answers_once_a_quorum_agrees_and_stragglers_still_run() {
    let e = engine(
        vec![
            Fake::holding("lock", "me"),
            Fake::holding("lock", "me"),
            Fake::holding("lock", "me"),
            Fake {
                delay: Duration::from_millis(40),
                ..Fake::holding("lock", "me")
            },
            Fake {
                delay: Duration::from_millis(40),
                ..Fake::holding("lock", "me")
            },
        ],
        50,
    );
    let start = tokio::time::Instant::now();
    let release = Op::Script(ScriptCall::release(0, bytes("lock"), bytes("me")));
    assert_eq!(e.execute(release).await, Reply::Int(1));
    assert_eq!(start.elapsed(), Duration::ZERO, "waited for the slow minority");
    tokio::time::sleep(Duration::from_millis(41)).await;
    assert_eq!(holders(&e, "me"), 0, "rule 6: the release still reached every master");
}
