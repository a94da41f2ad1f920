//! Commands the proxy answers itself, without the masters: connection state and
//! introspection that clients send when they connect.

use bytes::Bytes;

use super::{Command, arity_error, from, nth, parse_int, unknown_command};
use crate::error::ClientError;
use crate::reply::Protocol;

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

/// `COMMAND [COUNT | DOCS | INFO | LIST]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandCmd {
    /// `COMMAND`, `COMMAND DOCS`, `COMMAND INFO`, `COMMAND LIST`: the proxy publishes no
    /// command table; an empty reply is valid and keeps `redis-cli` happy.
    Table,
    /// `COMMAND COUNT`.
    Count,
}

/// Parses the connection commands; anything else is an unknown command.
pub fn parse(upper_name: &[u8], args: Vec<Bytes>) -> Result<Command, ClientError> {
    let n = args.len();
    let cmd = match upper_name {
        b"PING" if n <= 2 => Command::Ping(args.get(1).cloned()),
        b"ECHO" if n == 2 => Command::Echo(nth(&args, 1)?.clone()),
        b"QUIT" => Command::Quit,
        b"RESET" if n == 1 => Command::Reset,
        b"HELLO" => Command::Hello(parse_hello(&args)?),
        b"AUTH" if n == 2 => Command::Auth {
            user: None,
            password: nth(&args, 1)?.clone(),
        },
        b"AUTH" if n == 3 => Command::Auth {
            user: Some(nth(&args, 1)?.clone()),
            password: nth(&args, 2)?.clone(),
        },
        b"SELECT" if n == 2 => Command::Select(parse_int(nth(&args, 1)?)?),
        b"CLIENT" if n >= 2 => Command::Client(parse_client(&args)?),
        b"INFO" => Command::Info(from(&args, 1).to_vec()),
        b"COMMAND" => Command::Command(parse_command(&args)?),
        b"PROXY" if n >= 2 => Command::Proxy(parse_proxy(&args)?),
        b"MULTI" if n == 1 => Command::Multi,
        b"EXEC" if n == 1 => Command::Exec,
        b"DISCARD" if n == 1 => Command::Discard,
        b"WATCH" if n >= 2 => Command::Watch(from(&args, 1).to_vec()),
        b"UNWATCH" if n == 1 => Command::Unwatch,
        b"CONFIG" if n >= 3 && args.get(1).is_some_and(|a| a.eq_ignore_ascii_case(b"GET")) => {
            Command::ConfigGet(from(&args, 2).to_vec())
        }
        b"PING" | b"ECHO" | b"RESET" | b"AUTH" | b"SELECT" | b"CLIENT" | b"CONFIG" | b"MULTI" | b"EXEC"
        | b"DISCARD" | b"WATCH" | b"UNWATCH" | b"PROXY" => {
            return Err(arity_error(&args));
        }
        _ => return Err(unknown_command(&args)),
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

fn parse_client(args: &[Bytes]) -> Result<ClientCmd, ClientError> {
    let sub = nth(args, 1)?.to_ascii_uppercase();
    let wrong_arity = || ClientError::WrongArity(format!("client|{}", String::from_utf8_lossy(&sub).to_lowercase()));
    let n = args.len();
    Ok(match sub.as_slice() {
        b"SETNAME" if n == 3 => ClientCmd::SetName(nth(args, 2)?.clone()),
        b"GETNAME" if n == 2 => ClientCmd::GetName,
        b"ID" if n == 2 => ClientCmd::Id,
        b"SETINFO" if n == 4 => ClientCmd::SetInfo,
        b"INFO" if n == 2 => ClientCmd::Info,
        b"KILL" if n == 4 && args.get(2).is_some_and(|a| a.eq_ignore_ascii_case(b"ID")) => {
            ClientCmd::Kill(u64::try_from(parse_int(nth(args, 3)?)?).map_err(|_| ClientError::NotInteger)?)
        }
        b"KILL" if n == 4 => return Err(ClientError::Syntax),
        b"SETNAME" | b"GETNAME" | b"ID" | b"SETINFO" | b"INFO" | b"KILL" => return Err(wrong_arity()),
        _ => {
            return Err(ClientError::UnknownSubcommand {
                cmd: "CLIENT".into(),
                sub: String::from_utf8_lossy(nth(args, 1)?).into_owned(),
            });
        }
    })
}

fn parse_proxy(args: &[Bytes]) -> Result<ProxyCmd, ClientError> {
    let sub = nth(args, 1)?.to_ascii_uppercase();
    let lift = args.get(3).map(|a| a.eq_ignore_ascii_case(b"LIFT"));
    match (sub.as_slice(), args.len(), lift) {
        (b"BACKENDS", 2, _) => Ok(ProxyCmd::Backends),
        (b"CONFIG", 2, _) => Ok(ProxyCmd::Config),
        (b"LOCKS", 2, _) => Ok(ProxyCmd::Locks(None)),
        (b"LOCKS", 3, _) => Ok(ProxyCmd::Locks(Some(nth(args, 2)?.clone()))),
        (b"QUARANTINE", 3, _) => Ok(ProxyCmd::Quarantine {
            backend: nth(args, 2)?.clone(),
            lift: false,
        }),
        (b"QUARANTINE", 4, Some(true)) => Ok(ProxyCmd::Quarantine {
            backend: nth(args, 2)?.clone(),
            lift: true,
        }),
        (b"BACKENDS" | b"CONFIG" | b"LOCKS" | b"QUARANTINE", _, _) => Err(ClientError::Syntax),
        _ => Err(ClientError::UnknownSubcommand {
            cmd: "PROXY".into(),
            sub: String::from_utf8_lossy(nth(args, 1)?).into_owned(),
        }),
    }
}

fn parse_command(args: &[Bytes]) -> Result<CommandCmd, ClientError> {
    let Some(sub) = args.get(1) else {
        return Ok(CommandCmd::Table);
    };
    match sub.to_ascii_uppercase().as_slice() {
        b"COUNT" => Ok(CommandCmd::Count),
        b"DOCS" | b"INFO" | b"LIST" => Ok(CommandCmd::Table),
        _ => Err(ClientError::UnknownSubcommand {
            cmd: "COMMAND".into(),
            sub: String::from_utf8_lossy(sub).into_owned(),
        }),
    }
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
        let Command::Hello(h) = parse_line("HELLO 3 AUTH u p SETNAME me").unwrap() else {
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
            Command::Client(ClientCmd::SetInfo)
        );
        assert_eq!(
            parse_line("CLIENT KILL ID 7").unwrap(),
            Command::Client(ClientCmd::Kill(7))
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
    fn command_docs_for_redis_cli() {
        assert_eq!(parse_line("COMMAND DOCS").unwrap(), Command::Command(CommandCmd::Table));
    }
}
