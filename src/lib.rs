//! # redlock-proxy
//!
//! A server that speaks the Redis protocol (RESP2 and RESP3) and turns any unmodified Redis
//! client into a Redlock client. A client sends `SET key token NX PX ms` to take a lock and
//! the usual compare-and-delete script to release it; the proxy fans each command out,
//! concurrently, to N independent Redis masters and answers `OK` only when a majority
//! accepted it within the lock's validity time.
//!
//! ## The request path
//!
//! [`connection`] frames a request ([`protocol`]) → [`command::Command::parse`] types it
//! through the command table → [`proxy::Proxy::execute`] dispatches it to its recipe's serving
//! (`recipes::*::serve`), which runs the recipe's [`quorum::Acquisition`] or another operation
//! on the [`quorum::Engine`] → each [`backend::Backend`] answers → the engine decides (the
//! acquisition rule, or [`quorum::combine()`]) → [`connection`] settles the
//! [`proxy::Outcome`] when it writes it (a reply that holds only until its validity ends is
//! checked at that moment) and encodes the [`reply::Reply`] in the client's protocol.
//!
//! ## Layout
//!
//! The modules are layered (docs/development.md, "Layers"; `tests/layers.rs` holds the code to
//! it), bottom first:
//!
//! | module | concern |
//! |---|---|
//! | [`clock`], [`glob`], [`reply`], [`error`], [`stop`] | monotonic time behind a trait, Redis-style glob patterns, typed replies and their RESP2/RESP3 encoding, client-facing and start-up errors, the signal that stops a connection |
//! | [`protocol`] | request framing (RESP and inline) with limits |
//! | [`wire`], [`keys`], [`metrics`], [`tls`] | requests as the masters read them; the names the proxy keeps on the masters; metric names and the Prometheus recorder; rustls for clients and `rediss://` masters |
//! | [`backend`] | the `Backend` trait, real Redis masters (plain, Sentinel, cluster), embedded masters |
//! | [`config`] | `config.toml` schema, defaults, validation |
//! | [`lua`] | how a script is called on a master; the proxy's own scripts; the fenced acquisition |
//! | [`quorum`] | the Redlock engine: fan-out, validity, undo, the [`quorum::Acquisition`] trait, the one fenced path, the reply-combining rule, `NOQUORUM` |
//! | [`command`], [`introspection`], [`auth`], [`scripts`] | the command table and typed commands; `COMMAND` and `HELP` from the table; passwords, users, key patterns; clients' scripts by SHA1 |
//! | [`sessions`], [`waiters`], [`waiting`] | locks kept alive while their connection is open; per-key FIFO queues; what clients leave waiting, bounded |
//! | [`recipes`] | one folder per recipe (lock, reentrant, semaphore, read-write lock, election, several locks): its commands, parsers, engine part, names, Lua and serving |
//! | [`proxy`] | shared state and dispatch; start-up, admin, scripts, transactions, waiting, replies settled when written, `INFO` |
//! | [`connection`], [`server`], [`status`], [`cli`] | one client; accept loops and shutdown; `/metrics` and the status page; the command line |

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

/// Declares a module that reads what a client sent (framing, parsing, the typed commands): no
/// indexing, slicing, unchecked arithmetic or lossy cast in it can panic or wrap on a client's
/// bytes (rule 13; the fuzz targets check what the lints cannot). The one list of those lints:
/// `protocol`, `command` and each recipe's `command` and `parse` modules are declared through it.
macro_rules! reads_client_input {
    ($(#[$meta:meta])* $vis:vis mod $name:ident;) => {
        $(#[$meta])*
        #[deny(
            clippy::indexing_slicing,
            clippy::arithmetic_side_effects,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_possible_wrap
        )]
        $vis mod $name;
    };
}

pub mod auth;
pub mod backend;
pub mod check;
pub mod cli;
pub mod clock;
reads_client_input!(
    pub mod command;
);
pub mod config;
pub mod connection;
pub mod error;
pub mod glob;
pub mod introspection;
pub mod keys;
#[macro_use]
pub mod lua;
pub mod metrics;
reads_client_input!(
    pub mod protocol;
);
pub mod proxy;
pub mod quorum;
pub mod recipes;
pub mod reply;
pub mod scripts;
pub mod server;
pub mod sessions;
pub mod status;
pub mod stop;
pub mod tls;
pub mod waiters;
pub mod waiting;
pub mod wire;
