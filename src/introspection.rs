//! `COMMAND` (`COUNT`, `INFO`, `DOCS`, `LIST`, `GETKEYS`, `GETKEYSANDFLAGS`) and every
//! container's `HELP`, answered from the command table ([`crate::command::table`]) in Redis 7's
//! reply shapes, so that `redis-cli` shows hints for the proxy's commands and client libraries'
//! introspection works.
//!
//! The shapes follow Redis: a `COMMAND INFO` entry is `[name, arity, flags, first key, last
//! key, step, ACL categories, tips, key specs, subcommands]`, its flags and categories sets;
//! `COMMAND DOCS` a map of name → `{summary, since, group, complexity, [module], [arguments],
//! [subcommands]}`. Maps and sets are RESP3's, flattened to arrays for RESP2 clients by
//! [`Reply::encode`].

use bytes::Bytes;

use crate::command::spec::{Arg, ArgKind, Find, Handler, KeySpec, Spec};
use crate::command::table::{self, TABLE};
use crate::command::{CommandCmd, ListFilter};
use crate::glob;
use crate::reply::Reply;

/// The module the proxy's own commands belong to, in `COMMAND DOCS` and `COMMAND LIST
/// FILTERBY MODULE`.
pub const MODULE: &str = "redlock-proxy";

/// Answers a `COMMAND` form.
pub fn command(command: &CommandCmd) -> Reply {
    match command {
        CommandCmd::All => Reply::Array(TABLE.iter().map(|spec| info(spec)).collect()),
        CommandCmd::Count => Reply::Int(i64::try_from(TABLE.len()).unwrap_or(i64::MAX)),
        CommandCmd::Info(names) if names.is_empty() => Reply::Array(TABLE.iter().map(|spec| info(spec)).collect()),
        CommandCmd::Info(names) => Reply::Array(
            names
                .iter()
                .map(|name| table::lookup_full(name).map_or(Reply::Nil, info))
                .collect(),
        ),
        CommandCmd::Docs(names) if names.is_empty() => {
            Reply::Map(TABLE.iter().map(|spec| (Reply::bulk(spec.name), docs(spec))).collect())
        }
        CommandCmd::Docs(names) => Reply::Map(
            names
                .iter()
                .filter_map(|name| table::lookup_full(name))
                .map(|spec| (Reply::bulk(spec.name), docs(spec)))
                .collect(),
        ),
        CommandCmd::List(filter) => {
            let specs = || {
                TABLE
                    .iter()
                    .flat_map(|spec| std::iter::once(*spec).chain(spec.subcommands()))
            };
            // A client's pattern is lowercased and read once, not once per command: its
            // length is paid once (rule 16, `crate::glob`).
            let lowered = match filter {
                Some(ListFilter::Pattern(pattern)) => Some(pattern.to_ascii_lowercase()),
                _ => None,
            };
            let longest = specs().map(|spec| spec.name.len()).max().unwrap_or(0);
            let pattern = lowered.as_deref().map(|p| glob::Pattern::new(p, longest));
            Reply::Array(
                specs()
                    .filter(|spec| match (&pattern, filter) {
                        (Some(pattern), _) => pattern.matches(spec.name.as_bytes()),
                        (None, Some(filter)) => passes(spec, filter),
                        (None, None) => true,
                    })
                    .map(|spec| Reply::bulk(spec.name))
                    .collect(),
            )
        }
        CommandCmd::GetKeys { args, flags } => match table::key_positions(args) {
            Ok(found) => Reply::Array(
                found
                    .into_iter()
                    .filter_map(|(i, key_flags)| {
                        let key = Reply::Bulk(args.get(i)?.clone());
                        Some(if *flags {
                            Reply::Array(vec![key, statuses(key_flags)])
                        } else {
                            key
                        })
                    })
                    .collect(),
            ),
            Err(e) => e.into(),
        },
    }
}

/// `<CONTAINER> HELP`: what Redis answers, for the subcommands the proxy serves: a line of
/// syntax per subcommand, then its summary, indented.
pub fn help(container: &Spec) -> Reply {
    let upper = container.name.to_ascii_uppercase();
    let mut lines = vec![format!(
        "{upper} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"
    )];
    if let Handler::Container {
        bare: Some((_, what)), ..
    } = container.handler
    {
        lines.push("(no subcommand)".to_owned());
        lines.push(format!("    {what}"));
    }
    for sub in container.subcommands() {
        let mut line = sub.short_name().to_ascii_uppercase();
        let syntax = help_syntax(sub.args);
        if !syntax.is_empty() {
            line.push(' ');
            line.push_str(&syntax);
        }
        lines.push(line);
        lines.push(format!("    {}", sub.summary));
    }
    Reply::Array(lines.into_iter().map(|l| Reply::Status(Bytes::from(l))).collect())
}

/// Arguments as Redis's `HELP` texts write them: `<name>`, `TOKEN <name>`, `[optional]`,
/// `(a|b)`, `<name> [<name> ...]`.
fn help_syntax(args: &[Arg]) -> String {
    args.iter().map(help_arg).collect::<Vec<_>>().join(" ")
}

fn help_arg(arg: &Arg) -> String {
    let value = match &arg.kind {
        ArgKind::PureToken => String::new(),
        ArgKind::OneOf(choices) => {
            let inner = choices.iter().map(help_arg).collect::<Vec<_>>().join("|");
            if arg.optional && arg.token.is_none() {
                inner
            } else {
                format!("({inner})")
            }
        }
        ArgKind::Block(items) => help_syntax(items),
        _ => format!("<{}>", arg.name),
    };
    let mut text = match (arg.token, value.is_empty()) {
        (Some(token), true) => token.to_owned(),
        (Some(token), false) => format!("{token} {value}"),
        (None, _) => value,
    };
    if arg.multiple {
        text = format!("{text} [{text} ...]");
    }
    if arg.optional {
        text = format!("[{text}]");
    }
    text
}

/// Whether `spec` passes a `COMMAND LIST FILTERBY` (a pattern is read once by the caller;
/// here it is read for this name alone).
fn passes(spec: &Spec, filter: &ListFilter) -> bool {
    match filter {
        ListFilter::Module(name) => spec.is_native() && name.eq_ignore_ascii_case(MODULE.as_bytes()),
        ListFilter::AclCat(category) => spec
            .acl
            .iter()
            .any(|c| c.trim_start_matches('@').as_bytes().eq_ignore_ascii_case(category)),
        ListFilter::Pattern(pattern) => glob::matches(&pattern.to_ascii_lowercase(), spec.name.as_bytes()),
    }
}

/// A set of simple strings (flags, ACL categories).
fn statuses(words: &[&'static str]) -> Reply {
    Reply::Set(
        words
            .iter()
            .map(|w| Reply::Status(Bytes::from_static(w.as_bytes())))
            .collect(),
    )
}

fn field(name: &'static str, value: Reply) -> (Reply, Reply) {
    (Reply::bulk(name), value)
}

fn int(n: impl Into<i64>) -> Reply {
    Reply::Int(n.into())
}

/// A `COMMAND INFO` entry.
fn info(spec: &'static Spec) -> Reply {
    let (first, last, step) = spec.key_range();
    let subcommands = match spec.subcommands() {
        [] => Reply::Set(Vec::new()),
        subs => Reply::Array(subs.iter().map(info).collect()),
    };
    Reply::Array(vec![
        Reply::bulk(spec.name),
        int(spec.arity),
        statuses(spec.flags),
        int(first),
        int(last),
        int(step),
        statuses(spec.acl),
        Reply::Set(spec.tips.iter().map(|t| Reply::bulk(*t)).collect()),
        Reply::Set(spec.keys.iter().map(key_spec).collect()),
        subcommands,
    ])
}

/// A key spec, as `COMMAND INFO` gives it.
fn key_spec(keys: &KeySpec) -> Reply {
    let find = match keys.find {
        Find::Range { last, step } => Reply::Map(vec![
            field("type", Reply::bulk("range")),
            field(
                "spec",
                Reply::Map(vec![
                    field("lastkey", int(last)),
                    field("keystep", int(step)),
                    field("limit", int(0)),
                ]),
            ),
        ]),
        Find::Keynum { keynumidx, first, step } => Reply::Map(vec![
            field("type", Reply::bulk("keynum")),
            field(
                "spec",
                Reply::Map(vec![
                    field("keynumidx", int(keynumidx)),
                    field("firstkey", int(first)),
                    field("keystep", int(step)),
                ]),
            ),
        ]),
    };
    Reply::Map(vec![
        field("flags", statuses(keys.flags)),
        field(
            "begin_search",
            Reply::Map(vec![
                field("type", Reply::bulk("index")),
                field("spec", Reply::Map(vec![field("index", int(keys.begin))])),
            ]),
        ),
        field("find_keys", find),
    ])
}

/// A command's `COMMAND DOCS` map.
fn docs(spec: &'static Spec) -> Reply {
    let mut fields = vec![
        field("summary", Reply::bulk(spec.summary)),
        field("since", Reply::bulk(spec.since)),
        field("group", Reply::bulk(spec.group)),
        field("complexity", Reply::bulk(spec.complexity)),
    ];
    if spec.is_native() {
        fields.push(field("module", Reply::bulk(MODULE)));
    }
    if !spec.args.is_empty() {
        fields.push(field("arguments", arguments(spec.args)));
    }
    if !spec.subcommands().is_empty() {
        let subs = spec.subcommands().iter().map(|sub| (Reply::bulk(sub.name), docs(sub)));
        fields.push(field("subcommands", Reply::Map(subs.collect())));
    }
    Reply::Map(fields)
}

/// `COMMAND DOCS`' `arguments`: an array of maps, in Redis's field order.
fn arguments(args: &'static [Arg]) -> Reply {
    Reply::Array(args.iter().map(argument).collect())
}

fn argument(arg: &'static Arg) -> Reply {
    let mut fields = vec![
        field("name", Reply::bulk(arg.name)),
        field("type", Reply::bulk(arg.kind.name())),
    ];
    if matches!(arg.kind, ArgKind::Key) {
        // Each command has at most one key spec.
        fields.push(field("key_spec_index", int(0)));
    }
    if let Some(token) = arg.token {
        fields.push(field("token", Reply::bulk(token)));
    }
    let flags: Vec<&'static str> = [(arg.optional, "optional"), (arg.multiple, "multiple")]
        .into_iter()
        .filter_map(|(set, flag)| set.then_some(flag))
        .collect();
    if !flags.is_empty() {
        fields.push(field("flags", statuses(&flags)));
    }
    if let ArgKind::OneOf(inner) | ArgKind::Block(inner) = &arg.kind {
        fields.push(field("arguments", arguments(inner)));
    }
    Reply::Map(fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::args;
    use crate::command::{Command, Local};
    use crate::reply::Protocol;
    use bytes::BytesMut;

    fn lines(reply: &Reply) -> Vec<String> {
        let Reply::Array(items) = reply else {
            panic!("{reply:?}")
        };
        items
            .iter()
            .map(|i| match i {
                Reply::Status(s) => String::from_utf8_lossy(s).into_owned(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn help_lists_what_is_served() {
        let Ok(Command::Local(Local::Help(proxy))) = Command::parse(args("PROXY HELP")) else {
            panic!()
        };
        let text = lines(&help(proxy));
        assert_eq!(
            text[0],
            "PROXY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"
        );
        assert!(text.contains(&"QUARANTINE <master> [LIFT]".to_owned()), "{text:?}");
        assert!(text.contains(&"LOCKS [<pattern>]".to_owned()), "{text:?}");
        assert_eq!(text[text.len() - 2..], ["HELP", "    Prints this help."]);
        let Ok(Command::Local(Local::Help(script))) = Command::parse(args("SCRIPT HELP")) else {
            panic!()
        };
        assert!(lines(&help(script)).contains(&"FLUSH [ASYNC|SYNC]".to_owned()));
        let Ok(Command::Local(Local::Help(command))) = Command::parse(args("COMMAND HELP")) else {
            panic!()
        };
        let command = lines(&help(command));
        assert_eq!(command[1], "(no subcommand)");
        assert!(
            command.contains(&"LIST [FILTERBY (MODULE <module-name>|ACLCAT <category>|PATTERN <pattern>)]".to_owned()),
            "{command:?}"
        );
    }

    #[test]
    fn count_is_the_number_of_entries() {
        let Reply::Array(all) = command(&CommandCmd::All) else {
            panic!()
        };
        assert_eq!(command(&CommandCmd::Count), Reply::Int(all.len() as i64));
    }

    #[test]
    fn info_of_an_unknown_name_is_nil_and_docs_leave_it_out() {
        let names = args("get nope client|kill");
        let Reply::Array(infos) = command(&CommandCmd::Info(names.clone())) else {
            panic!()
        };
        assert_eq!(infos[1], Reply::Nil);
        assert!(matches!(&infos[2], Reply::Array(entry) if entry[0] == Reply::bulk("client|kill")));
        let Reply::Map(docs) = command(&CommandCmd::Docs(names)) else {
            panic!()
        };
        assert_eq!(docs.len(), 2);
    }

    #[test]
    fn get_info_is_redis_shaped() {
        let Reply::Array(entry) = info(table::lookup(b"get").unwrap()) else {
            panic!()
        };
        let mut out = BytesMut::new();
        Reply::Array(entry).encode(Protocol::Resp3, &mut out);
        let wire = String::from_utf8_lossy(&out);
        assert!(
            wire.starts_with(
                "*10\r\n$3\r\nget\r\n:2\r\n~2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n~3\r\n+@read\r\n"
            ),
            "{wire}"
        );
    }

    #[test]
    fn list_filters() {
        let names = |filter| {
            let Reply::Array(names) = command(&CommandCmd::List(Some(filter))) else {
                panic!()
            };
            names
        };
        let native = names(ListFilter::Module(Bytes::from_static(b"redlock-proxy")));
        assert!(native.contains(&Reply::bulk("lock.acquire")) && native.contains(&Reply::bulk("proxy|locks")));
        assert!(!native.contains(&Reply::bulk("get")));
        assert_eq!(
            names(ListFilter::Pattern(Bytes::from_static(b"LOCK.*"))).len(),
            7,
            "the seven LOCK.* commands"
        );
        assert!(names(ListFilter::AclCat(Bytes::from_static(b"scripting"))).contains(&Reply::bulk("eval")));
    }
}
