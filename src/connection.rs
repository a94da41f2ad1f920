//! One client connection: framing, per-connection state, pipelining with ordered replies.
//!
//! Commands from one connection run concurrently when they touch different keys; a command
//! that touches a key still in flight, or that changes connection state, waits for the
//! commands before it. Replies always go back in request order.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{Duration, Instant};

use crate::auth::{self, Identity};
use crate::command::{ClientCmd, Command, CommandCmd, Condition, Hello, LockCmd};
use crate::error::ClientError;
use crate::glob;
use crate::metrics as m;
use crate::protocol::{Limits, parse_request};
use crate::proxy::info;
use crate::proxy::{Outcome, Proxy, Queued};
use crate::reply::{Protocol, Reply};
use crate::sessions::{Lost, SessionLocks};
use crate::stop::Stop;
use crate::tls::Io;

/// What the connection does after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

/// The state Redis keeps per connection.
#[derive(Debug)]
struct Session {
    id: u64,
    protocol: Protocol,
    db: u32,
    name: Option<Bytes>,
    /// Who the client is, once authenticated.
    login: Login,
    /// Between `MULTI` and `EXEC`: the queued commands, as sent to each master.
    multi: Option<Queue>,
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
}

/// A transaction being queued.
#[derive(Debug, Default)]
struct Queue {
    commands: Vec<Queued>,
    /// A command failed to queue: `EXEC` answers `EXECABORT`.
    failed: bool,
    /// With a Redis Cluster member: the hash slot of the watched and queued keys so far.
    slot: Option<u16>,
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

/// A client connection and its pipeline.
pub struct Connection {
    stream: Box<dyn Io>,
    proxy: Arc<Proxy>,
    session: Session,
    read: BytesMut,
    /// Replies ready to go out, in order, settled (rule 4a) and encoded when written.
    ready: Vec<Outcome>,
    write: BytesMut,
    limits: Limits,
    in_flight: FuturesOrdered<BoxFuture<'static, Outcome>>,
    /// The keys of each in-flight command, oldest first, and how many in-flight commands
    /// touch each key.
    in_flight_keys: VecDeque<Keys>,
    /// With a fast hasher: every command of a connection looks its keys up here; the map holds
    /// only this connection's commands in flight (at most `max_pipeline`).
    busy_keys: HashMap<Bytes, usize, foldhash::fast::RandomState>,
    /// Turns true when the proxy shuts down; read once, when the client is listed (the server
    /// raises the `stop` of every client listed then).
    shutdown: watch::Receiver<bool>,
    /// Locks kept alive while this connection is open, and word of those lost.
    locks: SessionLocks,
    /// Session locks lost that a RESP2 client has not been told of yet: it is, as an error
    /// for its next `LOCK.*` command on that key.
    lost_untold: HashMap<(u32, Bytes), &'static str>,
    /// Turns true when the client is gone (end of stream, shutdown): its requests waiting for
    /// locks stop waiting and leave their queues.
    closed: watch::Sender<bool>,
    /// Raised by `CLIENT KILL ID` (another connection's) or the proxy's shutdown: this one
    /// finishes what is in flight and closes.
    stop: Arc<Stop>,
}

impl Connection {
    /// A new connection; nothing is read until [`Connection::run`].
    pub fn new(stream: Box<dyn Io>, peer: String, proxy: Arc<Proxy>, shutdown: watch::Receiver<bool>) -> Connection {
        let session = Session {
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
        Connection {
            stream,
            locks: SessionLocks::new(proxy.clone(), (session.id, peer)),
            lost_untold: HashMap::new(),
            closed: watch::Sender::new(false),
            stop: Arc::default(),
            proxy,
            session,
            read: BytesMut::with_capacity(4096),
            ready: Vec::new(),
            write: BytesMut::with_capacity(4096),
            limits,
            in_flight: FuturesOrdered::new(),
            in_flight_keys: VecDeque::new(),
            busy_keys: HashMap::default(),
            shutdown,
        }
    }

    /// Serves the client until it disconnects, sends `QUIT`, or sends malformed RESP.
    pub async fn run(mut self) -> std::io::Result<()> {
        let stats = &self.proxy.clone().stats;
        stats.connections.fetch_add(1, Ordering::Relaxed);
        stats.clients.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(m::CLIENT_CONNECTIONS).increment(1.0);
        self.proxy.clients.insert(self.session.id, self.stop.clone());
        // A shutdown that began before this client was listed did not raise its signal:
        // the server raises those it finds listed, after the shutdown flag turned true.
        if *self.shutdown.borrow() {
            self.stop.raise();
        }
        let result = self.serve().await;
        self.proxy.clients.remove(&self.session.id);
        // However the connection ended, its session locks end with it.
        self.locks.release_all().await;
        stats.clients.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(m::CLIENT_CONNECTIONS).decrement(1.0);
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
        loop {
            if self.dispatch_buffered().await? == Flow::Close {
                return self.flush().await;
            }
            self.flush().await?;
            let can_read = self.in_flight.len() < self.proxy.config.max_pipeline;
            // In this order, without drawing a random one each turn: the stop first (it is
            // rare and cheap to check), then replies before reads (each turn takes every
            // reply already done, and reads stop only while replies are ready, which the
            // pipeline's limit bounds).
            tokio::select! {
                biased;
                () = &mut stopped => {
                    // `CLIENT KILL`: as if the client had closed its side. Shutting down: no
                    // new requests; those in flight finish (an acquisition that fails runs its
                    // undo; a wait for a lock ends with nil), their replies go out, then the
                    // connection closes.
                    self.closed.send_replace(true);
                    return self.drain().await;
                }
                Some(reply) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.completed(reply);
                    // Everything else already done goes out in the same write.
                    while let Some(Some(reply)) = self.in_flight.next().now_or_never() {
                        self.completed(reply);
                    }
                }
                lost = self.locks.next_lost() => {
                    self.lock_lost(lost);
                    self.flush().await?;
                }
                () = &mut idle, if self.in_flight.is_empty() && !idle_limit.is_zero() => {
                    if last_read.elapsed() >= idle_limit {
                        // Idle past `timeout`: closed, as Redis closes idle clients.
                        return Ok(());
                    }
                    idle.as_mut().reset(last_read + idle_limit);
                }
                read = self.stream.read_buf(&mut self.read), if can_read => {
                    if !idle_limit.is_zero() {
                        last_read = Instant::now();
                    }
                    if read? == 0 {
                        // The client closed its side: finish what it asked for (but wait for
                        // no lock on its behalf), then stop.
                        self.closed.send_replace(true);
                        return self.drain().await;
                    }
                }
            }
        }
    }

    /// Parses and starts every complete request in the read buffer, while the pipeline has room.
    async fn dispatch_buffered(&mut self) -> std::io::Result<Flow> {
        while self.in_flight.len() < self.proxy.config.max_pipeline {
            match parse_request(&mut self.read, self.limits) {
                Ok(None) => break,
                Ok(Some(args)) if args.is_empty() => continue,
                Ok(Some(args)) => {
                    if self.dispatch(args).await? == Flow::Close {
                        return Ok(Flow::Close);
                    }
                }
                Err(e) => {
                    // Malformed RESP: answer what came before, report, and close only this connection.
                    self.drain().await?;
                    self.push(e.into());
                    return Ok(Flow::Close);
                }
            }
        }
        Ok(Flow::Continue)
    }

    /// Starts one command, or runs it in place when it must run alone.
    async fn dispatch(&mut self, args: Vec<Bytes>) -> std::io::Result<Flow> {
        self.proxy.stats.commands.fetch_add(1, Ordering::Relaxed);
        let command = match Command::parse(args) {
            Ok(command) => command,
            Err(e) => {
                if let Some(queue) = &mut self.session.multi {
                    queue.failed = true;
                }
                return Ok(self.ready(e.into()));
            }
        };
        if matches!(self.session.login, Login::None)
            && !matches!(
                command,
                Command::Auth { .. } | Command::Hello(_) | Command::Quit | Command::Reset
            )
        {
            return Ok(self.ready(ClientError::NoAuth.into()));
        }
        if let Err(e) = self
            .check_sizes(&command)
            .and_then(|()| reserved(&command))
            .and_then(|()| self.one_slot(&command))
            .and_then(|()| auth::permit(self.session.login.user(), &command))
        {
            if let Some(queue) = &mut self.session.multi {
                queue.failed = true;
            }
            return Ok(self.ready(e.into()));
        }
        if let Some(reply) = self.session_lock_hook(&command) {
            return Ok(self.ready(reply));
        }
        if self.session.multi.is_some()
            && !matches!(
                command,
                Command::Exec | Command::Discard | Command::Multi | Command::Watch(_) | Command::Quit | Command::Reset
            )
        {
            return Ok(self.queue(command));
        }
        match command.keys() {
            Some(keys) if keys.iter().any(|k| self.busy_keys.contains_key(k)) => {
                // Same key as a command in flight: keep their order on the masters.
                self.drain().await?;
                Ok(self.start(command))
            }
            Some(_) => Ok(self.start(command)),
            None => {
                self.drain().await?;
                let flow = self.run_alone(command).await;
                // Out at once: a reply must not wait behind whatever is parsed next (rule 4a).
                self.flush().await?;
                Ok(flow)
            }
        }
    }

    /// Starts a command that may run concurrently with others of this connection.
    fn start(&mut self, command: Command) -> Flow {
        let keys = Keys::of(command.keys().unwrap_or(&[]));
        let future = match command {
            Command::Ping(msg) => return self.ready(pong(msg)),
            Command::Echo(msg) => return self.ready(Reply::Bulk(msg)),
            command => self.proxy.execute(self.session.db, command, &self.closed),
        };
        for key in keys.as_slice() {
            *self.busy_keys.entry(key.clone()).or_default() += 1;
        }
        self.in_flight_keys.push_back(keys);
        self.in_flight.push_back(future);
        Flow::Continue
    }

    /// What a command means for this connection's session locks: a `LOCK.*` command on a lock
    /// lost since the client last heard gets the loss as its answer (RESP2 clients have no
    /// other way to learn of it); a command that releases or rewrites a session lock's key
    /// ends its keepalive (the holder manages the key itself now).
    fn session_lock_hook(&mut self, command: &Command) -> Option<Reply> {
        let db = self.session.db;
        if let Command::Lock(l) = command
            && let Some(reason) = self.lost_untold.remove(&(db, l.key().clone()))
        {
            return Some(
                ClientError::LockLost {
                    key: String::from_utf8_lossy(l.key()).into_owned(),
                    reason,
                }
                .into(),
            );
        }
        let ends_keepalive = match command {
            Command::Lock(LockCmd::Release { .. }) | Command::DelEx(_) | Command::Eval(_) => true,
            Command::Set(set) => set.condition != Condition::Nx,
            Command::Forward(f) => f.args[0].eq_ignore_ascii_case(b"DEL") || f.args[0].eq_ignore_ascii_case(b"UNLINK"),
            _ => false,
        };
        if ends_keepalive {
            for key in command.keys().unwrap_or(&[]) {
                self.locks.forget(db, key);
            }
        }
        None
    }

    /// A session lock of this connection was lost: a RESP3 client is told at once with a push
    /// message (`lock-lost`, key, token, reason), a RESP2 client at its next `LOCK.*` command
    /// on that key.
    fn lock_lost(&mut self, lost: Lost) {
        self.locks.forget(lost.db, &lost.key);
        if self.session.protocol == Protocol::Resp3 {
            self.push(Reply::Push(vec![
                Reply::bulk("lock-lost"),
                Reply::Bulk(lost.key),
                Reply::Bulk(lost.token),
                Reply::bulk(lost.reason),
            ]));
        } else {
            self.lost_untold.insert((lost.db, lost.key), lost.reason);
        }
    }

    /// Refuses lock commands whose keys or written value exceed `max_key_len` /
    /// `max_value_len`: every master would store a copy.
    fn check_sizes(&self, command: &Command) -> Result<(), ClientError> {
        let config = &self.proxy.config;
        let too_long = command
            .keys()
            .unwrap_or(&[])
            .iter()
            .any(|k| k.len() > config.max_key_len);
        if too_long {
            return Err(ClientError::Unsupported(format!(
                "key longer than max_key_len ({} bytes)",
                config.max_key_len
            )));
        }
        let value = match command {
            Command::Set(set) => Some(&set.value),
            Command::SetNx { value, .. } => Some(value),
            Command::Lock(LockCmd::Acquire { token, .. } | LockCmd::Fence { token, .. }) => Some(token),
            _ => None,
        };
        if value.is_some_and(|v| v.len() > config.max_value_len) {
            return Err(ClientError::Unsupported(format!(
                "value longer than max_value_len ({} bytes)",
                config.max_value_len
            )));
        }
        Ok(())
    }

    /// Queues a command between `MULTI` and `EXEC`.
    fn queue(&mut self, command: Command) -> Flow {
        let queued = self.proxy.queued_args(command);
        let Some(queue) = &mut self.session.multi else {
            return Flow::Continue;
        };
        let reply = match queued {
            Ok(args) => {
                queue.commands.push(args);
                Reply::status("QUEUED")
            }
            Err(e) => {
                queue.failed = true;
                e.into()
            }
        };
        self.ready(reply)
    }

    /// Queues an already-known reply behind the commands in flight.
    fn ready(&mut self, reply: Reply) -> Flow {
        self.in_flight_keys.push_back(Keys::Many(Vec::new()));
        self.in_flight
            .push_back(std::future::ready(Outcome::plain(reply)).boxed());
        Flow::Continue
    }

    /// Records a finished command (the oldest in flight) and queues its reply.
    fn completed(&mut self, reply: Outcome) {
        let keys = self.in_flight_keys.pop_front();
        for key in keys.as_ref().map_or(&[][..], Keys::as_slice) {
            if let Some(count) = self.busy_keys.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    self.busy_keys.remove(key);
                }
            }
        }
        self.ready.push(reply);
    }

    /// Waits for every command in flight, writing each reply as soon as it is its turn.
    async fn drain(&mut self) -> std::io::Result<()> {
        while let Some(reply) = self.in_flight.next().await {
            self.completed(reply);
            while let Some(Some(reply)) = self.in_flight.next().now_or_never() {
                self.completed(reply);
            }
            self.flush().await?;
        }
        Ok(())
    }

    fn push(&mut self, reply: Reply) {
        self.ready.push(Outcome::plain(reply));
    }

    /// Writes the ready replies. Rule 4a: each is settled now, at the moment it is written: a
    /// grant whose validity ran out while it waited for its turn becomes its failure value
    /// and is undone, a validity figure is what is left.
    async fn flush(&mut self) -> std::io::Result<()> {
        let now = Instant::now();
        // The buffer is put back after, so its capacity serves the next flush.
        let mut ready = std::mem::take(&mut self.ready);
        for outcome in ready.drain(..) {
            let settled = outcome.settle(now);
            if let Some(undo) = settled.undo {
                metrics::counter!(m::STALE_REPLIES).increment(1);
                let proxy = self.proxy.clone();
                tokio::spawn(async move { proxy.engine.undo(&undo).await });
            }
            if let Some(grant) = settled.session {
                self.locks.start(grant, self.session.name.clone());
            }
            settled.reply.encode(self.session.protocol, &mut self.write);
        }
        self.ready = ready;
        if !self.write.is_empty() {
            self.stream.write_all(&self.write).await?;
            self.write.clear();
        }
        Ok(())
    }

    /// Runs a command that changes connection state or touches the masters without a key,
    /// after everything before it finished.
    async fn run_alone(&mut self, command: Command) -> Flow {
        let reply = match command {
            Command::Quit => {
                self.push(Reply::ok());
                return Flow::Close;
            }
            Command::Reset => {
                self.locks.release_all().await;
                self.lost_untold.clear();
                self.session.protocol = Protocol::Resp2;
                self.session.db = 0;
                self.session.name = None;
                self.session.multi = None;
                self.session.watched.clear();
                self.session.login = Login::initial(&self.proxy);
                Reply::status("RESET")
            }
            Command::Hello(hello) => self.hello(hello),
            Command::Auth { user, password } => match self.authenticate(user.as_deref(), &password) {
                Ok(()) => Reply::ok(),
                Err(e) => e.into(),
            },
            Command::Select(db) => match u32::try_from(db) {
                Ok(db) if db < self.proxy.config.databases => {
                    self.session.db = db;
                    Reply::ok()
                }
                _ => ClientError::DbOutOfRange.into(),
            },
            Command::Client(c) => self.client(c),
            Command::Multi if self.session.multi.is_some() => ClientError::NestedMulti.into(),
            Command::Multi => {
                self.session.multi = Some(Queue::default());
                Reply::ok()
            }
            Command::Exec => self.exec().await,
            Command::Discard => match self.session.multi.take() {
                Some(_) => {
                    self.session.watched.clear();
                    Reply::ok()
                }
                None => ClientError::DiscardWithoutMulti.into(),
            },
            Command::Watch(_) if self.session.multi.is_some() => ClientError::WatchInMulti.into(),
            Command::Watch(keys) => match self.proxy.watch(self.session.db, keys).await {
                Ok(watched) => {
                    self.session.watched.extend(watched);
                    Reply::ok()
                }
                Err(error) => error,
            },
            Command::Proxy(c) => self.proxy.admin(c),
            Command::Unwatch => {
                self.session.watched.clear();
                Reply::ok()
            }
            Command::Info(sections) => {
                let operator = auth::is_operator(self.session.login.user());
                Reply::Bulk(Bytes::from(info::render(&self.proxy, &sections, operator)))
            }
            Command::Command(CommandCmd::Table) => Reply::Array(Vec::new()),
            Command::Command(CommandCmd::Count) => Reply::Int(0),
            Command::ConfigGet(patterns) => self.config_get(&patterns),
            command => {
                let outcome = self.proxy.execute(self.session.db, command, &self.closed).await;
                self.ready.push(outcome);
                return Flow::Continue;
            }
        };
        self.push(reply);
        Flow::Continue
    }

    /// `EXEC`: runs the queue (guarded by the watched keys); always ends the transaction.
    async fn exec(&mut self) -> Reply {
        let Some(queue) = self.session.multi.take() else {
            return ClientError::ExecWithoutMulti.into();
        };
        let watched = std::mem::take(&mut self.session.watched);
        if queue.failed {
            return ClientError::ExecAbort.into();
        }
        self.proxy.exec(self.session.db, &watched, &queue.commands).await
    }

    /// `HELLO`: authenticate and name if asked, switch protocol, describe the server.
    fn hello(&mut self, hello: Hello) -> Reply {
        if let Some((user, password)) = &hello.auth
            && let Err(e) = self.authenticate(Some(user), password)
        {
            return e.into();
        }
        if matches!(self.session.login, Login::None) {
            return ClientError::NoAuth.into();
        }
        if let Some(name) = hello.setname {
            self.session.name = Some(name);
        }
        if let Some(protocol) = hello.protocol {
            self.session.protocol = protocol;
        }
        let proto = match self.session.protocol {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        };
        let field = |k: &'static str, v: Reply| (Reply::bulk(k), v);
        Reply::Map(vec![
            field("server", Reply::bulk("redis")),
            field("version", Reply::bulk(info::REDIS_VERSION)),
            field("proto", Reply::Int(proto)),
            field("id", Reply::Int(self.session.id as i64)),
            field("mode", Reply::bulk("standalone")),
            field("role", Reply::bulk("master")),
            field("modules", Reply::Array(Vec::new())),
        ])
    }

    /// Checks credentials against `requirepass` (user `default` only).
    fn authenticate(&mut self, user: Option<&[u8]>, password: &[u8]) -> Result<(), ClientError> {
        match self.proxy.access.authenticate(user, password) {
            Ok(identity) => {
                self.session.login = identity.map_or(Login::Default, Login::User);
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
                self.session.name = (!name.is_empty()).then_some(name);
                Reply::ok()
            }
            ClientCmd::GetName => self.session.name.clone().map_or(Reply::Nil, Reply::Bulk),
            ClientCmd::Id => Reply::Int(self.session.id as i64),
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
                    .session
                    .name
                    .as_deref()
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default();
                Reply::Bulk(Bytes::from(format!(
                    "id={} name={} db={} resp={}\n",
                    self.session.id,
                    name,
                    self.session.db,
                    if self.session.protocol == Protocol::Resp3 { 3 } else { 2 }
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
    fn one_slot(&mut self, command: &Command) -> Result<(), ClientError> {
        let keys = match command {
            Command::Watch(keys) => keys.as_slice(),
            other => other.keys().unwrap_or(&[]),
        };
        let Some(slot) = self.proxy.slot_of(keys)? else {
            return Ok(());
        };
        let watched = self.proxy.slot_of(self.session.watched.iter().map(|(k, _)| k))?;
        let context = match (command, &self.session.multi) {
            (Command::Watch(_), _) => watched,
            (_, Some(queue)) => queue.slot.or(watched),
            (_, None) => return Ok(()),
        };
        if context.is_some_and(|other| other != slot) {
            return Err(ClientError::CrossSlot);
        }
        if let Some(queue) = &mut self.session.multi {
            queue.slot = Some(slot);
        }
        Ok(())
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
