//! Asking the proxy about itself, over three real masters: every container's `HELP`, the
//! unknown-subcommand error and the `HELP` it names, `COMMAND` / `COUNT` / `INFO` / `DOCS` /
//! `LIST` / `GETKEYS` in RESP2 and RESP3, the `CONFIG` forms the proxy does not serve, and
//! docs/commands.md against what the proxy answers (through `redis-cli`'s own reading of
//! `COMMAND DOCS`).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use redis::Value;
use support::{ProxyProcess, RedisServer, masters, urls};

/// The containers the proxy serves, each with a `HELP`.
const CONTAINERS: &[&str] = &["CLIENT", "COMMAND", "CONFIG", "SCRIPT", "PROXY"];

fn setup() -> (Vec<RedisServer>, ProxyProcess) {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    (servers, proxy)
}

fn query(c: &mut redis::Connection, line: &str) -> redis::RedisResult<Value> {
    let mut words = line.split_whitespace();
    let mut command = redis::cmd(words.next().expect("a command"));
    for word in words {
        command.arg(word);
    }
    command.query(c)
}

fn ok(c: &mut redis::Connection, line: &str) -> Value {
    query(c, line).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// The text of an error reply, code included (`ERR unknown subcommand ...`).
fn error(c: &mut redis::Connection, line: &str) -> String {
    match query(c, line) {
        Ok(v) => panic!("{line} answered {v:?}, not an error"),
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
    }
}

/// A RESP3 connection (`HELLO 3` when it connects).
fn resp3(proxy: &ProxyProcess) -> redis::Connection {
    redis::Client::open(format!("{}/?protocol=resp3", proxy.url()))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("RESP3 connection to the proxy")
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".into(),
        other => panic!("not a string: {other:?}"),
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(items) | Value::Set(items) => items,
        other => panic!("not an array: {other:?}"),
    }
}

/// A map reply as pairs: a RESP3 map, or a RESP2 flat array of keys and values.
fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        Value::Array(flat) => flat.chunks(2).map(|kv| (text(&kv[0]), kv[1].clone())).collect(),
        other => panic!("not a map: {other:?}"),
    }
}

fn get<'a>(fields: &'a [(String, Value)], name: &str) -> &'a Value {
    &fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name:?} among {fields:?}"))
        .1
}

/// `COMMAND LIST`: every command and subcommand, lower case (`client|kill`).
fn command_list(c: &mut redis::Connection) -> Vec<String> {
    items(&ok(c, "COMMAND LIST")).iter().map(text).collect()
}

#[test]
fn every_container_answers_help_with_what_it_serves() {
    let (_servers, proxy) = setup();
    let mut c = proxy.client();
    let list = command_list(&mut c);
    for container in CONTAINERS {
        let help = ok(&mut c, &format!("{container} HELP"));
        let lines: Vec<String> = items(&help)
            .iter()
            .map(|line| match line {
                Value::SimpleString(s) => s.clone(),
                other => panic!("{container} HELP: a line is not a simple string: {other:?}"),
            })
            .collect();
        assert_eq!(
            lines[0],
            format!("{container} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"),
            "{lines:#?}"
        );
        assert_eq!(
            lines[lines.len() - 2..],
            ["HELP", "    Prints this help."],
            "{lines:#?}"
        );
        // Each subcommand served has its line (the syntax, then its explanation indented),
        // and no line names a subcommand that is not served.
        let prefix = format!("{}|", container.to_lowercase());
        let served: BTreeSet<String> = list
            .iter()
            .filter_map(|name| name.strip_prefix(&prefix))
            .map(str::to_uppercase)
            .collect();
        let listed: BTreeSet<String> = lines[1..]
            .iter()
            .filter(|line| !line.starts_with(' ') && !line.starts_with('('))
            .map(|line| line.split(' ').next().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(
            listed, served,
            "{container} HELP lists exactly what is served: {lines:#?}"
        );
        for pair in lines[1..].chunks(2) {
            assert!(
                pair[1].starts_with("    ") && pair[1].len() > 8,
                "{container}: {pair:?}"
            );
        }
    }
    let config: Vec<String> = items(&ok(&mut c, "CONFIG HELP")).iter().map(text).collect();
    assert!(
        !config.iter().any(|l| l.starts_with("SET") || l.starts_with("REWRITE")),
        "CONFIG HELP lists only what is served: {config:?}"
    );
}

#[test]
fn an_unknown_subcommand_names_a_help_that_works() {
    let (_servers, proxy) = setup();
    let mut c = proxy.client();
    for container in CONTAINERS {
        let e = error(&mut c, &format!("{container} NOPE"));
        assert_eq!(e, format!("ERR unknown subcommand 'NOPE'. Try {container} HELP."));
        let named = e
            .strip_suffix('.')
            .and_then(|e| e.rsplit_once("Try "))
            .map(|(_, help)| help.to_owned())
            .expect("the error names a HELP");
        let help = ok(&mut c, &named);
        assert!(items(&help).len() >= 4, "{named}: {help:?}");
    }
    assert_eq!(
        error(&mut c, "CLIENT HELP extra"),
        "ERR wrong number of arguments for 'client|help' command"
    );
}

#[test]
fn command_count_is_the_number_of_entries_in_both_protocols() {
    let (_servers, proxy) = setup();
    for mut c in [proxy.client(), resp3(&proxy)] {
        let all = ok(&mut c, "COMMAND");
        let count = ok(&mut c, "COMMAND COUNT");
        assert_eq!(count, Value::Int(items(&all).len() as i64));
        let names: BTreeSet<String> = items(&all).iter().map(|entry| text(&items(entry)[0])).collect();
        for native in [
            "lock.acquire",
            "lock.extend",
            "lock.release",
            "lock.info",
            "lock.fence",
            "sem.acquire",
            "sem.extend",
            "sem.release",
            "sem.info",
            "proxy",
        ] {
            assert!(names.contains(native), "COMMAND lacks {native}: {names:?}");
        }
        let list = command_list(&mut c);
        let top: BTreeSet<String> = list.iter().filter(|n| !n.contains('|')).cloned().collect();
        assert_eq!(top, names, "COMMAND LIST's commands are COMMAND's");
        // `COMMAND INFO` with no name is `COMMAND`; `COMMAND DOCS` with none documents them all.
        assert_eq!(items(&ok(&mut c, "COMMAND INFO")).len(), names.len());
        let docs = pairs(&ok(&mut c, "COMMAND DOCS"));
        let documented: BTreeSet<String> = docs.iter().map(|(name, _)| name.clone()).collect();
        assert_eq!(documented, names, "every command has docs");
    }
}

/// Arity and key positions, as clients (redis-py's `COMMAND` parser, cluster clients) read them.
#[test]
fn command_info_gives_arity_flags_and_key_positions() {
    let (_servers, proxy) = setup();
    let mut c = proxy.client();
    let info = ok(&mut c, "COMMAND INFO lock.acquire GET nope client|kill eval");
    let entries = items(&info);
    assert_eq!(entries.len(), 5);
    let acquire = items(&entries[0]);
    assert_eq!(acquire.len(), 10, "Redis 7's ten fields: {acquire:?}");
    assert_eq!(text(&acquire[0]), "lock.acquire");
    assert_eq!(acquire[1], Value::Int(-4));
    let flags: Vec<String> = items(&acquire[2]).iter().map(text).collect();
    assert!(
        flags.contains(&"write".into()) && flags.contains(&"module".into()),
        "{flags:?}"
    );
    assert_eq!(acquire[3..6], [Value::Int(1), Value::Int(1), Value::Int(1)]);
    let get_entry = items(&entries[1]);
    assert_eq!((text(&get_entry[0]), &get_entry[1]), ("get".to_owned(), &Value::Int(2)));
    assert_eq!(entries[2], Value::Nil, "an unknown name is nil");
    let kill = items(&entries[3]);
    assert_eq!((text(&kill[0]), &kill[1]), ("client|kill".to_owned(), &Value::Int(4)));
    let eval = items(&entries[4]);
    assert_eq!(
        eval[3..6],
        [Value::Int(0), Value::Int(0), Value::Int(0)],
        "keys counted by numkeys"
    );
    let spec = pairs(&items(&eval[8])[0]);
    let find = pairs(get(&spec, "find_keys"));
    assert_eq!(text(get(&find, "type")), "keynum");

    // A container's entry holds its subcommands' entries.
    let proxy_info = ok(&mut c, "COMMAND INFO proxy");
    let subs = items(&items(&items(&proxy_info)[0])[9]);
    let names: BTreeSet<String> = subs.iter().map(|s| text(&items(s)[0])).collect();
    assert!(
        names.contains("proxy|quarantine") && names.contains("proxy|help"),
        "{names:?}"
    );

    assert_eq!(
        ok(&mut c, "COMMAND GETKEYS LOCK.ACQUIRE lock:a t 1000 KEEPALIVE"),
        Value::Array(vec![Value::BulkString(b"lock:a".to_vec())])
    );
    assert_eq!(
        ok(&mut c, "COMMAND GETKEYS EVAL s 2 a b x"),
        Value::Array(vec![Value::BulkString(b"a".to_vec()), Value::BulkString(b"b".to_vec())])
    );
    assert_eq!(
        error(&mut c, "COMMAND GETKEYS PING x"),
        "ERR The command has no key arguments"
    );
    assert_eq!(error(&mut c, "COMMAND GETKEYS NOPE x"), "ERR Invalid command specified");
    assert_eq!(
        error(&mut c, "COMMAND GETKEYS GET a b"),
        "ERR Invalid number of arguments specified for command"
    );
    let with_flags = ok(&mut c, "COMMAND GETKEYSANDFLAGS DEL a");
    let pair = items(&items(&with_flags)[0]);
    assert_eq!(text(&pair[0]), "a");
    assert!(items(&pair[1]).iter().map(text).any(|f| f == "delete"), "{pair:?}");
}

#[test]
fn lock_acquire_docs_have_a_summary_and_arguments() {
    let (_servers, proxy) = setup();
    let mut c = proxy.client();
    let docs = pairs(&ok(&mut c, "COMMAND DOCS lock.acquire nope"));
    assert_eq!(docs.len(), 1, "an unknown name is left out: {docs:?}");
    assert_eq!(docs[0].0, "lock.acquire");
    let fields = pairs(&docs[0].1);
    assert!(text(get(&fields, "summary")).contains("lock"), "{fields:?}");
    assert_eq!(text(get(&fields, "group")), "module");
    assert_eq!(text(get(&fields, "module")), "redlock-proxy");
    let args: Vec<Vec<(String, Value)>> = items(get(&fields, "arguments")).iter().map(pairs).collect();
    let names: Vec<String> = args.iter().map(|a| text(get(a, "name"))).collect();
    assert_eq!(names, ["key", "token", "ttl_ms", "ms", "keepalive", "reentrant"]);
    assert_eq!(text(get(&args[0], "type")), "key");
    assert_eq!(text(get(&args[3], "token")), "WAIT");
    assert_eq!(text(get(&args[4], "type")), "pure-token");
    let optional = |arg: &[(String, Value)]| items(get(arg, "flags")).iter().map(text).any(|f| f == "optional");
    assert!(optional(&args[3]) && optional(&args[4]));
}

#[test]
fn resp3_answers_maps_and_sets() {
    let (_servers, proxy) = setup();
    let mut c = resp3(&proxy);
    let docs = ok(&mut c, "COMMAND DOCS lock.acquire client");
    let Value::Map(docs) = docs else {
        panic!("COMMAND DOCS is a map in RESP3: {docs:?}")
    };
    let Value::Map(fields) = &docs[0].1 else {
        panic!("{docs:?}")
    };
    let fields: Vec<(String, Value)> = fields.iter().map(|(k, v)| (text(k), v.clone())).collect();
    let Value::Array(args) = get(&fields, "arguments") else {
        panic!("{fields:?}")
    };
    let Value::Map(wait) = &args[3] else {
        panic!("an argument is a map: {args:?}")
    };
    let wait: Vec<(String, Value)> = wait.iter().map(|(k, v)| (text(k), v.clone())).collect();
    assert!(matches!(get(&wait, "flags"), Value::Set(_)), "{wait:?}");
    let Value::Map(client) = &docs[1].1 else {
        panic!("{docs:?}")
    };
    let client: Vec<(String, Value)> = client.iter().map(|(k, v)| (text(k), v.clone())).collect();
    assert!(
        matches!(get(&client, "subcommands"), Value::Map(subs) if subs.len() >= 7),
        "{client:?}"
    );

    let info = ok(&mut c, "COMMAND INFO get nope");
    let entries = items(&info);
    assert_eq!(entries[1], Value::Nil);
    let get_entry = items(&entries[0]);
    assert!(
        matches!(&get_entry[2], Value::Set(flags) if flags.len() == 2),
        "{get_entry:?}"
    );
    assert!(
        matches!(&get_entry[6], Value::Set(_)),
        "ACL categories are a set: {get_entry:?}"
    );
    assert!(
        matches!(&get_entry[8], Value::Set(specs) if matches!(specs[0], Value::Map(_))),
        "{get_entry:?}"
    );
    let help = ok(&mut c, "PROXY HELP");
    assert!(
        matches!(&help, Value::Array(lines) if matches!(lines[0], Value::SimpleString(_))),
        "{help:?}"
    );
}

#[test]
fn config_forms_not_served_get_a_clear_error() {
    let (_servers, proxy) = setup();
    let mut c = proxy.client();
    let e = error(&mut c, "CONFIG SET timeout 1");
    assert!(
        e.starts_with("ERR CONFIG SET is not supported by the proxy: its configuration is read from its config file"),
        "{e}"
    );
    assert!(e.ends_with("; it serves CONFIG GET, CONFIG HELP"), "{e}");
    for line in ["CONFIG REWRITE", "CONFIG RESETSTAT", "config set"] {
        let e = error(&mut c, line);
        assert!(e.contains("is not supported by the proxy"), "{line}: {e}");
    }
    assert_eq!(
        error(&mut c, "CONFIG GET"),
        "ERR wrong number of arguments for 'config|get' command"
    );
    let timeout: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("timeout").query(&mut c).unwrap();
    assert_eq!(timeout, ["timeout", "0"]);
}

/// The rows of the markdown tables of `section` in docs/commands.md (up to the next `## `):
/// each row's cells, `\|` unescaped.
fn table_rows(doc: &str, section: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(section)
        .unwrap_or_else(|| panic!("docs/commands.md has no {section:?}"));
    let body = &doc[start + section.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    body.lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .skip(1)
        .map(|l| {
            let l = l
                .trim()
                .trim_start_matches('|')
                .trim_end_matches('|')
                .replace("\\|", "\u{0}");
            l.split('|').map(|cell| cell.trim().replace('\u{0}', "|")).collect()
        })
        .collect()
}

fn docs_commands_md() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join("commands.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `redis-cli`'s `HELP <command>` for every command, read as it prints it: name and
/// arguments (as its hints show them), then the summary.
fn redis_cli_help(port: u16, commands: &[String]) -> BTreeMap<String, String> {
    let mut child = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .env("HOME", std::env::temp_dir())
        .env("REDISCLI_HISTFILE", "/dev/null")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): install it, e.g. `apt-get install -y redis-tools`"));
    let mut stdin = child.stdin.take().expect("stdin");
    for command in commands {
        writeln!(stdin, "HELP {command}").expect("write to redis-cli");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("redis-cli");
    assert!(
        out.status.success(),
        "redis-cli: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let screen = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    // Without the colours: ESC [ ... m.
    let mut plain = String::new();
    let mut chars = screen.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(ch);
        }
    }
    let lines: Vec<&str> = plain.lines().collect();
    let mut found = BTreeMap::new();
    for pair in lines.windows(2) {
        if let Some(summary) = pair[1].trim_start().strip_prefix("summary: ") {
            found.insert(pair[0].trim().to_owned(), summary.to_owned());
        }
    }
    found
}

/// docs/commands.md's command reference lists exactly what the proxy serves, with the
/// arguments `redis-cli` shows from `COMMAND DOCS` and the summary it gives; and every
/// command the narrative table names is served, with its docs.
#[test]
fn docs_commands_md_and_the_proxy_agree() {
    let (_servers, proxy) = setup();
    let mut c = proxy.client();
    let doc = docs_commands_md();

    // The reference: one row per command and subcommand.
    let rows = table_rows(&doc, "## Command reference");
    let documented: BTreeMap<String, (String, String)> = rows
        .iter()
        .map(|row| {
            assert_eq!(row.len(), 3, "{row:?}");
            let strip = |cell: &str| cell.trim_matches('`').to_owned();
            (strip(&row[0]), (strip(&row[1]), row[2].clone()))
        })
        .collect();
    assert_eq!(documented.len(), rows.len(), "a command listed twice");
    let served: BTreeSet<String> = command_list(&mut c)
        .iter()
        .map(|name| name.to_uppercase().replace('|', " "))
        .collect();
    let listed: BTreeSet<String> = documented.keys().cloned().collect();
    assert_eq!(
        listed.difference(&served).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented in docs/commands.md but not served"
    );
    assert_eq!(
        served.difference(&listed).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "served but missing from docs/commands.md's command reference"
    );
    let top: Vec<String> = served.iter().filter(|n| !n.contains(' ')).cloned().collect();
    let shown = redis_cli_help(proxy.port, &top);
    for (name, (args, summary)) in &documented {
        let head = format!("{name} {args}").trim().to_owned();
        assert_eq!(
            shown.get(&head),
            Some(summary),
            "docs/commands.md: `{name}` `{args}` \"{summary}\"; redis-cli's HELP shows {:?}",
            shown
                .iter()
                .filter(|(h, _)| h.starts_with(name.as_str()))
                .collect::<Vec<_>>()
        );
    }

    // The narrative table: every command (and container subcommand) it names is served
    // and documented.
    let narrative = table_rows(&doc, "# Commands\n");
    let mut named = BTreeSet::new();
    for row in &narrative {
        for span in row[0].split('`').skip(1).step_by(2) {
            let mut words = span.split_whitespace();
            let Some(first) = words.next() else { continue };
            if !first.chars().all(|ch| ch.is_ascii_uppercase() || ch == '.') {
                continue;
            }
            named.insert(first.to_lowercase());
            if let Some(subs) = words.next().filter(|_| CONTAINERS.contains(&first))
                && subs.chars().all(|ch| ch.is_ascii_uppercase() || ch == '/')
            {
                for sub in subs.split('/') {
                    named.insert(format!("{}|{}", first.to_lowercase(), sub.to_lowercase()));
                }
            }
        }
    }
    assert!(named.len() > 30, "the narrative table was read: {named:?}");
    let mut info = redis::cmd("COMMAND");
    info.arg("INFO");
    let mut docs = redis::cmd("COMMAND");
    docs.arg("DOCS");
    for name in &named {
        info.arg(name);
        docs.arg(name);
    }
    let infos: Value = info.query(&mut c).expect("COMMAND INFO");
    for (name, entry) in named.iter().zip(items(&infos)) {
        assert_ne!(
            entry,
            &Value::Nil,
            "docs/commands.md names {name}, which COMMAND INFO does not know"
        );
    }
    let docs: Value = docs.query(&mut c).expect("COMMAND DOCS");
    let with_docs: BTreeSet<String> = pairs(&docs).into_iter().map(|(name, _)| name).collect();
    assert_eq!(&with_docs, &named, "every command docs/commands.md names has docs");
}
