//! The typed reply that flows back from backends, through the quorum engine, to a client.
//!
//! Backends speak RESP2 to the proxy; a client may speak RESP2 or RESP3 (after `HELLO 3`).
//! Replies are therefore kept typed until the very last moment, and [`Reply::encode`] picks
//! the wire form for the client's protocol.

use bytes::{BufMut, Bytes, BytesMut};

/// The client's protocol version, chosen with `HELLO`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Protocol {
    /// RESP2, the default of every new connection.
    #[default]
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

/// One reply, as Redis would give it.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+OK` and other simple strings.
    Status(Bytes),
    /// `-ERR ...`: the text after the dash, code included.
    Error(Bytes),
    /// `:42`.
    Int(i64),
    /// `$3\r\nabc`.
    Bulk(Bytes),
    /// The null bulk string (`$-1` in RESP2, `_` in RESP3): "no value".
    Nil,
    /// The null array (`*-1` in RESP2, `_` in RESP3): an aborted `EXEC`.
    NilArray,
    /// `*n` followed by n replies.
    Array(Vec<Reply>),
    /// A RESP3 map; flattened to an array of 2n items for RESP2 clients.
    Map(Vec<(Reply, Reply)>),
    /// A RESP3 set (`~n`); an array for RESP2 clients. `COMMAND` answers its flags in sets, as
    /// Redis does, and clients that read them (redis-cli's hints) accept both forms.
    Set(Vec<Reply>),
    /// A RESP3 double; a bulk string for RESP2 clients.
    Double(f64),
    /// A RESP3 boolean; the integers 1 and 0 for RESP2 clients.
    Bool(bool),
    /// A RESP3 push message (out of band, not a reply to a command); an array for RESP2.
    Push(Vec<Reply>),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Status(Bytes::from_static(b"OK"))
    }

    /// A simple string from static text.
    pub fn status(text: &'static str) -> Reply {
        Reply::Status(Bytes::from_static(text.as_bytes()))
    }

    /// An error reply; `text` starts with the code, e.g. `ERR syntax error`.
    pub fn error(text: impl Into<String>) -> Reply {
        Reply::Error(Bytes::from(text.into()))
    }

    /// A bulk string copied from anything byte-like.
    pub fn bulk(data: impl Into<Bytes>) -> Reply {
        Reply::Bulk(data.into())
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Whether this is an error reply whose code is `code` (e.g. `NOSCRIPT`).
    pub fn is_error_code(&self, code: &str) -> bool {
        match self {
            Reply::Error(text) => {
                text.starts_with(code.as_bytes()) && matches!(text.get(code.len()), None | Some(b' '))
            }
            _ => false,
        }
    }

    /// Writes this reply in the client's protocol.
    pub fn encode(&self, protocol: Protocol, out: &mut BytesMut) {
        match self {
            Reply::Status(s) => line(out, b'+', s),
            Reply::Error(e) => line(out, b'-', e),
            Reply::Int(i) => {
                out.put_u8(b':');
                put_int(out, *i);
            }
            Reply::Bulk(b) => bulk(out, b),
            Reply::Nil if protocol == Protocol::Resp3 => out.put_slice(b"_\r\n"),
            Reply::Nil => out.put_slice(b"$-1\r\n"),
            Reply::NilArray if protocol == Protocol::Resp3 => out.put_slice(b"_\r\n"),
            Reply::NilArray => out.put_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                header(out, b'*', items.len());
                for item in items {
                    item.encode(protocol, out);
                }
            }
            Reply::Set(items) => {
                header(out, if protocol == Protocol::Resp3 { b'~' } else { b'*' }, items.len());
                for item in items {
                    item.encode(protocol, out);
                }
            }
            Reply::Push(items) => {
                header(out, if protocol == Protocol::Resp3 { b'>' } else { b'*' }, items.len());
                for item in items {
                    item.encode(protocol, out);
                }
            }
            Reply::Map(pairs) => {
                if protocol == Protocol::Resp3 {
                    header(out, b'%', pairs.len());
                } else {
                    header(out, b'*', pairs.len() * 2);
                }
                for (k, v) in pairs {
                    k.encode(protocol, out);
                    v.encode(protocol, out);
                }
            }
            Reply::Double(d) => {
                let text = format_double(*d);
                if protocol == Protocol::Resp3 {
                    line(out, b',', text.as_bytes());
                } else {
                    bulk(out, text.as_bytes());
                }
            }
            Reply::Bool(b) if protocol == Protocol::Resp3 => out.put_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
            Reply::Bool(b) => {
                out.put_u8(b':');
                put_int(out, i64::from(*b));
            }
        }
    }
}

/// Formats a double the way Redis does on the wire (`inf`, `-inf`, `nan`, or the shortest form).
fn format_double(d: f64) -> String {
    if d.is_nan() {
        "nan".to_owned()
    } else if d.is_infinite() {
        if d > 0.0 { "inf" } else { "-inf" }.to_owned()
    } else {
        d.to_string()
    }
}

fn line(out: &mut BytesMut, kind: u8, text: &[u8]) {
    out.reserve(text.len() + 3);
    out.put_u8(kind);
    // A simple string or error can't carry CR or LF: Redis replaces them with spaces.
    for &b in text {
        out.put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
    }
    out.put_slice(b"\r\n");
}

/// Appends `data` as a bulk string: replies to clients, and the requests the proxy sends its
/// masters (`backend::pipeline::encode`).
pub(crate) fn bulk(out: &mut impl BufMut, data: &[u8]) {
    header(out, b'$', data.len());
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// Appends `kind`, the decimal `n` and CRLF; a one-digit `n` (most argument counts, a key
/// count, a one-byte token) in one fixed-size store: this runs for every argument of every
/// request to a master.
pub(crate) fn header(out: &mut impl BufMut, kind: u8, n: usize) {
    if let Some(&digit) = b"0123456789".get(n) {
        out.put_slice(&[kind, digit, b'\r', b'\n']);
    } else {
        out.put_u8(kind);
        put_int(out, n as i64);
    }
}

fn put_int(out: &mut impl BufMut, i: i64) {
    let mut buf = itoa::Buffer::new();
    out.put_slice(buf.format(i).as_bytes());
    out.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(reply: &Reply, protocol: Protocol) -> String {
        let mut out = BytesMut::new();
        reply.encode(protocol, &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn nil_differs_by_protocol() {
        assert_eq!(wire(&Reply::Nil, Protocol::Resp2), "$-1\r\n");
        assert_eq!(wire(&Reply::Nil, Protocol::Resp3), "_\r\n");
        assert_eq!(wire(&Reply::NilArray, Protocol::Resp2), "*-1\r\n");
    }

    #[test]
    fn map_is_flattened_for_resp2() {
        let map = Reply::Map(vec![(Reply::bulk("proto"), Reply::Int(3))]);
        assert_eq!(wire(&map, Protocol::Resp3), "%1\r\n$5\r\nproto\r\n:3\r\n");
        assert_eq!(wire(&map, Protocol::Resp2), "*2\r\n$5\r\nproto\r\n:3\r\n");
    }

    #[test]
    fn set_is_an_array_for_resp2() {
        let set = Reply::Set(vec![Reply::status("fast")]);
        assert_eq!(wire(&set, Protocol::Resp3), "~1\r\n+fast\r\n");
        assert_eq!(wire(&set, Protocol::Resp2), "*1\r\n+fast\r\n");
    }

    #[test]
    fn status_cannot_break_the_frame() {
        assert_eq!(wire(&Reply::error("ERR a\r\nb"), Protocol::Resp2), "-ERR a  b\r\n");
    }

    /// An independent RESP implementation (`redis-protocol`) must read what we write.
    #[test]
    fn encoding_is_valid_resp() {
        let reply = Reply::Array(vec![
            Reply::ok(),
            Reply::error("ERR x"),
            Reply::Int(-7),
            Reply::bulk("a\r\nb"),
            Reply::Nil,
            Reply::Map(vec![(Reply::bulk("k"), Reply::Double(1.5))]),
            Reply::Bool(true),
            Reply::Set(vec![Reply::status("readonly")]),
        ]);
        for protocol in [Protocol::Resp2, Protocol::Resp3] {
            let mut out = BytesMut::new();
            reply.encode(protocol, &mut out);
            let len = out.len();
            let decoded = match protocol {
                Protocol::Resp2 => redis_protocol::resp2::decode::decode(&out).map(|f| f.map(|(_, n)| n)),
                Protocol::Resp3 => redis_protocol::resp3::decode::complete::decode(&out).map(|f| f.map(|(_, n)| n)),
            };
            assert_eq!(decoded.unwrap(), Some(len), "{protocol:?}");
        }
    }

    #[test]
    fn error_code_match_is_whole_word() {
        let e = Reply::error("NOSCRIPT No matching script. Please use EVAL.");
        assert!(e.is_error_code("NOSCRIPT"));
        assert!(!e.is_error_code("NOSCRIPTX"));
        assert!(!Reply::error("NOSCRIPTING x").is_error_code("NOSCRIPT"));
    }
}
