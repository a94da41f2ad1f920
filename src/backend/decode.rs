//! A master's replies off the wire: the common ones read here, the rest by `redis-protocol`.
//!
//! Why not `redis-protocol` for all: it reads every frame twice (once for its extent, once
//! to build it), once per master per request. Nearly every reply on the request path is one
//! line (`+OK`, `+QUEUED`, `:1`, `-ERR ...`), one bulk string, or a short array of these (an
//! acquisition's `EXEC`: the `SET`'s reply and the master's `TIME`), and reads here in a
//! single pass: about 380 instructions fewer per one-line reply (BENCHMARKS.md). Anything
//! else, or anything not in its plain form (a number with a leading `+` or zero, arrays
//! nested deeper, a frame not yet complete), goes to `redis-protocol` unchanged, so the two
//! readers agree on every input (the tests below check it against the crate).

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;

use crate::protocol::whole_number;
use crate::reply::Reply;

/// The stream is not RESP2: the connection must be closed.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed;

/// Takes the first complete reply off `buffer`: `Ok(None)` while it is incomplete.
pub fn reply(buffer: &mut BytesMut) -> Result<Option<Reply>, Malformed> {
    if let Some(reply) = plain(buffer) {
        return Ok(Some(reply));
    }
    match decode_bytes_mut(buffer) {
        Ok(Some((frame, _, _))) => Ok(Some(to_reply(frame))),
        Ok(None) => Ok(None),
        Err(_) => Err(Malformed),
    }
}

/// A complete reply in its plain form (a one-line reply, a bulk string, or an array of
/// these, nested at most [`MAX_DEPTH`] deep), taken off `buffer`; `None` (and `buffer`
/// untouched) for anything else. Read in one pass over the bytes, then taken off as one
/// `Bytes` that every status and bulk string of the reply shares: no copy.
fn plain(buffer: &mut BytesMut) -> Option<Reply> {
    let (shape, end) = scan(buffer, 0, 0)?;
    let frame = buffer.split_to(end).freeze();
    Some(build(&frame, shape))
}

/// How deep the arrays read here may nest (an acquisition's `EXEC` reply is 2 deep): deeper
/// ones go to the crate, and no reply can make this reader recurse without bound.
const MAX_DEPTH: usize = 3;

/// A reply found by [`scan`]: its strings as ranges of the frame.
enum Scanned {
    Int(i64),
    Status(std::ops::Range<usize>),
    Error(std::ops::Range<usize>),
    Nil,
    Bulk(std::ops::Range<usize>),
    Array(Vec<Scanned>),
}

/// The plain reply starting at `at` in `bytes`, and where it ends; `None` when it is not
/// plain or not complete.
fn scan(bytes: &[u8], at: usize, depth: usize) -> Option<(Scanned, usize)> {
    let kind = *bytes.get(at)?;
    let start = at.checked_add(1)?;
    let line_len = bytes.get(start..)?.iter().position(|&b| b == b'\r')?;
    let line_end = start.checked_add(line_len)?;
    let line = bytes.get(start..line_end)?;
    if bytes.get(line_end.checked_add(1)?) != Some(&b'\n') || line.contains(&b'\n') {
        return None;
    }
    let next = line_end.checked_add(2)?;
    let scanned = match kind {
        b':' => Scanned::Int(whole_number(line)?),
        b'+' => Scanned::Status(start..line_end),
        // An error stays an error: the engine counts it as a failed vote, never a refusal or a
        // grant (rule 5a). `redis-protocol` keeps its text as UTF-8, and fails the stream
        // otherwise.
        b'-' if std::str::from_utf8(line).is_ok() => Scanned::Error(start..line_end),
        b'$' | b'*' if line == b"-1" => Scanned::Nil,
        b'$' => {
            let len = usize::try_from(whole_number(line)?).ok()?;
            let body_end = next.checked_add(len)?;
            if bytes.get(body_end..body_end.checked_add(2)?)? != b"\r\n" {
                return None;
            }
            return Some((Scanned::Bulk(next..body_end), body_end + 2));
        }
        b'*' if depth < MAX_DEPTH => {
            let count = usize::try_from(whole_number(line)?).ok()?;
            // Each item takes at least 3 bytes: a count larger than what is buffered is a
            // reply not yet complete (or not plain), never an allocation of that size.
            if count > bytes.len().saturating_sub(next) / 3 {
                return None;
            }
            let mut items = Vec::with_capacity(count);
            let mut at = next;
            for _ in 0..count {
                let (item, end) = scan(bytes, at, depth + 1)?;
                items.push(item);
                at = end;
            }
            return Some((Scanned::Array(items), at));
        }
        _ => return None,
    };
    Some((scanned, next))
}

/// The reply [`scan`] found, its strings sliced from `frame`.
fn build(frame: &Bytes, scanned: Scanned) -> Reply {
    match scanned {
        Scanned::Int(n) => Reply::Int(n),
        Scanned::Status(range) => Reply::Status(frame.slice(range)),
        Scanned::Error(range) => Reply::Error(frame.slice(range)),
        Scanned::Nil => Reply::Nil,
        Scanned::Bulk(range) => Reply::Bulk(frame.slice(range)),
        Scanned::Array(items) => Reply::Array(items.into_iter().map(|item| build(frame, item)).collect()),
    }
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
    use proptest::prelude::*;

    /// What `redis-protocol` alone makes of `input`: the replies, then how the stream ends
    /// (`Ok(rest)`: an incomplete tail; `Err`: malformed).
    fn by_crate(input: &[u8]) -> (Vec<Reply>, Result<Vec<u8>, Malformed>) {
        read_all(input, |buffer| match decode_bytes_mut(buffer) {
            Ok(Some((frame, _, _))) => Ok(Some(to_reply(frame))),
            Ok(None) => Ok(None),
            Err(_) => Err(Malformed),
        })
    }

    fn read_all(
        input: &[u8],
        mut next: impl FnMut(&mut BytesMut) -> Result<Option<Reply>, Malformed>,
    ) -> (Vec<Reply>, Result<Vec<u8>, Malformed>) {
        let mut buffer = BytesMut::from(input);
        let mut replies = Vec::new();
        loop {
            match next(&mut buffer) {
                Ok(Some(reply)) => replies.push(reply),
                Ok(None) => return (replies, Ok(buffer.to_vec())),
                Err(e) => return (replies, Err(e)),
            }
        }
    }

    #[test]
    fn reads_the_request_paths_replies_in_one_pass() {
        let mut buffer = BytesMut::from(&b":1\r\n+OK\r\n-ERR no\r\n$-1\r\n$3\r\nabc\r\n:-42\r\n$0\r\n\r\n"[..]);
        let expected = [
            Reply::Int(1),
            Reply::ok(),
            Reply::error("ERR no"),
            Reply::Nil,
            Reply::bulk("abc"),
            Reply::Int(-42),
            Reply::bulk(""),
        ];
        for want in expected {
            assert_eq!(plain(&mut buffer), Some(want));
        }
        assert!(buffer.is_empty());
    }

    #[test]
    fn leaves_everything_else_to_the_crate() {
        for input in [
            &b"*1\r\n:5\r"[..],
            b"*2\r\n:5\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"*99999999999\r\n:1\r\n",
            b":1\r",
            b":+1\r\n",
            b":007\r\n",
            b":-0\r\n",
            b":\r\n",
            b":99999999999999999999\r\n",
            b"$3\r\nab",
            b"$3\r\nabcd\r\n",
            b"$-2\r\n",
            b"-\xff\r\n",
            b"+a\nb\r\n",
            b"",
        ] {
            let mut buffer = BytesMut::from(input);
            assert_eq!(plain(&mut buffer), None, "{:?}", String::from_utf8_lossy(input));
            assert_eq!(&buffer[..], input, "untouched");
        }
        let mut nested = BytesMut::from(&b"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"[..]);
        let deep = Reply::Array(vec![Reply::Array(vec![Reply::Array(vec![Reply::Array(vec![
            Reply::Int(1),
        ])])])]);
        assert_eq!(reply(&mut nested), Ok(Some(deep)), "the crate reads it");
    }

    #[test]
    fn reads_an_acquisitions_transaction_in_one_pass() {
        let wire =
            b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n*2\r\n$10\r\n1700000000\r\n$6\r\n123456\r\n*2\r\n$-1\r\n*0\r\n";
        let mut buffer = BytesMut::from(&wire[..]);
        let queued = Reply::Status(Bytes::from_static(b"QUEUED"));
        let time = Reply::Array(vec![Reply::bulk("1700000000"), Reply::bulk("123456")]);
        for want in [
            Reply::ok(),
            queued.clone(),
            queued,
            Reply::Array(vec![Reply::ok(), time]),
            Reply::Array(vec![Reply::Nil, Reply::Array(vec![])]),
        ] {
            assert_eq!(plain(&mut buffer), Some(want));
        }
        assert!(buffer.is_empty());
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

    /// Replies as a master sends them, some of them bent (lengths that lie, missing line
    /// ends, signs, stray bytes), cut anywhere.
    fn wire() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
            "[ -~]{0,12}".prop_map(|s| format!("+{s}\r\n").into_bytes()),
            "[ -~]{0,12}".prop_map(|s| format!("-{s}\r\n").into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..12).prop_map(|b| [
                format!("${}\r\n", b.len()).into_bytes(),
                b,
                b"\r\n".to_vec()
            ]
            .concat()),
            Just(b"$-1\r\n".to_vec()),
            Just(b"*2\r\n:1\r\n$1\r\nx\r\n".to_vec()),
            Just(b"*-1\r\n".to_vec()),
            Just(b"*2\r\n+OK\r\n*2\r\n$10\r\n1700000000\r\n$6\r\n123456\r\n".to_vec()),
            Just(b"*1\r\n*1\r\n*1\r\n*1\r\n*0\r\n".to_vec()),
            (0u8..4).prop_map(|n| format!("*{n}\r\n").into_bytes()),
            (any::<u8>(), "[-+0-9a-z\r\n]{0,8}").prop_map(|(k, s)| [vec![k], s.into_bytes()].concat()),
            proptest::collection::vec(any::<u8>(), 0..6),
        ];
        (proptest::collection::vec(piece, 0..8), any::<prop::sample::Index>()).prop_map(|(pieces, cut)| {
            let all = pieces.concat();
            let at = if all.is_empty() { 0 } else { cut.index(all.len() + 1) };
            all[..at].to_vec()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn agrees_with_the_crate_on_every_stream(input in wire()) {
            prop_assert_eq!(read_all(&input, reply), by_crate(&input));
        }
    }
}
