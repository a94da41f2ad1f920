//! Rust source text in two views, for the tests that read `src/` (tests/layers.rs, tests/docs.rs):
//! a path in a doc comment or a string is no import, and a rule named in code is no citation.

/// A source text as code and as comments. Both views keep the text's byte length and its newlines,
/// so that an offset in either is the same offset, and the same line, in the file.
pub struct Split {
    /// The text with comments (doc comments too), string literals (normal, byte, raw) and char
    /// literals blanked. Lifetimes (`'a`) stay.
    pub code: String,
    /// The words of the comments, everything else blanked, comment markers (`//`, `///`, `//!`,
    /// `/*`, `*/`) too.
    pub comments: String,
}

/// Whether `b` can be part of an identifier.
fn ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

/// Splits `text` into its code and its comments (see [`Split`]).
pub fn split(text: &str) -> Split {
    let b = text.as_bytes();
    let mut code = b.to_vec();
    let mut comments: Vec<u8> = b.iter().map(|c| if *c == b'\n' { b'\n' } else { b' ' }).collect();
    let blank = |v: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut v[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let end = if b[i..].starts_with(b"//") {
            let end = b[i..].iter().position(|c| *c == b'\n').map_or(b.len(), |p| i + p);
            let marker = if matches!(b.get(i + 2), Some(b'/' | b'!')) {
                3
            } else {
                2
            };
            comments[(i + marker).min(end)..end].copy_from_slice(&b[(i + marker).min(end)..end]);
            end
        } else if b[i..].starts_with(b"/*") {
            let end = block_comment_end(b, i);
            let marker = if matches!(b.get(i + 2), Some(b'*' | b'!')) && end - i > 4 {
                3
            } else {
                2
            };
            let words = (i + marker).min(end - 2)..end - 2;
            comments[words.clone()].copy_from_slice(&b[words]);
            end
        } else if b[i] == b'"' {
            string_end(b, i + 1)
        } else if let Some(end) = raw_string_end(b, i) {
            end
        } else if b[i] == b'\'' {
            char_literal_end(b, i).unwrap_or(i + 1)
        } else {
            i += 1;
            continue;
        };
        if b[i] == b'\'' && end == i + 1 {
            // A lifetime or a label: code.
            i = end;
            continue;
        }
        blank(&mut code, i, end);
        i = end;
    }
    let text = |v: Vec<u8>| String::from_utf8(v).expect("whole characters are kept or blanked");
    Split {
        code: text(code),
        comments: text(comments),
    }
}

/// The end of the block comment opening at `start` (block comments nest).
fn block_comment_end(b: &[u8], start: usize) -> usize {
    let (mut depth, mut j) = (0, start);
    while j < b.len() {
        if b[j..].starts_with(b"/*") {
            depth += 1;
            j += 2;
        } else if b[j..].starts_with(b"*/") {
            depth -= 1;
            j += 2;
            if depth == 0 {
                return j;
            }
        } else {
            j += 1;
        }
    }
    b.len()
}

/// The end of a string literal whose text starts at `from` (after its opening quote).
fn string_end(b: &[u8], mut from: usize) -> usize {
    while from < b.len() && b[from] != b'"' {
        from += if b[from] == b'\\' { 2 } else { 1 };
    }
    (from + 1).min(b.len())
}

/// The end of the raw string (`r"…"`, `r#"…"#`, `br"…"`) starting at `start`, if one does.
fn raw_string_end(b: &[u8], start: usize) -> Option<usize> {
    let before = |k: usize| k.checked_sub(1).and_then(|p| b.get(p)).copied();
    let prefix_start = match before(start) {
        Some(b'b' | b'c') => start - 1,
        _ => start,
    };
    if b[start] != b'r' || before(prefix_start).is_some_and(ident_byte) {
        return None;
    }
    let hashes = b[start + 1..].iter().take_while(|c| **c == b'#').count();
    let open = start + 1 + hashes;
    if b.get(open) != Some(&b'"') {
        return None; // `r#ident`, or an identifier starting with r
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let len = b[open + 1..].windows(close.len()).position(|w| w == close.as_slice());
    Some(len.map_or(b.len(), |p| open + 1 + p + close.len()))
}

/// The end of the char (or byte) literal starting at `start`, or `None` for a lifetime or label
/// (`'a`, `'static`, `'outer:`).
fn char_literal_end(b: &[u8], start: usize) -> Option<usize> {
    if b.get(start + 1) == Some(&b'\\') {
        let close = b[start + 3..].iter().position(|c| *c == b'\'')?;
        return Some(start + 3 + close + 1);
    }
    let len = match b.get(start + 1)? {
        c if *c < 0x80 => 1,
        c if *c >= 0xf0 => 4,
        c if *c >= 0xe0 => 3,
        _ => 2,
    };
    (b.get(start + 1 + len) == Some(&b'\'')).then_some(start + 2 + len)
}
