//! Arguments as the masters read them: numbers and TTLs as text, made with as few allocations
//! as the hot path needs, and the SHA1 that names a script.

use bytes::Bytes;

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
