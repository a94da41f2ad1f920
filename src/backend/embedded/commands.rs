//! The commands of the in-process master: the command table, each command's handler, and
//! `EVAL`/`EVALSHA`/`SCRIPT` handing scripts to [`super::lua`].

use super::*;

impl Inner {
    /// Looks the command up, checks its arity and runs it.
    pub(super) fn execute(&mut self, db: u32, now_ms: u64, args: &[Bytes]) -> Reply {
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
pub(super) struct Command {
    /// Lowercase, as Redis names it in errors.
    pub(super) name: &'static str,
    /// Redis' convention: `n` means exactly n arguments (name included), `-n` at least n.
    pub(super) arity: i32,
    pub(super) handler: Handler,
}

/// Data commands only touch the keyspace, so scripts may call them; scripting commands need
/// the Lua engine and are refused inside scripts.
#[derive(Clone, Copy)]
pub(super) enum Handler {
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

    pub(super) fn accepts(&self, argc: usize) -> bool {
        let wanted = self.arity.unsigned_abs() as usize;
        if self.arity < 0 { argc >= wanted } else { argc == wanted }
    }
}

pub(super) static COMMANDS: &[Command] = &[
    Command::data("ping", -1, ping),
    Command::data("echo", 2, echo),
    Command::data("get", 2, get),
    Command::data("mget", -2, mget),
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
    Command::data("type", 2, type_of),
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
    Command::data("time", 1, time),
    Command::data("hset", -4, hash::hset),
    Command::data("hget", 3, hash::hget),
    Command::data("hdel", -3, hash::hdel),
    Command::data("hkeys", 2, hash::hkeys),
    Command::data("hgetall", 2, hash::hgetall),
    Command::data("hexists", 3, hash::hexists),
    Command::data("hincrby", 4, hash::hincrby),
    Command::data("hlen", 2, hash::hlen),
    Command::data("zadd", -4, zset::zadd),
    Command::data("zscore", 3, zset::zscore),
    Command::data("zrem", -3, zset::zrem),
    Command::data("zrange", -4, zset::zrange),
    Command::data("zrangebyscore", -4, zset::zrangebyscore),
    Command::data("zremrangebyscore", 4, zset::zremrangebyscore),
    Command::data("zcard", 2, zset::zcard),
    Command::scripting("eval", -3, eval),
    Command::scripting("evalsha", -3, evalsha),
    Command::scripting("script", -2, script),
];

pub(super) fn lookup(name: &[u8]) -> Option<&'static Command> {
    COMMANDS
        .iter()
        .find(|command| name.eq_ignore_ascii_case(command.name.as_bytes()))
}

/// Redis' error for an unknown command quotes the name and the start of the arguments.
pub(super) fn unknown_command(args: &[Bytes]) -> CommandError {
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
pub(super) struct Exec<'a> {
    pub(super) store: &'a mut Store,
    pub(super) db: u32,
    /// Unix ms on the master's clock, the same for a whole command or script.
    pub(super) now_ms: u64,
    pub(super) identity: &'a Identity,
}

impl Exec<'_> {
    pub(super) fn entry(&mut self, key: &[u8]) -> Option<&mut Entry> {
        self.store.get_mut(self.db, key, self.now_ms)
    }

    /// Stores `value`, or deletes the key when its expiry is already past (as Redis does).
    pub(super) fn write(&mut self, key: &Bytes, value: Bytes, expires_at: Option<i64>) {
        match expires_at {
            Some(at) if at <= self.now() => {
                self.store.remove(self.db, key, self.now_ms);
            }
            _ => {
                let expires_at = expires_at.map(|at| u64::try_from(at).unwrap_or(0));
                let entry = Entry::string(value, expires_at);
                self.store.insert(self.db, key.clone(), entry, self.now_ms);
            }
        }
    }

    /// The string at `key` (`None` if missing); `WRONGTYPE` if it holds another type.
    pub(super) fn string(&mut self, key: &[u8]) -> Result<Option<Bytes>, CommandError> {
        match self.entry(key).map(|entry| &entry.value) {
            None => Ok(None),
            Some(Data::Str(value)) => Ok(Some(value.clone())),
            Some(_) => Err(CommandError::WrongType),
        }
    }

    /// Deletes `key` if its hash or sorted set is empty: Redis never keeps an empty one
    /// (`EXISTS` answers 0 once the last field or member is gone).
    pub(super) fn drop_if_empty(&mut self, key: &[u8]) {
        let empty = self.entry(key).is_some_and(|entry| match &entry.value {
            Data::Str(_) => false,
            Data::Hash(hash) => hash.is_empty(),
            Data::ZSet(zset) => zset.is_empty(),
        });
        if empty {
            self.store.remove(self.db, key, self.now_ms);
        }
    }

    /// Now as Redis computes expiries: signed milliseconds.
    pub(super) fn now(&self) -> i64 {
        i64::try_from(self.now_ms).unwrap_or(i64::MAX)
    }
}

// ---------------------------------------------------------------------------------------------
// Connection and string commands
// ---------------------------------------------------------------------------------------------

pub(super) fn ping(_: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    match args {
        [_] => Ok(Reply::status("PONG")),
        [_, message] => Ok(Reply::Bulk(message.clone())),
        _ => Err(CommandError::WrongArity("ping")),
    }
}

pub(super) fn echo(_: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, message] = args else {
        return Err(CommandError::WrongArity("echo"));
    };
    Ok(Reply::Bulk(message.clone()))
}

pub(super) fn get(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("get"));
    };
    Ok(value_reply(exec.string(key)?))
}

/// `MGET`: each key's value, nil where it is missing or holds another type than a string
/// (`MGET` never answers `WRONGTYPE`, in Redis either).
pub(super) fn mget(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let values = args
        .iter()
        .skip(1)
        .map(|key| value_reply(exec.string(key).ok().flatten()))
        .collect();
    Ok(Reply::Array(values))
}

pub(super) fn value_reply(value: Option<Bytes>) -> Reply {
    value.map_or(Reply::Nil, Reply::Bulk)
}

pub(super) fn set(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, value, options @ ..] = args else {
        return Err(CommandError::WrongArity("set"));
    };
    let options = SetOptions::parse(options)?;
    let expire_at = match options.expire {
        Some((kind, amount)) => Some(kind.deadline(amount, exec.now(), "set")?),
        None => None,
    };
    let old = exec.entry(key).cloned();
    // `SET` replaces a value of any type, but `GET` can only return a string's.
    let old_string = match old.as_ref().map(|entry| &entry.value) {
        None => None,
        Some(Data::Str(value)) => Some(value.clone()),
        Some(_) if options.get => return Err(CommandError::WrongType),
        Some(_) => None,
    };
    let old_value = || value_reply(old_string.clone());
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
pub(super) enum Condition {
    Nx,
    Xx,
}

/// The options of `SET` after the value.
#[derive(Default)]
pub(super) struct SetOptions<'a> {
    pub(super) condition: Option<Condition>,
    pub(super) get: bool,
    pub(super) keep_ttl: bool,
    pub(super) expire: Option<(ExpireKind, &'a Bytes)>,
}

impl<'a> SetOptions<'a> {
    /// Parses the options in any order and case, rejecting the combinations Redis rejects.
    /// The expire amount is only validated after all options parsed, as in Redis, so a bad
    /// option wins over a bad number.
    pub(super) fn parse(options: &'a [Bytes]) -> Result<SetOptions<'a>, CommandError> {
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
pub(super) enum ExpireKind {
    Ex,
    Px,
    ExAt,
    PxAt,
}

impl ExpireKind {
    pub(super) fn parse(option: &[u8]) -> Option<ExpireKind> {
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
    pub(super) fn deadline(self, amount: &[u8], now: i64, command: &'static str) -> Result<i64, CommandError> {
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

pub(super) fn setnx(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, value] = args else {
        return Err(CommandError::WrongArity("setnx"));
    };
    if exec.entry(key).is_some() {
        return Ok(Reply::Int(0));
    }
    exec.write(key, value.clone(), None);
    Ok(Reply::Int(1))
}

pub(super) fn getset(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, value] = args else {
        return Err(CommandError::WrongArity("getset"));
    };
    let old = exec.string(key)?;
    exec.write(key, value.clone(), None);
    Ok(value_reply(old))
}

/// `DEL` and `UNLINK`: the number of keys that existed.
pub(super) fn del(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let (db, now_ms) = (exec.db, exec.now_ms);
    let removed = args
        .iter()
        .skip(1)
        .filter(|key| exec.store.remove(db, key, now_ms).is_some())
        .count();
    Ok(count_reply(removed))
}

/// `EXISTS`: a key named twice counts twice, as in Redis.
pub(super) fn exists(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let (db, now_ms) = (exec.db, exec.now_ms);
    let found = args
        .iter()
        .skip(1)
        .filter(|key| exec.store.contains(db, key, now_ms))
        .count();
    Ok(count_reply(found))
}

pub(super) fn count_reply(count: usize) -> Reply {
    Reply::Int(i64::try_from(count).unwrap_or(i64::MAX))
}

pub(super) fn incr(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("incr"));
    };
    incr_by(exec, key, 1)
}

pub(super) fn decr(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("decr"));
    };
    incr_by(exec, key, -1)
}

pub(super) fn incrby(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, delta] = args else {
        return Err(CommandError::WrongArity("incrby"));
    };
    incr_by(exec, key, parse_i64(delta)?)
}

pub(super) fn decrby(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, delta] = args else {
        return Err(CommandError::WrongArity("decrby"));
    };
    let delta = parse_i64(delta)?.checked_neg().ok_or(CommandError::DecrementOverflow)?;
    incr_by(exec, key, delta)
}

/// Adds `delta` to the integer at `key` (0 if missing), keeping its expiry as Redis does.
pub(super) fn incr_by(exec: &mut Exec<'_>, key: &Bytes, delta: i64) -> CommandResult {
    let (value, expires_at) = match exec.entry(key) {
        Some(Entry {
            value: Data::Str(value),
            expires_at,
        }) => (parse_i64(value)?, *expires_at),
        Some(_) => return Err(CommandError::WrongType),
        None => (0, None),
    };
    let value = value.checked_add(delta).ok_or(CommandError::Overflow)?;
    let entry = Entry::string(int_bytes(value), expires_at);
    exec.store.insert(exec.db, key.clone(), entry, exec.now_ms);
    Ok(Reply::Int(value))
}

// ---------------------------------------------------------------------------------------------
// Expiry commands
// ---------------------------------------------------------------------------------------------

/// Whether an `EXPIRE` amount is relative to now or a Unix timestamp.
#[derive(Clone, Copy)]
pub(super) enum Base {
    Now,
    Epoch,
}

/// Whether an amount is in seconds or milliseconds.
#[derive(Clone, Copy)]
pub(super) enum Unit {
    Seconds,
    Millis,
}

pub(super) fn pexpire(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    expire_generic(exec, args, Base::Now, Unit::Millis, "pexpire")
}

pub(super) fn expire(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    expire_generic(exec, args, Base::Now, Unit::Seconds, "expire")
}

pub(super) fn pexpireat(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    expire_generic(exec, args, Base::Epoch, Unit::Millis, "pexpireat")
}

pub(super) fn expireat(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    expire_generic(exec, args, Base::Epoch, Unit::Seconds, "expireat")
}

/// The four `EXPIRE` commands. Unlike `SET`, they accept zero and negative amounts: an expiry
/// that is already past deletes the key.
pub(super) fn expire_generic(
    exec: &mut Exec<'_>,
    args: &[Bytes],
    base: Base,
    unit: Unit,
    command: &'static str,
) -> CommandResult {
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
pub(super) struct ExpireFlags {
    pub(super) nx: bool,
    pub(super) xx: bool,
    pub(super) gt: bool,
    pub(super) lt: bool,
}

impl ExpireFlags {
    pub(super) fn parse(options: &[Bytes]) -> Result<ExpireFlags, CommandError> {
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
    pub(super) fn allow(&self, current: Option<i64>, at: i64) -> bool {
        (!self.nx || current.is_none())
            && (!self.xx || current.is_some())
            && (!self.gt || current.is_some_and(|current| at > current))
            && (!self.lt || current.is_none_or(|current| at < current))
    }
}

pub(super) fn pttl(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    ttl_generic(exec, args, Unit::Millis, "pttl")
}

pub(super) fn ttl(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    ttl_generic(exec, args, Unit::Seconds, "ttl")
}

/// `-2` for a missing key, `-1` for a key without expiry, else the time left; seconds are
/// rounded to the nearest, as Redis does.
pub(super) fn ttl_generic(exec: &mut Exec<'_>, args: &[Bytes], unit: Unit, command: &'static str) -> CommandResult {
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

/// `TYPE`: `string`, `hash`, `zset`, or `none` for a missing key, as a status reply.
pub(super) fn type_of(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("type"));
    };
    let name = exec.entry(key).map_or("none", |entry| entry.value.type_name());
    Ok(Reply::status(name))
}

pub(super) fn persist(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("persist"));
    };
    let removed = exec.entry(key).and_then(|entry| entry.expires_at.take()).is_some();
    Ok(Reply::Int(i64::from(removed)))
}

// ---------------------------------------------------------------------------------------------
// Server commands
// ---------------------------------------------------------------------------------------------

pub(super) fn flushdb(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    check_flush_mode(args)?;
    exec.store.flush_db(exec.db);
    Ok(Reply::ok())
}

pub(super) fn flushall(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    check_flush_mode(args)?;
    exec.store.flush_all();
    Ok(Reply::ok())
}

/// `FLUSHDB` and `FLUSHALL` take an optional `SYNC` or `ASYNC` (both mean the same here).
pub(super) fn check_flush_mode(args: &[Bytes]) -> Result<(), CommandError> {
    match args {
        [_] => Ok(()),
        [_, mode] if is(mode, "sync") || is(mode, "async") => Ok(()),
        _ => Err(CommandError::Syntax),
    }
}

/// `SCAN cursor [MATCH pattern] [COUNT n]`: every matching key in one batch (cursor `0`).
/// Redis may return any number of keys per call; returning them all at once is allowed.
pub(super) fn scan(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
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

pub(super) fn dbsize(exec: &mut Exec<'_>, _: &[Bytes]) -> CommandResult {
    Ok(count_reply(exec.store.len(exec.db, exec.now_ms)))
}

pub(super) fn role(_: &mut Exec<'_>, _: &[Bytes]) -> CommandResult {
    Ok(Reply::Array(vec![
        Reply::bulk("master"),
        Reply::Int(0),
        Reply::Array(Vec::new()),
    ]))
}

/// `TIME`: the master's clock, as seconds and microseconds.
pub(super) fn time(exec: &mut Exec<'_>, _: &[Bytes]) -> CommandResult {
    Ok(Reply::Array(vec![
        Reply::Bulk(int_bytes((exec.now_ms / 1000) as i64)),
        Reply::Bulk(int_bytes(((exec.now_ms % 1000) * 1000) as i64)),
    ]))
}

pub(super) type InfoSection = fn(&mut Exec<'_>, &mut String);

/// The sections of `INFO`, in Redis' order.
pub(super) const INFO_SECTIONS: &[(&str, InfoSection)] = &[
    ("server", info_server),
    ("replication", info_replication),
    ("cluster", info_cluster),
    ("keyspace", info_keyspace),
];

/// `INFO [section ...]`: no section, `default`, `all` or `everything` mean every section.
pub(super) fn info(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
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
pub(super) fn info_field(out: &mut String, name: &str, value: impl fmt::Display) {
    // Writing to a String can't fail.
    let _ = write!(out, "{name}:{value}\r\n");
}

pub(super) fn info_server(exec: &mut Exec<'_>, out: &mut String) {
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

pub(super) fn info_replication(exec: &mut Exec<'_>, out: &mut String) {
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

pub(super) fn info_cluster(_: &mut Exec<'_>, out: &mut String) {
    out.push_str("# Cluster\r\n");
    info_field(out, "cluster_enabled", 0);
}

pub(super) fn info_keyspace(exec: &mut Exec<'_>, out: &mut String) {
    out.push_str("# Keyspace\r\n");
    for stats in exec.store.stats(exec.now_ms) {
        let value = format!("keys={},expires={},avg_ttl=0", stats.keys, stats.expires);
        info_field(out, &format!("db{}", stats.db), value);
    }
}

// ---------------------------------------------------------------------------------------------
// Scripting commands
// ---------------------------------------------------------------------------------------------

pub(super) fn eval(inner: &mut Inner, db: u32, now_ms: u64, args: &[Bytes]) -> CommandResult {
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

pub(super) fn evalsha(inner: &mut Inner, db: u32, now_ms: u64, args: &[Bytes]) -> CommandResult {
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
pub(super) fn split_keys<'a>(numkeys: &[u8], rest: &'a [Bytes]) -> Result<(&'a [Bytes], &'a [Bytes]), CommandError> {
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
pub(super) fn script(inner: &mut Inner, _: u32, _: u64, args: &[Bytes]) -> CommandResult {
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
pub(super) fn engine(slot: &mut Option<ScriptEngine>) -> Result<&mut ScriptEngine, CommandError> {
    let engine = match slot.take() {
        Some(engine) => engine,
        None => ScriptEngine::new().map_err(CommandError::lua)?,
    };
    Ok(slot.insert(engine))
}
