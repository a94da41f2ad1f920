//! The user documentation (README.md and docs/*.md) against the code and a real proxy: what a
//! reader follows must lead somewhere, and what it shows must be what the proxy does.
//!
//! - every relative link reaches a file, and every anchor a heading of that file;
//! - every config key the docs write (`` `key = value` ``, a ```toml block) is a config key, and
//!   docs/configuration.md's table lists every key;
//! - every safety rule cited ("rule 5a", "rules 4 and 8") exists in docs/safety-rules.md, and
//!   the citation links to it; so does every rule the source's comments cite, and every fencing
//!   rule they cite ("F3") in docs/fencing.md;
//! - the README's first lines give the two commands and the test command CI runs;
//! - `LOCK.INFO`'s fields in docs/fencing.md are those a real proxy answers;
//! - the README's `redis-cli` sessions, replayed against a real proxy, answer as printed;
//! - the README's first deployment: fresh masters quarantined, the start-up ERROR line and the
//!   `NOQUORUM` reply as printed, and lifting 2 of 3 masters (not 1) reaches a quorum.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use redis::Value;
use support::{ProxyProcess, fencing_ready, masters, query, urls};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A repository file, by its path from the root.
fn read(path: &Path) -> String {
    let full = root().join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// README.md and every docs/*.md, as (path from the root, text).
fn documents() -> Vec<(PathBuf, String)> {
    let mut paths = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| PathBuf::from("docs").join(p.file_name().expect("a file name")))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths.into_iter().map(|p| (p.clone(), read(&p))).collect()
}

/// Whether `line` opens or closes a fenced code block: its fence (the backticks or tildes).
fn fence(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = trimmed.chars().take_while(|c| *c == marker).count();
    (len >= 3).then(|| &trimmed[..len])
}

/// The text with the lines of fenced code blocks emptied (line numbers are kept), and the
/// blocks themselves as (info string, body), the body without the fence's own indentation.
fn split_fences(text: &str) -> (String, Vec<(String, String)>) {
    struct Open {
        fence: String,
        indent: usize,
        info: String,
        body: String,
    }
    let mut prose = String::new();
    let mut blocks = Vec::new();
    let mut open: Option<Open> = None;
    for line in text.lines() {
        let marker = fence(line);
        match open.take() {
            None => match marker {
                Some(f) => {
                    open = Some(Open {
                        fence: f.to_owned(),
                        indent: line.len() - line.trim_start().len(),
                        info: line.trim_start()[f.len()..].trim().to_owned(),
                        body: String::new(),
                    })
                }
                None => prose.push_str(line),
            },
            Some(block)
                if marker.is_some_and(|m| m.starts_with(&block.fence)) && line.trim() == marker.unwrap_or("") =>
            {
                blocks.push((block.info, block.body));
            }
            Some(mut block) => {
                let indent = line.len() - line.trim_start_matches(' ').len();
                block.body.push_str(&line[indent.min(block.indent)..]);
                block.body.push('\n');
                open = Some(block);
            }
        }
        prose.push('\n');
    }
    (prose, blocks)
}

/// The inline code spans of `prose` (fences already removed): byte ranges with their
/// backticks, and their contents. A run of n backticks closes at the next run of exactly n
/// within the paragraph; an unclosed run is literal text.
fn code_spans(prose: &str) -> Vec<(usize, usize, String)> {
    let bytes = prose.as_bytes();
    let run_at = |i: usize| bytes[i..].iter().take_while(|b| **b == b'`').count();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let n = run_at(i);
        let mut j = i + n;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j..].starts_with(b"\n\n") {
                break;
            }
            if bytes[j] == b'`' {
                let m = run_at(j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                spans.push((i, j + n, prose[i + n..j].to_owned()));
                i = j + n;
            }
            None => i += n,
        }
    }
    spans
}

/// `prose` with its code spans replaced by spaces (same byte length), so that what remains is
/// the text a reader sees as words and links.
fn blank_code(prose: &str) -> String {
    let mut out = prose.to_owned().into_bytes();
    for (start, end, _) in code_spans(prose) {
        for b in &mut out[start..end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    String::from_utf8(out).expect("code spans end on character boundaries")
}

/// A link `[text](target)`: where its text lies in the blanked prose, and its target.
struct Link {
    text: std::ops::Range<usize>,
    target: String,
}

/// The links of blanked prose (code spans blanked, so a `[x](y)` inside code is not one).
fn links(blank: &str) -> Vec<Link> {
    let bytes = blank.as_bytes();
    let mut found = Vec::new();
    for (open, _) in blank.match_indices('[') {
        if open > 0 && bytes[open - 1] == b'\\' {
            continue;
        }
        let mut depth = 0usize;
        let mut close = None;
        for (k, b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'[' => depth += 1,
                b']' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { continue };
        if bytes.get(close + 1) != Some(&b'(') {
            continue;
        }
        let Some(len) = blank[close + 2..].find(')') else {
            continue;
        };
        let target = blank[close + 2..close + 2 + len].trim();
        let target = target.trim_start_matches('<').trim_end_matches('>');
        found.push(Link {
            text: open + 1..close,
            target: target.to_owned(),
        });
    }
    found
}

/// GitHub's anchor for a heading: the text as rendered (no link targets, backticks or
/// emphasis), lower-cased, spaces to `-`, every other character but letters, digits, `-` and
/// `_` dropped.
fn slug(heading: &str) -> String {
    let blank = blank_code(heading);
    let mut text = heading.to_owned();
    // Link targets go, their text stays: replace from the last so ranges stay valid.
    for link in links(&blank).iter().rev() {
        let end = link.text.end + 2 + link.target.len() + 1;
        let label = heading[link.text.clone()].to_owned();
        text.replace_range(link.text.start - 1..end.min(text.len()), &label);
    }
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings (outside code blocks), as GitHub makes them:
/// a repeated heading gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let (prose, _) = split_fences(text);
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    for line in prose.lines() {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#').trim());
        let n = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    anchors
}

/// The line number (1-based) of byte `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

#[test]
fn every_link_reaches_a_file_and_every_anchor_a_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in documents() {
        let (prose, _) = split_fences(&text);
        let blank = blank_code(&prose);
        for link in links(&blank) {
            let target = &link.target;
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let line = line_of(&blank, link.text.start);
            let resolved = if file.is_empty() {
                path.clone()
            } else {
                path.parent().unwrap_or(Path::new("")).join(file)
            };
            let full = root().join(&resolved);
            checked += 1;
            if !full.exists() {
                broken.push(format!("{}:{line}: {target}: no such file", path.display()));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            if full.extension().is_none_or(|x| x != "md") {
                broken.push(format!(
                    "{}:{line}: {target}: an anchor into a file that is not markdown",
                    path.display()
                ));
                continue;
            }
            let headings = anchors(&read(&resolved));
            if !headings.contains(anchor) {
                broken.push(format!(
                    "{}:{line}: {target}: {} has no heading with the anchor #{anchor}",
                    path.display(),
                    resolved.display()
                ));
            }
        }
    }
    assert!(checked > 50, "only {checked} links found: the link reader is broken");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The fields of a `[[users]]` entry (`redlock_proxy::config::User`).
const USER_FIELDS: &[&str] = &["name", "password", "password_sha256", "keys", "admin"];

#[test]
fn every_config_key_the_docs_write_is_a_config_key() {
    // USER_FIELDS are the fields of a user: each is accepted in one.
    let user: redlock_proxy::config::User =
        toml::from_str("name = \"u\"\npassword = \"p\"\nkeys = [\"*\"]\nadmin = true").expect("a user");
    assert_eq!(user.name, "u");
    assert!(
        toml::from_str::<redlock_proxy::config::User>("name = \"u\"\npassword_sha256 = \"x\"").is_ok(),
        "password_sha256 is a user's field"
    );
    let keys = redlock_proxy::config::KEYS;
    let mut wrong = Vec::new();
    let (mut inline, mut blocks) = (0, 0);
    for (path, text) in documents() {
        let (prose, fenced) = split_fences(&text);
        // `key = value` in prose: any code span that reads as one TOML assignment.
        for (start, _, code) in code_spans(&prose) {
            let Some((key, _)) = code.split_once(" = ") else {
                continue;
            };
            let is_name = key.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !is_name || toml::from_str::<toml::Table>(&code).is_err() {
                continue;
            }
            inline += 1;
            if !keys.contains(&key) && !USER_FIELDS.contains(&key) {
                wrong.push(format!(
                    "{}:{}: `{code}`: {key} is no config key",
                    path.display(),
                    line_of(&prose, start)
                ));
            }
        }
        // ```toml blocks: a config (or part of one) that the proxy reads as written.
        for (info, body) in fenced.iter().filter(|(info, _)| info == "toml") {
            blocks += 1;
            let table: toml::Table = match toml::from_str(body) {
                Ok(t) => t,
                Err(e) => {
                    wrong.push(format!(
                        "{}: a {info} block does not parse: {e}\n{body}",
                        path.display()
                    ));
                    continue;
                }
            };
            for (key, value) in &table {
                if !keys.contains(&key.as_str()) {
                    wrong.push(format!("{}: toml block: {key} is no config key", path.display()));
                }
                if key == "users" {
                    for user in value.as_array().into_iter().flatten().filter_map(|u| u.as_table()) {
                        for field in user.keys().filter(|f| !USER_FIELDS.contains(&f.as_str())) {
                            wrong.push(format!(
                                "{}: toml block: users.{field} is no user field",
                                path.display()
                            ));
                        }
                    }
                }
            }
            if let Err(e) = redlock_proxy::config::Config::parse(body) {
                wrong.push(format!(
                    "{}: toml block is not a valid config: {e}\n{body}",
                    path.display()
                ));
            }
        }
    }
    assert!(
        inline > 10 && blocks >= 3,
        "only {inline} keys and {blocks} toml blocks found: the reader is broken"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_configuration_guide_lists_every_key() {
    let doc = read(Path::new("docs/configuration.md"));
    let mut rows = doc
        .lines()
        .skip_while(|l| !l.starts_with("| option | default | meaning |"));
    assert!(rows.next().is_some(), "docs/configuration.md has no option table");
    let mut listed = Vec::new();
    for row in rows
        .take_while(|l| l.starts_with('|'))
        .filter(|l| !l.starts_with("|---"))
    {
        let cell = row.split('|').nth(1).unwrap_or_default();
        for name in cell.split(',') {
            let name = name.trim().trim_matches('`');
            listed.push(if name == "[[users]]" {
                "users".to_owned()
            } else {
                name.to_owned()
            });
        }
    }
    let listed_set: BTreeSet<&str> = listed.iter().map(String::as_str).collect();
    assert_eq!(listed_set.len(), listed.len(), "a key listed twice: {listed:?}");
    let keys: BTreeSet<&str> = redlock_proxy::config::KEYS.iter().copied().collect();
    let missing: Vec<&&str> = keys.difference(&listed_set).collect();
    let unknown: Vec<&&str> = listed_set.difference(&keys).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/configuration.md's table: missing {missing:?}, not config keys {unknown:?}"
    );
}

/// The rule ids docs/safety-rules.md defines: `1.` .. `15.` and sub-rules `4a.` ...
fn defined_rules() -> BTreeSet<String> {
    let text = read(Path::new("docs/safety-rules.md"));
    let mut rules = BTreeSet::new();
    for line in text.lines() {
        let item = line.trim_start().trim_start_matches("- ").trim_start_matches("**");
        let id: String = item.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        let rest = &item[id.len()..];
        if id.starts_with(|c: char| c.is_ascii_digit()) && (rest.starts_with(". ") || rest.starts_with(".** ")) {
            rules.insert(id);
        }
    }
    rules
}

/// One citation of rules in prose: where it is, and the ids it names ("rules 4 and 8", "rules
/// 1-9": each id of the range).
struct Citation {
    at: std::ops::Range<usize>,
    ids: Vec<String>,
}

/// Every "rule N" / "rules N, M and Ka" in blanked prose.
fn citations(blank: &str) -> Vec<Citation> {
    let bytes = blank.as_bytes();
    let mut found = Vec::new();
    let starts = blank
        .char_indices()
        .map(|(i, _)| i)
        .filter(|i| blank[*i..].starts_with("rule") || blank[*i..].starts_with("Rule"));
    for start in starts {
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'-') {
            continue;
        }
        let mut i = start + 4;
        if bytes.get(i) == Some(&b's') {
            i += 1;
        }
        if !bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
            continue;
        }
        while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
            i += 1;
        }
        // An id: digits, then at most one letter that ends the word.
        let id_at = |i: usize| -> Option<(String, usize)> {
            let digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
            if digits == 0 {
                return None;
            }
            let mut end = i + digits;
            if bytes.get(end).is_some_and(|b| b.is_ascii_lowercase())
                && !bytes.get(end + 1).is_some_and(|b| b.is_ascii_alphanumeric())
            {
                end += 1;
            }
            if bytes.get(end).is_some_and(|b| b.is_ascii_alphanumeric()) {
                return None;
            }
            Some((blank[i..end].to_owned(), end))
        };
        let Some((first, mut end)) = id_at(i) else { continue };
        let mut ids = vec![first];
        loop {
            let rest = &blank[end..];
            let sep = [", and ", ", or ", ", ", " and ", " or ", "/", "-", "–"]
                .iter()
                .find(|s| rest.starts_with(**s));
            let Some(sep) = sep else { break };
            let Some((id, next)) = id_at(end + sep.len()) else {
                break;
            };
            if matches!(*sep, "-" | "–") {
                let from: u32 = ids.last().and_then(|l| l.parse().ok()).unwrap_or(0);
                let to: u32 = id.parse().unwrap_or(0);
                ids.extend((from + 1..to).map(|n| n.to_string()));
            }
            ids.push(id);
            end = next;
        }
        found.push(Citation { at: start..end, ids });
    }
    found
}

#[test]
fn every_rule_cited_exists_and_links_to_the_rules() {
    let rules = defined_rules();
    for id in ["1", "4", "4a", "5a", "8", "8a", "13", "15"] {
        assert!(
            rules.contains(id),
            "docs/safety-rules.md: rule {id} not found (found {rules:?})"
        );
    }
    let mut wrong = Vec::new();
    let mut cited = 0;
    for (path, text) in documents() {
        if path.ends_with("safety-rules.md") {
            continue;
        }
        let (prose, _) = split_fences(&text);
        let blank = blank_code(&prose);
        let links = links(&blank);
        for citation in citations(&blank) {
            cited += 1;
            let line = line_of(&blank, citation.at.start);
            let words = blank[citation.at.clone()].replace('\n', " ");
            for id in citation.ids.iter().filter(|id| !rules.contains(*id)) {
                wrong.push(format!(
                    "{}:{line}: \"{words}\": rule {id} is not in docs/safety-rules.md",
                    path.display()
                ));
            }
            let linked = links.iter().any(|l| {
                l.text.start <= citation.at.start
                    && citation.at.end <= l.text.end
                    && l.target
                        .split('#')
                        .next()
                        .is_some_and(|f| f.ends_with("safety-rules.md"))
            });
            if !linked {
                wrong.push(format!(
                    "{}:{line}: \"{words}\" does not link to docs/safety-rules.md",
                    path.display()
                ));
            }
        }
    }
    assert!(cited > 20, "only {cited} citations found: the reader is broken");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The fencing rules docs/fencing.md defines: `F1` .. `F5` (`- **F1 (bump).** ...`).
fn defined_fencing_rules() -> BTreeSet<String> {
    let text = read(Path::new("docs/fencing.md"));
    let items = text.lines().filter_map(|l| l.trim_start().strip_prefix("- **F"));
    let ids = items.map(|rest| rest.chars().take_while(char::is_ascii_digit).collect::<String>());
    ids.filter(|digits| !digits.is_empty())
        .map(|digits| format!("F{digits}"))
        .collect()
}

/// Every fencing rule named in `text` ("F3", "F1–F5": both ends): where, and its id.
fn fencing_citations(text: &str) -> Vec<(usize, String)> {
    let bytes = text.as_bytes();
    let word = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_');
    (0..bytes.len())
        .filter(|i| bytes[*i] == b'F' && (*i == 0 || !word(bytes.get(i - 1))))
        .filter_map(|i| {
            let digits = bytes[i + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
            (digits > 0 && !word(bytes.get(i + 1 + digits))).then(|| (i, text[i..i + 1 + digits].to_owned()))
        })
        .collect()
}

/// The comments of every `.rs` file under src/, as (path from the root, their words with each
/// run of whitespace made one space, the line of each byte of those words): a citation may
/// run over comment lines ("rules 4a\n/// and 5a").
fn source_comments() -> Vec<(PathBuf, String, Vec<usize>)> {
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(root().join(dir)).expect("a source directory") {
            let path = dir.join(entry.expect("a directory entry").file_name());
            if root().join(&path).is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    rust_files(Path::new("src"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let comments = support::rust_source::split(&read(&path)).comments;
            let (mut words, mut lines, mut line) = (String::new(), Vec::new(), 1);
            for c in comments.chars() {
                if !c.is_whitespace() {
                    words.push(c);
                    lines.resize(words.len(), line);
                } else if !words.is_empty() && !words.ends_with(' ') {
                    words.push(' ');
                    lines.push(line);
                }
                line += usize::from(c == '\n');
            }
            (path, words, lines)
        })
        .collect()
}

#[test]
fn every_rule_cited_in_the_source_exists() {
    let (rules, fencing) = (defined_rules(), defined_fencing_rules());
    for id in ["F1", "F2", "F3", "F4", "F5"] {
        assert!(
            fencing.contains(id),
            "docs/fencing.md: {id} not found (found {fencing:?})"
        );
    }
    let mut wrong = Vec::new();
    let (mut cited, mut cited_fencing) = (0, 0);
    for (path, words, lines) in source_comments() {
        for citation in citations(&words) {
            cited += 1;
            let said = &words[citation.at.clone()];
            for id in citation.ids.iter().filter(|id| !rules.contains(*id)) {
                let which = if citation.ids.len() > 1 {
                    format!("rule {id} ")
                } else {
                    String::new()
                };
                let line = lines[citation.at.start];
                wrong.push(format!(
                    "{}:{line}: \"{said}\": {which}not in docs/safety-rules.md",
                    path.display()
                ));
            }
        }
        for (at, id) in fencing_citations(&words) {
            cited_fencing += 1;
            if !fencing.contains(&id) {
                wrong.push(format!(
                    "{}:{}: \"{id}\": not in docs/fencing.md",
                    path.display(),
                    lines[at]
                ));
            }
        }
    }
    assert!(
        cited > 50,
        "only {cited} rule citations found in src/: the reader is broken"
    );
    assert!(
        cited_fencing > 20,
        "only {cited_fencing} fencing rules found in src/: the reader is broken"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_readme_starts_with_the_two_commands_and_the_test_command_ci_runs() {
    let readme = read(Path::new("README.md"));
    let head: String = readme.lines().take(15).collect::<Vec<_>>().join("\n");
    for needed in ["cargo run --release", "bash .ci/run", "cargo test --all-targets"] {
        assert!(
            head.contains(needed),
            "the README's first lines lack `{needed}`:\n{head}"
        );
    }
    let sentence = "The whole test suite is `";
    let at = head
        .find(sentence)
        .expect("the README's first lines name the whole test suite")
        + sentence.len();
    let command = &head[at..at + head[at..].find('`').expect("the command's closing backtick")];
    let ci = read(Path::new(".ci/run"));
    assert!(
        ci.lines().any(|l| l.trim() == command),
        ".ci/run does not run the README's test command `{command}`"
    );
}

/// The field names of a `LOCK.INFO` reply as redis-cli prints it: the strings at the odd
/// positions of ` 1) "holder"`, ` 2) ...`.
fn info_fields(lines: &[&str]) -> Vec<String> {
    lines
        .iter()
        .map_while(|l| {
            let (n, item) = l.trim().split_once(") ")?;
            Some((n.parse::<usize>().ok()?, item.trim().trim_matches('"').to_owned()))
        })
        .filter(|(n, _)| n % 2 == 1)
        .map(|(_, name)| name)
        .collect()
}

#[test]
fn lock_info_fields_are_documented_as_the_proxy_answers_them() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    fencing_ready(&proxy);
    let mut c = proxy.client();
    let token = query(&mut c, &["LOCK.ACQUIRE", "lock:docs", "t", "10000"]).expect("LOCK.ACQUIRE");
    assert!(matches!(token, Value::Int(_)), "{token:?}");
    let reply = query(&mut c, &["LOCK.INFO", "lock:docs"]).expect("LOCK.INFO");
    let Value::Array(items) = reply else {
        panic!("LOCK.INFO answered {reply:?}, not a flat map")
    };
    let answered: Vec<String> = items
        .iter()
        .step_by(2)
        .map(|v| match v {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("a field name that is no string: {other:?}"),
        })
        .collect();
    assert!(answered.len() >= 3, "{answered:?}");

    // docs/fencing.md's redis-cli example shows the reply.
    let fencing = read(Path::new("docs/fencing.md"));
    let (_, blocks) = split_fences(&fencing);
    let example = blocks
        .iter()
        .find_map(|(_, body)| {
            let lines: Vec<&str> = body.lines().collect();
            let at = lines
                .iter()
                .position(|l| l.contains("redis-cli") && l.contains("LOCK.INFO"))?;
            Some(info_fields(&lines[at + 1..]))
        })
        .expect("docs/fencing.md shows a LOCK.INFO reply");
    assert_eq!(
        example, answered,
        "docs/fencing.md's LOCK.INFO example against a real proxy"
    );

    // The command tables name every field.
    for doc in ["docs/fencing.md", "docs/commands.md"] {
        let text = read(Path::new(doc));
        let row = text
            .lines()
            .find(|l| l.starts_with("| `LOCK.INFO key` |"))
            .unwrap_or_else(|| panic!("{doc} has no LOCK.INFO row"));
        for field in &answered {
            assert!(
                row.contains(&format!("`{field}`")),
                "{doc}'s LOCK.INFO row does not name `{field}`: {row}"
            );
        }
    }
}

/// The section of `text` under the heading line `heading`, up to the next `## `.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    let body = &text[start + heading.len() + 2..];
    &body[..body.find("\n## ").unwrap_or(body.len())]
}

/// Words of a shell command line, with '...' and "..." quoting (what the README's lines use).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    words.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            (_, c) => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(word);
    }
    words
}

/// Output as compared: without carriage returns and trailing blank lines, with long numbers
/// (fencing tokens, which start from the clock) as `#`.
fn normalise_tokens(text: &str) -> String {
    let mut out = String::new();
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        if digits.len() >= 10 {
            out.push('#');
        } else {
            out.push_str(digits);
        }
        digits.clear();
    };
    for c in text.replace('\r', "").trim_end().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

/// Runs `redis-cli -p <port> --no-raw <args>` (stdin: `input`), as a terminal would show it.
fn redis_cli(port: u16, args: &[String], input: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .arg("--no-raw")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): install it, e.g. `apt-get install -y redis-tools`"));
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(input) = input {
        stdin.write_all(input.as_bytes()).expect("write to redis-cli");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("redis-cli");
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `got` is what the README shows: equal, or, where the README ends with `...`, the
/// lines before it.
fn shown_as(got: &str, expected: &str) -> bool {
    let got = normalise_tokens(got);
    let expected = normalise_tokens(expected);
    match expected.strip_suffix("...") {
        Some(head) => got.starts_with(head.trim_end()),
        None => got == expected,
    }
}

/// The README's "Try it with redis-cli": every `redis-cli` line, replayed against a proxy over
/// embedded masters (what `cargo run --release` starts), answers what the README prints; the
/// interactive session is one connection. So the session lock's surprise stays as printed: a
/// session lock taken by a one-shot `redis-cli` is gone at the next command.
#[test]
fn the_readme_redis_cli_sessions_answer_as_printed() {
    let readme = read(Path::new("README.md"));
    let try_it = section(&readme, "## Try it with redis-cli");
    // The first lock on the README's first screen, then the Try it section.
    let first_screen = &readme[..readme.find("\n## ").expect("a section")];
    let (_, mut blocks) = split_fences(first_screen);
    assert!(!blocks.is_empty(), "the README's first screen shows a first lock");
    blocks.extend(split_fences(try_it).1);
    let proxy = ProxyProcess::start(&[], "");
    fencing_ready(&proxy);
    let prompt = "127.0.0.1:7379> ";
    let mut replayed = 0;
    for (_, body) in blocks {
        let lines: Vec<&str> = body.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i];
            i += 1;
            let Some(command) = line.strip_prefix("$ redis-cli -p 7379") else {
                continue;
            };
            if command.trim().is_empty() {
                // An interactive session: its commands through one connection.
                let mut input = String::new();
                let mut expected = String::new();
                while i < lines.len() && !lines[i].starts_with("$ ") {
                    match lines[i].strip_prefix(prompt) {
                        Some(cmd) => {
                            input.push_str(cmd);
                            input.push('\n');
                        }
                        None => {
                            expected.push_str(lines[i]);
                            expected.push('\n');
                        }
                    }
                    i += 1;
                }
                let got = redis_cli(proxy.port, &[], Some(&input));
                assert!(
                    shown_as(&got, &expected),
                    "README, redis-cli session:\n{input}printed:\n{expected}\nanswered:\n{got}"
                );
                replayed += 1;
                continue;
            }
            let mut expected = String::new();
            while i < lines.len() && !lines[i].starts_with("$ ") {
                expected.push_str(lines[i]);
                expected.push('\n');
                i += 1;
            }
            let args = shell_words(command);
            // A session lock is released by the task of the connection that closed, concurrently
            // with the next connection: on a loaded machine a read may come first. Reads are
            // asked again, for a bounded time, until they show the release.
            let deadline = Instant::now() + Duration::from_secs(5);
            let got = loop {
                let got = redis_cli(proxy.port, &args, None);
                let read_only = args.first().is_some_and(|a| a.eq_ignore_ascii_case("GET"));
                if shown_as(&got, &expected) || !read_only || Instant::now() > deadline {
                    break got;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            assert!(
                shown_as(&got, &expected),
                "README: `redis-cli -p 7379{command}` printed:\n{expected}\nanswered:\n{got}"
            );
            replayed += 1;
        }
    }
    assert!(
        replayed >= 12,
        "only {replayed} redis-cli lines found in the README's Try it section"
    );
}

/// Every number of seconds ("in 242 s") as `#`: how long is left depends on when the masters
/// started. Every other number (masters voting, the quorum, members, how many to lift) stays.
fn seconds_as_hash(text: &str) -> String {
    let mut out = String::new();
    let mut digits = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            digits.push(c);
            if chars.peek().is_some_and(|n| n.is_ascii_digit()) {
                continue;
            }
            let rest: String = chars.clone().take(2).collect();
            let seconds = rest == " s" && chars.clone().nth(2).is_none_or(|n| !n.is_alphanumeric());
            out.push_str(if seconds { "#" } else { &digits });
            digits.clear();
        } else {
            out.push(c);
        }
    }
    out
}

/// A log line without its colours (ESC [ ... m).
fn without_colours(line: &str) -> String {
    let mut plain = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The README's first deployment, over fresh `redis-server`s with the default
/// `quarantine = "always"`: the start-up ERROR line and the `NOQUORUM` reply are the ones the
/// README prints (numbers aside); lifting one of three masters is not enough and two are, as it
/// says; and its `--check-config` line with `--backend` flags is read as it shows.
#[test]
fn the_readme_first_deployment_is_what_a_proxy_over_fresh_masters_does() {
    let readme = read(Path::new("README.md"));
    let deployment = section(&readme, "## A first real deployment");

    // The flags as the README writes them.
    let check = deployment
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("target/release/redlock-proxy --check-config"))
        .expect("the README's --check-config line");
    let args = shell_words(check);
    let dir = std::env::temp_dir().join(format!("redlock-proxy-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_redlock-proxy"))
        .args(&args[1..])
        .current_dir(&dir)
        .output()
        .expect("run redlock-proxy --check-config");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{check}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(r#"backends = ["redis://h1:6379", "redis://h2:6379", "redis://h3:6379"]"#),
        "{stdout}"
    );

    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "quarantine = \"always\"");
    let deadline = Instant::now() + Duration::from_secs(10);
    let logged = loop {
        let log = proxy.log();
        if let Some(line) = log.lines().map(without_colours).find(|l| l.contains(" ERROR ")) {
            break line;
        }
        assert!(Instant::now() < deadline, "no ERROR line at start:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    // The README's proxy listens on 7379; the line names the port to copy.
    let logged = logged[logged.find("ERROR ").expect("ERROR")..].replace(&format!("-p {}", proxy.port), "-p 7379");
    let logged = logged.as_str();
    let printed = deployment
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ERROR "))
        .expect("the README shows the start-up ERROR line");
    assert_eq!(
        seconds_as_hash(printed),
        seconds_as_hash(logged),
        "the start-up ERROR line"
    );

    let mut c = proxy.client();
    let set = ["SET", "lock:a", "t1", "NX", "PX", "10000"];
    let refused = |c: &mut redis::Connection| match query(c, &set) {
        Err(e) => format!("{} {}", e.code().unwrap_or_default(), e.detail().unwrap_or_default()),
        Ok(v) => panic!("SET answered {v:?} with the masters quarantined"),
    };
    let error = refused(&mut c);
    let printed = deployment
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("(error) "))
        .expect("the README shows the NOQUORUM reply");
    assert_eq!(seconds_as_hash(printed), seconds_as_hash(&error), "the NOQUORUM reply");

    // Lifting: one member is not enough, two are.
    for member in ["0", "1"] {
        let lift = format!("redis-cli -p 7379 PROXY QUARANTINE {member} LIFT");
        assert!(deployment.contains(&lift), "the README does not show `{lift}`");
    }
    query(&mut c, &["PROXY", "QUARANTINE", "0", "LIFT"]).expect("lift member 0");
    let error = refused(&mut c);
    assert!(error.starts_with("NOQUORUM 1 of 3 masters can vote"), "{error}");
    query(&mut c, &["PROXY", "QUARANTINE", "1", "LIFT"]).expect("lift member 1");
    assert_eq!(
        query(&mut c, &set).expect("SET"),
        Value::Okay,
        "two of three lifted: a quorum"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_markdown_reader_reads_what_github_renders() {
    assert_eq!(
        slug("Safety: what is guaranteed, and what is not"),
        "safety-what-is-guaranteed-and-what-is-not"
    );
    assert_eq!(
        slug("Alerts (`deploy/prometheus-alerts.yml`)"),
        "alerts-deployprometheus-alertsyml"
    );
    assert_eq!(
        slug("Choosing N, TTLs and `max_ttl_ms`"),
        "choosing-n-ttls-and-max_ttl_ms"
    );
    assert_eq!(
        slug("Scripts and [rule 7](safety-rules.md#the-algorithm)"),
        "scripts-and-rule-7"
    );
    assert_eq!(slug("Fencing rules F1–F5"), "fencing-rules-f1f5");
    let blank = blank_code("see [a `b` c](x.md#y) and `[no](link)` and [rule 5a](r.md)");
    let found: Vec<String> = links(&blank).into_iter().map(|l| l.target).collect();
    assert_eq!(found, ["x.md#y", "r.md"]);
    let cited: Vec<Vec<String>> = citations("rules 4 and 8, rule 5a; rules 1-3; the rule-13 pass; rule 12.")
        .into_iter()
        .map(|c| c.ids)
        .collect();
    assert_eq!(cited, [vec!["4", "8"], vec!["5a"], vec!["1", "2", "3"], vec!["12"]]);
    assert_eq!(
        info_fields(&[" 1) \"holder\"", " 2) \"t\"", " 3) \"x\"", "12) (nil)", "$ next"]),
        ["holder", "x"]
    );
    assert_eq!(
        seconds_as_hash("only 0 of 3 vote; up to 242 s: lift 2 of them, again in 7 s; 5 seconds"),
        "only 0 of 3 vote; up to # s: lift 2 of them, again in # s; 5 seconds"
    );
}

/// A console line as compared: without its trailing comment (two spaces or more, then `#`).
fn without_comment(line: &str) -> &str {
    match line.find("  #") {
        Some(at) => line[..at].trim_end(),
        None => line.trim_end(),
    }
}

/// docs/commands.md's leader election, replayed as written: the campaign in an interactive
/// session (a connection that stays open, so the leadership lasts), `ELECT.LEADER` and the
/// long poll of `ELECT.OBSERVE ... AFTER term` from one-shot `redis-cli`s, the poll answered
/// when the leader resigns.
#[test]
fn the_election_example_replays_as_written() {
    let doc = read(Path::new("docs/commands.md"));
    let election = section(&doc, "## Leader election");
    let (_, blocks) = split_fences(election);
    let lines: Vec<&str> = blocks.iter().flat_map(|(_, body)| body.lines()).collect();
    let after = |prefix: &str| -> (usize, &str) {
        let at = lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("docs/commands.md's election example has no line {prefix:?}"));
        (at, &lines[at][prefix.len()..])
    };
    let proxy = ProxyProcess::start(&[], "");
    fencing_ready(&proxy);
    // The interactive campaign: one connection, kept.
    let (at, campaign) = after("127.0.0.1:7379> ");
    assert_eq!(
        lines[at - 1],
        "$ redis-cli -p 7379",
        "the campaign is an interactive session"
    );
    let mut leader = proxy.client();
    let args = shell_words(campaign);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let term = match query(&mut leader, &refs) {
        Ok(Value::Int(term)) => term,
        other => panic!("{campaign}: {other:?}"),
    };
    assert_eq!(normalise_tokens(without_comment(lines[at + 1])), "(integer) #");
    // ELECT.LEADER, one-shot.
    let (at, command) = after("$ redis-cli -p 7379 ELECT.LEADER");
    let got = redis_cli(proxy.port, &shell_words(&format!("ELECT.LEADER{command}")), None);
    let expected: Vec<&str> = lines[at + 1..at + 3].iter().map(|l| without_comment(l)).collect();
    assert!(shown_as(&got, &expected.join("\n")), "ELECT.LEADER answered:\n{got}");
    // The long poll, answered by the resignation.
    let (at, command) = after("$ redis-cli -p 7379 ELECT.OBSERVE");
    let written_term = normalise_tokens(command);
    assert!(written_term.contains("AFTER # TIMEOUT"), "{command}");
    let args: Vec<String> = shell_words(&format!("ELECT.OBSERVE{command}"))
        .into_iter()
        .map(|a| {
            if a.len() >= 10 && a.bytes().all(|b| b.is_ascii_digit()) {
                term.to_string()
            } else {
                a
            }
        })
        .collect();
    let port = proxy.port;
    let poll = std::thread::spawn(move || redis_cli(port, &args, None));
    // The poll is waiting before the leader resigns: it answers only on a change.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!poll.is_finished(), "the long poll answered while the leader still led");
    let (value, name) = (args_of(campaign, 2), args_of(campaign, 1));
    assert_eq!(query(&mut leader, &["ELECT.RESIGN", &name, &value]), Ok(Value::Int(1)));
    let got = poll.join().expect("the poll");
    assert!(
        shown_as(&got, without_comment(lines[at + 1])),
        "ELECT.OBSERVE answered:\n{got}"
    );
}

/// The `n`-th word of a console command line.
fn args_of(line: &str, n: usize) -> String {
    shell_words(line).swap_remove(n)
}
