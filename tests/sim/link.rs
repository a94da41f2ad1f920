//! The wire between one proxy and one master, as the quorum engine's [`Backend`].
//!
//! Like the proxy's real backend, a link is one connection, so it is FIFO: a request never
//! overtakes an earlier one, nor a reply an earlier reply. Each message is delayed by the
//! weather and may be lost. Delivery runs in tasks of its own, so a request the engine gave
//! up on (its fan-out's deadline passed) still reaches the master and executes later: that
//! late execution is what undo and release have to cope with. A message lost on the way gives
//! its place up unanswered (`Place::forget`): only the deadline ends the wait, as on a network.
//!
//! Rule 8 is modelled as the proxy does it: a connection is opened to one run of the master,
//! and the first request after a crash finds it broken; the next one reconnects, and reading
//! the master's identity on the new connection tells [`Health`] about the restart, before the
//! connection carries any request. A periodic probe does the same on its own. A new
//! connection is then greeted as the proxy greets it: fencing's epoch check (F3) demotes an
//! epoch another process wrote, such as the one a promoted replica copied from its master.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_proxy::backend::health::{Health, QuarantineMode, State};
use redlock_proxy::backend::{Backend, BackendError, Place, Request};
use redlock_proxy::clock::TokioClock;
use redlock_proxy::quorum::{Answer, EpochCheck};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::master::{SimMaster, lock};
use super::rng::Rng;
use super::world::World;

/// A request on its way, with what will happen to its reply.
struct Envelope {
    arrival: Instant,
    /// The master run the connection was opened to.
    epoch: u64,
    request: Request,
    reply_lost: bool,
    reply_delay: Duration,
    reply: oneshot::Sender<Answer>,
}

/// A reply on its way back.
struct Returning {
    arrival: Instant,
    answer: Answer,
    reply: oneshot::Sender<Answer>,
}

/// One proxy's connection to one master.
pub struct SimLink {
    name: String,
    master: Arc<SimMaster>,
    world: Arc<World>,
    health: Health,
    /// The master run this connection talks to; `None` when it must reconnect. Shared with
    /// the delivery task, which breaks it when a request finds that run gone.
    conn: Arc<Mutex<Option<u64>>>,
    rng: Mutex<Rng>,
    /// When the last request sent will arrive: none may arrive before it (FIFO).
    last_arrival: Mutex<Instant>,
    outbox: mpsc::UnboundedSender<Envelope>,
}

impl SimLink {
    /// Proxy `proxy`'s link to `master`, in quarantine `mode`, connected at once (the proxy
    /// connects to every master at start-up). Spawns the delivery tasks.
    pub fn open(world: &Arc<World>, proxy: usize, master: &Arc<SimMaster>, mode: QuarantineMode, rng: Rng) -> SimLink {
        let name = format!("p{proxy}-m{}", master.index);
        let conn = Arc::new(Mutex::new(None));
        let (outbox, inbox) = mpsc::unbounded_channel();
        let (replies, returning) = mpsc::unbounded_channel();
        let deliverer = Deliverer {
            name: name.clone(),
            world: world.clone(),
            master: master.clone(),
            conn: conn.clone(),
        };
        tokio::spawn(deliverer.run(inbox, replies));
        tokio::spawn(return_replies(returning));
        let health = Health::new(name.clone(), Arc::new(TokioClock::new()), mode, world.cfg.quarantine());
        let link = SimLink {
            name,
            master: master.clone(),
            world: world.clone(),
            health,
            conn,
            rng: Mutex::new(rng),
            last_arrival: Mutex::new(Instant::now()),
            outbox,
        };
        link.probe();
        link
    }

    /// The proxy's periodic health probe (`INFO server`): a reachable master is observed
    /// (a new run id quarantines it, rule 8), an unreachable one is marked down.
    pub fn probe(&self) {
        let mut conn = lock(&self.conn);
        if !self.master.is_reachable() {
            self.health.failed("probe failed");
            if !self.master.is_up() {
                *conn = None;
            }
            return;
        }
        let (epoch, run_id, uptime) = self.master.identity();
        self.health.observed(&run_id, uptime);
        if *conn != Some(epoch) {
            self.master.greet(&EpochCheck, &run_id);
        }
        *conn = Some(epoch);
    }

    /// Whether a request now would be sent and answered: connected to the master's current
    /// run, admitted by health (not down, not quarantined), and the master reachable.
    pub fn is_good(&self) -> bool {
        let connected = lock(&self.conn).is_some();
        connected && self.health.state() == State::Up && self.master.is_reachable()
    }

    /// The master behind this link.
    pub fn master(&self) -> &Arc<SimMaster> {
        &self.master
    }

    /// The connection to use: the current one (which may talk to a run that has since
    /// crashed: the request will find out), or a new one, whose first act is to read the
    /// master's identity (rule 8, before the connection carries any request).
    fn connection(&self) -> Result<u64, BackendError> {
        let mut conn = lock(&self.conn);
        if let Some(epoch) = *conn {
            return Ok(epoch);
        }
        if !self.master.is_reachable() {
            self.health.failed("connection refused");
            return Err(BackendError::Down);
        }
        let (epoch, run_id, uptime) = self.master.identity();
        self.world
            .note(|| format!("{} reconnects: run_id {run_id}, uptime {uptime:?}", self.name));
        self.health.observed(&run_id, uptime);
        self.master.greet(&EpochCheck, &run_id);
        *conn = Some(epoch);
        Ok(epoch)
    }

    /// Puts `request` on the wire; `None` when it is lost before reaching the master.
    fn send(&self, request: &Request, epoch: u64) -> Option<oneshot::Receiver<Answer>> {
        let fate = self.world.fate(&mut lock(&self.rng));
        if fate.request_lost || self.master.is_partitioned() {
            self.world.tally(|t| t.lost += 1);
            self.world
                .note(|| format!("{} request LOST: {}", self.name, describe(request)));
            return None;
        }
        let arrival = {
            let mut last = lock(&self.last_arrival);
            *last = (Instant::now() + fate.request_delay).max(*last);
            *last
        };
        let (reply, answer) = oneshot::channel();
        let envelope = Envelope {
            arrival,
            epoch,
            request: request.clone(),
            reply_lost: fate.reply_lost,
            reply_delay: fate.reply_delay,
            reply,
        };
        self.outbox.send(envelope).ok()?;
        Some(answer)
    }
}

impl Backend for SimLink {
    fn name(&self) -> &str {
        &self.name
    }

    fn run_id(&self) -> Option<String> {
        self.health.run_id()
    }

    fn start(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, place: Place) {
        // The identity is read on a new connection before admission is decided (rule 8).
        let epoch = self.connection().and_then(|epoch| {
            let admitted = if request.cleanup {
                self.health.admit_cleanup()
            } else {
                self.health.admit()
            };
            admitted.map(|()| epoch)
        });
        let epoch = match epoch {
            Ok(epoch) => epoch,
            Err(e) => {
                self.world.note(|| {
                    let reachable = self.master.is_reachable();
                    format!(
                        "{} refuses {} locally: {e} (master reachable: {reachable})",
                        self.name,
                        describe(request)
                    )
                });
                return place.complete(Err(e));
            }
        };
        match self.send(request, epoch) {
            Some(answer) => {
                let (link, fallback) = (self.clone(), fallback.cloned());
                tokio::spawn(async move {
                    let answer = match (answer.await, fallback) {
                        // As the proxy's connection does: the script by source, in its place.
                        (Ok(Ok(reply)), Some(fallback)) if reply.is_error_code("NOSCRIPT") && place.is_open() => {
                            match link.send(&fallback, epoch) {
                                Some(again) => again.await,
                                None => return place.forget(),
                            }
                        }
                        (answer, _) => answer,
                    };
                    match answer {
                        Ok(answer) => place.complete(answer),
                        Err(_) => place.forget(),
                    }
                });
            }
            // Lost on the way or on the way back: only the fan-out's deadline ends the wait.
            None => place.forget(),
        }
    }
}

/// The master's end of a link: takes requests in order, each at its arrival time.
struct Deliverer {
    name: String,
    world: Arc<World>,
    master: Arc<SimMaster>,
    conn: Arc<Mutex<Option<u64>>>,
}

impl Deliverer {
    /// Delivers until the link is dropped.
    async fn run(self, mut inbox: mpsc::UnboundedReceiver<Envelope>, replies: mpsc::UnboundedSender<Returning>) {
        let mut last_reply = Instant::now();
        while let Some(envelope) = inbox.recv().await {
            tokio::time::sleep_until(envelope.arrival).await;
            let Some(answer) = self.execute(&envelope) else {
                continue;
            };
            if envelope.reply_lost || self.master.is_partitioned() {
                self.world.tally(|t| t.lost += 1);
                self.world.note(|| format!("{} reply LOST", self.name));
                continue;
            }
            last_reply = (Instant::now() + envelope.reply_delay).max(last_reply);
            let returning = Returning {
                arrival: last_reply,
                answer,
                reply: envelope.reply,
            };
            if replies.send(returning).is_err() {
                return;
            }
        }
    }

    /// Runs one request at the master; `None` when a partition swallowed it on the way.
    fn execute(&self, envelope: &Envelope) -> Option<Answer> {
        if self.master.is_partitioned() {
            self.world.tally(|t| t.lost += 1);
            self.world.note(|| format!("{} request LOST in partition", self.name));
            return None;
        }
        let answer = self.master.deliver(&envelope.request, envelope.epoch);
        if answer.is_err() {
            let mut conn = lock(&self.conn);
            if *conn == Some(envelope.epoch) {
                *conn = None;
            }
        }
        self.world.note(|| {
            let request = describe(&envelope.request);
            format!("{} executes {request} -> {answer:?}", self.name)
        });
        Some(answer)
    }
}

/// The proxy's end of a link: hands replies over in order, each at its arrival time.
async fn return_replies(mut returning: mpsc::UnboundedReceiver<Returning>) {
    while let Some(r) = returning.recv().await {
        tokio::time::sleep_until(r.arrival).await;
        // The engine may have given up on it (timeout): then nobody is listening.
        let _ = r.reply.send(r.answer);
    }
}

/// A short form of a request for the trace: long arguments (scripts, SHA1s) abbreviated.
fn describe(request: &Request) -> String {
    let args: Vec<String> = request
        .args
        .iter()
        .map(|a| {
            let text = String::from_utf8_lossy(a);
            if text.chars().count() > 16 {
                format!("{}…", text.chars().take(8).collect::<String>())
            } else {
                text.into_owned()
            }
        })
        .collect();
    args.join(" ")
}
