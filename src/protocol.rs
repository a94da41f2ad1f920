//! Request framing: RESP arrays of bulk strings, and inline commands (`PING\r\n` typed into
//! nc), with size limits checked before data is buffered.
//!
//! The request side is hand-written rather than `redis-protocol`'s decoder: that decoder
//! accepts any two bytes after a bulk body as its terminator (`$2\r\nabcd` decodes as `ab`),
//! knows no inline commands, and only reports "incomplete" while a client announces a
//! gigabyte. Requests are a small subset of RESP, so [`scan`] walks the headers as they
//! arrive, refuses a declared count or length beyond the limits at once, and returns the
//! argument ranges; the arguments are then zero-copy slices of the read buffer.


use std::ops::Range;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use crate::error::ClientError;

/// Longest inline command line, as in Redis (`PROTO_INLINE_MAX_SIZE`).
const MAX_INLINE_LEN: usize = 64 * 1024;

/// Size limits applied while framing, before memory is spent.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest bulk string, in bytes.
    pub max_bulk_len: usize,
    /// Largest number of arguments.
    pub max_args: usize,
}

/// Takes one complete request off the front of `buf`.
///
/// `Ok(None)` means more bytes are needed. An empty request (a blank inline line, `*0` or
/// `*-1`) yields `Some(vec![])`, which the caller skips like Redis does.
pub fn parse_request(buf: &mut BytesMut, limits: Limits) -> Result<Option<Vec<Bytes>>, ClientError> {
    match buf.first() {
        None => Ok(None),
        Some(b'*') => parse_multibulk(buf, limits),
        Some(_) => parse_inline(buf),
    }
}

fn parse_multibulk(buf: &mut BytesMut, limits: Limits) -> Result<Option<Vec<Bytes>>, ClientError> {
    let Some((ranges, len)) = scan(buf, limits)? else {
        return Ok(None);
    };
    let frame = buf.split_to(len).freeze();
    Ok(Some(ranges.into_iter().map(|r| frame.slice(r)).collect()))
}

/// A complete request: where each argument lies, and the request's total length. The ranges
/// of a request of up to 8 arguments (a `SET key token NX PX ms` has 6) stay on the stack.
pub type Scanned = (SmallVec<[Range<usize>; 8]>, usize);

/// Walks a multibulk request: `Ok(None)` while it is incomplete and valid so far, the
/// argument ranges and total length once complete, an error as soon as a header is
/// malformed or declares more than the limits allow.
pub fn scan(buf: &[u8], limits: Limits) -> Result<Option<Scanned>, ClientError> {
    let Some((count, mut at)) = read_number(buf, 1, "invalid multibulk length")? else {
        return Ok(None);
    };
    // Conversions that cannot wrap: a header is any 64-bit number (-1 is the null multibulk,
    // no arguments).
    let count = usize::try_from(count.max(0)).unwrap_or(usize::MAX);
    if count > limits.max_args {
        return Err(protocol("invalid multibulk length"));
    }
    let mut ranges = SmallVec::with_capacity(count);
    for _ in 0..count {
        match buf.get(at) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&other) => {
                return Err(protocol(&format!("expected '$', got '{}'", char::from(other))));
            }
        }
        let Some((len, start)) = read_number(buf, at.saturating_add(1), "invalid bulk length")? else {
            return Ok(None);
        };
        let len = match usize::try_from(len) {
            Ok(len) if len <= limits.max_bulk_len => len,
            _ => return Err(protocol("invalid bulk length")),
        };
        // Bounded by the limit, so these do not overflow; checked all the same.
        let (Some(end), Some(after)) = (
            start.checked_add(len),
            start.checked_add(len).and_then(|e| e.checked_add(2)),
        ) else {
            return Err(protocol("invalid bulk length"));
        };
        match buf.get(end..after) {
            None => return Ok(None),
            Some(b"\r\n") => {}
            Some(_) => return Err(protocol("invalid bulk format")),
        }
        ranges.push(start..end);
        at = after;
    }
    Ok(Some((ranges, at)))
}

/// Reads `<number>\r\n` at `at`; `None` when the line is not complete yet. Numbers are read
/// as strictly as Redis reads them (an optional `-`, no `+`, no leading zeros, at most 20
/// characters), and a line that can no longer become a valid number is refused at once, so
/// the answer does not depend on where the reads cut the request.
fn read_number(buf: &[u8], at: usize, what: &str) -> Result<Option<(i64, usize)>, ClientError> {
    let rest = buf.get(at..).unwrap_or(&[]);
    let end = rest.iter().position(|&b| b == b'\r');
    let digits = rest.get(..end.unwrap_or(rest.len())).unwrap_or(rest);
    match end.map(|end| (end, rest.get(end.saturating_add(1)))) {
        // `at + end + 2` is within the buffer: the `\r\n` was found there.
        Some((end, Some(b'\n'))) => match whole_number(digits) {
            Some(n) => Ok(Some((n, at.saturating_add(end).saturating_add(2)))),
            None => Err(protocol(what)),
        },
        Some((_, Some(_))) => Err(protocol(what)),
        // Incomplete: refused at once if it can no longer become a number.
        _ if valid_number_prefix(digits) => Ok(None),
        _ => Err(protocol(what)),
    }
}

/// `text` as a number, when it is one as Redis reads numbers (`string2ll`): an optional `-`,
/// digits, no leading zero, no `-0`, within `i64`. Header lengths and integer arguments alike.
/// One pass over the digits: every request's headers are read with it.
pub(crate) fn whole_number(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, text),
    };
    let leading_zero = digits.first() == Some(&b'0') && (digits.len() > 1 || negative);
    if digits.is_empty() || text.len() > 20 || leading_zero {
        return None;
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = i64::from(d.wrapping_sub(b'0'));
        value = value.checked_mul(10)?;
        // Negative numbers are built downwards: `i64::MIN` has no positive counterpart.
        value = if negative {
            value.checked_sub(d)?
        } else {
            value.checked_add(d)?
        };
    }
    Some(value)
}

/// Whether `text` is, or can still grow into, a number Redis accepts.
fn valid_number_prefix(text: &[u8]) -> bool {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    text.len() <= 20
        && digits.iter().all(u8::is_ascii_digit)
        && !(digits.first() == Some(&b'0') && (digits.len() > 1 || text.len() > digits.len()))
}

fn parse_inline(buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ClientError> {
    let Some(newline) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_INLINE_LEN {
            return Err(protocol("too big inline request"));
        }
        return Ok(None);
    };
    let mut line = buf.split_to(newline.saturating_add(1));
    line.truncate(newline);
    if line.last() == Some(&b'\r') {
        line.truncate(newline.saturating_sub(1));
    }
    split_inline(&line)
        .map(Some)
        .ok_or_else(|| protocol("unbalanced quotes in request"))
}

/// Splits an inline command into arguments the way `redis-cli` and Redis do: whitespace
/// separates, double quotes allow escapes (`\n`, `\xHH`, ...), single quotes allow `\'`.
/// `None` for unbalanced quotes.
pub fn split_inline(line: &[u8]) -> Option<Vec<Bytes>> {
    let mut args = Vec::new();
    let mut rest = line;
    loop {
        rest = trim_start(rest);
        if rest.is_empty() {
            return Some(args);
        }
        let (arg, after) = match rest {
            [b'"', quoted @ ..] => double_quoted(quoted)?,
            [b'\'', quoted @ ..] => single_quoted(quoted)?,
            _ => {
                let end = rest.iter().position(u8::is_ascii_whitespace).unwrap_or(rest.len());
                let (arg, after) = rest.split_at_checked(end).unwrap_or((rest, &[]));
                (arg.to_vec(), after)
            }
        };
        args.push(Bytes::from(arg));
        rest = after;
    }
}

fn trim_start(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(s.len());
    s.get(start..).unwrap_or(&[])
}

/// A closing quote must be followed by whitespace or the end of the line.
fn after_quote(rest: &[u8]) -> Option<&[u8]> {
    match rest.first() {
        None => Some(rest),
        Some(b) if b.is_ascii_whitespace() => Some(rest),
        Some(_) => None,
    }
}

fn double_quoted(mut s: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut out = Vec::new();
    loop {
        match *s {
            [] => return None,
            [b'"', ref rest @ ..] => return Some((out, after_quote(rest)?)),
            [b'\\', b'x', h, l, ref rest @ ..] if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {
                out.push(hex(h) << 4 | hex(l));
                s = rest;
            }
            [b'\\', c, ref rest @ ..] => {
                out.push(match c {
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'b' => 8,
                    b'a' => 7,
                    other => other,
                });
                s = rest;
            }
            [c, ref rest @ ..] => {
                out.push(c);
                s = rest;
            }
        }
    }
}

fn single_quoted(mut s: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut out = Vec::new();
    loop {
        match *s {
            [] => return None,
            [b'\\', b'\'', ref rest @ ..] => {
                out.push(b'\'');
                s = rest;
            }
            [b'\'', ref rest @ ..] => return Some((out, after_quote(rest)?)),
            [c, ref rest @ ..] => {
                out.push(c);
                s = rest;
            }
        }
    }
}

/// The value of a hex digit (callers checked it is one).
fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c.wrapping_sub(b'0'),
        b'a'..=b'f' => c.wrapping_sub(b'a').wrapping_add(10),
        _ => c.wrapping_sub(b'A').wrapping_add(10),
    }
}

fn protocol(msg: &str) -> ClientError {
    ClientError::Protocol(msg.to_owned())
}

/// A command name or option word, upper-cased for matching. Every known word fits on the
/// stack, so parsing a request allocates nothing for it; a longer word (never a known one,
/// but its text can be in an error) is upper-cased on the heap.
pub enum Upper {
    Short([u8; Upper::SHORT], u8),
    Long(Vec<u8>),
}

impl Upper {
    /// Longer than any command name or option Redis has.
    const SHORT: usize = 24;

    pub fn of(word: &[u8]) -> Upper {
        let mut short = [0u8; Upper::SHORT];
        match (short.get_mut(..word.len()), u8::try_from(word.len())) {
            (Some(upper), Ok(len)) => {
                upper.copy_from_slice(word);
                upper.make_ascii_uppercase();
                Upper::Short(short, len)
            }
            _ => Upper::Long(word.to_ascii_uppercase()),
        }
    }
}

impl std::ops::Deref for Upper {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Upper::Short(short, len) => short.get(..usize::from(*len)).unwrap_or(short),
            Upper::Long(long) => long,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_bulk_len: 16,
        max_args: 4,
    };

    fn parse(input: &[u8]) -> Result<Option<Vec<Bytes>>, ClientError> {
        parse_request(&mut BytesMut::from(input), LIMITS)
    }

    fn args(v: &[&str]) -> Vec<Bytes> {
        v.iter().map(|s| Bytes::copy_from_slice(s.as_bytes())).collect()
    }

    #[test]
    fn multibulk_request() {
        let mut buf = BytesMut::from(&b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n*1\r\n$4\r\nPING\r\n"[..]);
        assert_eq!(parse_request(&mut buf, LIMITS).unwrap(), Some(args(&["PING", "hi"])));
        assert_eq!(parse_request(&mut buf, LIMITS).unwrap(), Some(args(&["PING"])));
        assert!(buf.is_empty());
    }

    #[test]
    fn partial_request_waits() {
        for cut in 1..20 {
            let full = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n";
            assert_eq!(parse(&full[..cut]).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn inline_request() {
        assert_eq!(parse(b"PING\r\n").unwrap(), Some(args(&["PING"])));
        assert_eq!(
            parse(b"set k \"a b\\x41\" 'it\\'s'\n").unwrap(),
            Some(args(&["set", "k", "a bA", "it's"]))
        );
        assert_eq!(parse(b"   \r\n").unwrap(), Some(vec![]));
        assert_eq!(parse(b"PING").unwrap(), None);
    }

    #[test]
    fn unbalanced_quotes() {
        let e = parse(b"set \"k\r\n").unwrap_err();
        assert_eq!(e.to_string(), "ERR Protocol error: unbalanced quotes in request");
        assert!(parse(b"set \"k\"x\r\n").is_err());
    }

    #[test]
    fn huge_bulk_refused_before_body_arrives() {
        let e = parse(b"*1\r\n$999999999\r\n").unwrap_err();
        assert_eq!(e.to_string(), "ERR Protocol error: invalid bulk length");
    }

    #[test]
    fn too_many_args_refused_before_they_arrive() {
        let e = parse(b"*1000\r\n").unwrap_err();
        assert_eq!(e.to_string(), "ERR Protocol error: invalid multibulk length");
    }

    #[test]
    fn malformed_frames() {
        for bad in [
            &b"*1\r\n:12\r\n"[..],
            b"*x\r\n",
            b"*1\r\n$-5\r\n",
            b"*1\r\n$2\r\nabcd\r\n",
            b"*1\rx",
        ] {
            assert!(parse(bad).is_err(), "accepted {:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn words_are_upper_cased_on_the_stack_or_the_heap() {
        for word in [&b""[..], b"set", b"Lock.Acquire", &[b'x'; 24], &[b'y'; 25], b"\xffnx"] {
            let upper = Upper::of(word);
            assert_eq!(&*upper, &word.to_ascii_uppercase()[..], "{word:?}");
            assert_eq!(matches!(upper, Upper::Short(..)), word.len() <= 24, "{word:?}");
        }
    }

    #[test]
    fn whole_numbers_follow_redis() {
        for (text, n) in [
            (&b"0"[..], 0),
            (b"10", 10),
            (b"-12", -12),
            (b"9223372036854775807", i64::MAX),
            (b"-9223372036854775808", i64::MIN),
        ] {
            assert_eq!(whole_number(text), Some(n));
        }
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"-01",
            b"+1",
            b"01",
            b" 1",
            b"1 ",
            b"1.5",
            b"1e3",
            b"x",
            b"9223372036854775808",
            b"99999999999999999999",
        ] {
            assert_eq!(whole_number(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn numbers_are_read_strictly_whatever_the_cut() {
        for bad in [&b"*1\r\n$03\r\nabc\r\n"[..], b"*01\r\n", b"*+1\r\n", b"*1\r\n$-0\r\n"] {
            assert!(parse(bad).is_err(), "accepted {:?}", String::from_utf8_lossy(bad));
            for cut in 2..bad.len() {
                assert!(parse(&bad[..cut]).is_err() || parse(&bad[..cut]) == Ok(None));
            }
        }
        assert!(parse(b"*1\r\n$00").is_err(), "refused before the line ends");
        assert_eq!(parse(b"*1\r\n$0\r\n\r\n").unwrap(), Some(vec![Bytes::new()]));
    }

    #[test]
    fn huge_inline_refused() {
        let line = vec![b'a'; MAX_INLINE_LEN + 1];
        assert!(parse(&line).is_err());
    }
}
