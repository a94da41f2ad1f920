//! One pipelined connection to a master: many requests in flight, written together.
//!
//! Requests from every client are queued to one writer task, which sends all that are
//! waiting in a single write (as twemproxy does); one reader task decodes the replies with
//! `redis-protocol` and hands each to its request, in order. A master answers requests on a
//! connection in the order it received them, so the n-th reply is the n-th request's.
//!
//! A request whose caller stopped waiting (the engine's timeout) is still sent and its
//! reply discarded: the order on the connection is what makes a later release land after
//! an earlier `SET` (rule 5).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::TlsConnector;

use super::BackendError;
use crate::reply::Reply;
use crate::tls;

/// Largest batch the writer gathers into one write.
const MAX_BATCH: usize = 256 * 1024;

/// A request waiting for its reply.
type Waiter = oneshot::Sender<Result<Reply, BackendError>>;

/// The requests sent and not yet answered, oldest first.
type InFlight = Arc<Mutex<VecDeque<Waiter>>>;

/// A pipelined connection to one master. Cloning shares the connection.
#[derive(Clone)]
pub struct Pipeline {
    jobs: mpsc::UnboundedSender<(Bytes, Waiter)>,
    dead: Arc<AtomicBool>,
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
        let (jobs, queue) = mpsc::unbounded_channel();
        let in_flight: InFlight = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        tokio::spawn(write_loop(queue, write, in_flight.clone(), dead.clone()));
        tokio::spawn(read_loop(read, in_flight, dead.clone()));
        Pipeline { jobs, dead }
    }

    /// Whether the connection failed (every later request fails at once).
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Sends one request (already RESP-encoded) and waits for its reply.
    pub async fn call(&self, encoded: Bytes) -> Result<Reply, BackendError> {
        if self.is_dead() {
            return Err(lost());
        }
        let (waiter, reply) = oneshot::channel();
        self.jobs.send((encoded, waiter)).map_err(|_| lost())?;
        reply.await.unwrap_or_else(|_| Err(lost()))
    }

    /// Sends a command given as arguments.
    pub async fn command(&self, args: &[&[u8]]) -> Result<Reply, BackendError> {
        self.call(encode(args.iter().copied())).await
    }
}

fn lost() -> BackendError {
    BackendError::Io("connection lost".into())
}

/// Encodes a command as a RESP array of bulk strings.
pub fn encode<'a>(args: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Bytes {
    let size: usize = args.clone().map(|a| a.len() + 16).sum::<usize>() + 16;
    let mut out = BytesMut::with_capacity(size);
    let mut number = itoa::Buffer::new();
    out.put_u8(b'*');
    out.put_slice(number.format(args.len()).as_bytes());
    out.put_slice(b"\r\n");
    for arg in args {
        out.put_u8(b'$');
        out.put_slice(number.format(arg.len()).as_bytes());
        out.put_slice(b"\r\n");
        out.put_slice(arg);
        out.put_slice(b"\r\n");
    }
    out.freeze()
}

/// Sends queued requests, all that are waiting in one write. The waiter is registered
/// before the bytes go out, so the reader always finds it.
async fn write_loop(
    mut queue: mpsc::UnboundedReceiver<(Bytes, Waiter)>,
    mut write: impl AsyncWrite + Unpin,
    in_flight: InFlight,
    dead: Arc<AtomicBool>,
) {
    let mut batch = BytesMut::with_capacity(16 * 1024);
    while let Some(first) = queue.recv().await {
        batch.clear();
        let mut next = Some(first);
        {
            let mut waiting = lock(&in_flight);
            while let Some((bytes, waiter)) = next.take() {
                batch.put_slice(&bytes);
                waiting.push_back(waiter);
                if batch.len() < MAX_BATCH {
                    next = queue.try_recv().ok();
                }
            }
        }
        let sent = async {
            write.write_all(&batch).await?;
            write.flush().await
        };
        if dead.load(Ordering::Relaxed) || sent.await.is_err() {
            fail_all(&in_flight, &dead);
            return;
        }
    }
}

/// Decodes replies as they arrive and hands each to the oldest waiting request.
async fn read_loop(mut read: impl AsyncRead + Unpin, in_flight: InFlight, dead: Arc<AtomicBool>) {
    let mut buffer = BytesMut::with_capacity(16 * 1024);
    loop {
        match read.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        loop {
            match decode_bytes_mut(&mut buffer) {
                Ok(Some((frame, _, _))) => {
                    let waiter = lock(&in_flight).pop_front();
                    match waiter {
                        // The caller may have stopped waiting: the reply is dropped.
                        Some(waiter) => drop(waiter.send(Ok(to_reply(frame)))),
                        // A reply nobody asked for: the stream is out of step.
                        None => {
                            fail_all(&in_flight, &dead);
                            return;
                        }
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    fail_all(&in_flight, &dead);
                    return;
                }
            }
        }
    }
    fail_all(&in_flight, &dead);
}

/// The connection is gone: every request still waiting fails.
fn fail_all(in_flight: &InFlight, dead: &AtomicBool) {
    dead.store(true, Ordering::Relaxed);
    for waiter in lock(in_flight).drain(..) {
        let _ = waiter.send(Err(lost()));
    }
}

fn lock(in_flight: &InFlight) -> std::sync::MutexGuard<'_, VecDeque<Waiter>> {
    // Every critical section is a push or a pop: a panic cannot leave the queue half-changed.
    in_flight.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A RESP2 frame from a master as the proxy's reply.
fn to_reply(frame: BytesFrame) -> Reply {
    match frame {
        BytesFrame::SimpleString(s) => Reply::Status(s),
        BytesFrame::Error(e) => Reply::Error(Bytes::copy_from_slice(e.as_bytes())),
        BytesFrame::Integer(i) => Reply::Int(i),
        BytesFrame::BulkString(b) => Reply::Bulk(b),
        BytesFrame::Array(items) => Reply::Array(items.into_iter().map(to_reply).collect()),
        BytesFrame::Null => Reply::Nil,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_a_command() {
        let wire = encode([&b"SET"[..], b"k", b""].into_iter());
        assert_eq!(&wire[..], b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    #[test]
    fn frames_become_replies() {
        let frame = BytesFrame::Array(vec![
            BytesFrame::Integer(1),
            BytesFrame::Null,
            BytesFrame::BulkString(Bytes::from_static(b"v")),
            BytesFrame::SimpleString(Bytes::from_static(b"OK")),
        ]);
        assert_eq!(
            to_reply(frame),
            Reply::Array(vec![Reply::Int(1), Reply::Nil, Reply::bulk("v"), Reply::ok()])
        );
    }
}
