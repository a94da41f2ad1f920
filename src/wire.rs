//! Requests as the masters read them: RESP arrays of bulk strings, made with as few
//! allocations as the hot path needs; numbers and TTLs as their text; the SHA1 that names a
//! script.

use bytes::Bytes;

use crate::reply::{bulk, header};

/// A number as a command's argument, in one allocation (none for a single digit, such as a
/// key count).
pub fn number(n: impl itoa::Integer) -> Bytes {
    const DIGITS: [&[u8]; 10] = [b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9"];
    let mut buffer = itoa::Buffer::new();
    let text = buffer.format(n).as_bytes();
    match text {
        [digit @ b'0'..=b'9'] => Bytes::from_static(DIGITS[usize::from(digit - b'0')]),
        _ => Bytes::copy_from_slice(text),
    }
}

/// A lock's TTL in milliseconds as a command's argument. Clients take their locks with one TTL
/// or a few, so the last one's text is kept per thread and shared: no allocation for an
/// acquisition with the same TTL as the one before it on this thread.
pub fn ttl_text(ms: u128) -> Bytes {
    thread_local! {
        static LAST: std::cell::RefCell<(u128, Bytes)> = const { std::cell::RefCell::new((0, Bytes::from_static(b"0"))) };
    }
    LAST.with_borrow_mut(|(last, text)| {
        if *last != ms {
            *last = ms;
            *text = number(ms);
        }
        text.clone()
    })
}

/// The lower-case hex SHA1 of a script, as Redis names scripts.
pub fn sha1_hex(body: &[u8]) -> Bytes {
    Bytes::from(sha1_smol::Sha1::from(body).hexdigest())
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
    let mut out = Vec::with_capacity(encoded_len(count, head.len(), tail.clone()));
    header(&mut out, b'*', count);
    out.extend_from_slice(head);
    for arg in tail {
        bulk(&mut out, arg);
    }
    Bytes::from(out)
}

/// The exact length of [`encode_after`]'s encoding.
pub fn encoded_len<'a>(count: usize, head: usize, tail: impl Iterator<Item = &'a [u8]>) -> usize {
    3 + digits(count) + head + tail.map(|a| 5 + digits(a.len()) + a.len()).sum::<usize>()
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
    fn a_ttl_is_written_in_milliseconds_whatever_came_before() {
        for ms in [10_000u128, 10_000, 0, 7, 30_000, 10_000, 18_446_744_073_709_551_616] {
            assert_eq!(&ttl_text(ms)[..], ms.to_string().as_bytes());
        }
    }

    #[test]
    fn sha1_matches_redis() {
        // `redis-cli SCRIPT LOAD "return 1"` answers this SHA1.
        assert_eq!(&sha1_hex(b"return 1")[..], b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
    }
}
