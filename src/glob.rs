//! Redis-style glob patterns (`*`, `?`, `[abc]`, `[a-z]`, `[^a]`, `\x`), as in `CONFIG GET`
//! and key patterns.
//!
//! Patterns come from clients (`CONFIG GET`, `COMMAND LIST FILTERBY PATTERN`, `KEYS`, `PROXY
//! LOCKS`) and from operators (a user's key patterns, `signal_lists`), and every match runs
//! on the event loop, so its cost must not grow faster than its input: no request may hold
//! the loop for longer than a stated bound (rule 16, `docs/safety.md`). A recursive matcher
//! that tries every split at every `*` takes time exponential in the number of stars (40
//! stars and an `x` against a 17-byte name: for ever). Here the match keeps only the last
//! star to fall back to, which is enough because every other element matches exactly one
//! byte: at most `(elements + 1) · (len(text) + 2)` steps, each over one element.
//!
//! An element is one step when it is a byte, `?` or an escape; a class costs its length each
//! time it is tried, so a pattern with a class is first read once into elements (a run of
//! stars one star, a class a set of 256 bits), and so is a pattern matched against many texts
//! ([`Pattern`]). A read pattern with more one-byte elements than the text has bytes cannot
//! match and is not kept beyond that count: at most `2 · len(text) + 1` elements. In all a
//! match costs `O(len(pattern) + len(text)²)`, and a [`Pattern`] the pattern's length once.

/// Whether `text` matches `pattern`.
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    if pattern.contains(&b'[') {
        // A class read once, not once per try.
        return Pattern::new(pattern, text.len()).matches(text);
    }
    // Every element one step: matched as written, with nothing to allocate (a user's key
    // patterns are matched on every command).
    run(&Raw(pattern), text).0
}

/// A pattern read once, to match many texts (the names of a `COMMAND LIST`, the keys of a
/// `KEYS`): the pattern's length is paid once, not once per text.
#[derive(Clone, Debug)]
pub struct Pattern<'a> {
    source: &'a [u8],
    /// The longest text the elements below were read for.
    longest: usize,
    /// The elements; `None` when no text of at most `longest` bytes can match (more one-byte
    /// elements than that, or a `[` without its `]`).
    elements: Option<Vec<Element>>,
}

/// One element of a pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Element {
    /// Any run of bytes (`*`).
    Star,
    /// Any one byte (`?`).
    Any,
    /// This byte (itself, or escaped with `\`).
    Byte(u8),
    /// One byte of this set (a `[...]` class, negation applied): bit `c` of the 256.
    Class([u64; 4]),
    /// Nothing (a `[` without its `]`): no text matches the pattern, since every element
    /// takes part in a match.
    Never,
}

impl Element {
    /// Whether this one-byte element matches `c` (a star matches no single byte here: the
    /// matcher handles it).
    fn accepts(&self, c: u8) -> bool {
        match self {
            Element::Star | Element::Never => false,
            Element::Any => true,
            Element::Byte(b) => *b == c,
            Element::Class(set) => set
                .get(usize::from(c >> 6))
                .is_some_and(|word| (word >> (c & 63)) & 1 == 1),
        }
    }
}

/// Where the matcher reads its elements: a pattern as written ([`Raw`]) or read ahead.
trait Elements {
    /// The element at position `p` and the position of the next; `None` past the end.
    fn element(&self, p: usize) -> Option<(Element, usize)>;
}

impl Elements for [Element] {
    fn element(&self, p: usize) -> Option<(Element, usize)> {
        self.get(p).map(|e| (*e, p + 1))
    }
}

/// A pattern as written, its elements decoded as the matcher reaches them.
struct Raw<'a>(&'a [u8]);

impl Elements for Raw<'_> {
    fn element(&self, p: usize) -> Option<(Element, usize)> {
        decode(self.0, p)
    }
}

/// The element of `pattern` that starts at `i`, and where the next starts.
fn decode(pattern: &[u8], i: usize) -> Option<(Element, usize)> {
    Some(match *pattern.get(i)? {
        // A run of stars is one star (passed in one step, and fallen back to after its end).
        b'*' => {
            let run = pattern.get(i..)?.iter().take_while(|&&b| b == b'*').count();
            (Element::Star, i + run)
        }
        b'?' => (Element::Any, i + 1),
        b'[' => match pattern.get(i + 1..).and_then(class) {
            Some((set, len)) => (Element::Class(set), i + 1 + len),
            None => (Element::Never, pattern.len()),
        },
        b'\\' if i + 1 < pattern.len() => (Element::Byte(*pattern.get(i + 1)?), i + 2),
        b => (Element::Byte(b), i + 1),
    })
}

impl<'a> Pattern<'a> {
    /// `pattern` read for texts of at most `longest` bytes (a longer text is matched all the
    /// same, by reading the pattern again for it).
    pub fn new(pattern: &'a [u8], longest: usize) -> Pattern<'a> {
        Pattern {
            source: pattern,
            longest,
            elements: read(pattern, longest),
        }
    }

    /// Whether `text` matches.
    pub fn matches(&self, text: &[u8]) -> bool {
        if text.len() > self.longest {
            return Pattern::new(self.source, text.len()).matches(text);
        }
        self.elements.as_deref().is_some_and(|elements| run(elements, text).0)
    }
}

/// The elements of `pattern` (a run of stars is one), or `None` when no text of at most
/// `longest` bytes can match: reading stops once there are more one-byte elements than that
/// (each takes one byte of the text), and at a `[` without its `]`. One pass.
fn read(pattern: &[u8], longest: usize) -> Option<Vec<Element>> {
    let mut elements = Vec::new();
    let mut singles = 0usize;
    let mut i = 0;
    while let Some((element, next)) = decode(pattern, i) {
        i = next;
        match element {
            Element::Star => elements.push(element),
            Element::Never => return None,
            _ => {
                singles += 1;
                if singles > longest {
                    return None;
                }
                elements.push(element);
            }
        }
    }
    Some(elements)
}

/// A `[...]` class (`pattern` starts after the `[`): its set of bytes, negation applied, and
/// its length up to and with its `]`; `None` without a `]`. `^` first negates; `a-z` is a
/// range (either way round) when a byte follows the `-`; everything else, `\` included, is
/// itself.
fn class(pattern: &[u8]) -> Option<([u64; 4], usize)> {
    let (negate, skip) = match pattern.first() {
        Some(b'^') => (true, 1),
        _ => (false, 0),
    };
    let body = pattern.get(skip..)?;
    let end = body.iter().position(|&b| b == b']')?;
    let items = body.get(..end)?;
    let mut set = [0u64; 4];
    let mut i = 0;
    while let Some(&first) = items.get(i) {
        match (items.get(i + 1), items.get(i + 2)) {
            (Some(b'-'), Some(&last)) => {
                add_range(&mut set, first.min(last), first.max(last));
                i += 3;
            }
            _ => {
                if let Some(word) = set.get_mut(usize::from(first >> 6)) {
                    *word |= 1 << (first & 63);
                }
                i += 1;
            }
        }
    }
    if negate {
        for word in &mut set {
            *word = !*word;
        }
    }
    Some((set, skip + end + 1))
}

/// Adds the bytes `lo..=hi` to `set`, a word at a time (a class of many ranges is read in
/// time linear in its length).
fn add_range(set: &mut [u64; 4], lo: u8, hi: u8) {
    for (w, word) in set.iter_mut().enumerate() {
        let (start, end) = (w * 64, w * 64 + 63);
        let (lo, hi) = (usize::from(lo).max(start), usize::from(hi).min(end));
        if lo > hi {
            continue;
        }
        let width = hi - lo + 1;
        let bits = if width == 64 {
            u64::MAX
        } else {
            ((1u64 << width) - 1) << (lo - start)
        };
        *word |= bits;
    }
}

/// The match over `elements`, and the number of steps it took (the tests bound the work by
/// it, not by a clock).
///
/// Two cursors walk the elements and the text; at a star the positions after it are
/// remembered, and on a mismatch the last star takes one more byte and the walk resumes after
/// it. Only the last star matters: between two stars every element takes one byte, so if
/// what follows the last star cannot match with the earlier stars' current extents, giving an
/// earlier star more bytes only moves the same elements further right, which the last star
/// can do as well. Each fall-back moves the text position after the star on by one byte (at
/// most `len(text) + 1` walks), and within a walk the element cursor only advances.
fn run<E: Elements + ?Sized>(elements: &E, text: &[u8]) -> (bool, u64) {
    let (mut p, mut t) = (0, 0);
    // After the last star seen: where the elements continue, and where its bytes end.
    let mut star: Option<(usize, usize)> = None;
    let mut steps: u64 = 0;
    loop {
        steps += 1;
        let here = elements.element(p);
        if let Some((Element::Star, next)) = here {
            p = next;
            star = Some((p, t));
            continue;
        }
        if t == text.len() {
            // The text is used up: a match only if the elements are too (stars are passed
            // above). Falling back would leave the rest fewer bytes, and it needs some.
            return (here.is_none(), steps);
        }
        if let (Some((element, next)), Some(&c)) = (here, text.get(t))
            && element.accepts(c)
        {
            p = next;
            t += 1;
            continue;
        }
        match star {
            Some((after, end)) if end < text.len() => {
                star = Some((after, end + 1));
                p = after;
                t = end + 1;
            }
            _ => return (false, steps),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Pattern, Raw, matches, read, run};
    use proptest::prelude::*;

    /// The recursive matcher this module had: the reference for the semantics, exponential in
    /// the number of stars.
    fn reference(pattern: &[u8], text: &[u8]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some((b'*', rest)) => (0..=text.len()).any(|i| reference(rest, &text[i..])),
            Some((b'?', rest)) => !text.is_empty() && reference(rest, &text[1..]),
            Some((b'[', rest)) => {
                let (negate, body) = match rest.first() {
                    Some(b'^') => (true, &rest[1..]),
                    _ => (false, rest),
                };
                let Some(end) = body.iter().position(|&b| b == b']') else {
                    return false;
                };
                let Some((&c, tail)) = text.split_first() else {
                    return false;
                };
                let set = &body[..end];
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
                hit != negate && reference(&body[end + 1..], tail)
            }
            Some((b'\\', rest)) if !rest.is_empty() => {
                text.first() == Some(&rest[0]) && reference(&rest[1..], &text[1..])
            }
            Some((&p, rest)) => text.first() == Some(&p) && reference(rest, &text[1..]),
        }
    }

    #[test]
    fn glob_patterns() {
        assert!(matches(b"*", b"anything"));
        assert!(matches(b"*", b""));
        assert!(matches(b"", b""));
        assert!(!matches(b"", b"a"));
        assert!(matches(b"lock:billing:*", b"lock:billing:42"));
        assert!(!matches(b"lock:billing:*", b"lock:orders:42"));
        assert!(matches(b"h?llo", b"hello"));
        assert!(matches(b"h[ae]llo", b"hallo"));
        assert!(!matches(b"h[^e]llo", b"hello"));
        assert!(matches(b"h[a-c]llo", b"hbllo"));
        assert!(matches(b"h[c-a]llo", b"hbllo"));
        assert!(matches(b"[\x00-\xff]", b"\x80"));
        assert!(matches(b"[^]", b"z"));
        assert!(!matches(b"[]", b"z"));
        assert!(matches(b"a\\*", b"a*"));
        assert!(!matches(b"a\\*", b"ab"));
        assert!(matches(b"a\\", b"a\\"));
        assert!(!matches(b"abc", b"ab"));
        assert!(matches(b"*b*c", b"abxbxc"));
        assert!(!matches(b"*b*c", b"abxbx"));
        assert!(matches(b"a*[xy]?", b"abcyz"));
        // A `[` without its `]` matches nothing.
        assert!(!matches(b"a[bc", b"ab"));
        assert!(!matches(b"*[", b"a"));
        // Read for short texts, a pattern still matches a longer one.
        let pattern = Pattern::new(b"a?c*", 2);
        assert!(!pattern.matches(b"ab"));
        assert!(pattern.matches(b"abcdef"));
    }

    /// Rule 16: the pattern of a restricted user's `CONFIG GET` (40 stars and an `x`) costs
    /// steps linear in the text, and no pattern more than the product of its elements and the
    /// text: counted steps, not a clock.
    #[test]
    fn many_stars_cost_linear_work() {
        let text = vec![b'a'; 1000];
        let mut pattern = vec![b'*'; 40];
        pattern.push(b'x');
        let elements = read(&pattern, text.len()).expect("elements");
        assert_eq!(elements.len(), 2, "a run of stars is one element");
        let (hit, steps) = run(elements.as_slice(), &text);
        assert!(!hit);
        assert!(steps <= 2 * text.len() as u64 + 4, "{steps} steps");
        // As written (no class: how `matches` runs it), the same.
        let (hit, steps) = run(&Raw(&pattern), &text);
        assert!(!hit);
        assert!(steps <= 2 * text.len() as u64 + 4, "{steps} steps");
        // The algorithm's worst case: every fall-back walks what follows the star again.
        // A key as long as `max_key_len` allows.
        let text = vec![b'a'; 4096];
        for pattern in [
            [&b"*"[..], &[b'a'; 200][..], b"b"].concat(),
            b"*a".repeat(20).into_iter().chain(*b"*b").collect(),
            b"*?*[a-z]".repeat(20).into_iter().chain(*b"*b").collect(),
        ] {
            let elements = read(&pattern, text.len()).expect("elements");
            let (hit, steps) = run(elements.as_slice(), &text);
            assert!(!hit);
            let bound = ((elements.len() + 1) * (text.len() + 2)) as u64;
            assert!(steps <= bound, "{steps} steps, bound {bound}");
            let (hit, steps) = run(&Raw(&pattern), &text);
            assert!(!hit);
            let bound = ((pattern.len() + 1) * (text.len() + 2)) as u64;
            assert!(steps <= bound, "{steps} steps, bound {bound}");
        }
        // More one-byte elements than the text has bytes: not even kept.
        assert_eq!(read(&[b'?'; 1 << 20], 17), None);
        let long: Vec<u8> = [&b"*["[..], &vec![b'b'; 1 << 20][..], b"]x"].concat();
        assert_eq!(read(&long, 17).map(|e| e.len()), Some(3), "a class is one element");
    }

    /// Patterns over a small alphabet, stars and classes included.
    fn pattern() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            prop::sample::select(vec![b'a', b'b', b'c', b'*', b'?', b'[', b']', b'^', b'-', b'\\']),
            0..12,
        )
    }

    fn text() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop::sample::select(vec![b'a', b'b', b'c', b'-', b'*', b']']), 0..12)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// The linear matcher means what the recursive one meant, on every small input, read
        /// for this text or for shorter and longer ones, and stays within its bound of steps.
        #[test]
        fn same_answers_as_the_recursive_matcher(p in pattern(), t in text(), longest in 0usize..16) {
            let expected = reference(&p, &t);
            prop_assert_eq!(matches(&p, &t), expected);
            prop_assert_eq!(Pattern::new(&p, longest).matches(&t), expected);
            let (hit, steps) = run(&Raw(&p), &t);
            prop_assert_eq!(hit, expected);
            prop_assert!(steps <= ((p.len() + 1) * (t.len() + 2)) as u64);
            if let Some(elements) = read(&p, t.len()) {
                prop_assert!(elements.len() <= 2 * t.len() + 1);
                let (hit, steps) = run(elements.as_slice(), &t);
                prop_assert_eq!(hit, expected);
                prop_assert!(steps <= ((elements.len() + 1) * (t.len() + 2)) as u64);
            }
        }
    }
}
