//! One pipelined connection to a master: many requests in flight, written together.
//!
//! A request is appended to the connection's output buffer, and its [`Slot`] to the requests
//! in flight, in one step under one lock, so the n-th reply is the n-th request's (a master
//! answers a connection's requests in order). One writer task sends everything appended
//! since its last write in a single write (as twemproxy does); it is woken only when the
//! connection goes from idle to busy. One reader task decodes the replies
//! (`decode`) and completes each request's slot, from where the fan-out decides whether
//! the waiting client must be woken. No channel, oneshot or task per request.
//!
//! A request whose fan-out stopped waiting (its deadline passed) is still sent and its reply
//! discarded: the order on the connection is what makes a later release land after an
//! earlier `SET` (rule 5).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_rustls::TlsConnector;

use super::{Answer, Slot, connection_lost, decode};
use crate::reply::{Reply, bulk, header};
use crate::tls;

/// A request sent and not yet answered.
struct InFlight {
    slot: Slot,
    /// The script by source, sent instead should the master answer `NOSCRIPT`.
    fallback: Option<Bytes>,
    /// Sent after `ASKING` (a cluster slot being migrated), and so is its fallback.
    asking: bool,
}

/// What the callers, the writer and the reader share.
#[derive(Default)]
struct Queue {
    /// Appended, not yet written.
    out: BytesMut,
    /// Sent (or about to be), not yet answered, oldest first.
    in_flight: VecDeque<InFlight>,
    /// The writer has been woken and not yet found `out` empty.
    writing: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the writer when the connection goes from idle to busy, fails, or is dropped.
    write: Notify,
    dead: AtomicBool,
    /// Every [`Pipeline`] handle is gone: the writer closes its half, so the master closes
    /// the connection and the reader ends too.
    dropped: AtomicBool,
    /// Wakes whoever waits for the connection to fail ([`Pipeline::closed`]).
    died: Notify,
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
                Pipeline::start(read, write)
            }
            Some((connector, host)) => {
                let (read, write) = tokio::io::split(tls::connect(connector, host, stream).await?);
                Pipeline::start(read, write)
            }
        })
    }

    /// Starts the writer and reader tasks over the two halves of a connection.
    fn start<R, W>(read: R, write: W) -> Pipeline
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            write: Notify::new(),
            dead: AtomicBool::new(false),
            dropped: AtomicBool::new(false),
            died: Notify::new(),
        });
        tokio::spawn(shared.clone().write_loop(write));
        tokio::spawn(shared.clone().read_loop(read));
        Pipeline {
            _handle: Arc::new(Handle(shared.clone())),
            shared,
        }
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

    /// Sends one request (already RESP-encoded); its answer completes `slot`. On `NOSCRIPT`,
    /// `fallback` (the script by source) is sent in its place if the slot is still open.
    /// Such a re-send lands behind requests sent meanwhile, which is why the scripts whose
    /// place in the connection's order matters are never sent by SHA1
    /// (`ScriptCall::in_order`).
    pub fn send(&self, encoded: &[u8], fallback: Option<Bytes>, slot: Slot) {
        self.shared.send(encoded, fallback, slot, false);
    }

    /// [`Pipeline::send`] right after `ASKING`, with nothing between them: a cluster node
    /// serves a key of a slot it is importing only to the command that follows `ASKING`.
    pub fn send_asking(&self, encoded: &[u8], fallback: Option<Bytes>, slot: Slot) {
        self.shared.send(encoded, fallback, slot, true);
    }

    /// Sends a command given as arguments and waits for its reply (start-up and probes).
    pub async fn command(&self, args: &[&[u8]]) -> Answer {
        let (slot, answer) = super::lone();
        self.send(&encode(args.iter().copied()), None, slot);
        answer.await
    }
}

impl Shared {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Every critical section is an append or a pop: a panic cannot leave it half-changed.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// See [`Pipeline::send`]. The bytes and the slot are queued in one step, so replies
    /// meet their requests in order.
    fn send(&self, encoded: &[u8], fallback: Option<Bytes>, slot: Slot, asking: bool) {
        let mut queue = self.queue();
        if self.is_dead() {
            drop(queue);
            slot.complete(Err(connection_lost()));
            return;
        }
        if asking {
            queue.out.put_slice(b"*1\r\n$6\r\nASKING\r\n");
            let ignored = InFlight {
                slot: Slot::ignored(),
                fallback: None,
                asking: false,
            };
            queue.in_flight.push_back(ignored);
        }
        queue.out.put_slice(encoded);
        queue.in_flight.push_back(InFlight { slot, fallback, asking });
        let wake = !std::mem::replace(&mut queue.writing, true);
        drop(queue);
        if wake {
            self.write.notify_one();
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
                    let mut queue = self.queue();
                    if queue.out.is_empty() {
                        queue.writing = false;
                        break;
                    }
                    std::mem::swap(&mut queue.out, &mut batch);
                }
                let sent = async {
                    write.write_all(&batch).await?;
                    write.flush().await
                };
                if sent.await.is_err() {
                    self.fail_all();
                    return;
                }
                batch.clear();
            }
        }
    }

    /// Decodes replies as they arrive and completes the oldest request's slot with each.
    async fn read_loop(self: Arc<Self>, mut read: impl AsyncRead + Unpin) {
        let mut buffer = BytesMut::with_capacity(16 * 1024);
        loop {
            match read.read_buf(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            loop {
                match decode::reply(&mut buffer) {
                    Ok(Some(reply)) => {
                        let request = self.queue().in_flight.pop_front();
                        // A reply nobody asked for: the stream is out of step.
                        let Some(request) = request else {
                            self.fail_all();
                            return;
                        };
                        self.answer(request, reply);
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

    /// Completes `request` with `reply`, or re-sends its script by source on `NOSCRIPT`.
    fn answer(&self, request: InFlight, reply: Reply) {
        match request.fallback {
            Some(fallback) if reply.is_error_code("NOSCRIPT") && request.slot.is_open() => {
                self.send(&fallback, None, request.slot, request.asking);
            }
            _ => request.slot.complete(Ok(reply)),
        }
    }

    /// The connection is gone: every request still waiting fails, and the writer stops.
    fn fail_all(&self) {
        self.dead.store(true, Ordering::Relaxed);
        let waiting = std::mem::take(&mut self.queue().in_flight);
        for request in waiting {
            request.slot.complete(Err(connection_lost()));
        }
        self.write.notify_one();
        self.died.notify_waiters();
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub fn encode<'a>(args: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Bytes {
    encode_after(args.len(), &[], args)
}

/// The RESP encoding of the first arguments of commands that all start with them (a script's
/// `EVAL <source> <numkeys>`), to be given to [`encode_after`].
pub fn encode_head<'a>(head: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for arg in head {
        bulk(&mut out, arg);
    }
    out
}

/// Encodes a command of `count` arguments: those encoded in `head` ([`encode_head`]), then
/// `tail`. The head is copied as it is, not encoded again: a script's source is the largest
/// part of every acquisition's request.
pub fn encode_after<'a>(count: usize, head: &[u8], tail: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Bytes {
    // The exact size: a vector filled to its capacity becomes `Bytes` without a second
    // allocation. A `Vec`, not a `BytesMut`: its appends are the cheaper (this runs for
    // every request, for each of its arguments).
    let len = 3 + digits(count) + head.len() + tail.clone().map(|a| 5 + digits(a.len()) + a.len()).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    header(&mut out, b'*', count);
    out.extend_from_slice(head);
    for arg in tail {
        bulk(&mut out, arg);
    }
    Bytes::from(out)
}

/// How many decimal digits `n` has: comparisons for the lengths requests have.
fn digits(n: usize) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        _ => n.checked_ilog10().map_or(1, |d| d as usize + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
