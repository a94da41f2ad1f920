//! The deployment files agree with each other (files only, no build, no process):
//!
//! - the systemd unit's install comment installs `deploy/config.production.toml` as the config,
//!   never the repository's `config.toml` (five embedded masters, for trying the proxy out);
//! - the unit's `ExecStartPre` and `ExecStart` run the binary where the Debian package
//!   (`[package.metadata.deb]` in Cargo.toml) installs it, with `--config` where the package
//!   installs the config, and the package installs this unit.
//!
//! `deploy/package-check.sh` builds the package and runs what it installs.

use std::path::Path;

const UNIT: &str = "deploy/redlock-proxy.service";
const BINARY_SOURCE: &str = "target/release/redlock-proxy";
const CONFIG_SOURCE: &str = "deploy/config.production.toml";

/// A repository file, by its path from the root.
fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Cargo.toml's `[package.metadata.deb]`.
fn deb_metadata() -> toml::Table {
    let manifest: toml::Table = read("Cargo.toml").parse().expect("Cargo.toml is TOML");
    manifest
        .get("package")
        .and_then(|p| p.get("metadata"))
        .and_then(|m| m.get("deb"))
        .and_then(toml::Value::as_table)
        .cloned()
        .expect("Cargo.toml has [package.metadata.deb]")
}

/// Where the package installs the asset whose source is `source`, as an absolute path. An
/// asset is `[source, dest, mode]` or `{ source, dest, mode }`; a `dest` ending in `/` is a
/// directory, the file keeping its name (cargo-deb's rules).
fn installed_path(deb: &toml::Table, source: &str) -> String {
    let assets = deb
        .get("assets")
        .and_then(toml::Value::as_array)
        .expect("[package.metadata.deb] lists its assets");
    let dests: Vec<&str> = assets
        .iter()
        .filter_map(|asset| {
            let (src, dest) = match asset {
                toml::Value::Array(a) => (a.first()?.as_str()?, a.get(1)?.as_str()?),
                toml::Value::Table(t) => (t.get("source")?.as_str()?, t.get("dest")?.as_str()?),
                _ => return None,
            };
            (src == source).then_some(dest)
        })
        .collect();
    let [dest] = dests[..] else {
        panic!("[package.metadata.deb] assets: expected one asset from {source}, found {dests:?}");
    };
    let name = Path::new(source)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a file name");
    let dest = dest.trim_start_matches('/');
    if dest.ends_with('/') {
        format!("/{dest}{name}")
    } else {
        format!("/{dest}")
    }
}

/// The unit's comment lines before its first section, without the `#`.
fn install_comment(unit: &str) -> Vec<&str> {
    unit.lines()
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.strip_prefix('#'))
        .map(str::trim)
        .collect()
}

/// The words of the unit's `key=` line (one line, no quoting: what the unit uses).
fn exec_words<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect();
    let [line] = lines[..] else {
        panic!("{UNIT}: expected one {key}= line, found {}", lines.len());
    };
    line.split_whitespace().collect()
}

/// The value after `--config` in `words`.
fn config_flag<'a>(words: &[&'a str]) -> Option<&'a str> {
    words.windows(2).find(|w| w[0] == "--config").map(|w| w[1])
}

#[test]
fn the_unit_install_comment_installs_the_production_config() {
    let unit = read(UNIT);
    let comment = install_comment(&unit);
    assert!(!comment.is_empty(), "{UNIT} has no install comment");
    // Each command of the comment that writes the config (`install ... SRC DEST`, `cp SRC DEST`),
    // by its source.
    let mut sources = Vec::new();
    for line in &comment {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (Some(&command), Some(&dest)) = (words.first(), words.last()) else {
            continue;
        };
        if matches!(command, "install" | "cp") && dest.ends_with("config.toml") && words.len() >= 3 {
            sources.push((words[words.len() - 2], *line));
        }
        // Also `envsubst ... < SRC > DEST` and the like: no word may name the repository's config.
        assert!(
            !words.iter().any(|w| matches!(*w, "config.toml" | "./config.toml")),
            "{UNIT}'s install comment names the repository's config.toml (embedded masters, for trying \
             it out only): `{line}`"
        );
    }
    assert!(
        !sources.is_empty(),
        "{UNIT}'s install comment installs no config:\n{}",
        comment.join("\n")
    );
    for (source, line) in sources {
        assert_eq!(
            source, CONFIG_SOURCE,
            "{UNIT}'s install comment installs {source} as the config, not {CONFIG_SOURCE}: `{line}`"
        );
    }
}

#[test]
fn the_unit_runs_the_binary_and_reads_the_config_where_the_package_installs_them() {
    let unit = read(UNIT);
    let deb = deb_metadata();
    let binary = installed_path(&deb, BINARY_SOURCE);
    let config = installed_path(&deb, CONFIG_SOURCE);
    assert!(
        config.starts_with("/etc/"),
        "the package installs the config at {config}, outside /etc: it would not be a conffile"
    );
    for key in ["ExecStartPre", "ExecStart"] {
        let words = exec_words(&unit, key);
        assert_eq!(
            words.first().copied(),
            Some(binary.as_str()),
            "{UNIT}: {key} runs {:?}, the package installs the binary at {binary}",
            words.first()
        );
        assert_eq!(
            config_flag(&words),
            Some(config.as_str()),
            "{UNIT}: {key} reads --config {:?}, the package installs the config at {config}",
            config_flag(&words)
        );
    }
    // The unit's install comment puts them at the same places.
    let comment = install_comment(&unit);
    assert!(
        comment
            .iter()
            .any(|l| l.contains(CONFIG_SOURCE) && l.ends_with(config.as_str())),
        "{UNIT}'s install comment does not install {CONFIG_SOURCE} at {config}"
    );
    assert!(
        comment
            .iter()
            .any(|l| l.starts_with("install ") && l.ends_with(binary.as_str())),
        "{UNIT}'s install comment does not install the binary at {binary}"
    );

    // The package installs this unit (cargo-deb's systemd-units takes <package>.service from
    // its unit-scripts directory).
    let units = deb
        .get("systemd-units")
        .and_then(toml::Value::as_table)
        .expect("[package.metadata.deb] has systemd-units");
    let dir = units
        .get("unit-scripts")
        .and_then(toml::Value::as_str)
        .expect("systemd-units names its unit-scripts directory");
    assert_eq!(
        Path::new(dir).join("redlock-proxy.service"),
        Path::new(UNIT),
        "the package's systemd unit is not {UNIT}"
    );
}
