//! Clients of the recipes beyond the lock, through the engine as the proxy calls it:
//! read-write locks (`Engine::acquire_rw`, `Engine::release_rw`, as `RWLOCK.*` does), several
//! locks at once (`Engine::acquire_all`, each key released as a lock, as `LOCK.ACQUIREALL` and
//! `LOCK.RELEASEALL` do) and leader election (the fenced acquisition of the election's lock
//! key, released by a resignation, as `ELECT.CAMPAIGN` and `ELECT.RESIGN` do), and reentrant
//! locks (`Engine::acquire_reentrant`; holds given back as `LOCK.RELEASE` gives them back: the
//! give-back script on every master, then, when masters report extra holds, the hold the
//! proxy chooses removed by name).
//!
//! Every grant joins the history: a set's keys and a leadership as grants of their lock keys
//! (property 1 per key: one holder of a key, one leader per election; property 5: tokens, and
//! so terms, rising per key), a read-write lock's holds as reads and writes of the lock (never
//! a writer's grant overlapping another grant, [`super::check::History::rw_overlaps`]; tokens
//! rising per lock, readers' and writers' alike).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redlock_proxy::quorum::{Fenced, combine};
use redlock_proxy::recipes::election::lock_key;
use redlock_proxy::recipes::multikey::AllFenced;
use redlock_proxy::recipes::reentrant::Reentry;
use redlock_proxy::recipes::reentrant::engine::{chosen_hold, reported_holds};
use redlock_proxy::recipes::reentrant::lua::give_back;
use redlock_proxy::recipes::rwlock::Names;
use redlock_proxy::recipes::rwlock::{Mode, RwTaken};
use redlock_proxy::reply::Reply;
use tokio::time::{Instant, sleep};

use super::check::{Fence, Grant, Kind};
use super::run::{Held, Proxy, Style, acquire_as, hold_time, release};
use super::world::World;

/// The read-write lock the clients share (one, so that readers meet writers often).
pub const RW_LOCK: &str = "rw:0";

/// The election the campaigners share.
pub const ELECTION: &str = "elect:0";

/// The names of [`RW_LOCK`] on the masters.
pub fn rw_names() -> Names {
    Names::of(RW_LOCK.as_bytes())
}

/// The lock key of [`ELECTION`].
pub fn election_key() -> String {
    String::from_utf8_lossy(&lock_key(ELECTION.as_bytes())).into_owned()
}

fn bytes(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// One key of a grant the engine decided: the key as the history names it, and its fencing
/// token.
struct Granted {
    key: String,
    fence: u64,
    kind: Kind,
}

/// Records a grant the engine decided at `decided_at`, valid for `validity` from then: one
/// grant and one fencing token per key, from the moment the answer reached the client (no
/// reply of these clients waits behind another command, so it is never stale unless the
/// engine answered after the validity ended: a failure, as for a lock). `sent`: when the
/// acquisition was sent, for the fencing check.
fn record(
    world: &World,
    proxy: &Proxy,
    token: &str,
    keys: Vec<Granted>,
    (sent, decided_at, validity): (Duration, Instant, Duration),
) -> Vec<Held> {
    let now = Instant::now();
    let until = decided_at + validity;
    if until <= now {
        world.fail(format!(
            "stale reply: {} granted to {token} at {:.3}s, valid only until {:.3}s",
            keys.first().map_or("", |k| k.key.as_str()),
            world.at(now).as_secs_f64(),
            world.at(until).as_secs_f64()
        ));
    }
    keys.into_iter()
        .map(|granted| {
            world.record_fence(Fence {
                key: granted.key.clone(),
                token: granted.fence,
                holder: token.into(),
                sent,
                answered: world.at(now),
            });
            let grant = Grant {
                key: granted.key,
                token: token.into(),
                proxy: proxy.index,
                from: world.at(now),
                until: world.at(until),
            };
            let id = world.record_hold(grant, granted.kind);
            Held { id, until }
        })
        .collect()
}

/// As the proxy does after a fenced command: repair in the background (F5).
fn recover_if_wanted(proxy: &Arc<Proxy>) {
    if proxy.engine.recovery_wanted(0) {
        let proxy = proxy.clone();
        tokio::spawn(async move { proxy.engine.recover(0).await });
    }
}

/// A read-write lock client: a read hold (most of the time) or the write hold of
/// [`RW_LOCK`], held as a lock client holds (sometimes crashing), released.
pub async fn rw_client(world: Arc<World>, proxy: Arc<Proxy>, id: usize, mut rng: super::rng::Rng) {
    let cfg = &world.cfg;
    let names = rw_names();
    let mut attempt = 0u64;
    while world.budget_left() {
        let mode = if rng.chance(0.6) { Mode::Read } else { Mode::Write };
        let token = format!("rw{id}.{attempt}");
        attempt += 1;
        let ttl = cfg.ttl(&mut rng);
        let sent = world.elapsed();
        world.note(|| format!("p{} {mode:?} {RW_LOCK} {token} ttl {ttl:?}", proxy.index));
        let taken = proxy
            .engine
            .acquire_rw(0, &names, mode, bytes(&token), ttl, Duration::ZERO)
            .await;
        world.count_op();
        let decided_at = Instant::now();
        world.note(|| format!("p{} {mode:?} {RW_LOCK} {token} -> {taken:?}", proxy.index));
        recover_if_wanted(&proxy);
        let RwTaken::Lock(Fenced::Yes {
            token: fence, validity, ..
        }) = taken
        else {
            sleep(rng.between(Duration::from_millis(1), cfg.timeout * 2)).await;
            continue;
        };
        let kind = match mode {
            Mode::Read => Kind::Read,
            Mode::Write => Kind::Write,
        };
        let granted = Granted {
            key: RW_LOCK.into(),
            fence,
            kind,
        };
        let held = record(&world, &proxy, &token, vec![granted], (sent, decided_at, validity));
        world.tally(|t| match mode {
            Mode::Read => t.read_holds += 1,
            Mode::Write => t.write_holds += 1,
        });
        let Some(held) = held.into_iter().next() else {
            continue;
        };
        if rng.chance(cfg.faults.client_crash) {
            world.note(|| format!("client rw{id} CRASHES holding {RW_LOCK} ({})", held.id));
            continue;
        }
        sleep(hold_time(&mut rng, held.until)).await;
        world.end_grant(held.id);
        let released = proxy.engine.release_rw(0, &names, bytes(&token)).await;
        world.count_op();
        world.note(|| format!("p{} release {RW_LOCK} {token} -> {released:?}", proxy.index));
        sleep(rng.between(Duration::ZERO, cfg.max_ttl / 4)).await;
    }
}

/// A client of several locks at once: two or three of the lock clients' keys (so a set meets
/// single acquisitions of its keys), taken all or none, held, each released as a lock.
pub async fn multikey_client(world: Arc<World>, proxy: Arc<Proxy>, id: usize, mut rng: super::rng::Rng) {
    let cfg = &world.cfg;
    let mut attempt = 0u64;
    while world.budget_left() {
        let want = if rng.chance(0.5) { 2 } else { 3 }.min(cfg.keys);
        let mut keys: Vec<String> = Vec::new();
        while keys.len() < want {
            let key = format!("lock:{}", rng.index(cfg.keys));
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        // The proxy sorts a set before taking it (one order for every request).
        keys.sort();
        let token = format!("m{id}.{attempt}");
        attempt += 1;
        let ttl = cfg.ttl(&mut rng);
        let sent = world.elapsed();
        world.note(|| format!("p{} acquireall {keys:?} {token} ttl {ttl:?}", proxy.index));
        let set = keys.iter().map(|k| bytes(k)).collect();
        let taken = proxy.engine.acquire_all(0, set, bytes(&token), ttl).await;
        world.count_op();
        let decided_at = Instant::now();
        world.note(|| format!("p{} acquireall {keys:?} {token} -> {taken:?}", proxy.index));
        recover_if_wanted(&proxy);
        let AllFenced::Yes { tokens, validity, .. } = taken else {
            sleep(rng.between(Duration::from_millis(1), cfg.timeout * 2)).await;
            continue;
        };
        let granted = keys
            .iter()
            .zip(tokens)
            .map(|(key, fence)| Granted {
                key: key.clone(),
                fence,
                kind: Kind::Exclusive,
            })
            .collect();
        let held = record(&world, &proxy, &token, granted, (sent, decided_at, validity));
        world.tally(|t| t.lock_sets += 1);
        let Some(until) = held.first().map(|h| h.until) else {
            continue;
        };
        if rng.chance(cfg.faults.client_crash) {
            world.note(|| format!("client m{id} CRASHES holding {keys:?}"));
            continue;
        }
        sleep(hold_time(&mut rng, until)).await;
        // The holder gives every key up at once, then releases them one by one.
        for h in &held {
            world.end_grant(h.id);
        }
        for (key, h) in keys.iter().zip(&held) {
            release(&world, &proxy, key, &token, h).await;
        }
        sleep(rng.between(Duration::ZERO, cfg.max_ttl / 4)).await;
    }
}

/// A campaigner of [`ELECTION`]: campaigns (the fenced acquisition of the election's lock),
/// leads for a while (sometimes dying as leader), resigns (a release of the lock).
pub async fn election_client(world: Arc<World>, proxy: Arc<Proxy>, id: usize, mut rng: super::rng::Rng) {
    let cfg = &world.cfg;
    let key = election_key();
    let mut attempt = 0u64;
    while world.budget_left() {
        let value = format!("e{id}.{attempt}");
        attempt += 1;
        let ttl = cfg.ttl(&mut rng);
        let style = Style {
            fenced: true,
            ..Style::default()
        };
        let campaign = acquire_as(&world, &proxy, &key, &value, ttl, style).await;
        recover_if_wanted(&proxy);
        let Some(held) = campaign.held else {
            sleep(rng.between(Duration::from_millis(1), cfg.timeout * 2)).await;
            continue;
        };
        world.tally(|t| t.leaderships += 1);
        if rng.chance(cfg.faults.client_crash) {
            world.note(|| format!("leader {value} CRASHES ({})", held.id));
            continue;
        }
        sleep(hold_time(&mut rng, held.until)).await;
        release(&world, &proxy, &key, &value, &held).await;
        sleep(rng.between(Duration::ZERO, cfg.max_ttl / 4)).await;
    }
}

/// A reentrant holder of one of the lock clients' keys: takes it with `REENTRANT`, takes it
/// again once or twice (each count-up a new hold placed on a quorum), gives the extra holds
/// back one by one while it goes on believing the lock, then the last. Its belief is one grant
/// in the history, from the first answer to the end of the latest validity a grant or count-up
/// answered (a count-up's answer ends the grant so far and starts the next, so that the
/// history never holds two grants of one holder at once), until the last give-back starts: a
/// give-back that freed the lock early would let a lock client in while it still believes
/// (property 1).
pub async fn reentrant_client(world: Arc<World>, proxy: Arc<Proxy>, id: usize, mut rng: super::rng::Rng) {
    let cfg = &world.cfg;
    let mut attempt = 0u64;
    while world.budget_left() {
        let key = format!("lock:{}", rng.index(cfg.keys));
        let token = format!("re{id}.{attempt}");
        attempt += 1;
        let ttl = cfg.ttl(&mut rng);
        let Some((mut held, mut last)) = take_again(&world, &proxy, &key, &token, ttl, None).await else {
            sleep(rng.between(Duration::from_millis(1), cfg.timeout * 2)).await;
            continue;
        };
        world.tally(|t| t.reentrant_holds += 1);
        let mut holds = 1;
        for _ in 0..1 + rng.index(2) {
            sleep(rng.between(Duration::ZERO, held.until.saturating_duration_since(Instant::now()) / 3)).await;
            if let Some((renewed, fence)) = take_again(&world, &proxy, &key, &token, ttl, Some((&held, last))).await {
                (held, last) = (renewed, fence);
                holds += 1;
                world.tally(|t| t.reentries += 1);
            }
        }
        if rng.chance(cfg.faults.client_crash) {
            world.note(|| format!("client re{id} CRASHES holding {key} ({})", held.id));
            continue;
        }
        for _ in 1..holds {
            sleep(rng.between(Duration::ZERO, held.until.saturating_duration_since(Instant::now()) / 4)).await;
            give_back_one(&world, &proxy, &key, &token).await;
        }
        sleep(hold_time(&mut rng, held.until)).await;
        world.end_grant(held.id);
        give_back_one(&world, &proxy, &key, &token).await;
        sleep(rng.between(Duration::ZERO, cfg.max_ttl / 4)).await;
    }
}

/// A session holder of one of the lock clients' keys (`KEEPALIVE`, rules 16 and 17): takes the
/// lock, then keeps it as the proxy's keeper does, extending it (`Engine::extend_with_holds`,
/// which heals it onto the voting masters that lack it) a third of the TTL apart, or a tenth
/// after a failed extension, for several TTLs across the faults. Each extension a quorum
/// confirmed ends the grant believed so far at its answer and starts the next, to the later of
/// their ends; when no extension comes in time the holder stops believing at the last end. A
/// heal that let a second client in, or an extension believed past what the masters keep,
/// shows as two grants of one key at once (property 1).
pub async fn session_client(world: Arc<World>, proxy: Arc<Proxy>, id: usize, mut rng: super::rng::Rng) {
    let cfg = &world.cfg;
    let mut attempt = 0u64;
    while world.budget_left() {
        let key = format!("lock:{}", rng.index(cfg.keys));
        let token = format!("s{id}.{attempt}");
        attempt += 1;
        let ttl = cfg.ttl(&mut rng);
        let taken = acquire_as(&world, &proxy, &key, &token, ttl, Style::default()).await;
        let Some(mut held) = taken.held else {
            sleep(rng.between(Duration::from_millis(1), cfg.timeout * 2)).await;
            continue;
        };
        world.tally(|t| t.sessions += 1);
        let rounds = 3 + rng.index(6);
        let mut kept = 0;
        while kept < rounds && world.budget_left() {
            let now = Instant::now();
            let wait = (ttl / 3).min(held.until.saturating_duration_since(now) / 2);
            sleep(wait).await;
            let extension = proxy.engine.extend_with_holds(0, bytes(&key), bytes(&token), ttl).await;
            world.count_op();
            let answered = Instant::now();
            match extension.validity {
                Some(validity) => {
                    world.end_grant(held.id);
                    let until = held.until.max(answered + validity);
                    let grant = Grant {
                        key: key.clone(),
                        token: token.clone(),
                        proxy: proxy.index,
                        from: world.at(answered),
                        until: world.at(until),
                    };
                    held = Held {
                        id: world.record_hold(grant, Kind::Exclusive),
                        until,
                    };
                    kept += 1;
                    world.tally(|t| t.session_extensions += 1);
                }
                // Believed until its last end; retried while a retry can still come in time.
                None if answered + ttl / 10 < held.until => {}
                None => break,
            }
        }
        if rng.chance(cfg.faults.client_crash) {
            world.note(|| format!("session s{id} CRASHES holding {key} ({})", held.id));
            continue;
        }
        release(&world, &proxy, &key, &token, &held).await;
        sleep(rng.between(Duration::ZERO, cfg.max_ttl / 4)).await;
    }
}

/// `LOCK.ACQUIRE key token ttl REENTRANT`: the first hold (`before` is `None`), or one more
/// hold of the grant `before` with its last fencing token. Granted: the grant now believed
/// (a count-up ends the one before at its answer and starts another to the later of their
/// ends) and its fencing token (recorded when above the last: a count-up answers the lock's
/// own token, or a higher one where masters had lost the lock).
async fn take_again(
    world: &World,
    proxy: &Arc<Proxy>,
    key: &str,
    token: &str,
    ttl: Duration,
    before: Option<(&Held, u64)>,
) -> Option<(Held, u64)> {
    let sent = world.elapsed();
    world.note(|| format!("p{} reentrant {key} {token} ttl {ttl:?}", proxy.index));
    let taken = proxy.engine.acquire_reentrant(0, bytes(key), bytes(token), ttl).await;
    world.count_op();
    let decided_at = Instant::now();
    world.note(|| format!("p{} reentrant {key} {token} -> {taken:?}", proxy.index));
    recover_if_wanted(proxy);
    let Reentry::Lock(Fenced::Yes {
        token: fence, validity, ..
    }) = taken
    else {
        return None;
    };
    let Some((held, last)) = before else {
        let granted = Granted {
            key: key.into(),
            fence,
            kind: Kind::Exclusive,
        };
        let held = record(world, proxy, token, vec![granted], (sent, decided_at, validity));
        return held.into_iter().next().map(|h| (h, fence));
    };
    let now = Instant::now();
    let until = held.until.max(decided_at + validity);
    if fence > last {
        world.record_fence(Fence {
            key: key.into(),
            token: fence,
            holder: token.into(),
            sent,
            answered: world.at(now),
        });
    }
    world.end_grant(held.id);
    let grant = Grant {
        key: key.into(),
        token: token.into(),
        proxy: proxy.index,
        from: world.at(now),
        until: world.at(until),
    };
    let id = world.record_hold(grant, Kind::Exclusive);
    Some((Held { id, until }, fence.max(last)))
}

/// `LOCK.RELEASE` of a reentrant lock, as the proxy runs it: the give-back script on every
/// master (the lock released where it keeps no extra hold); when a quorum did not release it,
/// the hold the proxy chooses among those reported, removed by name on every master.
async fn give_back_one(world: &World, proxy: &Arc<Proxy>, key: &str, token: &str) {
    let answers = proxy
        .engine
        .release_with(give_back(0, &bytes(key), bytes(token), None))
        .await;
    world.count_op();
    let released = combine(&answers, proxy.engine.quorum());
    if released == Reply::Int(1) {
        world.note(|| format!("p{} give back {key} {token}: released", proxy.index));
        return;
    }
    let reports: Vec<Vec<Bytes>> = answers.iter().filter_map(reported_holds).collect();
    if let Some(hold) = chosen_hold(&reports) {
        let dropped = proxy.engine.drop_hold(0, &bytes(key), bytes(token), hold).await;
        world.note(|| format!("p{} give back {key} {token}: a hold dropped: {dropped:?}", proxy.index));
    }
}
