//! Who may do what: the `requirepass` password, named users with their key patterns, and
//! the checks made on every command.
//!
//! Passwords are kept only as SHA-256 digests and compared in constant time.

// Every match on a command names each variant (no `_ =>`): a forgotten one is a compile error.
#![cfg_attr(not(test), deny(clippy::wildcard_enum_match_arm))]

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::command::Local;
use crate::command::{ClientCmd, Command, ScriptCmd};
use crate::config::Config;
use crate::error::{ClientError, StartError};
use crate::glob;

/// A named user, as authenticated.
#[derive(Debug)]
pub struct Identity {
    /// The user's name.
    pub name: String,
    password: [u8; 32],
    patterns: Vec<Vec<u8>>,
    admin: bool,
}

impl Identity {
    /// Whether the user may touch `key`.
    pub fn may_touch(&self, key: &[u8]) -> bool {
        self.patterns.iter().any(|p| glob::matches(p, key))
    }
}

/// The proxy's users.
#[derive(Debug, Default)]
pub struct Access {
    requirepass: Option<[u8; 32]>,
    users: HashMap<Vec<u8>, Arc<Identity>>,
}

impl Access {
    /// The users of a validated configuration.
    pub fn new(config: &Config) -> Result<Access, StartError> {
        let mut users = HashMap::new();
        for user in &config.users {
            let password = match (&user.password, &user.password_sha256) {
                (Some(clear), _) => digest(clear.as_bytes()),
                (None, Some(hex)) => from_hex(hex)
                    .ok_or_else(|| StartError::Config(format!("users.{}: bad password_sha256", user.name)))?,
                (None, None) => return Err(StartError::Config(format!("users.{}: no password", user.name))),
            };
            let identity = Identity {
                name: user.name.clone(),
                password,
                patterns: user.keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
                admin: user.admin,
            };
            users.insert(user.name.as_bytes().to_vec(), Arc::new(identity));
        }
        Ok(Access {
            requirepass: config.requirepass.as_deref().map(|p| digest(p.as_bytes())),
            users,
        })
    }

    /// Whether clients may run commands without `AUTH`.
    pub fn open(&self) -> bool {
        self.requirepass.is_none() && self.users.is_empty()
    }

    /// Checks credentials. `Ok(None)` is the default user (all keys, all commands);
    /// `Ok(Some(user))` a named user.
    pub fn authenticate(&self, user: Option<&[u8]>, password: &[u8]) -> Result<Option<Arc<Identity>>, ClientError> {
        let given = digest(password);
        match user {
            None | Some(b"default") => match &self.requirepass {
                Some(expected) if same(expected, &given) => Ok(None),
                Some(_) => Err(ClientError::WrongPass),
                // The default user is disabled when only named users are configured.
                None if !self.users.is_empty() => Err(ClientError::WrongPass),
                None if user.is_some() => Ok(None),
                None => Err(ClientError::AuthNotConfigured),
            },
            Some(name) => match self.users.get(name) {
                Some(identity) if same(&identity.password, &given) => Ok(Some(identity.clone())),
                _ => Err(ClientError::WrongPass),
            },
        }
    }
}

/// Whether `user` (`None`: the default user) is an operator: the default user, or a named
/// user with `admin = true`. Operators run `PROXY` and `SCRIPT FLUSH` and see the masters in
/// `INFO`.
pub fn is_operator(user: Option<&Identity>) -> bool {
    user.is_none_or(|u| u.admin)
}

/// Whether `user` (`None`: the default user) may run `command`: named users only touch keys
/// matching their patterns (a script's declared KEYS included) and run the operator's
/// commands only when they are admins.
pub fn permit(user: Option<&Identity>, command: &Command) -> Result<(), ClientError> {
    let Some(user) = user else { return Ok(()) };
    let admin_only = match command {
        Command::Proxy(_) => Some("proxy"),
        Command::Local(Local::Client(ClientCmd::Kill(_))) => Some("client|kill"),
        Command::Script(ScriptCmd::Flush) => Some("script|flush"),
        Command::Local(_)
        | Command::Acquire(_)
        | Command::Set(_)
        | Command::SetNx { .. }
        | Command::DelEx(_)
        | Command::Expire(_)
        | Command::Eval(_)
        | Command::Script(_)
        | Command::Forward(_)
        | Command::Multi
        | Command::Exec
        | Command::Discard
        | Command::Watch(_)
        | Command::Unwatch
        | Command::Recipe(_)
        | Command::BlPop { .. } => None,
    };
    if let Some(name) = admin_only
        && !is_operator(Some(user))
    {
        return Err(ClientError::NoPermCommand {
            user: user.name.clone(),
            command: name.into(),
        });
    }
    match command.keys().iter().find(|k| !user.may_touch(k)) {
        Some(key) => Err(ClientError::NoPermKey {
            user: user.name.clone(),
            key: String::from_utf8_lossy(key).into_owned(),
        }),
        None => Ok(()),
    }
}

fn digest(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Compares digests without leaking, through timing, how much of a guess was right.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn from_hex(hex: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args;
    use crate::config::User;

    fn access(requirepass: Option<&str>) -> Access {
        let config = Config {
            requirepass: requirepass.map(str::to_owned),
            users: vec![
                User {
                    name: "billing".into(),
                    password: Some("pw".into()),
                    password_sha256: None,
                    keys: vec!["lock:billing:*".into()],
                    admin: false,
                },
                User {
                    name: "ops".into(),
                    password: None,
                    // sha256("opspw")
                    password_sha256: Some(format!("{:x}", Sha256::digest(b"opspw"))),
                    keys: vec!["*".into()],
                    admin: true,
                },
            ],
            ..Config::default()
        };
        Access::new(&config).unwrap()
    }

    #[test]
    fn named_users_and_the_default_user() {
        let a = access(Some("root"));
        assert!(!a.open());
        assert_eq!(a.authenticate(None, b"root").unwrap().map(|u| u.name.clone()), None);
        assert_eq!(
            a.authenticate(Some(b"billing"), b"pw").unwrap().unwrap().name,
            "billing"
        );
        assert_eq!(a.authenticate(Some(b"ops"), b"opspw").unwrap().unwrap().name, "ops");
        assert_eq!(
            a.authenticate(Some(b"billing"), b"nope").unwrap_err(),
            ClientError::WrongPass
        );
        assert_eq!(
            a.authenticate(Some(b"ghost"), b"pw").unwrap_err(),
            ClientError::WrongPass
        );
        assert_eq!(
            access(None).authenticate(None, b"x").unwrap_err(),
            ClientError::WrongPass
        );
        assert!(Access::default().open());
    }

    #[test]
    fn key_patterns_and_admin_commands() {
        let a = access(None);
        let billing = a.authenticate(Some(b"billing"), b"pw").unwrap().unwrap();
        let set = |key: &str| Command::parse(args(&format!("SET {key} t NX PX 1000"))).unwrap();
        assert!(permit(Some(&billing), &set("lock:billing:42")).is_ok());
        let err = permit(Some(&billing), &set("lock:orders:1")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "NOPERM User billing has no permissions to access the 'lock:orders:1' key"
        );
        let eval = Command::parse(args("EVAL return 1 1 lock:orders:1")).unwrap();
        assert!(
            permit(Some(&billing), &eval).is_err(),
            "a script's declared KEYS are checked"
        );
        let proxy = Command::parse(args("PROXY BACKENDS")).unwrap();
        assert!(permit(Some(&billing), &proxy).is_err());
        let flush = Command::parse(args("SCRIPT FLUSH")).unwrap();
        assert!(permit(Some(&billing), &flush).is_err(), "SCRIPT FLUSH is for admins");
        assert!(!a.open(), "named users alone: no client is in without AUTH");
        let ops = a.authenticate(Some(b"ops"), b"opspw").unwrap().unwrap();
        assert!(permit(Some(&ops), &proxy).is_ok());
        assert!(permit(None, &proxy).is_ok(), "the default user may do everything");
    }
}
