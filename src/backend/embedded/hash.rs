//! Hashes of the embedded master: the value type and the commands the proxy's scripts call on
//! it (`HSET`, `HGET`, `HDEL`, `HKEYS`, `HGETALL`, `HEXISTS`, `HINCRBY`, `HLEN`), with Redis 7's
//! replies and errors.
//!
//! Fields keep their insertion order, as a small Redis hash (a listpack) does: `HKEYS` lists
//! them in the order they were first set. A hash emptied by `HDEL` is deleted, as in Redis.

use super::commands::{Exec, count_reply, value_reply};
use super::*;

/// A hash: fields and values in insertion order. The proxy's hashes hold a handful of fields
/// (a reentrant lock's owner, expiry and holds), for which a vector is the fastest map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hash {
    fields: Vec<(Bytes, Bytes)>,
}

impl Hash {
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn get(&self, field: &[u8]) -> Option<&Bytes> {
        self.fields
            .iter()
            .find(|(name, _)| name == field)
            .map(|(_, value)| value)
    }

    /// Sets `field`; true when it is new.
    pub fn set(&mut self, field: &Bytes, value: Bytes) -> bool {
        match self.fields.iter_mut().find(|(name, _)| name == field) {
            Some((_, old)) => {
                *old = value;
                false
            }
            None => {
                self.fields.push((field.clone(), value));
                true
            }
        }
    }

    /// Removes `field`, keeping the others' order; true when it was there.
    pub fn remove(&mut self, field: &[u8]) -> bool {
        let before = self.fields.len();
        self.fields.retain(|(name, _)| name != field);
        self.fields.len() < before
    }

    pub fn iter(&self) -> impl Iterator<Item = &(Bytes, Bytes)> {
        self.fields.iter()
    }
}

impl Exec<'_> {
    /// The hash at `key` (`None` if missing); `WRONGTYPE` if it holds another type.
    fn hash(&mut self, key: &[u8]) -> Result<Option<&mut Hash>, CommandError> {
        match self.entry(key).map(|entry| &mut entry.value) {
            None => Ok(None),
            Some(Data::Hash(hash)) => Ok(Some(hash)),
            Some(_) => Err(CommandError::WrongType),
        }
    }

    /// The hash at `key`, created empty (without expiry) if missing; the caller must leave a
    /// field in it, since Redis never keeps an empty hash.
    fn hash_or_create(&mut self, key: &Bytes) -> Result<&mut Hash, CommandError> {
        if self.hash(key)?.is_none() {
            let entry = Entry {
                value: Data::Hash(Hash::default()),
                expires_at: None,
            };
            self.store.insert(self.db, key.clone(), entry, self.now_ms);
        }
        self.hash(key)?.ok_or(CommandError::KeyspaceLost)
    }
}

/// `HSET key field value [field value ...]`: how many fields are new. An existing hash keeps
/// its expiry.
pub(super) fn hset(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, pairs @ ..] = args else {
        return Err(CommandError::WrongArity("hset"));
    };
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        return Err(CommandError::WrongArity("hset"));
    }
    let hash = exec.hash_or_create(key)?;
    let added = pairs
        .chunks_exact(2)
        .filter(|pair| hash.set(&pair[0], pair[1].clone()))
        .count();
    Ok(count_reply(added))
}

/// `HGET key field`: the value, or nil.
pub(super) fn hget(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, field] = args else {
        return Err(CommandError::WrongArity("hget"));
    };
    let value = exec.hash(key)?.and_then(|hash| hash.get(field).cloned());
    Ok(value_reply(value))
}

/// `HDEL key field [field ...]`: how many fields were removed; the key goes with its last field.
pub(super) fn hdel(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, fields @ ..] = args else {
        return Err(CommandError::WrongArity("hdel"));
    };
    let Some(hash) = exec.hash(key)? else {
        return Ok(Reply::Int(0));
    };
    let removed = fields.iter().filter(|field| hash.remove(field)).count();
    exec.drop_if_empty(key);
    Ok(count_reply(removed))
}

/// `HKEYS key`: the fields, an empty array for a missing key.
pub(super) fn hkeys(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("hkeys"));
    };
    let fields = exec
        .hash(key)?
        .map(|hash| hash.iter().map(|(field, _)| Reply::Bulk(field.clone())).collect())
        .unwrap_or_default();
    Ok(Reply::Array(fields))
}

/// `HGETALL key`: field, value, field, value...
pub(super) fn hgetall(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("hgetall"));
    };
    let flat = exec
        .hash(key)?
        .map(|hash| {
            hash.iter()
                .flat_map(|(field, value)| [Reply::Bulk(field.clone()), Reply::Bulk(value.clone())])
                .collect()
        })
        .unwrap_or_default();
    Ok(Reply::Array(flat))
}

/// `HEXISTS key field`: 1 or 0.
pub(super) fn hexists(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, field] = args else {
        return Err(CommandError::WrongArity("hexists"));
    };
    let found = exec.hash(key)?.is_some_and(|hash| hash.get(field).is_some());
    Ok(Reply::Int(i64::from(found)))
}

/// `HINCRBY key field increment`: the new value; a missing field counts as 0. The increment
/// is checked before the hash is touched, so a bad one creates nothing.
pub(super) fn hincrby(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key, field, increment] = args else {
        return Err(CommandError::WrongArity("hincrby"));
    };
    let increment = parse_i64(increment)?;
    let current = match exec.hash(key)?.and_then(|hash| hash.get(field)) {
        Some(value) => parse_i64(value).map_err(|_| CommandError::HashValueNotInteger)?,
        None => 0,
    };
    let value = current.checked_add(increment).ok_or(CommandError::Overflow)?;
    exec.hash_or_create(key)?.set(field, int_bytes(value));
    Ok(Reply::Int(value))
}

/// `HLEN key`: the number of fields, 0 for a missing key.
pub(super) fn hlen(exec: &mut Exec<'_>, args: &[Bytes]) -> CommandResult {
    let [_, key] = args else {
        return Err(CommandError::WrongArity("hlen"));
    };
    let len = exec.hash(key)?.map_or(0, |hash| hash.len());
    Ok(count_reply(len))
}
