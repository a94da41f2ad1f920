//! `config.toml`: the schema, its defaults, and validation with errors that name the field.
//!
//! Every option is documented in the shipped `config.toml`; keep the two in step.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::health::QuarantineMode;
use crate::backend::url::mask_url;
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
    /// The legacy member (docs/migrating-from-setnx.md, "Rolling over without a stop"): the
    /// single Redis old code still locks on during a rollout. While set, every lock on a key it
    /// bridges must be granted there too, in the form the client wrote it.
    pub legacy_backend: Option<String>,
    /// Glob patterns of the keys bridged to `legacy_backend` (all client keys when omitted).
    pub legacy_keys: Vec<String>,
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
    /// Most bytes of one client's requests the proxy buffers while none of them can start
    /// (behind a `WAIT`, a command that runs alone, or a full pipeline): the connection keeps
    /// reading up to here, so that the client's end is seen while it waits.
    pub client_query_buffer_limit: usize,
    /// Most bytes of replies waiting for one client to read them; past it the client is
    /// dropped (as Redis's `client-output-buffer-limit`): one client that stops reading costs
    /// only itself.
    pub client_output_buffer_limit: usize,
    /// How long a client may leave its replies unread, or its input past
    /// `client_query_buffer_limit` unstarted, before it is dropped, in ms.
    pub client_stall_timeout_ms: u64,
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
    /// Most requests one user leaves waiting or observing in this proxy (each `WAIT`, each
    /// key of a `BLPOP`, each long poll, each election observed), all its connections
    /// together (`crate::waiting`).
    pub max_waiting_per_user: usize,
    /// Most requests waiting or observing in this proxy, all clients together.
    pub max_waiting: usize,
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
    /// when unset, `""` or `"off"`: so that `--metrics-listen off` turns off what a file set).
    #[serde(deserialize_with = "off_or_address")]
    pub metrics_listen: Option<String>,
}

/// An optional listener's address: `""` and `"off"` are none.
fn off_or_address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let value = Option::<String>::deserialize(d)?;
    Ok(value.filter(|v| !v.is_empty() && v != "off"))
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
            legacy_backend: None,
            legacy_keys: all_keys(),
            quarantine: QuarantineMode::Always,
            probe_interval_ms: 100,
            requirepass: None,
            users: Vec::new(),
            script_policy: ScriptPolicy::Any,
            script_allowlist: Vec::new(),
            script_files: Vec::new(),
            databases: 16,
            // Rule 16: what one request computes on the event loop grows with its size.
            proto_max_bulk_len: 256 * 1024,
            max_args: 64 * 1024,
            max_key_len: 4096,
            max_value_len: 4096,
            max_pipeline: 256,
            client_query_buffer_limit: 1024 * 1024,
            client_output_buffer_limit: 32 * 1024 * 1024,
            client_stall_timeout_ms: 10_000,
            maxclients: 10_000,
            timeout: 0,
            tcp_keepalive: 300,
            max_hold_ms: 3_600_000,
            max_session_locks_per_client: 100,
            max_session_locks_per_user: 1_000,
            max_session_locks: 10_000,
            max_waiting_per_user: 10_000,
            max_waiting: 100_000,
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

/// Every key of `config.toml`, in its order. Each is also a flag, `--max-ttl-ms 60000` (dashes
/// or underscores), as Redis's own server takes any directive as `--port 6380`: whatever a
/// user may set in the file can be set at start without writing one.
pub const KEYS: &[&str] = &[
    "listen",
    "tls_listen",
    "tls_cert_file",
    "tls_key_file",
    "tls_ca_file",
    "backends",
    "embedded_backends",
    "backend_timeout_ms",
    "connect_timeout_ms",
    "drift_factor",
    "default_ttl_ms",
    "max_ttl_ms",
    "legacy_ttl_ms",
    "legacy_backend",
    "legacy_keys",
    "quarantine",
    "probe_interval_ms",
    "requirepass",
    "users",
    "script_policy",
    "script_allowlist",
    "script_files",
    "databases",
    "proto_max_bulk_len",
    "max_args",
    "max_key_len",
    "max_value_len",
    "max_pipeline",
    "client_query_buffer_limit",
    "client_output_buffer_limit",
    "client_stall_timeout_ms",
    "maxclients",
    "timeout",
    "tcp_keepalive",
    "max_hold_ms",
    "max_session_locks_per_client",
    "max_session_locks_per_user",
    "max_session_locks",
    "max_waiting_per_user",
    "max_waiting",
    "min_keepalive_ttl_ms",
    "max_waiters_per_key",
    "max_waiters",
    "signal_lists",
    "threads",
    "log_level",
    "log_format",
    "metrics_listen",
];

/// A config key given as a flag, and the value as typed after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flag {
    /// The key, with underscores (`max_ttl_ms`).
    pub key: String,
    /// The value as typed.
    pub value: String,
}

/// Sets `flag`'s key in `table` (config text as read), adding to the flags' list when
/// `repeated`.
fn apply(table: &mut toml::Table, flag: &Flag, repeated: bool) {
    let defaults = toml::Table::try_from(Config::default()).unwrap_or_default();
    let value = flag_value(&flag.value, defaults.get(&flag.key));
    if repeated && let (Some(toml::Value::Array(list)), toml::Value::Array(more)) = (table.get_mut(&flag.key), &value) {
        list.extend(more.iter().cloned());
    } else {
        table.insert(flag.key.clone(), value);
    }
}

/// `max_ttl_ms` as a flag: `max-ttl-ms`.
fn dashed(key: &str) -> String {
    key.replace('_', "-")
}

/// The config key nearest to a mistyped one (edit distance at most a third of its length),
/// or containing it.
fn closest_key(typed: &str) -> Option<&'static str> {
    let distance = |a: &str, b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut diagonal = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let substitution = diagonal + usize::from(ca != *cb);
                diagonal = row[j + 1];
                row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
            }
        }
        row[b.len()]
    };
    let (best, d) = KEYS.iter().map(|k| (*k, distance(typed, k))).min_by_key(|(_, d)| *d)?;
    if d * 3 <= typed.len().max(3) {
        return Some(best);
    }
    KEYS.iter().copied().find(|k| k.contains(typed))
}

/// A flag's value as the type of the key's default (`None`: an optional key, all strings).
fn flag_value(text: &str, default: Option<&toml::Value>) -> toml::Value {
    let as_toml = || {
        toml::from_str::<toml::Table>(&format!("v = {text}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
    };
    match default {
        None | Some(toml::Value::String(_)) => toml::Value::String(text.to_owned()),
        Some(toml::Value::Array(_)) => match as_toml() {
            Some(list @ toml::Value::Array(_)) => list,
            _ => toml::Value::Array(vec![toml::Value::String(text.to_owned())]),
        },
        Some(_) => as_toml().unwrap_or_else(|| toml::Value::String(text.to_owned())),
    }
}

impl Config {
    /// Reads config `text` (empty: the defaults) and applies `flags` over it, each flag's
    /// value read as the key's type: a string key takes the text as it is (a password of
    /// digits stays a string), an array key takes one element per flag (`--backend a
    /// --backend b`) or a TOML array, any other key a TOML value (`60000`, `true`, `0.01`).
    /// Errors in the file name its line; errors in a flag name the flag.
    pub fn parse_with_flags(text: &str, flags: &[Flag]) -> Result<Config, StartError> {
        // The file's own errors first, with their line.
        let file = Config::parse(text)?;
        if flags.is_empty() {
            return Ok(file);
        }
        let file_table: toml::Table =
            toml::from_str(text).map_err(|e| StartError::Config(describe_toml_error(text, &e)))?;
        let mut table = file_table.clone();
        let mut from_flags: Vec<&str> = Vec::new();
        for flag in flags {
            let key = flag.key.as_str();
            if !KEYS.contains(&key) {
                let hint = closest_key(key).map_or(String::new(), |k| format!(" (did you mean --{}?)", dashed(k)));
                return Err(StartError::Config(format!(
                    "--{}: no such option{hint}; every config.toml key is a flag: see --help",
                    dashed(key)
                )));
            }
            // Repeated, an array key's elements add up; the file's list is replaced by the flags'.
            apply(&mut table, flag, from_flags.contains(&key));
            from_flags.push(key);
        }
        Config::deserialize(table).map_err(|e| {
            // The error of a value deserialized from a table names no key: the flag that fails
            // alone over the file is the one to name.
            let culprit = flags.iter().find(|flag| {
                let mut alone = file_table.clone();
                apply(&mut alone, flag, false);
                Config::deserialize(alone).is_err()
            });
            let message = e.message().replace('\n', " ");
            StartError::Config(match culprit {
                Some(flag) => format!("--{} {}: {message}", dashed(&flag.key), flag.value),
                None => format!("flags: {message}"),
            })
        })
    }

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
            if let Err(e) = crate::backend::url::check_url(url) {
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
        if let Some(url) = &self.legacy_backend {
            if let Err(e) = crate::backend::url::check_url(url) {
                return bad("legacy_backend", format!("'{}' is not a Redis URL: {e}", mask_url(url)));
            }
            if self.backends.is_empty() {
                return bad(
                    "legacy_backend",
                    "needs real masters (backends): the bridge is for a rollout".into(),
                );
            }
            let mut all = self.backends.clone();
            all.push(url.clone());
            // The legacy member must be another server than every master: its vote is a veto
            // beside the quorum, never one of the quorum's.
            if let Some((first, _, server)) = crate::backend::identity::conflicts(&all) {
                return bad(
                    "legacy_backend",
                    format!(
                        "'{}' is the same Redis server ({server}) as master '{}': the legacy server must be another server",
                        mask_url(url),
                        mask_url(&self.backends[first])
                    ),
                );
            }
            if self.legacy_keys.is_empty() {
                return bad("legacy_keys", "at least one pattern (\"*\" for all)".into());
            }
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
            ("client_query_buffer_limit", self.client_query_buffer_limit),
            ("client_output_buffer_limit", self.client_output_buffer_limit),
            (
                "client_stall_timeout_ms",
                usize::try_from(self.client_stall_timeout_ms).unwrap_or(usize::MAX),
            ),
            ("maxclients", self.maxclients),
            ("proto_max_bulk_len", self.proto_max_bulk_len),
            ("max_args", self.max_args),
            ("threads", self.threads),
            ("max_session_locks_per_client", self.max_session_locks_per_client),
            ("max_session_locks_per_user", self.max_session_locks_per_user),
            ("max_session_locks", self.max_session_locks),
            ("max_waiting_per_user", self.max_waiting_per_user),
            ("max_waiting", self.max_waiting),
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
            legacy_backend: self.legacy_backend.as_deref().map(mask_url),
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
    /// (`embedded_backends` is left out when `backends` are set: it is not used.)
    pub fn to_toml(&self) -> String {
        let rendered = toml::Table::try_from(self.masked()).map(|mut table| {
            if !self.backends.is_empty() {
                table.remove("embedded_backends");
            }
            table.to_string()
        });
        rendered.unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
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
        if self.backends.is_empty() {
            warnings.push(format!(
                "backends: none configured, so the proxy runs {n} EMBEDDED in-process masters: for trying it out, \
                 NOT for production, as they share this process's fate and a crash loses every lock; list real \
                 Redis masters in backends (--backend redis://host:port, once for each)"
            ));
        } else if n == 1 {
            warnings.push(
                "backends: one master is no Redlock: it tolerates no failure, and if it restarts without \
                 persistence every lock is lost (and kept out by the quarantine for max_ttl_ms); use 3 or 5 \
                 independent masters"
                    .to_owned(),
            );
        }
        if n > 1 && n.is_multiple_of(2) {
            let tolerated = (n - 1) / 2;
            warnings.push(format!(
                "backends: {n} masters need a quorum of {}, tolerating {tolerated} failure{} as {} would: use an odd number",
                n / 2 + 1,
                if tolerated == 1 { "" } else { "s" },
                if n == 2 { "1 master".to_owned() } else { format!("{} masters", n - 1) }
            ));
        }
        match self.quarantine {
            QuarantineMode::Always => {}
            QuarantineMode::Restarts => warnings.push(
                "quarantine: \"restarts\" trusts each master when first seen: one that restarted without \
                 persistence just before the proxy started votes at once, and a lock it held on a bare majority \
                 can be granted twice (rule 8). Right only when no lock can predate the masters (all started \
                 fresh together); otherwise use \"always\""
                    .to_owned(),
            ),
            QuarantineMode::Off => warnings.push(
                "quarantine: \"off\" lets a master that restarted without persistence vote at once, its locks \
                 lost: a lock held on a bare majority that included it can be granted twice (rule 8). Only for \
                 masters that persist every write (appendfsync always); otherwise use \"always\""
                    .to_owned(),
            ),
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
    fn the_legacy_member_is_another_server_than_every_master_and_needs_real_masters() {
        let same = error_of(
            "backends = [\"redis://127.0.0.1:6390\", \"redis://127.0.0.1:6391\"]\n\
             legacy_backend = \"redis://localhost:6391/2\"",
        );
        assert!(
            same.contains("legacy_backend") && same.contains("must be another server"),
            "{same}"
        );
        let embedded = error_of("legacy_backend = \"redis://127.0.0.1:6390\"");
        assert!(embedded.contains("needs real masters"), "{embedded}");
        let no_keys = error_of(
            "backends = [\"redis://127.0.0.1:6390\"]\nlegacy_backend = \"redis://127.0.0.1:6391\"\nlegacy_keys = []",
        );
        assert!(no_keys.contains("legacy_keys"), "{no_keys}");
        let ok = Config::parse("backends = [\"redis://127.0.0.1:6390\"]\nlegacy_backend = \"redis://127.0.0.1:6391\"")
            .and_then(|c| c.validate());
        assert!(ok.is_ok(), "{ok:?}");
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

    fn flag(key: &str, value: &str) -> Flag {
        Flag {
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn every_key_is_a_flag_read_as_its_type() {
        let file = "backends = [\"redis://f:1\"]\nmax_ttl_ms = 1000\n";
        let flags = [
            flag("quarantine", "restarts"),
            flag("max_ttl_ms", "60000"),
            flag("requirepass", "1234"),
            flag("backends", "redis://a:1"),
            flag("backends", "redis://b:1"),
            flag("drift_factor", "0.02"),
            flag("signal_lists", "[\"x:*\", \"y:*\"]"),
            flag("metrics_listen", "127.0.0.1:9121"),
        ];
        let c = Config::parse_with_flags(file, &flags).unwrap();
        assert_eq!(c.quarantine, QuarantineMode::Restarts);
        assert_eq!(c.max_ttl_ms, 60_000);
        assert_eq!(
            c.requirepass.as_deref(),
            Some("1234"),
            "a password of digits stays a string"
        );
        assert_eq!(
            c.backends,
            ["redis://a:1", "redis://b:1"],
            "the flags' list replaces the file's"
        );
        assert_eq!(c.drift_factor, 0.02);
        assert_eq!(c.signal_lists, ["x:*", "y:*"]);
        assert_eq!(c.metrics_listen.as_deref(), Some("127.0.0.1:9121"));
        let none = Config::parse_with_flags(file, &[]).unwrap();
        assert_eq!(none.max_ttl_ms, 1000);
    }

    #[test]
    fn a_bad_flag_is_named() {
        let error = |flags: &[Flag]| Config::parse_with_flags("", flags).unwrap_err().to_string();
        let typo = error(&[flag("max_tll_ms", "5")]);
        assert!(
            typo.contains("--max-tll-ms: no such option (did you mean --max-ttl-ms?)"),
            "{typo}"
        );
        let wrong = error(&[flag("quarantine", "restarts"), flag("max_ttl_ms", "fast")]);
        assert!(wrong.contains("--max-ttl-ms fast: invalid type"), "{wrong}");
        let variant = error(&[flag("log_format", "xml")]);
        assert!(variant.contains("--log-format xml: unknown variant `xml`"), "{variant}");
    }

    /// `KEYS` (the flags, `--help`) lists exactly the fields of [`Config`]: the parser's own
    /// list of them is in its error for an unknown field.
    #[test]
    fn the_flags_are_exactly_the_config_keys() {
        let e = toml::from_str::<Config>("zz_no_such_key = 1")
            .unwrap_err()
            .message()
            .to_owned();
        let fields: Vec<&str> = e.split('`').skip(3).step_by(2).collect();
        assert_eq!(fields, KEYS, "{e}");
    }

    /// The shipped `config.toml` documents every key (set or commented out), and names no
    /// key the proxy does not have.
    #[test]
    fn the_shipped_config_documents_every_key_and_only_those() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap();
        let named: Vec<&str> = text
            .lines()
            .filter_map(|l| {
                let l = l.trim_start_matches('#').trim_start();
                let key = match l.strip_prefix("[[") {
                    Some(table) => table.strip_suffix("]]")?,
                    None => l.split_once(" = ")?.0,
                };
                key.chars().all(|c| c.is_ascii_lowercase() || c == '_').then_some(key)
            })
            .collect();
        for key in KEYS {
            assert!(named.contains(key), "config.toml does not document {key}");
        }
        for key in &named {
            // `[[users]]` tables' own fields.
            if ["name", "password", "password_sha256", "keys", "admin"].contains(key) {
                continue;
            }
            assert!(KEYS.contains(key), "config.toml names {key}, which is no config key");
        }
    }

    #[test]
    fn errors_are_one_line() {
        assert!(!error_of("backend_timeout_ms = \"fast\"").contains('\n'));
    }

    #[test]
    fn warnings_name_each_misconfiguration() {
        let five = |more: Config| Config {
            backends: (1..=5).map(|i| format!("redis://h{i}:6379")).collect(),
            ..more
        };
        let good = five(Config::default());
        assert!(good.warnings().is_empty(), "{:?}", good.warnings());
        let embedded = Config::default().warnings();
        assert!(embedded[0].starts_with("backends: none configured"), "{embedded:?}");
        let even = Config {
            backends: vec!["redis://a:1".into(), "redis://b:1".into()],
            ..Config::default()
        };
        let even = even.warnings();
        assert!(
            even.iter()
                .any(|w| w.contains("2 masters need a quorum of 2, tolerating 0 failures as 1 master would")),
            "{even:?}"
        );
        let single = Config {
            backends: vec!["redis://a:1".into()],
            ..Config::default()
        };
        assert!(single.warnings()[0].starts_with("backends: one master is no Redlock"));
        for (mode, start) in [
            (QuarantineMode::Off, "quarantine: \"off\""),
            (QuarantineMode::Restarts, "quarantine: \"restarts\""),
        ] {
            let c = five(Config {
                quarantine: mode,
                ..Config::default()
            });
            assert!(c.warnings().iter().any(|w| w.starts_with(start)), "{:?}", c.warnings());
        }
        let shown = five(Config::default()).to_toml();
        assert!(
            !shown.contains("embedded_backends"),
            "unused when backends are set: {shown}"
        );
        assert!(Config::default().to_toml().contains("embedded_backends = 5"));
        let no_scheme = error_of("backends = [\"localhost:6379\"]");
        assert!(no_scheme.contains("write redis://localhost:6379"), "{no_scheme}");
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
        let scripts = five(Config {
            users: vec![billing.clone()],
            ..Config::default()
        });
        assert!(scripts.warnings().iter().any(|w| w.starts_with("script_policy")));
        let allowlisted = Config {
            script_policy: ScriptPolicy::Allowlist,
            ..scripts
        };
        assert!(allowlisted.warnings().is_empty(), "{:?}", allowlisted.warnings());
        let unconfined = five(Config {
            users: vec![User {
                keys: vec!["lock:billing:*".into(), "*".into()],
                ..billing
            }],
            ..Config::default()
        });
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
