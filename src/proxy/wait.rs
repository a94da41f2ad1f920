//! Waiting (`... WAIT ms`): waiting in this proxy's per-key FIFO queue
//! ([`crate::waiters`]), and the release announcements that wake waiters in every proxy.
//!
//! A waiting request tries to take the lock only at the head of its queue and only when the
//! lock can have become free:
//! - a release through this proxy (`LOCK.RELEASE`, `DEL`/`UNLINK`, `DELEX`, a script whose
//!   declared keys are gone from a quorum afterwards, the end of a session lock) wakes the
//!   head here at once;
//! - the same releases are announced on the masters (`PUBLISH
//!   redlock-proxy:released:<db>[:<n>] <proxy run id> <next> <ms> <key>`), and every proxy
//!   listens on every master (`PSUBSCRIBE`), so a release through another proxy wakes this
//!   one's head too; a client's own release script is covered the same way, since it runs
//!   through a proxy. A release somebody is known to wait for (a proxy's head was refused and
//!   said so, `waiting`, which goes to every master that is up too) is announced on every
//!   master that is up, numbered (`<n>`, this proxy's count), so that one paused or cut-off
//!   master does not swallow it; each master publishes it in the release's own script where
//!   the lock is free afterwards. A listener acts on it once ([`Heard`]), when copies from a
//!   quorum of masters are in (or a backend timeout after the first), so that its head finds
//!   the lock free on a quorum rather than racing the release. One nobody is known
//!   to wait for is announced on one master, in turn (for a head whose `waiting` crossed the
//!   release: the masters' cost stays one `PUBLISH` per release);
//! - the holder's TTL running out: a refusal tells, in the same round trip, how long each
//!   master still holds the lock (the fenced acquisition script, which waiting requests use,
//!   answers `{pttl}` when the key is held); the head tries again once a quorum's copies can have expired.
//!
//! `SEM.ACQUIRE ... WAIT ms` waits the same way, in one queue per semaphore (named by its base,
//! `crate::recipes::semaphore::Names::base`): a release or the expiry of any of its slots gives the turn,
//! and after a grant the next in line tries at once (another permit may be free).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::backend::Request;
use crate::backend::health::State;
use crate::metrics as m;
use crate::quorum::Op;
use crate::reply::Reply;
use crate::waiters::{Next, Turn};

use super::{Outcome, Proxy, request};

/// The channel prefix of release announcements; the database number follows.
const RELEASED: &str = "redlock-proxy:released:";

/// The channel prefix of waiting announcements (a proxy's queue head was refused); the
/// database number follows.
const WAITING: &str = "redlock-proxy:waiting:";

/// The channel prefix of signal announcements (a script pushed to a list); the database
/// number follows.
const SIGNALLED: &str = "redlock-proxy:signalled:";

/// How many numbered release announcements a proxy remembers, to act on each once although
/// every master that is up carries it: copies of one announcement come within a round trip
/// of each other, except from a master that was paused or cut off, whose copy comes when it
/// is back; by then more than this many may have gone by, and the copy wakes a head for
/// nothing (it tries once, is refused, and waits again).
const HEARD: usize = 16 * 1024;

/// The numbered release announcements heard lately ([`HEARD`] of them), by a hash of channel
/// and message: from which masters, and whether acted on.
#[derive(Default)]
pub(crate) struct Heard {
    hashing: std::collections::hash_map::RandomState,
    copies: std::collections::HashMap<u64, Copies>,
    order: std::collections::VecDeque<u64>,
}

/// One numbered announcement's copies so far.
#[derive(Default)]
struct Copies {
    /// The masters it came from (bit `i`: member `i`; members past 63 share bit 63).
    masters: u64,
    acted: bool,
}

/// What a copy of a numbered announcement calls for ([`Heard::copy`]).
enum Copy {
    /// Act on it now.
    Act,
    /// The first copy, not enough yet: act when the others come, or after a backend timeout
    /// ([`Heard::overdue`]).
    First,
    /// Nothing (acted on already, or waiting for more).
    Nothing,
}

impl Heard {
    /// The hash an announcement (`channel`, `message`) is remembered by.
    fn hash(&self, channel: &[u8], message: &[u8]) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = self.hashing.build_hasher();
        hasher.write(channel);
        hasher.write(message);
        hasher.finish()
    }

    /// A copy of the announcement `hash` came from master `master`: act on it now, which is
    /// once, when copies from `needed` masters are in.
    fn copy(&mut self, hash: u64, master: usize, needed: usize) -> Copy {
        let first = !self.copies.contains_key(&hash);
        if first {
            self.order.push_back(hash);
            if self.order.len() > HEARD
                && let Some(oldest) = self.order.pop_front()
            {
                self.copies.remove(&oldest);
            }
        }
        let copies = self.copies.entry(hash).or_default();
        if copies.acted {
            return Copy::Nothing;
        }
        copies.masters |= 1 << master.min(63);
        copies.acted = copies.masters.count_ones() as usize >= needed;
        match (copies.acted, first) {
            (true, _) => Copy::Act,
            (false, true) => Copy::First,
            (false, false) => Copy::Nothing,
        }
    }

    /// The announcement `hash`, whose first copy came a backend timeout ago: whether it is to
    /// be acted on now (it was not yet); it is then marked acted on.
    fn overdue(&mut self, hash: u64) -> bool {
        match self.copies.get_mut(&hash) {
            Some(copies) if !copies.acted => {
                copies.acted = true;
                true
            }
            _ => false,
        }
    }
}

/// The queue a release of `key` is announced and queued under: a semaphore slot's semaphore
/// (its waiters wait for any slot), a read-write lock's hold's lock, any other key itself.
/// Every release comes here: a prefix test for a lock's key (each recipe names its own lines:
/// `command::Call::queue_of`).
pub(crate) fn queue_key(key: &Bytes) -> Bytes {
    crate::command::recipe::queue_of(key)
}

/// The least a refused head waits before it tries again.
const RETRY_FLOOR: Duration = Duration::from_millis(1);

/// What a queue waits for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Line {
    /// A lock of this TTL: one holder, so after a grant the next in line waits for its
    /// release (or its TTL) before it tries.
    Lock {
        /// The TTL asked for.
        ttl: Duration,
    },
    /// A semaphore of `permits` (its queue is its base name): after a grant the next in line
    /// tries at once when this proxy believes another permit may be free, else it waits for a
    /// release as a lock's does.
    Permits { permits: u32 },
    /// A hold many may have at once (a read-write lock's reader): after a grant the next in
    /// line tries at once.
    Shared,
}

impl Proxy {
    /// Waits in this proxy's queue `queue` (a lock's key, or a semaphore's base name) for up
    /// to `wait`: the head of the queue tries (`try_once`: one acquisition, its outcome and
    /// when the refusing masters said the lock can be free) at once and whenever it may
    /// succeed; the others wait for their turn. The grant as soon as this request gets it,
    /// nil when `wait` has passed first (or the client went away: `closed`).
    pub(crate) async fn wait_in_line<F>(
        &self,
        db: u32,
        queue: &Bytes,
        line: Line,
        wait: Duration,
        closed: watch::Receiver<bool>,
        try_once: impl Fn() -> F,
    ) -> Outcome
    where
        F: Future<Output = (Outcome, Option<Duration>)>,
    {
        self.wait_in_line_waking(db, queue, &[], line, wait, closed, try_once)
            .await
    }

    /// [`Proxy::wait_in_line`], the head also woken by a release of any key of `also`
    /// through any proxy (several locks at once wait in their first key's queue: a release
    /// of another key of the set can make the whole set free).
    #[allow(clippy::too_many_arguments, reason = "wait_in_line's, and the keys that also wake")]
    pub(crate) async fn wait_in_line_waking<F>(
        &self,
        db: u32,
        queue: &Bytes,
        also: &[Bytes],
        line: Line,
        wait: Duration,
        mut closed: watch::Receiver<bool>,
        try_once: impl Fn() -> F,
    ) -> Outcome
    where
        F: Future<Output = (Outcome, Option<Duration>)>,
    {
        let started = Instant::now();
        // `WAIT` is the client's number: a deadline past what the clock can hold is "for
        // ever" (a century), never an overflow.
        let deadline = started
            .checked_add(wait)
            .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 24 * 3600));
        // A request refused a place in the queue did not wait: it is counted among the
        // commands (`error`), not the waits.
        let ticket = match self.waiters.enqueue(db, queue, deadline) {
            Ok(ticket) => ticket,
            Err(e) => return Reply::from(e).into(),
        };
        // Every end of a wait is timed, with how it ended (the labelled key costs an
        // allocation: only when the metrics are exported).
        let answer = |outcome: Outcome, how: &'static str| {
            if self.config.metrics_listen.is_some() {
                metrics::histogram!(m::WAIT_SECONDS, "outcome" => how).record(started.elapsed().as_secs_f64());
            }
            outcome
        };
        // The head tries at once; the others when their turn comes.
        let mut waited = false;
        // The service could not decide (`-NOQUORUM`): tried again after a backend timeout, and
        // answered if it still cannot at the deadline (a wait does not hide an outage).
        let mut unavailable: Option<Outcome> = None;
        loop {
            // Listening before the try: a release while it runs wakes the next round.
            let mut sleepers: Vec<_> = also.iter().map(|key| self.signals.wait(db, key)).collect();
            let mut retry_at = deadline;
            let head = ticket.is_head();
            if let Some(ttl) = ticket.after_grant().filter(|_| head) {
                // The request before this one just got the lock for `ttl`: wait for its
                // release, or for that TTL to run out (no command to the masters).
                retry_at = (Instant::now() + ttl).min(deadline);
            } else if head {
                // Each try is one quorum round (a semaphore's, one per slot tried), timed as
                // an acquisition: the time between tries is waiting, not the masters' latency.
                let round = Instant::now();
                let (outcome, free_in) = try_once().await;
                metrics::histogram!(m::ACQUIRE_SECONDS).record(round.elapsed().as_secs_f64());
                match &outcome.reply {
                    Reply::Int(_) | Reply::Array(_) => {
                        if waited {
                            metrics::counter!(m::HANDOFFS).increment(1);
                        }
                        match line {
                            Line::Lock { ttl } => ticket.granted(ttl),
                            Line::Permits { permits } => match self.semaphores.all_busy_for(db, queue, permits) {
                                Some(free_in) => ticket.granted(free_in),
                                None => ticket.granted_permit(),
                            },
                            Line::Shared => ticket.granted_permit(),
                        }
                        return answer(outcome, "acquired");
                    }
                    Reply::Nil => {
                        unavailable = None;
                        // A release through any proxy should give this one its turn.
                        self.announce_waiting(db, queue);
                        // The refusal told how long a quorum still holds the lock; when it
                        // could not (masters without an answer), a lock's TTL is read; a
                        // semaphore is tried again after a backend timeout.
                        let free_at = match (free_in, line) {
                            (Some(free_in), _) => Instant::now() + free_in,
                            (None, Line::Lock { .. }) => self.held_until(db, queue).await,
                            (None, Line::Permits { .. } | Line::Shared) => {
                                Instant::now() + self.config.backend_timeout()
                            }
                        };
                        // Never again at once: a refusal whose masters are free "now" (an
                        // attempt granted and undone, its validity spent) would otherwise
                        // send the head round in a loop for as long as it waits.
                        retry_at = free_at.max(Instant::now() + RETRY_FLOOR).min(deadline);
                    }
                    reply if reply.is_error_code("NOQUORUM") => {
                        retry_at = (Instant::now() + self.config.backend_timeout()).min(deadline);
                        unavailable = Some(outcome);
                    }
                    // Any other answer (a bad TTL, an internal error) is final.
                    _ => return answer(outcome, "error"),
                }
            }
            if Instant::now() >= deadline {
                return match unavailable {
                    Some(outcome) => answer(outcome, "noquorum"),
                    None => answer(Reply::Nil.into(), "timeout"),
                };
            }
            tokio::select! {
                () = ticket.woken() => {}
                () = sleep_until(retry_at) => {}
                () = any_woken(&mut sleepers) => {}
                _ = closed.wait_for(|closed| *closed) => return answer(Reply::Nil.into(), "disconnected"),
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

    /// The lock `key` was released through this proxy (by a command that cannot carry the
    /// announcement itself): the next turn is given, and every other proxy hears of it
    /// through the masters (one `PUBLISH`).
    pub fn announce_release(&self, db: u32, key: &Bytes) {
        self.signals.signal(db, key);
        self.election_changed(db, key);
        self.pass_turn(db, key);
    }

    /// Gives the next turn for `key` (its queue: a semaphore slot's is its semaphore's) and
    /// tells the other proxies (a `PUBLISH` on one master, on every master that is up when
    /// somebody is known to wait).
    fn pass_turn(&self, db: u32, key: &Bytes) {
        let queue = queue_key(key);
        let chosen = Instant::now();
        let turn = self.waiters.choose(db, &queue);
        self.waiters.give(db, &queue, &turn, chosen);
        if let Some((on, channel, message)) = self.release_announcement(db, key, &turn) {
            self.publish_all(&on, &channel, &message);
        }
    }

    /// After a release of `key` through this proxy: the turn, chosen at `chosen` (before the
    /// release was sent: the release announced it), is given (the head here wakes when it is
    /// this proxy's; a semaphore slot's turn is its semaphore's queue's), and clients blocked
    /// on a signal list of that name wake.
    pub(crate) fn released(&self, db: u32, key: &Bytes, turn: &Turn, chosen: Instant) {
        self.waiters.give(db, &queue_key(key), turn, chosen);
        self.signals.signal(db, key);
        self.election_changed(db, key);
    }

    /// The announcement of a release of `key` through this proxy that gives `turn`: the
    /// masters to publish it on (every master that is up when the turn is somebody's, else one
    /// that is up, taken in turn: [`Proxy::announcers`]), the channel and the message
    /// `<this proxy's run id> <next: a run id or *> <ms its waiters still wait> <key>`; `None`
    /// when nothing is announced (embedded masters, or none up).
    pub(crate) fn release_announcement(&self, db: u32, key: &Bytes, turn: &Turn) -> Option<(Vec<usize>, Bytes, Bytes)> {
        let on = self.announcers(!matches!(turn, Turn::Anyone));
        if on.is_empty() {
            return None;
        }
        let (channel, message) = self.release_message(db, key, turn, on.len() > 1);
        Some((on, channel, message))
    }

    /// The channel and the message of [`Proxy::release_announcement`], for the masters the
    /// caller chose (several releases announced at once: `LOCK.RELEASEALL`). `numbered`: the
    /// announcement goes to several masters, and its channel carries this proxy's count of
    /// them, so that a listener acts on one copy ([`Heard`]).
    pub(crate) fn release_message(&self, db: u32, key: &Bytes, turn: &Turn, numbered: bool) -> (Bytes, Bytes) {
        let next: &[u8] = match turn {
            Turn::Here => self.run_id.as_bytes(),
            Turn::To(proxy) => proxy,
            Turn::Anyone => b"*",
        };
        // A semaphore slot's release names the slot (other proxies learn that it is free) and
        // its semaphore's waiters.
        let waiting = self.waiters.waiting_for(db, &queue_key(key)).as_millis().to_string();
        let message = [self.run_id.as_bytes(), next, waiting.as_bytes(), key].join(&b' ');
        let channel = if numbered {
            let n = self.released_count.fetch_add(1, Ordering::Relaxed);
            format!("{RELEASED}{db}:{n}")
        } else {
            format!("{RELEASED}{db}")
        };
        (Bytes::from(channel), Bytes::from(message))
    }

    /// The head of this proxy's queue for `key` was refused while the lock is held: the
    /// other proxies learn that requests wait here (so that a release gives this proxy its
    /// turn, announced on every master that is up), for as long as they will wait. On every
    /// master that is up itself: lost with one master, the release would be announced on one
    /// master only, which may be that one (its copies are idempotent: each says the same).
    fn announce_waiting(&self, db: u32, key: &Bytes) {
        let waiting = self.waiters.waiting_for(db, key).as_millis().to_string();
        let message = Bytes::from([self.run_id.as_bytes(), waiting.as_bytes(), key].join(&b' '));
        let channel = Bytes::from(format!("{WAITING}{db}"));
        self.publish_all(&self.announcers(true), &channel, &message);
    }

    /// A script pushed to `key` through this proxy (a wake-up signal list): a client blocked
    /// in `BLPOP` on it wakes, here and in every other proxy.
    pub fn announce_signal(&self, db: u32, key: &Bytes) {
        self.signals.signal(db, key);
        let message = [self.run_id.as_bytes(), key].join(&b' ');
        if let Some(i) = self.announcer() {
            self.publish_on(i, Bytes::from(format!("{SIGNALLED}{db}")), Bytes::from(message));
        }
    }

    /// The master that carries the next announcement nobody is known to wait for: every proxy
    /// listens on every master, so one master that is up is enough, taken from the masters in
    /// turn. Should it be lost, waiters elsewhere still wake when the holder's TTL runs out.
    /// `None` without real masters (nobody else listens) or with none up.
    pub(crate) fn announcer(&self) -> Option<usize> {
        if !self.announces {
            return None;
        }
        let backends = self.engine.backends();
        let first = self.announcements.fetch_add(1, Ordering::Relaxed);
        (0..backends.len())
            .map(|i| (first + i) % backends.len())
            .find(|&i| backends[i].state() == State::Up)
    }

    /// The masters that carry an announcement: with `everywhere` (somebody is known to wait
    /// for it), every master that is up, so that it reaches the waiters whenever a majority
    /// is reachable, whichever master was just paused or cut off; else [`Proxy::announcer`]'s
    /// one. None without real masters.
    pub(crate) fn announcers(&self, everywhere: bool) -> Vec<usize> {
        if !everywhere {
            return self.announcer().into_iter().collect();
        }
        if !self.announces {
            return Vec::new();
        }
        let backends = self.engine.backends();
        (0..backends.len())
            .filter(|&i| backends[i].state() == State::Up)
            .collect()
    }

    /// `PUBLISH channel message` on master `i`, not awaited.
    pub(crate) fn publish_on(&self, i: usize, channel: Bytes, message: Bytes) {
        let publish = Request::new(0, vec![Bytes::from_static(b"PUBLISH"), channel, message]);
        self.engine.send_to(i, Op::Command(publish));
    }

    /// [`Proxy::publish_on`] on each of the masters `on`.
    pub(crate) fn publish_all(&self, on: &[usize], channel: &Bytes, message: &Bytes) {
        for &i in on {
            self.publish_on(i, channel.clone(), message.clone());
        }
    }

    /// Listens on every real master for the announcements of every proxy (its own are
    /// ignored) and acts on them.
    pub(crate) fn listen_for_releases(self: &Arc<Self>) {
        for (i, backend) in self.engine.backends().iter().enumerate() {
            let Some(target) = backend.subscription_target() else {
                continue;
            };
            let (alive, heard) = (Arc::downgrade(self), Arc::downgrade(self));
            tokio::spawn(crate::backend::subscriber::run(
                target,
                "redlock-proxy:*",
                move || alive.strong_count() > 0,
                move |channel, message| on_announcement(&heard, i, channel, &message),
            ));
        }
    }
}

/// Resolves when any of `sleepers` is woken; never without any.
async fn any_woken(sleepers: &mut [crate::waiters::Sleeper]) {
    if sleepers.is_empty() {
        return std::future::pending().await;
    }
    let woken = sleepers
        .iter_mut()
        .map(|s| Box::pin(async move { (&mut s.woken).await.ok() }));
    futures_util::future::select_all(woken).await;
}

/// One announcement, on `redlock-proxy:<kind>:<db>`, from the proxy whose run id starts the
/// message (a proxy's own are ignored: it acted on them when it made them):
/// - `released`: `<from> <next> <waiting ms> <key>`: the lock was released; `next` (a run id,
///   or `*`) has the turn; `from` still has waiters for that long. On
///   `redlock-proxy:released:<db>:<n>` it was published on several masters: acted on once;
/// - `waiting`: `<from> <waiting ms> <key>`: requests wait for the lock at `from`;
/// - `signalled`: `<from> <key>`: a script pushed to a signal list;
/// - `leader`: `<from> <key>`: an election's lock was granted or released (`super::election`).
fn on_announcement(proxy: &Weak<Proxy>, master: usize, channel: &[u8], message: &Bytes) {
    let Some(proxy) = proxy.upgrade() else { return };
    let Some(rest) = channel.strip_prefix(b"redlock-proxy:") else {
        return;
    };
    let mut names = rest.split(|&b| b == b':');
    let (Some(kind), Some(db), numbered, None) = (names.next(), names.next(), names.next(), names.next()) else {
        return;
    };
    let Some(db) = std::str::from_utf8(db).ok().and_then(|db| db.parse::<u32>().ok()) else {
        return;
    };
    let (kind, fields) = match kind {
        b"released" => (Kind::Released, 3),
        b"waiting" => (Kind::Waiting, 2),
        b"signalled" => (Kind::Signalled, 1),
        b"leader" => (Kind::Leader, 1),
        _ => return,
    };
    // The key comes last: it may hold spaces.
    let mut parts = Vec::with_capacity(fields);
    let mut rest = message.clone();
    for _ in 0..fields {
        let Some(space) = rest.iter().position(|&b| b == b' ') else {
            return;
        };
        parts.push(rest.slice(..space));
        rest = rest.slice(space + 1..);
    }
    let key = rest;
    if parts.first().is_none_or(|from| from == proxy.run_id.as_bytes()) {
        return;
    }
    // Every master that is up carries a numbered announcement, each where the lock is free
    // after the release there: it is acted on once, when copies from a quorum of masters are
    // in, so that what it sets off finds the lock gone from a quorum rather than racing the
    // release on masters it has not reached yet (a head given the turn takes it; the keeper
    // of a session lock here checks it and is refused). When they do not all come within a
    // backend timeout (a master paused, or cut off from this proxy or from the releasing
    // one), the release has reached what it will reach by then, and it is acted on all the
    // same: never the holder's TTL.
    if numbered.is_some() {
        let needed = proxy.engine.quorum();
        let copy = {
            let mut heard = proxy.heard.lock().unwrap_or_else(|e| e.into_inner());
            let hash = heard.hash(channel, message);
            (hash, heard.copy(hash, master, needed))
        };
        match copy {
            (_, Copy::Act) => {}
            (hash, Copy::First) => {
                let (weak, timeout) = (Arc::downgrade(&proxy), proxy.config.backend_timeout());
                tokio::spawn(async move {
                    tokio::time::sleep(timeout).await;
                    let Some(proxy) = weak.upgrade() else { return };
                    let overdue = proxy.heard.lock().unwrap_or_else(|e| e.into_inner()).overdue(hash);
                    if overdue {
                        act(&proxy, kind, db, &parts, &key);
                    }
                });
                return;
            }
            (_, Copy::Nothing) => return,
        }
    }
    act(&proxy, kind, db, &parts, &key);
}

/// What an announcement is about (see [`on_announcement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Released,
    Waiting,
    Signalled,
    Leader,
}

/// Acts on an announcement of `kind` about `key` in `db`, its fields `parts` (the first is
/// the announcing proxy's run id).
fn act(proxy: &Proxy, kind: Kind, db: u32, parts: &[Bytes], key: &Bytes) {
    let field = |i: usize| parts.get(i).cloned().unwrap_or_default();
    let waiting = |field: &Bytes| {
        let ms = std::str::from_utf8(field).ok().and_then(|ms| ms.parse::<u64>().ok());
        Duration::from_millis(ms.unwrap_or(0))
    };
    let from = field(0);
    match kind {
        Kind::Released => {
            let named = field(1);
            let next = match &named[..] {
                b"*" => Next::Anyone,
                id if id == proxy.run_id.as_bytes() => Next::Me,
                id => Next::Other(id),
            };
            proxy.signals.signal(db, key);
            // An election's lock: its observers here read the leader again.
            proxy.elections.changed(db, key);
            // A session lock kept here: its keeper checks it at once (rule 16).
            proxy.sessions.released_elsewhere(db, key);
            // A semaphore slot's release: free, and its semaphore's queue has the turn.
            proxy.permit_released(db, key);
            if matches!(next, Next::Other(_)) {
                // Its turn went to another proxy, which is taking it.
                proxy.permit_handed_over(db, key);
            }
            if !proxy
                .waiters
                .released_elsewhere(db, &queue_key(key), &from, next, waiting(&field(2)))
            {
                // The turn came here, but nobody waits any more: passed on.
                proxy.pass_turn(db, key);
            }
        }
        Kind::Waiting => proxy.waiters.waiting_elsewhere(db, key, &from, waiting(&field(1))),
        Kind::Leader => proxy.elections.changed(db, key),
        Kind::Signalled => proxy.signals.signal(db, key),
    }
}

impl Proxy {
    /// Whether `key` is a lock library's signal list (`signal_lists`).
    fn is_signal_list(&self, key: &[u8]) -> bool {
        self.config
            .signal_lists
            .iter()
            .any(|pattern| crate::glob::matches(pattern.as_bytes(), key))
    }

    /// `BLPOP key [key ...] timeout`, for libraries that wait on a signal list their release
    /// script fills (python-redis-lock): a signal already on a master answers at once;
    /// otherwise the client sleeps until a script pushes to one of the keys through any proxy
    /// (or a lock of that name is released), or the timeout. The answer is `[key, value]` or
    /// nil, as Redis's; it is a wake-up, never a grant: the client then takes the lock with the
    /// quorum `SET NX` as usual.
    ///
    /// Only on signal lists (`signal_lists`): the element answered is a signal, not always one
    /// that was pushed, and a list is not served through a majority (an element popped on some
    /// masters and not others is lost or returned twice), so any other key is refused before
    /// anything is sent.
    pub(crate) async fn blpop(
        &self,
        db: u32,
        keys: Vec<Bytes>,
        timeout: Option<Duration>,
        mut closed: watch::Receiver<bool>,
    ) -> Outcome {
        if let Some(key) = keys.iter().find(|k| !self.is_signal_list(k)) {
            return Reply::error(format!(
                "ERR BLPOP through the proxy waits only on lock signal lists (keys matching signal_lists: {}), \
                 not '{}': lists are not served through a majority",
                self.config.signal_lists.join(" "),
                String::from_utf8_lossy(key)
            ))
            .into();
        }
        let sleepers: Vec<_> = keys.iter().map(|key| self.signals.wait(db, key)).collect();
        for key in &keys {
            // The client went away: nothing more is sent on its behalf.
            if *closed.borrow() {
                return Reply::NilArray.into();
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_queued_under_its_recipe_s_key() {
        let names = crate::recipes::semaphore::Names::of(b"a:1");
        assert_eq!(&queue_key(&names.slot(12)), names.base());
        let rw = crate::recipes::rwlock::Names::of(b"d");
        assert_eq!(&queue_key(&rw.writer()), rw.base());
        let lock = Bytes::from_static(b"lock:1");
        assert_eq!(queue_key(&lock), lock);
    }

    use super::{Copy, HEARD, Heard};

    /// Every master that is up carries a numbered announcement: it is acted on once, however
    /// many copies come (here needing one).
    #[test]
    fn a_numbered_announcement_is_acted_on_once() {
        let mut heard = Heard::default();
        let hash = heard.hash(b"redlock-proxy:released:0:7", b"a * 0 k");
        assert!(matches!(heard.copy(hash, 0, 1), Copy::Act));
        assert!(matches!(heard.copy(hash, 1, 1), Copy::Nothing));
        assert!(matches!(heard.copy(hash, 2, 1), Copy::Nothing));
        assert!(!heard.overdue(hash));
        // Another release, same key and fields: another number, acted on.
        let other = heard.hash(b"redlock-proxy:released:0:8", b"a * 0 k");
        assert!(matches!(heard.copy(other, 1, 1), Copy::Act));
    }

    /// A numbered announcement is acted on once copies from a quorum of masters are in (the
    /// lock is then free on a quorum), or a backend timeout after the first copy when the
    /// others do not come (a master paused or cut off), and only once either way.
    #[test]
    fn an_announcement_waits_for_a_quorum_of_copies_or_a_timeout() {
        let mut heard = Heard::default();
        let hash = heard.hash(b"redlock-proxy:released:0:1", b"a b 0 k");
        assert!(matches!(heard.copy(hash, 2, 3), Copy::First));
        assert!(
            matches!(heard.copy(hash, 2, 3), Copy::Nothing),
            "the same master twice counts once"
        );
        assert!(matches!(heard.copy(hash, 0, 3), Copy::Nothing));
        assert!(matches!(heard.copy(hash, 4, 3), Copy::Act));
        assert!(!heard.overdue(hash), "acted on already");
        assert!(matches!(heard.copy(hash, 1, 3), Copy::Nothing));
        let late = heard.hash(b"redlock-proxy:released:0:2", b"a b 0 k");
        assert!(matches!(heard.copy(late, 0, 3), Copy::First));
        assert!(heard.overdue(late));
        assert!(!heard.overdue(late));
        assert!(matches!(heard.copy(late, 1, 3), Copy::Nothing));
    }

    /// What is remembered is bounded: the oldest announcements are forgotten first.
    #[test]
    fn heard_announcements_are_bounded() {
        let mut heard = Heard::default();
        let first = heard.hash(b"c", b"0");
        assert!(matches!(heard.copy(first, 0, 1), Copy::Act));
        for n in 1..=HEARD {
            let hash = heard.hash(b"c", n.to_string().as_bytes());
            assert!(matches!(heard.copy(hash, 0, 1), Copy::Act));
        }
        assert_eq!(heard.copies.len(), HEARD);
        assert_eq!(heard.order.len(), HEARD);
        // Forgotten: a copy that late is acted on again (a head woken for nothing).
        assert!(matches!(heard.copy(first, 1, 1), Copy::Act));
    }
}
