//! `deploy/Containerfile` cannot rot unseen: its build stage (`FROM ... AS builder` up to the
//! next `FROM`) is replayed in a scratch directory with the toolchain at hand, since no
//! container engine here can pull the base image. `WORKDIR`, `ENV`, `ARG` and `COPY` (from the
//! repository root, the build context, honouring `.containerignore` and keeping modification
//! times as `COPY` does) are applied, and each `RUN` is executed as written with `sh -c`, in
//! order. A manifest naming a file the dependency layer lacks, a placeholder build cargo
//! refuses, a binary that does not start: each fails here as it would fail the image build.
//! The runtime stage's `COPY --from=builder` sources must exist afterwards.
//!
//! The container's paths map into the scratch directory (`/src` is `<scratch>/src`). The build
//! output is shared between runs: every `RUN` gets `CARGO_TARGET_DIR=<repo>/target/containerfile-replay`,
//! and the working directory's `target` is a symlink to it, so `./target/release/...` in a
//! `RUN` line finds what cargo built and a rerun rebuilds only the crate itself.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// One instruction of the Containerfile, continuation lines joined.
#[derive(Debug)]
struct Instruction {
    /// 1-based line where the instruction starts.
    line: usize,
    /// The keyword, upper case (`RUN`, `COPY`, ...).
    keyword: String,
    /// Everything after the keyword.
    args: String,
}

/// Splits a Containerfile into instructions as the builders do: a line ending with `\` goes on
/// with the next line (without the backslash and the newline); comment lines (`#` first) and
/// blank lines are dropped, also inside a continued instruction.
fn instructions(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (body, continues) = match raw.trim_end().strip_suffix('\\') {
            Some(body) => (body, true),
            None => (raw, false),
        };
        match &mut current {
            Some((_, joined)) => joined.push_str(body),
            None => current = Some((i + 1, body.trim_start().to_owned())),
        }
        if !continues && let Some((line, joined)) = current.take() {
            let (keyword, args) = joined.split_once(char::is_whitespace).unwrap_or((&joined, ""));
            out.push(Instruction {
                line,
                keyword: keyword.to_ascii_uppercase(),
                args: args.trim().to_owned(),
            });
        }
    }
    assert!(
        current.is_none(),
        "the Containerfile ends inside a continued instruction"
    );
    out
}

/// The instructions of the stage named `name`: after its `FROM ... AS name`, up to the next `FROM`.
fn stage<'a>(all: &'a [Instruction], name: &str) -> &'a [Instruction] {
    let names = |i: &Instruction| {
        let words: Vec<&str> = i.args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
        i.keyword == "FROM" && words.len() == 3 && words[1].eq_ignore_ascii_case("as") && words[2] == name
    };
    let start = all
        .iter()
        .position(names)
        .unwrap_or_else(|| panic!("no `FROM ... AS {name}` stage in the Containerfile"));
    let end = all[start + 1..]
        .iter()
        .position(|i| i.keyword == "FROM")
        .map_or(all.len(), |n| start + 1 + n);
    &all[start + 1..end]
}

/// The scratch directory, removed (with the `target` symlinks in it, not what they point to)
/// however the test ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The build context's exclusions (`.containerignore`, else `.dockerignore`): plain paths only;
/// a pattern this replay cannot read fails the test rather than copying too much.
fn ignored_paths(context: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(context.join(".containerignore"))
        .or_else(|_| std::fs::read_to_string(context.join(".dockerignore")))
        .unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            assert!(
                !l.contains(['*', '?', '[', '!']),
                "the replay reads only plain paths in .containerignore, not {l:?}: teach tests/containerfile.rs"
            );
            PathBuf::from(l.trim_matches('/'))
        })
        .collect()
}

/// A path inside the build context, refusing to leave it.
fn context_path(source: &str) -> PathBuf {
    let path = Path::new(source);
    assert!(
        path.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir)),
        "COPY source {source:?} leaves the build context"
    );
    assert!(
        !source.contains(['*', '?', '[']),
        "COPY source {source:?}: the replay does not expand wildcards; teach tests/containerfile.rs"
    );
    path.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect()
}

/// Copies `from` (a file) to `to`, keeping its permissions and modification time as `COPY` does.
fn copy_file(from: &Path, to: &Path) {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).expect("create the destination directory");
    }
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    let modified = std::fs::metadata(from)
        .and_then(|m| m.modified())
        .expect("source mtime");
    std::fs::File::options()
        .write(true)
        .open(to)
        .and_then(|f| f.set_modified(modified))
        .expect("keep the modification time");
}

/// Copies the directory `from` (relative path `rel` in the context) into `to`, skipping ignored paths.
fn copy_dir(context: &Path, rel: &Path, to: &Path, ignored: &[PathBuf]) {
    std::fs::create_dir_all(to).expect("create the destination directory");
    let mut entries: Vec<_> = std::fs::read_dir(context.join(rel))
        .expect("read a COPY source directory")
        .map(|e| e.expect("directory entry"))
        .collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let rel = rel.join(entry.file_name());
        if ignored.iter().any(|i| rel.starts_with(i)) {
            continue;
        }
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(context, &rel, &target, ignored);
        } else {
            copy_file(&entry.path(), &target);
        }
    }
}

/// The replay's state: the build context, the scratch root (the container's `/`), the
/// working directory and environment so far.
struct Replay {
    context: PathBuf,
    root: PathBuf,
    workdir: PathBuf,
    env: BTreeMap<String, String>,
    shared_target: PathBuf,
    ignored: Vec<PathBuf>,
}

impl Replay {
    /// A container path in the scratch root: absolute from the root, relative from the workdir.
    fn container_path(&self, path: &str) -> PathBuf {
        match path.strip_prefix('/') {
            Some(rest) => self.root.join(rest),
            None => self.workdir.join(path),
        }
    }

    fn apply(&mut self, i: &Instruction) {
        let at = format!("Containerfile line {} ({} {})", i.line, i.keyword, i.args);
        match i.keyword.as_str() {
            "WORKDIR" => {
                self.workdir = self.container_path(&i.args);
                std::fs::create_dir_all(&self.workdir).expect("create the WORKDIR");
            }
            "ENV" | "ARG" => {
                assert!(
                    !i.args.contains(['"', '\'', '$', '\\']),
                    "{at}: the replay reads only plain `NAME=value` words; teach tests/containerfile.rs"
                );
                let words: Vec<&str> = i.args.split_whitespace().collect();
                match words.as_slice() {
                    // `ARG NAME` without a default sets nothing.
                    [name] if i.keyword == "ARG" && !name.contains('=') => {}
                    // The legacy `ENV NAME value with spaces`.
                    [name, rest @ ..] if i.keyword == "ENV" && !name.contains('=') => {
                        self.env.insert((*name).to_owned(), rest.join(" "));
                    }
                    pairs => {
                        for pair in pairs {
                            let (name, value) = pair
                                .split_once('=')
                                .unwrap_or_else(|| panic!("{at}: {pair:?} is not NAME=value"));
                            self.env.insert(name.to_owned(), value.to_owned());
                        }
                    }
                }
            }
            "COPY" => self.copy(i, &at),
            "RUN" => self.run(i, &at),
            "LABEL" | "EXPOSE" | "USER" | "STOPSIGNAL" | "ENTRYPOINT" | "CMD" | "HEALTHCHECK" | "VOLUME" => {}
            other => panic!("{at}: the replay does not know {other}; teach tests/containerfile.rs"),
        }
    }

    fn copy(&self, i: &Instruction, at: &str) {
        assert!(
            !i.args.starts_with('['),
            "{at}: the replay reads COPY's shell form only"
        );
        let mut words: Vec<&str> = i.args.split_whitespace().collect();
        words.retain(|w| {
            assert!(
                !w.starts_with("--from"),
                "{at}: COPY --from in the build stage is not replayed"
            );
            !w.starts_with("--")
        });
        let (dest, sources) = words
            .split_last()
            .unwrap_or_else(|| panic!("{at}: COPY without a destination"));
        assert!(!sources.is_empty(), "{at}: COPY without a source");
        let into_dir = dest.ends_with('/') || sources.len() > 1;
        let dest_path = self.container_path(dest);
        for source in sources {
            let rel = context_path(source);
            let from = self.context.join(&rel);
            let meta = std::fs::metadata(&from).unwrap_or_else(|e| panic!("{at}: {}: {e}", from.display()));
            if meta.is_dir() {
                copy_dir(&self.context, &rel, &dest_path, &self.ignored);
            } else if into_dir || dest_path.is_dir() {
                let name = from.file_name().expect("a file name");
                copy_file(&from, &dest_path.join(name));
            } else {
                copy_file(&from, &dest_path);
            }
        }
    }

    fn run(&self, i: &Instruction, at: &str) {
        assert!(
            !i.args.starts_with('[') && !i.args.starts_with("--") && !i.args.contains("<<"),
            "{at}: the replay runs RUN's plain shell form only; teach tests/containerfile.rs"
        );
        // The build output is shared between runs: cargo writes there, and `./target` in the
        // working directory leads there too.
        let link = self.workdir.join("target");
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(&self.shared_target, &link).expect("link ./target to the shared build output");
        }
        let started = Instant::now();
        let mut command = Command::new("sh");
        // What `cargo test` tells this test about the repository's package is not the build's
        // business (and build scripts that watch CARGO_MANIFEST_DIR would rebuild on it).
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if [
                "CARGO_MANIFEST_",
                "CARGO_PKG_",
                "CARGO_BIN_EXE_",
                "CARGO_CRATE_",
                "CARGO_TARGET_TMPDIR",
            ]
            .iter()
            .any(|p| name.starts_with(p))
            {
                command.env_remove(name.as_ref());
            }
        }
        let out = command
            .arg("-c")
            .arg(&i.args)
            .current_dir(&self.workdir)
            .envs(&self.env)
            .env("CARGO_TARGET_DIR", &self.shared_target)
            .output()
            .unwrap_or_else(|e| panic!("{at}: cannot start sh: {e}"));
        let tail = |bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        assert!(
            out.status.success(),
            "{at} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            tail(&out.stdout),
            tail(&out.stderr)
        );
        eprintln!("{at}: ok in {:.1} s", started.elapsed().as_secs_f64());
    }
}

#[test]
fn containerfile_build_stage_replays_with_the_local_toolchain() {
    let context = PathBuf::from(REPO);
    let text = std::fs::read_to_string(context.join("deploy/Containerfile")).expect("read deploy/Containerfile");
    let all = instructions(&text);
    let builder = stage(&all, "builder");
    assert!(
        builder.iter().any(|i| i.keyword == "RUN") && builder.iter().any(|i| i.keyword == "COPY"),
        "the build stage copies and runs nothing: {builder:?}"
    );

    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let scratch = Scratch(std::env::temp_dir().join(format!("redlock-containerfile-{}-{nanos}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).expect("create the scratch directory");
    let shared_target = context.join("target").join("containerfile-replay");
    std::fs::create_dir_all(&shared_target).expect("create the shared build output directory");

    let mut replay = Replay {
        ignored: ignored_paths(&context),
        context,
        root: scratch.0.clone(),
        // The base image sets no WORKDIR: `/` until the stage names one.
        workdir: scratch.0.clone(),
        env: BTreeMap::new(),
        shared_target,
    };
    for instruction in builder {
        replay.apply(instruction);
    }

    // What the later stages take from the build stage exists.
    let mut taken = 0;
    for i in all
        .iter()
        .filter(|i| i.keyword == "COPY" && i.args.contains("--from=builder"))
    {
        let words: Vec<&str> = i.args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
        let (_, sources) = words.split_last().expect("COPY --from=builder with a destination");
        for source in sources {
            let path = replay.container_path(source);
            assert!(
                path.exists(),
                "Containerfile line {}: the build stage left no {source}",
                i.line
            );
            taken += 1;
        }
    }
    assert!(taken > 0, "no stage takes anything from the build stage");
}
