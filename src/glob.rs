//! Redis-style glob patterns (`*`, `?`, `[abc]`, `[a-z]`, `[^a]`, `\x`), as in `CONFIG GET`
//! and key patterns.

/// Whether `text` matches `pattern`.
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| matches(rest, &text[i..])),
        Some((b'?', rest)) => !text.is_empty() && matches(rest, &text[1..]),
        Some((b'[', rest)) => match (class(rest), text.split_first()) {
            (Some((ok, after)), Some((&c, tail))) => ok(c) && matches(after, tail),
            _ => false,
        },
        Some((b'\\', rest)) if !rest.is_empty() => text.first() == Some(&rest[0]) && matches(&rest[1..], &text[1..]),
        Some((&p, rest)) => text.first() == Some(&p) && matches(rest, &text[1..]),
    }
}

/// Parses a `[...]` class (after the `[`): a predicate and the pattern after the `]`.
fn class(pattern: &[u8]) -> Option<(impl Fn(u8) -> bool, &[u8])> {
    let (negate, body) = match pattern.first() {
        Some(b'^') => (true, &pattern[1..]),
        _ => (false, pattern),
    };
    let end = body.iter().position(|&b| b == b']')?;
    let set = body[..end].to_vec();
    let test = move |c: u8| {
        let mut hit = false;
        let mut i = 0;
        while i < set.len() {
            if i + 2 < set.len() && set[i + 1] == b'-' {
                hit |= (set[i].min(set[i + 2])..=set[i].max(set[i + 2])).contains(&c);
                i += 3;
            } else {
                hit |= set[i] == c;
                i += 1;
            }
        }
        hit != negate
    };
    Some((test, &body[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn glob_patterns() {
        assert!(matches(b"*", b"anything"));
        assert!(matches(b"lock:billing:*", b"lock:billing:42"));
        assert!(!matches(b"lock:billing:*", b"lock:orders:42"));
        assert!(matches(b"h?llo", b"hello"));
        assert!(matches(b"h[ae]llo", b"hallo"));
        assert!(!matches(b"h[^e]llo", b"hello"));
        assert!(matches(b"h[a-c]llo", b"hbllo"));
        assert!(matches(b"a\\*", b"a*"));
        assert!(!matches(b"a\\*", b"ab"));
        assert!(!matches(b"abc", b"ab"));
    }
}
