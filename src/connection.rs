//! One client connection: framing, per-connection state, pipelining with ordered replies.
//!
//! Commands from one connection run concurrently when they touch different keys; a command
//! that touches a key still in flight waits for the commands on that key, and one that
//! changes connection state (or touches no key) waits for every command before it and runs
//! alone. Replies always go back in request order.
//!
//! **The connection never goes deaf** (rules 13 and 16): its one loop never awaits a command
//! nor a write. A command that cannot start yet is held (`Connection::blocked`) while the
//! loop goes on reading the socket, up to `client_query_buffer_limit` (so an end of stream is
//! seen at once, and ends the client's waits), delivering lost-lock notices and watching the
//! stop signal (`CLIENT KILL`, shutdown), whatever the connection is waiting for. Replies
//! are written as the socket takes them, in a branch of the same loop: a client that stops
//! reading holds at most `client_output_buffer_limit` bytes, for at most
//! `client_stall_timeout_ms`, and is then dropped (its session locks released), as Redis drops
//! a client past its output buffer limit. A command whose work is asynchronous and that must
//! run alone (`EXEC`, `WATCH`, `RESET`, a script without keys) runs as an in-flight command
//! like any other, marked exclusive: nothing after it is parsed until it is done.
//!
//! Rule 16: a session lives from its grant. An acquisition of a session lock carries a
//! [`crate::sessions::Starter`]: the moment its future completes (commands complete out of
//! order; their replies go out in order), the grant's keeping begins, and when the reply is
//! written it is confirmed, or, lost meanwhile, written as its failure value.

// Every match on a command names each variant (no `_ =>`): a forgotten one is a compile error.
#![cfg_attr(not(test), deny(clippy::wildcard_enum_match_arm))]

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::watch;
use tokio::time::{Duration, Instant};

use crate::auth::{self, Identity};
use crate::command::Local;
use crate::command::{ClientCmd, Command, Hello, Recipe};
use crate::error::ClientError;
use crate::glob;
use crate::introspection;
use crate::metrics as m;
use crate::protocol::{Limits, parse_request};
use crate::proxy::info;
use crate::proxy::{Outcome, Proxy, Queued};
use crate::recipes::election::command::ElectCmd;
use crate::recipes::election::observers::Observers;
use crate::reply::{Protocol, Reply};
use crate::sessions::{Effect, Lost, SessionLocks, Starter};
use crate::stop::Stop;
use crate::tls::Io;
use crate::waiting::Waiting;

/// How many bytes of replies may wait for the client to read them before the connection starts
/// no more of its commands (backpressure; `client_output_buffer_limit` bounds what commands
/// already started add).
const WRITE_AHEAD: usize = 64 * 1024;

/// How long a closing connection's last replies may wait for the client to read them.
const CLOSING_GRACE: Duration = Duration::from_secs(1);

/// The state Redis keeps per connection (per client): not to be confused with its session
/// locks (`crate::sessions`).
#[derive(Debug)]
struct ClientState {
    id: u64,
    protocol: Protocol,
    db: u32,
    name: Option<Bytes>,
    /// Who the client is, once authenticated.
    login: Login,
    /// Between `MULTI` and `EXEC`: the queued commands, as sent to each master.
    multi: Option<Multi>,
    /// `WATCH`ed keys and the value a majority held when watched.
    watched: Vec<(Bytes, Option<Bytes>)>,
}

/// Who a client is.
#[derive(Debug)]
enum Login {
    /// Not authenticated: only `AUTH`, `HELLO`, `QUIT` and `RESET` are answered.
    None,
    /// The default user (by `requirepass`, or without any password configured).
    Default,
    /// A named user, limited to its key patterns.
    User(Arc<Identity>),
}

impl Login {
    /// A new (or `RESET`) connection: the default user when the proxy needs no password.
    fn initial(proxy: &Proxy) -> Login {
        if proxy.access.open() {
            Login::Default
        } else {
            Login::None
        }
    }

    /// The named user, if any (`None` for the default user: [`auth::permit`] lets it do all).
    fn user(&self) -> Option<&Identity> {
        match self {
            Login::User(identity) => Some(identity),
            Login::None | Login::Default => None,
        }
    }

    /// The name session locks are counted under.
    fn name(&self) -> &str {
        self.user().map_or("default", |u| u.name.as_str())
    }
}

/// A transaction being queued, between `MULTI` and `EXEC`.
#[derive(Debug, Default)]
struct Multi {
    commands: Vec<Queued>,
    /// A command failed to queue: `EXEC` answers `EXECABORT`.
    failed: bool,
    /// With a Redis Cluster member: the hash slot of the watched and queued keys so far.
    hash_slot: Option<u16>,
    /// The keys queued writes name: a session lock on one of them is changed if `EXEC` runs.
    writes: Vec<Bytes>,
}

/// The keys of one command in flight. Most commands name one key: no allocation for those.
enum Keys {
    One(Bytes),
    Many(Vec<Bytes>),
}

impl Keys {
    fn of(keys: &[Bytes]) -> Keys {
        match keys {
            [key] => Keys::One(key.clone()),
            keys => Keys::Many(keys.to_vec()),
        }
    }

    fn as_slice(&self) -> &[Bytes] {
        match self {
            Keys::One(key) => std::slice::from_ref(key),
            Keys::Many(keys) => keys,
        }
    }
}

/// What the connection keeps of one command in flight until its reply is written.
struct InFlight {
    /// The keys it holds busy.
    keys: Keys,
    /// What its outcome does to this connection's session locks.
    effect: Effect,
    /// It runs alone: nothing after it starts until it is done.
    exclusive: bool,
    /// An `ELECT.OBSERVE` on RESP3 (database, election): its pushes wait for its reply.
    observed: Option<(u32, Bytes)>,
}

/// A client connection and its pipeline.
pub struct Connection {
    reader: ReadHalf<Box<dyn Io>>,
    writer: WriteHalf<Box<dyn Io>>,
    /// Bytes were written since the last flush (TLS keeps some until flushed).
    unflushed: bool,
    /// Since when written replies wait for the client to read them (no byte taken).
    output_since: Option<Instant>,
    /// Since when the read buffer is past `client_query_buffer_limit` with nothing startable.
    input_stuck_since: Option<Instant>,
    proxy: Arc<Proxy>,
    state: ClientState,
    read: BytesMut,
    /// Replies ready to go out, in order, each with its effect on session locks; settled
    /// (rule 4a), applied (rule 13) and encoded when written.
    ready: Vec<(Outcome, Effect)>,
    write: BytesMut,
    limits: Limits,
    in_flight: FuturesOrdered<BoxFuture<'static, Outcome>>,
    /// What is kept of each in-flight command, oldest first.
    in_flight_meta: VecDeque<InFlight>,
    /// With a fast hasher: every command of a connection looks its keys up here; the map holds
    /// only this connection's commands in flight (at most `max_pipeline`).
    busy_keys: HashMap<Bytes, usize, foldhash::fast::RandomState>,
    /// An exclusive command is in flight: nothing is parsed or started until it is done.
    exclusive: bool,
    /// The next command, parsed and admitted, that cannot start yet: its key is in flight,
    /// or it must run alone and others are in flight. Nothing behind it is parsed.
    blocked: Option<(Command, Effect)>,
    /// The connection is ending (end of stream, `QUIT`, `CLIENT KILL`, shutdown, malformed
    /// input): nothing more is read or started; what is in flight finishes, then it closes.
    ending: bool,
    /// Malformed input: answered with this error after the replies before it, then closed.
    malformed: Option<ClientError>,
    /// Turns true when the proxy shuts down; read once, when the client is listed (the server
    /// raises the `stop` of every client listed then).
    shutdown: watch::Receiver<bool>,
    /// Locks kept alive while this connection is open, and word of those lost.
    locks: SessionLocks,
    /// Session locks lost that a RESP2 client has not been told of yet: it is, as an error
    /// for its next `LOCK.*` command on that key.
    lost_untold: HashMap<(u32, Bytes), &'static str>,
    /// The elections this connection observes (`ELECT.OBSERVE` on RESP3): their pushes.
    observers: Observers,
    /// Turns true when the client is gone (end of stream, shutdown): its requests waiting for
    /// locks stop waiting and leave their queues. Dropped with the connection (even by a
    /// panic), which its waiters read the same way.
    closed: watch::Sender<bool>,
    /// Raised by `CLIENT KILL ID` (another connection's) or the proxy's shutdown: this one
    /// finishes what is in flight and closes.
    stop: Arc<Stop>,
}

impl Connection {
    /// A new connection; nothing is read until [`Connection::run`].
    pub fn new(stream: Box<dyn Io>, peer: String, proxy: Arc<Proxy>, shutdown: watch::Receiver<bool>) -> Connection {
        let state = ClientState {
            id: proxy.next_client_id(),
            protocol: Protocol::Resp2,
            db: 0,
            name: None,
            login: Login::initial(&proxy),
            multi: None,
            watched: Vec::new(),
        };
        let limits = Limits {
            max_bulk_len: proxy.config.proto_max_bulk_len,
            max_args: proxy.config.max_args,
        };
        let (reader, writer) = tokio::io::split(stream);
        Connection {
            reader,
            writer,
            unflushed: false,
            output_since: None,
            input_stuck_since: None,
            locks: SessionLocks::new(proxy.clone(), (state.id, peer)),
            lost_untold: HashMap::new(),
            observers: Observers::default(),
            closed: watch::Sender::new(false),
            stop: Arc::default(),
            proxy,
            state,
            read: BytesMut::with_capacity(4096),
            ready: Vec::new(),
            write: BytesMut::with_capacity(4096),
            limits,
            in_flight: FuturesOrdered::new(),
            in_flight_meta: VecDeque::new(),
            busy_keys: HashMap::default(),
            exclusive: false,
            blocked: None,
            ending: false,
            malformed: None,
            shutdown,
        }
    }

    /// Serves the client until it disconnects, sends `QUIT`, or sends malformed RESP.
    pub async fn run(mut self) -> std::io::Result<()> {
        // Unlisted and uncounted when this ends, however it ends (a panic of this task too).
        let _listed = Listed::new(&self.proxy, self.state.id, self.stop.clone());
        // A shutdown that began before this client was listed did not raise its signal:
        // the server raises those it finds listed, after the shutdown flag turned true.
        if *self.shutdown.borrow() {
            self.stop.raise();
        }
        let result = self.serve().await;
        self.closed.send_replace(true);
        // However the connection ended, its session locks end with it.
        self.locks.release_all().await;
        result
    }

    async fn serve(&mut self) -> std::io::Result<()> {
        // `CLIENT KILL` or shutdown: one waiter for the connection's life, not one registered
        // and dropped on every turn of the loop.
        let stop = self.stop.clone();
        let stopped = stop.raised();
        tokio::pin!(stopped);
        // `timeout`: how long a client may stay idle (zero: for ever).
        let idle_limit = Duration::from_secs(self.proxy.config.timeout);
        let mut last_read = Instant::now();
        // One timer for the connection, not one per request: when it fires it is moved to the
        // last read plus the limit, and closes the connection only if that moment has passed.
        // Without a limit it is never polled.
        let idle = tokio::time::sleep(idle_limit);
        tokio::pin!(idle);
        // `client_stall_timeout_ms`, the same way: polled only while replies wait unread or
        // input is stuck past its bound.
        let stall_limit = Duration::from_millis(self.proxy.config.client_stall_timeout_ms);
        let stall = tokio::time::sleep(stall_limit);
        tokio::pin!(stall);
        let query_limit = self.proxy.config.client_query_buffer_limit;
        // Once the connection is ending and nothing is in flight, what is left unread gets a
        // short grace, not the whole stall limit: `CLIENT KILL` and shutdown do not wait on a
        // client that stopped reading.
        let mut closing = false;
        loop {
            if !self.ending {
                self.dispatch_buffered();
            }
            self.encode_ready();
            // Most writes complete at once: done here, without a turn of the loop for each.
            self.write_now()?;
            if self.write.len() > self.proxy.config.client_output_buffer_limit {
                return Err(self.dropped("client_output_buffer_limit"));
            }
            if self.ending && self.in_flight.is_empty() {
                if let Some(error) = self.malformed.take() {
                    // Malformed RESP: what came before is answered, then this error, and only
                    // this connection closes.
                    self.push(error.into());
                    continue;
                }
                if self.write.is_empty() && !self.unflushed {
                    return Ok(());
                }
                if !closing {
                    closing = true;
                    stall.as_mut().reset(Instant::now() + CLOSING_GRACE.min(stall_limit));
                }
            }
            // Reads go on while commands wait (an end of stream must be seen whatever the
            // connection waits for), up to `client_query_buffer_limit` while nothing more can
            // start.
            let can_start = self.blocked.is_none() && !self.exclusive && self.room();
            let can_read = !self.ending && (can_start || self.read.len() < query_limit);
            self.input_stuck_since = match (can_read || self.ending, self.input_stuck_since) {
                (true, _) => None,
                (false, since) => since.or_else(|| Some(Instant::now())),
            };
            let stalled = closing || self.output_since.is_some() || self.input_stuck_since.is_some();
            // In this order, without drawing a random one each turn: the stop first (it is
            // rare and cheap to check), then replies before reads (each turn takes every
            // reply already done).
            tokio::select! {
                biased;
                () = &mut stopped, if !self.ending => {
                    // `CLIENT KILL`: as if the client had closed its side. Shutting down: no
                    // new requests; those in flight finish (an acquisition that fails runs its
                    // undo; a wait for a lock ends with nil), their replies go out, then the
                    // connection closes.
                    self.end();
                }
                Some(reply) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.completed(reply);
                    // Everything else already done goes out in the same write.
                    while let Some(Some(reply)) = self.in_flight.next().now_or_never() {
                        self.completed(reply);
                    }
                }
                lost = self.locks.next_lost() => {
                    if let Some(push) = self.locks.lost(lost).and_then(|lost| self.tell(lost)) {
                        self.push(push);
                    }
                }
                observation = self.observers.next() => {
                    if let Some(push) = self.observers.seen(observation) {
                        self.push(push);
                    }
                }
                sent = send(&mut self.writer, &self.write), if !self.write.is_empty() || self.unflushed => {
                    match sent? {
                        0 if self.write.is_empty() => self.unflushed = false,
                        0 => return Err(std::io::ErrorKind::WriteZero.into()),
                        n => self.wrote(n),
                    }
                }
                () = &mut stall, if stalled => {
                    if closing {
                        // The grace is over: what is left unread is dropped with the client.
                        return Ok(());
                    }
                    let since = [self.output_since, self.input_stuck_since].into_iter().flatten().min();
                    match since {
                        Some(since) if since.elapsed() >= stall_limit => {
                            return Err(self.dropped("client_stall_timeout_ms"));
                        }
                        Some(since) => stall.as_mut().reset(since + stall_limit),
                        None => {}
                    }
                }
                () = &mut idle, if self.in_flight.is_empty() && !idle_limit.is_zero() => {
                    if last_read.elapsed() >= idle_limit {
                        // Idle past `timeout`: closed, as Redis closes idle clients.
                        return Ok(());
                    }
                    idle.as_mut().reset(last_read + idle_limit);
                }
                read = self.reader.read_buf(&mut self.read), if can_read => {
                    if !idle_limit.is_zero() {
                        last_read = Instant::now();
                    }
                    if read? == 0 {
                        // The client closed its side: what it asked for and is in flight
                        // finishes (but no lock is waited for on its behalf), and nothing
                        // it sent after that starts, as Redis drops a closed client's input.
                        self.end();
                    }
                }
            }
        }
    }

    /// Writes (and flushes) what the socket takes at once, without waiting: the rest waits for
    /// the loop's write branch.
    fn write_now(&mut self) -> std::io::Result<()> {
        while !self.write.is_empty() || self.unflushed {
            match send(&mut self.writer, &self.write).now_or_never() {
                None => break,
                Some(Err(e)) => return Err(e),
                Some(Ok(0)) if self.write.is_empty() => self.unflushed = false,
                Some(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                Some(Ok(n)) => self.wrote(n),
            }
        }
        Ok(())
    }

    /// The socket took `n` bytes of the replies.
    fn wrote(&mut self, n: usize) {
        self.write.advance(n);
        self.unflushed = true;
        // Progress: a client still reading is not stalled, however much waits.
        self.output_since = (!self.write.is_empty()).then(Instant::now);
    }

    /// The client is dropped past one of its bounds (`limit`): what it had in flight and
    /// unread is dropped with it, and its session locks are released (`Connection::run`).
    fn dropped(&self, limit: &'static str) -> std::io::Error {
        tracing::warn!(
            client = self.state.id,
            limit,
            unread = self.write.len(),
            unstarted = self.read.len(),
            "client dropped: past {limit}"
        );
        metrics::counter!(m::CLIENTS_DROPPED, "limit" => limit).increment(1);
        std::io::Error::other(format!("client dropped: past {limit}"))
    }

    /// The connection ends: its waits end now, nothing more is read or started.
    fn end(&mut self) {
        self.closed.send_replace(true);
        self.ending = true;
        self.blocked = None;
        self.read.clear();
    }

    /// Whether another command may start: fewer than `max_pipeline` in flight, and fewer than
    /// [`WRITE_AHEAD`] bytes of replies waiting for the client to read them (a client that
    /// stops reading gets no more work done for it: its input waits in the read buffer, up to
    /// `client_query_buffer_limit`, and then in the socket).
    fn room(&self) -> bool {
        self.in_flight.len() < self.proxy.config.max_pipeline && self.write.len() < WRITE_AHEAD
    }

    /// Parses and starts every complete request in the read buffer, while commands can start.
    /// Never awaits: a command that cannot start yet is held in `blocked`.
    fn dispatch_buffered(&mut self) {
        while !self.ending && !self.exclusive && self.room() {
            let next = match self.blocked.take() {
                Some(next) => next,
                None => match parse_request(&mut self.read, self.limits) {
                    Ok(None) => return,
                    Ok(Some(args)) if args.is_empty() => continue,
                    Ok(Some(args)) => match self.admit(args) {
                        Some(next) => next,
                        None => continue,
                    },
                    Err(e) => {
                        self.malformed = Some(e);
                        self.end();
                        return;
                    }
                },
            };
            if let Some(blocked) = self.try_start(next) {
                self.blocked = Some(blocked);
                return;
            }
        }
    }

    /// Parses one request and answers what can be answered at once (errors, `QUEUED`, a lost
    /// lock's report); returns the command to start, with its effect on session locks.
    fn admit(&mut self, args: Vec<Bytes>) -> Option<(Command, Effect)> {
        self.proxy.stats.commands.fetch_add(1, Ordering::Relaxed);
        let command = match Command::parse(args) {
            Ok(command) => command,
            Err(e) => {
                self.refuse(e);
                return None;
            }
        };
        if matches!(self.state.login, Login::None)
            && !matches!(
                command,
                Command::Local(Local::Auth { .. } | Local::Hello(_) | Local::Quit | Local::Reset)
            )
        {
            self.ready(ClientError::NoAuth.into());
            return None;
        }
        if let Err(e) = self
            .check_sizes(&command)
            .and_then(|()| reserved(&command))
            .and_then(|()| self.one_hash_slot(&command))
            .and_then(|()| auth::permit(self.state.login.user(), &command))
        {
            self.refuse(e);
            return None;
        }
        if let Some(reply) = self.untold_loss(&command) {
            self.ready(reply);
            return None;
        }
        if self.state.multi.is_some()
            && !matches!(
                command,
                Command::Exec
                    | Command::Discard
                    | Command::Multi
                    | Command::Watch(_)
                    | Command::Local(Local::Quit | Local::Reset)
            )
        {
            self.queue(command);
            return None;
        }
        let effect = match command.session_ttl(self.proxy.config.default_ttl_ms) {
            // Bounded before anything is sent (item: session locks are bounded).
            Some(ttl_ms) => match self
                .locks
                .admit(self.state.login.name(), ttl_ms, command.session_locks())
            {
                Ok(()) => Effect::Acquiring(command.session_locks()),
                Err(e) => {
                    self.ready(e.into());
                    return None;
                }
            },
            // Only while some session lock may be affected (this connection's, or another's of
            // this proxy) is the effect's copy of the keys paid for.
            None if self.effects_matter() => Effect::of(&command, self.state.db),
            None => Effect::None,
        };
        Some((command, effect))
    }

    /// An error for a command that cannot run; inside `MULTI` it also dooms the transaction.
    fn refuse(&mut self, e: ClientError) {
        if let Some(transaction) = &mut self.state.multi {
            transaction.failed = true;
        }
        self.ready(e.into());
    }

    /// Whether a command's effect on session locks can matter (rule 13): some session lock is
    /// held through this proxy, or this connection may be about to hold one (an acquisition
    /// pending, or a grant done but not yet written). Otherwise no effect is made, and the
    /// acquire and release path copies no keys for it.
    fn effects_matter(&self) -> bool {
        self.proxy.sessions.in_play()
            || self.locks.active()
            || self
                .ready
                .iter()
                .any(|(o, _)| o.session.is_some() || !o.begun.is_empty())
    }

    /// Starts `command` if it can start now; else gives it back, to wait in `blocked`.
    fn try_start(&mut self, (command, effect): (Command, Effect)) -> Option<(Command, Effect)> {
        if command.runs_alone() {
            // After everything before it.
            if !self.in_flight.is_empty() {
                return Some((command, effect));
            }
            self.run_alone(command, effect);
            return None;
        }
        // Same key as a command in flight: keep their order on the masters.
        if command.keys().iter().any(|k| self.busy_keys.contains_key(k)) {
            return Some((command, effect));
        }
        self.start(command, effect);
        None
    }

    /// Starts a command that may run concurrently with others of this connection.
    fn start(&mut self, command: Command, effect: Effect) {
        let keys = Keys::of(command.keys());
        let resp3 = self.state.protocol == Protocol::Resp3;
        let observed = match &command {
            Command::Recipe(Recipe::Elect(ElectCmd::Observe { election, after: None })) if resp3 => {
                if let Err(e) = self.observers.admit(self.state.db, election) {
                    return self.ready(e.into());
                }
                Some((self.state.db, election.clone()))
            }
            Command::Local(_)
            | Command::Acquire(_)
            | Command::Set(_)
            | Command::SetNx { .. }
            | Command::DelEx(_)
            | Command::Expire(_)
            | Command::Eval(_)
            | Command::Script(_)
            | Command::Forward(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Watch(_)
            | Command::Unwatch
            | Command::Proxy(_)
            | Command::Recipe(_)
            | Command::BlPop { .. } => None,
        };
        // Bounded per user and in all before anything waits (`crate::waiting`); counted until
        // the request is answered or the observation ends.
        let waiting = match self.waiting(&command) {
            Ok(waiting) => waiting,
            Err(e) => return self.refused_with(e.into(), effect),
        };
        let future = match command {
            Command::Local(Local::Ping(msg)) => return self.ready(pong(msg)),
            Command::Local(Local::Echo(msg)) => return self.ready(Reply::Bulk(msg)),
            Command::Recipe(Recipe::Elect(ElectCmd::Unobserve { election })) => {
                let answer = self.observers.unobserve(self.state.db, &election);
                return self.ready(answer);
            }
            // On RESP3 the connection observes: the reply, then pushes (`crate::recipes::election::observers`).
            Command::Recipe(Recipe::Elect(ElectCmd::Observe { election, after: None })) if resp3 => {
                let readings = self.proxy.watch_election(self.state.db, &election);
                self.observers
                    .observe(self.state.db, election, readings, waiting)
                    .map(Outcome::plain)
                    .boxed()
            }
            command @ Command::Local(
                Local::Quit
                | Local::Reset
                | Local::Hello(_)
                | Local::Auth { .. }
                | Local::Select(_)
                | Local::Client(_)
                | Local::Info(_)
                | Local::Command(_)
                | Local::Help(_)
                | Local::ConfigGet(_),
            )
            | command @ Command::Acquire(_)
            | command @ Command::Set(_)
            | command @ Command::SetNx { .. }
            | command @ Command::DelEx(_)
            | command @ Command::Expire(_)
            | command @ Command::Eval(_)
            | command @ Command::Script(_)
            | command @ Command::Forward(_)
            | command @ Command::Multi
            | command @ Command::Exec
            | command @ Command::Discard
            | command @ Command::Watch(_)
            | command @ Command::Unwatch
            | command @ Command::Proxy(_)
            | command @ Command::Recipe(_)
            | command @ Command::BlPop { .. } => {
                let starter = self.starter(&effect, keys.as_slice());
                let future = self.proxy.execute(self.state.db, command, &self.closed);
                counted_while(kept_from_grant(future, starter), waiting)
            }
        };
        for key in keys.as_slice() {
            *self.busy_keys.entry(key.clone()).or_default() += 1;
        }
        self.in_flight_meta.push_back(InFlight {
            keys,
            effect,
            exclusive: false,
            observed,
        });
        self.in_flight.push_back(future);
    }

    /// The waits `command` leaves in the proxy, counted against the bounds, or why not.
    fn waiting(&self, command: &Command) -> Result<Option<Waiting>, ClientError> {
        match command.waits() {
            0 => Ok(None),
            n => self.proxy.waiting.take(self.state.login.name(), n).map(Some),
        }
    }

    /// A command refused as it was to start: its error, in order, with its effect (an
    /// acquisition admitted against the session bounds stops counting as pending).
    fn refused_with(&mut self, reply: Reply, effect: Effect) {
        self.in_flight_meta.push_back(InFlight {
            keys: Keys::Many(Vec::new()),
            effect,
            exclusive: false,
            observed: None,
        });
        self.in_flight
            .push_back(std::future::ready(Outcome::plain(reply)).boxed());
    }

    /// Rule 16: what an acquisition of session locks begins keeping its grants with, the
    /// moment a quorum granted them, whatever waits in front of its reply ([`kept_from_grant`]).
    /// Made before the acquisition sends anything: its keys are watched from then on, so that a
    /// change another command makes to them before the grant begins keeping is not missed
    /// (rule 13).
    fn starter(&mut self, effect: &Effect, keys: &[Bytes]) -> Option<Starter> {
        if !matches!(effect, Effect::Acquiring(_)) {
            return None;
        }
        let (name, db) = (self.state.name.clone(), self.state.db);
        Some(self.locks.starter(name, self.state.login.name(), db, keys))
    }

    /// Starts a command that runs alone: nothing after it starts until it is done.
    fn start_exclusive(&mut self, future: BoxFuture<'static, Outcome>, effect: Effect) {
        self.exclusive = true;
        self.in_flight_meta.push_back(InFlight {
            keys: Keys::Many(Vec::new()),
            effect,
            exclusive: true,
            observed: None,
        });
        self.in_flight.push_back(future);
    }

    /// A recipe's command on a session lock lost since the client last heard (a `LOCK.*` command
    /// on its lock, a `SEM.*` command on the semaphore whose permit was lost...) gets the loss
    /// as its answer: RESP2 clients have no other way to learn of it. Which commands, and which
    /// lost locks are theirs, each recipe says (`command::Call::loss_of`).
    fn untold_loss(&mut self, command: &Command) -> Option<Reply> {
        let db = self.state.db;
        let loss = match command {
            Command::Recipe(recipe) => recipe.call().loss_of()?,
            Command::Local(_)
            | Command::Acquire(_)
            | Command::Set(_)
            | Command::SetNx { .. }
            | Command::DelEx(_)
            | Command::Expire(_)
            | Command::Eval(_)
            | Command::Script(_)
            | Command::Forward(_)
            | Command::Multi
            | Command::Exec
            | Command::Discard
            | Command::Watch(_)
            | Command::Unwatch
            | Command::Proxy(_)
            | Command::BlPop { .. } => return None,
        };
        let lost = self
            .lost_untold
            .keys()
            .find(|(d, lost)| *d == db && (loss.owns)(lost, loss.named))?
            .clone();
        let (key, reason) = (loss.named, self.lost_untold.remove(&lost)?);
        Some(
            ClientError::LockLost {
                key: String::from_utf8_lossy(key).into_owned(),
                reason,
            }
            .into(),
        )
    }

    /// Tells the client a session lock of this connection was lost: a RESP3 client at once
    /// with a push message (`lock-lost`, key, token, reason; for a semaphore's permit, the
    /// semaphore's key), a RESP2 client at its next `LOCK.*` (`SEM.*`) command on that key.
    /// Returns the push to write.
    #[must_use]
    fn tell(&mut self, lost: Lost) -> Option<Reply> {
        if self.state.protocol == Protocol::Resp3 {
            let key = crate::command::recipe::named_key(&lost.key).unwrap_or(lost.key);
            Some(Reply::Push(vec![
                Reply::bulk("lock-lost"),
                Reply::Bulk(key),
                Reply::Bulk(lost.token),
                Reply::bulk(lost.reason),
            ]))
        } else {
            self.lost_untold.insert((lost.db, lost.key), lost.reason);
            None
        }
    }

    /// Refuses lock commands whose keys or written value exceed `max_key_len` /
    /// `max_value_len`: every master would store a copy.
    fn check_sizes(&self, command: &Command) -> Result<(), ClientError> {
        let config = &self.proxy.config;
        let too_long = command.keys().iter().any(|k| k.len() > config.max_key_len);
        if too_long {
            return Err(ClientError::Unsupported(format!(
                "key longer than max_key_len ({} bytes)",
                config.max_key_len
            )));
        }
        if command.written_value().is_some_and(|v| v.len() > config.max_value_len) {
            return Err(ClientError::Unsupported(format!(
                "value longer than max_value_len ({} bytes)",
                config.max_value_len
            )));
        }
        Ok(())
    }

    /// Queues a command between `MULTI` and `EXEC`.
    fn queue(&mut self, command: Command) {
        let writes = command.writes().then(|| command.keys().to_vec());
        let queued = self.proxy.queued_args(command);
        let Some(transaction) = &mut self.state.multi else {
            return;
        };
        let reply = match queued {
            Ok(args) => {
                transaction.commands.push(args);
                transaction.writes.extend(writes.into_iter().flatten());
                Reply::status("QUEUED")
            }
            Err(e) => {
                transaction.failed = true;
                e.into()
            }
        };
        self.ready(reply);
    }

    /// Queues an already-known reply behind the commands in flight.
    fn ready(&mut self, reply: Reply) {
        self.in_flight_meta.push_back(InFlight {
            keys: Keys::Many(Vec::new()),
            effect: Effect::None,
            exclusive: false,
            observed: None,
        });
        self.in_flight
            .push_back(std::future::ready(Outcome::plain(reply)).boxed());
    }

    /// Records a finished command (the oldest in flight) and queues its reply.
    fn completed(&mut self, mut outcome: Outcome) {
        let Some(done) = self.in_flight_meta.pop_front() else {
            return;
        };
        for key in done.keys.as_slice() {
            if let Some(count) = self.busy_keys.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    self.busy_keys.remove(key);
                }
            }
        }
        if done.exclusive {
            self.exclusive = false;
        }
        if let Some(watched) = outcome.watched.take() {
            self.state.watched.extend(*watched);
        }
        self.ready.push((outcome, done.effect));
        // An observation's changes read before its reply went out follow it.
        if let Some(observed) = done.observed
            && let Some(push) = self.observers.answered(&observed)
        {
            self.ready.push((Outcome::plain(push), Effect::None));
        }
    }

    /// A reply outside the order of requests (a RESP3 push, the final error).
    fn push(&mut self, reply: Reply) {
        self.ready.push((Outcome::plain(reply), Effect::None));
    }

    /// Encodes the ready replies for the writer. Rule 4a: each is settled now, at the moment it
    /// is written: a grant whose validity ran out while it waited for its turn becomes its
    /// failure value and is undone, a validity figure is what is left. Rule 16: a session
    /// grant kept since it was granted is confirmed now, or, lost meanwhile, not written as a
    /// grant. Rule 13: what the written reply says is what it does to session locks.
    fn encode_ready(&mut self) {
        if self.ready.is_empty() {
            return;
        }
        // Losses already reported are applied first: no grant goes out after its own loss.
        while let Some(lost) = self.locks.lost_now() {
            if let Some(push) = self.locks.lost(lost).and_then(|lost| self.tell(lost)) {
                self.ready.push((Outcome::plain(push), Effect::None));
            }
        }
        let now = Instant::now();
        // The buffer is put back after, so its capacity serves the next turn.
        let mut ready = std::mem::take(&mut self.ready);
        for (outcome, effect) in ready.drain(..) {
            let (outcome, lost_before) = self.confirm_begun(outcome, now);
            let settled = outcome.settle(now);
            if let Some(undo) = settled.undo {
                metrics::counter!(m::STALE_REPLIES).increment(1);
                let proxy = self.proxy.clone();
                tokio::spawn(async move { proxy.engine.undo(&undo).await });
            }
            if let Some(grant) = settled.session {
                let user = self.state.login.name().to_owned();
                self.locks.start(grant, self.state.name.clone(), &user);
                for grant in settled.more_sessions {
                    self.locks.start(grant, self.state.name.clone(), &user);
                }
            }
            let ended = self
                .locks
                .apply(effect, &settled.reply, settled.freed, settled.released_hold.as_ref());
            settled.reply.encode(self.state.protocol, &mut self.write);
            // A loss told now goes out right after the reply that caused it.
            for lost in lost_before.into_iter().chain(ended) {
                if let Some(push) = self.tell(lost) {
                    push.encode(self.state.protocol, &mut self.write);
                }
            }
        }
        self.ready = ready;
        if self.output_since.is_none() && !self.write.is_empty() {
            self.output_since = Some(now);
        }
    }

    /// Rule 16: the session grants `outcome` kept since they were granted become this
    /// connection's session locks now, if all are still kept and valid. If one was lost or ran
    /// out, the reply is settled as a grant past its validity (its failure value, undone);
    /// a reply without a failure value goes out as it is, and the losses to tell after it are
    /// returned.
    fn confirm_begun(&mut self, mut outcome: Outcome, now: Instant) -> (Outcome, Vec<Lost>) {
        if outcome.begun.is_empty() {
            return (outcome, Vec::new());
        }
        match self.locks.confirm(std::mem::take(&mut outcome.begun), now) {
            Ok(()) => (outcome.kept(), Vec::new()),
            Err(lost) => {
                if outcome.lapse(now) {
                    (outcome, Vec::new())
                } else {
                    (outcome, lost)
                }
            }
        }
    }

    /// Runs a command that changes connection state or touches the masters without a key,
    /// now that nothing before it is in flight. What needs the masters (or the release of
    /// session locks) runs as an exclusive command.
    fn run_alone(&mut self, command: Command, effect: Effect) {
        let reply = match command {
            Command::Local(Local::Quit) => {
                self.ready(Reply::ok());
                self.ending = true;
                return;
            }
            Command::Local(Local::Reset) => {
                let releases = self.locks.release_all();
                self.lost_untold.clear();
                self.observers.clear();
                self.state.protocol = Protocol::Resp2;
                self.state.db = 0;
                self.state.name = None;
                self.state.multi = None;
                self.state.watched.clear();
                self.state.login = Login::initial(&self.proxy);
                let reset = async move {
                    releases.await;
                    Outcome::plain(Reply::status("RESET"))
                };
                return self.start_exclusive(Box::pin(reset), effect);
            }
            Command::Local(Local::Hello(hello)) => self.hello(hello),
            Command::Local(Local::Auth { user, password }) => match self.authenticate(user.as_deref(), &password) {
                Ok(()) => Reply::ok(),
                Err(e) => e.into(),
            },
            Command::Local(Local::Select(db)) => match u32::try_from(db) {
                Ok(db) if db < self.proxy.config.databases => {
                    self.state.db = db;
                    Reply::ok()
                }
                _ => ClientError::DbOutOfRange.into(),
            },
            Command::Local(Local::Client(c)) => self.client(c),
            Command::Multi if self.state.multi.is_some() => ClientError::NestedMulti.into(),
            Command::Multi => {
                self.state.multi = Some(Multi::default());
                Reply::ok()
            }
            Command::Exec => return self.exec(),
            Command::Discard => match self.state.multi.take() {
                Some(_) => {
                    self.state.watched.clear();
                    Reply::ok()
                }
                None => ClientError::DiscardWithoutMulti.into(),
            },
            Command::Watch(_) if self.state.multi.is_some() => ClientError::WatchInMulti.into(),
            Command::Watch(keys) => {
                let (proxy, db) = (self.proxy.clone(), self.state.db);
                let watch = async move {
                    match proxy.watch(db, keys).await {
                        Ok(watched) => {
                            let mut outcome = Outcome::plain(Reply::ok());
                            outcome.watched = Some(Box::new(watched));
                            outcome
                        }
                        Err(error) => Outcome::plain(error),
                    }
                };
                return self.start_exclusive(Box::pin(watch), effect);
            }
            Command::Proxy(c) => self.proxy.admin(c),
            Command::Unwatch => {
                self.state.watched.clear();
                Reply::ok()
            }
            Command::Local(Local::Info(sections)) => {
                let operator = auth::is_operator(self.state.login.user());
                Reply::Bulk(Bytes::from(info::render(&self.proxy, &sections, operator)))
            }
            Command::Local(Local::Command(c)) => introspection::command(&c),
            Command::Local(Local::Help(container)) => introspection::help(container),
            Command::Local(Local::ConfigGet(patterns)) => self.config_get(&patterns),
            command @ Command::Local(Local::Ping(_) | Local::Echo(_))
            | command @ Command::Acquire(_)
            | command @ Command::Set(_)
            | command @ Command::SetNx { .. }
            | command @ Command::DelEx(_)
            | command @ Command::Expire(_)
            | command @ Command::Eval(_)
            | command @ Command::Script(_)
            | command @ Command::Forward(_)
            | command @ Command::Recipe(_)
            | command @ Command::BlPop { .. } => {
                let waiting = match self.waiting(&command) {
                    Ok(waiting) => waiting,
                    Err(e) => return self.refused_with(e.into(), effect),
                };
                let starter = self.starter(&effect, command.keys());
                let future = self.proxy.execute(self.state.db, command, &self.closed);
                let future = counted_while(kept_from_grant(future, starter), waiting);
                return self.start_exclusive(future, effect);
            }
        };
        self.ready(reply);
    }

    /// `EXEC`: runs the queued commands (guarded by the watched keys); always ends the transaction.
    fn exec(&mut self) {
        let Some(transaction) = self.state.multi.take() else {
            return self.ready(ClientError::ExecWithoutMulti.into());
        };
        let watched = std::mem::take(&mut self.state.watched);
        if transaction.failed {
            return self.ready(ClientError::ExecAbort.into());
        }
        let effect = if self.effects_matter() {
            Effect::Exec {
                db: self.state.db,
                keys: transaction.writes,
            }
        } else {
            Effect::None
        };
        let (proxy, db) = (self.proxy.clone(), self.state.db);
        let exec = async move { Outcome::plain(proxy.exec(db, &watched, &transaction.commands).await) };
        self.start_exclusive(Box::pin(exec), effect);
    }

    /// `HELLO`: authenticate and name if asked, switch protocol, describe the server.
    fn hello(&mut self, hello: Hello) -> Reply {
        if let Some((user, password)) = &hello.auth
            && let Err(e) = self.authenticate(Some(user), password)
        {
            return e.into();
        }
        if matches!(self.state.login, Login::None) {
            return ClientError::NoAuth.into();
        }
        if let Some(name) = hello.setname {
            self.state.name = Some(name);
        }
        if let Some(protocol) = hello.protocol {
            self.state.protocol = protocol;
        }
        // RESP2 has no pushes: observations end (a long poll is the RESP2 way).
        if self.state.protocol == Protocol::Resp2 {
            self.observers.clear();
        }
        let proto = match self.state.protocol {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        };
        let field = |k: &'static str, v: Reply| (Reply::bulk(k), v);
        Reply::Map(vec![
            field("server", Reply::bulk("redis")),
            field("version", Reply::bulk(info::REDIS_VERSION)),
            field("proto", Reply::Int(proto)),
            field("id", Reply::Int(self.state.id as i64)),
            field("mode", Reply::bulk("standalone")),
            field("role", Reply::bulk("master")),
            field("modules", Reply::Array(Vec::new())),
        ])
    }

    /// Checks credentials against `requirepass` (user `default` only).
    fn authenticate(&mut self, user: Option<&[u8]>, password: &[u8]) -> Result<(), ClientError> {
        match self.proxy.access.authenticate(user, password) {
            Ok(identity) => {
                self.state.login = identity.map_or(Login::Default, Login::User);
                Ok(())
            }
            Err(e) => {
                if e == ClientError::WrongPass {
                    self.proxy.stats.auth_failures.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(m::AUTH_FAILURES).increment(1);
                }
                Err(e)
            }
        }
    }

    /// `CONFIG GET`: the parameters `redis-benchmark` and StackExchange.Redis read at start,
    /// with the values that describe the proxy (no persistence of its own, no idle timeout).
    fn config_get(&self, patterns: &[Bytes]) -> Reply {
        let databases = self.proxy.config.databases.to_string();
        let timeout = self.proxy.config.timeout.to_string();
        let known = [
            ("save", ""),
            ("appendonly", "no"),
            ("timeout", timeout.as_str()),
            ("databases", databases.as_str()),
            ("replica-read-only", "yes"),
        ];
        let pairs = known
            .iter()
            .filter(|(name, _)| {
                patterns
                    .iter()
                    .any(|p| glob::matches(&p.to_ascii_lowercase(), name.as_bytes()))
            })
            .map(|(name, value)| {
                (
                    Reply::bulk(*name),
                    Reply::Bulk(Bytes::copy_from_slice(value.as_bytes())),
                )
            })
            .collect();
        Reply::Map(pairs)
    }

    fn client(&mut self, command: ClientCmd) -> Reply {
        match command {
            ClientCmd::SetName(name) => {
                if name.iter().any(|&b| b <= b' ' || b > b'~') {
                    return ClientError::Unsupported(
                        "Client names cannot contain spaces, newlines or special characters.".into(),
                    )
                    .into();
                }
                self.state.name = (!name.is_empty()).then_some(name);
                Reply::ok()
            }
            ClientCmd::GetName => self.state.name.clone().map_or(Reply::Nil, Reply::Bulk),
            ClientCmd::Id => Reply::Int(self.state.id as i64),
            ClientCmd::Kill(id) => match self.proxy.clients.get(&id) {
                Some(stop) => {
                    stop.raise();
                    Reply::Int(1)
                }
                None => Reply::Int(0),
            },
            ClientCmd::SetInfo => Reply::ok(),
            ClientCmd::Info => {
                let name = self
                    .state
                    .name
                    .as_deref()
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default();
                Reply::Bulk(Bytes::from(format!(
                    "id={} name={} db={} resp={}\n",
                    self.state.id,
                    name,
                    self.state.db,
                    if self.state.protocol == Protocol::Resp3 { 3 } else { 2 }
                )))
            }
        }
    }
}

impl Connection {
    /// With a Redis Cluster member, a command's keys must be in one slot; a `WATCH`'s in the
    /// slot of the keys watched before, and inside `MULTI` in the slot of the watched keys
    /// and of the commands queued before (the transaction runs as one script on one shard):
    /// `CROSSSLOT` otherwise, as Redis Cluster answers.
    fn one_hash_slot(&mut self, command: &Command) -> Result<(), ClientError> {
        let Some(slot) = self.proxy.hash_slot_of(command.keys())? else {
            return Ok(());
        };
        let watched = self.proxy.hash_slot_of(self.state.watched.iter().map(|(k, _)| k))?;
        let context = match (command, &self.state.multi) {
            (Command::Watch(_), _) => watched,
            (_, Some(transaction)) => transaction.hash_slot.or(watched),
            (_, None) => return Ok(()),
        };
        if context.is_some_and(|other| other != slot) {
            return Err(ClientError::CrossSlot);
        }
        if let Some(transaction) = &mut self.state.multi {
            transaction.hash_slot = Some(slot);
        }
        Ok(())
    }
}

/// Rule 16: `future`, an acquisition, begins keeping its grants through `starter` the moment
/// it completes, not when its reply is written.
fn kept_from_grant(future: BoxFuture<'static, Outcome>, starter: Option<Starter>) -> BoxFuture<'static, Outcome> {
    let Some(starter) = starter else {
        return future;
    };
    future
        .map(move |mut outcome| {
            outcome.begin_keeping(&starter);
            outcome
        })
        .boxed()
}

/// `future`, with `waiting` counted until it completes (or is dropped with its connection).
fn counted_while(future: BoxFuture<'static, Outcome>, waiting: Option<Waiting>) -> BoxFuture<'static, Outcome> {
    match waiting {
        None => future,
        Some(waiting) => future
            .map(move |outcome| {
                drop(waiting);
                outcome
            })
            .boxed(),
    }
}

/// Writes what the socket takes of `buf` now; with nothing left to write, flushes (TLS keeps
/// some bytes until flushed) and answers 0.
async fn send(writer: &mut WriteHalf<Box<dyn Io>>, buf: &[u8]) -> std::io::Result<usize> {
    if buf.is_empty() {
        writer.flush().await?;
        return Ok(0);
    }
    writer.write(buf).await
}

/// A connection's place in the proxy's list of clients and counts: taken when it starts,
/// given back when it ends, however it ends (a panic of its task unwinds through this too).
struct Listed {
    proxy: Arc<Proxy>,
    id: u64,
}

impl Listed {
    fn new(proxy: &Arc<Proxy>, id: u64, stop: Arc<Stop>) -> Listed {
        proxy.stats.connections.fetch_add(1, Ordering::Relaxed);
        proxy.stats.clients.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(m::CLIENT_CONNECTIONS).increment(1.0);
        proxy.clients.insert(id, stop);
        Listed {
            proxy: proxy.clone(),
            id,
        }
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.proxy.clients.remove(&self.id);
        self.proxy.stats.clients.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(m::CLIENT_CONNECTIONS).decrement(1.0);
    }
}

/// Rule 11: refuses a command that names one of the proxy's own keys.
fn reserved(command: &Command) -> Result<(), ClientError> {
    match command.reserved_key() {
        Some(key) => Err(ClientError::ReservedKey(String::from_utf8_lossy(key).into_owned())),
        None => Ok(()),
    }
}

/// `PING` answers `PONG`, or echoes its argument.
fn pong(message: Option<Bytes>) -> Reply {
    message.map_or(Reply::status("PONG"), Reply::Bulk)
}

#[cfg(test)]
mod tests {
    //! One connection over an in-memory stream, with the embedded masters and a paused clock
    //! (timers run as soon as nothing else can): rule 13's cases, in virtual time.

    use super::*;
    use crate::config::Config;
    use redis_protocol::resp3::decode::complete::decode_bytes_mut;
    use redis_protocol::resp3::types::BytesFrame;
    use tokio::io::DuplexStream;
    use tokio::task::JoinHandle;

    /// A client of `proxy`: its end of the stream, and the connection's task.
    struct Client {
        stream: DuplexStream,
        buf: BytesMut,
        task: JoinHandle<std::io::Result<()>>,
    }

    impl Client {
        async fn connect(proxy: &Arc<Proxy>) -> Client {
            let (ours, theirs) = tokio::io::duplex(1 << 16);
            let (_, shutdown) = watch::channel(false);
            let connection = Connection::new(Box::new(theirs), "test".into(), proxy.clone(), shutdown);
            let mut client = Client {
                stream: ours,
                buf: BytesMut::new(),
                task: tokio::spawn(connection.run()),
            };
            assert!(matches!(client.call(&["HELLO", "3"]).await, BytesFrame::Map { .. }));
            client
        }

        async fn send(&mut self, args: &[&str]) {
            let mut wire = format!("*{}\r\n", args.len());
            for a in args {
                wire.push_str(&format!("${}\r\n{a}\r\n", a.len()));
            }
            self.stream.write_all(wire.as_bytes()).await.unwrap();
        }

        async fn next(&mut self) -> BytesFrame {
            loop {
                if let Some((frame, _, _)) = decode_bytes_mut(&mut self.buf).unwrap() {
                    return frame;
                }
                let n = self.stream.read_buf(&mut self.buf).await.unwrap();
                assert!(n > 0, "the connection closed");
            }
        }

        async fn call(&mut self, args: &[&str]) -> BytesFrame {
            self.send(args).await;
            self.next().await
        }
    }

    async fn proxy(extra: &str) -> Arc<Proxy> {
        let config = Config::parse(&format!("embedded_backends = 3\nmin_keepalive_ttl_ms = 50\n{extra}")).unwrap();
        Proxy::start(config).await.unwrap()
    }

    /// Whether another client could take `key` now (it gives it back at once).
    async fn free(proxy: &Arc<Proxy>, key: &str) -> bool {
        let mut other = Client::connect(proxy).await;
        let took = matches!(
            other.call(&["SET", key, "other", "NX", "PX", "10000"]).await,
            BytesFrame::SimpleString { .. }
        );
        if took {
            other.call(&["LOCK.RELEASE", key, "other"]).await;
        }
        took
    }

    fn int(frame: &BytesFrame) -> i64 {
        match frame {
            BytesFrame::Number { data, .. } => *data,
            other => panic!("not an integer: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_and_read_only_commands_of_a_non_holder_leave_a_session_lock_alone() {
        let proxy = proxy("default_ttl_ms = 300").await;
        let mut shared = Client::connect(&proxy).await;
        assert!(int(&shared.call(&["LOCK.ACQUIRE", "k", "A", "300", "KEEPALIVE"]).await) > 0);
        let release = "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";
        assert_eq!(int(&shared.call(&["EVAL", release, "1", "k", "stale"]).await), 0);
        assert_eq!(int(&shared.call(&["LOCK.RELEASE", "k", "stale"]).await), 0);
        assert_eq!(int(&shared.call(&["DELEX", "k", "IFEQ", "stale"]).await), 0);
        assert!(matches!(
            shared.call(&["SET", "k", "x", "IFEQ", "stale", "PX", "300"]).await,
            BytesFrame::Null
        ));
        assert!(
            int(&shared
                .call(&["EVAL", "return redis.call('pttl',KEYS[1])", "1", "k"])
                .await)
                > 0
        );
        assert!(matches!(shared.call(&["MULTI"]).await, BytesFrame::SimpleString { .. }));
        shared.call(&["DEL", "k"]).await;
        assert!(matches!(
            shared.call(&["DISCARD"]).await,
            BytesFrame::SimpleString { .. }
        ));
        // Ten TTLs later (virtual time), still held.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!free(&proxy, "k").await);
        assert_eq!(proxy.sessions.total(), 1);
        // The holder's own release ends it.
        assert_eq!(int(&shared.call(&["EVAL", release, "1", "k", "A"]).await), 1);
        assert_eq!(proxy.sessions.total(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn end_of_stream_is_seen_while_a_wait_is_in_flight() {
        let proxy = proxy("").await;
        let mut holder = Client::connect(&proxy).await;
        assert!(int(&holder.call(&["LOCK.ACQUIRE", "w", "H", "5000"]).await) > 0);
        let mut w = Client::connect(&proxy).await;
        w.send(&["LOCK.ACQUIRE", "w", "W", "5000", "WAIT", "20000"]).await;
        w.send(&["LOCK.INFO", "w"]).await;
        while proxy.waiters.waiting(0, &Bytes::from_static(b"w")) == 0 {
            tokio::task::yield_now().await;
        }
        drop(w.stream);
        // The connection ends at once, and its request leaves the queue.
        let ended = tokio::time::timeout(Duration::from_millis(100), w.task).await;
        // (Its replies may meet a broken pipe: the client is gone.)
        assert!(matches!(ended, Ok(Ok(_))), "{ended:?}");
        assert_eq!(proxy.waiters.waiting(0, &Bytes::from_static(b"w")), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_is_pushed_while_the_connection_waits_for_another_lock() {
        let proxy = proxy("max_hold_ms = 1000").await;
        let mut other = Client::connect(&proxy).await;
        assert!(int(&other.call(&["LOCK.ACQUIRE", "l2", "O", "10000"]).await) > 0);
        let mut a = Client::connect(&proxy).await;
        let start = Instant::now();
        assert!(int(&a.call(&["LOCK.ACQUIRE", "l1", "A", "3000", "KEEPALIVE"]).await) > 0);
        a.send(&["LOCK.ACQUIRE", "l2", "A", "3000", "WAIT", "4000"]).await;
        a.send(&["LOCK.INFO", "l2"]).await;
        let BytesFrame::Push { data, .. } = a.next().await else {
            panic!("a push first");
        };
        assert_eq!(data.len(), 4);
        let told = start.elapsed();
        assert!(told < Duration::from_millis(1500), "told after {told:?}");
        assert!(matches!(a.next().await, BytesFrame::Null), "then the wait runs out");
        assert!(matches!(a.next().await, BytesFrame::Map { .. }), "then LOCK.INFO");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_loss_report_does_not_end_a_newer_session_lock() {
        let proxy = proxy("").await;
        let mut locks = SessionLocks::new(proxy.clone(), (0, String::new()));
        let grant = || crate::sessions::SessionGrant {
            db: 0,
            key: Bytes::from_static(b"s"),
            token: Bytes::from_static(b"A"),
            ttl: Duration::from_secs(1),
            valid_until: Instant::now() + Duration::from_secs(1),
        };
        let report = |id| Lost {
            db: 0,
            key: Bytes::from_static(b"s"),
            token: Bytes::from_static(b"A"),
            reason: "not-extended",
            id,
        };
        // Kept (id 0), released by its holder, taken again with the same token (id 1).
        locks.start(grant(), None, "default");
        let released = Effect::Released {
            db: 0,
            key: Bytes::from_static(b"s"),
            token: Bytes::from_static(b"A"),
        };
        assert!(locks.apply(released, &Reply::Int(1), true, None).is_empty());
        assert!(!locks.active());
        locks.start(grant(), None, "default");
        // The first keeping's late report leaves the second alone; the second's own ends it.
        assert_eq!(locks.lost(report(0)), None);
        assert!(locks.active());
        assert_eq!(locks.lost(report(1)), Some(report(1)));
        assert!(!locks.active());
    }

    /// A client that never reads: its replies fill the in-memory pipe, no more of its
    /// commands start, and after `client_stall_timeout_ms` without a byte taken it is dropped,
    /// its session lock with it.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_dropped_after_the_stall_timeout() {
        let proxy = proxy("client_stall_timeout_ms = 2000").await;
        let (mut ours, theirs) = tokio::io::duplex(4096);
        let (_, shutdown) = watch::channel(false);
        let task = tokio::spawn(Connection::new(Box::new(theirs), "test".into(), proxy.clone(), shutdown).run());
        ours.write_all(b"*4\r\n$3\r\nSET\r\n$1\r\nq\r\n$1\r\nA\r\n$2\r\nNX\r\n")
            .await
            .unwrap();
        while proxy.sessions.total() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let echo = format!("*2\r\n$4\r\nECHO\r\n$1000\r\n{}\r\n", "x".repeat(1000));
        // 100 KB of replies asked for, none read.
        let (_read, mut write) = tokio::io::split(ours);
        let flood = tokio::spawn(async move {
            for _ in 0..100 {
                if write.write_all(echo.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
        let started = Instant::now();
        let ended = tokio::time::timeout(Duration::from_secs(5), task).await;
        assert!(matches!(ended, Ok(Ok(Err(_)))), "dropped with an error: {ended:?}");
        let after = started.elapsed();
        assert!(after >= Duration::from_millis(2000), "dropped after {after:?}");
        flood.abort();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(proxy.sessions.total(), 0);
        assert!(free(&proxy, "q").await, "its session lock released at once");
    }

    /// One reply larger than `client_output_buffer_limit`, unread: the client is dropped at
    /// once, without waiting for the stall timeout.
    #[tokio::test(start_paused = true)]
    async fn a_reply_past_the_output_limit_drops_its_client() {
        let proxy = proxy("client_output_buffer_limit = 65536").await;
        let (mut ours, theirs) = tokio::io::duplex(4096);
        let (_, shutdown) = watch::channel(false);
        let task = tokio::spawn(Connection::new(Box::new(theirs), "test".into(), proxy.clone(), shutdown).run());
        let big = "x".repeat(100_000);
        let echo = format!("*2\r\n$4\r\nECHO\r\n${}\r\n{big}\r\n", big.len());
        ours.write_all(echo.as_bytes()).await.unwrap();
        let ended = tokio::time::timeout(Duration::from_millis(100), task).await;
        assert!(matches!(ended, Ok(Ok(Err(_)))), "dropped with an error: {ended:?}");
    }

    /// `CLIENT KILL` of a client whose replies wait unread: seen at once (no write is awaited
    /// in the loop), and what is left unread gets only the closing grace.
    #[tokio::test(start_paused = true)]
    async fn client_kill_is_seen_while_replies_wait_unread() {
        let proxy = proxy("").await;
        let (mut ours, theirs) = tokio::io::duplex(1024);
        let (_, shutdown) = watch::channel(false);
        let connection = Connection::new(Box::new(theirs), "test".into(), proxy.clone(), shutdown);
        let id = connection.state.id;
        let task = tokio::spawn(connection.run());
        let echo = format!("*2\r\n$4\r\nECHO\r\n$1000\r\n{}\r\n", "x".repeat(1000));
        for _ in 0..8 {
            ours.write_all(echo.as_bytes()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!task.is_finished(), "waiting for its client to read");
        let started = Instant::now();
        proxy.clients.get(&id).expect("listed").raise();
        let ended = tokio::time::timeout(Duration::from_secs(5), task).await;
        assert!(ended.is_ok(), "the kill was not seen");
        assert!(
            started.elapsed() <= CLOSING_GRACE,
            "closed after {:?}",
            started.elapsed()
        );
        drop(ours);
    }

    #[tokio::test]
    async fn a_lock_too_short_for_any_validity_is_refused_not_retried() {
        // TTL 2 ms is all drift allowance (2 ms + 1 %): every attempt would be granted and
        // undone, and a WAIT would go round again at once for as long as it waits.
        let proxy = proxy("").await;
        let mut a = Client::connect(&proxy).await;
        for wait in [
            &["LOCK.ACQUIRE", "v", "A", "2"][..],
            &["LOCK.ACQUIRE", "v", "A", "2", "WAIT", "1000"],
        ] {
            match a.call(wait).await {
                BytesFrame::SimpleError { data, .. } => assert!(data.contains("no validity"), "{data}"),
                other => panic!("{wait:?}: {other:?}"),
            }
        }
        assert!(int(&a.call(&["LOCK.ACQUIRE", "v", "A", "50"]).await) > 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_task_that_dies_releases_its_session_locks_at_once() {
        // Aborting the task drops the connection as a panic's unwinding would: its session
        // locks are released at once, not left to their TTL, and it is no longer listed.
        let proxy = proxy("").await;
        let mut a = Client::connect(&proxy).await;
        assert!(int(&a.call(&["LOCK.ACQUIRE", "d", "A", "10000", "KEEPALIVE"]).await) > 0);
        assert_eq!(proxy.clients.len(), 1);
        a.task.abort();
        let _ = a.task.await;
        assert_eq!(proxy.clients.len(), 0);
        assert_eq!(proxy.stats.clients.load(Ordering::Relaxed), 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(free(&proxy, "d").await, "released at once, not at its 10 s TTL");
        assert_eq!(proxy.sessions.total(), 0);
    }
}
