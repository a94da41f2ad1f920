//! A raw client speaking RESP3, to read the push messages the proxy sends (lost-lock notices,
//! an election's changes) between replies.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::BytesMut;
use redis_protocol::resp3::decode::complete::decode_bytes_mut;
use redis_protocol::resp3::types::BytesFrame;

use super::ProxyProcess;

/// A raw client speaking RESP3 (after `HELLO 3`), to read push messages.
pub struct Resp3 {
    stream: TcpStream,
    buf: BytesMut,
}

impl Resp3 {
    pub fn connect(proxy: &ProxyProcess) -> Resp3 {
        let mut c = Resp3 {
            stream: proxy.raw(),
            buf: BytesMut::new(),
        };
        c.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        assert!(matches!(c.call(&["HELLO", "3"]), BytesFrame::Map { .. }));
        c
    }

    pub fn send(&mut self, args: &[&str]) {
        let mut wire = format!("*{}\r\n", args.len());
        for a in args {
            wire.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.stream.write_all(wire.as_bytes()).expect("write");
    }

    /// The next frame from the proxy (a reply or a push).
    pub fn next(&mut self) -> BytesFrame {
        loop {
            if let Some((frame, _, _)) = decode_bytes_mut(&mut self.buf).expect("RESP3") {
                return frame;
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).expect("read (timed out?)");
            assert!(n > 0, "the proxy closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    pub fn call(&mut self, args: &[&str]) -> BytesFrame {
        self.send(args);
        self.next()
    }
}

/// The text items of a push message.
pub fn push_items(frame: &BytesFrame) -> Vec<String> {
    match frame {
        BytesFrame::Push { data, .. } => data
            .iter()
            .map(|f| match f {
                BytesFrame::BlobString { data, .. } => String::from_utf8_lossy(data).into_owned(),
                other => format!("{other:?}"),
            })
            .collect(),
        other => panic!("not a push message: {other:?}"),
    }
}
