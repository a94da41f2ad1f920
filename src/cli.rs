//! The command line: parse flags, load `config.toml`, start the masters and the server
//! (`src/main.rs` only calls [`main`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{self, Config, Flag, LogFormat};
use crate::error::StartError;
use crate::proxy::Proxy;
use crate::server;

/// The log target of these lines: the binary's, as operators filter it (`redlock_proxy`).
const TARGET: &str = "redlock_proxy";

/// A Redis-protocol server that turns any Redis client into a Redlock client.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Config file. Default: ./config.toml when it exists, else built-in defaults.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Validate the configuration, print it (secrets masked) with warnings, and exit.
    #[arg(long)]
    check_config: bool,
}

/// The flags the command line parser knows; every other `--name` is a config key.
const OWN_FLAGS: &[&str] = &["config", "check-config", "help", "version"];

/// Splits the command line into the parser's own flags and config keys given as flags
/// (`--quarantine restarts`, `--max-ttl-ms=60000`, `--backend <url>` for one of `backends`).
fn split_args(args: impl IntoIterator<Item = String>) -> Result<(Vec<String>, Vec<Flag>), StartError> {
    let mut own = Vec::new();
    let mut flags = Vec::new();
    let mut args = args.into_iter();
    own.extend(args.next());
    while let Some(arg) = args.next() {
        let Some(name) = arg.strip_prefix("--").filter(|n| !n.is_empty()) else {
            own.push(arg);
            continue;
        };
        let (name, inline) = match name.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (name, None),
        };
        if OWN_FLAGS.contains(&name) {
            own.push(arg);
            continue;
        }
        let key = match name.replace('-', "_") {
            k if k == "backend" => "backends".to_owned(),
            k => k,
        };
        let value = match inline.or_else(|| args.next()) {
            Some(value) => value,
            None => return Err(StartError::Config(format!("--{name} needs a value"))),
        };
        flags.push(Flag { key, value });
    }
    Ok((own, flags))
}

/// `--help`'s list of the config keys that are flags.
fn keys_help() -> String {
    // `backends` by the flag that names one master, as the README and the docs write it.
    let keys: Vec<String> = config::KEYS
        .iter()
        .map(|k| match *k {
            "backends" => "--backend".to_owned(),
            k => format!("--{}", k.replace('_', "-")),
        })
        .collect();
    format!(
        "Every config.toml key is also a flag, over the file: --<key> <value> or --<key>=<value>, \
         e.g. --quarantine restarts --max-ttl-ms 60000 --metrics-listen 127.0.0.1:9121. An array key \
         takes one element per flag (--backend redis://h1:6379 --backend redis://h2:6379) or a TOML \
         array. The keys (see config.toml for each):\n  {}",
        keys.join(" ")
    )
}

/// The binary's entry point: runs the proxy as the command line says, and exits with its
/// status.
pub fn main() -> ExitCode {
    let (own, flags) = match split_args(std::env::args()) {
        Ok(split) => split,
        Err(e) => {
            eprintln!("redlock-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    let matches = Args::command().after_help(keys_help()).get_matches_from(own);
    let args = match Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    let (config, source) = match load_config(&args, &flags) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("redlock-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    if args.check_config {
        return crate::check::run(&config, &source);
    }
    let _log = init_logging(&config.log_level, config.log_format);
    tracing::info!(target: TARGET, version = env!("CARGO_PKG_VERSION"), "redlock-proxy starting: {source}");
    for warning in config.warnings() {
        tracing::warn!(target: TARGET, "{warning}");
    }
    let runtime = match runtime(config.threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redlock-proxy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Which file said so: a second proxy started from the same directory reads the
            // same `config.toml`, and its taken port is that file's.
            eprintln!("redlock-proxy: {e} (configuration from {source})");
            ExitCode::from(2)
        }
    }
}

/// The runtime for `threads` (config): one thread runs everything on one event loop; more
/// share the work. With one, a request's hops (client task, backend writer, backend reader)
/// run on the same thread in turn, so the writer finds the requests of every client that
/// was ready in one batch, and no thread is woken to steal a task.
fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}

/// Reads the config file (if any), applies flags, validates. Also says where the
/// configuration came from, for the first log line.
fn load_config(args: &Args, flags: &[Flag]) -> Result<(Config, String), StartError> {
    let default_path = PathBuf::from("config.toml");
    let path = match &args.config {
        Some(path) => Some(path.clone()),
        None => default_path.exists().then_some(default_path),
    };
    let text = match &path {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| StartError::Config(format!("cannot read {}: {e}", path.display())))?,
        None => String::new(),
    };
    let mut config = Config::parse_with_flags(&text, flags)?;
    config.resolve_env()?;
    config.validate()?;
    let here = std::env::current_dir().unwrap_or_default();
    let file = match (&path, &args.config) {
        (Some(path), Some(_)) => format!("config file {}", here.join(path).display()),
        (Some(path), None) => format!(
            "config file {} (found in the working directory; --config names another, --config /dev/null none)",
            here.join(path).display()
        ),
        (None, _) => format!(
            "built-in defaults (no --config, and no config.toml in the working directory {})",
            here.display()
        ),
    };
    let source = match flags.len() {
        0 => file,
        n => format!("{file}, {n} flag(s) over it"),
    };
    Ok((config, source))
}

/// How many log lines wait for a stderr that is not read before new ones are dropped (and
/// counted: `redlock_log_lines_dropped_total`): a few megabytes at most.
const LOG_BACKLOG: usize = 16 * 1024;

/// Logs to stderr at `level` in `format`. The lines are written by a thread of their own:
/// a stderr that blocks (a pipe nobody reads, a stalled journal) costs dropped lines, never
/// a request, a keepalive or a lost-lock notice (rule 16). Colour only on a terminal, and
/// not with `NO_COLOR` set: escape codes in a file or the journal are noise. The guard
/// flushes what is left when dropped: keep it until the end of `main`.
fn init_logging(level: &str, format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    use std::io::IsTerminal;
    let filter =
        tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_BACKLOG)
        .thread_name("redlock-proxy-log")
        .finish(std::io::stderr());
    crate::metrics::count_dropped_log_lines(writer.error_counter());
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(writer);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    guard
}

async fn serve(config: Config) -> Result<(), StartError> {
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|source| StartError::Listen {
            key: "listen",
            addr: config.listen.clone(),
            source,
        })?;
    // The metrics listener is bound, and the recorder installed, before the masters are
    // connected: the engine's per-master series are registered with the recorder then. It
    // serves once the proxy exists (the status page reads it).
    let status = match &config.metrics_listen {
        Some(addr) => {
            let listener = crate::status::bind(addr).await?;
            tracing::info!(target: TARGET, "metrics and status page served on http://{addr}/metrics and http://{addr}/");
            Some((listener, crate::metrics::install()?))
        }
        None => None,
    };
    let tls = match (&config.tls_listen, &config.tls_cert_file, &config.tls_key_file) {
        (Some(addr), Some(cert), Some(key)) => {
            let acceptor = crate::tls::acceptor(cert, key)?;
            let listener = TcpListener::bind(addr).await.map_err(|source| StartError::Listen {
                key: "tls_listen",
                addr: addr.clone(),
                source,
            })?;
            Some((listener, acceptor))
        }
        _ => None,
    };
    let proxy = Proxy::start(config).await?;
    tracing::info!(
        target: TARGET,
        listen = %proxy.config.listen,
        backends = proxy.engine.backends().len(),
        quorum = proxy.engine.quorum(),
        "redlock-proxy ready"
    );
    let (stop, stopped) = watch::channel(false);
    if let Some((listener, metrics)) = status {
        tokio::spawn(crate::status::serve(listener, proxy.clone(), metrics, stopped.clone()));
    }
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!(target: TARGET, "shutting down: no new connections");
        let _ = stop.send(true);
    });
    server::run(listener, tls, proxy, stopped).await;
    tracing::info!(target: TARGET, "redlock-proxy stopped");
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
