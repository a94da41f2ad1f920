//! `config.toml`: the schema, its defaults, and validation with errors that name the field.
//!
//! Every option is documented in the shipped `config.toml`; keep the two in step.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::health::QuarantineMode;
use crate::backend::redis::mask_url;
use crate::error::StartError;

/// A named user.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct User {
    /// The name given to `AUTH`.
    pub name: String,
    /// The password, in clear (or `${ENV_VAR}`).
    pub password: Option<String>,
    /// The password's SHA-256, hex: the password itself need not be stored.
    pub password_sha256: Option<String>,
    /// Glob patterns of the keys the user may touch (`lock:billing:*`); all when omitted.
    #[serde(default = "all_keys")]
    pub keys: Vec<String>,
    /// Whether the user may run `PROXY` commands and `SCRIPT FLUSH`.
    #[serde(default)]
    pub admin: bool,
}

/// python-redis-lock's signal lists (`lock-signal:<name>`).
fn default_signal_lists() -> Vec<String> {
    vec!["lock-signal:*".to_owned()]
}

fn all_keys() -> Vec<String> {
    vec!["*".to_owned()]
}

/// Which scripts clients may run.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ScriptPolicy {
    /// Any script.
    #[default]
    Any,
    /// Only the scripts named in `script_allowlist` or loaded from `script_files`.
    Allowlist,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The proxy's configuration, as read from `config.toml` and overridden by flags.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the proxy listens on for Redis clients.
    pub listen: String,
    /// Address for TLS clients (none when unset); needs `tls_cert_file` and `tls_key_file`.
    pub tls_listen: Option<String>,
    /// The proxy's certificate chain (PEM) for `tls_listen`.
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// The proxy's private key (PEM) for `tls_listen`.
    pub tls_key_file: Option<std::path::PathBuf>,
    /// CA certificates (PEM) that `rediss://` masters are verified against.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Redis master URLs (`redis://[user:pass@]host:port[/db]`). Empty: run embedded masters.
    pub backends: Vec<String>,
    /// How many in-process masters to run when `backends` is empty.
    pub embedded_backends: usize,
    /// Per-backend, per-request timeout (rule 3: far below any TTL).
    pub backend_timeout_ms: u64,
    /// Timeout for opening a connection to a backend.
    pub connect_timeout_ms: u64,
    /// Clock drift allowance as a fraction of the TTL (rule 4); 2 ms are always added.
    pub drift_factor: f64,
    /// TTL written for locks taken without one (`SET k v NX`): they are session locks, kept
    /// alive while their connection is open; this is the fallback should the proxy die.
    pub default_ttl_ms: u64,
    /// Largest TTL a client may ask for.
    pub max_ttl_ms: u64,
    /// TTL given to keys written without one (`SETNX`, `GETSET`, plain `SET`): the safety
    /// net that keeps a crashed legacy client from holding a lock forever.
    pub legacy_ttl_ms: u64,
    /// When to quarantine a restarted master (rule 8).
    pub quarantine: QuarantineMode,
    /// How often each master is probed (`INFO server`), in ms.
    pub probe_interval_ms: u64,
    /// Password clients must give with `AUTH` (none when unset).
    pub requirepass: Option<String>,
    /// Named users (`AUTH user password`), each limited to key patterns.
    pub users: Vec<User>,
    /// Which scripts clients may run: `any`, or only those in `script_allowlist`/`script_files`.
    pub script_policy: ScriptPolicy,
    /// SHA1s of the scripts allowed under `script_policy = "allowlist"`.
    pub script_allowlist: Vec<String>,
    /// Lua files allowed under `script_policy = "allowlist"` (loaded at start).
    pub script_files: Vec<std::path::PathBuf>,
    /// Number of logical databases clients may `SELECT`.
    pub databases: u32,
    /// Largest bulk string a client may send, in bytes.
    pub proto_max_bulk_len: usize,
    /// Largest number of arguments in one command.
    pub max_args: usize,
    /// Largest key a lock command may name, in bytes (each master stores a copy).
    pub max_key_len: usize,
    /// Largest value (token) a lock command may write, in bytes.
    pub max_value_len: usize,
    /// Commands of one connection in flight at once; past this the proxy stops reading from
    /// that client until replies went out (backpressure).
    pub max_pipeline: usize,
    /// Most clients connected at once; more get `-ERR max number of clients reached`.
    pub maxclients: usize,
    /// Close a client idle for this many seconds (0: never), like Redis's `timeout`.
    pub timeout: u64,
    /// TCP keepalive probes on client connections every this many seconds (0: off), like
    /// Redis's `tcp-keepalive`: a client host that vanishes without closing its socket is
    /// noticed, and its session locks released.
    pub tcp_keepalive: u64,
    /// Longest a session lock is kept alive, in ms (a hung but connected client cannot
    /// hold a lock for ever).
    pub max_hold_ms: u64,
    /// Most session locks one connection may hold (pending acquisitions count).
    pub max_session_locks_per_client: usize,
    /// Most session locks one user may hold through this proxy (all connections of the
    /// default user count as one user).
    pub max_session_locks_per_user: usize,
    /// Most session locks this proxy keeps alive, all clients together.
    pub max_session_locks: usize,
    /// Shortest TTL a session lock may have, in ms: each is extended at a third of its TTL on
    /// every master, so this bounds the keepalive load one lock puts on them.
    pub min_keepalive_ttl_ms: u64,
    /// Most requests waiting for one lock in this proxy (`LOCK.ACQUIRE ... WAIT`).
    pub max_waiters_per_key: usize,
    /// Most requests waiting for locks in this proxy, all keys together.
    pub max_waiters: usize,
    /// Glob patterns of the lists `BLPOP` may wait on: lock libraries' signal lists, which the
    /// proxy serves as a wake-up only. Lists are not served through a majority (an element
    /// popped on some masters and not others is lost or returned twice), so `BLPOP` on any
    /// other key is refused.
    pub signal_lists: Vec<String>,
    /// Threads serving clients and masters. 1 (the default): one event loop, as Redis and
    /// twemproxy run, which on a shared machine beats a work-stealing pool (BENCHMARKS.md);
    /// more: a multi-threaded runtime, for machines where one core is not enough.
    pub threads: usize,
    /// Log filter (`error`, `warn`, `info`, `debug`, `trace`, or a tracing directive).
    pub log_level: String,
    /// Log format: `text` or `json`.
    pub log_format: LogFormat,
    /// Address of the HTTP listener serving Prometheus's `/metrics` and the status page (none
    /// when unset).
    pub metrics_listen: Option<String>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen: "127.0.0.1:7379".to_owned(),
            tls_listen: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            backends: Vec::new(),
            embedded_backends: 5,
            backend_timeout_ms: 50,
            connect_timeout_ms: 250,
            drift_factor: 0.01,
            default_ttl_ms: 30_000,
            max_ttl_ms: 300_000,
            legacy_ttl_ms: 60_000,
            quarantine: QuarantineMode::Always,
            probe_interval_ms: 100,
            requirepass: None,
            users: Vec::new(),
            script_policy: ScriptPolicy::Any,
            script_allowlist: Vec::new(),
            script_files: Vec::new(),
            databases: 16,
            proto_max_bulk_len: 512 * 1024 * 1024,
            max_args: 1024 * 1024,
            max_key_len: 4096,
            max_value_len: 4096,
            max_pipeline: 256,
            maxclients: 10_000,
            timeout: 0,
            tcp_keepalive: 300,
            max_hold_ms: 3_600_000,
            max_session_locks_per_client: 100,
            max_session_locks_per_user: 1_000,
            max_session_locks: 10_000,
            min_keepalive_ttl_ms: 1_000,
            max_waiters_per_key: 1_000,
            max_waiters: 10_000,
            signal_lists: default_signal_lists(),
            threads: 1,
            log_level: "info".to_owned(),
            log_format: LogFormat::Text,
            metrics_listen: None,
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, StartError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| StartError::Config(format!("cannot read {}: {e}", path.display())))?;
        Config::parse(&text)
    }

    /// Replaces `${NAME}` in backend URLs and passwords with environment variables, so that
    /// secrets need not be written in `config.toml`. An unset variable is an error naming the
    /// field.
    pub fn resolve_env(&mut self) -> Result<(), StartError> {
        let env = |name: &str| std::env::var(name).ok();
        for url in &mut self.backends {
            *url = expand(url, "backends", env)?;
        }
        if let Some(pass) = &mut self.requirepass {
            *pass = expand(pass, "requirepass", env)?;
        }
        for user in &mut self.users {
            if let Some(pass) = &mut user.password {
                *pass = expand(pass, &format!("users.{}.password", user.name), env)?;
            }
        }
        Ok(())
    }

    /// Parses config text (without validating it; see [`Config::validate`]).
    pub fn parse(text: &str) -> Result<Config, StartError> {
        toml::from_str(text).map_err(|e| StartError::Config(describe_toml_error(text, &e)))
    }

    /// Checks values that parse but make no sense; the error names the field.
    pub fn validate(&self) -> Result<(), StartError> {
        let bad = |field: &str, why: String| Err(StartError::Config(format!("{field}: {why}")));
        if self.listen.parse::<SocketAddr>().is_err() {
            return bad("listen", format!("'{}' is not an ip:port address", self.listen));
        }
        if let Some(addr) = &self.tls_listen {
            if addr.parse::<SocketAddr>().is_err() {
                return bad("tls_listen", format!("'{addr}' is not an ip:port address"));
            }
            if self.tls_cert_file.is_none() || self.tls_key_file.is_none() {
                return bad("tls_listen", "needs tls_cert_file and tls_key_file".into());
            }
        }
        if self.tls_ca_file.is_none() && self.backends.iter().any(|u| u.starts_with("rediss")) {
            return bad(
                "tls_ca_file",
                "rediss:// backends need the CA to verify them against".into(),
            );
        }
        if let Some(addr) = &self.metrics_listen
            && addr.parse::<SocketAddr>().is_err()
        {
            return bad("metrics_listen", format!("'{addr}' is not an ip:port address"));
        }
        for url in &self.backends {
            if let Err(e) = crate::backend::redis::check_url(url) {
                return bad("backends", format!("'{}' is not a Redis URL: {e}", mask_url(url)));
            }
        }
        // Rule 15: one server must never be two quorum members.
        if let Some((first, second, server)) = crate::backend::identity::conflicts(&self.backends) {
            return bad(
                "backends",
                format!(
                    "'{}' and '{}' name the same Redis server ({server}), whatever the database: one server \
                     would vote twice and could form a majority alone; list each master once",
                    mask_url(&self.backends[first]),
                    mask_url(&self.backends[second])
                ),
            );
        }
        if self.backends.is_empty() && self.embedded_backends == 0 {
            return bad(
                "embedded_backends",
                "must be at least 1 when no backends are configured".into(),
            );
        }
        if self.max_hold_ms == 0 {
            return bad("max_hold_ms", "must be greater than 0".into());
        }
        if self.backend_timeout_ms == 0 {
            return bad("backend_timeout_ms", "must be greater than 0".into());
        }
        if self.probe_interval_ms == 0 {
            return bad("probe_interval_ms", "must be greater than 0".into());
        }
        if self.connect_timeout_ms == 0 {
            return bad("connect_timeout_ms", "must be greater than 0".into());
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return bad("drift_factor", format!("{} is outside [0, 0.5)", self.drift_factor));
        }
        if self.max_ttl_ms == 0 {
            return bad("max_ttl_ms", "must be greater than 0".into());
        }
        for (field, ttl) in [
            ("default_ttl_ms", self.default_ttl_ms),
            ("legacy_ttl_ms", self.legacy_ttl_ms),
        ] {
            if ttl == 0 || ttl > self.max_ttl_ms {
                return bad(field, format!("{ttl} must be in 1..=max_ttl_ms ({})", self.max_ttl_ms));
            }
        }
        if self.min_keepalive_ttl_ms == 0 || self.min_keepalive_ttl_ms > self.default_ttl_ms {
            return bad(
                "min_keepalive_ttl_ms",
                format!(
                    "{} must be in 1..=default_ttl_ms ({}): locks without a TTL are session locks with default_ttl_ms",
                    self.min_keepalive_ttl_ms, self.default_ttl_ms
                ),
            );
        }
        if self.databases == 0 {
            return bad("databases", "must be at least 1".into());
        }
        for (field, value) in [
            ("max_key_len", self.max_key_len),
            ("max_value_len", self.max_value_len),
            ("max_pipeline", self.max_pipeline),
            ("maxclients", self.maxclients),
            ("proto_max_bulk_len", self.proto_max_bulk_len),
            ("max_args", self.max_args),
            ("threads", self.threads),
            ("max_session_locks_per_client", self.max_session_locks_per_client),
            ("max_session_locks_per_user", self.max_session_locks_per_user),
            ("max_session_locks", self.max_session_locks),
        ] {
            if value == 0 {
                return bad(field, "must be greater than 0".into());
            }
        }
        if let Some(pattern) = self.signal_lists.iter().find(|p| p.is_empty() || *p == "*") {
            return bad(
                "signal_lists",
                format!(
                    "'{pattern}' is not a signal-list pattern: name the lock library's signal lists (\"lock-signal:*\"); \
                     lists are not served through a majority"
                ),
            );
        }
        self.validate_users()?;
        if self.script_policy == ScriptPolicy::Allowlist
            && self.script_allowlist.is_empty()
            && self.script_files.is_empty()
        {
            return bad(
                "script_allowlist",
                "script_policy = \"allowlist\" needs script_allowlist or script_files".into(),
            );
        }
        if let Some(sha) = self
            .script_allowlist
            .iter()
            .find(|s| s.len() != 40 || !s.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return bad("script_allowlist", format!("'{sha}' is not a SHA1 (40 hex digits)"));
        }
        Ok(())
    }

    fn validate_users(&self) -> Result<(), StartError> {
        let mut seen = std::collections::HashSet::new();
        for user in &self.users {
            let field = format!("users.{}", user.name);
            let bad = |why: &str| Err(StartError::Config(format!("{field}: {why}")));
            if user.name.is_empty() || user.name == "default" || user.name.contains(char::is_whitespace) {
                return bad("a name, not empty, without spaces, and not 'default' (that one is requirepass)");
            }
            if !seen.insert(&user.name) {
                return bad("defined twice");
            }
            match (&user.password, &user.password_sha256) {
                (Some(_), None) => {}
                (None, Some(h)) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {}
                (None, Some(_)) => return bad("password_sha256 must be 64 hex digits"),
                _ => return bad("give exactly one of password and password_sha256"),
            }
            if user.keys.is_empty() {
                return bad("keys: at least one pattern (\"*\" for all)");
            }
        }
        Ok(())
    }

    /// The configuration with its secrets masked, for `--check-config`, `PROXY CONFIG` and logs.
    pub fn masked(&self) -> Config {
        Config {
            backends: self.backends.iter().map(|u| mask_url(u)).collect(),
            requirepass: self.requirepass.as_ref().map(|_| "***".to_owned()),
            users: self
                .users
                .iter()
                .map(|u| User {
                    password: u.password.as_ref().map(|_| "***".to_owned()),
                    ..u.clone()
                })
                .collect(),
            ..self.clone()
        }
    }

    /// The masked configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(&self.masked()).unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }

    /// What the session lock bounds allow at most, for `--check-config`: how many are kept
    /// alive, and the keepalive load they can put on each master (each lock is extended at a
    /// third of its TTL, at least `min_keepalive_ttl_ms`).
    pub fn session_bounds(&self) -> String {
        let per_lock = 3000.0 / self.min_keepalive_ttl_ms as f64;
        format!(
            "session locks: at most {} per connection, {} per user, {} in all; their keepalives at most {:.0} requests/s per master ({:.0} for one connection's)",
            self.max_session_locks_per_client,
            self.max_session_locks_per_user,
            self.max_session_locks,
            per_lock * self.max_session_locks as f64,
            per_lock * self.max_session_locks_per_client as f64,
        )
    }

    /// Settings that are valid but probably not what the operator wants.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let n = self.backend_count();
        if n.is_multiple_of(2) {
            warnings.push(format!(
                "backends: {n} masters need a quorum of {}, tolerating {} failures like {} masters would: use an odd number",
                n / 2 + 1,
                (n - 1) / 2,
                n - 1
            ));
        }
        let shortest_ttl = self.default_ttl_ms.min(self.legacy_ttl_ms);
        if self.backend_timeout_ms * 10 > shortest_ttl {
            warnings.push(format!(
                "backend_timeout_ms: {} ms is not far below the shortest TTL ({shortest_ttl} ms): one slow master can \
                 eat the validity time; keep it under a tenth of the TTLs",
                self.backend_timeout_ms
            ));
        }
        // The validity a lock of `ttl` keeps when a master takes the whole timeout:
        // ttl - timeout - (ttl * drift_factor + 2 ms).
        let usable = |ttl: f64| ttl - self.backend_timeout_ms as f64 - (ttl * self.drift_factor + 2.0);
        if self.drift_factor > 0.1 || usable(shortest_ttl as f64) <= shortest_ttl as f64 / 2.0 {
            warnings.push(format!(
                "drift_factor: {} leaves a {shortest_ttl} ms lock {:.0} ms of validity after a slow master; short \
                 TTLs become unusable (keep drift_factor near 0.01)",
                self.drift_factor,
                usable(shortest_ttl as f64).max(0.0)
            ));
        }
        let confined: Vec<&str> = self
            .users
            .iter()
            .filter(|u| !u.keys.iter().any(|k| k == "*"))
            .map(|u| u.name.as_str())
            .collect();
        if self.script_policy == ScriptPolicy::Any && !confined.is_empty() {
            warnings.push(format!(
                "script_policy: \"any\" lets {} run any script, and a script can touch keys it never declares: \
                 key patterns do not confine scripts (use \"allowlist\")",
                confined.join(", ")
            ));
        }
        warnings
    }

    /// How many masters the proxy fans out to.
    pub fn backend_count(&self) -> usize {
        if self.backends.is_empty() {
            self.embedded_backends
        } else {
            self.backends.len()
        }
    }

    /// [`Config::backend_timeout_ms`] as a duration.
    pub fn backend_timeout(&self) -> Duration {
        Duration::from_millis(self.backend_timeout_ms)
    }

    /// [`Config::connect_timeout_ms`] as a duration.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

/// Replaces each `${NAME}` in `text` by `env(NAME)`.
fn expand(text: &str, field: &str, env: impl Fn(&str) -> Option<String>) -> Result<String, StartError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start + 2..].find('}') else { break };
        let name = &rest[start + 2..start + 2 + len];
        let value =
            env(name).ok_or_else(|| StartError::Config(format!("{field}: environment variable {name} is not set")))?;
        out.push_str(&rest[..start]);
        out.push_str(&value);
        rest = &rest[start + 3 + len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Turns a TOML error into one line that names the line and the field.
fn describe_toml_error(text: &str, err: &toml::de::Error) -> String {
    let message = err.message().replace('\n', " ");
    let Some(span) = err.span() else {
        return message;
    };
    let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("");
    match line.split_once('=') {
        Some((field, _)) => format!("line {line_no}, field '{}': {message}", field.trim()),
        None => format!("line {line_no}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        match Config::parse(text).and_then(|c| c.validate()) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("accepted: {text}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.listen, "127.0.0.1:7379");
        assert_eq!(c.backend_count(), 5);
    }

    #[test]
    fn shipped_config_is_valid() {
        let c = Config::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml"))).unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        assert!(error_of("backend_timeout_ms = \"fast\"").contains("backend_timeout_ms"));
        assert!(error_of("no_such_option = 1").contains("no_such_option"));
        assert!(error_of("drift_factor = 0.9").starts_with("invalid configuration: drift_factor"));
        assert!(error_of("listen = \"nowhere\"").contains("listen"));
        assert!(error_of("backends = [\"http://x\"]").contains("backends"));
        assert!(error_of("default_ttl_ms = 900000").contains("default_ttl_ms"));
        assert!(error_of("legacy_ttl_ms = 0").contains("legacy_ttl_ms"));
        assert!(error_of("threads = 0").contains("threads"));
        assert!(error_of("signal_lists = [\"*\"]").contains("signal_lists"));
        assert!(error_of("signal_lists = [\"\"]").contains("signal_lists"));
    }

    #[test]
    fn one_server_is_never_two_members() {
        let members = |list: &str| error_of(&format!("backends = [{list}]"));
        let e = members(r#""redis://:secret@h:6379/0", "redis://h:6379/1", "redis://h2:6379/0""#);
        assert!(
            e.contains("backends: 'redis://:***@h:6379/0' and 'redis://h:6379/1'"),
            "{e}"
        );
        assert!(!e.contains("secret"), "{e}");
        let e = members(r#""redis://h2:1", "redis://h2:1", "redis://h3:1""#);
        assert!(e.contains("'redis://h2:1' and 'redis://h2:1'"), "{e}");
        let e = members(r#""redis://localhost:7000", "redis://127.0.0.1:7000", "redis://h3:1""#);
        assert!(e.contains("the same Redis server"), "{e}");
        let distinct = r#"backends = ["redis://h:1", "redis://h:2", "redis://h2:1"]"#;
        Config::parse(distinct).and_then(|c| c.validate()).unwrap();
    }

    #[test]
    fn errors_are_one_line() {
        assert!(!error_of("backend_timeout_ms = \"fast\"").contains('\n'));
    }

    #[test]
    fn warnings_name_each_misconfiguration() {
        assert!(
            Config::default().warnings().is_empty(),
            "{:?}",
            Config::default().warnings()
        );
        let even = Config {
            embedded_backends: 4,
            ..Config::default()
        };
        assert!(even.warnings()[0].starts_with("backends: 4 masters"));
        let slow = Config {
            backend_timeout_ms: 5_000,
            ..Config::default()
        };
        assert!(slow.warnings().iter().any(|w| w.starts_with("backend_timeout_ms")));
        let drifty = Config {
            drift_factor: 0.3,
            ..Config::default()
        };
        assert!(drifty.warnings().iter().any(|w| w.starts_with("drift_factor")));
        let billing = User {
            name: "billing".into(),
            password: Some("pw".into()),
            password_sha256: None,
            keys: vec!["lock:billing:*".into()],
            admin: false,
        };
        let scripts = Config {
            users: vec![billing.clone()],
            ..Config::default()
        };
        assert!(scripts.warnings().iter().any(|w| w.starts_with("script_policy")));
        let allowlisted = Config {
            script_policy: ScriptPolicy::Allowlist,
            ..scripts
        };
        assert!(allowlisted.warnings().is_empty(), "{:?}", allowlisted.warnings());
        let unconfined = Config {
            users: vec![User {
                keys: vec!["lock:billing:*".into(), "*".into()],
                ..billing
            }],
            ..Config::default()
        };
        assert!(unconfined.warnings().is_empty(), "{:?}", unconfined.warnings());
    }

    #[test]
    fn masked_config_hides_secrets() {
        let c = Config {
            backends: vec!["redis://u:pw@h:1".into()],
            requirepass: Some("pw".into()),
            ..Config::default()
        };
        let text = c.to_toml();
        assert!(!text.contains("pw@") && !text.contains("\"pw\""), "{text}");
        assert!(text.contains("redis://u:***@h:1"));
    }

    #[test]
    fn environment_variables_fill_secrets() {
        let env = |name: &str| (name == "PW").then(|| "s3cret".to_owned());
        assert_eq!(
            expand("redis://:${PW}@h:1", "backends", env).unwrap(),
            "redis://:s3cret@h:1"
        );
        assert_eq!(expand("no vars", "x", env).unwrap(), "no vars");
        let err = expand("${NOPE}", "requirepass", env).unwrap_err().to_string();
        assert!(
            err.contains("requirepass: environment variable NOPE is not set"),
            "{err}"
        );
    }

    #[test]
    fn users_are_validated() {
        let user = |extra: &str| error_of(&format!("[[users]]\nname = \"u\"\n{extra}"));
        assert!(user("").contains("exactly one of password"));
        assert!(user("password_sha256 = \"abc\"").contains("64 hex digits"));
        assert!(user("password = \"p\"\nkeys = []").contains("at least one pattern"));
        assert!(error_of("script_policy = \"allowlist\"").contains("script_allowlist"));
    }

    #[test]
    fn passwords_are_masked() {
        assert_eq!(mask_url("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(mask_url("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(mask_url("redis://h:1"), "redis://h:1");
    }
}
