//! The Lua side of the in-process master: a sandboxed Lua 5.1 state per master, `redis.call`
//! and friends, and the conversion of replies both ways.

use super::*;

// ---------------------------------------------------------------------------------------------
// The Lua engine
// ---------------------------------------------------------------------------------------------

/// Lua code run once per state, after the Rust helpers are installed. Besides the `redis`
/// helpers that are easier said in Lua, it makes the sandbox: no file access, no bytecode
/// loading (malicious bytecode can corrupt a Lua 5.1 VM), and `pcall`/`xpcall` that hand a
/// script the `{err = ...}` table for an error `redis.call` raised, as Redis 7 does.
pub(super) const PRELUDE: &str = r#"
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
pub(super) struct RaisedReply(Bytes);

/// One Lua state with its cache of compiled scripts, by lowercase SHA1.
pub(super) struct ScriptEngine {
    pub(super) lua: Lua,
    pub(super) scripts: HashMap<String, Function>,
    /// Lua's `xpcall`, through which every script runs so that [`script_error`] sees errors
    /// before the stack unwinds and can tell the line, as Redis' error handler does.
    pub(super) xpcall: Function,
    pub(super) error_handler: Function,
}

/// What one `EVAL` or `EVALSHA` runs with.
pub(super) struct ScriptCall<'a> {
    pub(super) sha: String,
    pub(super) keys: &'a [Bytes],
    pub(super) argv: &'a [Bytes],
    pub(super) db: u32,
    pub(super) now_ms: u64,
    pub(super) identity: &'a Identity,
    pub(super) time_limit: Duration,
}

/// The state of the running script, lent to Lua as app data so that `redis.pcall`, the
/// watchdog and the error handler can reach it. The store is moved in for the run and back
/// out after it.
pub(super) struct ScriptRun {
    pub(super) store: Store,
    pub(super) db: u32,
    pub(super) now_ms: u64,
    pub(super) identity: Identity,
    pub(super) sha: String,
    pub(super) time_limit: Duration,
    /// `None` if the deadline is too far away to represent.
    pub(super) deadline: Option<Instant>,
    pub(super) killed: bool,
}

impl ScriptRun {
    /// Runs a command from `redis.call` or `redis.pcall`, with the errors Redis gives scripts.
    pub(super) fn call(&mut self, args: &[Bytes]) -> Reply {
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
    pub(super) fn new() -> mlua::Result<ScriptEngine> {
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

    pub(super) fn cached(&self, sha: &str) -> Option<Function> {
        self.scripts.get(sha).cloned()
    }

    /// The compiled script, compiling and caching it on first sight.
    pub(super) fn compile(&mut self, sha: &str, body: &[u8]) -> Result<Function, CommandError> {
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
    pub(super) fn run(&mut self, function: &Function, call: ScriptCall<'_>, store: &mut Store) -> CommandResult {
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
    pub(super) fn set_arguments(&self, keys: &[Bytes], argv: &[Bytes]) -> mlua::Result<()> {
        let globals = self.lua.globals();
        globals.raw_set("KEYS", self.string_table(keys)?)?;
        globals.raw_set("ARGV", self.string_table(argv)?)
    }

    pub(super) fn string_table(&self, items: &[Bytes]) -> mlua::Result<Table> {
        let table = self.lua.create_table_with_capacity(items.len(), 0)?;
        for (index, item) in items.iter().enumerate() {
            table.raw_set(index + 1, self.lua.create_string(item)?)?;
        }
        Ok(table)
    }
}

/// What `xpcall` returned: `true` and the script's first result, or `false` and the message
/// [`script_error`] made.
pub(super) fn script_outcome(outcome: MultiValue) -> CommandResult {
    let mut values = outcome.into_iter();
    match (values.next(), values.next()) {
        (Some(Value::Boolean(true)), result) => Ok(ReplyBuilder::new().reply(&result.unwrap_or(Value::Nil))),
        (_, Some(Value::String(message))) => Ok(Reply::Error(lua_bytes(&message))),
        _ => Err(CommandError::NoOutcome),
    }
}

/// The watchdog fires every [`WATCHDOG_INTERVAL`] instructions.
pub(super) fn watchdog_triggers() -> HookTriggers {
    HookTriggers::new().every_nth_instruction(WATCHDOG_INTERVAL)
}

/// Kills the running script once its deadline passed. The hook is global so that coroutines
/// the script creates are watched too. After a kill it fires on every instruction, so that a
/// script catching the error with `pcall` can't run a single instruction more.
pub(super) fn watchdog(lua: &Lua, _: &LuaDebug<'_>) -> mlua::Result<VmState> {
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
pub(super) fn script_error(lua: &Lua, error: Value) -> mlua::Result<LuaString> {
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
pub(super) fn script_line(lua: &Lua) -> Option<usize> {
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
pub(super) fn redis_call(lua: &Lua, args: Variadic<Value>) -> mlua::Result<Value> {
    match script_command(lua, &args) {
        Reply::Error(text) => {
            let raised = RaisedReply(Bytes::from(normalize_error(&text)));
            Err(mlua::Error::external(raised))
        }
        reply => reply_to_lua(lua, &reply),
    }
}

/// Raises one of our errors into the script, as `redis.call` raises a command's error.
pub(super) fn raise(error: CommandError) -> mlua::Error {
    mlua::Error::external(RaisedReply(Bytes::from(error.to_string())))
}

/// `redis.pcall`: runs a command, returning errors as `{err = ...}` tables instead of raising.
pub(super) fn redis_pcall(lua: &Lua, args: Variadic<Value>) -> mlua::Result<Value> {
    reply_to_lua(lua, &script_command(lua, &args))
}

/// Runs the command a script asked for against the running script's keyspace.
pub(super) fn script_command(lua: &Lua, args: &[Value]) -> Reply {
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
pub(super) fn as_error_table(lua: &Lua, value: Value) -> mlua::Result<Value> {
    if let Value::Error(error) = &value
        && let Some(raised) = error.downcast_ref::<RaisedReply>()
    {
        return Ok(Value::Table(error_table(lua, &raised.0)?));
    }
    Ok(value)
}

/// The arguments of `redis.call`: strings, or numbers that Redis turns into strings.
pub(super) fn command_args(args: &[Value]) -> Result<Vec<Bytes>, CommandError> {
    if args.is_empty() {
        return Err(CommandError::NoScriptArguments);
    }
    args.iter()
        .map(|arg| lua_string_value(arg).ok_or(CommandError::BadScriptArgument))
        .collect()
}

/// A Lua value as a string, when Lua itself would treat it as one (strings and numbers).
pub(super) fn lua_string_value(value: &Value) -> Option<Bytes> {
    match value {
        Value::String(s) => Some(lua_bytes(s)),
        Value::Integer(i) => Some(int_bytes(*i)),
        Value::Number(n) => Some(Bytes::from(format_number(*n))),
        _ => None,
    }
}

/// Formats a Lua number for a command argument: integral values without a fraction (so
/// `ARGV[2] + pttl` gives `30000`, not `30000.0`), others in their shortest exact form.
pub(super) fn format_number(n: f64) -> String {
    // 2^63: every integral f64 below it in magnitude fits an i64.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if n.fract() == 0.0 && n.abs() < LIMIT {
        (n as i64).to_string()
    } else {
        n.to_string()
    }
}

/// `redis.error_reply(msg)`: `{err = msg}`, with `ERR ` added when msg has no error code.
pub(super) fn redis_error_reply(lua: &Lua, args: Variadic<Value>) -> mlua::Result<Table> {
    match args.as_slice() {
        [message] => match lua_string_value(message) {
            Some(message) => error_table(lua, &normalize_error(&message)),
            None => error_table(lua, &bad_helper_arguments()),
        },
        _ => error_table(lua, &bad_helper_arguments()),
    }
}

/// `redis.status_reply(msg)`: `{ok = msg}`.
pub(super) fn redis_status_reply(lua: &Lua, args: Variadic<Value>) -> mlua::Result<Table> {
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

pub(super) fn bad_helper_arguments() -> Vec<u8> {
    CommandError::BadHelperArguments.to_string().into_bytes()
}

/// `redis.sha1hex(s)`: the lowercase hex SHA1 of a string (of nothing for other values).
pub(super) fn redis_sha1hex(_: &Lua, args: Variadic<Value>) -> mlua::Result<String> {
    let [value] = args.as_slice() else {
        return Err(raise(CommandError::HelperArity));
    };
    Ok(sha1_hex(&lua_string_value(value).unwrap_or_default()))
}

/// Redis' normal form of a script error: a leading `-` dropped, `ERR ` added when the text has
/// no code (no space), line breaks at the ends trimmed.
pub(super) fn normalize_error(message: &[u8]) -> Vec<u8> {
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

pub(super) fn error_table(lua: &Lua, message: &[u8]) -> mlua::Result<Table> {
    let table = lua.create_table()?;
    table.raw_set("err", lua.create_string(message)?)?;
    Ok(table)
}

/// Redis → Lua, as the Redis docs define it: integer → number, bulk → string, nil → false,
/// array → table, status → `{ok = ...}`, error → `{err = ...}`.
pub(super) fn reply_to_lua(lua: &Lua, reply: &Reply) -> mlua::Result<Value> {
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
        Reply::Array(items) | Reply::Push(items) | Reply::Set(items) => Value::Table(lua_array(lua, items.iter())?),
        Reply::Map(pairs) => {
            let flat = pairs.iter().flat_map(|(key, value)| [key, value]);
            Value::Table(lua_array(lua, flat)?)
        }
        // RESP2 forms, which is what a script sees.
        Reply::Double(d) => Value::String(lua.create_string(format_number(*d))?),
        Reply::Bool(b) => Value::Integer(i64::from(*b)),
    })
}

pub(super) fn lua_array<'a>(lua: &Lua, items: impl Iterator<Item = &'a Reply>) -> mlua::Result<Table> {
    let table = lua.create_table()?;
    for (index, item) in items.enumerate() {
        table.raw_set(index + 1, reply_to_lua(lua, item)?)?;
    }
    Ok(table)
}

/// Lua → Redis, as the Redis docs define it, within a budget of values so that no table can
/// make the conversion run away.
pub(super) struct ReplyBuilder {
    pub(super) values_left: usize,
    /// Set when a value had to be left out for lack of budget.
    pub(super) overflowed: bool,
}

impl ReplyBuilder {
    pub(super) fn new() -> ReplyBuilder {
        ReplyBuilder {
            values_left: MAX_REPLY_VALUES,
            overflowed: false,
        }
    }

    /// The reply for a script's result, or an error if it was too large.
    pub(super) fn reply(mut self, value: &Value) -> Reply {
        let reply = self.convert(value, 0);
        if self.overflowed {
            return CommandError::ReplyTooLarge.into();
        }
        reply
    }

    /// number → integer (truncated toward zero), string → bulk, `{ok=}` → status, `{err=}` →
    /// error, other table → array up to its first nil, false → nil, true → 1, anything else
    /// → nil.
    pub(super) fn convert(&mut self, value: &Value, depth: usize) -> Reply {
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

    pub(super) fn table(&mut self, table: &Table, depth: usize) -> Reply {
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
