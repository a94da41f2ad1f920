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
//! [`connection`] frames a request ([`protocol`]) → [`command::Command::parse`] types it →
//! [`proxy::Proxy::execute`] maps it onto the [`quorum::Engine`] → each [`backend::Backend`]
//! answers → [`quorum::combine`] (or the acquisition rule) decides → [`connection`] settles
//! the [`proxy::Outcome`] when it writes it (a reply that holds only until its validity ends
//! is checked at that moment) and encodes the [`reply::Reply`] in the client's protocol.
//!
//! ## Layout
//!
//! | module | concern |
//! |---|---|
//! | [`config`] | `config.toml` schema, defaults, validation |
//! | [`auth`] | passwords, named users, key patterns |
//! | [`server`] | accept loops (plain and TLS), client cap, shutdown |
//! | [`tls`] | rustls for clients and `rediss://` masters |
//! | [`connection`] | one client: framing, session state, pipelining, ordered replies |
//! | [`sessions`] | locks kept alive while the connection that took them is open |
//! | [`stop`] | the signal that stops a connection (`CLIENT KILL`, shutdown) |
//! | [`waiters`] | per-key FIFO queues of requests waiting for a lock |
//! | [`waiting`] | what clients leave waiting or observing, bounded per user and in all |
//! | [`semaphore`] | semaphores as k mutex slots: their names on the masters, what a proxy believes of them |
//! | [`rwlock`] | read-write locks: their names on the masters, and how a reader's hold is named in the proxy |
//! | [`election`] | leader election: each election's lock name, its readers, a connection's observations |
//! | [`protocol`] | request framing (RESP and inline) with limits |
//! | [`command`] | the command table; parsing into a typed [`command::Command`] |
//! | [`introspection`] | `COMMAND` and the containers' `HELP`, answered from the command table |
//! | [`proxy`] | shared state; commands that need the masters; keeping session locks on them |
//! | [`quorum`] | the Redlock engine: fan-out, validity, undo, the reply-combining rule, its errors (`NOQUORUM`) |
//! | [`backend`] | the `Backend` trait, real Redis masters, embedded masters |
//! | [`scripts`] | the proxy's release script; clients' scripts by SHA1 |
//! | [`info`] | `INFO` sections |
//! | [`metrics`] | metric names, the Prometheus recorder |
//! | [`status`] | the HTTP listener on `metrics_listen`: `/metrics` and the status page |
//! | [`clock`] | monotonic time behind a trait |
//! | [`glob`] | Redis-style glob patterns |
//! | [`reply`] | typed replies and their RESP2/RESP3 encoding |
//! | [`error`] | client-facing and startup errors (each layer owns its own) |

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
