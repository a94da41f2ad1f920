//! Commands the proxy answers itself, without the masters: connection state and
//! introspection that clients send when they connect.

use bytes::Bytes;

use super::spec::Spec;
use super::{Command, arity_error, from, nth, parse_int};
use crate::error::ClientError;
use crate::reply::Protocol;

/// A command the connection answers itself, without the masters (`crate::connection`).
#[derive(Clone, Debug, PartialEq)]
pub enum Local {
    /// `PING [message]`.
    Ping(Option<Bytes>),
    /// `ECHO message`.
    Echo(Bytes),
    /// `QUIT`: reply `+OK`, then close.
    Quit,
    /// `RESET`: back to a fresh connection's state.
    Reset,
    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`.
    Hello(Hello),
    /// `AUTH [user] password`.
    Auth {
        /// The user name, when given.
        user: Option<Bytes>,
        /// The password.
        password: Bytes,
    },
    /// `SELECT index`.
    Select(i64),
    /// `CLIENT ...`.
    Client(ClientCmd),
    /// `INFO [section ...]`.
    Info(Vec<Bytes>),
    /// `COMMAND [COUNT | DOCS ... | INFO ... | LIST | GETKEYS ...]`.
    Command(CommandCmd),
    /// `<container> HELP` (`CLIENT HELP`, `PROXY HELP`, ...): the container's subcommands, from
    /// the command table.
    Help(&'static Spec),
    /// `CONFIG GET pattern ...`: the few parameters clients and tools ask for.
    ConfigGet(Vec<Bytes>),
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Hello {
    /// The protocol asked for; `None` keeps the current one.
    pub protocol: Option<Protocol>,
    /// `AUTH username password`.
    pub auth: Option<(Bytes, Bytes)>,
    /// `SETNAME clientname`.
    pub setname: Option<Bytes>,
}

/// `CLIENT <subcommand>`.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientCmd {
    /// `CLIENT SETNAME name`.
    SetName(Bytes),
    /// `CLIENT GETNAME`.
    GetName,
    /// `CLIENT ID`.
    Id,
    /// `CLIENT SETINFO LIB-NAME|LIB-VER value`: accepted and ignored.
    SetInfo,
    /// `CLIENT INFO`.
    Info,
    /// `CLIENT KILL ID id`: closes that client's connection (operators); its session locks
    /// are released as on any close.
    Kill(u64),
}

/// `PROXY <subcommand>`: the operator's commands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyCmd {
    /// `PROXY BACKENDS`: each master's address, state, run id and request statistics.
    Backends,
    /// `PROXY CONFIG`: the effective configuration, secrets masked.
    Config,
    /// `PROXY LEGACY`: the legacy member, and the old code's locks still held there.
    Legacy,
    /// `PROXY LOCKS [pattern]`: this proxy's session locks and wait queues.
    Locks(Option<Bytes>),
    /// `PROXY QUARANTINE <index|addr> [LIFT]`: quarantine a master now, or lift its quarantine.
    Quarantine {
        /// The master's index (as in `INFO backends`) or address.
        backend: Bytes,
        /// Lift instead of impose.
        lift: bool,
    },
}

/// `COMMAND [COUNT | DOCS | INFO | LIST | GETKEYS | GETKEYSANDFLAGS]`: answered from the
/// command table (`super::table`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandCmd {
    /// `COMMAND`: every command's `COMMAND INFO` entry.
    All,
    /// `COMMAND COUNT`.
    Count,
    /// `COMMAND INFO [name ...]`: these commands' entries (nil for an unknown name), or all.
    Info(Vec<Bytes>),
    /// `COMMAND DOCS [name ...]`: a map of these commands' docs (unknown names left out), or
    /// of all.
    Docs(Vec<Bytes>),
    /// `COMMAND LIST [FILTERBY ...]`: the names of commands and subcommands.
    List(Option<ListFilter>),
    /// `COMMAND GETKEYS command [arg ...]`, or with `flags` `COMMAND GETKEYSANDFLAGS`.
    GetKeys {
        /// The command whose keys are asked for, name first.
        args: Vec<Bytes>,
        /// Each key with its key-spec flags.
        flags: bool,
    },
}

/// `COMMAND LIST FILTERBY ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListFilter {
    /// `MODULE name`: the commands of a module (the proxy's own are module `redlock-proxy`'s).
    Module(Bytes),
    /// `ACLCAT category`: the commands in an ACL category.
    AclCat(Bytes),
    /// `PATTERN pattern`: the names matching a glob pattern.
    Pattern(Bytes),
}

/// Parses the connection commands (the table has checked the arity).
pub fn parse(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let n = args.len();
    let cmd = match spec.name {
        "ping" if n <= 2 => Command::Local(Local::Ping(args.get(1).cloned())),
        "echo" => Command::Local(Local::Echo(nth(&args, 1)?.clone())),
        "quit" => Command::Local(Local::Quit),
        "reset" => Command::Local(Local::Reset),
        "hello" => Command::Local(Local::Hello(parse_hello(&args)?)),
        "auth" if n == 2 => Command::Local(Local::Auth {
            user: None,
            password: nth(&args, 1)?.clone(),
        }),
        "auth" if n == 3 => Command::Local(Local::Auth {
            user: Some(nth(&args, 1)?.clone()),
            password: nth(&args, 2)?.clone(),
        }),
        "select" => Command::Local(Local::Select(parse_int(nth(&args, 1)?)?)),
        "info" => Command::Local(Local::Info(from(&args, 1).to_vec())),
        "multi" => Command::Multi,
        "exec" => Command::Exec,
        "discard" => Command::Discard,
        "watch" => Command::Watch(from(&args, 1).to_vec()),
        "unwatch" => Command::Unwatch,
        _ => return Err(arity_error(&args)),
    };
    Ok(cmd)
}

fn parse_hello(args: &[Bytes]) -> Result<Hello, ClientError> {
    let mut hello = Hello::default();
    let Some(version) = args.get(1) else {
        return Ok(hello);
    };
    hello.protocol = match parse_int(version) {
        Ok(2) => Some(Protocol::Resp2),
        Ok(3) => Some(Protocol::Resp3),
        Ok(_) => return Err(ClientError::NoProto),
        Err(_) => {
            return Err(ClientError::Unsupported(
                "Protocol version is not an integer or out of range".into(),
            ));
        }
    };
    let mut rest = from(args, 2);
    while let Some(word) = rest.first() {
        let word = word.to_ascii_uppercase();
        match (word.as_slice(), rest) {
            (b"AUTH", [_, user, pass, tail @ ..]) => {
                hello.auth = Some((user.clone(), pass.clone()));
                rest = tail;
            }
            (b"SETNAME", [_, name, tail @ ..]) => {
                hello.setname = Some(name.clone());
                rest = tail;
            }
            _ => {
                return Err(ClientError::Unsupported(format!(
                    "Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&word)
                )));
            }
        }
    }
    Ok(hello)
}

/// Parses `CLIENT <subcommand>`.
pub fn parse_client(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let client = match spec.name {
        "client|setname" => ClientCmd::SetName(nth(&args, 2)?.clone()),
        "client|getname" => ClientCmd::GetName,
        "client|id" => ClientCmd::Id,
        "client|setinfo" => ClientCmd::SetInfo,
        "client|info" => ClientCmd::Info,
        "client|kill" if args.get(2).is_some_and(|a| a.eq_ignore_ascii_case(b"ID")) => {
            ClientCmd::Kill(u64::try_from(parse_int(nth(&args, 3)?)?).map_err(|_| ClientError::NotInteger)?)
        }
        _ => return Err(ClientError::Syntax),
    };
    Ok(Command::Local(Local::Client(client)))
}

/// Parses `PROXY <subcommand>`.
pub fn parse_proxy(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let lift = args.get(3).map(|a| a.eq_ignore_ascii_case(b"LIFT"));
    let proxy = match (spec.name, args.len(), lift) {
        ("proxy|backends", _, _) => ProxyCmd::Backends,
        ("proxy|config", _, _) => ProxyCmd::Config,
        ("proxy|legacy", 2, _) => ProxyCmd::Legacy,
        ("proxy|locks", 2, _) => ProxyCmd::Locks(None),
        ("proxy|locks", 3, _) => ProxyCmd::Locks(Some(nth(&args, 2)?.clone())),
        ("proxy|quarantine", 3, _) => ProxyCmd::Quarantine {
            backend: nth(&args, 2)?.clone(),
            lift: false,
        },
        ("proxy|quarantine", 4, Some(true)) => ProxyCmd::Quarantine {
            backend: nth(&args, 2)?.clone(),
            lift: true,
        },
        _ => return Err(ClientError::Syntax),
    };
    Ok(Command::Proxy(proxy))
}

/// Parses `COMMAND [<subcommand>]`.
pub fn parse_command(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    let command = match spec.name {
        "command" => CommandCmd::All,
        "command|count" => CommandCmd::Count,
        "command|docs" => CommandCmd::Docs(from(&args, 2).to_vec()),
        "command|info" => CommandCmd::Info(from(&args, 2).to_vec()),
        "command|list" => CommandCmd::List(parse_filter(from(&args, 2))?),
        "command|getkeys" => CommandCmd::GetKeys {
            args: from(&args, 2).to_vec(),
            flags: false,
        },
        "command|getkeysandflags" => CommandCmd::GetKeys {
            args: from(&args, 2).to_vec(),
            flags: true,
        },
        _ => return Err(ClientError::Syntax),
    };
    Ok(Command::Local(Local::Command(command)))
}

/// `[FILTERBY MODULE name | ACLCAT category | PATTERN pattern]`.
fn parse_filter(rest: &[Bytes]) -> Result<Option<ListFilter>, ClientError> {
    let [filterby, kind, value] = rest else {
        return if rest.is_empty() {
            Ok(None)
        } else {
            Err(ClientError::Syntax)
        };
    };
    if !filterby.eq_ignore_ascii_case(b"FILTERBY") {
        return Err(ClientError::Syntax);
    }
    let value = value.clone();
    match kind.to_ascii_uppercase().as_slice() {
        b"MODULE" => Ok(Some(ListFilter::Module(value))),
        b"ACLCAT" => Ok(Some(ListFilter::AclCat(value))),
        b"PATTERN" => Ok(Some(ListFilter::Pattern(value))),
        _ => Err(ClientError::Syntax),
    }
}

/// Parses `CONFIG GET parameter [parameter ...]`, the one form served (the others Redis has
/// are refused, with the reason, by the table).
pub fn parse_config(_spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    Ok(Command::Local(Local::ConfigGet(from(&args, 2).to_vec())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args;

    fn parse_line(line: &str) -> Result<Command, ClientError> {
        Command::parse(args(line))
    }

    #[test]
    fn hello_with_auth_and_setname() {
        let Command::Local(Local::Hello(h)) = parse_line("HELLO 3 AUTH u p SETNAME me").unwrap() else {
            panic!()
        };
        assert_eq!(h.protocol, Some(Protocol::Resp3));
        assert_eq!(h.auth, Some((Bytes::from_static(b"u"), Bytes::from_static(b"p"))));
        assert_eq!(h.setname, Some(Bytes::from_static(b"me")));
    }

    #[test]
    fn hello_refuses_other_versions() {
        assert_eq!(
            parse_line("HELLO 4").unwrap_err().to_string(),
            "NOPROTO unsupported protocol version"
        );
        assert!(parse_line("HELLO 3 AUTH u").is_err());
    }

    #[test]
    fn client_subcommands() {
        assert_eq!(
            parse_line("client setinfo lib-name x").unwrap(),
            Command::Local(Local::Client(ClientCmd::SetInfo))
        );
        assert_eq!(
            parse_line("CLIENT KILL ID 7").unwrap(),
            Command::Local(Local::Client(ClientCmd::Kill(7)))
        );
        assert_eq!(
            parse_line("CLIENT KILL x").unwrap_err().to_string(),
            "ERR wrong number of arguments for 'client|kill' command"
        );
        assert_eq!(
            parse_line("CLIENT KILL ADDR 1.2.3.4:5").unwrap_err().to_string(),
            "ERR syntax error"
        );
        assert_eq!(
            parse_line("CLIENT NOPE x").unwrap_err().to_string(),
            "ERR unknown subcommand 'NOPE'. Try CLIENT HELP."
        );
    }

    #[test]
    fn command_subcommands() {
        assert_eq!(parse_line("COMMAND").unwrap(), Command::Local(Local::Command(CommandCmd::All)));
        assert_eq!(
            parse_line("command docs").unwrap(),
            Command::Local(Local::Command(CommandCmd::Docs(vec![])))
        );
        assert_eq!(
            parse_line("COMMAND INFO get lock.acquire").unwrap(),
            Command::Local(Local::Command(CommandCmd::Info(args("get lock.acquire"))))
        );
        assert_eq!(
            parse_line("COMMAND LIST filterby aclcat write").unwrap(),
            Command::Local(Local::Command(CommandCmd::List(Some(ListFilter::AclCat(Bytes::from_static(b"write"))))))
        );
        assert_eq!(
            parse_line("COMMAND LIST x").unwrap_err().to_string(),
            "ERR syntax error"
        );
        assert_eq!(
            parse_line("COMMAND COUNT x").unwrap_err().to_string(),
            "ERR wrong number of arguments for 'command|count' command"
        );
        assert_eq!(
            parse_line("COMMAND NOPE").unwrap_err().to_string(),
            "ERR unknown subcommand 'NOPE'. Try COMMAND HELP."
        );
    }
}
