//! One pipelined connection to a master: many requests in flight, written together.
//!
//! A request is appended to the connection's output buffer, and its [`Place`] to the requests
//! in flight, in one step under one lock, so the n-th reply is the n-th request's (a master
//! answers a connection's requests in order). One writer task sends everything appended
//! since its last write in a single write (as twemproxy does); it is woken only when the
//! connection goes from idle to busy. One reader task decodes the replies
//! (`decode`) and completes each request's place, from where the fan-out decides whether
//! the waiting client must be woken. No channel, oneshot or task per request.
//!
//! The writer runs only after every client that was ready in the same turn of the event
//! loop has queued its request, so on its own it would send them all in one batch, and the
//! master would idle while the proxy reads them and then work while the proxy idles (where
//! they do not share a core, the two take turns instead of working at once). So over plain
//! TCP the caller writes what is queued itself, without waiting for the writer, once at
//! least [`EARLY_WRITE`] requests and at least as many as the master has in hand are
//! waiting ([`Shared::write_early`]): the master gets work while it would otherwise idle,
//! and a busy master still gets large batches.
//!
//! Acquisitions queued one after another, not yet written, share one transaction
//! ([`Shared::join`]): a master then runs `MULTI`, `EXEC` and the clock reading once for all
//! of them, instead of once each (`super::acquire`).
//!
//! A request whose fan-out stopped waiting (its deadline passed) is still sent and its reply
//! discarded: the order on the connection is what makes a later release land after an
//! earlier `SET` (rule 5).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;
use tokio_rustls::TlsConnector;

use super::{Answer, Form, Place, acquire, connection_lost, decode};
use crate::reply::Reply;
use crate::tls;
use crate::wire::encode;

/// A request sent and not yet answered.
struct InFlight {
    place: Place,
    /// The script by source, sent instead should the master answer `NOSCRIPT`.
    fallback: Option<Bytes>,
    /// Sent after `ASKING` (a cluster slot being migrated), and so is its fallback.
    asking: bool,
    /// How many replies make its answer, and how they fold into one.
    form: Form,
    /// How many of its replies were read, for a request of several ([`Form::Acquisition`]).
    seen: usize,
    /// For an acquisition, how many share its transaction: itself and the ones queued right
    /// after it that joined ([`Shared::join`]); 0 for one that joined an earlier one's (it is
    /// answered with that one, never on its own).
    members: usize,
    /// The first error reply among them (a transaction's command refused when queued): the
    /// answer when `EXEC` aborts, so a refused write reads as that failure, never as a refusal
    /// of the lock (rule 5a).
    error: Option<Reply>,
}

/// What the callers, the writer and the reader share: the bytes going out, and the requests
/// sent whose replies are awaited.
#[derive(Default)]
struct Outbox {
    /// Appended, not yet written.
    out: BytesMut,
    /// Sent (or about to be), not yet answered, oldest first.
    in_flight: VecDeque<InFlight>,
    /// The writer has been woken and not yet found `out` empty.
    writing: bool,
    /// The writer holds a batch it has not finished writing: nothing else may be written
    /// before it.
    writer_busy: bool,
    /// How many of `in_flight` (the last ones) were queued after the last write began: the
    /// rest the master has in hand (or has answered, its replies not yet read).
    unwritten: usize,
    /// How many acquisitions share the transaction at the end of `out`, not yet written, that a
    /// next one may join (0: none may).
    open: usize,
    /// Where in `out` that transaction begins (its `MULTI`), while `open` is not 0.
    open_at: usize,
    /// The scripts (SHA1s) sent on this connection so far ([`Outbox::first_run`]).
    scripts: std::collections::HashSet<[u8; 40]>,
}

/// How many scripts a connection remembers having sent; past it, it forgets them all (each is
/// then sent by source once more).
const SCRIPTS_KNOWN: usize = 1024;

impl Outbox {
    /// Whether `encoded` is an `EVALSHA` of a script not sent on this connection before (now
    /// noted as sent). Such a script goes by source at once: `EVALSHA` would cost a `NOSCRIPT`
    /// and a second round trip, which a master far away (a round trip near
    /// `backend_timeout_ms`) answers too late; run once, the master has it for `EVALSHA`.
    fn first_run(&mut self, encoded: &[u8]) -> bool {
        let Some(sha) = sha_of(encoded) else {
            return false;
        };
        if self.scripts.contains(&sha) {
            return false;
        }
        if self.scripts.len() >= SCRIPTS_KNOWN {
            self.scripts.clear();
        }
        self.scripts.insert(sha);
        true
    }
}

/// The SHA1 of an `EVALSHA` request as this proxy encodes it (`*n`, `EVALSHA`, the 40-digit
/// SHA1, ...); `None` for any other request.
fn sha_of(encoded: &[u8]) -> Option<[u8; 40]> {
    let header = encoded.iter().position(|&b| b == b'\n')? + 1;
    let rest = encoded.get(header..)?.strip_prefix(b"$7\r\nEVALSHA\r\n$40\r\n")?;
    rest.get(..40)?.try_into().ok()
}

impl InFlight {
    fn new(place: Place, fallback: Option<Bytes>, asking: bool, form: Form, members: usize) -> InFlight {
        InFlight {
            place,
            fallback,
            asking,
            form,
            seen: 0,
            members,
            error: None,
        }
    }

    /// How many replies answer it: one more for each acquisition that joined its transaction
    /// (a `QUEUED`), and one for the clock reading a shared transaction begins with.
    fn replies(&self) -> usize {
        let joined = self.members.saturating_sub(1);
        self.form.replies() + joined + usize::from(joined > 0)
    }
}

/// The most acquisitions one transaction takes. `benches/acquire_forms.py`: a master's CPU per
/// acquisition, 16 deep, is 1.46× a `SET NX PX`'s in a transaction each, 1.14× four to a
/// transaction, 1.04× sixteen (BENCHMARKS.md, "The masters' cost of exactness").
const MAX_MEMBERS: usize = 32;

/// The fewest requests written early, by their caller, rather than by the writer at the end
/// of the turn ([`Shared::write_early`]). `benches/ab.sh` in both layouts, against the writer
/// alone: where the masters have a core of their own, N=1 at `-c 50` from 0.73 to about
/// 1.0 times nutcracker's rate; 1, 8 and 16 were no better, 1 cost N=5 on shared cores, and
/// 16's fewer writes there did not show in throughput (BENCHMARKS.md, fourth pass).
const EARLY_WRITE: usize = 4;

struct Shared {
    outbox: Mutex<Outbox>,
    /// Wakes the writer when the connection goes from idle to busy, fails, or is dropped.
    write: Notify,
    dead: AtomicBool,
    /// Whether acquisitions may share a transaction: not on a cluster's node, where the keys of
    /// one transaction must share a slot.
    join: AtomicBool,
    /// Every [`Pipeline`] handle is gone: the writer closes its half, so the master closes
    /// the connection and the reader ends too.
    dropped: AtomicBool,
    /// Wakes whoever waits for the connection to fail ([`Pipeline::closed`]).
    died: Notify,
    /// The socket, for the callers' early writes: plain TCP only (a TLS stream's writes go
    /// through its session, which the writer owns).
    socket: Option<Arc<OwnedWriteHalf>>,
}

/// A pipelined connection to one master. Cloning shares the connection; dropping the last
/// clone closes it.
#[derive(Clone)]
pub struct Pipeline {
    shared: Arc<Shared>,
    _handle: Arc<Handle>,
}

/// Held by the [`Pipeline`] clones only (not by the connection's tasks): its drop tells the
/// tasks that nobody can send any more.
struct Handle(Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.dropped.store(true, Ordering::Relaxed);
        self.0.write.notify_one();
    }
}

impl Pipeline {
    /// Opens a connection to `addr` (`host:port`), over TLS when `tls` gives the connector
    /// and the host name to verify.
    pub async fn connect(addr: &str, tls: Option<(&TlsConnector, &str)>) -> std::io::Result<Pipeline> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(match tls {
            None => {
                let (read, write) = stream.into_split();
                let write = Arc::new(write);
                Pipeline::start(read, Tcp(write.clone()), Some(write))
            }
            Some((connector, host)) => {
                let (read, write) = tokio::io::split(tls::connect(connector, host, stream).await?);
                Pipeline::start(read, write, None)
            }
        })
    }

    /// Starts the writer and reader tasks over the two halves of a connection (`socket`: the
    /// write half again, for early writes, when it is plain TCP).
    fn start<R, W>(read: R, write: W, socket: Option<Arc<OwnedWriteHalf>>) -> Pipeline
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            outbox: Mutex::default(),
            write: Notify::new(),
            dead: AtomicBool::new(false),
            join: AtomicBool::new(false),
            dropped: AtomicBool::new(false),
            died: Notify::new(),
            socket,
        });
        tokio::spawn(shared.clone().write_loop(write));
        tokio::spawn(shared.clone().read_loop(read));
        Pipeline {
            _handle: Arc::new(Handle(shared.clone())),
            shared,
        }
    }

    /// Whether acquisitions may share a transaction (they do not until told they may).
    pub fn join_acquisitions(&self, join: bool) {
        self.shared.join.store(join, Ordering::Relaxed);
    }

    /// Whether the connection failed (every later request fails at once).
    pub fn is_dead(&self) -> bool {
        self.shared.is_dead()
    }

    /// Resolves once the connection has failed.
    pub async fn closed(&self) {
        let died = self.shared.died.notified();
        tokio::pin!(died);
        died.as_mut().enable();
        if !self.is_dead() {
            died.await;
        }
    }

    /// Sends one request (already RESP-encoded); its answer completes `place`. On `NOSCRIPT`,
    /// `fallback` (the script by source) is sent instead if the place is still open.
    /// Such a re-send lands behind requests sent meanwhile, which is why the scripts whose
    /// place in the connection's order matters are never sent by SHA1
    /// (`ScriptCall::in_order`).
    pub fn send(&self, encoded: &[u8], form: Form, fallback: Option<Bytes>, place: Place) {
        self.shared.send(encoded, form, fallback, place, false);
    }

    /// [`Pipeline::send`] right after `ASKING`, with nothing between them: a cluster node
    /// serves a key of a slot it is importing only to the command that follows `ASKING`.
    pub fn send_asking(&self, encoded: &[u8], form: Form, fallback: Option<Bytes>, place: Place) {
        self.shared.send(encoded, form, fallback, place, true);
    }

    /// Sends a command given as arguments and waits for its reply (start-up and probes).
    pub async fn command(&self, args: &[&[u8]]) -> Answer {
        let (place, answer) = super::lone();
        self.send(&encode(args.iter().copied()), Form::One, None, place);
        answer.await
    }
}

impl Shared {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    fn outbox(&self) -> MutexGuard<'_, Outbox> {
        // Every critical section is an append or a pop: a panic cannot leave it half-changed.
        self.outbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// See [`Pipeline::send`]. The bytes and the place are queued in one step, so replies
    /// meet their requests in order.
    fn send(&self, encoded: &[u8], form: Form, fallback: Option<Bytes>, place: Place, asking: bool) {
        let mut outbox = self.outbox();
        if self.is_dead() {
            drop(outbox);
            place.complete(Err(connection_lost()));
            return;
        }
        let by_source;
        let (encoded, fallback) = match fallback {
            Some(source) if outbox.first_run(encoded) => {
                by_source = source;
                (&by_source[..], None)
            }
            fallback => (encoded, fallback),
        };
        let acquisition = matches!(form, Form::Acquisition { .. }) && !asking && self.join.load(Ordering::Relaxed);
        if acquisition && self.join(&mut outbox, encoded) {
            outbox
                .in_flight
                .push_back(InFlight::new(place, fallback, asking, form, 0));
        } else {
            if asking {
                outbox.out.put_slice(b"*1\r\n$6\r\nASKING\r\n");
                let ignored = InFlight::new(Place::ignored(), None, false, Form::One, 1);
                outbox.in_flight.push_back(ignored);
                outbox.unwritten += 1;
            }
            outbox.open_at = outbox.out.len();
            outbox.out.put_slice(encoded);
            outbox
                .in_flight
                .push_back(InFlight::new(place, fallback, asking, form, 1));
            outbox.open = usize::from(acquisition);
        }
        outbox.unwritten += 1;
        self.write_early(&mut outbox);
        // Nothing left to write (written early): the writer need not wake.
        let wake = !outbox.out.is_empty() && !std::mem::replace(&mut outbox.writing, true);
        drop(outbox);
        if wake {
            self.write.notify_one();
        }
    }

    /// Puts the acquisition `encoded` into the transaction at the end of `out`, if one is open
    /// to it: its `SET` goes before that transaction's `TIME` and `EXEC`, and the acquisition
    /// that opened it counts one member more. The first to join also puts a `TIME` right after
    /// the `MULTI`: a shared transaction's writes are bracketed by two clock readings
    /// ([`acquire::split`]). Nothing is reordered: the transaction is the last thing queued,
    /// and none of it has been written.
    fn join(&self, outbox: &mut Outbox, encoded: &[u8]) -> bool {
        let Some(set) = acquire::set_of(encoded) else {
            return false;
        };
        if outbox.open == 0 || outbox.open >= MAX_MEMBERS || !outbox.out.ends_with(acquire::TIME_EXEC) {
            return false;
        }
        // The opener and its members are the last `open` requests in flight; were they not
        // (a bookkeeping slip), nothing is joined.
        let Some(opener) = outbox.in_flight.len().checked_sub(outbox.open) else {
            return false;
        };
        let first_join = outbox.in_flight.get(opener).is_some_and(|o| o.members == 1);
        let begins = outbox.open_at;
        if first_join && !outbox.out.get(begins..).is_some_and(|t| t.starts_with(acquire::MULTI)) {
            return false;
        }
        let Some(opener) = outbox.in_flight.get_mut(opener) else {
            return false;
        };
        opener.members += 1;
        if first_join {
            let after_multi = begins + acquire::MULTI.len();
            let rest = outbox.out.split_off(after_multi);
            outbox.out.put_slice(acquire::TIME);
            outbox.out.unsplit(rest);
        }
        let end = outbox.out.len() - acquire::TIME_EXEC.len();
        outbox.out.truncate(end);
        outbox.out.put_slice(set);
        outbox.out.put_slice(acquire::TIME_EXEC);
        outbox.open += 1;
        true
    }

    /// Writes what is queued now, from the caller, once at least [`EARLY_WRITE`] requests and
    /// at least as many as the master has in hand (written, not yet answered) wait: so the
    /// master works on the first requests of a turn while the proxy reads the rest, and
    /// batches grow with the master's backlog. Only while the writer holds no batch, and
    /// under the outbox's lock: the bytes go out in the order they were queued, which is the
    /// order of `in_flight` (rule 5's order on the connection). A write that would block or
    /// fails leaves everything to the writer, which meets the same error and fails the
    /// connection.
    fn write_early(&self, outbox: &mut Outbox) {
        let in_hand = outbox.in_flight.len().saturating_sub(outbox.unwritten);
        if outbox.writer_busy || outbox.unwritten < EARLY_WRITE.max(in_hand) {
            return;
        }
        let Some(socket) = &self.socket else {
            return;
        };
        if let Ok(written) = socket.try_write(&outbox.out) {
            outbox.out.advance(written);
            // Begun to be written, even if the socket took only part: their replies may come,
            // and nothing may join them.
            outbox.unwritten = 0;
            outbox.open = 0;
        }
    }

    /// Writes what callers appended, all of it in one write, until the connection fails or
    /// every handle is dropped.
    async fn write_loop(self: Arc<Self>, mut write: impl AsyncWrite + Unpin) {
        let mut batch = BytesMut::with_capacity(16 * 1024);
        loop {
            self.write.notified().await;
            loop {
                if self.is_dead() || self.dropped.load(Ordering::Relaxed) {
                    // Closing our half tells the master to close the connection.
                    self.fail_all();
                    let _ = write.shutdown().await;
                    return;
                }
                {
                    let mut outbox = self.outbox();
                    if outbox.out.is_empty() {
                        outbox.writing = false;
                        break;
                    }
                    std::mem::swap(&mut outbox.out, &mut batch);
                    outbox.writer_busy = true;
                    outbox.unwritten = 0;
                    outbox.open = 0;
                }
                let sent = async {
                    write.write_all(&batch).await?;
                    write.flush().await
                };
                if sent.await.is_err() {
                    self.fail_all();
                    return;
                }
                self.outbox().writer_busy = false;
                batch.clear();
            }
        }
    }

    /// Decodes replies as they arrive and completes the oldest request's place with each.
    async fn read_loop(self: Arc<Self>, mut read: impl AsyncRead + Unpin) {
        let mut buffer = BytesMut::with_capacity(16 * 1024);
        loop {
            match read.read_buf(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            loop {
                if self.skip_queued(&mut buffer) {
                    continue;
                }
                match decode::reply(&mut buffer) {
                    Ok(Some(reply)) => {
                        let mut outbox = self.outbox();
                        // A reply nobody asked for: the stream is out of step.
                        let Some(oldest) = outbox.in_flight.front_mut() else {
                            drop(outbox);
                            self.fail_all();
                            return;
                        };
                        // A request of several replies is answered at its last.
                        oldest.seen += 1;
                        if oldest.seen < oldest.replies() {
                            if reply.is_error() && oldest.error.is_none() {
                                oldest.error = Some(reply);
                            }
                            continue;
                        }
                        let Some(request) = outbox.in_flight.pop_front() else {
                            continue;
                        };
                        if request.members > 1 {
                            // Those that joined its transaction are right behind it.
                            let joined = (1..request.members)
                                .filter_map(|_| outbox.in_flight.pop_front())
                                .collect();
                            drop(outbox);
                            self.answer_shared(request, joined, reply);
                        } else {
                            drop(outbox);
                            self.answer(request, reply);
                        }
                    }
                    Ok(None) => break,
                    Err(decode::Malformed) => {
                        self.fail_all();
                        return;
                    }
                }
            }
        }
        self.fail_all();
    }

    /// Takes a transaction's `+OK` (to `MULTI`) or `+QUEUED` off `buffer` without decoding
    /// it, where the oldest request in flight is a transaction that still awaits later replies:
    /// such a reply only counts (an error among them is kept, and these are none). Three of an
    /// acquisition's four replies per master are these; decoded, each cost about 400
    /// instructions (BENCHMARKS.md, "Instructions per acquisition"). `false` for anything
    /// else, which is decoded as always.
    fn skip_queued(&self, buffer: &mut BytesMut) -> bool {
        let line = |buffer: &BytesMut| {
            if buffer.starts_with(b"+QUEUED\r\n") {
                Some(9)
            } else if buffer.starts_with(b"+OK\r\n") {
                Some(5)
            } else {
                None
            }
        };
        if line(buffer).is_none() {
            return false;
        }
        // All of them under one lock: they come together.
        let mut outbox = self.outbox();
        let mut skipped = false;
        while let Some(len) = line(buffer) {
            match outbox.in_flight.front_mut() {
                Some(oldest) if oldest.seen + 1 < oldest.replies() => {
                    oldest.seen += 1;
                    buffer.advance(len);
                    skipped = true;
                }
                _ => break,
            }
        }
        skipped
    }

    /// Completes `request` with `reply`, or re-sends its script by source on `NOSCRIPT`.
    fn answer(&self, mut request: InFlight, last: Reply) {
        let reply = request.form.fold(request.error.take(), last);
        match request.fallback {
            Some(fallback) if reply.is_error_code("NOSCRIPT") && request.place.is_open() => {
                self.send(&fallback, Form::One, None, request.place, request.asking);
            }
            _ => request.place.complete(Ok(reply)),
        }
    }

    /// Completes the acquisitions that shared a transaction (`first`, which opened it, and
    /// `joined`) with `EXEC`'s reply, each with its own part of it: its `SET`'s result and the
    /// one clock reading. An error queuing any of them aborted them all: that error is each
    /// one's answer (a failure, never a refusal: rule 5a).
    fn answer_shared(&self, first: InFlight, joined: Vec<InFlight>, exec: Reply) {
        let parts = acquire::split(exec, 1 + joined.len());
        let error = first.error.clone();
        for (mut request, part) in std::iter::once(first).chain(joined).zip(parts) {
            request.error = error.clone();
            self.answer(request, part);
        }
    }

    /// The connection is gone: every request still waiting fails, and the writer stops.
    fn fail_all(&self) {
        self.dead.store(true, Ordering::Relaxed);
        let waiting = std::mem::take(&mut self.outbox().in_flight);
        for request in waiting {
            request.place.complete(Err(connection_lost()));
        }
        self.write.notify_one();
        self.died.notify_waiters();
    }
}

/// The writer's side of a plain TCP connection whose write half the callers share for
/// their early writes ([`Shared::write_early`]).
struct Tcp(Arc<OwnedWriteHalf>);

impl AsyncWrite for Tcp {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let socket: &TcpStream = (*self.0).as_ref();
        loop {
            ready!(socket.poll_write_ready(cx))?;
            match socket.try_write(buf) {
                // The readiness was stale: it is cleared now, so the next poll waits.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Closes the sending direction (the master then closes the connection), as dropping an
    /// unshared write half would.
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let socket: &TcpStream = (*self.0).as_ref();
        Poll::Ready(socket2::SockRef::from(socket).shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::wire::{encode_after, encode_head};

    #[test]
    fn a_script_goes_by_source_the_first_time_on_a_connection_only() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let evalsha = encode([&b"EVALSHA"[..], sha.as_bytes(), b"1", b"k"].into_iter());
        let other = encode([&b"EVALSHA"[..], "f".repeat(40).as_bytes(), b"0"].into_iter());
        let mut outbox = Outbox::default();
        assert!(outbox.first_run(&evalsha), "never sent here: by source");
        assert!(!outbox.first_run(&evalsha), "sent once: by SHA1");
        assert!(outbox.first_run(&other));
        assert!(!outbox.first_run(&encode([&b"EVAL"[..], b"return 1", b"0"].into_iter())));
        assert!(!outbox.first_run(&encode([&b"GET"[..], b"k"].into_iter())));
    }

    #[test]
    fn encodes_a_command() {
        let wire = encode([&b"SET"[..], b"k", b""].into_iter());
        assert_eq!(&wire[..], b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
        for (count, len) in [
            (0, 0),
            (1, 9),
            (9, 10),
            (10, 99),
            (11, 100),
            (100, 999),
            (3, 1000),
            (2, 12345),
        ] {
            let arg = vec![b'x'; len];
            let args = || std::iter::repeat_n(&arg[..], count);
            let wire = encode(args());
            let mut expected = format!("*{count}\r\n").into_bytes();
            for _ in 0..count {
                expected.extend_from_slice(format!("${len}\r\n").as_bytes());
                expected.extend_from_slice(&arg);
                expected.extend_from_slice(b"\r\n");
            }
            assert_eq!(wire, expected, "{count} arguments of {len} bytes");
        }
    }

    /// A pipeline and the master's end of its connection (a socket the test reads and writes).
    async fn connected() -> (Pipeline, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (pipeline, accepted) = tokio::join!(Pipeline::connect(&addr, None), listener.accept());
        (pipeline.unwrap(), accepted.unwrap().0)
    }

    /// `write_early`'s rule, watched from the master's side. The test never yields between
    /// sends, so the writer task cannot run: whatever leaves the outbox was written early.
    #[tokio::test(flavor = "current_thread")]
    async fn the_first_requests_of_a_turn_go_early_and_batches_grow_with_the_backlog() {
        let (pipeline, mut master) = connected().await;
        let request = |i: usize| encode([&b"ECHO"[..], i.to_string().as_bytes()].into_iter());
        let mut sent = Vec::new();
        // (requests queued, whether the last one takes them out): 4 wait for nothing in hand,
        // then as many as the master has in hand (4, then 8).
        for (count, written) in [(3, false), (1, true), (3, false), (1, true), (7, false), (1, true)] {
            for _ in 0..count {
                let wire = request(sent.len());
                pipeline.send(&wire, Form::One, None, Place::ignored());
                sent.extend_from_slice(&wire);
            }
            let outbox = pipeline.shared.outbox();
            assert_eq!(
                outbox.out.is_empty(),
                written,
                "after {count} more, {} in flight",
                outbox.in_flight.len()
            );
        }
        assert_eq!(pipeline.shared.outbox().in_flight.len(), 16);
        // What reached the master: every request, once, in the order queued.
        let mut received = vec![0; sent.len()];
        tokio::time::timeout(Duration::from_secs(10), master.read_exact(&mut received))
            .await
            .expect("the early writes reached the master")
            .unwrap();
        assert_eq!(received, sent);
    }

    /// Acquisitions queued together go out as one transaction, and each is answered with its
    /// own `SET`'s result and the shared clock reading; anything else queued between them
    /// closes the transaction, and a connection not told it may join never does.
    #[tokio::test(flavor = "current_thread")]
    async fn acquisitions_queued_together_share_one_transaction() {
        let (pipeline, mut master) = connected().await;
        let acquisition = |key: &str| acquire::encoded(key.as_bytes(), b"t", b"10000");
        let form = Form::Acquisition { ttl_ms: 10_000 };
        let set = |key: &str| encode([&b"SET"[..], key.as_bytes(), b"t", b"NX", b"PX", b"10000"].into_iter());
        pipeline.send(&acquisition("a"), form, None, Place::ignored());
        pipeline.send(&acquisition("b"), form, None, Place::ignored());
        assert_eq!(
            pipeline.shared.outbox().out[..],
            acquisition("a")[..]
                .iter()
                .chain(&acquisition("b")[..])
                .copied()
                .collect::<Vec<u8>>()[..],
            "a connection not told it may join"
        );
        {
            // Never written (the test has not yielded): as if never sent.
            let mut outbox = pipeline.shared.outbox();
            outbox.out.clear();
            outbox.in_flight.clear();
            outbox.unwritten = 0;
        }
        pipeline.join_acquisitions(true);
        let (places, answers): (Vec<_>, Vec<_>) = (0..3).map(|_| super::super::lone()).unzip();
        for (key, place) in ["a", "b", "c"].into_iter().zip(places) {
            pipeline.send(&acquisition(key), form, None, place);
        }
        pipeline.send(&encode([&b"PING"[..]].into_iter()), Form::One, None, Place::ignored());
        let mut expected = b"*1\r\n$5\r\nMULTI\r\n*1\r\n$4\r\nTIME\r\n".to_vec();
        for key in ["a", "b", "c"] {
            expected.extend_from_slice(&set(key));
        }
        expected.extend_from_slice(acquire::TIME_EXEC);
        expected.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        let mut received = vec![0; expected.len()];
        tokio::time::timeout(Duration::from_secs(10), master.read_exact(&mut received))
            .await
            .expect("the transaction reached the master")
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&received), String::from_utf8_lossy(&expected));
        let time = "*2\r\n$10\r\n1700000000\r\n$6\r\n123456\r\n";
        let before = "*2\r\n$10\r\n1699999999\r\n$6\r\n999000\r\n";
        let replies = format!(
            "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*5\r\n{before}+OK\r\n$-1\r\n+OK\r\n{time}+PONG\r\n"
        );
        master.write_all(replies.as_bytes()).await.unwrap();
        let expiry = Reply::Array(vec![Reply::Int(1_700_000_010_123), Reply::Int(1_700_000_009_999)]);
        let mut answered = Vec::new();
        for answer in answers {
            answered.push(match answer.await.unwrap() {
                Reply::Array(mut parts) => parts.swap_remove(0),
                other => other,
            });
        }
        assert_eq!(answered, vec![expiry.clone(), Reply::Nil, expiry]);
    }

    #[test]
    fn a_head_is_copied_as_it_would_have_been_encoded() {
        let args: [&[u8]; 5] = [b"EVAL", &[b'x'; 150], b"2", b"key", b"token"];
        let head = encode_head(args[..3].iter().copied());
        assert_eq!(
            encode_after(5, &head, args[3..].iter().copied()),
            encode(args.into_iter())
        );
    }
}
