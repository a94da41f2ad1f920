//! The quorum engine: fan a command out to N masters, decide at a majority, and undo.
//!
//! This is the Redlock algorithm (rules 1–7 of docs/safety-rules.md). It knows nothing of sockets
//! or RESP: it is generic over [`Backend`] and [`Clock`], so unit tests and a
//! deterministic simulation drive it with in-process masters and simulated time.

pub mod combine;
mod error;
pub(crate) mod fanout;
mod fence;
mod legacy;
pub mod observed;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;

pub(crate) use combine::quorum_th_largest;
pub use combine::{Answer, combine, combine_or};
pub use error::{NoQuorum, Unfenced};
pub use fence::{Attempt, EpochCheck, Fenced, FencedLock, LockInfo, Recoverable};
pub use legacy::Legacy;
use legacy::{LegacyTake, LegacyVote, LegacyWrite};

use crate::backend::{Backend, BackendError, Request};
use crate::clock::Clock;
use crate::lua::ScriptCall;
use crate::reply::Reply;
use fanout::{FanOut, Late, OnAnswer};
use observed::Observed;

/// Rule 4's fixed part of the drift allowance, added to `ttl × drift_factor`.
const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// Rule 4's clock drift allowance for a TTL: `ttl × drift_factor + 2 ms`.
pub fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    // Never a panic, whatever the factor: a drift past what a Duration holds is the most.
    Duration::try_from_secs_f64(ttl.as_secs_f64() * drift_factor)
        .unwrap_or(Duration::MAX)
        .saturating_add(DRIFT_FLOOR)
}

/// Rule 2: the majority of `n` masters.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The engine's knobs.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Rule 3: how long one master may take to answer one request.
    pub backend_timeout: Duration,
    /// Rule 4: clock drift allowance as a fraction of the TTL.
    pub drift_factor: f64,
}

/// What an acquisition came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Acquired {
    /// A quorum holds the lock for at least `validity` from now.
    Yes {
        /// Rule 4's `ttl − elapsed − drift`.
        validity: Duration,
        /// Takes this grant back, should it no longer be valid when the reply is written
        /// (rule 4a).
        undo: Undo,
    },
    /// Enough masters answered, but not a quorum granted it in time (or it is held).
    No {
        /// When it can be free at the latest, as far as the answers tell: the moment a quorum
        /// of masters no longer holds it (`None`: they cannot tell).
        free_in: Option<Duration>,
    },
    /// Fewer than a quorum of masters could vote: the service could not decide.
    NoQuorum(NoQuorum),
}

/// How to take back one acquisition attempt, and nothing else (rule 5a): on each master
/// whose reply says the attempt wrote there, the delete that checks the token *and* the
/// expiry that reply read ([`crate::lua::own::UNDO`]); on the masters whose reply is still to
/// come, the same, once it comes and if it says so. A master whose connection breaks first
/// never tells: its key, if any, is left to its TTL (liveness for one TTL, never safety).
#[derive(Clone)]
pub struct Undo {
    /// The lock: database, key, token.
    pub(crate) lock: Lock,
    /// How the masters' replies read.
    pub(crate) kind: Arc<dyn Undoes>,
    /// Each master's answer as the engine read it (`None`: not read yet).
    pub(crate) answers: Vec<Option<Answer>>,
    /// The attempt's fan-out, where the answers not read yet land, in time or late.
    pub(crate) fan_out: Arc<FanOut>,
    /// What the attempt wrote on the legacy member, if a key is bridged there (boxed: every
    /// undo waits in a reply or a session, most without a legacy member).
    pub(crate) legacy: Option<Box<LegacyWrite>>,
}

impl std::fmt::Debug for Undo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Undo")
            .field("lock", &self.lock)
            .field("answers", &self.answers)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Undo {
    /// The same undo: of the same attempt.
    fn eq(&self, other: &Undo) -> bool {
        Arc::ptr_eq(&self.fan_out, &other.fan_out)
    }
}

/// A lock as an acquisition names it on the masters: database, key, token.
pub type Lock = (u32, Bytes, Bytes);

/// What an acquisition writes on each master, and so how its replies are read: the one
/// extension point of the engine. The plain lock ([`Plain`]) and the fenced one
/// ([`fence::FencedLock`]) are here; each recipe implements its own in its `engine.rs`.
/// The engine runs every kind alike (rules 3–5a: `Engine::take`); a kind says only what
/// to send, how a reply votes, how to take back its write and what a refusal told.
pub trait Acquisition: Send + Sync + 'static {
    /// What a refused attempt's answers tell the recipe beyond when the lock can be free (a
    /// semaphore's holders, a read-write lock's conflict); `Infallible` when nothing.
    type Refusal: Send + std::fmt::Debug;

    /// Whether its grants carry fencing counters (F1): the token must then come from a quorum
    /// of trusted ones.
    fn fenced(&self) -> bool {
        true
    }

    /// The operation to run on every master.
    fn op(&self, db: u32, key: &Bytes, token: &Bytes, ttl: Duration) -> Op;

    /// How one master's reply votes. By default the fenced acquisition's: a grant is `{counter,
    /// expiry}` with the bumped counter (≥ 1, trusted), 0 or -1 when it wrote but cannot vouch
    /// for its counter (F3), a refusal `{pttl}`. Anything else (an error reply such as `OOM`,
    /// `NOPERM`, `READONLY`) is no vote at all (rule 5a): a failure, never "held by someone
    /// else".
    fn vote(&self, reply: &Reply) -> Option<Vote> {
        fenced_vote(reply)
    }

    /// Rule 5a: what takes back this attempt's write on the master that gave `answer`, and
    /// nothing else. By default the lock key it wrote, named by the expiry its reply read
    /// ([`ScriptCall::undo`]).
    fn undo(&self, (db, key, token): &Lock, answer: &Answer) -> Option<ScriptCall> {
        let expiry = self.written(answer)?;
        Some(ScriptCall::undo(*db, key.clone(), token.clone(), expiry))
    }

    /// F2: the write-back of the fencing token `fence` for the holder of `key`, on one
    /// master: by default the fenced lock's ([`crate::lua::fence::write_back`]).
    fn write_back(&self, db: u32, key: &Bytes, token: Bytes, fence: u64) -> ScriptCall {
        crate::lua::fence::write_back(db, key, token, fence)
    }

    /// What the answers of a refused attempt tell the recipe (`quorum` of them decide), if
    /// anything.
    fn refusal(&self, _answers: &[Answer], _quorum: usize) -> Option<Self::Refusal> {
        None
    }

    /// The client keys this attempt writes, `key` among them: what a legacy member must also
    /// grant where it bridges them (`quorum::legacy`). By default `key` alone.
    fn keys(&self, key: &Bytes) -> Vec<Bytes> {
        vec![key.clone()]
    }

    /// Whether the attempt may find its own token already holding the lock (a reentrant hold
    /// taken again): only then does a legacy member accept an equal value as this one's.
    fn reenters(&self) -> bool {
        false
    }

    /// Where `answer` says this attempt wrote: the expiry of its write there.
    fn written(&self, answer: &Answer) -> Option<i64> {
        match answer.as_ref().ok().and_then(|r| self.vote(r)) {
            Some(Vote::Granted { expiry, .. }) => Some(expiry),
            _ => None,
        }
    }
}

/// The fenced acquisition's vote (see [`Acquisition::vote`]): `{counter, expiry}` granted,
/// `{pttl}` refused, anything else no vote.
pub fn fenced_vote(reply: &Reply) -> Option<Vote> {
    match reply {
        Reply::Array(answer) => match answer.as_slice() {
            [Reply::Int(_)] => Some(Vote::Refused),
            [Reply::Int(n), Reply::Int(expiry)] if *expiry > 0 => Some(Vote::Granted {
                fence: u64::try_from(*n).ok().filter(|n| *n > 0),
                expiry: *expiry,
            }),
            _ => None,
        },
        _ => None,
    }
}

/// `SET key token NX PX ttl`, in a transaction that reads the master's clock after the write
/// ([`crate::backend::acquire`]): the plain lock, and the hot path.
#[derive(Clone, Copy, Debug)]
pub struct Plain;

/// The one plain acquisition every `SET NX` shares (its undo keeps a reference to it).
static PLAIN: std::sync::LazyLock<Arc<Plain>> = std::sync::LazyLock::new(|| Arc::new(Plain));

impl Acquisition for Plain {
    type Refusal = std::convert::Infallible;

    fn fenced(&self) -> bool {
        false
    }

    fn op(&self, db: u32, key: &Bytes, token: &Bytes, ttl: Duration) -> Op {
        let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        Op::Command(Request::acquisition(db, key.clone(), token.clone(), ttl))
    }

    /// A grant is the expiry of the key written, a refusal nil (the key is held there).
    fn vote(&self, reply: &Reply) -> Option<Vote> {
        match reply {
            Reply::Nil => Some(Vote::Refused),
            reply => plain_expiry(reply).map(|(latest, _)| Vote::Granted {
                fence: None,
                expiry: latest,
            }),
        }
    }

    /// Rule 5a: the key written, named by its expiry, or by the two clock readings around it
    /// where the write shared a transaction ([`crate::backend::acquire::split`]).
    fn undo(&self, (db, key, token): &Lock, answer: &Answer) -> Option<ScriptCall> {
        let (latest, earliest) = plain_expiry(answer.as_ref().ok()?)?;
        Some(if earliest == latest {
            ScriptCall::undo(*db, key.clone(), token.clone(), latest)
        } else {
            ScriptCall::undo_between(*db, key.clone(), token.clone(), earliest, latest)
        })
    }
}

/// The expiry a plain acquisition's write got, as `(latest, earliest)`: one reading, or two
/// around a shared transaction's writes (`{latest, earliest}`); `None` for a refusal or
/// anything that is no write. Rule 5a: this names the write its undo may remove, and nothing
/// else, so anything but a positive expiry, or readings out of order, is no vote at all (a
/// failure, never a grant).
fn plain_expiry(reply: &Reply) -> Option<(i64, i64)> {
    match reply {
        Reply::Int(expiry) if *expiry > 0 => Some((*expiry, *expiry)),
        Reply::Array(readings) => match readings.as_slice() {
            [Reply::Int(latest), Reply::Int(earliest)] if *earliest > 0 && earliest <= latest => {
                Some((*latest, *earliest))
            }
            _ => None,
        },
        _ => None,
    }
}

/// The part of an acquisition its [`Undo`] keeps, without the kind's own types: an undo
/// outlives the attempt (in a reply waiting to be written, in a session).
pub(crate) trait Undoes: Send + Sync {
    /// [`Acquisition::undo`].
    fn undo_call(&self, lock: &Lock, answer: &Answer) -> Option<ScriptCall>;

    /// [`Acquisition::write_back`].
    fn write_back_call(&self, db: u32, key: &Bytes, token: Bytes, fence: u64) -> ScriptCall;
}

impl<A: Acquisition> Undoes for A {
    fn undo_call(&self, lock: &Lock, answer: &Answer) -> Option<ScriptCall> {
        self.undo(lock, answer)
    }

    fn write_back_call(&self, db: u32, key: &Bytes, token: Bytes, fence: u64) -> ScriptCall {
        self.write_back(db, key, token, fence)
    }
}

/// How one master voted on an acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vote {
    /// It holds the lock for us now: with the fencing counter it bumped, if trusted, and the
    /// expiry of the key it wrote (Unix ms on its clock), which names this write (rule 5a).
    Granted { fence: Option<u64>, expiry: i64 },
    /// It wrote nothing (the lock is held there).
    Refused,
}

/// After a refused acquisition: when the lock can be free at the latest, from the masters'
/// answers: a master that refused holds it for the PTTL it reported, one that granted was
/// undone (free now), and one that failed cannot tell. The lock can be taken once a quorum is
/// free: the quorum-th smallest of those times (`None` when that one cannot tell).
fn free_in(answers: &[Answer], quorum: usize) -> Option<Duration> {
    let mut times: Vec<Option<Duration>> = answers
        .iter()
        .map(|answer| match answer {
            Ok(Reply::Array(held)) => match held.as_slice() {
                // A key at PTTL 0 is still there for up to a millisecond (a master expires it
                // once its time has passed): free in 1 ms at the soonest, never "now", which
                // would send a waiter round again at once, in a loop, for that millisecond.
                [Reply::Int(ms)] if *ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs().max(1))),
                // -2: gone already; -1: no TTL, never free by itself.
                [Reply::Int(-2)] => Some(Duration::ZERO),
                _ => None,
            },
            Ok(Reply::Int(_)) => Some(Duration::ZERO),
            _ => None,
        })
        .collect();
    // Unknown (`None`) sorts last.
    times.sort_by_key(|t| t.unwrap_or(Duration::MAX));
    times.get(quorum.checked_sub(1)?).copied().flatten()
}

/// What `Engine::take` came to, for an acquisition whose refusals tell `R`.
#[derive(Debug)]
pub(crate) enum Taken<R> {
    /// A quorum granted (with trusted counters, when fenced) and the lock is valid.
    Yes(Grant),
    /// Held elsewhere, or not valid in time; undone.
    No {
        /// When it can be free at the latest (see [`Acquired::No`]).
        free_in: Option<Duration>,
        /// What the answers told the recipe ([`Acquisition::refusal`]).
        refusal: Option<R>,
    },
    /// Fewer than a quorum could vote; undone.
    NoQuorum(NoQuorum),
    /// A quorum granted the lock, but fewer than a quorum had trusted counters; undone.
    Unfenced {
        /// Grants with a trusted counter.
        trusted: usize,
        /// All masters.
        total: usize,
    },
}

/// An attempt a quorum granted in time: what the recipe needs to vouch for its token (F2) and
/// to take it back.
#[derive(Debug)]
pub struct Grant {
    /// Rule 4's `ttl − elapsed − drift`.
    pub validity: Duration,
    /// The counters of the trusted grants so far.
    pub fences: Vec<u64>,
    /// When the first request went out (rule 4's clock).
    pub start: Duration,
    /// Takes the grant back (rule 4a, and a failed fencing write-back).
    pub undo: Undo,
}

/// What an extension came to: every master's answer, and whether a quorum extended
/// within the validity time (rule 7).
#[derive(Clone, Debug, PartialEq)]
pub struct Extension {
    /// Each master's answer, in configuration order.
    pub answers: Vec<Answer>,
    /// When a quorum succeeded and the new validity is positive: that validity.
    pub validity: Option<Duration>,
    /// The lock is known to be lost, not only unextended: the legacy member answered that
    /// another value holds it, or that it may have lost its keys (`quorum::legacy`).
    pub lost: bool,
}

/// One operation to run on every master.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A plain command.
    Command(Request),
    /// A script, by SHA1 with a fallback to its source.
    Script(ScriptCall),
}

impl Op {
    /// The request to send, and the one to send instead on `NOSCRIPT`.
    fn parts(&self) -> (&Request, Option<&Request>) {
        match self {
            Op::Command(request) => (request, None),
            Op::Script(script) => script.parts(),
        }
    }
}

/// The Redlock engine over a fixed set of masters.
pub struct Engine<B, C> {
    pub(crate) backends: Vec<Arc<B>>,
    /// Every master's index, `0..n`: the targets of a fan-out to all (made once, not per request).
    pub(crate) everyone: Vec<usize>,
    /// Per-master request statistics, in the same order (shared with every fan-out).
    pub(crate) observed: Arc<[Arc<Observed>]>,
    pub(crate) clock: C,
    pub(crate) settings: Settings,
    /// Fencing repairs (F5) under way or recent.
    pub(crate) repairs: Arc<fence::Repairs>,
    /// The legacy member, during a rollout from a single Redis (`quorum::legacy`).
    pub(crate) legacy: Option<Arc<Legacy<B>>>,
}

impl<B: Backend, C: Clock> Engine<B, C> {
    /// An engine over `backends` (independent masters, rule 2), timed by `clock`.
    pub fn new(backends: Vec<B>, clock: C, settings: Settings) -> Engine<B, C> {
        Engine {
            everyone: (0..backends.len()).collect(),
            observed: backends.iter().map(|b| Arc::new(Observed::new(b.name()))).collect(),
            backends: backends.into_iter().map(Arc::new).collect(),
            clock,
            settings,
            repairs: Arc::default(),
            legacy: None,
        }
    }

    /// Request statistics of master `index`.
    pub fn observed(&self, index: usize) -> Option<&Observed> {
        self.observed.get(index).map(|o| &**o)
    }

    /// The masters, in configuration order.
    pub fn backends(&self) -> &[Arc<B>] {
        &self.backends
    }

    /// Rule 2: how many masters must agree.
    pub fn quorum(&self) -> usize {
        quorum(self.backends.len())
    }

    /// Rule 4, the one place validity is computed: `ttl − elapsed − (ttl × drift_factor + 2 ms)`,
    /// or `None` when that is not positive.
    pub fn validity(&self, ttl: Duration, elapsed: Duration) -> Option<Duration> {
        let drift = drift(ttl, self.settings.drift_factor);
        ttl.checked_sub(elapsed)?.checked_sub(drift).filter(|v| !v.is_zero())
    }

    /// Takes the lock `key` with `token` for `ttl` on a majority (rules 3–5).
    ///
    /// Answers as soon as the outcome is certain: a quorum granted within the validity
    /// time, or a quorum can no longer be reached. Masters still answering after a grant
    /// finish in the background; after a refusal, the partial lock is undone on every
    /// master before this returns, so an immediate retry does not trip over it.
    pub fn acquire(&self, db: u32, key: Bytes, token: Bytes, ttl: Duration) -> impl Future<Output = Acquired> + '_ {
        // `map`, not `async`: a layer of its own would hold the arguments again.
        self.take(PLAIN.clone(), db, key, token, ttl).map(|taken| match taken {
            Taken::Yes(Grant { validity, undo, .. }) => Acquired::Yes { validity, undo },
            Taken::No { free_in, .. } => Acquired::No { free_in },
            Taken::Unfenced { .. } => Acquired::No { free_in: None },
            Taken::NoQuorum(e) => Acquired::NoQuorum(e),
        })
    }

    /// Rule 5a: takes back one acquisition attempt where (and only where) its own write is
    /// still in place: on every master whose answer says it wrote, by the expiry it read
    /// there. The answers read so far are undone now (awaited, so that a retry finds no
    /// partial lock); those still to come are undone as they arrive, in time or late.
    pub async fn undo(&self, undo: &Undo) {
        let ops: Vec<(usize, Op)> = undo
            .answers
            .iter()
            .enumerate()
            .filter_map(|(i, answer)| Some((i, Op::Script(undo.kind.undo_call(&undo.lock, answer.as_ref()?)?))))
            .collect();
        undo.fan_out.hand_over(self.undo_on_arrival(undo));
        let masters = async {
            if !ops.is_empty() {
                let ops: Vec<(usize, &Op)> = ops.iter().map(|(i, op)| (*i, op)).collect();
                let fan_out = self.fan_out_each(&ops, self.settings.backend_timeout, None);
                self.collect(&fan_out, ops.len()).await;
            }
        };
        let legacy = async {
            if let Some(write) = &undo.legacy {
                self.undo_legacy_write(write).await;
            }
        };
        futures_util::future::join(masters, legacy).await;
    }

    /// What undoes an attempt on a master whose answer arrives after the engine stopped
    /// reading: the answer, when it says the attempt wrote, names the write (rule 5a), and the
    /// undo goes to that master, behind the write on its connection. Nobody waits for it.
    fn undo_on_arrival(&self, undo: &Undo) -> Late {
        let lock = undo.lock.clone();
        let kind = undo.kind.clone();
        let backends = self.backends.clone();
        Box::new(move |i, answer| {
            if let (Some(op), Some(backend)) = (kind.undo_call(&lock, &answer), backends.get(i)) {
                let (request, fallback) = op.parts();
                backend.start(request, fallback, crate::backend::Place::ignored());
            }
        })
    }

    /// Runs an acquisition on every master (rules 3–5). A fenced one counts towards the
    /// quorum only grants that carry a trusted counter (F1, F3 of `docs/fencing.md`): the
    /// token must come from a quorum of them.
    ///
    /// An `async` block, not an `async fn`: the latter keeps a second copy of its arguments
    /// in its future, and this future is in every acquisition's.
    #[allow(clippy::manual_async_fn, reason = "an `async fn` would hold its arguments twice")]
    ///
    /// `kind` comes shared: the attempt's undo keeps it (`Undo::kind`), so that the plain
    /// acquisition, the hot path, passes one made once ([`PLAIN`]) and allocates nothing for it.
    pub(crate) fn take<A: Acquisition>(
        &self,
        kind: Arc<A>,
        db: u32,
        key: Bytes,
        token: Bytes,
        ttl: Duration,
    ) -> impl Future<Output = Taken<A::Refusal>> + '_ {
        async move {
            let fenced = kind.fenced();
            let op = kind.op(db, &key, &token, ttl);
            // Rule 4: the clock starts before the first send.
            let start = self.clock.now();
            let n = self.backends.len();
            // F5: a fenced grant that cannot vouch for its counter asks for a repair, whether it
            // answers before the decision or after. (Plain acquisitions, the hot path, need no hook.)
            let repairs = fenced.then(|| self.repairs.clone());
            let on_answer = repairs.map(|repairs| -> OnAnswer {
                let kind = kind.clone();
                Box::new(move |answer| {
                    if let Some(Vote::Granted { fence: None, .. }) = answer.as_ref().ok().and_then(|r| kind.vote(r)) {
                        repairs.want(db);
                    }
                })
            });
            // Rule 9: never hold a request longer than the lock's TTL; past it nothing is valid.
            let timeout = self.settings.backend_timeout.min(ttl);
            let fan_out = self.fan_out(&op, timeout, &self.everyone, on_answer);
            // The legacy member's take, beside the masters' and within their deadline: a
            // veto, not a vote (`quorum::legacy`).
            // Boxed, as its vote's wait below: the plain acquisition's future, the hot path,
            // stays as small without a legacy member as it was before one could be set.
            let mut legacy = match &self.legacy {
                Some(_) => self
                    .legacy_take(db, kind.keys(&key), &token, ttl, kind.reenters(), fan_out.deadline())
                    .map(Box::new),
                None => None,
            };
            let deadline = tokio::time::sleep_until(fan_out.deadline());
            tokio::pin!(deadline);
            let q = self.quorum();
            let mut answers: Vec<Option<Answer>> = vec![None; n];
            let (mut granted, mut refused, mut failed) = (0, 0, 0);
            let mut fences = Vec::new();
            let vote = |answer: &Answer| answer.as_ref().ok().and_then(|r| kind.vote(r));
            // No outcome is certain with fewer than a quorum of answers: the record wakes this
            // task only once that many are in (then for each further one), or at the deadline.
            while let Some((i, answer)) = fan_out.next(q, deadline.as_mut()).await {
                match vote(&answer) {
                    Some(Vote::Granted { fence, .. }) => {
                        granted += 1;
                        fences.extend(fence);
                    }
                    Some(Vote::Refused) => refused += 1,
                    None => failed += 1,
                }
                answers[i] = Some(answer);
                let counted = if fenced { fences.len() } else { granted };
                if counted >= q {
                    // The legacy member must hold it too: its refusal or failure is the
                    // attempt's (undone below, on the masters and there).
                    if let Some(take) = &mut legacy {
                        match Box::pin(take.vote()).await {
                            LegacyVote::Granted(_) => {}
                            LegacyVote::Held(_) => {
                                if let Some(l) = &self.legacy {
                                    l.refused_while_granted();
                                }
                                break;
                            }
                            LegacyVote::Failed(_) => break,
                        }
                    }
                    // Rule 4: acquired only if the lock is still valid after the time spent
                    // (the legacy member's answer included).
                    if let Some(validity) = self.validity(ttl, self.clock.now() - start) {
                        // Rule 5a: should the grant be taken back, the masters' answers name
                        // what it wrote; the stragglers' too, as they arrive. Stragglers complete
                        // the record with nobody waiting: more masters holding our key only adds
                        // safety margin; the reply must not wait for them (rule 3).
                        let undo = Undo {
                            lock: (db, key, token),
                            kind,
                            answers,
                            fan_out,
                            legacy: legacy.as_ref().and_then(|take| take.written()).map(Box::new),
                        };
                        return Taken::Yes(Grant {
                            validity,
                            fences,
                            start,
                            undo,
                        });
                    }
                    break;
                }
                let remaining = n - granted - refused - failed;
                // A quorum is out of reach: the outcome is certain.
                if counted + remaining < q && (granted + refused >= q || failed > n - q) {
                    break;
                }
            }
            // Not acquired. What follows (the late answers, the undo) is a future of its own, boxed
            // only here: every acquisition's future, boxed per command by the client's connection,
            // stays small enough for the allocator's fast path (BENCHMARKS.md, "Allocations").
            Box::pin(self.not_taken(kind, (db, key, token), fan_out, answers, (granted, fences), legacy)).await
        }
    }

    /// Rules 5 and 5a for an attempt that was not acquired: waits for the late answers
    /// (within the fan-out's deadline), undoes the attempt, and says why it failed.
    async fn not_taken<A: Acquisition>(
        &self,
        kind: Arc<A>,
        lock: Lock,
        fan_out: Arc<FanOut>,
        mut answers: Vec<Option<Answer>>,
        (granted, fences): (usize, Vec<u64>),
        mut legacy: Option<Box<LegacyTake>>,
    ) -> Taken<A::Refusal> {
        let (n, q) = (self.backends.len(), self.quorum());
        let fenced = kind.fenced();
        let vote = |answer: &Answer| answer.as_ref().ok().and_then(|r| kind.vote(r));
        let deadline = tokio::time::sleep_until(fan_out.deadline());
        tokio::pin!(deadline);
        // Rules 5 and 5a: not acquired, for whatever reason: undo, where the attempt wrote and
        // only there, by the write each master's answer names (never a key with an equal
        // value that another acquisition wrote). The late answers are awaited (within the
        // fan-out's deadline), and every master that wrote is undone before the caller hears
        // nil, so its retry finds no partial lock. A master still silent at the deadline is
        // undone when its answer comes, if it says it wrote: a stalled master costs the
        // caller no second timeout.
        while let Some((i, answer)) = fan_out.next(n, deadline.as_mut()).await {
            answers[i] = Some(answer);
        }
        // The legacy member's answer too (within the same deadline): it is undone with the rest.
        let legacy_vote = match &mut legacy {
            Some(take) => Some(take.vote().await.clone()),
            None => None,
        };
        let undo = Undo {
            lock,
            kind: kind.clone(),
            answers,
            fan_out,
            legacy: None,
        };
        futures_util::future::join(self.undo(&undo), self.legacy_undo(legacy)).await;
        // Masters still silent count as not answered in time.
        let answers: Vec<Answer> = undo
            .answers
            .into_iter()
            .map(|a| a.unwrap_or(Err(BackendError::Pending)))
            .collect();
        let voted = answers.iter().filter(|a| vote(a).is_some()).count();
        // A bridged key: the old code's lock on the legacy member refuses; its silence or error
        // is the failure the client is told of (fail closed).
        match legacy_vote {
            Some(LegacyVote::Held(pttl)) => {
                // Free once both are: the legacy key's PTTL, unless the masters tell of longer
                // (`None`: the old code's key has no TTL, the `SETNX` pattern's).
                let masters = free_in(&answers, q);
                return Taken::No {
                    free_in: pttl.map(|p| masters.map_or(p, |m| m.max(p))),
                    refusal: kind.refusal(&answers, q),
                };
            }
            Some(LegacyVote::Failed(answer)) if voted >= q => {
                return Taken::NoQuorum(self.legacy_failure(&answer));
            }
            Some(LegacyVote::Failed(_) | LegacyVote::Granted(_)) | None => {}
        }
        if voted < q {
            Taken::NoQuorum(NoQuorum::of(&answers, |r| kind.vote(r).is_some()))
        } else if fenced && granted >= q && fences.len() < q {
            Taken::Unfenced {
                trusted: fences.len(),
                total: n,
            }
        } else {
            Taken::No {
                free_in: free_in(&answers, q),
                refusal: kind.refusal(&answers, q),
            }
        }
    }

    /// Rule 7: runs a TTL-setting `op` (an extension, or a conditional write with a TTL) on
    /// every master. `ttl_of` reads, from one master's reply, the TTL it now guarantees when
    /// that master succeeded. The write counts only if a quorum succeeded and the TTL a
    /// quorum guarantees, less the time spent and the drift, is still positive (rule 4).
    pub async fn extend(&self, op: Op, ttl_of: impl Fn(&Reply) -> Option<Duration>) -> Extension {
        let start = self.clock.now();
        let q = self.quorum();
        // More answers can only raise the guaranteed TTL, so a positive validity is final;
        // and a quorum of identical replies fixes the combined reply.
        let answers = self
            .gather(&op, |answers| {
                self.guaranteed_validity(answers, &ttl_of, start).is_some() || quorum_agrees(answers, q)
            })
            .await;
        self.judged(answers, &ttl_of, start)
    }

    /// Rule 7a for a script, whose success values the proxy cannot know: `ttl_of` reads the
    /// TTL its keys have on one master (whether or not the script succeeded there), and
    /// `result_of` the script's own result. Answers once a quorum agrees on the result (the
    /// combined result is then fixed) and either the validity is positive (final) or every
    /// master answered: a validity judged on part of the answers could withhold a success
    /// that the rest would confirm.
    pub async fn probe(
        &self,
        op: Op,
        ttl_of: impl Fn(&Reply) -> Option<Duration>,
        result_of: impl Fn(&Reply) -> Reply,
    ) -> Extension {
        let start = self.clock.now();
        let q = self.quorum();
        let answers = self
            .gather(&op, |answers| {
                let results: Vec<Option<Answer>> = answers
                    .iter()
                    .map(|a| a.as_ref().map(|a| a.as_ref().map(&result_of).map_err(Clone::clone)))
                    .collect();
                let all_in = answers.iter().all(Option::is_some);
                quorum_agrees(&results, q) && (all_in || self.guaranteed_validity(answers, &ttl_of, start).is_some())
            })
            .await;
        self.judged(answers, &ttl_of, start)
    }

    /// Rule 4 on the TTL a quorum guarantees (the quorum-th largest of `ttl_of` over the
    /// answers so far), counted from `start`.
    fn guaranteed_validity(
        &self,
        answers: &[Option<Answer>],
        ttl_of: impl Fn(&Reply) -> Option<Duration>,
        start: Duration,
    ) -> Option<Duration> {
        let ttls = answers
            .iter()
            .flatten()
            .filter_map(|a| a.as_ref().ok().and_then(&ttl_of));
        let ttl = quorum_th_largest(ttls.collect(), self.quorum())?;
        self.validity(ttl, self.clock.now() - start)
    }

    /// The answers of a TTL-setting operation with the validity they guarantee now.
    fn judged(&self, answers: Vec<Answer>, ttl_of: impl Fn(&Reply) -> Option<Duration>, start: Duration) -> Extension {
        let partial: Vec<Option<Answer>> = answers.iter().cloned().map(Some).collect();
        let validity = self.guaranteed_validity(&partial, ttl_of, start);
        Extension {
            answers,
            validity,
            lost: false,
        }
    }

    /// Rules 1, 5 and 6: delete `key` on every master where it still holds `token`.
    pub async fn release(&self, db: u32, key: Bytes, token: Bytes) -> Vec<Answer> {
        self.release_with(ScriptCall::release(db, key, token)).await
    }

    /// [`Engine::release`] by another release script (a reentrant lock's, which gives one
    /// hold back: [`crate::recipes::reentrant::lua::GIVE_BACK`]).
    pub async fn release_with(&self, release: ScriptCall) -> Vec<Answer> {
        self.broadcast(Op::Script(release)).await
    }

    /// `release` (a call of [`ScriptCall::release`] or of another release script) on every
    /// master, with the masters `on` running `announcing` instead: the same release, which
    /// also announces it there where the lock is free afterwards (one request per master in
    /// all). `on` is the caller's choice: every master that is up when somebody is known to
    /// wait, so that a master paused or cut off does not swallow the announcement (a listener
    /// acts on its copies as `crate::proxy::wait` says).
    pub async fn release_announcing(&self, release: ScriptCall, on: &[usize], announcing: ScriptCall) -> Vec<Answer> {
        let n = self.backends.len();
        let release = Op::Script(release);
        let announcing = Op::Script(announcing);
        let ops: Vec<(usize, &Op)> = (0..n)
            .map(|i| (i, if on.contains(&i) { &announcing } else { &release }))
            .collect();
        let fan_out = self.fan_out_each(&ops, self.settings.backend_timeout, None);
        self.collect(&fan_out, n).await
    }

    /// Runs `op` on every master and combines the replies by the majority rule.
    ///
    /// Answers as soon as a quorum of masters gave the same reply: no other reply can then
    /// reach a quorum, and for integers the quorum-th largest value can no longer change
    /// (fewer than a quorum remain), so the combined reply is final. The rest complete the
    /// fan-out with nobody waiting (rule 6: a release still reaches every master).
    pub async fn execute(&self, op: Op) -> Reply {
        let q = self.quorum();
        combine(&self.gather(&op, |answers| quorum_agrees(answers, q)).await, q)
    }

    /// Runs `op` on every master and collects answers until `done` says the outcome is
    /// certain, or all are in. Masters still running then complete the fan-out with nobody
    /// waiting; their place in the result holds [`BackendError::Pending`].
    pub(crate) async fn gather(&self, op: &Op, done: impl Fn(&[Option<Answer>]) -> bool) -> Vec<Answer> {
        self.gather_from(&self.everyone, op, done).await
    }

    /// [`Engine::gather`] from the masters at `targets`; the others' places hold
    /// [`BackendError::Pending`]. Every `done` this engine uses needs a quorum of answers, so
    /// the waiting task is woken only once that many are in.
    pub(crate) async fn gather_from(
        &self,
        targets: &[usize],
        op: &Op,
        done: impl Fn(&[Option<Answer>]) -> bool,
    ) -> Vec<Answer> {
        let fan_out = self.fan_out(op, self.settings.backend_timeout, targets, None);
        let deadline = tokio::time::sleep_until(fan_out.deadline());
        tokio::pin!(deadline);
        let at_least = self.quorum().min(targets.len());
        let mut answers: Vec<Option<Answer>> = vec![None; self.backends.len()];
        while let Some((i, answer)) = fan_out.next(at_least, deadline.as_mut()).await {
            answers[i] = Some(answer);
            if done(&answers) {
                break;
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Err(BackendError::Pending)))
            .collect()
    }

    /// Runs `op` on every master concurrently and collects every answer, each bounded by
    /// the backend timeout (rule 3), in configuration order.
    pub async fn broadcast(&self, op: Op) -> Vec<Answer> {
        let fan_out = self.fan_out(&op, self.settings.backend_timeout, &self.everyone, None);
        self.collect(&fan_out, self.everyone.len()).await
    }

    /// Sends `op` to master `i`; nobody waits for the answer (an announcement). The fan-out's
    /// record takes it, within the backend timeout (rule 3).
    pub fn send_to(&self, i: usize, op: Op) {
        self.fan_out(&op, self.settings.backend_timeout, &[i], None);
    }

    /// Runs `op` on the masters at `targets`, concurrently; their answers in configuration
    /// order.
    pub(crate) async fn broadcast_to(&self, targets: &[usize], op: Op) -> Vec<(usize, Answer)> {
        let fan_out = self.fan_out(&op, self.settings.backend_timeout, targets, None);
        let answers = self.collect(&fan_out, targets.len()).await;
        answers
            .into_iter()
            .enumerate()
            .filter(|(i, _)| targets.contains(i))
            .collect()
    }

    /// Every answer of `fan_out` (`count` of them expected), in configuration order; places
    /// not asked hold [`BackendError::Pending`].
    async fn collect(&self, fan_out: &FanOut, count: usize) -> Vec<Answer> {
        let deadline = tokio::time::sleep_until(fan_out.deadline());
        tokio::pin!(deadline);
        let mut answers = vec![Err(BackendError::Pending); self.backends.len()];
        while let Some((i, answer)) = fan_out.next(count, deadline.as_mut()).await {
            answers[i] = answer;
        }
        answers
    }

    /// Starts `op` on the masters at `targets`; their answers land in the returned record,
    /// bounded by one deadline, `timeout` from now (rule 3).
    fn fan_out(&self, op: &Op, timeout: Duration, targets: &[usize], on_answer: Option<OnAnswer>) -> Arc<FanOut> {
        let n = self.backends.len();
        let fan_out = self.record(timeout, on_answer);
        // A fan-out to every master (every acquisition) skips nobody: no search per master.
        if targets.len() < n {
            for i in (0..n).filter(|i| !targets.contains(i)) {
                fan_out.skip(i);
            }
        }
        for &i in targets {
            self.start_on(&fan_out, i, op);
        }
        fan_out
    }

    /// [`Engine::fan_out`] with an operation of its own per master: `(i, op)` for master `i`.
    fn fan_out_each(&self, ops: &[(usize, &Op)], timeout: Duration, on_answer: Option<OnAnswer>) -> Arc<FanOut> {
        let fan_out = self.record(timeout, on_answer);
        for i in (0..self.backends.len()).filter(|i| !ops.iter().any(|(j, _)| j == i)) {
            fan_out.skip(i);
        }
        for &(i, op) in ops {
            self.start_on(&fan_out, i, op);
        }
        fan_out
    }

    /// A fan-out's record, its deadline `timeout` from now. One clock reading gives every call
    /// its start and the shared rule-3 deadline. It is tokio's clock, so that deadlines and
    /// latencies are simulated time under simulation.
    fn record(&self, timeout: Duration, on_answer: Option<OnAnswer>) -> Arc<FanOut> {
        let deadline = tokio::time::Instant::now() + timeout;
        Arc::new(FanOut::new(
            self.backends.len(),
            deadline,
            self.observed.clone(),
            on_answer,
        ))
    }

    /// Starts `op` on master `i`, its answer to land in `fan_out`.
    fn start_on(&self, fan_out: &Arc<FanOut>, i: usize, op: &Op) {
        if let Some(backend) = self.backends.get(i) {
            let (request, fallback) = op.parts();
            backend.start(request, fallback, FanOut::place(fan_out, i));
        }
    }
}

/// Whether a quorum of the answers so far are the same reply.
fn quorum_agrees(answers: &[Option<Answer>], quorum: usize) -> bool {
    let replies: Vec<&Reply> = answers.iter().flatten().filter_map(|a| a.as_ref().ok()).collect();
    replies
        .iter()
        .any(|r| replies.iter().filter(|o| *o == r).count() >= quorum)
}

/// Rule 3: one master costs at most one timeout.
async fn bounded(timeout: Duration, call: impl Future<Output = Answer>) -> Answer {
    bounded_until(tokio::time::Instant::now() + timeout, call).await
}

/// Rule 3 for calls started together: each has until their shared deadline (start + one
/// timeout), then counts as timed out.
async fn bounded_until(deadline: tokio::time::Instant, call: impl Future<Output = Answer>) -> Answer {
    tokio::time::timeout_at(deadline, call)
        .await
        .unwrap_or(Err(BackendError::Timeout))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fence_tests;
