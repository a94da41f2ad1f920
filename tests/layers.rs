//! The import structure of `src/`: each file uses only files of its own layer or lower ones
//! (docs/development.md, "Layers"), and no modules import each other in a circle.
//!
//! The checker reads the source, not the compiler's view: comments, strings and test-only code
//! (`#[cfg(test)]` items, and files their parent declares under `#[cfg(test)]`) are left out, and
//! each path (`use` trees; `crate::`, `super::`, `self::`, child-module and imported-module paths
//! in code) is resolved to the file that defines what it names, through `use` re-exports. A file
//! depends on another when one of its paths lands there; re-exporting (`pub use`) an item is no
//! dependency unless the file also names the item itself, and declaring a module (`mod x;`) is
//! none. A macro is followed only as a path (`crate::name!`), not by its bare name
//! (`counter_lua!`). Calls of methods are not followed either: a module's `impl` blocks split
//! over its files (`impl Proxy` in `recipes/lock/serve.rs`) are no dependency of the module file.

#[allow(dead_code)]
#[path = "support/rust_source.rs"]
mod rust_source;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// One token of blanked code and its byte offset: an identifier (or number, or lifetime), `::`,
/// or one punctuation character.
struct Token {
    text: String,
    at: usize,
}

/// The tokens of `code` (comments and literals already blanked).
fn tokens(code: &str) -> Vec<Token> {
    let b = code.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        // A lifetime or label (`'a`) is one token: char literals are blanked.
        let quote = usize::from(b[i] == b'\'');
        let word = b[i + quote..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
            .count();
        let len = if word > 0 {
            quote + word
        } else if b[i..].starts_with(b"::") {
            2
        } else if b[i].is_ascii_whitespace() || !b[i].is_ascii() {
            i += 1;
            continue;
        } else {
            1
        };
        out.push(Token {
            text: code[i..i + len].to_owned(),
            at: i,
        });
        i += len;
    }
    out
}

/// Whether a token is an identifier.
fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
}

/// A `use` tree's leaf: the path as written, and the name it brings in (`None` for a glob).
struct Leaf {
    segs: Vec<String>,
    name: Option<String>,
}

/// The leaves of the `use` tree at `toks[*pos..]` (`a::{b, c::{self, d as e}, f::*}`), appended
/// to `out` with `prefix` before each.
fn use_tree(toks: &[&str], pos: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Leaf>) {
    while let Some(&t) = toks.get(*pos) {
        *pos += 1;
        match t {
            "::" => {}
            "*" => {
                return out.push(Leaf {
                    segs: prefix,
                    name: None,
                });
            }
            "{" => {
                while toks.get(*pos).is_some_and(|t| *t != "}") {
                    use_tree(toks, pos, prefix.clone(), out);
                    if toks.get(*pos) == Some(&",") {
                        *pos += 1;
                    }
                }
                *pos += 1;
                return;
            }
            t if is_ident(t) => {
                if toks.get(*pos) == Some(&"::") {
                    prefix.push(t.to_owned());
                    continue;
                }
                if t != "self" {
                    prefix.push(t.to_owned());
                }
                let mut name = prefix.last().cloned();
                if toks.get(*pos) == Some(&"as") {
                    name = toks.get(*pos + 1).map(|n| n.to_string());
                    *pos += 2;
                }
                return out.push(Leaf { segs: prefix, name });
            }
            _ => return,
        }
    }
}

/// A `use` declaration's leaf in a file: where, whether re-exported, whether at the file's top
/// level (and so seen by other modules' paths).
struct Use {
    leaf: Leaf,
    at: usize,
    public: bool,
    top_level: bool,
}

/// One file of `src/` as the checker reads it.
#[derive(Default)]
struct File {
    path: PathBuf,
    module: Vec<String>,
    text: String,
    /// The code's tokens, test-only code left out.
    tokens: Vec<Token>,
    /// Modules declared with `mod name;` outside `#[cfg(test)]`, and those declared inside it.
    children: BTreeSet<String>,
    test_children: BTreeSet<String>,
    /// `#![cfg(test)]`: the whole file is test-only.
    test_only: bool,
    /// Names of the items defined at the file's top level, and which of them are `pub`.
    defined: BTreeSet<String>,
    public: BTreeSet<String>,
    /// Names of the macros it defines (`macro_rules! name`).
    macros: BTreeSet<String>,
    uses: Vec<Use>,
    /// The token indices of `use` and `mod` declarations: not paths in code.
    declarations: BTreeSet<usize>,
}

/// Whether `toks[i..]` is the attribute `#[cfg(test)]` (or `#![cfg(test)]` when `inner`).
fn cfg_test(toks: &[Token], i: usize, inner: bool) -> bool {
    let want: &[&str] = if inner {
        &["#", "!", "[", "cfg", "(", "test", ")", "]"]
    } else {
        &["#", "[", "cfg", "(", "test", ")", "]"]
    };
    toks.len() >= i + want.len() && want.iter().zip(&toks[i..]).all(|(w, t)| t.text == *w)
}

/// The end of the item starting at `toks[i]` (after its attributes): its `;` or the `}` that
/// closes its body, whichever comes first at its own nesting depth.
fn item_end(toks: &[Token], mut i: usize) -> usize {
    while toks.get(i).is_some_and(|t| t.text == "#") {
        i = item_end(toks, i + 1); // another attribute: `[...]`
    }
    let mut depth = 0usize;
    while let Some(t) = toks.get(i) {
        match t.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" if depth == 0 => return i, // the enclosing block ends
            ")" | "]" | "}" => {
                depth -= 1;
                if depth == 0 && t.text != ")" {
                    return i + 1;
                }
            }
            ";" if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Reads one file: blanks comments and literals, leaves out test-only items, and collects its
/// declarations, definitions and `use` leaves.
fn read_file(path: PathBuf, text: String) -> File {
    let all = tokens(&rust_source::split(&text).code);
    let module = module_of(&path);
    let mut f = File {
        path,
        module,
        text,
        ..File::default()
    };
    (f.tokens, f.test_children, f.test_only) = without_test_items(all);
    let toks: Vec<&str> = f.tokens.iter().map(|t| t.text.as_str()).collect();
    let mut depth = 0usize;
    for i in 0..toks.len() {
        match toks[i] {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "use" => {
                let public = visibility_before(&toks, i);
                let mut pos = i + 1;
                let mut leaves = Vec::new();
                use_tree(&toks, &mut pos, Vec::new(), &mut leaves);
                f.declarations.extend(i..pos);
                let (at, top_level) = (f.tokens[i].at, depth == 0);
                f.uses.extend(leaves.into_iter().map(|leaf| Use {
                    leaf,
                    at,
                    public,
                    top_level,
                }));
            }
            "macro_rules" if toks.get(i + 1) == Some(&"!") => {
                f.macros.insert(toks.get(i + 2).unwrap_or(&"").to_string());
            }
            "mod" if depth == 0 && toks.get(i + 2) == Some(&";") => {
                f.children.insert(toks[i + 1].to_string());
                f.declarations.extend(i..i + 3);
            }
            "struct" | "enum" | "fn" | "trait" | "type" | "const" | "static" | "union"
                if depth == 0 && toks.get(i + 1).is_some_and(|n| is_ident(n) && *n != "fn") =>
            {
                let name = toks[i + 1].to_string();
                if visibility_before(&toks, i) {
                    f.public.insert(name.clone());
                }
                f.defined.insert(name);
            }
            _ => {}
        }
    }
    f
}

/// The tokens without test-only items (`#[cfg(test)]` and the item after it); the modules declared
/// test-only there (`#[cfg(test)] mod tests;`), and whether the file says `#![cfg(test)]`.
fn without_test_items(all: Vec<Token>) -> (Vec<Token>, BTreeSet<String>, bool) {
    let (mut kept, mut test_children, mut test_only) = (Vec::new(), BTreeSet::new(), false);
    let mut skip_until = 0;
    for i in 0..all.len() {
        test_only |= cfg_test(&all, i, true);
        if i >= skip_until && cfg_test(&all, i, false) {
            skip_until = item_end(&all, i + 7);
            let item: Vec<&str> = all[i + 7..skip_until].iter().map(|t| t.text.as_str()).collect();
            if let [.., "mod", name, ";"] = item.as_slice() {
                test_children.insert(name.to_string());
            }
        }
        if i >= skip_until {
            kept.push(Token {
                text: all[i].text.clone(),
                at: all[i].at,
            });
        }
    }
    (kept, test_children, test_only)
}

/// Whether the item whose keyword is `toks[i]` is `pub` or `pub(...)`, past qualifiers
/// (`pub const fn`, `pub(crate) async fn`).
fn visibility_before(toks: &[&str], mut i: usize) -> bool {
    while i > 0 && matches!(toks[i - 1], "const" | "async" | "unsafe" | "extern") {
        i -= 1;
    }
    match i.checked_sub(1).map(|j| toks[j]) {
        Some("pub") => true,
        Some(")") => {
            let open = toks[..i].iter().rposition(|t| *t == "(");
            open.is_some_and(|o| o > 0 && toks[o - 1] == "pub")
        }
        _ => false,
    }
}

/// The module a file is: `src/a/b.rs` is `a::b`, `src/a/mod.rs` is `a`, `src/lib.rs` the root.
fn module_of(path: &Path) -> Vec<String> {
    let inner = path.strip_prefix("src").unwrap_or(path).with_extension("");
    let mut segs: Vec<String> = inner.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    segs
}

/// Where a path leads: the file defining what it names, the module file when the name is not
/// found there, or outside the crate's files (another crate, the crate root).
#[derive(Clone, Copy, PartialEq)]
enum Target {
    Found(usize),
    Module(usize),
    Outside,
}

/// One layer of docs/development.md's table: its name and file patterns.
struct Layer {
    name: String,
    patterns: Vec<String>,
}

/// Why one file depends on another: the first path that leads there, and its line.
struct Evidence {
    line: usize,
    path: String,
}

/// `src/` read: its files (the crate root too, not checked), the layers, and the dependencies.
struct Tree {
    files: Vec<File>,
    by_module: HashMap<Vec<String>, usize>,
    /// Per file, the modules it imports under a name (`use crate::quorum;`).
    aliases: Vec<HashMap<String, Vec<String>>>,
    layers: Vec<Layer>,
    edges: BTreeMap<(usize, usize), Evidence>,
}

/// A repository file's text, or its replacement in `overrides`.
fn read_text(root: &Path, overrides: &[(PathBuf, String)], path: &Path) -> String {
    match overrides.iter().find(|(p, _)| p == path) {
        Some((_, text)) => text.clone(),
        None => std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    }
}

/// Every `.rs` file under `dir` (relative to `root`), sorted.
fn rust_files(root: &Path, dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root.join(dir)).expect("a readable directory") {
        let name = dir.join(entry.expect("a directory entry").file_name());
        if root.join(&name).is_dir() {
            out.extend(rust_files(root, &name));
        } else if name.extension().is_some_and(|x| x == "rs") {
            out.push(name);
        }
    }
    out.sort();
    out
}

impl Tree {
    /// Reads `src/` and docs/development.md under `root`, with `overrides` in place of some
    /// files' text, and finds the dependencies between the files.
    fn read(root: &Path, overrides: &[(PathBuf, String)]) -> Tree {
        let mut files: Vec<File> = rust_files(root, Path::new("src"))
            .into_iter()
            .filter(|p| p != Path::new("src/main.rs")) // the binary: a crate of its own
            .map(|p| {
                let text = read_text(root, overrides, &p);
                read_file(p, text)
            })
            .collect();
        let declared_for_tests: BTreeSet<Vec<String>> = files
            .iter()
            .flat_map(|f| {
                f.test_children
                    .iter()
                    .map(|c| [f.module.clone(), vec![c.clone()]].concat())
            })
            .collect();
        files.retain(|f| !f.test_only && !(1..=f.module.len()).any(|k| declared_for_tests.contains(&f.module[..k])));
        let by_module = files.iter().enumerate().map(|(i, f)| (f.module.clone(), i)).collect();
        let doc = read_text(root, overrides, Path::new("docs/development.md"));
        let mut tree = Tree {
            aliases: vec![HashMap::new(); files.len()],
            files,
            by_module,
            layers: layers(&doc),
            edges: BTreeMap::new(),
        };
        for _ in 0..2 {
            // Twice: `use a::b;` may start at a module another `use` imported.
            tree.aliases = (0..tree.files.len()).map(|f| tree.module_aliases(f)).collect();
        }
        for f in 0..tree.files.len() {
            tree.find_dependencies(f);
        }
        tree
    }

    /// The modules file `f` imports under a name, and their absolute paths.
    fn module_aliases(&self, f: usize) -> HashMap<String, Vec<String>> {
        let file = &self.files[f];
        let mut out = HashMap::new();
        for u in &file.uses {
            if let (Some(name), Some(abs)) = (&u.leaf.name, self.absolute(f, &u.leaf.segs))
                && self.by_module.contains_key(&abs)
            {
                out.insert(name.clone(), abs);
            }
        }
        out
    }

    /// The path `segs`, written in file `f`, from the crate root; `None` when it starts outside
    /// the crate (`std::`, another crate, a local enum's variants).
    fn absolute(&self, f: usize, segs: &[String]) -> Option<Vec<String>> {
        let file = &self.files[f];
        let first = segs.first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => file.module.clone(),
            "super" => {
                let ups = segs.iter().take_while(|s| *s == "super").count();
                let keep = file.module.len().checked_sub(ups)?;
                return Some([&file.module[..keep], &segs[ups..]].concat());
            }
            name if file.children.contains(name) => return Some([&file.module[..], segs].concat()),
            name => self.aliases[f].get(name)?.clone(),
        };
        base.extend_from_slice(&segs[1..]);
        Some(base)
    }

    /// The file an absolute path leads to: the deepest module file on it, then where that
    /// module has the rest from (see [`Tree::resolve_in`]).
    fn resolve(&self, segs: &[String], depth: usize) -> Target {
        match (1..=segs.len())
            .rev()
            .find(|k| self.by_module.contains_key(&segs[..*k]))
        {
            Some(k) => self.resolve_in(self.by_module[&segs[..k]], &segs[k..], depth),
            // `crate::name!`: a `#[macro_export]` macro is at the crate root, wherever defined.
            None => match (0..self.files.len()).find(|f| segs.len() == 1 && self.files[*f].macros.contains(&segs[0])) {
                Some(f) => Target::Found(f),
                None => Target::Outside,
            },
        }
    }

    /// The file the path `rest` leads to from within the module file `m`: `m` when it defines
    /// `rest`'s first name, else where `m` imports that name from (`pub use rwlock::Mode;`).
    fn resolve_in(&self, m: usize, rest: &[String], depth: usize) -> Target {
        let Some(name) = rest.first() else {
            return Target::Found(m);
        };
        let file = &self.files[m];
        if file.defined.contains(name) || depth > 8 {
            return Target::Found(m);
        }
        let top = || file.uses.iter().filter(|u| u.top_level);
        if let Some(u) = top().find(|u| u.leaf.name.as_ref() == Some(name)) {
            return match self.absolute(m, &u.leaf.segs) {
                Some(abs) => self.resolve(&[abs, rest[1..].to_vec()].concat(), depth + 1),
                None => Target::Outside,
            };
        }
        for glob in top().filter(|u| u.leaf.name.is_none()) {
            if let Some(abs) = self.absolute(m, &glob.leaf.segs) {
                let found = self.resolve(&[abs, rest.to_vec()].concat(), depth + 1);
                if matches!(found, Target::Found(_)) {
                    return found;
                }
            }
        }
        Target::Module(m)
    }

    /// Records file `f`'s dependencies: its `use` leaves (a `pub use` only when the file names
    /// the item itself; a module imported under a name only through the paths that use it), and
    /// the paths in its code that start at `crate`, `self`, `super`, a child module or an
    /// imported module.
    fn find_dependencies(&mut self, f: usize) {
        let file = &self.files[f];
        let names_in_code: BTreeSet<&str> = (file.tokens.iter().enumerate())
            .filter(|(i, _)| !file.declarations.contains(i))
            .map(|(_, t)| t.text.as_str())
            .collect();
        // Names used other than as a path's first segment.
        let bare_in_code: BTreeSet<&str> = (file.tokens.iter().enumerate())
            .filter(|(i, _)| !file.declarations.contains(i))
            .filter(|(i, _)| file.tokens.get(i + 1).is_none_or(|t| t.text != "::"))
            .map(|(_, t)| t.text.as_str())
            .collect();
        let mut found = Vec::new();
        for u in &file.uses {
            let Some(abs) = self.absolute(f, &u.leaf.segs) else {
                continue;
            };
            let named = u.leaf.name.as_deref().is_some_and(|n| names_in_code.contains(n));
            let module_import = u.leaf.name.is_some() && self.by_module.contains_key(&abs);
            let path = u.leaf.segs.join("::");
            if module_import && bare_in_code.contains(u.leaf.name.as_deref().unwrap_or_default()) {
                // Also an item of the module above (`use crate::quorum::combine;` then
                // `combine(..)`): a module and a function may share a name.
                let (parent, name) = abs.split_at(abs.len() - 1);
                if let Some(item @ Target::Found(_)) = self.by_module.get(parent).map(|p| self.resolve_in(*p, name, 0))
                {
                    found.push((u.at, path, item));
                }
            } else if (!u.public || named) && !module_import {
                found.push((u.at, path, self.resolve(&abs, 0)));
            }
        }
        let toks: Vec<&str> = file.tokens.iter().map(|t| t.text.as_str()).collect();
        for i in 0..toks.len() {
            let starts = matches!(toks[i], "crate" | "self" | "super")
                || file.children.contains(toks[i])
                || self.aliases[f].contains_key(toks[i]);
            let continues = i > 0 && matches!(toks[i - 1], "::" | ".");
            if !starts || continues || file.declarations.contains(&i) || toks.get(i + 1) != Some(&"::") {
                continue;
            }
            let mut segs = vec![toks[i].to_owned()];
            while toks.get(i + 2 * segs.len() - 1) == Some(&"::")
                && toks.get(i + 2 * segs.len()).is_some_and(|t| is_ident(t))
            {
                segs.push(toks[i + 2 * segs.len()].to_owned());
            }
            if let Some(abs) = self.absolute(f, &segs)
                && !self.by_module.contains_key(&abs)
            {
                found.push((file.tokens[i].at, segs.join("::"), self.resolve(&abs, 0)));
            }
        }
        found.sort_by_key(|(at, _, _)| *at);
        for (at, path, target) in found {
            if let Target::Found(to) | Target::Module(to) = target
                && to != f
            {
                let line = self.files[f].text[..at].matches('\n').count() + 1;
                self.edges.entry((f, to)).or_insert(Evidence { line, path });
            }
        }
    }

    /// Whether file `to` is a module that contains file `from` (`src/quorum/mod.rs` for
    /// `src/quorum/fence.rs`): a module's parts may use what the module itself defines.
    fn is_ancestor(&self, from: usize, to: usize) -> bool {
        let (a, b) = (&self.files[from].module, &self.files[to].module);
        b.len() < a.len() && a.starts_with(b)
    }
}

/// The rows of the `## Layers` table in docs/development.md, bottom layer first: `| layer |
/// files |`, the files as backticked patterns.
fn layers(doc: &str) -> Vec<Layer> {
    let section = format!("\n{doc}");
    let section = section
        .split("\n## ")
        .find(|s| s.starts_with("Layers\n"))
        .expect("docs/development.md has a section \"## Layers\"");
    let rows = section.lines().filter(|l| l.trim_start().starts_with('|')).skip(1);
    let layers: Vec<Layer> = rows
        .filter(|row| !row.chars().all(|c| matches!(c, '|' | '-' | ':' | ' ')))
        .map(|row| {
            let cells: Vec<&str> = row.trim().trim_matches('|').split('|').collect();
            let files = cells
                .get(1)
                .unwrap_or_else(|| panic!("a layer row without files: {row}"));
            Layer {
                name: cells[0].trim().trim_matches('`').to_owned(),
                patterns: files.split('`').skip(1).step_by(2).map(str::to_owned).collect(),
            }
        })
        .collect();
    assert!(
        layers.len() >= 2,
        "docs/development.md's \"Layers\" table has fewer than 2 rows"
    );
    layers
}

/// Whether `path` matches the pattern: `*` within one segment, `**` any number of segments.
fn glob(pattern: &str, path: &str) -> bool {
    fn segments(p: &[&str], s: &[&str]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((&"**", rest)) => (0..=s.len()).any(|k| segments(rest, &s[k..])),
            Some((first, rest)) => {
                !s.is_empty() && within(first.as_bytes(), s[0].as_bytes()) && segments(rest, &s[1..])
            }
        }
    }
    fn within(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => (0..=s.len()).any(|k| within(rest, &s[k..])),
            Some((c, rest)) => s.first() == Some(c) && within(rest, &s[1..]),
        }
    }
    let p: Vec<&str> = pattern.split('/').collect();
    let s: Vec<&str> = path.split('/').collect();
    segments(&p, &s)
}

/// Files that import each other in a circle: the files, and the report naming them and the
/// imports that close the circle.
struct Circle {
    files: BTreeSet<PathBuf>,
    report: String,
}

/// What the checker finds wrong: files placed in no layer or several (and patterns that place
/// nothing), imports of a higher layer, and circles.
struct Findings {
    placement: Vec<String>,
    upward: Vec<String>,
    circles: Vec<Circle>,
}

/// The layer of each checked file (`None` when the table places it in no layer or several),
/// and what is wrong with the placement.
fn placement(tree: &Tree) -> (Vec<Option<usize>>, Vec<String>) {
    let mut wrong = Vec::new();
    let mut used = BTreeSet::new();
    let mut layer_of = Vec::new();
    for file in &tree.files {
        let path = file.path.to_string_lossy().replace('\\', "/");
        let matched: Vec<(usize, &String)> = (tree.layers.iter().enumerate())
            .flat_map(|(l, layer)| layer.patterns.iter().map(move |p| (l, p)))
            .filter(|(_, p)| glob(p, &path))
            .collect();
        used.extend(matched.iter().map(|(_, p)| p.to_string()));
        if file.module.is_empty() {
            layer_of.push(None); // the crate root only declares the modules
            continue;
        }
        let named: Vec<String> = matched
            .iter()
            .map(|(l, p)| format!("`{p}` ({})", tree.layers[*l].name))
            .collect();
        match matched.as_slice() {
            [(l, _)] => layer_of.push(Some(*l)),
            [] => wrong.push(format!("{path}: in no layer of docs/development.md's \"Layers\" table")),
            _ => wrong.push(format!("{path}: matches more than one pattern: {}", named.join(", "))),
        }
        if matched.len() != 1 {
            layer_of.push(None);
        }
    }
    for layer in &tree.layers {
        for p in layer.patterns.iter().filter(|p| !used.contains(*p)) {
            wrong.push(format!("`{p}` (layer \"{}\"): matches no file", layer.name));
        }
    }
    (layer_of, wrong)
}

/// The strongly connected components of more than one node (Tarjan's algorithm, iterative).
fn components(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = adj.len();
    let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut out, mut next) = (Vec::new(), Vec::new(), 0);
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0)];
        (index[root], low[root], next) = (next, next, next + 1);
        stack.push(root);
        on_stack[root] = true;
        while let Some((v, child)) = work.last_mut() {
            let v = *v;
            if let Some(&w) = adj[v].get(*child) {
                *child += 1;
                if index[w] == usize::MAX {
                    (index[w], low[w], next) = (next, next, next + 1);
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some((u, _)) = work.last() {
                low[*u] = low[*u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    out.push(component);
                }
            }
        }
    }
    out.sort();
    out
}

/// Checks `src/` under `root` (with `overrides` in place of some files' text) against the
/// layers of docs/development.md and for circles.
fn check(root: &Path, overrides: &[(PathBuf, String)]) -> Findings {
    findings(&Tree::read(root, overrides))
}

/// What is wrong in a read tree.
fn findings(tree: &Tree) -> Findings {
    let (layer_of, placement) = placement(tree);
    let shown = |f: usize| tree.files[f].path.to_string_lossy().replace('\\', "/");
    let mut upward = Vec::new();
    for (&(from, to), e) in &tree.edges {
        if let (Some(lf), Some(lt)) = (layer_of[from], layer_of[to])
            && lt > lf
        {
            upward.push(format!(
                "{}:{}: uses {} ({}, layer \"{}\") from layer \"{}\"",
                shown(from),
                e.line,
                e.path,
                shown(to),
                tree.layers[lt].name,
                tree.layers[lf].name
            ));
        }
    }
    let mut adj = vec![Vec::new(); tree.files.len()];
    for &(from, to) in tree.edges.keys().filter(|(f, t)| !tree.is_ancestor(*f, *t)) {
        adj[from].push(to);
    }
    let circles = components(&adj)
        .into_iter()
        .map(|component| {
            let names: Vec<String> = component.iter().map(|f| shown(*f)).collect();
            let mut report = format!("a circle of {} files: {}", component.len(), names.join(", "));
            for (&(from, to), e) in &tree.edges {
                if component.contains(&from) && component.contains(&to) && adj[from].contains(&to) {
                    report += &format!("\n    {}:{}: {} -> {}", shown(from), e.line, e.path, shown(to));
                }
            }
            let files = component.iter().map(|f| tree.files[*f].path.clone()).collect();
            Circle { files, report }
        })
        .collect();
    Findings {
        placement,
        upward,
        circles,
    }
}

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn each_file_uses_only_its_own_layer_or_lower_ones_and_no_modules_import_in_a_circle() {
    let found = check(root(), &[]);
    let mut report: Vec<String> = found.placement;
    report.extend(found.upward);
    report.extend(found.circles.into_iter().map(|c| c.report));
    assert!(
        report.is_empty(),
        "{} findings (layers: docs/development.md, \"Layers\"):\n{}",
        report.len(),
        report.join("\n")
    );
}

/// File `f`'s public item that a path `crate::<its module>::<item>` leads to `f` itself.
fn public_item(tree: &Tree, f: usize) -> Option<String> {
    let file = &tree.files[f];
    file.public
        .iter()
        .find(|name| {
            let path = [file.module.clone(), vec![name.to_string()]].concat();
            tree.resolve(&path, 0) == Target::Found(f)
        })
        .cloned()
}

/// `text` with `use crate::<module>::<item>;` added at its end, and the line of that `use`.
fn plant(text: &str, module: &[String], item: &str) -> (String, String, usize) {
    let path = format!("crate::{}::{item}", module.join("::"));
    (format!("{text}\nuse {path};\n"), path, text.matches('\n').count() + 2)
}

#[test]
fn a_planted_import_of_the_top_layer_in_the_bottom_layer_is_reported() {
    let tree = Tree::read(root(), &[]);
    let before = findings(&tree);
    let (layer_of, _) = placement(&tree);
    let top = tree.layers.len() - 1;
    let low = layer_of
        .iter()
        .position(|l| *l == Some(0))
        .expect("a file in the bottom layer");
    let (high, item) = (0..tree.files.len())
        .filter(|f| layer_of[*f] == Some(top) && !tree.edges.contains_key(&(low, *f)))
        .find_map(|f| Some((f, public_item(&tree, f)?)))
        .expect("a public item in a file of the top layer");
    let (low_file, high_file) = (&tree.files[low], &tree.files[high]);
    let (text, path, line) = plant(&low_file.text, &high_file.module, &item);
    println!("planted in {}: use {path};", low_file.path.display());
    let after = check(root(), &[(low_file.path.clone(), text)]);
    let expected = format!(
        "{}:{line}: uses {path} ({}, layer \"{}\") from layer \"{}\"",
        low_file.path.display(),
        high_file.path.display(),
        tree.layers[top].name,
        tree.layers[0].name
    );
    let new: Vec<&String> = after.upward.iter().filter(|v| !before.upward.contains(v)).collect();
    assert_eq!(new, [&expected], "the planted upward import, and only it, is new");
    assert_eq!(after.upward.len(), before.upward.len() + 1);
    assert_eq!(after.placement, before.placement);
}

#[test]
fn a_planted_import_closing_a_circle_is_reported() {
    let tree = Tree::read(root(), &[]);
    let before = findings(&tree);
    let (layer_of, _) = placement(&tree);
    let paths = |a: usize, b: usize| [&tree.files[a].path, &tree.files[b].path];
    let in_a_circle =
        |a: usize, b: usize| (before.circles.iter()).any(|c| paths(a, b).iter().all(|p| c.files.contains(*p)));
    // A file `a` importing `b` in its own layer, neither containing the other, not yet in a
    // circle together: `b` importing `a` closes one.
    let (a, b, item) = (tree.edges.keys())
        .filter(|(a, b)| layer_of[*a].is_some() && layer_of[*a] == layer_of[*b])
        .filter(|(a, b)| !tree.is_ancestor(*a, *b) && !tree.is_ancestor(*b, *a) && !in_a_circle(*a, *b))
        .find_map(|&(a, b)| Some((a, b, public_item(&tree, a)?)))
        .expect("two files of one layer, one importing the other");
    let (text, path, line) = plant(&tree.files[b].text, &tree.files[a].module, &item);
    println!("planted in {}: use {path};", tree.files[b].path.display());
    let after = check(root(), &[(tree.files[b].path.clone(), text)]);
    let closing = format!(
        "{}:{line}: {path} -> {}",
        tree.files[b].path.display(),
        tree.files[a].path.display()
    );
    let circle = after
        .circles
        .iter()
        .find(|c| paths(a, b).iter().all(|p| c.files.contains(*p)));
    let circle = circle.unwrap_or_else(|| panic!("no circle reported with the planted `{closing}`"));
    assert!(circle.report.contains(&closing), "{}\nlacks {closing}", circle.report);
    assert_eq!(after.upward, before.upward, "an import within a layer is no upward one");
}

/// A small crate for the reader's own test: files after `=== path` lines.
const SCRATCH: &str = r###"=== src/lib.rs
pub mod a;
pub mod b;
pub mod low;
=== src/low.rs
//! crate::b::Top in a comment is no import
pub struct Low;
pub fn text() -> &'static str { r##"crate::b::Top"## }
#[cfg(test)]
mod tests {
    use crate::b::Top;
}
#[cfg(test)]
use crate::a::Hidden;
#[macro_export]
macro_rules! shout { () => {} }
=== src/a/mod.rs
mod inner;
#[cfg(test)]
mod tests;
pub use inner::Hidden;
pub struct A;
pub fn make() -> Hidden { crate::shout!(); Hidden }
=== src/a/inner.rs
use super::A;
use crate::{low::{self, Low}};
pub struct Hidden;
fn f<'a>(_: &'a A) -> char { let _ = low::text(); '"' }
=== src/a/tests.rs
use crate::b::Top;
=== src/b.rs
use crate::a::Hidden;
pub struct Top;
fn g() { let _ = crate::low::text(); }
=== docs/development.md
## Layers

| layer | files |
|---|---|
| bottom | `src/low.rs` |
| middle | `src/a/*.rs` |
| top | `src/b.rs`, `src/c/**` |
"###;

#[test]
fn the_reader_follows_re_exports_and_leaves_out_comments_strings_and_tests() {
    let dir = std::env::temp_dir().join(format!("layers-test-{}", std::process::id()));
    for file in SCRATCH.split("=== ").skip(1) {
        let (path, text) = file.split_once('\n').expect("a path line");
        std::fs::create_dir_all(dir.join(path).parent().expect("a parent")).expect("a directory");
        std::fs::write(dir.join(path), text).expect("a written file");
    }
    let tree = Tree::read(&dir, &[]);
    let _ = std::fs::remove_dir_all(&dir);
    let edges: Vec<String> = (tree.edges.keys())
        .map(|(f, t)| format!("{} -> {}", tree.files[*f].path.display(), tree.files[*t].path.display()))
        .collect();
    let inner = ["src/a/inner.rs -> src/a/mod.rs", "src/a/inner.rs -> src/low.rs"];
    let outer = [
        "src/a/mod.rs -> src/a/inner.rs",
        "src/a/mod.rs -> src/low.rs",
        "src/b.rs -> src/a/inner.rs",
        "src/b.rs -> src/low.rs",
    ];
    assert_eq!(edges, [&inner[..], &outer[..]].concat());
    let found = findings(&tree);
    assert_eq!(found.placement, ["`src/c/**` (layer \"top\"): matches no file"]);
    assert!(found.upward.is_empty(), "{:?}", found.upward);
    assert!(
        found.circles.is_empty(),
        "the parts of a module may use what it defines"
    );

    // In the real tree, what is left of each file has no test in it, and its braces pair up
    // (a literal or comment read wrong would show).
    for file in Tree::read(root(), &[]).files {
        let toks: Vec<&str> = file.tokens.iter().map(|t| t.text.as_str()).collect();
        let test = toks.windows(4).position(|w| w == ["#", "[", "test", "]"]);
        assert!(test.is_none(), "{}: a #[test] left in its code", file.path.display());
        let opened = toks.iter().filter(|t| **t == "{").count();
        assert_eq!(
            opened,
            toks.iter().filter(|t| **t == "}").count(),
            "{}: braces",
            file.path.display()
        );
    }

    let toks = tokens("a::{b, c::{self, d as e}, f::*};");
    let toks: Vec<&str> = toks.iter().map(|t| t.text.as_str()).collect();
    let mut leaves = Vec::new();
    use_tree(&toks, &mut 0, Vec::new(), &mut leaves);
    let leaves: Vec<(String, Option<String>)> = leaves.into_iter().map(|l| (l.segs.join("::"), l.name)).collect();
    let leaf = |path: &str, name: Option<&str>| (path.to_owned(), name.map(str::to_owned));
    assert_eq!(
        leaves,
        [
            leaf("a::b", Some("b")),
            leaf("a::c", Some("c")),
            leaf("a::c::d", Some("e")),
            leaf("a::f", None)
        ]
    );
    assert!(glob("src/recipes/*/lua.rs", "src/recipes/mutex/lua.rs"));
    assert!(glob("src/backend/**", "src/backend/cluster/route.rs") && glob("src/**/mod.rs", "src/mod.rs"));
    assert!(!glob("src/quorum/*.rs", "src/quorum/x/y.rs") && !glob("src/clock.rs", "src/clock.rss"));
    let split =
        rust_source::split("let s = br##\"crate::x \"# \"##; /* a /* crate::y */ */ let c = b'\\''; // crate::w\n");
    assert!(
        !split.code.contains("crate") && split.code.contains("let c ="),
        "{}",
        split.code
    );
    assert!(split.comments.contains("a /* crate::y") && split.comments.trim_end().ends_with("crate::w"));
}
