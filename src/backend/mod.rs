//! The masters the proxy fans out to, behind one trait.
//!
//! [`Backend`] is the seam that keeps the quorum engine free of sockets: real Redis masters
//! ([`redis::RedisBackend`]) and the in-process store ([`embedded::EmbeddedBackend`], for trying
//! the proxy out and for tests) implement it the same way.

pub mod acquire;
pub mod cluster;
mod decode;
pub mod embedded;
pub mod health;
pub mod identity;
pub mod locate;
mod pipeline;
pub mod redis;
pub mod subscriber;
pub mod url;
pub mod wall_clock;

use std::future::Future;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::reply::Reply;
use crate::wire::ttl_text;

/// One command for one master: the database it runs in, and its arguments, name first.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// The logical database (`SELECT n`) the command runs in.
    pub db: u32,
    /// The command name followed by its arguments, exactly as sent to Redis.
    pub args: Vec<Bytes>,
    /// An owner-checked delete (rules 5 and 6: undo, release). Sent even to a master marked
    /// down, over its connection if one is still open: a master that was only slow or paused
    /// executes it after the `SET` it follows, instead of keeping a partial lock until its TTL.
    pub cleanup: bool,
    /// A read of the proxy's own bookkeeping (the fencing epoch, F4): answered also by a
    /// quarantined master, which votes on nothing but can say what it holds. Only for reads
    /// whose answer is about the master's own data, never a vote on a lock.
    pub inspect: bool,
    /// Rule 15: the reply carries the master's `TIME` (`{reply, {seconds, microseconds}}`, see
    /// [`split_time`]), read after the command ran. The backend judges that reading before it
    /// hands the reply on: an acquisition's vote from a master whose clock jumped ahead (and
    /// may have expired the lock it now grants) is no vote.
    pub timed: bool,
    /// How it goes on the wire: one command, or a plain acquisition's transaction.
    pub form: Form,
    /// The RESP encoding, made once and shared by every master the request goes to.
    encoded: OnceLock<Bytes>,
}

/// How a request goes on the wire, and how many replies make its one answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// One command, one reply.
    One,
    /// A plain acquisition: `args` is its `SET key token NX PX ttl`, sent in a transaction
    /// with `TIME`, whose replies fold into one ([`acquire`]).
    Acquisition {
        /// The TTL written: with the time the write was made, when the key expires.
        ttl_ms: u64,
    },
}

impl Form {
    /// How many replies the master sends.
    pub fn replies(self) -> usize {
        match self {
            Form::One => 1,
            Form::Acquisition { .. } => acquire::REPLIES,
        }
    }

    /// The one answer made of the replies: the last (`last`), and the first error reply
    /// among those before it (`error`: a transaction's command refused when queued).
    pub fn fold(self, error: Option<Reply>, last: Reply) -> Reply {
        match self {
            Form::One => last,
            Form::Acquisition { ttl_ms } => acquire::fold(error, last, ttl_ms),
        }
    }
}

impl Request {
    /// A request for database `db`.
    pub fn new(db: u32, args: Vec<Bytes>) -> Request {
        Request {
            db,
            args,
            cleanup: false,
            inspect: false,
            timed: false,
            form: Form::One,
            encoded: OnceLock::new(),
        }
    }

    /// This request reads the master's own bookkeeping: see [`Request::inspect`].
    pub fn inspecting(mut self) -> Request {
        self.inspect = true;
        self
    }

    /// A plain acquisition, `SET key token NX PX ttl_ms`, as its transaction ([`acquire`]):
    /// timed, its reply carrying the master's clock (rule 15).
    pub fn acquisition(db: u32, key: Bytes, token: Bytes, ttl_ms: u64) -> Request {
        let ttl = ttl_text(u128::from(ttl_ms));
        let wire = acquire::encoded(&key, &token, &ttl);
        let args = vec![
            Bytes::from_static(b"SET"),
            key,
            token,
            Bytes::from_static(b"NX"),
            Bytes::from_static(b"PX"),
            ttl,
        ];
        Request {
            db,
            args,
            cleanup: false,
            inspect: false,
            timed: true,
            form: Form::Acquisition { ttl_ms },
            encoded: OnceLock::from(wire),
        }
    }

    /// A request whose first arguments are the same in every request of its kind, and were
    /// encoded once as `head` ([`encode_head`](crate::wire::encode_head) of `args[..head_args]`).
    pub fn after_head(db: u32, args: Vec<Bytes>, head: &[u8], head_args: usize) -> Request {
        let tail = args.get(head_args..).unwrap_or_default().iter().map(|a| &a[..]);
        let wire = crate::wire::encode_after(args.len(), head, tail);
        Request {
            db,
            args,
            cleanup: false,
            inspect: false,
            timed: false,
            form: Form::One,
            encoded: OnceLock::from(wire),
        }
    }

    /// The request as a RESP array of bulk strings.
    pub fn encoded(&self) -> Bytes {
        self.wire().clone()
    }

    /// [`Request::encoded`], borrowed: no reference count to share (a request put straight
    /// on a connection is copied into its output buffer).
    pub fn wire(&self) -> &Bytes {
        self.encoded
            .get_or_init(|| crate::wire::encode(self.args.iter().map(|a| &a[..])))
    }
}

/// Why a master gave no reply. A reply that *is* an error (`-WRONGTYPE ...`) is not a
/// `BackendError`: the master answered, and the answer is a [`Reply::Error`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// No reply within the per-backend timeout.
    #[error("timed out")]
    Timeout,
    /// The master is known to be unreachable; it was not tried (no timeout was spent).
    #[error("down")]
    Down,
    /// The master restarted recently and takes no part in any quorum yet (rule 8).
    #[error("quarantined")]
    Quarantined {
        /// How long until it votes again.
        remaining: std::time::Duration,
    },
    /// The master is the same server (same `run_id`) as member `of`'s: it does not vote
    /// (rule 15); it was not tried.
    #[error("duplicate of backend {of} (same run_id)")]
    Duplicate {
        /// The index of the member it duplicates.
        of: usize,
    },
    /// The master answered, but its wall clock gained on the proxy's beyond the drift
    /// allowance (rule 15): it may have expired keys early, so its answer is no vote, and it
    /// is quarantined. The request did run there.
    #[error("wall clock ahead by {} ms beyond the drift allowance", .ahead.as_millis())]
    ClockAhead {
        /// By how much, at least.
        ahead: std::time::Duration,
    },
    /// Not answered yet when the outcome was already decided (the request still completes).
    #[error("pending")]
    Pending,
    /// The connection failed while the request was in flight.
    #[error("connection error: {0}")]
    Io(String),
}

/// A master's place in a fan-out: where one master's answer to one request goes, in the
/// fan-out the request is part of. The backend completes the place from wherever the answer is decoded (a connection's
/// reader task, or at once when it is known without asking: down, quarantined); the record
/// behind it decides when the waiting client is woken. No future, channel or timer per master:
/// one record and one deadline per fan-out.
pub struct Place {
    sink: Option<Arc<dyn Sink>>,
    index: usize,
}

/// What a [`Place`] is in: the owner of a fan-out (the quorum engine's record).
pub trait Sink: Send + Sync {
    /// Master `index` answered (or failed to).
    fn complete(&self, index: usize, answer: Answer);
    /// Whether master `index`'s answer is still awaited: neither in yet nor past the
    /// fan-out's deadline. A backend re-sends a script by source after `NOSCRIPT` only then.
    fn is_open(&self, index: usize) -> bool;
}

impl Place {
    /// Place `index` in `sink`.
    pub fn new(sink: Arc<dyn Sink>, index: usize) -> Place {
        Place {
            sink: Some(sink),
            index,
        }
    }

    /// A place whose answer nobody wants (the reply to `ASKING`).
    pub(crate) fn ignored() -> Place {
        Place { sink: None, index: 0 }
    }

    /// Delivers the answer.
    pub fn complete(mut self, answer: Answer) {
        if let Some(sink) = self.sink.take() {
            sink.complete(self.index, answer);
        }
    }

    /// Gives the place up without an answer: the request or its reply was lost on the way (as
    /// the simulation's links lose messages), so only the fan-out's deadline ends the wait.
    pub fn forget(mut self) {
        self.sink = None;
    }

    /// Whether the answer is still awaited (see [`Sink::is_open`]).
    pub fn is_open(&self) -> bool {
        self.sink.as_ref().is_some_and(|sink| sink.is_open(self.index))
    }
}

impl Drop for Place {
    /// A place dropped unanswered (its connection went away with it) fails, so that a
    /// fan-out always hears from every master it asked.
    fn drop(&mut self) {
        if let Some(sink) = self.sink.take() {
            sink.complete(self.index, Err(connection_lost()));
        }
    }
}

/// A [`Request::timed`] reply: `{reply, time}` (`time` as `TIME` answers it) as the reply and
/// the master's clock reading; any other reply (a refusal, an error) as it is, with none.
pub fn split_time(reply: Reply) -> (Reply, Option<std::time::Duration>) {
    let Reply::Array(parts) = reply else {
        return (reply, None);
    };
    match <[Reply; 2]>::try_from(parts) {
        Ok([reply, time]) => match wall_clock::parse_time(&time) {
            Some(at) => (reply, Some(at)),
            None => (Reply::Array(vec![reply, time]), None),
        },
        Err(parts) => (Reply::Array(parts), None),
    }
}

/// One master's answer: a reply (possibly an error reply), or no reply at all.
pub type Answer = Result<Reply, BackendError>;

/// A Redis master as the quorum engine sees it.
///
/// A member of the quorum is asked through [`Backend::start`], which returns at once; the
/// answer arrives later in the [`Place`]. A member may be more than one connection (it picks
/// the one for the request), as long as it answers each request once.
pub trait Backend: Send + Sync + 'static {
    /// A short name for logs and `INFO` (e.g. `127.0.0.1:6379`).
    fn name(&self) -> &str;

    /// Sends `request` and delivers its answer to `place`. Where the master answers `NOSCRIPT`
    /// and `fallback` is given (the same script by source), the fallback is sent instead,
    /// while the place is open. Implementations do not apply the per-request timeout
    /// themselves: the fan-out's one deadline bounds every master (rule 3).
    fn start(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, place: Place);

    /// The master process's `run_id` as last seen, if known: fencing epochs are tied to it.
    fn run_id(&self) -> Option<String> {
        None
    }
}

/// A single request to one master, awaited on its own (start-up, probes, repairs: not the
/// request path, which fans out through the quorum engine's record).
pub async fn call<B: Backend>(backend: &Arc<B>, request: &Request, fallback: Option<&Request>) -> Answer {
    let (place, answer) = lone();
    backend.start(request, fallback, place);
    answer.await
}

/// A place for a lone request, and its answer to await.
pub(crate) fn lone() -> (Place, impl Future<Output = Answer>) {
    let (sender, answer) = tokio::sync::oneshot::channel();
    let sink: Arc<dyn Sink> = Arc::new(Single(std::sync::Mutex::new(Some(sender))));
    (Place::new(sink, 0), async move {
        answer.await.unwrap_or_else(|_| Err(connection_lost()))
    })
}

/// `AUTH [user] password` for `credentials` (user, if any, and password), as arguments: for
/// every connection to a master (requests, subscriptions, a cluster's seeds).
pub(crate) fn auth_args((user, password): &(Option<String>, String)) -> Vec<&[u8]> {
    let mut args: Vec<&[u8]> = vec![b"AUTH"];
    args.extend(user.as_deref().map(str::as_bytes));
    args.push(password.as_bytes());
    args
}

/// The connection carrying a request failed before its answer came.
pub(crate) fn connection_lost() -> BackendError {
    BackendError::Io("connection lost".into())
}

/// The [`Sink`] of a lone request: its one answer goes to whoever awaits it.
struct Single(std::sync::Mutex<Option<tokio::sync::oneshot::Sender<Answer>>>);

impl Sink for Single {
    fn complete(&self, _: usize, answer: Answer) {
        let sender = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(sender) = sender {
            let _ = sender.send(answer);
        }
    }

    fn is_open(&self, _: usize) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(|sender| !sender.is_closed())
    }
}

/// For backends whose calls are futures (the tests' in-process masters and the simulation's
/// links): runs `answer` in a task of its own and completes `place` with it.
pub fn complete_with(place: Place, answer: impl Future<Output = Answer> + Send + 'static) {
    tokio::spawn(async move { place.complete(answer.await) });
}

/// The masters a running proxy uses: real ones, or embedded ones for trying it out.
/// An enum rather than a trait object keeps the request path free of boxing.
pub enum AnyBackend {
    /// A real Redis master (fixed, or a Sentinel group's).
    Redis(Box<redis::RedisBackend>),
    /// A Redis Cluster: one master per shard.
    Cluster(Arc<cluster::ClusterBackend>),
    /// An in-process master.
    Embedded(embedded::EmbeddedBackend),
}

impl AnyBackend {
    /// The member's state, for `INFO` and metrics (a cluster's: see
    /// [`cluster::ClusterBackend::state`]).
    pub fn state(&self) -> health::State {
        match self {
            AnyBackend::Redis(r) => r.health().state(),
            AnyBackend::Cluster(c) => c.state(),
            AnyBackend::Embedded(_) => health::State::Up,
        }
    }

    /// Why the member is not up, when known (see [`health::Health::why`]), for the status page;
    /// a cluster's as a whole (each shard has its own: [`AnyBackend::shards`]).
    pub fn why(&self) -> Option<String> {
        match self {
            AnyBackend::Redis(r) => r.health().why(),
            AnyBackend::Cluster(c) => c.why(),
            AnyBackend::Embedded(_) => None,
        }
    }

    /// Applies `change` to the health of every master of the member (`PROXY QUARANTINE`);
    /// false for a member without any (embedded).
    pub fn each_health(&self, change: impl Fn(&health::Health)) -> bool {
        match self {
            AnyBackend::Redis(r) => change(r.health()),
            AnyBackend::Cluster(c) => c.nodes().iter().for_each(|n| change(n.health())),
            AnyBackend::Embedded(_) => return false,
        }
        true
    }

    /// Where a Sentinel group's master is now (the address it last named), for `INFO` and
    /// metrics; `None` for other members.
    pub fn master(&self) -> Option<String> {
        match self {
            AnyBackend::Redis(r) if r.kind() == "sentinel" => {
                Some(r.master().map_or_else(|| "none".to_owned(), |a| a.to_string()))
            }
            _ => None,
        }
    }

    /// A cluster's shards (master, slots, state); `None` for other members.
    pub fn shards(&self) -> Option<Vec<cluster::ShardView>> {
        match self {
            AnyBackend::Cluster(c) => Some(c.shards()),
            _ => None,
        }
    }

    /// How to subscribe to the release announcements on this member; `None` for an embedded
    /// one (its announcements stay in the process).
    pub fn subscription_target(&self) -> Option<subscriber::Target> {
        match self {
            AnyBackend::Redis(r) => Some(r.subscription_target()),
            AnyBackend::Cluster(c) => Some(c.subscription_target()),
            AnyBackend::Embedded(_) => None,
        }
    }

    /// `redis`, `sentinel`, `cluster` or `embedded`, for `INFO`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyBackend::Redis(r) => r.kind(),
            AnyBackend::Cluster(_) => "cluster",
            AnyBackend::Embedded(_) => "embedded",
        }
    }
}

impl Backend for AnyBackend {
    fn name(&self) -> &str {
        match self {
            AnyBackend::Redis(b) => b.name(),
            AnyBackend::Cluster(b) => b.name(),
            AnyBackend::Embedded(b) => b.name(),
        }
    }

    fn start(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, place: Place) {
        match &**self {
            AnyBackend::Redis(b) => b.send(request, fallback, place),
            AnyBackend::Cluster(b) => b.send(request, fallback, place),
            AnyBackend::Embedded(b) => place.complete(Ok(b.answer(request, fallback))),
        }
    }

    /// A cluster has no one run id (each shard has its own): fencing epochs, tied to a run
    /// id, are not kept on it.
    fn run_id(&self) -> Option<String> {
        match self {
            AnyBackend::Redis(r) => r.health().run_id(),
            AnyBackend::Cluster(_) => None,
            AnyBackend::Embedded(e) => Some(e.run_id()),
        }
    }
}
