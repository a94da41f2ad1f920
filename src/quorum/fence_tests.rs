//! Fencing over in-process masters that run the real scripts (the embedded master's Lua),
//! on tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::fence::Fenced;
use super::{Engine, Settings};
use crate::backend::embedded::EmbeddedBackend;
use crate::backend::{Backend, BackendError, Place, Request, complete_with};
use crate::clock::TokioClock;
use crate::reply::Reply;

/// An embedded master that can be made unreachable, answering after `delay`.
struct Master {
    inner: EmbeddedBackend,
    down: std::sync::atomic::AtomicBool,
    delay: Duration,
    /// The write-back scripts (F2) that reached it, by SHA1 or by source.
    write_backs: std::sync::atomic::AtomicUsize,
}

impl Backend for Master {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn start(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, place: Place) {
        let (master, request, fallback) = (self.clone(), request.clone(), fallback.cloned());
        complete_with(place, async move { master.answer(&request, fallback.as_ref()).await });
    }

    fn run_id(&self) -> Option<String> {
        Some(self.inner.run_id())
    }
}

impl Master {
    async fn answer(&self, request: &Request, fallback: Option<&Request>) -> Result<Reply, BackendError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(BackendError::Down);
        }
        let body = crate::lua::fence::WRITE_BACK.as_bytes();
        let script = request.args.get(1).map(|a| &a[..]);
        if script == Some(body) || script == Some(&crate::wire::sha1_hex(body)[..]) {
            self.write_backs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        Ok(self.inner.answer(request, fallback))
    }
}

fn engine(n: usize) -> Engine<Master, TokioClock> {
    engine_with_delays(&vec![0; n])
}

/// Masters answering after these delays, in ms.
fn engine_with_delays(delays_ms: &[u64]) -> Engine<Master, TokioClock> {
    let masters = delays_ms
        .iter()
        .enumerate()
        .map(|(i, &ms)| Master {
            inner: EmbeddedBackend::new(format!("m{i}"), Arc::new(TokioClock::new())),
            down: false.into(),
            delay: Duration::from_millis(ms),
            write_backs: 0.into(),
        })
        .collect();
    let settings = Settings {
        backend_timeout: Duration::from_millis(50),
        drift_factor: 0.01,
    };
    Engine::new(masters, TokioClock::new(), settings)
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn set_down(e: &Engine<Master, TokioClock>, which: &[usize], down: bool) {
    for &i in which {
        e.backends()[i].down.store(down, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn acquire(e: &Engine<Master, TokioClock>, token: &str) -> Fenced {
    e.acquire_fenced(0, b("lock"), b(token), Duration::from_millis(10_000))
        .await
}

fn token(f: &Fenced) -> u64 {
    match f {
        Fenced::Yes { token, .. } => *token,
        other => panic!("not granted: {other:?}"),
    }
}

/// Write-back scripts that reached the masters so far.
fn write_backs(e: &Engine<Master, TokioClock>) -> usize {
    e.backends()
        .iter()
        .map(|m| m.write_backs.load(std::sync::atomic::Ordering::SeqCst))
        .sum()
}

/// The counter master `i` holds for the lock, raw.
fn counter(e: &Engine<Master, TokioClock>, i: usize) -> Option<Bytes> {
    let get = Request::new(0, vec![b("GET"), b("redlock-proxy:fence:c:lock")]);
    match e.backends()[i].inner.execute(&get) {
        Reply::Bulk(v) => Some(v),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn tokens_increase_and_each_call_bumps_once() {
    let e = engine(5);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    let t1 = token(&acquire(&e, "a").await);
    assert!(t1 > before, "a new database starts at the genesis time in µs");
    assert!(matches!(acquire(&e, "b").await, Fenced::No { .. }), "held");
    let t2 = token(&e.fence(0, b("lock"), b("a")).await);
    assert_eq!(t2, t1 + 1);
    assert_eq!(
        e.fence(0, b("lock"), b("b")).await,
        Fenced::No { free_in: None },
        "not the holder"
    );
    let never = e.lock_info(0, b("never-fenced")).await.expect("quorum");
    assert_eq!(
        (never.holder, never.last_token),
        (None, None),
        "a genesis base is not a token"
    );
    let info = e.lock_info(0, b("lock")).await.expect("quorum");
    assert_eq!(info.holder, Some(b("a")));
    assert_eq!(info.last_token, Some(t2));
    assert!(info.validity > Duration::from_millis(9_000));
    e.release(0, b("lock"), b("a")).await;
    assert_eq!(token(&acquire(&e, "b").await), t1 + 2);
    let t4 = token(&e.fence(0, b("lock"), b("b")).await);
    assert_eq!(t4, t1 + 3);
    // The masters not waited for finish in the background.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let last = e.lock_info(0, b("lock")).await.expect("quorum").last_token;
    assert!(last >= Some(t4), "{last:?}");
    // F2: a quorum vouches for the last token.
    let suffix = format!(" {t4}");
    let vouch = (0..5)
        .filter(|&i| counter(&e, i).is_some_and(|c| c.ends_with(suffix.as_bytes())))
        .count();
    assert!(vouch >= 3, "{vouch} masters vouch for {t4}");
}

/// F2 without a second round trip: when a quorum of bumps returned the token itself, that
/// quorum holds it already. A master that missed grants (its counter lags) makes the bumps
/// disagree, and then the token is written back before it is answered.
#[tokio::test(start_paused = true)]
async fn agreeing_counters_need_no_write_back_and_disagreeing_ones_get_it() {
    let e = engine(3);
    let t1 = token(&acquire(&e, "a").await);
    // The masters not waited for finish in the background (here and below).
    tokio::time::sleep(Duration::from_millis(1)).await;
    e.release(0, b("lock"), b("a")).await;
    let before = write_backs(&e);
    let t2 = token(&acquire(&e, "b").await);
    assert_eq!(t2, t1 + 1);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(write_backs(&e), before, "the bumps agreed: no write-back");
    e.release(0, b("lock"), b("b")).await;
    // Master 2 misses a grant: its counter lags behind.
    set_down(&e, &[2], true);
    let t3 = token(&acquire(&e, "c").await);
    e.release(0, b("lock"), b("c")).await;
    set_down(&e, &[2], false);
    // A quorum of masters 1 and 2: their bumps disagree (t3 + 1 and t2 + 1).
    set_down(&e, &[0], true);
    let before = write_backs(&e);
    let t4 = token(&acquire(&e, "d").await);
    assert_eq!(t4, t3 + 1);
    assert!(write_backs(&e) > before, "the bumps disagreed: written back");
    let suffix = format!(" {t4}");
    assert!(
        counter(&e, 2).is_some_and(|c| c.ends_with(suffix.as_bytes())),
        "the lagging master was raised to the token"
    );
}

/// The case `docs/fencing.md` is about: a grant whose write-back lands on exactly 3 of 5
/// masters, one of which restarts empty; the next grant's quorum has that master and the
/// two that never saw the token. Without F3 the restarted master's counter (0) and the
/// two stale ones would give a smaller token.
#[tokio::test(start_paused = true)]
async fn a_master_that_lost_its_counters_does_not_vote_on_tokens() {
    let e = engine(5);
    let first = token(&acquire(&e, "a").await);
    e.release(0, b("lock"), b("a")).await;
    // Masters 3 and 4 miss several grants: 0, 1, 2 are ahead.
    set_down(&e, &[3, 4], true);
    let mut last = first;
    for i in 0..5 {
        let t = token(&acquire(&e, &format!("x{i}")).await);
        assert!(t > last);
        last = t;
        e.release(0, b("lock"), b(&format!("x{i}"))).await;
    }
    // Master 2 restarts empty; 0 and 1 become unreachable; 3 and 4 are back.
    e.backends()[2].inner.restart();
    set_down(&e, &[0, 1], true);
    set_down(&e, &[3, 4], false);
    // 2, 3, 4 grant the lock, but only 3 and 4 have trusted counters: no token.
    match acquire(&e, "late").await {
        Fenced::Unfenced(u) => assert_eq!(u.trusted, 2),
        other => panic!("{other:?}"),
    }
    assert!(
        e.lock_info(0, b("lock")).await.expect("quorum").holder.is_none(),
        "undone"
    );
    // With 0 and 1 back, the token is above every earlier one, and master 2 is rewritten.
    set_down(&e, &[0, 1], false);
    let t = token(&acquire(&e, "late").await);
    assert!(t > last, "{t} after {last}");
    let raw = counter(&e, 2).expect("rewritten");
    assert!(raw.ends_with(format!(" {t}").as_bytes()), "{raw:?}");
    // Now 2, 3, 4 alone can grant: 2 vouches for the latest token.
    e.release(0, b("lock"), b("late")).await;
    set_down(&e, &[0, 1], true);
    assert!(token(&acquire(&e, "again").await) > t);
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_of_an_earlier_run_is_not_trusted() {
    let e = engine(3);
    let t = token(&acquire(&e, "a").await);
    // What the backend does on a new connection to a master whose run id changed while its
    // epoch (restored from a snapshot) names the old run.
    let check = Request::new(
        0,
        vec![
            b("EVAL"),
            b(crate::lua::fence::CHECK_EPOCH),
            b("1"),
            b(crate::keys::EPOCH_KEY),
            b("another-run"),
        ],
    );
    assert_eq!(e.backends()[0].inner.execute(&check), Reply::Int(2));
    assert_eq!(e.backends()[0].inner.execute(&check), Reply::Int(1), "now current");
    e.release(0, b("lock"), b("a")).await;
    // Masters 1 and 2 alone vouch; master 0's counter is of the old run.
    set_down(&e, &[2], true);
    match acquire(&e, "b").await {
        Fenced::Unfenced(u) => assert_eq!(u.trusted, 1),
        other => panic!("{other:?}"),
    }
    set_down(&e, &[2], false);
    assert!(token(&acquire(&e, "b").await) > t);
}

#[tokio::test(start_paused = true)]
async fn extend_reports_the_validity_left() {
    let e = engine(3);
    token(&acquire(&e, "a").await);
    let v = e
        .extend_lock(0, b("lock"), b("a"), Duration::from_millis(20_000))
        .await
        .validity
        .expect("extended");
    assert!(
        v > Duration::from_millis(19_000) && v < Duration::from_millis(20_000),
        "{v:?}"
    );
    assert_eq!(
        e.extend_lock(0, b("lock"), b("b"), Duration::from_millis(20_000))
            .await
            .validity,
        None
    );
}

/// Found by the simulation: a grant that also found a master without an epoch assigned it
/// one before answering, and answered the validity computed before that round trip. The
/// validity must hold from the moment the answer is given (rule 4).
#[tokio::test(start_paused = true)]
async fn validity_counts_every_round_trip_before_the_answer() {
    // Master 2 answers first, so its missing epoch is seen before the grant is decided.
    let e = engine_with_delays(&[20, 20, 5]);
    token(&acquire(&e, "warm").await);
    e.release(0, b("lock"), b("warm")).await;
    // Master 2 loses its epoch (as after a restart).
    let del = Request::new(0, vec![b("DEL"), b(crate::keys::EPOCH_KEY)]);
    e.backends()[2].inner.execute(&del);
    let ttl = Duration::from_millis(1_000);
    let start = tokio::time::Instant::now();
    let fenced = e.acquire_fenced(0, b("lock"), b("a"), ttl).await;
    let elapsed = start.elapsed();
    let Fenced::Yes { validity, .. } = fenced else {
        panic!("{fenced:?}")
    };
    let drift = super::drift(ttl, 0.01);
    assert!(
        validity + elapsed + drift <= ttl,
        "{validity:?} + {elapsed:?} + {drift:?} > {ttl:?}"
    );
}

/// F5: a rolling restart of every master (each empty), with a lock not used meanwhile. Each
/// restarted master is repaired from the others before the next restarts, so afterwards the
/// idle lock's next token is above its last one, and new locks can be fenced.
#[tokio::test(start_paused = true)]
async fn a_rolling_restart_keeps_idle_locks_fenced() {
    let e = engine(5);
    let idle = e
        .acquire_fenced(0, b("idle"), b("a"), Duration::from_millis(10_000))
        .await;
    let last = token(&idle);
    e.release(0, b("idle"), b("a")).await;
    // The genesis asked for one (the masters had no epoch); nothing since.
    e.recovery_wanted(0);
    for i in 0..5 {
        e.backends()[i].inner.restart();
        // A fenced operation that meets the restarted master (it cannot vouch), even after
        // the quorum answered, asks for a recovery, which the proxy runs in the background;
        // here, at once.
        assert!(!e.recovery_wanted(0));
        token(&acquire(&e, &format!("t{i}")).await);
        e.release(0, b("lock"), b(&format!("t{i}"))).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(e.recovery_wanted(0), "restart of master {i} noticed");
        e.recover(0).await;
        tokio::time::advance(Duration::from_secs(2)).await;
    }
    let again = e
        .acquire_fenced(0, b("idle"), b("b"), Duration::from_millis(10_000))
        .await;
    assert!(token(&again) > last, "{again:?} after {last}");
    let fresh = e
        .acquire_fenced(0, b("fresh"), b("c"), Duration::from_millis(10_000))
        .await;
    token(&fresh);
    for i in 0..5 {
        let get = Request::new(0, vec![b("GET"), b(crate::keys::EPOCH_KEY)]);
        let epoch = e.backends()[i].inner.execute(&get);
        assert!(
            matches!(&epoch, Reply::Bulk(v) if v.starts_with(b"g ")),
            "master {i} promoted: {epoch:?}"
        );
    }
}

/// The epoch master `i` holds, raw.
fn epoch(e: &Engine<Master, TokioClock>, i: usize) -> Option<Bytes> {
    let get = Request::new(0, vec![b("GET"), b(crate::keys::EPOCH_KEY)]);
    match e.backends()[i].inner.execute(&get) {
        Reply::Bulk(v) => Some(v),
        _ => None,
    }
}

/// F4: a genesis is decided only when every master answered without an epoch; a master out
/// of sight might hold one.
#[tokio::test(start_paused = true)]
async fn no_genesis_while_a_master_is_out_of_sight() {
    let e = engine(3);
    set_down(&e, &[2], true);
    match acquire(&e, "a").await {
        Fenced::Unfenced(u) => {
            assert_eq!(u.genesis_waits_for, [2], "the refusal names the member it waits for");
            let said = u.to_string();
            assert!(
                said.contains("start only when every master answers (member 2 did not"),
                "{said}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!((0..3).all(|i| epoch(&e, i).is_none()), "nothing decided");
    set_down(&e, &[2], false);
    token(&acquire(&e, "a").await);
    assert!((0..3).all(|i| epoch(&e, i).is_some_and(|v| v.starts_with(b"g "))));
}

/// F5: a rejoined master is promoted only when every other master answered the repair; and
/// a repair started under one epoch writes nothing once the master has another (it
/// restarted again).
#[tokio::test(start_paused = true)]
async fn promotion_needs_every_other_master_and_the_same_epoch() {
    let e = engine(5);
    let last = token(&acquire(&e, "a").await);
    e.release(0, b("lock"), b("a")).await;
    e.backends()[0].inner.restart();
    set_down(&e, &[4], true);
    e.recover(0).await;
    let rejoined = epoch(&e, 0).expect("a rejoin epoch");
    assert!(rejoined.starts_with(b"r "), "{rejoined:?}");
    assert_eq!(
        counter(&e, 0).map(|c| c.ends_with(format!(" {last}").as_bytes())),
        Some(true),
        "copied"
    );
    set_down(&e, &[4], false);
    tokio::time::advance(Duration::from_secs(2)).await;
    e.recover(0).await;
    assert!(epoch(&e, 0).is_some_and(|v| v.starts_with(b"g ")), "promoted");

    let counter_key = b("redlock-proxy:fence:c:lock");
    let stale = crate::lua::fence::repair(0, &rejoined, &[(counter_key, 1)], Some(999));
    assert_eq!(
        stale.run(&e.backends()[0]).await,
        Ok(Reply::Int(0)),
        "epoch changed: nothing done"
    );
    assert!(epoch(&e, 0).is_some_and(|v| v.starts_with(b"g ")));
}
