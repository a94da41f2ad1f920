//! The HTTP listener on `metrics_listen`: Prometheus's `/metrics`, and a read-only status page
//! for operators (`/`, `/status`; its script `/status.js` redraws it from `/status.json`).
//!
//! Hand-written HTTP/1.1 on tokio rather than hyper: it serves four fixed resources to `GET`
//! and `HEAD` only, one request per connection, so a request line and a size-bounded header
//! block is all it reads; hyper came in only through the Prometheus exporter's own listener,
//! which this replaces, so dropping it takes a whole HTTP stack out of the build.
//!
//! Nothing a client sends can hold memory or a task for long: the request head is read into a
//! fixed buffer ([`MAX_HEAD`], else `431`) within [`READ_TIMEOUT`] (else `408`), the answer
//! written within `WRITE_TIMEOUT`, and at most [`MAX_CONNECTIONS`] are served at once (more
//! are answered `503` and closed). See [`view`] for what the page shows, and never shows.

pub mod view;

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use crate::error::StartError;
use crate::proxy::Proxy;

pub use view::status;

/// Connections served at once: an operator's browser or two and a Prometheus scraper need a
/// handful; the rest are answered `503` so that a flood costs a fixed amount of memory.
pub const MAX_CONNECTIONS: usize = 32;

/// Largest request head (request line and headers) read; a larger one is answered `431`.
/// Browsers send well under 2 KB to a page without cookies.
pub const MAX_HEAD: usize = 8 * 1024;

/// How long a client has to send its whole request head: a slow one is answered `408`.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the answer may take to be written: a client that stops reading is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// After answering, how long what the client still sends is read and discarded before the
/// connection is closed: closing with unread bytes makes the kernel reset the connection, and
/// the client could lose the answer (a `431` to a request it is still sending).
const LINGER: Duration = Duration::from_secs(1);

/// At most this much is discarded while lingering.
const LINGER_BYTES: usize = 256 * 1024;

/// The page, its script: plain HTML and vanilla JavaScript, no outside resources.
const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("page.js");

/// The page's policy: its own script only (a key that looks like markup can never run as
/// script, even were the drawing code to slip), fetches to this origin only, nothing from
/// elsewhere, no framing.
const PAGE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; \
                           img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Binds `metrics_listen`: before the masters are connected, so that a taken port fails the
/// start as a taken `listen` does.
pub async fn bind(addr: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr).await.map_err(|source| StartError::Listen {
        key: "metrics_listen",
        addr: addr.to_owned(),
        source,
    })
}

/// What the listener serves from.
struct Sources {
    proxy: Arc<Proxy>,
    metrics: PrometheusHandle,
}

/// Serves `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    metrics: PrometheusHandle,
    mut stop: watch::Receiver<bool>,
) {
    let sources = Arc::new(Sources { proxy, metrics });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    // Connections being told `503`: as many again; past those, closed without a word.
    let refusals = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        match accepted {
            Ok((stream, _)) => {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    // Over the limit: told so (the request is read past, not parsed), in a
                    // task of its own that lingers as any answer does; at most as many such
                    // tasks as there are slots.
                    if let Ok(refusing) = refusals.clone().try_acquire_owned() {
                        tokio::spawn(async move {
                            answer(stream, &Response::refusal(Refusal::Busy), false).await;
                            drop(refusing);
                        });
                    }
                    continue;
                };
                let sources = sources.clone();
                tokio::spawn(async move {
                    handle(stream, &sources).await;
                    drop(slot);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics_listen: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// One connection: one request, its answer, closed.
async fn handle(mut stream: TcpStream, sources: &Sources) {
    let mut buf = vec![0u8; MAX_HEAD];
    let (response, head_only) = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream, &mut buf)).await {
        Err(_) => (Response::refusal(Refusal::Timeout), false),
        Ok(Err(None)) => return,
        Ok(Err(Some(refusal))) => (Response::refusal(refusal), false),
        Ok(Ok(len)) => match parse(buf.get(..len).unwrap_or_default()) {
            Ok(request) => (route(&request, sources).await, request.head),
            Err(refusal) => (Response::refusal(refusal), false),
        },
    };
    drop(buf);
    answer(stream, &response, head_only).await;
}

/// Writes `response` (its head only for `HEAD`), within `WRITE_TIMEOUT`, and closes.
async fn answer(mut stream: TcpStream, response: &Response, head_only: bool) {
    let written = tokio::time::timeout(WRITE_TIMEOUT, async {
        stream.write_all(&response.bytes(head_only)).await?;
        stream.shutdown().await
    })
    .await;
    if matches!(written, Ok(Ok(()))) {
        linger(&mut stream).await;
    }
}

/// Reads and discards what the client still sends, until it closes, for at most [`LINGER`]
/// and [`LINGER_BYTES`].
async fn linger(stream: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    let mut left = LINGER_BYTES;
    let _ = tokio::time::timeout(LINGER, async {
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Reads into `buf` until the blank line that ends a request head; its length. `Err(None)`:
/// the client closed before sending a whole head (nothing to answer).
async fn read_head(stream: &mut TcpStream, buf: &mut [u8]) -> Result<usize, Option<Refusal>> {
    let mut filled = 0;
    loop {
        let Some(free) = buf.get_mut(filled..).filter(|free| !free.is_empty()) else {
            return Err(Some(Refusal::HeadTooLarge));
        };
        let n = match stream.read(free).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(n) => n,
        };
        // The end may straddle two reads: look from a little before the new bytes.
        let from = filled.saturating_sub(3);
        filled += n;
        if let Some(end) = head_end(buf.get(from..filled).unwrap_or_default()) {
            return Ok(from + end);
        }
    }
}

/// Where the blank line ending a head is in `bytes` (`\r\n\r\n`, or a bare `\n\n`), counted
/// to its end.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|at| at + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|at| at + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A request as far as it matters here.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    /// `HEAD`: the answer's headers only.
    head: bool,
    /// The path, without its query.
    path: String,
}

/// Why a request gets no resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// Not a request line this server understands.
    BadRequest,
    /// Not `GET` or `HEAD`: the listener is read-only.
    Method,
    /// No such resource.
    NotFound,
    /// The head was larger than [`MAX_HEAD`].
    HeadTooLarge,
    /// The head did not arrive within [`READ_TIMEOUT`].
    Timeout,
    /// [`MAX_CONNECTIONS`] are being served.
    Busy,
}

/// Parses a request head: its request line (`METHOD target HTTP/1.x`). Headers are not needed
/// for anything served here, and are not read.
fn parse(head: &[u8]) -> Result<Request, Refusal> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = std::str::from_utf8(line)
        .map_err(|_| Refusal::BadRequest)?
        .trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::BadRequest);
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") || !target.starts_with('/') {
        return Err(Refusal::BadRequest);
    }
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        m if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) => return Err(Refusal::Method),
        _ => return Err(Refusal::BadRequest),
    };
    let path = target.split(['?', '#']).next().unwrap_or_default().to_owned();
    Ok(Request { head, path })
}

/// The answer to a parsed request.
async fn route(request: &Request, sources: &Sources) -> Response {
    match request.path.as_str() {
        "/" | "/status" => Response::ok("text/html; charset=utf-8", PAGE.as_bytes().to_vec()).with_policy(),
        "/status.js" => Response::ok("text/javascript; charset=utf-8", SCRIPT.as_bytes().to_vec()),
        "/status.json" => match serde_json::to_vec(&status(&sources.proxy)) {
            Ok(body) => Response::ok("application/json", body),
            Err(e) => {
                tracing::warn!(error = %e, "status page: cannot render the status");
                Response::new(
                    500,
                    "Internal Server Error",
                    "text/plain; charset=utf-8",
                    b"cannot render\n".to_vec(),
                )
            }
        },
        "/metrics" => {
            // Rendering walks every series: off the event loop, as the exporter's own
            // listener did.
            let handle = sources.metrics.clone();
            match tokio::task::spawn_blocking(move || handle.render()).await {
                Ok(text) => Response::ok("text/plain; version=0.0.4; charset=utf-8", text.into_bytes()),
                Err(_) => Response::new(
                    500,
                    "Internal Server Error",
                    "text/plain; charset=utf-8",
                    b"cannot render\n".to_vec(),
                ),
            }
        }
        _ => Response::refusal(Refusal::NotFound),
    }
}

/// An answer, closed after.
struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    /// Extra header lines, each ending in CRLF.
    headers: String,
    body: Vec<u8>,
}

impl Response {
    fn new(status: u16, reason: &'static str, content_type: &'static str, body: Vec<u8>) -> Response {
        Response {
            status,
            reason,
            content_type,
            headers: String::new(),
            body,
        }
    }

    fn ok(content_type: &'static str, body: Vec<u8>) -> Response {
        Response::new(200, "OK", content_type, body)
    }

    fn with_policy(mut self) -> Response {
        self.headers.push_str(&format!(
            "Content-Security-Policy: {PAGE_POLICY}\r\nReferrer-Policy: no-referrer\r\n"
        ));
        self
    }

    fn refusal(refusal: Refusal) -> Response {
        let (status, reason) = match refusal {
            Refusal::BadRequest => (400, "Bad Request"),
            Refusal::Method => (405, "Method Not Allowed"),
            Refusal::NotFound => (404, "Not Found"),
            Refusal::HeadTooLarge => (431, "Request Header Fields Too Large"),
            Refusal::Timeout => (408, "Request Timeout"),
            Refusal::Busy => (503, "Service Unavailable"),
        };
        let mut response = Response::new(
            status,
            reason,
            "text/plain; charset=utf-8",
            format!("{status} {reason}\n").into_bytes(),
        );
        if refusal == Refusal::Method {
            response.headers.push_str("Allow: GET, HEAD\r\n");
        }
        response
    }

    /// The answer on the wire; `head_only` (a `HEAD` request): without its body.
    fn bytes(&self, head_only: bool) -> Vec<u8> {
        let head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
             X-Content-Type-Options: nosniff\r\nConnection: close\r\n{}\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len(),
            self.headers
        );
        let mut out = head.into_bytes();
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            parse(b"GET /status.json?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Ok(Request {
                head: false,
                path: "/status.json".into()
            })
        );
        assert_eq!(
            parse(b"HEAD / HTTP/1.0\r\n\r\n"),
            Ok(Request {
                head: true,
                path: "/".into()
            })
        );
        assert_eq!(parse(b"POST /metrics HTTP/1.1\r\n\r\n"), Err(Refusal::Method));
        assert_eq!(parse(b"DELETE / HTTP/1.1\r\n\r\n"), Err(Refusal::Method));
        assert_eq!(parse(b"GET / HTTP/2\r\n\r\n"), Err(Refusal::BadRequest));
        assert_eq!(parse(b"GET http://x/ HTTP/1.1\r\n\r\n"), Err(Refusal::BadRequest));
        assert_eq!(parse(b"get / HTTP/1.1\r\n\r\n"), Err(Refusal::BadRequest));
        assert_eq!(parse(b"GET  / HTTP/1.1\r\n\r\n"), Err(Refusal::BadRequest));
        assert_eq!(parse(b"\xff / HTTP/1.1\r\n\r\n"), Err(Refusal::BadRequest));
        assert_eq!(parse(b""), Err(Refusal::BadRequest));
    }

    #[test]
    fn head_ends_at_the_first_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody"), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
    }

    #[test]
    fn answers_say_their_length_and_close() {
        let text = String::from_utf8(Response::refusal(Refusal::Method).bytes(false)).unwrap();
        assert!(text.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{text}");
        assert!(text.contains("\r\nAllow: GET, HEAD\r\n"), "{text}");
        assert!(text.contains("\r\nContent-Length: 23\r\n"), "{text}");
        assert!(text.contains("\r\nConnection: close\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n405 Method Not Allowed\n"), "{text}");
        let head = String::from_utf8(Response::ok("text/plain", b"abc".to_vec()).bytes(true)).unwrap();
        assert!(
            head.contains("Content-Length: 3\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
    }
}
