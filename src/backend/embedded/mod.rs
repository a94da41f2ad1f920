//! An in-process Redis master, for trying the proxy out without a real Redis and for tests.
//!
//! [`EmbeddedBackend`] answers the commands that lock clients and the proxy's own scripts send
//! (strings with expiry, the hash and sorted-set commands the scripts call, `EVAL`, `EVALSHA`,
//! `SCRIPT`, `INFO`) the way a Redis 7 master does, down to the error texts, so that
//! the quorum engine can't tell it from the real thing. Each command, including a whole Lua
//! script, runs under one mutex: scripts are atomic, as in Redis.
//!
//! Time comes from a [`Clock`], so tests can run it on simulated time or give each master a
//! drifting clock. The keys live in `Store` (`store.rs`); `commands.rs` parses and runs the
//! commands (`hash.rs` and `zset.rs` those of hashes and sorted sets), `lua.rs` the scripts; this
//! module is the master itself.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mlua::chunk::ChunkMode;
use mlua::debug::Debug as LuaDebug;
use mlua::{Function, HookTriggers, Lua, LuaOptions, LuaString, MultiValue, StdLib, Table, Value, Variadic, VmState};

use super::{Backend, Form, Place, Request};
use crate::clock::Clock;
use crate::reply::Reply;
use commands::*;
use lua::*;
use store::{Data, Entry, Store};

/// The version the master claims in `INFO`.
const REDIS_VERSION: &str = "7.0.0";

/// A script running longer than this (real time) is killed, so a runaway script can't hang the
/// backend. Redis answers other clients `BUSY` after its limit and leaves the kill to
/// `SCRIPT KILL`; here other callers wait on the lock and could never send one, so the
/// backend kills by itself.
const SCRIPT_TIME_LIMIT: Duration = Duration::from_secs(5);

/// How many Lua instructions run between two looks at the script's deadline.
const WATCHDOG_INTERVAL: u32 = 1000;

/// Lua memory cap: without it, `string.rep("x", 1e12)` would abort the whole process.
const LUA_MEMORY_LIMIT: usize = 256 << 20;

/// How deeply nested a table a script may return (Redis stops at its Lua stack limit).
const MAX_REPLY_DEPTH: usize = 128;

/// How many values a script's reply may hold in all, so that a table referring to itself
/// (`t[1] = t; t[2] = t`) can't make the conversion run forever.
const MAX_REPLY_VALUES: usize = 1 << 20;

/// How many stack frames the error handler looks through for the script's line.
const MAX_STACK_SCAN: usize = 256;

/// How much of a command's arguments Redis quotes back in `unknown command` errors.
const UNKNOWN_COMMAND_QUOTE_LEN: usize = 128;

/// The name scripts are compiled under: error messages read `user_script:1: ...`, as in Redis.
const SCRIPT_CHUNK_NAME: &str = "@user_script";

/// Every error text this master can reply with, worded exactly as Redis 7 words it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum CommandError {
    #[error("ERR syntax error")]
    Syntax,
    #[error("ERR invalid cursor")]
    InvalidCursor,
    #[error("ERR value is not an integer or out of range")]
    NotAnInteger,
    #[error("ERR increment or decrement would overflow")]
    Overflow,
    #[error("ERR decrement would overflow")]
    DecrementOverflow,
    #[error("ERR invalid expire time in '{0}' command")]
    InvalidExpireTime(&'static str),
    #[error("ERR wrong number of arguments for '{0}' command")]
    WrongArity(&'static str),
    #[error("ERR unknown command '{name}', with args beginning with: {args}")]
    UnknownCommand { name: String, args: String },
    #[error("ERR unknown subcommand '{subcommand}'. Try {command} HELP.")]
    UnknownSubcommand { command: &'static str, subcommand: String },
    #[error("ERR Unsupported option {0}")]
    UnsupportedOption(String),
    #[error("ERR NX and XX, GT or LT options at the same time are not compatible")]
    ExpireNxConflict,
    #[error("ERR GT and LT options at the same time are not compatible")]
    ExpireGtLtConflict,
    #[error("ERR Number of keys can't be greater than number of args")]
    TooManyKeys,
    #[error("ERR Number of keys can't be negative")]
    NegativeKeys,
    #[error("NOSCRIPT No matching script. Please use EVAL.")]
    NoScript,
    #[error("NOTBUSY No scripts in execution right now.")]
    NotBusy,
    #[error("ERR SCRIPT FLUSH only support SYNC|ASYNC option")]
    FlushOption,
    #[error("ERR Error compiling script (new function): {0}")]
    Compile(String),
    #[error("ERR script killed: ran longer than {0} ms")]
    ScriptKilled(u128),
    #[error("ERR Unknown Redis command called from script")]
    UnknownFromScript,
    #[error("ERR Wrong number of args calling Redis command from script")]
    ArityFromScript,
    #[error("ERR This Redis command is not allowed from script")]
    NotAllowedFromScript,
    #[error("ERR Please specify at least one argument for this redis lib call")]
    NoScriptArguments,
    #[error("ERR Lua redis lib command arguments must be strings or integers")]
    BadScriptArgument,
    #[error("ERR wrong number or type of arguments")]
    BadHelperArguments,
    #[error("ERR reached lua stack limit")]
    LuaStackLimit,
    #[error("ERR reply from script is too large")]
    ReplyTooLarge,
    #[error("ERR wrong number of arguments")]
    HelperArity,
    #[error("ERR redis.call and redis.pcall only work while a script runs")]
    NoRunningScript,
    #[error("ERR the script engine is busy")]
    EngineBusy,
    #[error("ERR the script engine lost the keyspace")]
    KeyspaceLost,
    #[error("ERR the script ended without an outcome")]
    NoOutcome,
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    #[error("ERR hash value is not an integer")]
    HashValueNotInteger,
    #[error("ERR value is not a valid float")]
    NotAFloat,
    #[error("ERR min or max is not a float")]
    RangeNotAFloat,
    #[error("ERR XX and NX options at the same time are not compatible")]
    ZaddXxNx,
    #[error("ERR GT, LT, and/or NX options at the same time are not compatible")]
    ZaddGtLtNx,
    #[error("ERR INCR option supports a single increment-element pair")]
    ZaddIncrPair,
    #[error("ERR resulting score is not a number (NaN)")]
    ScoreNan,
    #[error("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX")]
    LimitWithoutBy,
    #[error("ERR BYLEX is not supported by the embedded master")]
    ByLexUnsupported,
    #[error("ERR {0}")]
    Lua(String),
}

impl CommandError {
    /// A failure of the Lua machinery itself (out of memory, a broken state).
    fn lua(error: mlua::Error) -> CommandError {
        CommandError::Lua(lua_error_message(&error))
    }
}

impl From<CommandError> for Reply {
    fn from(error: CommandError) -> Reply {
        Reply::error(error.to_string())
    }
}

type CommandResult = Result<Reply, CommandError>;

/// An in-process Redis 7 master.
pub struct EmbeddedBackend {
    name: String,
    clock: Arc<dyn Clock>,
    /// Unix time (ms) at the clock's origin. `EXPIREAT` and `PXAT` speak Unix time while the
    /// clock is monotonic: the master's wall clock is this origin plus the clock, so a
    /// simulated or drifting clock shows in expiry exactly like a relative `PX` does.
    unix_ms_at_origin: u64,
    /// Boxed to keep the backend small: it is moved around and held in enums beside the
    /// other kinds of backend.
    inner: Box<Mutex<Inner>>,
}

/// Everything one command may change; guarded by the backend's mutex.
struct Inner {
    store: Store,
    identity: Identity,
    /// Created on the first script, dropped by `SCRIPT FLUSH` and restarts.
    scripting: Option<ScriptEngine>,
    script_time_limit: Duration,
}

/// Who this run of the master is: what `INFO` reports, renewed by every restart.
#[derive(Clone, Debug)]
struct Identity {
    run_id: String,
    replid: String,
    /// Unix ms (on the master's clock) when this run started, for the uptime.
    started_at_ms: u64,
}

impl Identity {
    fn fresh(now_ms: u64) -> Identity {
        Identity {
            run_id: random_hex_id(),
            replid: random_hex_id(),
            started_at_ms: now_ms,
        }
    }
}

impl EmbeddedBackend {
    /// A master with no keys. `name` is shown in logs; expiry and uptime are measured on
    /// `clock` (tests pass a simulated or drifting one).
    pub fn new(name: impl Into<String>, clock: Arc<dyn Clock>) -> EmbeddedBackend {
        let wall_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, millis);
        let unix_ms_at_origin = wall_ms.saturating_sub(millis(clock.now()));
        EmbeddedBackend::with_origin(name, clock, unix_ms_at_origin)
    }

    /// A master whose wall clock reads `unix_ms_at_origin` when `clock` reads zero.
    fn with_origin(name: impl Into<String>, clock: Arc<dyn Clock>, unix_ms_at_origin: u64) -> EmbeddedBackend {
        let now_ms = unix_ms_at_origin.saturating_add(millis(clock.now()));
        EmbeddedBackend {
            name: name.into(),
            clock,
            unix_ms_at_origin,
            inner: Box::new(Mutex::new(Inner {
                store: Store::new(),
                identity: Identity::fresh(now_ms),
                scripting: None,
                script_time_limit: SCRIPT_TIME_LIMIT,
            })),
        }
    }

    /// Simulates a restart without persistence: all keys and cached scripts are lost, the
    /// master gets a new run id and its uptime starts again at zero.
    pub fn restart(&self) {
        let now_ms = self.now_ms();
        let mut inner = self.lock();
        inner.store = Store::new();
        inner.scripting = None;
        inner.identity = Identity::fresh(now_ms);
    }

    /// Simulates a failover: the master is replaced by one of its replicas, promoted. A
    /// replica is another process, so the run id (and replication id) is new; it may have run
    /// for a long time (`replica_uptime`, which `INFO` reports as the uptime, since the
    /// promotion does not restart it), which is why a proxy cannot date a failover by the
    /// uptime. Its script cache is its own: the master's cached scripts are gone. Replication
    /// is asynchronous, so it may lack the master's last writes: only the live keys for which
    /// `keep` is true remain. Returns how many live keys were lost.
    pub fn promote_replica(&self, replica_uptime: Duration, keep: impl FnMut(&[u8]) -> bool) -> usize {
        let now_ms = self.now_ms();
        let mut inner = self.lock();
        let lost = inner.store.retain(now_ms, keep);
        inner.scripting = None;
        inner.identity = Identity::fresh(now_ms.saturating_sub(millis(replica_uptime)));
        lost
    }

    /// The current run's id, as `INFO server` reports it.
    pub fn run_id(&self) -> String {
        self.lock().identity.run_id.clone()
    }

    /// Executes one request synchronously and returns Redis' reply (a plain acquisition's
    /// transaction: its replies folded into one, as a real master's are).
    pub fn execute(&self, request: &Request) -> Reply {
        // One instant for the whole command, scripts included, like Redis' time snapshot.
        let now_ms = self.now_ms();
        let mut inner = self.lock();
        match request.form {
            Form::One => inner.execute(request.db, now_ms, &request.args),
            Form::Acquisition { .. } => {
                // `SET` and `TIME` in one step: nothing runs between them.
                let set = inner.execute(request.db, now_ms, &request.args);
                let time = inner.execute(request.db, now_ms, &[Bytes::from_static(b"TIME")]);
                request.form.fold(None, Reply::Array(vec![set, time]))
            }
        }
    }

    /// The master's wall clock, in Unix milliseconds.
    fn now_ms(&self) -> u64 {
        self.unix_ms_at_origin.saturating_add(millis(self.clock.now()))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing in here panics; if something ever did, the keyspace is still consistent
        // (every command writes it in one step), so keep serving.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shortens the script time limit so tests don't wait 5 s.
    #[cfg(test)]
    fn set_script_time_limit(&self, limit: Duration) {
        self.lock().script_time_limit = limit;
    }
}

impl fmt::Debug for EmbeddedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedBackend")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl EmbeddedBackend {
    /// [`EmbeddedBackend::execute_call`] as the proxy reads it: a [`Request::timed`] reply
    /// without its clock reading, which is not judged (an embedded master shares the proxy's
    /// monotonic clock: it cannot jump ahead of it).
    pub fn answer(&self, request: &Request, fallback: Option<&Request>) -> Reply {
        let reply = self.execute_call(request, fallback);
        if request.timed {
            super::split_time(reply).0
        } else {
            reply
        }
    }

    /// Runs `request`, and `fallback` in its place should the script be unknown (`NOSCRIPT`).
    pub fn execute_call(&self, request: &Request, fallback: Option<&Request>) -> Reply {
        let reply = self.execute(request);
        match fallback {
            Some(fallback) if reply.is_error_code("NOSCRIPT") => self.execute(fallback),
            _ => reply,
        }
    }
}

impl Backend for EmbeddedBackend {
    fn name(&self) -> &str {
        &self.name
    }

    /// Never fails: an embedded master answers at once, before this returns.
    fn start(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, place: Place) {
        place.complete(Ok(self.answer(request, fallback)));
    }

    fn run_id(&self) -> Option<String> {
        Some(EmbeddedBackend::run_id(self))
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// Case-insensitive comparison of an argument with a lowercase keyword.
fn is(arg: &[u8], keyword: &str) -> bool {
    arg.eq_ignore_ascii_case(keyword.as_bytes())
}

/// Parses an integer the way Redis' `string2ll` does (the proxy's own rule for numbers).
fn parse_i64(data: &[u8]) -> Result<i64, CommandError> {
    crate::protocol::whole_number(data).ok_or(CommandError::NotAnInteger)
}

fn int_bytes(i: i64) -> Bytes {
    Bytes::copy_from_slice(itoa::Buffer::new().format(i).as_bytes())
}

fn lua_bytes(s: &LuaString) -> Bytes {
    Bytes::copy_from_slice(&s.as_bytes())
}

/// The message of a Lua error, without mlua's wrapping and traceback.
fn lua_error_message(error: &mlua::Error) -> String {
    let message = match error {
        mlua::Error::CallbackError { cause, .. } => return lua_error_message(cause),
        mlua::Error::RuntimeError(message) | mlua::Error::MemoryError(message) => message.clone(),
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        other => other.to_string(),
    };
    message.lines().next().unwrap_or_default().to_owned()
}

fn sha1_hex(data: &[u8]) -> String {
    sha1_smol::Sha1::from(data).digest().to_string()
}

/// 40 random hex characters, like Redis' run ids.
fn random_hex_id() -> String {
    let bytes: [u8; 20] = rand::random();
    bytes.iter().fold(String::with_capacity(40), |mut hex, byte| {
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

mod commands;
mod hash;
mod lua;
mod store;
#[cfg(test)]
mod tests;
mod zset;
