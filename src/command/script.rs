//! `EVAL`, `EVALSHA` and `SCRIPT`.

use bytes::Bytes;

use super::spec::Spec;
use super::{Command, arity_error, from, nth, parse_int};
use crate::error::ClientError;

/// Which script to run.
#[derive(Clone, Debug, PartialEq)]
pub enum ScriptRef {
    /// `EVAL`: the script's source.
    Body(Bytes),
    /// `EVALSHA`: the SHA1 of a script loaded earlier, lower-cased.
    Sha(Bytes),
}

/// `EVAL script numkeys key... arg...` or `EVALSHA sha1 numkeys key... arg...`.
#[derive(Clone, Debug, PartialEq)]
pub struct Eval {
    /// The script or its SHA1.
    pub script: ScriptRef,
    /// How many of `keys_and_args` are keys.
    pub numkeys: usize,
    /// The keys, then the arguments.
    pub keys_and_args: Vec<Bytes>,
}

impl Eval {
    /// The declared keys.
    pub fn keys(&self) -> &[Bytes] {
        // `numkeys` was checked against the arguments when parsed; never a panic all the same.
        self.keys_and_args.get(..self.numkeys).unwrap_or(&[])
    }

    /// The arguments after the keys.
    pub fn argv(&self) -> &[Bytes] {
        self.keys_and_args.get(self.numkeys..).unwrap_or(&[])
    }
}

/// `SCRIPT LOAD | EXISTS | FLUSH`.
#[derive(Clone, Debug, PartialEq)]
pub enum ScriptCmd {
    /// `SCRIPT LOAD source`.
    Load(Bytes),
    /// `SCRIPT EXISTS sha1 ...`.
    Exists(Vec<Bytes>),
    /// `SCRIPT FLUSH [ASYNC|SYNC]`.
    Flush,
}

/// Parses `EVAL`/`EVALSHA`.
pub fn parse_eval(mut args: Vec<Bytes>) -> Result<Command, ClientError> {
    if args.len() < 3 {
        return Err(arity_error(&args));
    }
    let numkeys = parse_int(nth(&args, 2)?)?;
    // Conversions that cannot wrap: a client's numkeys is any 64-bit number.
    let numkeys = usize::try_from(numkeys).map_err(|_| ClientError::NegativeKeys)?;
    if numkeys > args.len().saturating_sub(3) {
        return Err(ClientError::TooManyKeys);
    }
    let is_sha = nth(&args, 0)?.eq_ignore_ascii_case(b"EVALSHA");
    let keys_and_args = args.split_off(3);
    let script = if is_sha {
        ScriptRef::Sha(Bytes::from(nth(&args, 1)?.to_ascii_lowercase()))
    } else {
        ScriptRef::Body(nth(&args, 1)?.clone())
    };
    Ok(Command::Eval(Eval {
        script,
        numkeys,
        keys_and_args,
    }))
}

/// Parses `SCRIPT <subcommand>` (the table has checked the arity).
pub fn parse_script(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let cmd = match spec.name {
        "script|load" => ScriptCmd::Load(nth(&args, 2)?.clone()),
        "script|exists" => ScriptCmd::Exists(
            from(&args, 2)
                .iter()
                .map(|s| Bytes::from(s.to_ascii_lowercase()))
                .collect(),
        ),
        "script|flush" if args.len() <= 3 => ScriptCmd::Flush,
        _ => return Err(ClientError::WrongArity(spec.name.to_owned())),
    };
    Ok(Command::Script(cmd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args;

    #[test]
    fn eval_splits_keys_and_args() {
        let Command::Eval(e) = Command::parse(args("EVAL body 2 k1 k2 a1")).unwrap() else {
            panic!()
        };
        assert_eq!(e.keys(), &args("k1 k2")[..]);
        assert_eq!(e.argv(), &args("a1")[..]);
        assert_eq!(e.script, ScriptRef::Body(Bytes::from_static(b"body")));
    }

    #[test]
    fn evalsha_lowercases_the_sha() {
        let Command::Eval(e) = Command::parse(args("evalsha ABC 0")).unwrap() else {
            panic!()
        };
        assert_eq!(e.script, ScriptRef::Sha(Bytes::from_static(b"abc")));
    }

    #[test]
    fn eval_errors_match_redis() {
        let err = |l: &str| Command::parse(args(l)).unwrap_err().to_string();
        assert_eq!(
            err("EVAL s 2 k"),
            "ERR Number of keys can't be greater than number of args"
        );
        assert_eq!(err("EVAL s -1"), "ERR Number of keys can't be negative");
        assert_eq!(err("EVAL s x"), "ERR value is not an integer or out of range");
        assert_eq!(err("EVAL s"), "ERR wrong number of arguments for 'eval' command");
        assert_eq!(err("SCRIPT NOPE"), "ERR unknown subcommand 'NOPE'. Try SCRIPT HELP.");
        assert_eq!(
            err("SCRIPT LOAD"),
            "ERR wrong number of arguments for 'script|load' command"
        );
        assert_eq!(
            err("SCRIPT FLUSH SYNC x"),
            "ERR wrong number of arguments for 'script|flush' command"
        );
    }
}
