//! What the command table says of each command ([`Spec`]): its name, arity, flags, key
//! positions, documentation, and the function that parses it; the rows themselves are in
//! [`super::table`].

use bytes::Bytes;

use super::{Command, parse_int};
use crate::error::ClientError;

/// The proxy's version: the `since` of its own commands.
pub(crate) const PROXY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Complexity of a command sent to every master.
pub(crate) const ON_EACH_MASTER: &str = "O(1) on each master, all masters at once";

/// Parses a command (or a subcommand) whose arity was already checked against its [`Spec`].
pub type Parse = fn(&'static Spec, Vec<Bytes>) -> Result<Command, ClientError>;

/// How a command is served.
pub enum Handler {
    /// Parsed by this function.
    Parse(Parse),
    /// A container (`CLIENT`, `CONFIG`, ...): the second argument names the subcommand.
    Container {
        /// The command alone, with no subcommand (`COMMAND`); `None`: an arity error.
        bare: Option<(Parse, &'static str)>,
        /// The subcommands, `HELP` included.
        subcommands: &'static [Spec],
    },
    /// A container's `HELP`: answered from the container's subcommands.
    Help,
}

/// One command or subcommand the proxy serves.
pub struct Spec {
    /// Lower case, as Redis lists it: `get`, `lock.acquire`, `client|kill`.
    pub name: &'static str,
    /// Redis's convention: n exactly n arguments (the name counts), -n at least n.
    pub arity: i32,
    /// Command flags (`write`, `readonly`, `fast`, ...), in Redis's order.
    pub flags: &'static [&'static str],
    /// ACL categories (`@write`, `@slow`, ...).
    pub acl: &'static [&'static str],
    /// Command tips (`nondeterministic_output`, ...).
    pub tips: &'static [&'static str],
    /// Where the keys are, when the command has any.
    pub keys: Option<KeySpec>,
    /// One line: what the command does through the proxy.
    pub summary: &'static str,
    /// The Redis version that introduced it, or the proxy's for its own commands.
    pub since: &'static str,
    /// Redis's command group; `module` for the proxy's own commands.
    pub group: &'static str,
    /// Its time complexity.
    pub complexity: &'static str,
    /// Its arguments after the name (after the subcommand's name for a subcommand).
    pub args: &'static [Arg],
    /// How it is served.
    pub handler: Handler,
}

impl PartialEq for Spec {
    /// Names are unique in the table.
    fn eq(&self, other: &Spec) -> bool {
        self.name == other.name
    }
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Spec({})", self.name)
    }
}

impl Spec {
    pub(crate) const fn new(name: &'static str, arity: i32, handler: Handler) -> Spec {
        Spec {
            name,
            arity,
            flags: &[],
            acl: &[],
            tips: &[],
            keys: None,
            summary: "",
            since: "",
            group: "",
            complexity: "",
            args: &[],
            handler,
        }
    }

    pub(crate) const fn flags(mut self, flags: &'static [&'static str], acl: &'static [&'static str]) -> Spec {
        self.flags = flags;
        self.acl = acl;
        self
    }

    pub(crate) const fn tips(mut self, tips: &'static [&'static str]) -> Spec {
        self.tips = tips;
        self
    }

    pub(crate) const fn keys(mut self, keys: KeySpec) -> Spec {
        self.keys = Some(keys);
        self
    }

    pub(crate) const fn doc(
        mut self,
        summary: &'static str,
        since: &'static str,
        group: &'static str,
        complexity: &'static str,
    ) -> Spec {
        self.summary = summary;
        self.since = since;
        self.group = group;
        self.complexity = complexity;
        self
    }

    pub(crate) const fn args(mut self, args: &'static [Arg]) -> Spec {
        self.args = args;
        self
    }

    /// A subcommand's own name (`kill` of `client|kill`); a command's whole name.
    pub fn short_name(&self) -> &'static str {
        self.name.split_once('|').map_or(self.name, |(_, sub)| sub)
    }

    /// The subcommands of a container; none for any other command.
    pub fn subcommands(&self) -> &'static [Spec] {
        match self.handler {
            Handler::Container { subcommands, .. } => subcommands,
            Handler::Parse(_) | Handler::Help => &[],
        }
    }

    /// Whether it is one of the proxy's own commands (described as a module's).
    pub fn is_native(&self) -> bool {
        self.group == "module"
    }

    /// Whether `argc` arguments (the name included) fit the arity.
    pub(crate) fn arity_fits(&self, argc: usize) -> bool {
        let argc = i64::try_from(argc).unwrap_or(i64::MAX);
        let arity = i64::from(self.arity);
        if arity >= 0 {
            argc == arity
        } else {
            argc >= arity.saturating_neg()
        }
    }

    /// `COMMAND INFO`'s first key, last key and step (the "legacy" range): 0 0 0 for a
    /// command whose keys are counted by an argument (`EVAL`) or that has none.
    pub fn key_range(&self) -> (i64, i64, i64) {
        match self.keys {
            Some(KeySpec {
                begin,
                find: Find::Range { last, step },
                ..
            }) => {
                let first = i64::from(begin);
                let last = if last >= 0 {
                    first.saturating_add(i64::from(last))
                } else {
                    i64::from(last)
                };
                (first, last, i64::from(step))
            }
            _ => (0, 0, 0),
        }
    }
}

/// Where a command's keys are, in Redis's key-spec terms: the search for the first key begins
/// at argument `begin`, then the keys are found by `find`.
#[derive(Clone, Copy, Debug)]
pub struct KeySpec {
    /// Key-spec flags (`RW`, `access`, `update`, ...).
    pub flags: &'static [&'static str],
    /// The index of the first key (or of the key count), the name being argument 0.
    pub begin: u8,
    /// How the keys are found from there.
    pub find: Find,
}

/// How the keys are found from [`KeySpec::begin`].
#[derive(Clone, Copy, Debug)]
pub enum Find {
    /// Every `step`th argument from `begin` to the last key: `begin + last` when `last` ≥ 0,
    /// else the argument `-last` from the end (-1: the last argument).
    Range {
        /// See above.
        last: i8,
        /// See above.
        step: u8,
    },
    /// The argument at `begin + keynumidx` counts the keys, which start at `begin + first`.
    Keynum {
        /// See above.
        keynumidx: u8,
        /// See above.
        first: u8,
        /// See above.
        step: u8,
    },
}

pub(crate) const fn range(flags: &'static [&'static str], begin: u8, last: i8) -> KeySpec {
    KeySpec {
        flags,
        begin,
        find: Find::Range { last, step: 1 },
    }
}

/// An argument as `COMMAND DOCS` describes it (and `redis-cli` shows it as a hint).
#[derive(Debug)]
pub struct Arg {
    /// Its name, shown in hints.
    pub name: &'static str,
    /// What it is.
    pub kind: ArgKind,
    /// The word that introduces it (`WAIT` of `WAIT ms`), or the word itself (a pure token).
    pub token: Option<&'static str>,
    /// It may be left out.
    pub optional: bool,
    /// It may be repeated.
    pub multiple: bool,
}

/// The type of an [`Arg`], as Redis names it.
#[derive(Debug)]
pub enum ArgKind {
    /// A key (of the command's one key spec).
    Key,
    /// A string.
    String,
    /// An integer.
    Integer,
    /// A number with decimals.
    Double,
    /// A glob pattern.
    Pattern,
    /// A Unix time.
    UnixTime,
    /// A word alone ([`Arg::token`]).
    PureToken,
    /// One of these.
    OneOf(&'static [Arg]),
    /// All of these, in order.
    Block(&'static [Arg]),
}

impl ArgKind {
    /// Redis's name of the type.
    pub fn name(&self) -> &'static str {
        match self {
            ArgKind::Key => "key",
            ArgKind::String => "string",
            ArgKind::Integer => "integer",
            ArgKind::Double => "double",
            ArgKind::Pattern => "pattern",
            ArgKind::UnixTime => "unix-time",
            ArgKind::PureToken => "pure-token",
            ArgKind::OneOf(_) => "oneof",
            ArgKind::Block(_) => "block",
        }
    }
}

impl Arg {
    pub(crate) const fn new(name: &'static str, kind: ArgKind) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            optional: false,
            multiple: false,
        }
    }

    pub(crate) const fn optional(mut self) -> Arg {
        self.optional = true;
        self
    }

    pub(crate) const fn multiple(mut self) -> Arg {
        self.multiple = true;
        self
    }

    /// Introduced by `token` (`WAIT ms`).
    pub(crate) const fn after(mut self, token: &'static str) -> Arg {
        self.token = Some(token);
        self
    }
}

pub(crate) const fn key(name: &'static str) -> Arg {
    Arg::new(name, ArgKind::Key)
}

pub(crate) const fn string(name: &'static str) -> Arg {
    Arg::new(name, ArgKind::String)
}

pub(crate) const fn integer(name: &'static str) -> Arg {
    Arg::new(name, ArgKind::Integer)
}

/// A word alone: `name` is the word in lower case.
pub(crate) const fn word(name: &'static str, token: &'static str) -> Arg {
    Arg::new(name, ArgKind::PureToken).after(token)
}

pub(crate) const fn one_of(name: &'static str, args: &'static [Arg]) -> Arg {
    Arg::new(name, ArgKind::OneOf(args))
}

pub(crate) const fn block(name: &'static str, args: &'static [Arg]) -> Arg {
    Arg::new(name, ArgKind::Block(args))
}

/// The indexes of the keys `keys` finds in `args`; `None` when a key count does not fit.
pub(crate) fn positions(keys: &KeySpec, args: &[Bytes]) -> Option<Vec<usize>> {
    let begin = usize::from(keys.begin);
    let (first, last, step) = match keys.find {
        Find::Range { last, step } => {
            let last = if last >= 0 {
                begin.checked_add(usize::try_from(last).ok()?)?
            } else {
                args.len().checked_sub(usize::from(last.unsigned_abs()))?
            };
            (begin, last, step)
        }
        Find::Keynum { keynumidx, first, step } => {
            let count = parse_int(args.get(begin.checked_add(usize::from(keynumidx))?)?).ok()?;
            let count = usize::try_from(count).ok()?;
            let first = begin.checked_add(usize::from(first))?;
            if count == 0 {
                return Some(Vec::new());
            }
            let last = first.checked_add(count.checked_sub(1)?.checked_mul(usize::from(step))?)?;
            (first, last, step)
        }
    };
    if last >= args.len() {
        return None;
    }
    Some((first..=last).step_by(usize::from(step.max(1))).collect())
}

/// The keys of `args` by the table: those of a forwarded command (`Command::Forward`).
pub(crate) fn keys_of(spec: &Spec, args: &[Bytes]) -> Vec<Bytes> {
    let Some(keys) = &spec.keys else {
        return Vec::new();
    };
    positions(keys, args)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| args.get(i).cloned())
        .collect()
}
