//! `redlock-proxy`: parse flags, load `config.toml`, start the masters and the server.

// No input may panic the proxy (rule 13): the panicking forms are refused in the crate's own
// code (tests may use them: clippy.toml), and so are the conversions that panic on a client's
// number (clippy.toml's `disallowed-methods`).
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable,
    clippy::todo,
    clippy::unimplemented,
    clippy::disallowed_methods
)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokio::net::TcpListener;
use tokio::sync::watch;

use redlock_proxy::config::{Config, LogFormat};
use redlock_proxy::error::StartError;
use redlock_proxy::proxy::Proxy;
use redlock_proxy::server;

/// A Redis-protocol server that turns any Redis client into a Redlock client.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Config file. Default: ./config.toml when it exists, else built-in defaults.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on (overrides `listen`).
    #[arg(long)]
    listen: Option<String>,
    /// A backend master URL; repeat for each master (overrides `backends`).
    #[arg(long = "backend")]
    backends: Vec<String>,
    /// Log filter (overrides `log_level`).
    #[arg(long)]
    log_level: Option<String>,
    /// Log format (overrides `log_format`).
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    /// Validate the configuration, print it (secrets masked) with warnings, and exit.
    #[arg(long)]
    check_config: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match load_config(&args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("redlock-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    if args.check_config {
        // The configuration goes to stdout and the verdict to stderr. The configuration ends
        // with a newline and is flushed before the verdict, so that on a terminal (or with
        // `2>&1`) `configuration OK` is a line of its own, whichever field comes last.
        let mut text = config.to_toml();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
            eprintln!("redlock-proxy: cannot print the configuration: {e}");
            return ExitCode::FAILURE;
        }
        drop(stdout);
        for (i, url) in config.backends.iter().enumerate() {
            eprintln!("member {i}: {}", redlock_proxy::backend::redis::describe_url(url));
        }
        eprintln!("{}", config.session_bounds());
        for warning in config.warnings() {
            eprintln!("warning: {warning}");
        }
        eprintln!("configuration OK");
        return ExitCode::SUCCESS;
    }
    init_logging(&config.log_level, config.log_format);
    for warning in config.warnings() {
        tracing::warn!("{warning}");
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
            eprintln!("redlock-proxy: {e}");
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

/// Reads the config file (if any), applies flags, validates.
fn load_config(args: &Args) -> Result<Config, StartError> {
    let default_path = PathBuf::from("config.toml");
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None if default_path.exists() => Config::load(&default_path)?,
        None => Config::default(),
    };
    if let Some(listen) = &args.listen {
        config.listen.clone_from(listen);
    }
    if !args.backends.is_empty() {
        config.backends.clone_from(&args.backends);
    }
    if let Some(level) = &args.log_level {
        config.log_level.clone_from(level);
    }
    if let Some(format) = args.log_format {
        config.log_format = format;
    }
    config.resolve_env()?;
    config.validate()?;
    Ok(config)
}

fn init_logging(level: &str, format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}

async fn serve(config: Config) -> Result<(), StartError> {
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: config.listen.clone(),
            source,
        })?;
    // The metrics listener is bound, and the recorder installed, before the masters are
    // connected: the engine's per-master series are registered with the recorder then. It
    // serves once the proxy exists (the status page reads it).
    let status = match &config.metrics_listen {
        Some(addr) => {
            let listener = redlock_proxy::status::bind(addr).await?;
            Some((listener, redlock_proxy::metrics::install()?))
        }
        None => None,
    };
    let tls = match (&config.tls_listen, &config.tls_cert_file, &config.tls_key_file) {
        (Some(addr), Some(cert), Some(key)) => {
            let acceptor = redlock_proxy::tls::acceptor(cert, key)?;
            let listener = TcpListener::bind(addr).await.map_err(|source| StartError::Listen {
                addr: addr.clone(),
                source,
            })?;
            Some((listener, acceptor))
        }
        _ => None,
    };
    let proxy = Proxy::start(config).await?;
    tracing::info!(
        listen = %proxy.config.listen,
        backends = proxy.engine.backends().len(),
        quorum = proxy.engine.quorum(),
        "redlock-proxy ready"
    );
    let (stop, stopped) = watch::channel(false);
    if let Some((listener, metrics)) = status {
        tokio::spawn(redlock_proxy::status::serve(
            listener,
            proxy.clone(),
            metrics,
            stopped.clone(),
        ));
    }
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: no new connections");
        let _ = stop.send(true);
    });
    server::run(listener, tls, proxy, stopped).await;
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
