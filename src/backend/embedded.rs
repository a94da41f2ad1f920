//! An in-process Redis master, for trying the proxy out without a real Redis and for tests.
//!
//! [`EmbeddedBackend`] answers the commands that lock clients send (strings with expiry, `EVAL`,
//! `EVALSHA`, `SCRIPT`, `INFO`) the way a Redis 7 master does, down to the error texts, so that
//! the quorum engine can't tell it from the real thing. Each command, including a whole Lua
//! script, runs under one mutex: scripts are atomic, as in Redis.
//!
//! Time comes from a [`Clock`], so tests can run it on simulated time or give each master a
//! drifting clock. The keys live in [`Store`]; this module parses commands and runs scripts.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mlua::chunk::ChunkMode;
use mlua::debug::Debug as LuaDebug;
use mlua::{Function, HookTriggers, Lua, LuaOptions, LuaString, MultiValue, StdLib, Table, Value, Variadic, VmState};

use super::store::{Entry, Store};
use super::{Backend, BackendError, Request};
use crate::clock::Clock;
use crate::reply::Reply;

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

    /// The current run's id, as `INFO server` reports it.
    pub fn run_id(&self) -> String {
        self.lock().identity.run_id.clone()
    }

    /// Executes one command synchronously and returns Redis' reply.
    pub fn execute(&self, request: &Request) -> Reply {
        // One instant for the whole command, scripts included, like Redis' time snapshot.
        let now_ms = self.now_ms();
        self.lock().execute(request.db, now_ms, &request.args)
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

impl Backend for EmbeddedBackend {
    fn name(&self) -> &str {
        &self.name
    }

    /// Never fails: an embedded master always answers. The command runs when the future is
    /// first polled, as a request to a real master is only sent then.
    async fn call(&self, request: &Request) -> Result<Reply, BackendError> {
        Ok(self.execute(request))
    }

    fn run_id(&self) -> Option<String> {
        Some(EmbeddedBackend::run_id(self))
    }
}

impl Inner {
    /// Looks the command up, checks its arity and runs it.
    fn execute(&mut self, db: u32, now_ms: u64, args: &[Bytes]) -> Reply {
        let Some(command) = args.first().and_then(|name| lookup(name)) else {
            return unknown_command(args).into();
        };
        if !command.accepts(args.len()) {
            return CommandError::WrongArity(command.name).into();
        }
        let result = match command.handler {
            Handler::Data(run) => {
                let mut exec = Exec {
                    store: &mut self.store,
                    db,
                    now_ms,
                    identity: &self.identity,
                };
                run(&mut exec, args)
            }
            Handler::Scripting(run) => run(self, db, now_ms, args),
        };
        result.unwrap_or_else(Reply::from)
    }
}

// ---------------------------------------------------------------------------------------------
// The command table
// ---------------------------------------------------------------------------------------------

/// One command this master knows.
struct Command {
    /// Lowercase, as Redis names it in errors.
    name: &'static str,
    /// Redis' convention: `n` means exactly n arguments (name included), `-n` at least n.
    arity: i32,
    handler: Handler,
}

/// Data commands only touch the keyspace, so scripts may call them; scripting commands need
/// the Lua engine and are refused inside scripts.
#[derive(Clone, Copy)]
enum Handler {
    Data(fn(&mut Exec<'_>, &[Bytes]) -> CommandResult),
    Scripting(fn(&mut Inner, u32, u64, &[Bytes]) -> CommandResult),
}

impl Command {
    const fn data(name: &'static str, arity: i32, run: fn(&mut Exec<'_>, &[Bytes]) -> CommandResult) -> Command {
        Command {
            name,
            arity,
            handler: Handler::Data(run),
        }
    }

    const fn scripting(
        name: &'static str,
        arity: i32,
        run: fn(&mut Inner, u32, u64, &[Bytes]) -> CommandResult,
    ) -> Command {
        Command {
            name,
            arity,
            handler: Handler::Scripting(run),
        }
    }

    fn accepts(&self, argc: usize) -> bool {
        let wanted = self.arity.unsigned_abs() as usize;
        if self.arity < 0 { argc >= wanted } else { argc == wanted }
    }
}

static COMMANDS: &[Command] = &[
    Command::data("ping", -1, ping),
    Command::data("echo", 2, echo),
    Command::data("get", 2, get),
    Command::data("set", -3, set),
    Command::data("setnx", 3, setnx),
    Command::data("getset", 3, getset),
    Command::data("del", -2, del),
    Command::data("unlink", -2, del),
    Command::data("exists", -2, exists),
    Command::data("pexpire", -3, pexpire),
    Command::data("expire", -3, expire),
    Command::data("pexpireat", -3, pexpireat),
    Command::data("expireat", -3, expireat),
    Command::data("pttl", 2, pttl),
    Command::data("ttl", 2, ttl),
    Command::data("persist", 2, persist),
    Command::data("incr", 2, incr),
    Command::data("incrby", 3, incrby),
    Command::data("decr", 2, decr),
    Command::data("decrby", 3, decrby),
    Command::data("flushdb", -1, flushdb),
    Command::data("flushall", -1, flushall),
    Command::data("dbsize", 1, dbsize),
    Command::data("scan", -2, scan),
    Command::data("info", -1, info),
    Command::data("role", 1, role),
    Command::scripting("eval", -3, eval),
    Command::scripting("evalsha", -3, evalsha),
    Command::scripting("script", -2, script),
];

fn lookup(name: &[u8]) -> Option<&'static Command> {
    COMMANDS
        .iter()
        .find(|command| name.eq_ignore_ascii_case(command.name.as_bytes()))
}

/// Redis' error for an unknown command quotes the name and the start of the arguments.
fn unknown_command(args: &[Bytes]) -> CommandError {
    let name = args.first().map_or(&[][..], |name| &name[..]);
    let mut quoted = Vec::new();
    for arg in args.iter().skip(1) {
        let room = UNKNOWN_COMMAND_QUOTE_LEN.saturating_sub(quoted.len());
        if room == 0 {
            break;
        }
        quoted.push(b'\'');
        quoted.extend(arg.iter().take(room));
        quoted.extend_from_slice(b"' ");
    }
    let name: Vec<u8> = name.iter().take(UNKNOWN_COMMAND_QUOTE_LEN).copied().collect();
    CommandError::UnknownCommand {
        name: String::from_utf8_lossy(&name).into_owned(),
        args: String::from_utf8_lossy(&quoted).into_owned(),
    }
}

/// What a data command runs against: one database at one frozen instant.
struct Exec<'a> {
    store: &'a mut Store,
    db: u32,
    /// Unix ms on the master's clock, the same for a whole command or script.
    now_ms: u64,
    identity: &'a Identity,
}

impl Exec<'_> {
    fn entry(&mut self, key: &[u8]) -> Option<&mut Entry> {
        self.store.get_mut(self.db, key, self.now_ms)
    }

    /// Stores `value`, or deletes the key when its expiry is already past (as Redis does).
    fn write(&mut self, key: &Bytes, value: Bytes, expires_at: Option<i64>) {
        match expires_at {
            Some(at) if at <= self.now() => {
                self.store.remove(self.db, key, self.now_ms);
            }
            _ => {
                let expires_at = expires_at.map(|at| u64::try_from(at).unwrap_or(0));
                let entry = Entry { value, expires_at };
                self.store.insert(self.db, key.clone(), entry, self.now_ms);
            }
        }
    }

    /// Now as Redis computes expiries: signed milliseconds.
    fn now(&self) -> i64 {
        i64::try_from(self.now_ms).unwrap_or(i64::MAX)
    }
}

// ---------------------------------------------------------------------------------------------
// Connection and string commands
// ---------------------------------------------------------------------------------------------

fn ping(_: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    match args {
        [_] => Ok(Reply::status("PONG")),
        [_, message] => Ok(Reply::Bulk(message.clone())),
        _ => Err(CommandError::WrongArity("ping")),
    }
}

fn echo(_: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, message] = args else {
        return Err(CommandError::WrongArity("echo"));
    };
    Ok(Reply::Bulk(message.clone()))
}

fn get(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("get"));
    };
    Ok(value_reply(exec.entry(key).map(|entry| entry.value.clone())))
}

fn value_reply(value: Option<Bytes>) -> Reply {
    value.map_or(Reply::Nil, Reply::Bulk)
}

fn set(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, value, options @ ..] = args else {
        return Err(CommandError::WrongArity("set"));
    };
    let options = SetOptions::parse(options)?;
    let expire_at = match options.expire {
        Some((kind, amount)) => Some(kind.deadline(amount, exec.now(), "set")?),
        None => None,
    };
    let old = exec.entry(key).cloned();
    let old_value = || value_reply(old.as_ref().map(|entry| entry.value.clone()));
    let blocked = match options.condition {
        Some(Condition::Nx) => old.is_some(),
        Some(Condition::Xx) => old.is_none(),
        None => false,
    };
    if blocked {
        return Ok(if options.get { old_value() } else { Reply::Nil });
    }
    let expires_at = match expire_at {
        Some(at) => Some(at),
        None if options.keep_ttl => old
            .as_ref()
            .and_then(|entry| entry.expires_at)
            .map(|at| i64::try_from(at).unwrap_or(i64::MAX)),
        None => None,
    };
    exec.write(key, value.clone(), expires_at);
    Ok(if options.get { old_value() } else { Reply::ok() })
}

/// `NX` or `XX`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Condition {
    Nx,
    Xx,
}

/// The options of `SET` after the value.
#[derive(Default)]
struct SetOptions<'a> {
    condition: Option<Condition>,
    get: bool,
    keep_ttl: bool,
    expire: Option<(ExpireKind, &'a Bytes)>,
}

impl<'a> SetOptions<'a> {
    /// Parses the options in any order and case, rejecting the combinations Redis rejects.
    /// The expire amount is only validated after all options parsed, as in Redis, so a bad
    /// option wins over a bad number.
    fn parse(options: &'a [Bytes]) -> Result<SetOptions<'a>, CommandError> {
        let mut parsed = SetOptions::default();
        let mut options = options.iter();
        while let Some(option) = options.next() {
            if is(option, "nx") && parsed.condition != Some(Condition::Xx) {
                parsed.condition = Some(Condition::Nx);
            } else if is(option, "xx") && parsed.condition != Some(Condition::Nx) {
                parsed.condition = Some(Condition::Xx);
            } else if is(option, "get") {
                parsed.get = true;
            } else if is(option, "keepttl") && parsed.expire.is_none() {
                parsed.keep_ttl = true;
            } else if let Some(kind) = ExpireKind::parse(option) {
                // The same kind twice is fine (the last wins), two different kinds are not.
                let compatible = !parsed.keep_ttl && parsed.expire.is_none_or(|(other, _)| other == kind);
                match options.next() {
                    Some(amount) if compatible => parsed.expire = Some((kind, amount)),
                    _ => return Err(CommandError::Syntax),
                }
            } else {
                return Err(CommandError::Syntax);
            }
        }
        Ok(parsed)
    }
}

/// `EX`, `PX`, `EXAT` or `PXAT`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExpireKind {
    Ex,
    Px,
    ExAt,
    PxAt,
}

impl ExpireKind {
    fn parse(option: &[u8]) -> Option<ExpireKind> {
        [
            ("ex", ExpireKind::Ex),
            ("px", ExpireKind::Px),
            ("exat", ExpireKind::ExAt),
            ("pxat", ExpireKind::PxAt),
        ]
        .into_iter()
        .find_map(|(name, kind)| is(option, name).then_some(kind))
    }

    /// The absolute expiry (Unix ms) that `amount` means, checked like Redis checks it:
    /// positive, and without overflow once in milliseconds.
    fn deadline(self, amount: &[u8], now: i64, command: &'static str) -> Result<i64, CommandError> {
        let amount = parse_i64(amount)?;
        let invalid = CommandError::InvalidExpireTime(command);
        if amount <= 0 {
            return Err(invalid);
        }
        let ms = match self {
            ExpireKind::Ex | ExpireKind::ExAt => amount.checked_mul(1000).ok_or(invalid.clone())?,
            ExpireKind::Px | ExpireKind::PxAt => amount,
        };
        match self {
            ExpireKind::Ex | ExpireKind::Px => ms.checked_add(now).ok_or(invalid),
            ExpireKind::ExAt | ExpireKind::PxAt => Ok(ms),
        }
    }
}

fn setnx(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, value] = args else {
        return Err(CommandError::WrongArity("setnx"));
    };
    if exec.entry(key).is_some() {
        return Ok(Reply::Int(0));
    }
    exec.write(key, value.clone(), None);
    Ok(Reply::Int(1))
}

fn getset(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, value] = args else {
        return Err(CommandError::WrongArity("getset"));
    };
    let old = exec.entry(key).map(|entry| entry.value.clone());
    exec.write(key, value.clone(), None);
    Ok(value_reply(old))
}

/// `DEL` and `UNLINK`: the number of keys that existed.
fn del(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let (db, now_ms) = (exec.db, exec.now_ms);
    let removed = args
        .iter()
        .skip(1)
        .filter(|key| exec.store.remove(db, key, now_ms).is_some())
        .count();
    Ok(count_reply(removed))
}

/// `EXISTS`: a key named twice counts twice, as in Redis.
fn exists(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let (db, now_ms) = (exec.db, exec.now_ms);
    let found = args
        .iter()
        .skip(1)
        .filter(|key| exec.store.contains(db, key, now_ms))
        .count();
    Ok(count_reply(found))
}

fn count_reply(count: usize) -> Reply {
    Reply::Int(i64::try_from(count).unwrap_or(i64::MAX))
}

fn incr(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("incr"));
    };
    incr_by(exec, key, 1)
}

fn decr(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("decr"));
    };
    incr_by(exec, key, -1)
}

fn incrby(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, delta] = args else {
        return Err(CommandError::WrongArity("incrby"));
    };
    incr_by(exec, key, parse_i64(delta)?)
}

fn decrby(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, delta] = args else {
        return Err(CommandError::WrongArity("decrby"));
    };
    let delta = parse_i64(delta)?.checked_neg().ok_or(CommandError::DecrementOverflow)?;
    incr_by(exec, key, delta)
}

/// Adds `delta` to the integer at `key` (0 if missing), keeping its expiry as Redis does.
fn incr_by(exec: &mut Exec<'_>, key: &Bytes, delta: i64) -> CommandResult {
    let (value, expires_at) = match exec.entry(key) {
        Some(entry) => (parse_i64(&entry.value)?, entry.expires_at),
        None => (0, None),
    };
    let value = value.checked_add(delta).ok_or(CommandError::Overflow)?;
    let entry = Entry {
        value: int_bytes(value),
        expires_at,
    };
    exec.store.insert(exec.db, key.clone(), entry, exec.now_ms);
    Ok(Reply::Int(value))
}

// ---------------------------------------------------------------------------------------------
// Expiry commands
// ---------------------------------------------------------------------------------------------

/// Whether an `EXPIRE` amount is relative to now or a Unix timestamp.
#[derive(Clone, Copy)]
enum Base {
    Now,
    Epoch,
}

/// Whether an amount is in seconds or milliseconds.
#[derive(Clone, Copy)]
enum Unit {
    Seconds,
    Millis,
}

fn pexpire(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    expire_generic(exec, args, Base::Now, Unit::Millis, "pexpire")
}

fn expire(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    expire_generic(exec, args, Base::Now, Unit::Seconds, "expire")
}

fn pexpireat(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    expire_generic(exec, args, Base::Epoch, Unit::Millis, "pexpireat")
}

fn expireat(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    expire_generic(exec, args, Base::Epoch, Unit::Seconds, "expireat")
}

/// The four `EXPIRE` commands. Unlike `SET`, they accept zero and negative amounts: an expiry
/// that is already past deletes the key.
fn expire_generic(exec: &mut Exec<'_>, args: &[Bytes], base: Base, unit: Unit, command: &'static str) -> CommandResult {
    let [_, key, amount, options @ ..] = args else {
        return Err(CommandError::WrongArity(command));
    };
    let flags = ExpireFlags::parse(options)?;
    let invalid = CommandError::InvalidExpireTime(command);
    let amount = parse_i64(amount)?;
    let ms = match unit {
        Unit::Seconds => amount.checked_mul(1000).ok_or(invalid.clone())?,
        Unit::Millis => amount,
    };
    let at = match base {
        Base::Now => ms.checked_add(exec.now()).ok_or(invalid)?,
        Base::Epoch => ms,
    };
    let now = exec.now();
    let Some(entry) = exec.entry(key) else {
        return Ok(Reply::Int(0));
    };
    let current = entry.expires_at.map(|at| i64::try_from(at).unwrap_or(i64::MAX));
    if !flags.allow(current, at) {
        return Ok(Reply::Int(0));
    }
    if at <= now {
        exec.store.remove(exec.db, key, exec.now_ms);
    } else {
        entry.expires_at = Some(u64::try_from(at).unwrap_or(0));
    }
    Ok(Reply::Int(1))
}

/// The `NX | XX | GT | LT` conditions of the `EXPIRE` commands.
#[derive(Default)]
struct ExpireFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

impl ExpireFlags {
    fn parse(options: &[Bytes]) -> Result<ExpireFlags, CommandError> {
        let mut flags = ExpireFlags::default();
        for option in options {
            let flag = match () {
                () if is(option, "nx") => &mut flags.nx,
                () if is(option, "xx") => &mut flags.xx,
                () if is(option, "gt") => &mut flags.gt,
                () if is(option, "lt") => &mut flags.lt,
                () => {
                    let option = String::from_utf8_lossy(option).into_owned();
                    return Err(CommandError::UnsupportedOption(option));
                }
            };
            *flag = true;
        }
        if flags.nx && (flags.xx || flags.gt || flags.lt) {
            return Err(CommandError::ExpireNxConflict);
        }
        if flags.gt && flags.lt {
            return Err(CommandError::ExpireGtLtConflict);
        }
        Ok(flags)
    }

    /// Whether the new expiry `at` may replace `current` (`None`: the key never expires,
    /// which counts as an infinite TTL for `GT` and `LT`).
    fn allow(&self, current: Option<i64>, at: i64) -> bool {
        (!self.nx || current.is_none())
            && (!self.xx || current.is_some())
            && (!self.gt || current.is_some_and(|current| at > current))
            && (!self.lt || current.is_none_or(|current| at < current))
    }
}

fn pttl(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    ttl_generic(exec, args, Unit::Millis, "pttl")
}

fn ttl(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    ttl_generic(exec, args, Unit::Seconds, "ttl")
}

/// `-2` for a missing key, `-1` for a key without expiry, else the time left; seconds are
/// rounded to the nearest, as Redis does.
fn ttl_generic(exec: &mut Exec<'_>, args: &[Bytes], unit: Unit, command: &'static str) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity(command));
    };
    let now_ms = exec.now_ms;
    let Some(entry) = exec.entry(key) else {
        return Ok(Reply::Int(-2));
    };
    let Some(at) = entry.expires_at else {
        return Ok(Reply::Int(-1));
    };
    let left = i64::try_from(at.saturating_sub(now_ms)).unwrap_or(i64::MAX);
    Ok(Reply::Int(match unit {
        Unit::Millis => left,
        Unit::Seconds => left.saturating_add(500) / 1000,
    }))
}

fn persist(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("persist"));
    };
    let removed = exec.entry(key).and_then(|entry| entry.expires_at.take()).is_some();
    Ok(Reply::Int(i64::from(removed)))
}

// ---------------------------------------------------------------------------------------------
// Server commands
// ---------------------------------------------------------------------------------------------

fn flushdb(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    check_flush_mode(args)?;
    exec.store.flush_db(exec.db);
    Ok(Reply::ok())
}

fn flushall(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    check_flush_mode(args)?;
    exec.store.flush_all();
    Ok(Reply::ok())
}

/// `FLUSHDB` and `FLUSHALL` take an optional `SYNC` or `ASYNC` (both mean the same here).
fn check_flush_mode(args: &[Bytes]) -> Result<(), CommandError> {
    match args {
        [_] => Ok(()),
        [_, mode] if is(mode, "sync") || is(mode, "async") => Ok(()),
        _ => Err(CommandError::Syntax),
    }
}

/// `SCAN cursor [MATCH pattern] [COUNT n]`: every matching key in one batch (cursor `0`).
/// Redis may return any number of keys per call; returning them all at once is allowed.
fn scan(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    parse_i64(&args[1]).map_err(|_| CommandError::InvalidCursor)?;
    let mut pattern: &[u8] = b"*";
    let mut options = args[2..].chunks(2);
    for option in options.by_ref() {
        match option {
            [name, value] if is(name, "match") => pattern = value,
            [name, value] if is(name, "count") => {
                parse_i64(value)?;
            }
            _ => return Err(CommandError::Syntax),
        }
    }
    let keys = exec.store.keys(exec.db, pattern, exec.now_ms);
    Ok(Reply::Array(vec![
        Reply::Bulk(Bytes::from_static(b"0")),
        Reply::Array(keys.into_iter().map(Reply::Bulk).collect()),
    ]))
}

fn dbsize(exec: &mut Exec<'_>, _: &[Bytes]) -> CommandResult {
    Ok(count_reply(exec.store.len(exec.db, exec.now_ms)))
}

fn role(_: &mut Exec<'_>, _: &[Bytes]) -> CommandResult {
    Ok(Reply::Array(vec![
        Reply::bulk("master"),
        Reply::Int(0),
        Reply::Array(Vec::new()),
    ]))
}

type InfoSection = fn(&mut Exec<'_>, &mut String);

/// The sections of `INFO`, in Redis' order.
const INFO_SECTIONS: &[(&str, InfoSection)] = &[
    ("server", info_server),
    ("replication", info_replication),
    ("cluster", info_cluster),
    ("keyspace", info_keyspace),
];

/// `INFO [section ...]`: no section, `default`, `all` or `everything` mean every section.
fn info(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let wanted = args.get(1..).unwrap_or_default();
    let everything = wanted.is_empty()
        || wanted
            .iter()
            .any(|name| is(name, "default") || is(name, "all") || is(name, "everything"));
    let mut text = String::new();
    for (name, write) in INFO_SECTIONS {
        if everything || wanted.iter().any(|wanted| is(wanted, name)) {
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            write(exec, &mut text);
        }
    }
    Ok(Reply::Bulk(Bytes::from(text)))
}

/// Writes one `name:value` line of `INFO`.
fn info_field(out: &mut String, name: &str, value: impl fmt::Display) {
    // Writing to a String can't fail.
    let _ = write!(out, "{name}:{value}\r\n");
}

fn info_server(exec: &mut Exec<'_>, out: &mut String) {
    let uptime_ms = exec.now_ms.saturating_sub(exec.identity.started_at_ms);
    out.push_str("# Server\r\n");
    info_field(out, "redis_version", REDIS_VERSION);
    info_field(out, "redis_git_sha1", "00000000");
    info_field(out, "redis_git_dirty", 0);
    info_field(out, "redis_mode", "standalone");
    info_field(out, "arch_bits", 64);
    info_field(out, "process_id", std::process::id());
    info_field(out, "run_id", &exec.identity.run_id);
    info_field(out, "tcp_port", 0);
    info_field(out, "uptime_in_seconds", uptime_ms / 1000);
    info_field(out, "uptime_in_days", uptime_ms / 86_400_000);
    info_field(out, "uptime_in_milliseconds", uptime_ms);
}

fn info_replication(exec: &mut Exec<'_>, out: &mut String) {
    out.push_str("# Replication\r\n");
    info_field(out, "role", "master");
    info_field(out, "connected_slaves", 0);
    info_field(out, "master_failover_state", "no-failover");
    info_field(out, "master_replid", &exec.identity.replid);
    info_field(out, "master_replid2", "0".repeat(40));
    info_field(out, "master_repl_offset", 0);
    info_field(out, "second_repl_offset", -1);
    info_field(out, "repl_backlog_active", 0);
}

fn info_cluster(_: &mut Exec<'_>, out: &mut String) {
    out.push_str("# Cluster\r\n");
    info_field(out, "cluster_enabled", 0);
}

fn info_keyspace(exec: &mut Exec<'_>, out: &mut String) {
    out.push_str("# Keyspace\r\n");
    for stats in exec.store.stats(exec.now_ms) {
        let value = format!("keys={},expires={},avg_ttl=0", stats.keys, stats.expires);
        info_field(out, &format!("db{}", stats.db), value);
    }
}

// ---------------------------------------------------------------------------------------------
// Scripting commands
// ---------------------------------------------------------------------------------------------

fn eval(inner: &mut Inner, db: u32, now_ms: u64, args: &[Bytes]) -> CommandResult {
    let [_, body, numkeys, rest @ ..] = args else {
        return Err(CommandError::WrongArity("eval"));
    };
    let (keys, argv) = split_keys(numkeys, rest)?;
    let sha = sha1_hex(body);
    let engine = engine(&mut inner.scripting)?;
    let function = engine.compile(&sha, body)?;
    let call = ScriptCall {
        sha,
        keys,
        argv,
        db,
        now_ms,
        identity: &inner.identity,
        time_limit: inner.script_time_limit,
    };
    engine.run(&function, call, &mut inner.store)
}

fn evalsha(inner: &mut Inner, db: u32, now_ms: u64, args: &[Bytes]) -> CommandResult {
    let [_, sha, numkeys, rest @ ..] = args else {
        return Err(CommandError::WrongArity("evalsha"));
    };
    let (keys, argv) = split_keys(numkeys, rest)?;
    let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
    let engine = inner.scripting.as_mut().ok_or(CommandError::NoScript)?;
    let function = engine.cached(&sha).ok_or(CommandError::NoScript)?;
    let call = ScriptCall {
        sha,
        keys,
        argv,
        db,
        now_ms,
        identity: &inner.identity,
        time_limit: inner.script_time_limit,
    };
    engine.run(&function, call, &mut inner.store)
}

/// `numkeys` splits the arguments after it into `KEYS` and `ARGV`.
fn split_keys<'a>(numkeys: &[u8], rest: &'a [Bytes]) -> Result<(&'a [Bytes], &'a [Bytes]), CommandError> {
    let numkeys = parse_i64(numkeys)?;
    if numkeys < 0 {
        return Err(CommandError::NegativeKeys);
    }
    usize::try_from(numkeys)
        .ok()
        .and_then(|numkeys| rest.split_at_checked(numkeys))
        .ok_or(CommandError::TooManyKeys)
}

/// `SCRIPT LOAD | EXISTS | FLUSH | KILL`.
fn script(inner: &mut Inner, _: u32, _: u64, args: &[Bytes]) -> CommandResult {
    let [_, subcommand, rest @ ..] = args else {
        return Err(CommandError::WrongArity("script"));
    };
    if is(subcommand, "load") {
        let [body] = rest else {
            return Err(CommandError::WrongArity("script|load"));
        };
        let sha = sha1_hex(body);
        engine(&mut inner.scripting)?.compile(&sha, body)?;
        Ok(Reply::Bulk(Bytes::from(sha)))
    } else if is(subcommand, "exists") {
        if rest.is_empty() {
            return Err(CommandError::WrongArity("script|exists"));
        }
        let exists = |sha: &Bytes| {
            let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
            let cached = inner
                .scripting
                .as_ref()
                .is_some_and(|engine| engine.scripts.contains_key(&sha));
            Reply::Int(i64::from(cached))
        };
        Ok(Reply::Array(rest.iter().map(exists).collect()))
    } else if is(subcommand, "flush") {
        match rest {
            [] => {}
            [mode] if is(mode, "sync") || is(mode, "async") => {}
            _ => return Err(CommandError::FlushOption),
        }
        // Like Redis, a flush also throws the Lua state away, with any globals scripts left.
        inner.scripting = None;
        Ok(Reply::ok())
    } else if is(subcommand, "kill") {
        if !rest.is_empty() {
            return Err(CommandError::WrongArity("script|kill"));
        }
        // Scripts run under the backend's lock: when this command gets to run, none is.
        Err(CommandError::NotBusy)
    } else {
        Err(CommandError::UnknownSubcommand {
            command: "SCRIPT",
            subcommand: String::from_utf8_lossy(subcommand).into_owned(),
        })
    }
}

/// The Lua engine, created on first use.
fn engine(slot: &mut Option<ScriptEngine>) -> Result<&mut ScriptEngine, CommandError> {
    let engine = match slot.take() {
        Some(engine) => engine,
        None => ScriptEngine::new().map_err(CommandError::lua)?,
    };
    Ok(slot.insert(engine))
}

// ---------------------------------------------------------------------------------------------
// The Lua engine
// ---------------------------------------------------------------------------------------------

/// Lua code run once per state, after the Rust helpers are installed. Besides the `redis`
/// helpers that are easier said in Lua, it makes the sandbox: no file access, no bytecode
/// loading (malicious bytecode can corrupt a Lua 5.1 VM), and `pcall`/`xpcall` that hand a
/// script the `{err = ...}` table for an error `redis.call` raised, as Redis 7 does.
const PRELUDE: &str = r#"
local as_error_table = redis.__as_error_table
redis.__as_error_table = nil
redis.log = function() end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
redis.replicate_commands = function() return true end
redis.set_repl = function() end
redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE, redis.REPL_REPLICA, redis.REPL_ALL = 0, 1, 2, 2, 3
redis.breakpoint = function() return false end
redis.debug = function() end
redis.REDIS_VERSION = "7.0.0"
redis.REDIS_VERSION_NUM = 0x070000

local raw_pcall, raw_xpcall = pcall, xpcall
local function settle(ok, ...)
    if ok then return ok, ... end
    return ok, as_error_table((...))
end
pcall = function(...)
    return settle(raw_pcall(...))
end
xpcall = function(f, handler, ...)
    return raw_xpcall(f, function(e) return handler(as_error_table(e)) end, ...)
end

local loadstring_, concat, byte, type = loadstring, table.concat, string.byte, type
loadstring = function(source, name)
    if type(source) == "string" and byte(source, 1) == 27 then
        return nil, "loading bytecode is not allowed"
    end
    return loadstring_(source, name)
end
load = function(reader, name)
    if type(reader) ~= "function" then
        return nil, "bad argument #1 to 'load' (function expected)"
    end
    local parts = {}
    while true do
        local part = reader()
        if part == nil or part == "" then break end
        parts[#parts + 1] = part
    end
    return loadstring(concat(parts), name)
end
-- newproxy makes userdata with __gc, whose finalizer could run outside any script's watchdog.
loadfile, dofile, newproxy = nil, nil, nil
print = function() end
"#;

/// An error reply raised into a script by `redis.call` (or by the watchdog and helpers).
///
/// `redis.call` is a Rust function rather than a Lua wrapper around `redis.pcall` so that
/// `return redis.call(...)`, a tail call, keeps the script's frame on the stack and the error
/// can name its line. mlua only lets Rust raise Rust errors, not Lua tables, so the reply
/// travels as this type; [`script_error`] and the sandbox's `pcall`/`xpcall` turn it back
/// into Redis' `{err = ...}` table.
#[derive(Debug, thiserror::Error)]
#[error("{}", String::from_utf8_lossy(.0))]
struct RaisedReply(Bytes);

/// One Lua state with its cache of compiled scripts, by lowercase SHA1.
struct ScriptEngine {
    lua: Lua,
    scripts: HashMap<String, Function>,
    /// Lua's `xpcall`, through which every script runs so that [`script_error`] sees errors
    /// before the stack unwinds and can tell the line, as Redis' error handler does.
    xpcall: Function,
    error_handler: Function,
}

/// What one `EVAL` or `EVALSHA` runs with.
struct ScriptCall<'a> {
    sha: String,
    keys: &'a [Bytes],
    argv: &'a [Bytes],
    db: u32,
    now_ms: u64,
    identity: &'a Identity,
    time_limit: Duration,
}

/// The state of the running script, lent to Lua as app data so that `redis.pcall`, the
/// watchdog and the error handler can reach it. The store is moved in for the run and back
/// out after it.
struct ScriptRun {
    store: Store,
    db: u32,
    now_ms: u64,
    identity: Identity,
    sha: String,
    time_limit: Duration,
    /// `None` if the deadline is too far away to represent.
    deadline: Option<Instant>,
    killed: bool,
}

impl ScriptRun {
    /// Runs a command from `redis.call` or `redis.pcall`, with the errors Redis gives scripts.
    fn call(&mut self, args: &[Bytes]) -> Reply {
        let Some(command) = args.first().and_then(|name| lookup(name)) else {
            return CommandError::UnknownFromScript.into();
        };
        if !command.accepts(args.len()) {
            return CommandError::ArityFromScript.into();
        }
        let Handler::Data(run) = command.handler else {
            return CommandError::NotAllowedFromScript.into();
        };
        let mut exec = Exec {
            store: &mut self.store,
            db: self.db,
            now_ms: self.now_ms,
            identity: &self.identity,
        };
        run(&mut exec, args).unwrap_or_else(Reply::from)
    }
}

impl ScriptEngine {
    /// A fresh state with only the safe libraries (base, table, string, math), the `redis`
    /// table, a memory cap and the watchdog hook.
    fn new() -> mlua::Result<ScriptEngine> {
        let lua = Lua::new_with(StdLib::TABLE | StdLib::STRING | StdLib::MATH, LuaOptions::default())?;
        lua.set_memory_limit(LUA_MEMORY_LIMIT)?;
        // Captured before the prelude wraps it: the engine's own error handler reads raised
        // replies directly.
        let xpcall = lua.globals().get("xpcall")?;
        let redis = lua.create_table()?;
        redis.set("call", lua.create_function(redis_call)?)?;
        redis.set("pcall", lua.create_function(redis_pcall)?)?;
        redis.set("__as_error_table", lua.create_function(as_error_table)?)?;
        redis.set("error_reply", lua.create_function(redis_error_reply)?)?;
        redis.set("status_reply", lua.create_function(redis_status_reply)?)?;
        redis.set("sha1hex", lua.create_function(redis_sha1hex)?)?;
        lua.globals().set("redis", redis)?;
        lua.load(PRELUDE).set_name("=redis_prelude").exec()?;
        lua.set_global_hook(watchdog_triggers(), watchdog)?;
        Ok(ScriptEngine {
            xpcall,
            error_handler: lua.create_function(script_error)?,
            lua,
            scripts: HashMap::new(),
        })
    }

    fn cached(&self, sha: &str) -> Option<Function> {
        self.scripts.get(sha).cloned()
    }

    /// The compiled script, compiling and caching it on first sight.
    fn compile(&mut self, sha: &str, body: &[u8]) -> Result<Function, CommandError> {
        if let Some(function) = self.cached(sha) {
            return Ok(function);
        }
        let function = self
            .lua
            .load(body)
            .set_name(SCRIPT_CHUNK_NAME)
            .set_mode(ChunkMode::Text)
            .into_function()
            .map_err(|error| CommandError::Compile(lua_error_message(&error)))?;
        self.scripts.insert(sha.to_owned(), function.clone());
        Ok(function)
    }

    /// Runs a compiled script against `store` and converts what it returns.
    fn run(&mut self, function: &Function, call: ScriptCall<'_>, store: &mut Store) -> CommandResult {
        self.set_arguments(call.keys, call.argv).map_err(CommandError::lua)?;
        let run = ScriptRun {
            store: std::mem::take(store),
            db: call.db,
            now_ms: call.now_ms,
            identity: call.identity.clone(),
            sha: call.sha,
            time_limit: call.time_limit,
            deadline: Instant::now().checked_add(call.time_limit),
            killed: false,
        };
        if let Err(run) = self.lua.try_set_app_data(run) {
            *store = run.store;
            return Err(CommandError::EngineBusy);
        }
        let outcome = self.xpcall.call::<MultiValue>((function, &self.error_handler));
        let Some(run) = self.lua.remove_app_data::<ScriptRun>() else {
            return Err(CommandError::KeyspaceLost);
        };
        *store = run.store;
        // Lua 5.1 has no emergency collection: the garbage of a big script would make the
        // next allocations fail against the memory cap, so collect it now.
        if self.lua.used_memory() > LUA_MEMORY_LIMIT / 4 {
            let _ = self.lua.gc_collect();
        }
        if run.killed {
            // Back from the every-instruction hook of a kill to the cheap one. Should that fail,
            // the strict hook stays, which is slower but still correct.
            let _ = self.lua.set_global_hook(watchdog_triggers(), watchdog);
            return Err(CommandError::ScriptKilled(call.time_limit.as_millis()));
        }
        script_outcome(outcome.map_err(CommandError::lua)?)
    }

    /// Sets the `KEYS` and `ARGV` globals for one run.
    fn set_arguments(&self, keys: &[Bytes], argv: &[Bytes]) -> mlua::Result<()> {
        let globals = self.lua.globals();
        globals.raw_set("KEYS", self.string_table(keys)?)?;
        globals.raw_set("ARGV", self.string_table(argv)?)
    }

    fn string_table(&self, items: &[Bytes]) -> mlua::Result<Table> {
        let table = self.lua.create_table_with_capacity(items.len(), 0)?;
        for (index, item) in items.iter().enumerate() {
            table.raw_set(index + 1, self.lua.create_string(item)?)?;
        }
        Ok(table)
    }
}

/// What `xpcall` returned: `true` and the script's first result, or `false` and the message
/// [`script_error`] made.
fn script_outcome(outcome: MultiValue) -> CommandResult {
    let mut values = outcome.into_iter();
    match (values.next(), values.next()) {
        (Some(Value::Boolean(true)), result) => Ok(ReplyBuilder::new().reply(&result.unwrap_or(Value::Nil))),
        (_, Some(Value::String(message))) => Ok(Reply::Error(lua_bytes(&message))),
        _ => Err(CommandError::NoOutcome),
    }
}

/// The watchdog fires every [`WATCHDOG_INTERVAL`] instructions.
fn watchdog_triggers() -> HookTriggers {
    HookTriggers::new().every_nth_instruction(WATCHDOG_INTERVAL)
}

/// Kills the running script once its deadline passed. The hook is global so that coroutines
/// the script creates are watched too. After a kill it fires on every instruction, so that a
/// script catching the error with `pcall` can't run a single instruction more.
fn watchdog(lua: &Lua, _: &LuaDebug<'_>) -> mlua::Result<VmState> {
    let Ok(Some(mut run)) = lua.try_app_data_mut::<ScriptRun>() else {
        return Ok(VmState::Continue);
    };
    let limit_ms = run.time_limit.as_millis();
    if !run.killed {
        if run.deadline.is_none_or(|deadline| Instant::now() < deadline) {
            return Ok(VmState::Continue);
        }
        run.killed = true;
        drop(run);
        lua.set_global_hook(HookTriggers::new().every_nth_instruction(1), watchdog)?;
    }
    Err(raise(CommandError::ScriptKilled(limit_ms)))
}

/// Lua's error handler for scripts: turns any error value into Redis 7's error text, with the
/// script line it was raised on (`... script: <sha>, on @user_script:<line>.`).
fn script_error(lua: &Lua, error: Value) -> mlua::Result<LuaString> {
    let mut text = match &error {
        Value::Table(table) => match table.raw_get::<Value>("err") {
            Ok(Value::String(message)) => lua_bytes(&message).to_vec(),
            _ => b"ERR unknown error".to_vec(),
        },
        Value::String(message) => [&b"ERR "[..], &message.as_bytes()].concat(),
        Value::Error(error) => match error.downcast_ref::<RaisedReply>() {
            Some(raised) => raised.0.to_vec(),
            None => format!("ERR {}", lua_error_message(error)).into_bytes(),
        },
        other => format!("ERR {}", other.to_string().unwrap_or_default()).into_bytes(),
    };
    let sha = lua
        .try_app_data_ref::<ScriptRun>()
        .ok()
        .flatten()
        .map(|run| run.sha.clone());
    if let (Some(sha), Some(line)) = (sha, script_line(lua)) {
        text.extend_from_slice(format!(" script: {sha}, on {SCRIPT_CHUNK_NAME}:{line}.").as_bytes());
    }
    lua.create_string(text)
}

/// The line of the innermost script frame on the stack, skipping `error`, the Rust helpers
/// and the prelude.
fn script_line(lua: &Lua) -> Option<usize> {
    for level in 1..=MAX_STACK_SCAN {
        // `None`: the stack ended without a script frame.
        let line = lua.inspect_stack(level, |frame| {
            let in_script = frame.source().source.as_deref() == Some(SCRIPT_CHUNK_NAME);
            in_script.then(|| frame.current_line()).flatten()
        })?;
        if line.is_some() {
            return line;
        }
    }
    None
}

/// `redis.call`: runs a command; an error reply aborts the script (unless it is caught).
fn redis_call(lua: &Lua, args: Variadic<Value>) -> mlua::Result<Value> {
    match script_command(lua, &args) {
        Reply::Error(text) => {
            let raised = RaisedReply(Bytes::from(normalize_error(&text)));
            Err(mlua::Error::external(raised))
        }
        reply => reply_to_lua(lua, &reply),
    }
}

/// Raises one of our errors into the script, as `redis.call` raises a command's error.
fn raise(error: CommandError) -> mlua::Error {
    mlua::Error::external(RaisedReply(Bytes::from(error.to_string())))
}

/// `redis.pcall`: runs a command, returning errors as `{err = ...}` tables instead of raising.
fn redis_pcall(lua: &Lua, args: Variadic<Value>) -> mlua::Result<Value> {
    reply_to_lua(lua, &script_command(lua, &args))
}

/// Runs the command a script asked for against the running script's keyspace.
fn script_command(lua: &Lua, args: &[Value]) -> Reply {
    match command_args(args) {
        Ok(args) => match lua.try_app_data_mut::<ScriptRun>() {
            Ok(Some(mut run)) => run.call(&args),
            _ => CommandError::NoRunningScript.into(),
        },
        Err(error) => error.into(),
    }
}

/// An error value as a script should see it: a raised reply becomes its `{err = ...}` table,
/// anything else is left alone.
fn as_error_table(lua: &Lua, value: Value) -> mlua::Result<Value> {
    if let Value::Error(error) = &value
        && let Some(raised) = error.downcast_ref::<RaisedReply>()
    {
        return Ok(Value::Table(error_table(lua, &raised.0)?));
    }
    Ok(value)
}

/// The arguments of `redis.call`: strings, or numbers that Redis turns into strings.
fn command_args(args: &[Value]) -> Result<Vec<Bytes>, CommandError> {
    if args.is_empty() {
        return Err(CommandError::NoScriptArguments);
    }
    args.iter()
        .map(|arg| lua_string_value(arg).ok_or(CommandError::BadScriptArgument))
        .collect()
}

/// A Lua value as a string, when Lua itself would treat it as one (strings and numbers).
fn lua_string_value(value: &Value) -> Option<Bytes> {
    match value {
        Value::String(s) => Some(lua_bytes(s)),
        Value::Integer(i) => Some(int_bytes(*i)),
        Value::Number(n) => Some(Bytes::from(format_number(*n))),
        _ => None,
    }
}

/// Formats a Lua number for a command argument: integral values without a fraction (so
/// `ARGV[2] + pttl` gives `30000`, not `30000.0`), others in their shortest exact form.
fn format_number(n: f64) -> String {
    // 2^63: every integral f64 below it in magnitude fits an i64.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if n.fract() == 0.0 && n.abs() < LIMIT {
        (n as i64).to_string()
    } else {
        n.to_string()
    }
}

/// `redis.error_reply(msg)`: `{err = msg}`, with `ERR ` added when msg has no error code.
fn redis_error_reply(lua: &Lua, args: Variadic<Value>) -> mlua::Result<Table> {
    match args.as_slice() {
        [message] => match lua_string_value(message) {
            Some(message) => error_table(lua, &normalize_error(&message)),
            None => error_table(lua, &bad_helper_arguments()),
        },
        _ => error_table(lua, &bad_helper_arguments()),
    }
}

/// `redis.status_reply(msg)`: `{ok = msg}`.
fn redis_status_reply(lua: &Lua, args: Variadic<Value>) -> mlua::Result<Table> {
    let [message] = args.as_slice() else {
        return error_table(lua, &bad_helper_arguments());
    };
    let Some(message) = lua_string_value(message) else {
        return error_table(lua, &bad_helper_arguments());
    };
    let table = lua.create_table()?;
    table.raw_set("ok", lua.create_string(&message)?)?;
    Ok(table)
}

fn bad_helper_arguments() -> Vec<u8> {
    CommandError::BadHelperArguments.to_string().into_bytes()
}

/// `redis.sha1hex(s)`: the lowercase hex SHA1 of a string (of nothing for other values).
fn redis_sha1hex(_: &Lua, args: Variadic<Value>) -> mlua::Result<String> {
    let [value] = args.as_slice() else {
        return Err(raise(CommandError::HelperArity));
    };
    Ok(sha1_hex(&lua_string_value(value).unwrap_or_default()))
}

/// Redis' normal form of a script error: a leading `-` dropped, `ERR ` added when the text has
/// no code (no space), line breaks at the ends trimmed.
fn normalize_error(message: &[u8]) -> Vec<u8> {
    let message = message.strip_prefix(b"-").unwrap_or(message);
    let is_break = |b: &u8| *b == b'\r' || *b == b'\n';
    let start = message.iter().position(|b| !is_break(b)).unwrap_or(message.len());
    let end = message.iter().rposition(|b| !is_break(b)).map_or(start, |end| end + 1);
    let message = message.get(start..end).unwrap_or_default();
    if message.contains(&b' ') {
        message.to_vec()
    } else {
        [&b"ERR "[..], message].concat()
    }
}

fn error_table(lua: &Lua, message: &[u8]) -> mlua::Result<Table> {
    let table = lua.create_table()?;
    table.raw_set("err", lua.create_string(message)?)?;
    Ok(table)
}

/// Redis → Lua, as the Redis docs define it: integer → number, bulk → string, nil → false,
/// array → table, status → `{ok = ...}`, error → `{err = ...}`.
fn reply_to_lua(lua: &Lua, reply: &Reply) -> mlua::Result<Value> {
    Ok(match reply {
        Reply::Int(i) => Value::Integer(*i),
        Reply::Bulk(data) => Value::String(lua.create_string(data)?),
        Reply::Nil | Reply::NilArray => Value::Boolean(false),
        Reply::Status(text) => {
            let table = lua.create_table()?;
            table.raw_set("ok", lua.create_string(text)?)?;
            Value::Table(table)
        }
        Reply::Error(text) => Value::Table(error_table(lua, &normalize_error(text))?),
        Reply::Array(items) | Reply::Push(items) => Value::Table(lua_array(lua, items.iter())?),
        Reply::Map(pairs) => {
            let flat = pairs.iter().flat_map(|(key, value)| [key, value]);
            Value::Table(lua_array(lua, flat)?)
        }
        // RESP2 forms, which is what a script sees.
        Reply::Double(d) => Value::String(lua.create_string(format_number(*d))?),
        Reply::Bool(b) => Value::Integer(i64::from(*b)),
    })
}

fn lua_array<'a>(lua: &Lua, items: impl Iterator<Item = &'a Reply>) -> mlua::Result<Table> {
    let table = lua.create_table()?;
    for (index, item) in items.enumerate() {
        table.raw_set(index + 1, reply_to_lua(lua, item)?)?;
    }
    Ok(table)
}

/// Lua → Redis, as the Redis docs define it, within a budget of values so that no table can
/// make the conversion run away.
struct ReplyBuilder {
    values_left: usize,
    /// Set when a value had to be left out for lack of budget.
    overflowed: bool,
}

impl ReplyBuilder {
    fn new() -> ReplyBuilder {
        ReplyBuilder {
            values_left: MAX_REPLY_VALUES,
            overflowed: false,
        }
    }

    /// The reply for a script's result, or an error if it was too large.
    fn reply(mut self, value: &Value) -> Reply {
        let reply = self.convert(value, 0);
        if self.overflowed {
            return CommandError::ReplyTooLarge.into();
        }
        reply
    }

    /// number → integer (truncated toward zero), string → bulk, `{ok=}` → status, `{err=}` →
    /// error, other table → array up to its first nil, false → nil, true → 1, anything else
    /// → nil.
    fn convert(&mut self, value: &Value, depth: usize) -> Reply {
        match value {
            Value::Boolean(true) => Reply::Int(1),
            Value::Integer(i) => Reply::Int(*i),
            // `as` truncates toward zero and saturates; NaN becomes 0.
            Value::Number(n) => Reply::Int(*n as i64),
            Value::String(s) => Reply::Bulk(lua_bytes(s)),
            Value::Table(table) => self.table(table, depth),
            _ => Reply::Nil,
        }
    }

    fn table(&mut self, table: &Table, depth: usize) -> Reply {
        if depth >= MAX_REPLY_DEPTH {
            return CommandError::LuaStackLimit.into();
        }
        if let Ok(Value::String(message)) = table.raw_get::<Value>("err") {
            return Reply::Error(lua_bytes(&message));
        }
        if let Ok(Value::String(status)) = table.raw_get::<Value>("ok") {
            return Reply::Status(lua_bytes(&status));
        }
        let mut items = Vec::new();
        for index in 1_i64.. {
            let item = match table.raw_get::<Value>(index) {
                Ok(Value::Nil) | Err(_) => break,
                Ok(item) => item,
            };
            if self.values_left == 0 {
                self.overflowed = true;
                break;
            }
            self.values_left -= 1;
            items.push(self.convert(&item, depth + 1));
        }
        Reply::Array(items)
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// Unix ms at the test clock's origin, so absolute expiries are predictable.
    const ORIGIN_MS: u64 = 1_700_000_000_000;

    /// A clock that only moves when told to.
    #[derive(Default)]
    struct ManualClock {
        ms: AtomicU64,
    }

    impl ManualClock {
        fn advance(&self, ms: u64) {
            self.ms.fetch_add(ms, Ordering::SeqCst);
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Duration {
            Duration::from_millis(self.ms.load(Ordering::SeqCst))
        }
    }

    fn backend() -> (EmbeddedBackend, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::default());
        let backend = EmbeddedBackend::with_origin("test", clock.clone(), ORIGIN_MS);
        (backend, clock)
    }

    fn request(db: u32, args: &[&str]) -> Request {
        let args = args.iter().map(|arg| Bytes::from(arg.to_string())).collect();
        Request::new(db, args)
    }

    fn run(backend: &EmbeddedBackend, args: &[&str]) -> Reply {
        backend.execute(&request(0, args))
    }

    fn run_db(backend: &EmbeddedBackend, db: u32, args: &[&str]) -> Reply {
        backend.execute(&request(db, args))
    }

    fn bulk(text: &str) -> Reply {
        Reply::bulk(text.to_owned())
    }

    fn error(text: &str) -> Reply {
        Reply::error(text)
    }

    /// The text of an error reply, for prefix checks.
    fn error_text(reply: &Reply) -> String {
        match reply {
            Reply::Error(text) => String::from_utf8_lossy(text).into_owned(),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    /// A field of `INFO section`, or of the default `INFO` if `section` is empty.
    fn info_field_value(backend: &EmbeddedBackend, section: &str, field: &str) -> String {
        let args: &[&str] = if section.is_empty() {
            &["INFO"]
        } else {
            &["INFO", section]
        };
        let Reply::Bulk(text) = run(backend, args) else {
            panic!("INFO is not a bulk string");
        };
        let text = String::from_utf8_lossy(&text).into_owned();
        let prefix = format!("{field}:");
        text.split("\r\n")
            .find_map(|line| line.strip_prefix(&prefix).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {field} in {text}"))
    }

    // ----- strings and SET options -------------------------------------------------------

    #[test]
    fn ping_and_echo() {
        let (b, _) = backend();
        assert_eq!(run(&b, &["PING"]), Reply::status("PONG"));
        assert_eq!(run(&b, &["ping", "hi"]), bulk("hi"));
        assert_eq!(
            run(&b, &["ping", "a", "b"]),
            error("ERR wrong number of arguments for 'ping' command")
        );
        assert_eq!(run(&b, &["echo", "x"]), bulk("x"));
    }

    #[test]
    fn set_and_get() {
        let (b, _) = backend();
        assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
        assert_eq!(run(&b, &["SET", "k", "v"]), Reply::ok());
        assert_eq!(run(&b, &["get", "k"]), bulk("v"));
        assert_eq!(run(&b, &["SET", "k", "w", "GET"]), bulk("v"));
        assert_eq!(run(&b, &["SET", "new", "w", "GET"]), Reply::Nil);
        assert_eq!(run(&b, &["GET", "k"]), bulk("w"));
    }

    #[test]
    fn set_nx_and_xx() {
        let (b, _) = backend();
        assert_eq!(run(&b, &["SET", "k", "1", "XX"]), Reply::Nil);
        assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
        assert_eq!(run(&b, &["SET", "k", "1", "NX"]), Reply::ok());
        assert_eq!(run(&b, &["SET", "k", "2", "nx"]), Reply::Nil);
        assert_eq!(run(&b, &["GET", "k"]), bulk("1"));
        assert_eq!(run(&b, &["SET", "k", "3", "xX"]), Reply::ok());
        assert_eq!(run(&b, &["GET", "k"]), bulk("3"));
        // NX with GET (allowed since 7.0) returns the value that blocked the write.
        assert_eq!(run(&b, &["SET", "k", "4", "NX", "GET"]), bulk("3"));
        assert_eq!(run(&b, &["SETNX", "k", "5"]), Reply::Int(0));
        assert_eq!(run(&b, &["SETNX", "other", "5"]), Reply::Int(1));
    }

    #[test]
    fn set_options_in_any_order_and_case() {
        let (b, _) = backend();
        assert_eq!(run(&b, &["Set", "k", "v", "pX", "100", "nX"]), Reply::ok());
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(100));
        assert_eq!(run(&b, &["set", "k", "v", "get", "ex", "10", "xx"]), bulk("v"));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(10_000));
        // The same expiry option twice is accepted; the last one wins.
        assert_eq!(run(&b, &["SET", "k", "v", "EX", "1", "EX", "2"]), Reply::ok());
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(2_000));
    }

    #[test]
    fn set_syntax_errors() {
        let (b, _) = backend();
        let syntax = error("ERR syntax error");
        for args in [
            &["SET", "k", "v", "NX", "XX"][..],
            &["SET", "k", "v", "XX", "NX"],
            &["SET", "k", "v", "EX"],
            &["SET", "k", "v", "EX", "10", "PX", "10"],
            &["SET", "k", "v", "KEEPTTL", "EX", "10"],
            &["SET", "k", "v", "PX", "10", "KEEPTTL"],
            &["SET", "k", "v", "BOGUS"],
            // A bad option wins over a bad number, as options are parsed first.
            &["SET", "k", "v", "EX", "abc", "BOGUS"],
        ] {
            assert_eq!(run(&b, args), syntax, "{args:?}");
        }
        assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
    }

    #[test]
    fn set_expire_value_errors() {
        let (b, _) = backend();
        let not_int = error("ERR value is not an integer or out of range");
        let invalid = error("ERR invalid expire time in 'set' command");
        assert_eq!(run(&b, &["SET", "k", "v", "EX", "abc"]), not_int);
        assert_eq!(run(&b, &["SET", "k", "v", "PX", "1.5"]), not_int);
        assert_eq!(run(&b, &["SET", "k", "v", "PX", "+5"]), not_int);
        assert_eq!(run(&b, &["SET", "k", "v", "PX", "05"]), not_int);
        assert_eq!(run(&b, &["SET", "k", "v", "EX", "0"]), invalid);
        assert_eq!(run(&b, &["SET", "k", "v", "PX", "-5"]), invalid);
        assert_eq!(run(&b, &["SET", "k", "v", "EX", "9223372036854775807"]), invalid);
        assert_eq!(run(&b, &["SET", "k", "v", "PX", "9223372036854775807"]), invalid);
        assert_eq!(run(&b, &["SET", "k", "v", "PX", "99999999999999999999"]), not_int);
        assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
    }

    #[test]
    fn set_without_keepttl_clears_the_expiry() {
        let (b, _) = backend();
        run(&b, &["SET", "k", "v", "PX", "1000"]);
        assert_eq!(run(&b, &["SET", "k", "w", "KEEPTTL"]), Reply::ok());
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(1000));
        assert_eq!(run(&b, &["SET", "k", "x"]), Reply::ok());
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-1));
        run(&b, &["SET", "k", "v", "PX", "1000"]);
        assert_eq!(run(&b, &["GETSET", "k", "y"]), bulk("v"));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-1));
    }

    #[test]
    fn absolute_expiry_uses_the_masters_wall_clock() {
        let (b, _) = backend();
        let at = (ORIGIN_MS + 5_000).to_string();
        assert_eq!(run(&b, &["SET", "k", "v", "PXAT", &at]), Reply::ok());
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(5_000));
        let at = (ORIGIN_MS / 1000 + 7).to_string();
        assert_eq!(run(&b, &["SET", "k", "v", "EXAT", &at]), Reply::ok());
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(7_000));
        // An expiry already past stores nothing.
        let past = (ORIGIN_MS - 1).to_string();
        assert_eq!(run(&b, &["SET", "k", "v", "PXAT", &past]), Reply::ok());
        assert_eq!(run(&b, &["EXISTS", "k"]), Reply::Int(0));
    }

    #[test]
    fn new_derives_the_wall_clock_from_system_time() {
        let backend = EmbeddedBackend::new("real", Arc::new(ManualClock::default()));
        let wall = millis(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default());
        let at = (wall + 10_000).to_string();
        backend.execute(&request(0, &["SET", "k", "v", "PXAT", &at]));
        let Reply::Int(left) = backend.execute(&request(0, &["PTTL", "k"])) else {
            panic!("PTTL is not an integer");
        };
        assert!((9_000..=10_000).contains(&left), "{left}");
    }

    // ----- expiry ------------------------------------------------------------------------

    #[test]
    fn keys_expire_on_the_clock() {
        let (b, clock) = backend();
        run(&b, &["SET", "k", "v", "PX", "100"]);
        clock.advance(99);
        assert_eq!(run(&b, &["GET", "k"]), bulk("v"));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(1));
        clock.advance(1);
        // Alive through its last millisecond, as in Redis.
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(0));
        clock.advance(1);
        assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
        assert_eq!(run(&b, &["EXISTS", "k"]), Reply::Int(0));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-2));
        assert_eq!(run(&b, &["SET", "k", "w", "NX"]), Reply::ok());
    }

    #[test]
    fn pttl_and_ttl() {
        let (b, clock) = backend();
        assert_eq!(run(&b, &["PTTL", "missing"]), Reply::Int(-2));
        assert_eq!(run(&b, &["TTL", "missing"]), Reply::Int(-2));
        run(&b, &["SET", "forever", "v"]);
        assert_eq!(run(&b, &["PTTL", "forever"]), Reply::Int(-1));
        assert_eq!(run(&b, &["TTL", "forever"]), Reply::Int(-1));
        run(&b, &["SET", "k", "v", "PX", "1499"]);
        assert_eq!(run(&b, &["TTL", "k"]), Reply::Int(1));
        run(&b, &["SET", "k", "v", "PX", "1500"]);
        assert_eq!(run(&b, &["TTL", "k"]), Reply::Int(2));
        clock.advance(1100);
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(400));
        assert_eq!(run(&b, &["TTL", "k"]), Reply::Int(0));
        run(&b, &["SET", "k", "v", "EX", "10"]);
        assert_eq!(run(&b, &["TTL", "k"]), Reply::Int(10));
    }

    #[test]
    fn pexpire_and_expire() {
        let (b, _) = backend();
        assert_eq!(run(&b, &["PEXPIRE", "missing", "100"]), Reply::Int(0));
        run(&b, &["SET", "k", "v"]);
        assert_eq!(run(&b, &["PEXPIRE", "k", "100"]), Reply::Int(1));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(100));
        assert_eq!(run(&b, &["EXPIRE", "k", "3"]), Reply::Int(1));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(3000));
        let at = (ORIGIN_MS + 2500).to_string();
        assert_eq!(run(&b, &["PEXPIREAT", "k", &at]), Reply::Int(1));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(2500));
        let at = (ORIGIN_MS / 1000 + 4).to_string();
        assert_eq!(run(&b, &["EXPIREAT", "k", &at]), Reply::Int(1));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(4000));
        // Zero or negative deletes the key.
        assert_eq!(run(&b, &["PEXPIRE", "k", "-1"]), Reply::Int(1));
        assert_eq!(run(&b, &["EXISTS", "k"]), Reply::Int(0));
        run(&b, &["SET", "k", "v"]);
        assert_eq!(run(&b, &["EXPIRE", "k", "0"]), Reply::Int(1));
        assert_eq!(run(&b, &["EXISTS", "k"]), Reply::Int(0));
    }

    #[test]
    fn expire_conditions() {
        let (b, _) = backend();
        run(&b, &["SET", "k", "v"]);
        assert_eq!(run(&b, &["PEXPIRE", "k", "100", "XX"]), Reply::Int(0));
        assert_eq!(run(&b, &["PEXPIRE", "k", "100", "GT"]), Reply::Int(0));
        assert_eq!(run(&b, &["PEXPIRE", "k", "100", "nx"]), Reply::Int(1));
        assert_eq!(run(&b, &["PEXPIRE", "k", "200", "NX"]), Reply::Int(0));
        assert_eq!(run(&b, &["PEXPIRE", "k", "50", "GT"]), Reply::Int(0));
        assert_eq!(run(&b, &["PEXPIRE", "k", "200", "GT"]), Reply::Int(1));
        assert_eq!(run(&b, &["PEXPIRE", "k", "300", "LT"]), Reply::Int(0));
        assert_eq!(run(&b, &["PEXPIRE", "k", "150", "LT", "XX"]), Reply::Int(1));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(150));
        run(&b, &["SET", "p", "v"]);
        // No expiry counts as infinite: LT always applies.
        assert_eq!(run(&b, &["PEXPIRE", "p", "150", "LT"]), Reply::Int(1));
    }

    #[test]
    fn expire_errors() {
        let (b, _) = backend();
        run(&b, &["SET", "k", "v"]);
        assert_eq!(
            run(&b, &["PEXPIRE", "k", "100", "NX", "XX"]),
            error("ERR NX and XX, GT or LT options at the same time are not compatible")
        );
        assert_eq!(
            run(&b, &["PEXPIRE", "k", "100", "GT", "LT"]),
            error("ERR GT and LT options at the same time are not compatible")
        );
        assert_eq!(
            run(&b, &["PEXPIRE", "k", "100", "soon"]),
            error("ERR Unsupported option soon")
        );
        assert_eq!(
            run(&b, &["PEXPIRE", "k", "x"]),
            error("ERR value is not an integer or out of range")
        );
        assert_eq!(
            run(&b, &["EXPIRE", "k", "9223372036854775807"]),
            error("ERR invalid expire time in 'expire' command")
        );
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-1));
    }

    #[test]
    fn persist_removes_the_expiry() {
        let (b, _) = backend();
        assert_eq!(run(&b, &["PERSIST", "missing"]), Reply::Int(0));
        run(&b, &["SET", "k", "v", "PX", "100"]);
        assert_eq!(run(&b, &["PERSIST", "k"]), Reply::Int(1));
        assert_eq!(run(&b, &["PERSIST", "k"]), Reply::Int(0));
        assert_eq!(run(&b, &["PTTL", "k"]), Reply::Int(-1));
    }

    // ----- other commands ----------------------------------------------------------------

    #[test]
    fn del_unlink_and_exists_count_keys() {
        let (b, _) = backend();
        run(&b, &["SET", "a", "1"]);
        run(&b, &["SET", "b", "2"]);
        run(&b, &["SET", "c", "3"]);
        assert_eq!(run(&b, &["EXISTS", "a", "a", "b", "x"]), Reply::Int(3));
        assert_eq!(run(&b, &["DEL", "a", "a", "x"]), Reply::Int(1));
        assert_eq!(run(&b, &["UNLINK", "b", "c"]), Reply::Int(2));
        assert_eq!(run(&b, &["EXISTS", "a", "b", "c"]), Reply::Int(0));
    }

    #[test]
    fn incr_and_decr() {
        let (b, _) = backend();
        assert_eq!(run(&b, &["INCR", "n"]), Reply::Int(1));
        assert_eq!(run(&b, &["INCRBY", "n", "41"]), Reply::Int(42));
        assert_eq!(run(&b, &["DECR", "n"]), Reply::Int(41));
        assert_eq!(run(&b, &["DECRBY", "n", "40"]), Reply::Int(1));
        assert_eq!(run(&b, &["GET", "n"]), bulk("1"));
        run(&b, &["PEXPIRE", "n", "500"]);
        run(&b, &["INCR", "n"]);
        assert_eq!(run(&b, &["PTTL", "n"]), Reply::Int(500));
        let not_int = error("ERR value is not an integer or out of range");
        run(&b, &["SET", "s", "abc"]);
        assert_eq!(run(&b, &["INCR", "s"]), not_int);
        assert_eq!(run(&b, &["INCRBY", "n", "x"]), not_int);
        run(&b, &["SET", "big", "9223372036854775807"]);
        assert_eq!(
            run(&b, &["INCR", "big"]),
            error("ERR increment or decrement would overflow")
        );
        assert_eq!(
            run(&b, &["DECRBY", "n", "-9223372036854775808"]),
            error("ERR decrement would overflow")
        );
    }

    #[test]
    fn arity_and_unknown_command_errors() {
        let (b, _) = backend();
        assert_eq!(
            run(&b, &["GET"]),
            error("ERR wrong number of arguments for 'get' command")
        );
        assert_eq!(
            run(&b, &["Set", "k"]),
            error("ERR wrong number of arguments for 'set' command")
        );
        assert_eq!(
            run(&b, &["DBSIZE", "x"]),
            error("ERR wrong number of arguments for 'dbsize' command")
        );
        assert_eq!(
            run(&b, &["FOO", "a", "b"]),
            error("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ")
        );
        assert_eq!(
            run(&b, &["nope"]),
            error("ERR unknown command 'nope', with args beginning with: ")
        );
        assert_eq!(
            b.execute(&Request::new(0, Vec::new())),
            error("ERR unknown command '', with args beginning with: ")
        );
        let long = "x".repeat(300);
        let text = error_text(&run(&b, &["FOO", &long, "more"]));
        assert!(text.ends_with(&format!("'{}' ", "x".repeat(128))), "{text}");
    }

    #[test]
    fn databases_are_separate() {
        let (b, _) = backend();
        run_db(&b, 0, &["SET", "k", "zero"]);
        run_db(&b, 1, &["SET", "k", "one"]);
        assert_eq!(run_db(&b, 0, &["GET", "k"]), bulk("zero"));
        assert_eq!(run_db(&b, 1, &["GET", "k"]), bulk("one"));
        assert_eq!(run_db(&b, 2, &["GET", "k"]), Reply::Nil);
        assert_eq!(run_db(&b, 1, &["DBSIZE"]), Reply::Int(1));
        assert_eq!(run_db(&b, 1, &["FLUSHDB"]), Reply::ok());
        assert_eq!(run_db(&b, 1, &["GET", "k"]), Reply::Nil);
        assert_eq!(run_db(&b, 0, &["GET", "k"]), bulk("zero"));
        run_db(&b, 5, &["SET", "k", "five"]);
        assert_eq!(run_db(&b, 0, &["FLUSHALL", "ASYNC"]), Reply::ok());
        assert_eq!(run_db(&b, 5, &["DBSIZE"]), Reply::Int(0));
        assert_eq!(run(&b, &["FLUSHALL", "later"]), error("ERR syntax error"));
    }

    #[test]
    fn info_reports_version_run_id_uptime_and_role() {
        let (b, clock) = backend();
        assert_eq!(info_field_value(&b, "server", "redis_version"), "7.0.0");
        assert_eq!(info_field_value(&b, "server", "redis_mode"), "standalone");
        let run_id = info_field_value(&b, "server", "run_id");
        assert_eq!(run_id.len(), 40);
        assert!(run_id.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        clock.advance(3_500);
        assert_eq!(info_field_value(&b, "server", "uptime_in_seconds"), "3");
        assert_eq!(info_field_value(&b, "server", "uptime_in_milliseconds"), "3500");
        assert_eq!(info_field_value(&b, "", "role"), "master");
        assert_eq!(info_field_value(&b, "replication", "role"), "master");
        run_db(&b, 2, &["SET", "k", "v", "PX", "100"]);
        assert_eq!(info_field_value(&b, "keyspace", "db2"), "keys=1,expires=1,avg_ttl=0");
        let Reply::Bulk(server_only) = run(&b, &["INFO", "SERVER"]) else {
            panic!("INFO is not a bulk string");
        };
        assert!(server_only.starts_with(b"# Server\r\n"));
        assert!(!server_only.windows(5).any(|w| w == b"role:"));
        assert_eq!(run(&b, &["INFO", "nosuchsection"]), bulk(""));
        assert_eq!(
            run(&b, &["ROLE"]),
            Reply::Array(vec![bulk("master"), Reply::Int(0), Reply::Array(vec![])])
        );
    }

    #[test]
    fn restart_loses_keys_and_scripts_and_changes_run_id() {
        let (b, clock) = backend();
        run(&b, &["SET", "k", "v"]);
        let Reply::Bulk(sha) = run(&b, &["SCRIPT", "LOAD", "return 1"]) else {
            panic!("SCRIPT LOAD gives no sha");
        };
        let sha = String::from_utf8_lossy(&sha).into_owned();
        let before = info_field_value(&b, "server", "run_id");
        clock.advance(5_000);
        b.restart();
        assert_eq!(run(&b, &["GET", "k"]), Reply::Nil);
        assert_eq!(
            run(&b, &["EVALSHA", &sha, "0"]),
            error("NOSCRIPT No matching script. Please use EVAL.")
        );
        assert_ne!(info_field_value(&b, "server", "run_id"), before);
        assert_eq!(info_field_value(&b, "server", "uptime_in_milliseconds"), "0");
        clock.advance(1_000);
        assert_eq!(info_field_value(&b, "server", "uptime_in_seconds"), "1");
    }

    #[tokio::test]
    async fn backend_trait_always_answers() {
        let (b, _) = backend();
        assert_eq!(b.name(), "test");
        let reply = b.call(&request(0, &["SET", "k", "v"])).await;
        assert_eq!(reply, Ok(Reply::ok()));
        let reply = b.call(&request(0, &["BOGUS"])).await;
        assert!(matches!(reply, Ok(Reply::Error(_))));
    }

    #[tokio::test]
    async fn calls_run_on_spawned_tasks() {
        async fn via_trait<B: Backend>(backend: Arc<B>, request: Request) -> Reply {
            match backend.call(&request).await {
                Ok(reply) => reply,
                Err(error) => panic!("an embedded master always answers: {error}"),
            }
        }
        let (b, _) = backend();
        let b = Arc::new(b);
        let set = tokio::spawn(via_trait(b.clone(), request(0, &["SET", "k", "v"])));
        assert_eq!(set.await.expect("the task ran"), Reply::ok());
        assert_eq!(via_trait(b, request(0, &["GET", "k"])).await, bulk("v"));
    }

    // ----- scripts from real clients -----------------------------------------------------

    const RELEASE: &str =
        r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#;

    /// redis-py's `Lock.extend` script.
    const REDIS_PY_EXTEND: &str = r#"
        local token = redis.call('get', KEYS[1])
        if not token or token ~= ARGV[1] then
            return 0
        end
        local expiration = redis.call('pttl', KEYS[1])
        if not expiration then
            expiration = 0
        end
        if expiration < 0 then
            return 0
        end
        local newttl = ARGV[2]
        if ARGV[3] == "0" then
            newttl = ARGV[2] + expiration
        end
        redis.call('pexpire', KEYS[1], newttl)
        return 1
    "#;

    /// node-redlock's multi-key acquire.
    const NODE_REDLOCK_ACQUIRE: &str = r#"
        for _, key in ipairs(KEYS) do
            if redis.call("exists", key) == 1 then
                return 0
            end
        end
        for _, key in ipairs(KEYS) do
            redis.call("set", key, ARGV[1], "PX", ARGV[2])
        end
        return #KEYS
    "#;

    /// redsync's release, which tells a missing key (-1) from a foreign one (0).
    const REDSYNC_RELEASE: &str = r#"
        local val = redis.call("GET", KEYS[1])
        if val == ARGV[1] then
            return redis.call("DEL", KEYS[1])
        elseif val == false then
            return -1
        else
            return 0
        end
    "#;

    #[test]
    fn canonical_release_script() {
        let (b, _) = backend();
        run(&b, &["SET", "lock", "token", "PX", "30000"]);
        assert_eq!(run(&b, &["EVAL", RELEASE, "1", "lock", "other"]), Reply::Int(0));
        assert_eq!(run(&b, &["GET", "lock"]), bulk("token"));
        assert_eq!(run(&b, &["EVAL", RELEASE, "1", "lock", "token"]), Reply::Int(1));
        assert_eq!(run(&b, &["GET", "lock"]), Reply::Nil);
        assert_eq!(run(&b, &["EVAL", RELEASE, "1", "lock", "token"]), Reply::Int(0));
    }

    #[test]
    fn redis_py_extend_script() {
        let (b, clock) = backend();
        run(&b, &["SET", "lock", "token", "PX", "10000"]);
        clock.advance(4_000);
        // Additive extend: 6000 left + 5000.
        let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "lock", "token", "5000", "0"]);
        assert_eq!(reply, Reply::Int(1));
        assert_eq!(run(&b, &["PTTL", "lock"]), Reply::Int(11_000));
        // Replacing extend.
        let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "lock", "token", "5000", "1"]);
        assert_eq!(reply, Reply::Int(1));
        assert_eq!(run(&b, &["PTTL", "lock"]), Reply::Int(5_000));
        let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "lock", "stolen", "5000", "1"]);
        assert_eq!(reply, Reply::Int(0));
        run(&b, &["PERSIST", "lock"]);
        let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "lock", "token", "5000", "1"]);
        assert_eq!(reply, Reply::Int(0));
        let reply = run(&b, &["EVAL", REDIS_PY_EXTEND, "1", "gone", "token", "5000", "1"]);
        assert_eq!(reply, Reply::Int(0));
    }

    #[test]
    fn node_redlock_multi_key_acquire() {
        let (b, _) = backend();
        let acquire = |keys: &[&str]| {
            let mut args = vec!["EVAL", NODE_REDLOCK_ACQUIRE];
            let numkeys = keys.len().to_string();
            args.push(&numkeys);
            args.extend_from_slice(keys);
            args.extend_from_slice(&["token", "2000"]);
            run(&b, &args)
        };
        assert_eq!(acquire(&["a", "b", "c"]), Reply::Int(3));
        assert_eq!(run(&b, &["GET", "b"]), bulk("token"));
        assert_eq!(run(&b, &["PTTL", "c"]), Reply::Int(2000));
        assert_eq!(acquire(&["d", "c"]), Reply::Int(0));
        assert_eq!(run(&b, &["EXISTS", "d"]), Reply::Int(0));
    }

    #[test]
    fn redsync_release_script() {
        let (b, _) = backend();
        assert_eq!(
            run(&b, &["EVAL", REDSYNC_RELEASE, "1", "lock", "token"]),
            Reply::Int(-1)
        );
        run(&b, &["SET", "lock", "other"]);
        assert_eq!(run(&b, &["EVAL", REDSYNC_RELEASE, "1", "lock", "token"]), Reply::Int(0));
        run(&b, &["SET", "lock", "token"]);
        assert_eq!(run(&b, &["EVAL", REDSYNC_RELEASE, "1", "lock", "token"]), Reply::Int(1));
    }

    #[test]
    fn scripts_run_in_the_requests_database() {
        let (b, _) = backend();
        let script = "return redis.call('set', KEYS[1], ARGV[1])";
        assert_eq!(run_db(&b, 3, &["EVAL", script, "1", "k", "v"]), Reply::ok());
        assert_eq!(run_db(&b, 3, &["GET", "k"]), bulk("v"));
        assert_eq!(run_db(&b, 0, &["GET", "k"]), Reply::Nil);
    }

    // ----- script cache ------------------------------------------------------------------

    #[test]
    fn eval_caches_the_script_for_evalsha() {
        let (b, _) = backend();
        let sha = sha1_hex(RELEASE.as_bytes());
        assert_eq!(
            run(&b, &["EVALSHA", &sha, "1", "lock", "token"]),
            error("NOSCRIPT No matching script. Please use EVAL.")
        );
        run(&b, &["EVAL", RELEASE, "1", "lock", "token"]);
        run(&b, &["SET", "lock", "token"]);
        let upper = sha.to_ascii_uppercase();
        assert_eq!(run(&b, &["evalsha", &upper, "1", "lock", "token"]), Reply::Int(1));
    }

    #[test]
    fn script_load_exists_and_flush() {
        let (b, _) = backend();
        assert_eq!(run(&b, &["SCRIPT", "EXISTS", "abc"]), Reply::Array(vec![Reply::Int(0)]));
        let sha = sha1_hex(b"return 'hi'");
        assert_eq!(run(&b, &["SCRIPT", "LOAD", "return 'hi'"]), bulk(&sha));
        assert_eq!(
            run(&b, &["script", "exists", &sha, "nope"]),
            Reply::Array(vec![Reply::Int(1), Reply::Int(0)])
        );
        assert_eq!(run(&b, &["EVALSHA", &sha, "0"]), bulk("hi"));
        assert_eq!(run(&b, &["SCRIPT", "FLUSH", "ASYNC"]), Reply::ok());
        assert_eq!(
            run(&b, &["EVALSHA", &sha, "0"]),
            error("NOSCRIPT No matching script. Please use EVAL.")
        );
        assert_eq!(
            run(&b, &["SCRIPT", "FLUSH", "NOW"]),
            error("ERR SCRIPT FLUSH only support SYNC|ASYNC option")
        );
        assert_eq!(
            run(&b, &["SCRIPT", "LOAD"]),
            error("ERR wrong number of arguments for 'script|load' command")
        );
        assert_eq!(
            run(&b, &["SCRIPT", "nope"]),
            error("ERR unknown subcommand 'nope'. Try SCRIPT HELP.")
        );
        assert_eq!(
            run(&b, &["SCRIPT", "KILL"]),
            error("NOTBUSY No scripts in execution right now.")
        );
    }

    #[test]
    fn script_flush_drops_lua_globals() {
        let (b, _) = backend();
        run(&b, &["EVAL", "leftover = 42", "0"]);
        assert_eq!(run(&b, &["EVAL", "return leftover", "0"]), Reply::Int(42));
        run(&b, &["SCRIPT", "FLUSH"]);
        assert_eq!(run(&b, &["EVAL", "return leftover", "0"]), Reply::Nil);
    }

    #[test]
    fn numkeys_errors() {
        let (b, _) = backend();
        assert_eq!(
            run(&b, &["EVAL", "return 1", "2", "k"]),
            error("ERR Number of keys can't be greater than number of args")
        );
        assert_eq!(
            run(&b, &["EVAL", "return 1", "-1"]),
            error("ERR Number of keys can't be negative")
        );
        assert_eq!(
            run(&b, &["EVAL", "return 1", "one"]),
            error("ERR value is not an integer or out of range")
        );
        assert_eq!(
            run(&b, &["EVAL", "return 1"]),
            error("ERR wrong number of arguments for 'eval' command")
        );
        let reply = run(&b, &["EVAL", "return {KEYS[1], ARGV[1], #KEYS, #ARGV}", "1", "k", "a"]);
        assert_eq!(
            reply,
            Reply::Array(vec![bulk("k"), bulk("a"), Reply::Int(1), Reply::Int(1)])
        );
    }

    #[test]
    fn compile_errors() {
        let (b, _) = backend();
        let text = error_text(&run(&b, &["EVAL", "return = 1", "0"]));
        assert!(
            text.starts_with("ERR Error compiling script (new function): user_script:1: "),
            "{text}"
        );
        let text = error_text(&run(&b, &["SCRIPT", "LOAD", "x x"]));
        assert!(text.starts_with("ERR Error compiling script"), "{text}");
    }

    // ----- conversions -------------------------------------------------------------------

    fn eval(b: &EmbeddedBackend, script: &str) -> Reply {
        run(b, &["EVAL", script, "0"])
    }

    #[test]
    fn lua_to_redis_conversions() {
        let (b, _) = backend();
        assert_eq!(eval(&b, "return true"), Reply::Int(1));
        assert_eq!(eval(&b, "return false"), Reply::Nil);
        assert_eq!(eval(&b, "return nil"), Reply::Nil);
        assert_eq!(eval(&b, "return"), Reply::Nil);
        assert_eq!(eval(&b, "return 3.99"), Reply::Int(3));
        assert_eq!(eval(&b, "return -3.99"), Reply::Int(-3));
        assert_eq!(eval(&b, "return 'x'"), bulk("x"));
        assert_eq!(eval(&b, "return 1, 2"), Reply::Int(1));
        assert_eq!(
            eval(&b, "return {1, 'two', 3.5, nil, 5}"),
            Reply::Array(vec![Reply::Int(1), bulk("two"), Reply::Int(3)])
        );
        assert_eq!(
            eval(&b, "return {1, {true, false}, {}}"),
            Reply::Array(vec![
                Reply::Int(1),
                Reply::Array(vec![Reply::Int(1), Reply::Nil]),
                Reply::Array(vec![]),
            ])
        );
        assert_eq!(eval(&b, "return {ok = 'FINE'}"), Reply::status("FINE"));
        assert_eq!(eval(&b, "return {err = 'BAD thing'}"), error("BAD thing"));
        assert_eq!(eval(&b, "return {err = 'BAD', ok = 'x'}"), error("BAD"));
        assert_eq!(
            eval(&b, "return {1, 2, ok = 3}"),
            Reply::Array(vec![Reply::Int(1), Reply::Int(2)])
        );
        assert_eq!(eval(&b, "return redis.status_reply('DONE')"), Reply::status("DONE"));
        assert_eq!(eval(&b, "return redis.error_reply('MY error')"), error("MY error"));
        assert_eq!(eval(&b, "return redis.error_reply('boom')"), error("ERR boom"));
        assert_eq!(eval(&b, "return redis.error_reply('-WRONG x')"), error("WRONG x"));
        assert_eq!(
            eval(&b, "return redis.error_reply()"),
            error("ERR wrong number or type of arguments")
        );
        assert_eq!(eval(&b, "return function() end"), Reply::Nil);
    }

    #[test]
    fn redis_to_lua_conversions() {
        let (b, _) = backend();
        run(&b, &["SET", "s", "v"]);
        assert_eq!(eval(&b, "return type(redis.call('get', 'missing'))"), bulk("boolean"));
        assert_eq!(eval(&b, "return redis.call('get', 'missing') == false"), Reply::Int(1));
        assert_eq!(eval(&b, "return type(redis.call('exists', 's'))"), bulk("number"));
        assert_eq!(eval(&b, "return redis.call('ping').ok"), bulk("PONG"));
        assert_eq!(eval(&b, "return redis.call('ping')"), Reply::status("PONG"));
        assert_eq!(eval(&b, "return redis.call('get', 's')"), bulk("v"));
        assert_eq!(
            eval(&b, "return redis.pcall('incr', 's').err"),
            bulk("ERR value is not an integer or out of range")
        );
        assert_eq!(
            eval(&b, "local r = redis.call('role') return {type(r), r[1], r[2], #r[3]}"),
            Reply::Array(vec![bulk("table"), bulk("master"), Reply::Int(0), Reply::Int(0)])
        );
        // Numbers become arguments without a fraction.
        assert_eq!(eval(&b, "return redis.call('set', 'n', 10 * 3)"), Reply::ok());
        assert_eq!(run(&b, &["GET", "n"]), bulk("30"));
        assert_eq!(eval(&b, "return redis.call('echo', 2.5)"), bulk("2.5"));
    }

    #[test]
    fn redis_helpers() {
        let (b, _) = backend();
        assert_eq!(
            eval(&b, "return redis.sha1hex('')"),
            bulk("da39a3ee5e6b4b0d3255bfef95601890afd80709")
        );
        assert_eq!(
            eval(&b, "redis.log(redis.LOG_WARNING, 'hi') return redis.LOG_NOTICE"),
            Reply::Int(2)
        );
        assert_eq!(
            eval(&b, "return {redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_WARNING}"),
            Reply::Array(vec![Reply::Int(0), Reply::Int(1), Reply::Int(3)])
        );
        assert_eq!(
            eval(&b, "return tonumber('12') + #string.format('%d', 7)"),
            Reply::Int(13)
        );
        assert_eq!(eval(&b, "return select('#', unpack({1, 2, 3}))"), Reply::Int(3));
        assert_eq!(eval(&b, "return math.floor(7.9) + table.getn({1})"), Reply::Int(8));
        let text = error_text(&eval(&b, "return redis.sha1hex()"));
        assert!(text.starts_with("ERR wrong number of arguments script: "), "{text}");
    }

    // ----- errors in scripts -------------------------------------------------------------

    #[test]
    fn call_raises_and_pcall_returns_errors() {
        let (b, _) = backend();
        run(&b, &["SET", "s", "text"]);
        let script = "redis.call('incr', KEYS[1])\nreturn 'not reached'";
        let sha = sha1_hex(script.as_bytes());
        assert_eq!(
            run(&b, &["EVAL", script, "1", "s"]),
            error(&format!(
                "ERR value is not an integer or out of range script: {sha}, on @user_script:1."
            ))
        );
        assert_eq!(
            eval(&b, "return redis.pcall('incr', 's')"),
            error("ERR value is not an integer or out of range")
        );
        assert_eq!(
            eval(
                &b,
                "local r = redis.pcall('incr', 's') return r.err ~= nil and 'caught' or 'no'"
            ),
            bulk("caught")
        );
        // A script's own pcall catches redis.call's error as a table, as in Redis 7.
        assert_eq!(
            eval(
                &b,
                "local ok, e = pcall(redis.call, 'incr', 's') return {tostring(ok), type(e), e.err}"
            ),
            Reply::Array(vec![
                bulk("false"),
                bulk("table"),
                bulk("ERR value is not an integer or out of range")
            ])
        );
        assert_eq!(
            eval(
                &b,
                "return select(2, xpcall(function() redis.call('incr', 's') end, function(e) return e.err end))"
            ),
            bulk("ERR value is not an integer or out of range")
        );
        assert_eq!(
            eval(&b, "return {pcall(function(...) return ... end, 1, nil, 3)}"),
            Reply::Array(vec![Reply::Int(1), Reply::Int(1)])
        );
        assert_eq!(
            eval(&b, "return {pcall(error, 'plain')}"),
            Reply::Array(vec![Reply::Nil, bulk("plain")])
        );
        // The error aborted the script: nothing after it ran.
        let script = "redis.call('set', 'before', '1')\nredis.call('incr', 's')\nredis.call('set', 'after', '1')";
        let text = error_text(&eval(&b, script));
        assert!(text.ends_with("on @user_script:2."), "{text}");
        assert_eq!(run(&b, &["EXISTS", "before", "after"]), Reply::Int(1));
    }

    #[test]
    fn script_only_command_errors() {
        let (b, _) = backend();
        assert_eq!(
            eval(&b, "return redis.pcall('nosuch')"),
            error("ERR Unknown Redis command called from script")
        );
        assert_eq!(
            eval(&b, "return redis.pcall('get')"),
            error("ERR Wrong number of args calling Redis command from script")
        );
        assert_eq!(
            eval(&b, "return redis.pcall('eval', 'return 1', '0')"),
            error("ERR This Redis command is not allowed from script")
        );
        assert_eq!(
            eval(&b, "return redis.pcall('get', {})"),
            error("ERR Lua redis lib command arguments must be strings or integers")
        );
        assert_eq!(
            eval(&b, "return redis.pcall()"),
            error("ERR Please specify at least one argument for this redis lib call")
        );
        // A tail call still names the script line.
        let sha = sha1_hex(b"\nreturn redis.call('nosuch')");
        assert_eq!(
            eval(&b, "\nreturn redis.call('nosuch')"),
            error(&format!(
                "ERR Unknown Redis command called from script script: {sha}, on @user_script:2."
            ))
        );
    }

    #[test]
    fn runtime_errors_name_the_script_line() {
        let (b, _) = backend();
        let script = "local x = 1\nerror('boom')";
        let sha = sha1_hex(script.as_bytes());
        assert_eq!(
            eval(&b, script),
            error(&format!("ERR user_script:2: boom script: {sha}, on @user_script:2."))
        );
        let text = error_text(&eval(&b, "return nil + 1"));
        assert!(
            text.starts_with("ERR user_script:1: attempt to perform arithmetic"),
            "{text}"
        );
        let text = error_text(&eval(&b, "error({err = 'CUSTOM failure'})"));
        assert!(text.starts_with("CUSTOM failure script: "), "{text}");
        let text = error_text(&eval(&b, "error(42)"));
        assert!(text.starts_with("ERR user_script:1: 42"), "{text}");
        let text = error_text(&eval(&b, "error(true)"));
        assert!(text.starts_with("ERR true script: "), "{text}");
        let text = error_text(&eval(&b, "error()"));
        assert!(text.starts_with("ERR nil"), "{text}");
    }

    #[test]
    fn sandbox_has_no_file_access_or_bytecode() {
        let (b, _) = backend();
        assert_eq!(
            eval(
                &b,
                "return {type(os), type(io), type(debug), type(package), type(require), type(loadfile), type(dofile), type(newproxy)}"
            ),
            Reply::Array(vec![bulk("nil"); 8])
        );
        let bytecode = "\u{1b}Lua\u{51}\u{0}";
        let text = error_text(&run(&b, &["EVAL", bytecode, "0"]));
        assert!(text.starts_with("ERR Error compiling script"), "{text}");
        assert_eq!(
            eval(
                &b,
                "local f, e = loadstring(string.dump(function() return 1 end)) return {type(f), e}"
            ),
            Reply::Array(vec![bulk("nil"), bulk("loading bytecode is not allowed")])
        );
        assert_eq!(eval(&b, "return loadstring('return 7')()"), Reply::Int(7));
        assert_eq!(
            eval(
                &b,
                "local parts = {'return ', '8'} local i = 0 return load(function() i = i + 1 return parts[i] end)()"
            ),
            Reply::Int(8)
        );
        assert_eq!(eval(&b, "print('not to stdout') return 1"), Reply::Int(1));
    }

    // ----- runaway scripts ---------------------------------------------------------------

    fn killed(b: &EmbeddedBackend, script: &str) {
        let started = Instant::now();
        assert_eq!(
            eval(b, script),
            error("ERR script killed: ran longer than 50 ms"),
            "{script}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn runaway_scripts_are_killed() {
        let (b, _) = backend();
        b.set_script_time_limit(Duration::from_millis(50));
        killed(&b, "while true do end");
        killed(&b, "local function f() return f() end return f()");
        // Catching the kill with pcall doesn't buy another instruction.
        killed(&b, "while true do pcall(function() while true do end end) end");
        killed(&b, "local co = coroutine.wrap(function() while true do end end) co()");
        killed(&b, "while true do redis.call('incr', 'spin') end");
        // The backend goes on working, at full speed.
        assert_eq!(
            eval(&b, "local n = 0 for i = 1, 100000 do n = n + i end return n"),
            Reply::Int(5_000_050_000)
        );
        assert!(matches!(run(&b, &["GET", "spin"]), Reply::Bulk(_)));
    }

    #[test]
    fn the_default_time_limit_is_five_seconds() {
        let (b, _) = backend();
        assert_eq!(b.lock().script_time_limit, Duration::from_millis(5000));
        assert_eq!(
            Reply::from(CommandError::ScriptKilled(SCRIPT_TIME_LIMIT.as_millis())),
            error("ERR script killed: ran longer than 5000 ms")
        );
    }

    #[test]
    fn hostile_scripts_get_errors_not_crashes() {
        let (b, _) = backend();
        let text = error_text(&eval(&b, "return string.rep('x', 1e10)"));
        assert!(text.contains("not enough memory"), "{text}");
        assert_eq!(
            eval(&b, "local t = {} t[1] = t t[2] = t return t"),
            error("ERR reply from script is too large")
        );
        let Reply::Array(outer) = eval(&b, "local t = {} t[1] = t return t") else {
            panic!("not an array");
        };
        assert_eq!(outer.len(), 1);
        let text = error_text(&eval(&b, "local function f() f() end f()"));
        assert!(text.contains("stack overflow"), "{text}");
        // Still healthy.
        assert_eq!(eval(&b, "return 1"), Reply::Int(1));
    }

    #[test]
    fn self_referencing_table_is_cut_at_the_stack_limit() {
        let mut reply = ReplyBuilder::new().reply(&Value::Nil);
        assert_eq!(reply, Reply::Nil);
        let lua = Lua::new();
        let table: Table = lua.load("local t = {} t[1] = t return t").eval().expect("a table");
        reply = ReplyBuilder::new().reply(&Value::Table(table));
        let mut depth = 0;
        while let Reply::Array(items) = reply {
            depth += 1;
            reply = items.into_iter().next().expect("one item");
        }
        assert_eq!(depth, MAX_REPLY_DEPTH);
        assert_eq!(reply, error("ERR reached lua stack limit"));
    }

    #[test]
    fn parse_i64_follows_redis() {
        // The rule itself is tested on `protocol::whole_number`; here the master's error.
        assert_eq!(parse_i64(b"-12"), Ok(-12));
        assert_eq!(parse_i64(b"1e3"), Err(CommandError::NotAnInteger));
    }
}
