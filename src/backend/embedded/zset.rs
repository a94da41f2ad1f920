//! Sorted sets of the embedded master: the value type and the commands the proxy's scripts call
//! on it (`ZADD`, `ZSCORE`, `ZREM`, `ZRANGE`, `ZRANGEBYSCORE`, `ZREMRANGEBYSCORE`, `ZCARD`),
//! with Redis 7's replies and errors.
//!
//! Members are ordered by score, then by their bytes, as in Redis. Scores are replied as Redis
//! 7.0 formats them (`%.17g`: `10`, `1.5`, `0.10000000000000001`, `1e+20`, `inf`), since
//! scripts read them back with `tonumber`. A set emptied by `ZREM` or `ZREMRANGEBYSCORE` is
//! deleted, as in Redis. `ZRANGE ... BYLEX` is not served.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use super::commands::{Exec, count_reply};
use super::*;

/// A score: never NaN (Redis refuses those), and `-0` stored as `0`, so the total order of
/// `f64::total_cmp` is the numeric order.
#[derive(Clone, Copy, Debug)]
pub struct Score(f64);

impl Score {
    fn new(value: f64) -> Score {
        // Adding zero turns -0 into 0 and changes nothing else.
        Score(value + 0.0)
    }
}

impl PartialEq for Score {
    fn eq(&self, other: &Score) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Score) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Score) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A sorted set: each member's score, and the members in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZSet {
    scores: HashMap<Bytes, Score>,
    order: BTreeSet<(Score, Bytes)>,
}

impl ZSet {
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    pub fn len(&self) -> usize {
        self.scores.len()
    }

    pub fn score(&self, member: &[u8]) -> Option<f64> {
        self.scores.get(member).map(|score| score.0)
    }

    /// Sets `member`'s score, adding it if new.
    pub fn insert(&mut self, member: &Bytes, score: f64) {
        let score = Score::new(score);
        if let Some(old) = self.scores.insert(member.clone(), score) {
            self.order.remove(&(old, member.clone()));
        }
        self.order.insert((score, member.clone()));
    }

    /// Removes `member`; true when it was there.
    pub fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.remove_entry(member) {
            Some((member, score)) => {
                self.order.remove(&(score, member));
                true
            }
            None => false,
        }
    }

    /// The members in order, lowest score first.
    fn ascending(&self) -> impl DoubleEndedIterator<Item = (&Bytes, f64)> {
        self.order.iter().map(|(score, member)| (member, score.0))
    }
}

/// One end of a score range: `1.5`, `(1.5` (exclusive), `-inf`, `+inf`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bound {
    value: f64,
    exclusive: bool,
}

impl Bound {
    fn parse(text: &[u8]) -> Result<Bound, CommandError> {
        let (exclusive, number) = match text.strip_prefix(b"(") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let value = parse_score(number).map_err(|_| CommandError::RangeNotAFloat)?;
        Ok(Bound { value, exclusive })
    }

    fn above_min(self, score: f64) -> bool {
        if self.exclusive {
            score > self.value
        } else {
            score >= self.value
        }
    }

    fn below_max(self, score: f64) -> bool {
        if self.exclusive {
            score < self.value
        } else {
            score <= self.value
        }
    }
}

/// Parses a score as Redis' `strtod` check does: a whole decimal number, `inf`, `+inf` or
/// `-inf`; never NaN.
pub(super) fn parse_score(text: &[u8]) -> Result<f64, CommandError> {
    std::str::from_utf8(text)
        .ok()
        .filter(|text| !text.starts_with(|c: char| c.is_ascii_whitespace()))
        .and_then(|text| text.parse::<f64>().ok())
        .filter(|value| !value.is_nan())
        .ok_or(CommandError::NotAFloat)
}

/// A score as Redis 7.0 replies it: `%.17g`, and `inf` / `-inf`.
pub(super) fn format_score(value: f64) -> String {
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if value == 0.0 {
        return "0".to_owned();
    }
    // 17 significant digits, then `%g`'s choice between fixed and exponent notation.
    let scientific = format!("{value:.16e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..17).contains(&exponent) {
        let decimals = usize::try_from(16 - exponent).unwrap_or(0);
        trim_fraction(&format!("{value:.decimals$}")).to_owned()
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_fraction(mantissa), exponent.unsigned_abs())
    }
}

/// `%g` drops a fraction's trailing zeros, and the point when nothing is left after it.
fn trim_fraction(number: &str) -> &str {
    if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.')
    } else {
        number
    }
}

fn score_reply(value: f64) -> Reply {
    Reply::Bulk(Bytes::from(format_score(value)))
}

impl Exec<'_> {
    /// The sorted set at `key` (`None` if missing); `WRONGTYPE` if it holds another type.
    fn zset(&mut self, key: &[u8]) -> Result<Option<&mut ZSet>, CommandError> {
        match self.entry(key).map(|entry| &mut entry.value) {
            None => Ok(None),
            Some(Data::ZSet(zset)) => Ok(Some(zset)),
            Some(_) => Err(CommandError::WrongType),
        }
    }
}

/// The options of `ZADD`.
#[derive(Default)]
struct ZaddFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

impl ZaddFlags {
    /// Reads the leading options; returns them and the score-member pairs after them, checked
    /// as Redis checks them.
    fn parse(args: &[Bytes]) -> Result<(ZaddFlags, Vec<Pair<'_>>), CommandError> {
        let mut flags = ZaddFlags::default();
        let mut rest = args;
        while let [option, tail @ ..] = rest {
            let flag = match () {
                () if is(option, "nx") => &mut flags.nx,
                () if is(option, "xx") => &mut flags.xx,
                () if is(option, "gt") => &mut flags.gt,
                () if is(option, "lt") => &mut flags.lt,
                () if is(option, "ch") => &mut flags.ch,
                () if is(option, "incr") => &mut flags.incr,
                () => break,
            };
            *flag = true;
            rest = tail;
        }
        if rest.is_empty() || !rest.len().is_multiple_of(2) {
            return Err(CommandError::Syntax);
        }
        if flags.nx && flags.xx {
            return Err(CommandError::ZaddXxNx);
        }
        if (flags.nx && (flags.gt || flags.lt)) || (flags.gt && flags.lt) {
            return Err(CommandError::ZaddGtLtNx);
        }
        if flags.incr && rest.len() > 2 {
            return Err(CommandError::ZaddIncrPair);
        }
        // Every score is checked before anything is written.
        let pairs = rest
            .chunks_exact(2)
            .map(|pair| Ok((parse_score(&pair[0])?, &pair[1])))
            .collect::<Result<Vec<_>, CommandError>>()?;
        Ok((flags, pairs))
    }
}

/// A score and its member, as `ZADD` takes them.
type Pair<'a> = (f64, &'a Bytes);

/// What `ZADD` did with one pair.
enum Added {
    New(f64),
    Changed(f64),
    /// Present with this score already, or refused by `NX`/`XX`/`GT`/`LT` (`None`).
    Kept(Option<f64>),
}

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]`: how many members
/// were added (and changed, with `CH`); with `INCR`, the new score, or nil when refused. `XX`
/// on a missing key creates nothing.
pub(super) fn zadd(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, rest @ ..] = args else {
        return Err(CommandError::WrongArity("zadd"));
    };
    let (flags, pairs) = ZaddFlags::parse(rest)?;
    let zset = match exec.zset(key)? {
        Some(zset) => zset,
        None if flags.xx => return Ok(if flags.incr { Reply::Nil } else { Reply::Int(0) }),
        None => {
            let entry = Entry {
                value: Data::ZSet(ZSet::default()),
                expires_at: None,
            };
            exec.store.insert(exec.db, key.clone(), entry, exec.now_ms);
            exec.zset(key)?.ok_or(CommandError::KeyspaceLost)?
        }
    };
    let (mut added, mut changed, mut last) = (0, 0, None);
    for (score, member) in pairs {
        let outcome = zadd_one(zset, &flags, score, member)?;
        last = match outcome {
            Added::New(score) => {
                added += 1;
                Some(score)
            }
            Added::Changed(score) => {
                changed += 1;
                Some(score)
            }
            Added::Kept(score) => score,
        };
    }
    if flags.incr {
        return Ok(last.map_or(Reply::Nil, score_reply));
    }
    Ok(count_reply(if flags.ch { added + changed } else { added }))
}

/// One pair of `ZADD`, as Redis' `zsetAdd`.
fn zadd_one(zset: &mut ZSet, flags: &ZaddFlags, score: f64, member: &Bytes) -> Result<Added, CommandError> {
    let Some(current) = zset.score(member) else {
        if flags.xx {
            return Ok(Added::Kept(None));
        }
        zset.insert(member, score);
        return Ok(Added::New(score));
    };
    if flags.nx {
        return Ok(Added::Kept(None));
    }
    let new = if flags.incr { current + score } else { score };
    if new.is_nan() {
        return Err(CommandError::ScoreNan);
    }
    if (flags.gt && new <= current) || (flags.lt && new >= current) {
        return Ok(Added::Kept(None));
    }
    if new == current {
        return Ok(Added::Kept(Some(new)));
    }
    zset.insert(member, new);
    Ok(Added::Changed(new))
}

/// `ZSCORE key member`: the score as a bulk string (scripts get a Lua string), or nil.
pub(super) fn zscore(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, member] = args else {
        return Err(CommandError::WrongArity("zscore"));
    };
    let score = exec.zset(key)?.and_then(|zset| zset.score(member));
    Ok(score.map_or(Reply::Nil, score_reply))
}

/// `ZREM key member [member ...]`: how many were removed; the key goes with its last member.
pub(super) fn zrem(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, members @ ..] = args else {
        return Err(CommandError::WrongArity("zrem"));
    };
    let Some(zset) = exec.zset(key)? else {
        return Ok(Reply::Int(0));
    };
    let removed = members.iter().filter(|member| zset.remove(member)).count();
    exec.drop_if_empty(key);
    Ok(count_reply(removed))
}

/// `ZCARD key`: the number of members, 0 for a missing key.
pub(super) fn zcard(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("zcard"));
    };
    let len = exec.zset(key)?.map_or(0, |zset| zset.len());
    Ok(count_reply(len))
}

/// `ZREMRANGEBYSCORE key min max`: how many were removed; the key goes with its last member.
pub(super) fn zremrangebyscore(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, min, max] = args else {
        return Err(CommandError::WrongArity("zremrangebyscore"));
    };
    let (min, max) = (Bound::parse(min)?, Bound::parse(max)?);
    let Some(zset) = exec.zset(key)? else {
        return Ok(Reply::Int(0));
    };
    let doomed: Vec<Bytes> = zset
        .ascending()
        .filter(|(_, score)| min.above_min(*score) && max.below_max(*score))
        .map(|(member, _)| member.clone())
        .collect();
    for member in &doomed {
        zset.remove(member);
    }
    exec.drop_if_empty(key);
    Ok(count_reply(doomed.len()))
}

/// How a `ZRANGE` selects its members.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RangeBy {
    Rank,
    Score,
    Lex,
}

/// The options of `ZRANGE` and `ZRANGEBYSCORE` after `start stop`.
struct RangeOptions {
    by: RangeBy,
    rev: bool,
    with_scores: bool,
    /// `LIMIT offset count`: offset 0 and count -1 (everything) unless given.
    offset: i64,
    count: i64,
}

impl RangeOptions {
    /// Parses the options in any order, as Redis does; `fixed_by` for `ZRANGEBYSCORE`, which
    /// takes no `BYSCORE`/`BYLEX`/`REV`.
    fn parse(options: &[Bytes], fixed_by: Option<RangeBy>) -> Result<RangeOptions, CommandError> {
        let mut parsed = RangeOptions {
            by: fixed_by.unwrap_or(RangeBy::Rank),
            rev: false,
            with_scores: false,
            offset: 0,
            count: -1,
        };
        let mut rest = options;
        while let [option, tail @ ..] = rest {
            rest = tail;
            if is(option, "withscores") {
                parsed.with_scores = true;
            } else if is(option, "limit") && rest.len() >= 2 {
                parsed.offset = parse_i64(&rest[0])?;
                parsed.count = parse_i64(&rest[1])?;
                rest = &rest[2..];
            } else if fixed_by.is_none() && is(option, "byscore") {
                parsed.by = RangeBy::Score;
            } else if fixed_by.is_none() && is(option, "bylex") {
                parsed.by = RangeBy::Lex;
            } else if fixed_by.is_none() && is(option, "rev") {
                parsed.rev = true;
            } else {
                return Err(CommandError::Syntax);
            }
        }
        if parsed.by == RangeBy::Rank && (parsed.offset != 0 || parsed.count != -1) {
            return Err(CommandError::LimitWithoutBy);
        }
        if parsed.by == RangeBy::Lex {
            return Err(CommandError::ByLexUnsupported);
        }
        Ok(parsed)
    }
}

/// `ZRANGE key start stop [BYSCORE] [REV] [LIMIT offset count] [WITHSCORES]`.
pub(super) fn zrange(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, start, stop, options @ ..] = args else {
        return Err(CommandError::WrongArity("zrange"));
    };
    let options = RangeOptions::parse(options, None)?;
    range(exec, key, start, stop, &options)
}

/// `ZRANGEBYSCORE key min max [WITHSCORES] [LIMIT offset count]`.
pub(super) fn zrangebyscore(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, min, max, options @ ..] = args else {
        return Err(CommandError::WrongArity("zrangebyscore"));
    };
    let options = RangeOptions::parse(options, Some(RangeBy::Score))?;
    range(exec, key, min, max, &options)
}

/// The members a range selects, flattened with their scores if asked: `member, score, ...`
/// (RESP2's shape, which is also what scripts see).
fn range(exec: &mut Exec<'_>, key: &[u8], start: &[u8], stop: &[u8], options: &RangeOptions) -> CommandResult {
    let selected = match options.by {
        RangeBy::Score => {
            // With `REV` the first bound is the maximum.
            let (max, min) = if options.rev { (start, stop) } else { (stop, start) };
            let (min, max) = (Bound::parse(min)?, Bound::parse(max)?);
            let zset = exec.zset(key)?;
            by_score(zset.as_deref(), min, max, options)
        }
        _ => {
            let (start, stop) = (parse_i64(start)?, parse_i64(stop)?);
            let zset = exec.zset(key)?;
            by_rank(zset.as_deref(), start, stop, options.rev)
        }
    };
    let reply = selected
        .into_iter()
        .flat_map(|(member, score)| {
            let score = options.with_scores.then(|| score_reply(score));
            std::iter::once(Reply::Bulk(member)).chain(score)
        })
        .collect();
    Ok(Reply::Array(reply))
}

/// Members by rank: negative ranks count from the end, out-of-range ends are clamped.
fn by_rank(zset: Option<&ZSet>, start: i64, stop: i64, rev: bool) -> Vec<(Bytes, f64)> {
    let Some(zset) = zset else {
        return Vec::new();
    };
    let len = i64::try_from(zset.len()).unwrap_or(i64::MAX);
    let start = if start < 0 { (start + len).max(0) } else { start };
    let stop = if stop < 0 { stop + len } else { stop.min(len - 1) };
    if start > stop || start >= len {
        return Vec::new();
    }
    let skip = usize::try_from(start).unwrap_or(usize::MAX);
    let take = usize::try_from(stop - start + 1).unwrap_or(0);
    let pick = |(member, score): (&Bytes, f64)| (member.clone(), score);
    if rev {
        zset.ascending().rev().skip(skip).take(take).map(pick).collect()
    } else {
        zset.ascending().skip(skip).take(take).map(pick).collect()
    }
}

/// Members by score, lowest first (highest first with `REV`), then `LIMIT`: a negative offset
/// selects nothing, a negative count everything after the offset.
fn by_score(zset: Option<&ZSet>, min: Bound, max: Bound, options: &RangeOptions) -> Vec<(Bytes, f64)> {
    let Some(zset) = zset else {
        return Vec::new();
    };
    let Ok(skip) = usize::try_from(options.offset) else {
        return Vec::new();
    };
    let take = usize::try_from(options.count).unwrap_or(usize::MAX);
    let inside = |(_, score): &(&Bytes, f64)| min.above_min(*score) && max.below_max(*score);
    let pick = |(member, score): (&Bytes, f64)| (member.clone(), score);
    if options.rev {
        zset.ascending()
            .rev()
            .filter(inside)
            .skip(skip)
            .take(take)
            .map(pick)
            .collect()
    } else {
        zset.ascending()
            .filter(inside)
            .skip(skip)
            .take(take)
            .map(pick)
            .collect()
    }
}
