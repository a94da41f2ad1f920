//! The checks behind the fuzz targets, shared by the libFuzzer targets in `fuzz_targets/`.
//!
//! A target fails (panics) on a panic inside the crate, and on a broken invariant:
//!
//! - `request_path`: bytes from a client go through [`parse_request`] with small limits, and
//!   every request it yields through [`Command::parse`] and [`Command::keys`]. Framing may
//!   only yield requests within the limits, wait without consuming, or fail with
//!   `ERR Protocol error: ...`; cutting the same bytes into other reads changes nothing; a
//!   command's keys are among its arguments; every error is one Redis error line.
//! - `combine`: the input describes 1..=7 masters' answers; [`combine`] must follow the
//!   majority rule (see `tests/properties.rs` for the same properties with proptest).

mod commands;

pub use commands::commands;

use bytes::{Bytes, BytesMut};
use redlock_proxy::backend::BackendError;
use redlock_proxy::command::Command;
use redlock_proxy::error::ClientError;
use redlock_proxy::protocol::{Limits, parse_request};
use redlock_proxy::quorum::{Answer, combine, combine_or};
use redlock_proxy::reply::{Protocol, Reply};

/// Small limits, so that the fuzzer reaches them.
pub const LIMITS: Limits = Limits {
    max_bulk_len: 512,
    max_args: 32,
};

/// What a connection makes of its reads: the requests, and the error that closes it.
#[derive(Debug, PartialEq)]
struct Framed {
    requests: Vec<Vec<Bytes>>,
    error: Option<String>,
}

/// The `request_path` target.
pub fn request_path(data: &[u8]) {
    let whole = frame(&[data]);
    for args in &whole.requests {
        check_command(args);
    }
    // The same bytes in three reads, cut where the data says.
    let h = data.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let a = (h % (data.len() as u64 + 1)) as usize;
    let b = a + ((h >> 32) % ((data.len() - a) as u64 + 1)) as usize;
    let pieces = frame(&[&data[..a], &data[a..b], &data[b..]]);
    assert_eq!(whole, pieces, "framing depends on where the reads are cut ({a}, {b})");
}

fn frame(reads: &[&[u8]]) -> Framed {
    let mut buf = BytesMut::new();
    let mut requests = Vec::new();
    for read in reads {
        buf.extend_from_slice(read);
        loop {
            // Where the buffer starts and how long it is: a wait must leave both alone.
            let (start, len, multibulk) = (buf.as_ptr(), buf.len(), buf.first() == Some(&b'*'));
            match parse_request(&mut buf, LIMITS) {
                Ok(None) => {
                    assert!(buf.as_ptr() == start && buf.len() == len, "waiting consumed bytes");
                    break;
                }
                Ok(Some(args)) => {
                    assert!(buf.len() < len, "a request consumed nothing");
                    if multibulk {
                        assert!(args.len() <= LIMITS.max_args, "{} arguments", args.len());
                        assert!(args.iter().all(|a| a.len() <= LIMITS.max_bulk_len), "bulk too long");
                    }
                    requests.push(args);
                }
                Err(e) => {
                    assert!(matches!(e, ClientError::Protocol(_)), "{e:?}");
                    let text = e.to_string();
                    assert!(text.starts_with("ERR Protocol error: "), "{text:?}");
                    check_error_line(&Reply::from(e));
                    return Framed {
                        requests,
                        error: Some(text),
                    };
                }
            }
        }
    }
    Framed { requests, error: None }
}

fn check_command(args: &[Bytes]) {
    // Empty requests (blank lines, `*0`) are skipped by the connection.
    if args.is_empty() {
        return;
    }
    match Command::parse(args.to_vec()) {
        Ok(cmd) => {
            for key in cmd.keys() {
                assert!(args[1..].contains(key), "key {key:?} is not an argument");
            }
        }
        Err(e) => {
            let text = e.to_string();
            assert!(has_redis_code(&text), "no error code: {text:?}");
            check_error_line(&Reply::from(e));
        }
    }
}

fn has_redis_code(text: &str) -> bool {
    text.split_once(' ')
        .is_some_and(|(code, _)| !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()))
}

/// An error reply is a single line on the wire, in both protocols.
fn check_error_line(reply: &Reply) {
    for protocol in [Protocol::Resp2, Protocol::Resp3] {
        let mut out = BytesMut::new();
        reply.encode(protocol, &mut out);
        assert!(out.starts_with(b"-") && out.ends_with(b"\r\n"), "{out:?}");
        let body = &out[1..out.len() - 2];
        assert!(!body.contains(&b'\r') && !body.contains(&b'\n'), "{out:?}");
    }
}

/// Reads the fuzzer's bytes as a description of the masters' answers; zeros when exhausted.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(std::array::from_fn(|_| self.byte()))
    }

    fn text(&mut self) -> Vec<u8> {
        let len = usize::from(self.byte() % 8);
        (0..len).map(|_| self.byte()).collect()
    }

    fn answer(&mut self, depth: u8) -> Answer {
        let tag = self.byte();
        Ok(match tag % 13 {
            0 => return Err(BackendError::Timeout),
            1 => return Err(BackendError::Down),
            2 => {
                return Err(match tag / 13 % 3 {
                    0 => BackendError::Quarantined {
                        remaining: std::time::Duration::from_secs(1),
                    },
                    1 => BackendError::Pending,
                    _ => BackendError::Io("connection reset".into()),
                });
            }
            // Small integers, so that equal and neighbouring values are frequent.
            3 | 4 => Reply::Int(i64::from(tag / 13 % 5) - 2),
            5 => Reply::Int(self.i64()),
            6 => Reply::Nil,
            7 => Reply::NilArray,
            8 => Reply::Status(Bytes::from_static(if tag & 0x80 == 0 { b"OK" } else { b"QUEUED" })),
            9 => Reply::Bulk(match tag / 13 % 3 {
                0 => Bytes::from_static(b"a"),
                1 => Bytes::from_static(b"b"),
                _ => Bytes::from(self.text()),
            }),
            10 => Reply::Error(match tag / 13 % 4 {
                0 => Bytes::from_static(b"ERR x"),
                1 => Bytes::from_static(b"NOSCRIPT No matching script. Please use EVAL."),
                2 => Bytes::from_static(b"BUSY y"),
                _ => Bytes::from(self.text()),
            }),
            11 if depth < 2 => {
                let len = tag / 13 % 3;
                Reply::Array((0..len).map(|_| self.answer(depth + 1).unwrap_or(Reply::Nil)).collect())
            }
            _ => Reply::Int(i64::from(tag % 2)),
        })
    }
}

fn count(answers: &[Answer], reply: &Reply) -> usize {
    answers.iter().filter(|a| a.as_ref().ok() == Some(reply)).count()
}

fn ints_at_least(answers: &[Answer], v: i64) -> usize {
    answers
        .iter()
        .filter(|a| matches!(a, Ok(Reply::Int(i)) if *i >= v))
        .count()
}

/// The `combine` target.
pub fn combine_target(data: &[u8]) {
    let mut input = Input(data);
    let n = 1 + usize::from(input.byte() % 7);
    let q = n / 2 + 1;
    let answers: Vec<Answer> = (0..n).map(|_| input.answer(0)).collect();
    let result = combine(&answers, q);
    let mut wire = BytesMut::new();
    result.encode(Protocol::Resp3, &mut wire);

    // Rule 1: NOQUORUM exactly when fewer than a quorum answered.
    let answered = answers.iter().filter(|a| a.is_ok()).count();
    let noquorum = format!("NOQUORUM {answered} of {n} masters can vote");
    let is_noquorum = matches!(&result, Reply::Error(e) if e.starts_with(noquorum.as_bytes()));
    assert_eq!(answered < q, is_noquorum, "{answers:?} gave {result:?}");
    if answered < q {
        return;
    }

    // Rule 2: integers from a quorum give the largest value a quorum returned or exceeded.
    let ints = ints_at_least(&answers, i64::MIN);
    match result {
        Reply::Int(v) => {
            assert!(
                ints_at_least(&answers, v) >= q,
                "{v} not reached by a quorum: {answers:?}"
            );
            assert!(
                v == i64::MAX || ints_at_least(&answers, v + 1) < q,
                "{v} not the largest: {answers:?}"
            );
        }
        _ => assert!(ints < q, "{ints} integers of {n} gave {result:?}"),
    }

    // A reply given by a quorum is the result; a reply is never made up.
    if let Some(same) = answers.iter().flatten().find(|r| count(&answers, r) >= q) {
        assert_eq!(&result, same, "a quorum gave {same:?}: {answers:?}");
        // Turning every other answer into a timeout changes nothing.
        let degraded: Vec<Answer> = answers
            .iter()
            .map(|a| match a {
                Ok(r) if r == same => Ok(r.clone()),
                _ => Err(BackendError::Timeout),
            })
            .collect();
        assert_eq!(
            combine(&degraded, q),
            result,
            "timeouts changed the result: {answers:?}"
        );
    }
    assert!(
        result == Reply::Nil || count(&answers, &result) > 0,
        "{result:?} is no master's reply: {answers:?}"
    );

    // The fallback replaces only "nothing held by a quorum".
    let fallback = Reply::bulk("fallback");
    let with = combine_or(&answers, q, fallback.clone());
    assert!(
        with == result || (result == Reply::Nil && with == fallback),
        "{with:?} vs {result:?}: {answers:?}"
    );

    // The order of the answers does not matter.
    let mut reversed = answers.clone();
    reversed.reverse();
    assert_eq!(combine(&reversed, q), result, "reversed: {answers:?}");
    let mut rotated = answers.clone();
    rotated.rotate_left(1);
    assert_eq!(combine(&rotated, q), result, "rotated: {answers:?}");
}
