//! The one table of the commands the proxy serves: each command's name, arity, flags, key
//! positions, documentation, and the function that parses it.
//!
//! [`super::Command::parse`] finds a command only through this table, so a command cannot be
//! served without being described here; `COMMAND`, `COMMAND INFO`, `COMMAND DOCS`,
//! `COMMAND LIST`, `COMMAND GETKEYS` and every container's `HELP` are answered from it
//! (`crate::introspection`). The arity is checked here, before a command's parser runs, as
//! Redis checks it; the key positions are those the parsers take as keys (a unit test holds
//! the two together), so what `COMMAND INFO` tells a client is what the proxy does.
//!
//! The flags, ACL categories and key-spec flags use Redis's vocabulary, and say what the proxy
//! does: `CONFIG GET` is open to every user here, `SCRIPT FLUSH` is an operator's command.
//! The native commands (`LOCK.*`, `SEM.*`, `PROXY`) are described as a Redis module's are (group
//! `module`, flag `module`), which is what tools expect of a dotted command name.

use std::cmp::Ordering;
use std::sync::LazyLock;

use bytes::Bytes;

use super::Local;
use super::spec::*;
use super::{Command, connection, script, unknown_command};
use crate::error::ClientError;
use crate::recipes::lock::parse as lock;

// Flag sets, in Redis's order.
const CONN: &[&str] = &["noscript", "loading", "stale"];
const ADMIN: &[&str] = &["admin", "noscript", "loading", "stale"];
const ADMIN_ACL: &[&str] = &["@admin", "@slow", "@dangerous"];
/// The flags of `PROXY`'s subcommands: the operator's, and the proxy's own.
const NATIVE_ADMIN: &[&str] = &["module", "admin", "noscript", "loading", "stale"];

/// A container's `HELP` subcommand (`name` is `<container>|help`).
const fn help(name: &'static str, since: &'static str, group: &'static str) -> Spec {
    Spec::new(name, 2, Handler::Help)
        .flags(&["loading", "stale"], &["@slow"])
        .doc("Prints this help.", since, group, "O(1)")
}

/// Forwarded to every master, decided by the majority rule (`lock::parse_forward`).
fn forward(spec: &'static Spec, args: Vec<Bytes>) -> Result<Command, ClientError> {
    lock::parse_forward(spec, args)
}

static CLIENT: [Spec; 7] = [
    Spec::new("client|setname", 3, Handler::Parse(connection::parse_client))
        .flags(CONN, &["@slow", "@connection"])
        .doc("Names this connection", "2.6.9", "connection", "O(1)")
        .args(&[string("connection-name")]),
    Spec::new("client|getname", 2, Handler::Parse(connection::parse_client))
        .flags(CONN, &["@slow", "@connection"])
        .doc("Returns this connection's name", "2.6.9", "connection", "O(1)"),
    Spec::new("client|id", 2, Handler::Parse(connection::parse_client))
        .flags(CONN, &["@slow", "@connection"])
        .doc("Returns this connection's id", "5.0.0", "connection", "O(1)"),
    Spec::new("client|setinfo", 4, Handler::Parse(connection::parse_client))
        .flags(CONN, &["@slow", "@connection"])
        .doc(
            "Accepts the client library's name and version (and ignores them)",
            "7.2.0",
            "connection",
            "O(1)",
        )
        .args(&[one_of(
            "attr",
            &[string("libname").after("LIB-NAME"), string("libver").after("LIB-VER")],
        )]),
    Spec::new("client|info", 2, Handler::Parse(connection::parse_client))
        .flags(CONN, &["@slow", "@connection"])
        .tips(&["nondeterministic_output"])
        .doc(
            "Describes this connection: id, name, db, protocol",
            "6.2.0",
            "connection",
            "O(1)",
        ),
    Spec::new("client|kill", 4, Handler::Parse(connection::parse_client))
        .flags(ADMIN, &["@admin", "@slow", "@dangerous", "@connection"])
        .doc(
            "Closes a client's connection (operators), releasing its session locks",
            "2.4.0",
            "connection",
            "O(1)",
        )
        .args(&[integer("client-id").after("ID")]),
    help("client|help", "5.0.0", "connection"),
];

static COMMAND: [Spec; 7] = [
    Spec::new("command|count", 2, Handler::Parse(connection::parse_command))
        .flags(&["loading", "stale"], &["@slow", "@connection"])
        .doc("Counts the commands the proxy serves", "2.8.13", "server", "O(1)"),
    Spec::new("command|docs", -2, Handler::Parse(connection::parse_command))
        .flags(&["loading", "stale"], &["@slow", "@connection"])
        .tips(&["nondeterministic_output_order"])
        .doc(
            "Documents the commands named, or every command the proxy serves",
            "7.0.0",
            "server",
            "O(N) where N is the number of commands to look up",
        )
        .args(&[string("command-name").optional().multiple()]),
    Spec::new("command|info", -2, Handler::Parse(connection::parse_command))
        .flags(&["loading", "stale"], &["@slow", "@connection"])
        .tips(&["nondeterministic_output_order"])
        .doc(
            "Describes the commands named (arity, flags, keys), or every command the proxy serves",
            "2.8.13",
            "server",
            "O(N) where N is the number of commands to look up",
        )
        .args(&[string("command-name").optional().multiple()]),
    Spec::new("command|list", -2, Handler::Parse(connection::parse_command))
        .flags(&["loading", "stale"], &["@slow", "@connection"])
        .tips(&["nondeterministic_output_order"])
        .doc(
            "Lists the names of the commands and subcommands the proxy serves",
            "7.0.0",
            "server",
            "O(N) where N is the number of commands the proxy serves",
        )
        .args(&[block(
            "filterby",
            &[one_of(
                "filter",
                &[
                    string("module-name").after("MODULE"),
                    string("category").after("ACLCAT"),
                    Arg::new("pattern", ArgKind::Pattern).after("PATTERN"),
                ],
            )],
        )
        .after("FILTERBY")
        .optional()]),
    Spec::new("command|getkeys", -4, Handler::Parse(connection::parse_command))
        .flags(&["loading", "stale"], &["@slow", "@connection"])
        .doc(
            "Extracts the keys of a command",
            "2.8.13",
            "server",
            "O(N) where N is the number of arguments",
        )
        .args(&[string("command"), string("arg").optional().multiple()]),
    Spec::new("command|getkeysandflags", -4, Handler::Parse(connection::parse_command))
        .flags(&["loading", "stale"], &["@slow", "@connection"])
        .doc(
            "Extracts the keys of a command, with their key-spec flags",
            "7.0.0",
            "server",
            "O(N) where N is the number of arguments",
        )
        .args(&[string("command"), string("arg").optional().multiple()]),
    help("command|help", "5.0.0", "server"),
];

static CONFIG: [Spec; 2] = [
    Spec::new("config|get", -3, Handler::Parse(connection::parse_config))
        .flags(CONN, &["@slow"])
        .doc(
            "Returns the parameters matching the patterns: the few that clients and tools read at start",
            "2.0.0",
            "server",
            "O(N) where N is the number of parameters the proxy answers",
        )
        .args(&[Arg::new("parameter", ArgKind::Pattern).multiple()]),
    help("config|help", "5.0.0", "server"),
];

static SCRIPT: [Spec; 4] = [
    Spec::new("script|load", 3, Handler::Parse(script::parse_script))
        .flags(&["noscript", "stale"], &["@slow", "@scripting"])
        .doc(
            "Remembers a script and loads it on every master",
            "2.6.0",
            "scripting",
            "O(N) with N the length of the script",
        )
        .args(&[string("script")]),
    Spec::new("script|exists", -3, Handler::Parse(script::parse_script))
        .flags(&["noscript"], &["@slow", "@scripting"])
        .doc(
            "Tells which scripts the proxy knows the source of",
            "2.6.0",
            "scripting",
            "O(N) with N the number of scripts to check",
        )
        .args(&[string("sha1").multiple()]),
    Spec::new("script|flush", -2, Handler::Parse(script::parse_script))
        .flags(&["admin", "noscript"], &["@admin", "@slow", "@dangerous", "@scripting"])
        .doc(
            "Forgets every script, on the proxy and on every master (operators)",
            "2.6.0",
            "scripting",
            "O(N) with N the number of scripts",
        )
        .args(&[one_of("flush-type", &[word("async", "ASYNC"), word("sync", "SYNC")]).optional()]),
    help("script|help", "5.0.0", "scripting"),
];

static PROXY: [Spec; 6] = [
    Spec::new("proxy|backends", 2, Handler::Parse(connection::parse_proxy))
        .flags(NATIVE_ADMIN, ADMIN_ACL)
        .doc(
            "Each master's address, state, run id and request statistics (operators)",
            PROXY_VERSION,
            "module",
            "O(N) where N is the number of masters",
        ),
    Spec::new("proxy|config", 2, Handler::Parse(connection::parse_proxy))
        .flags(NATIVE_ADMIN, ADMIN_ACL)
        .doc(
            "The configuration in effect, as TOML, secrets masked (operators)",
            PROXY_VERSION,
            "module",
            "O(1)",
        ),
    Spec::new("proxy|legacy", 2, Handler::Parse(connection::parse_proxy))
        .flags(NATIVE_ADMIN, ADMIN_ACL)
        .doc(
            "The legacy member of a rollout, and the old code's locks still held there (operators)",
            PROXY_VERSION,
            "module",
            "O(1)",
        ),
    Spec::new("proxy|locks", -2, Handler::Parse(connection::parse_proxy))
        .flags(NATIVE_ADMIN, ADMIN_ACL)
        .doc(
            "This proxy's session locks and wait queues, of the locks matching the pattern (operators)",
            PROXY_VERSION,
            "module",
            "O(N) where N is the number of session locks and waiting requests",
        )
        .args(&[Arg::new("pattern", ArgKind::Pattern).optional()]),
    Spec::new("proxy|quarantine", -3, Handler::Parse(connection::parse_proxy))
        .flags(NATIVE_ADMIN, ADMIN_ACL)
        .doc(
            "Quarantines a master (index or address) now, or lifts its quarantine (operators)",
            PROXY_VERSION,
            "module",
            "O(1)",
        )
        .args(&[string("master"), word("lift", "LIFT").optional()]),
    help("proxy|help", PROXY_VERSION, "module"),
];

/// Every command the proxy serves, sorted by name (a request finds its row by binary search):
/// the rows of `OWN` and each recipe's, registered here once.
pub static TABLE: LazyLock<Vec<&'static Spec>> = LazyLock::new(|| {
    let recipes: [&'static [Spec]; 5] = [
        &crate::recipes::lock::parse_native::ROWS,
        &crate::recipes::multikey::parse::ROWS,
        &crate::recipes::semaphore::parse::ROWS,
        &crate::recipes::rwlock::parse::ROWS,
        &crate::recipes::election::parse::ROWS,
    ];
    let mut rows: Vec<&'static Spec> = OWN.iter().chain(recipes.into_iter().flatten()).collect();
    rows.sort_by(|a, b| a.name.cmp(b.name));
    rows
});

/// The proxy's own rows and Redis's commands it serves; each recipe's native commands are in its
/// folder (`recipes/*/parse.rs`, `ROWS`), and [`TABLE`] has them all.
static OWN: [Spec; 35] = [
    Spec::new("auth", -2, Handler::Parse(connection::parse))
        .flags(
            &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"],
            &["@fast", "@connection"],
        )
        .doc(
            "Authenticates this connection (requirepass, or a user of the config file)",
            "1.0.0",
            "connection",
            "O(N) where N is the number of passwords defined for the user",
        )
        .args(&[string("username").optional(), string("password")]),
    Spec::new("blpop", -3, Handler::Parse(|_, args| lock::parse_blpop(args)))
        .flags(
            &["write", "noscript", "blocking"],
            &["@write", "@list", "@slow", "@blocking"],
        )
        .keys(range(&["RW", "access", "delete"], 1, -2))
        .doc(
            "Waits for a wake-up on signal lists (signal_lists only): a release or a push through any proxy",
            "2.0.0",
            "list",
            "O(N) where N is the number of keys",
        )
        .args(&[key("key").multiple(), Arg::new("timeout", ArgKind::Double)]),
    Spec::new(
        "client",
        -2,
        Handler::Container {
            bare: None,
            subcommands: &CLIENT,
        },
    )
    .flags(&[], &["@slow"])
    .doc(
        "A container for the connection's commands",
        "2.4.0",
        "connection",
        "Depends on subcommand.",
    ),
    Spec::new(
        "command",
        -1,
        Handler::Container {
            bare: Some((
                connection::parse_command,
                "Return details about every command the proxy serves.",
            )),
            subcommands: &COMMAND,
        },
    )
    .flags(&["loading", "stale"], &["@slow", "@connection"])
    .tips(&["nondeterministic_output_order"])
    .doc(
        "Describes every command the proxy serves",
        "2.8.13",
        "server",
        "O(N) where N is the number of commands the proxy serves",
    ),
    Spec::new(
        "config",
        -2,
        Handler::Container {
            bare: None,
            subcommands: &CONFIG,
        },
    )
    .flags(&[], &["@slow"])
    .doc(
        "A container for the configuration commands (only CONFIG GET is served)",
        "2.0.0",
        "server",
        "Depends on subcommand.",
    ),
    Spec::new("del", -2, Handler::Parse(forward))
        .flags(&["write"], &["@keyspace", "@write", "@slow"])
        .keys(range(&["RM", "delete"], 1, -1))
        .doc(
            "Deletes keys on every master: the count a majority deleted",
            "1.0.0",
            "generic",
            ON_EACH_MASTER,
        )
        .args(&[key("key").multiple()]),
    Spec::new("delex", -2, Handler::Parse(|_, args| lock::parse_delex(args)))
        .flags(&["write", "fast"], &["@write", "@string", "@fast"])
        .keys(range(&["RW", "access", "delete"], 1, 0))
        .doc(
            "Deletes a key if it holds (IFEQ) or does not hold (IFNE) a value: an owner-checked release",
            "8.4.0",
            "string",
            ON_EACH_MASTER,
        )
        .args(&[
            key("key"),
            one_of(
                "condition",
                &[string("ifeq-value").after("IFEQ"), string("ifne-value").after("IFNE")],
            )
            .optional(),
        ]),
    Spec::new("discard", 1, Handler::Parse(connection::parse))
        .flags(
            &["noscript", "loading", "stale", "fast", "allow_busy"],
            &["@fast", "@transaction"],
        )
        .doc(
            "Discards the commands queued after MULTI",
            "2.0.0",
            "transactions",
            "O(N) where N is the number of queued commands",
        ),
    Spec::new("echo", 2, Handler::Parse(connection::parse))
        .flags(&["loading", "stale", "fast"], &["@fast", "@connection"])
        .doc("Returns the message", "1.0.0", "connection", "O(1)")
        .args(&[string("message")]),
    Spec::new("eval", -3, Handler::Parse(|_, args| script::parse_eval(args)))
        .flags(
            &["noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
            &["@slow", "@scripting"],
        )
        .keys(KeySpec {
            flags: &["RW", "access", "update"],
            begin: 2,
            find: Find::Keynum {
                keynumidx: 0,
                first: 1,
                step: 1,
            },
        })
        .doc(
            "Runs a script on every master; the replies are combined by the majority rule",
            "2.6.0",
            "scripting",
            "Depends on the script that is executed.",
        )
        .args(&[
            string("script"),
            integer("numkeys"),
            key("key").optional().multiple(),
            string("arg").optional().multiple(),
        ]),
    Spec::new("evalsha", -3, Handler::Parse(|_, args| script::parse_eval(args)))
        .flags(
            &["noscript", "stale", "skip_monitor", "no_mandatory_keys", "movablekeys"],
            &["@slow", "@scripting"],
        )
        .keys(KeySpec {
            flags: &["RW", "access", "update"],
            begin: 2,
            find: Find::Keynum {
                keynumidx: 0,
                first: 1,
                step: 1,
            },
        })
        .doc(
            "Runs a script the proxy knows by its SHA1 on every master, as EVAL",
            "2.6.0",
            "scripting",
            "Depends on the script that is executed.",
        )
        .args(&[
            string("sha1"),
            integer("numkeys"),
            key("key").optional().multiple(),
            string("arg").optional().multiple(),
        ]),
    Spec::new("exec", 1, Handler::Parse(connection::parse))
        .flags(
            &["noscript", "loading", "stale", "skip_slowlog"],
            &["@slow", "@transaction"],
        )
        .doc(
            "Runs the queued commands as one script per master, checking the watched keys",
            "1.2.0",
            "transactions",
            "Depends on commands in the transaction",
        ),
    Spec::new("exists", -2, Handler::Parse(forward))
        .flags(&["readonly", "fast"], &["@keyspace", "@read", "@fast"])
        .keys(range(&["RO"], 1, -1))
        .doc(
            "Counts the keys that exist on a majority of masters",
            "1.0.0",
            "generic",
            ON_EACH_MASTER,
        )
        .args(&[key("key").multiple()]),
    Spec::new("expire", -3, Handler::Parse(|_, args| lock::parse_expire(args)))
        .flags(&["write", "fast"], &["@keyspace", "@write", "@fast"])
        .keys(range(&["RW", "update"], 1, 0))
        .doc(
            "Sets a key's TTL in seconds on every master: 1 only if a majority set it within its validity",
            "1.0.0",
            "generic",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), integer("seconds"), EXPIRE_CONDITION]),
    Spec::new("get", 2, Handler::Parse(forward))
        .flags(&["readonly", "fast"], &["@read", "@string", "@fast"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "Returns the value a majority of masters hold, else nil",
            "1.0.0",
            "string",
            ON_EACH_MASTER,
        )
        .args(&[key("key")]),
    Spec::new("getset", 3, Handler::Parse(|_, args| lock::parse_getset(args)))
        .flags(&["write", "denyoom", "fast"], &["@write", "@string", "@fast"])
        .keys(range(&["RW", "access", "update"], 1, 0))
        .doc(
            "The legacy steal: sets a value on every master and returns the old one a majority returned",
            "1.0.0",
            "string",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), string("value")]),
    Spec::new("hello", -1, Handler::Parse(connection::parse))
        .flags(
            &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"],
            &["@fast", "@connection"],
        )
        .doc(
            "Switches the protocol (RESP2 or RESP3), authenticates, names the connection",
            "6.0.0",
            "connection",
            "O(1)",
        )
        .args(&[block(
            "arguments",
            &[
                integer("protover"),
                block("username-password", &[string("username"), string("password")])
                    .after("AUTH")
                    .optional(),
                string("clientname").after("SETNAME").optional(),
            ],
        )
        .optional()]),
    Spec::new("info", -1, Handler::Parse(connection::parse))
        .flags(&["loading", "stale"], &["@slow", "@dangerous"])
        .tips(&["nondeterministic_output"])
        .doc(
            "The proxy's state: server, clients, stats, backends (operators), quorum",
            "1.0.0",
            "server",
            "O(N) where N is the number of masters",
        )
        .args(&[string("section").optional().multiple()]),
    Spec::new("llen", 2, Handler::Parse(forward))
        .flags(&["readonly", "fast"], &["@read", "@list", "@fast"])
        .keys(range(&["RO"], 1, 0))
        .doc(
            "Returns the length of a list, as the majority rule combines the masters' answers",
            "1.0.0",
            "list",
            ON_EACH_MASTER,
        )
        .args(&[key("key")]),
    Spec::new("multi", 1, Handler::Parse(connection::parse))
        .flags(
            &["noscript", "loading", "stale", "fast", "allow_busy"],
            &["@fast", "@transaction"],
        )
        .doc("Starts a transaction", "1.2.0", "transactions", "O(1)"),
    Spec::new("pexpire", -3, Handler::Parse(|_, args| lock::parse_expire(args)))
        .flags(&["write", "fast"], &["@keyspace", "@write", "@fast"])
        .keys(range(&["RW", "update"], 1, 0))
        .doc(
            "Sets a key's TTL in ms on every master: 1 only if a majority set it within its validity",
            "2.6.0",
            "generic",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), integer("milliseconds"), EXPIRE_CONDITION]),
    Spec::new("ping", -1, Handler::Parse(connection::parse))
        .flags(&["fast"], &["@fast", "@connection"])
        .doc("Answers PONG, or the message", "1.0.0", "connection", "O(1)")
        .args(&[string("message").optional()]),
    Spec::new(
        "proxy",
        -2,
        Handler::Container {
            bare: None,
            subcommands: &PROXY,
        },
    )
    .flags(&["module"], &["@slow"])
    .doc(
        "A container for the operator's commands",
        PROXY_VERSION,
        "module",
        "Depends on subcommand.",
    ),
    Spec::new("pttl", 2, Handler::Parse(forward))
        .flags(&["readonly", "fast"], &["@keyspace", "@read", "@fast"])
        .tips(&["nondeterministic_output"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "The TTL in ms a majority of masters still guarantee a key",
            "2.6.0",
            "generic",
            ON_EACH_MASTER,
        )
        .args(&[key("key")]),
    Spec::new("quit", -1, Handler::Parse(connection::parse))
        .flags(
            &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"],
            &["@fast", "@connection"],
        )
        .doc("Closes the connection", "1.0.0", "connection", "O(1)"),
    Spec::new("reset", 1, Handler::Parse(connection::parse))
        .flags(
            &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"],
            &["@fast", "@connection"],
        )
        .doc(
            "Resets the connection, releasing its session locks",
            "6.2.0",
            "connection",
            "O(1)",
        ),
    Spec::new(
        "script",
        -2,
        Handler::Container {
            bare: None,
            subcommands: &SCRIPT,
        },
    )
    .flags(&[], &["@slow"])
    .doc(
        "A container for the script cache's commands",
        "2.6.0",
        "scripting",
        "Depends on subcommand.",
    ),
    Spec::new("select", 2, Handler::Parse(connection::parse))
        .flags(&["loading", "stale", "fast"], &["@fast", "@connection"])
        .doc(
            "Selects a database: the same database (plus the URL's) on every master",
            "1.0.0",
            "connection",
            "O(1)",
        )
        .args(&[integer("index")]),
    Spec::new("set", -3, Handler::Parse(|_, args| lock::parse_set(args)))
        .flags(&["write", "denyoom"], &["@write", "@string", "@slow"])
        .keys(range(&["RW", "access", "update", "variable_flags"], 1, 0))
        .doc(
            "With NX, takes a lock on a majority of masters; else writes on every master (always with a TTL)",
            "1.0.0",
            "string",
            ON_EACH_MASTER,
        )
        .args(&[
            key("key"),
            string("value"),
            one_of(
                "condition",
                &[
                    word("nx", "NX"),
                    word("xx", "XX"),
                    string("comparison-value").after("IFEQ"),
                ],
            )
            .optional(),
            word("get", "GET").optional(),
            one_of(
                "expiration",
                &[
                    integer("seconds").after("EX"),
                    integer("milliseconds").after("PX"),
                    Arg::new("unix-time-seconds", ArgKind::UnixTime).after("EXAT"),
                    Arg::new("unix-time-milliseconds", ArgKind::UnixTime).after("PXAT"),
                ],
            )
            .optional(),
        ]),
    Spec::new("setnx", 3, Handler::Parse(|_, args| lock::parse_setnx(args)))
        .flags(&["write", "denyoom", "fast"], &["@write", "@string", "@fast"])
        .keys(range(&["OW", "insert"], 1, 0))
        .doc(
            "The legacy lock: sets a key if absent, decided by a majority of masters",
            "1.0.0",
            "string",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), string("value")]),
    Spec::new("ttl", 2, Handler::Parse(forward))
        .flags(&["readonly", "fast"], &["@keyspace", "@read", "@fast"])
        .tips(&["nondeterministic_output"])
        .keys(range(&["RO", "access"], 1, 0))
        .doc(
            "The TTL in seconds a majority of masters still guarantee a key",
            "1.0.0",
            "generic",
            ON_EACH_MASTER,
        )
        .args(&[key("key")]),
    Spec::new("unlink", -2, Handler::Parse(forward))
        .flags(&["write", "fast"], &["@keyspace", "@write", "@fast"])
        .keys(range(&["RM", "delete"], 1, -1))
        .doc(
            "Deletes keys on every master: the count a majority deleted",
            "4.0.0",
            "generic",
            ON_EACH_MASTER,
        )
        .args(&[key("key").multiple()]),
    Spec::new("unwatch", 1, Handler::Parse(connection::parse))
        .flags(
            &["noscript", "loading", "stale", "fast", "allow_busy"],
            &["@fast", "@transaction"],
        )
        .doc("Forgets the watched keys", "2.2.0", "transactions", "O(1)"),
    Spec::new("watch", -2, Handler::Parse(connection::parse))
        .flags(
            &["noscript", "loading", "stale", "fast", "allow_busy"],
            &["@fast", "@transaction"],
        )
        .keys(range(&["RO"], 1, -1))
        .doc(
            "Watches keys: the next EXEC runs only if they still hold the value a majority held",
            "2.2.0",
            "transactions",
            "O(1) for every key, on each master",
        )
        .args(&[key("key").multiple()]),
    Spec::new("zrem", -3, Handler::Parse(forward))
        .flags(&["write", "fast"], &["@write", "@sortedset", "@fast"])
        .keys(range(&["RW", "delete"], 1, 0))
        .doc(
            "Removes members of a sorted set on every master (a semaphore's release): the count a majority removed",
            "1.2.0",
            "sorted-set",
            ON_EACH_MASTER,
        )
        .args(&[key("key"), string("member").multiple()]),
];

/// `PEXPIRE`'s and `EXPIRE`'s `[NX|XX|GT|LT]`.
const EXPIRE_CONDITION: Arg = one_of(
    "condition",
    &[word("nx", "NX"), word("xx", "XX"), word("gt", "GT"), word("lt", "LT")],
)
.optional();

/// Subcommands Redis has and the proxy does not serve, each with the reason: asked for, they
/// get an error that says so and names what is served, rather than "unknown subcommand".
pub static NOT_SERVED: &[(&str, &str)] = &[
    (
        "config|set",
        "its configuration is read from its config file at start and changed by a restart \
         (PROXY CONFIG shows the configuration in effect)",
    ),
    (
        "config|rewrite",
        "it never writes its config file (PROXY CONFIG shows the configuration in effect)",
    ),
    (
        "config|resetstat",
        "its statistics are counters that only grow (INFO stats, the metrics endpoint)",
    ),
];

/// Compares a name as sent (any case) with a table name (lower case).
fn compare(sent: &[u8], name: &str) -> Ordering {
    sent.iter().map(u8::to_ascii_lowercase).cmp(name.bytes())
}

/// The top-level command named `name` (any case).
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    let i = TABLE.binary_search_by(|spec| compare(name, spec.name).reverse()).ok()?;
    TABLE.get(i).copied()
}

/// A container's subcommand named `name` (any case).
fn subcommand(container: &'static Spec, name: &[u8]) -> Option<&'static Spec> {
    container
        .subcommands()
        .iter()
        .find(|sub| compare(name, sub.short_name()) == Ordering::Equal)
}

/// A command or a subcommand by its full name, as `COMMAND INFO` and `COMMAND DOCS` take it:
/// `get`, `client|kill` (any case).
pub fn lookup_full(name: &[u8]) -> Option<&'static Spec> {
    match name.iter().position(|&b| b == b'|') {
        None => lookup(name),
        Some(bar) => {
            let container = lookup(name.get(..bar)?)?;
            subcommand(container, name.get(bar.checked_add(1)?..)?)
        }
    }
}

/// The command that `args` name: a top-level command, or a container's subcommand when the
/// container has one of that name (as Redis's `COMMAND GETKEYS` looks it up).
fn lookup_args(args: &[Bytes]) -> Option<&'static Spec> {
    let container = lookup(args.first()?)?;
    match args.get(1).and_then(|sub| subcommand(container, sub)) {
        Some(sub) => Some(sub),
        None => Some(container),
    }
}

/// `ERR wrong number of arguments for '<full name>' command`.
fn wrong_arity(spec: &Spec) -> ClientError {
    ClientError::WrongArity(spec.name.to_owned())
}

impl Command {
    /// Parses one request. `args` is never empty (empty requests are skipped by the caller).
    /// A command is found only through this table, which checks its arity and hands it to
    /// its family's parser.
    pub fn parse(args: Vec<Bytes>) -> Result<Command, ClientError> {
        parse(args)
    }
}

/// Parses a request through the table: the command (and subcommand) is looked up, its arity
/// checked, then its parser runs. `args` is never empty.
pub fn parse(args: Vec<Bytes>) -> Result<Command, ClientError> {
    let Some(spec) = args.first().and_then(|name| lookup(name)) else {
        return Err(unknown_command(&args));
    };
    if !spec.arity_fits(args.len()) {
        return Err(wrong_arity(spec));
    }
    let (bare, subcommands) = match &spec.handler {
        Handler::Parse(parse) => return parse(spec, args),
        Handler::Help => return Ok(Command::Local(Local::Help(spec))),
        Handler::Container { bare, subcommands } => (bare, subcommands),
    };
    let Some(sent) = args.get(1) else {
        return match bare {
            Some((parse, _)) => parse(spec, args),
            None => Err(wrong_arity(spec)),
        };
    };
    let Some(sub) = subcommands
        .iter()
        .find(|s| compare(sent, s.short_name()) == Ordering::Equal)
    else {
        return Err(not_served(spec, sent));
    };
    if !sub.arity_fits(args.len()) {
        return Err(wrong_arity(sub));
    }
    match &sub.handler {
        Handler::Parse(parse) => parse(sub, args),
        Handler::Help => Ok(Command::Local(Local::Help(spec))),
        // No container holds another.
        Handler::Container { .. } => Err(not_served(spec, sent)),
    }
}

/// The error for a subcommand `container` does not serve: why, for one Redis has and the
/// proxy refuses ([`NOT_SERVED`]); Redis's "unknown subcommand" otherwise, whose
/// `Try <CMD> HELP.` the proxy answers.
fn not_served(container: &Spec, sent: &[u8]) -> ClientError {
    let sent_text = String::from_utf8_lossy(sent);
    let full = format!("{}|{}", container.name, sent_text.to_ascii_lowercase());
    let upper = container.name.to_ascii_uppercase();
    match NOT_SERVED.iter().find(|(name, _)| *name == full) {
        Some((_, why)) => ClientError::NotServed {
            command: format!("{upper} {}", sent_text.to_ascii_uppercase()),
            why,
            served: container
                .subcommands()
                .iter()
                .map(|sub| format!("{upper} {}", sub.short_name().to_ascii_uppercase()))
                .collect::<Vec<_>>()
                .join(", "),
        },
        None => ClientError::UnknownSubcommand {
            cmd: upper,
            sub: sent_text.into_owned(),
        },
    }
}

/// The keys of a command, for `COMMAND GETKEYS` and for the parsers (one rule for both): each
/// key's index in `args` (the name being 0), with its key-spec flags.
///
/// Errors as Redis's `COMMAND GETKEYS` words them: an unknown command, one without keys, a
/// wrong number of arguments, or a key count that does not fit the arguments.
pub fn key_positions(args: &[Bytes]) -> Result<Vec<(usize, &'static [&'static str])>, ClientError> {
    let spec = lookup_args(args).ok_or(ClientError::InvalidCommand)?;
    let Some(keys) = &spec.keys else {
        return Err(ClientError::NoKeyArguments);
    };
    if !spec.arity_fits(args.len()) {
        return Err(ClientError::InvalidArgumentCount);
    }
    match positions(keys, args) {
        Some(found) => Ok(found.into_iter().map(|i| (i, keys.flags)).collect()),
        None if spec.flags.contains(&"no_mandatory_keys") => Ok(Vec::new()),
        None => Err(ClientError::InvalidKeyArguments),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth;
    use crate::command::args;

    /// Every spec, subcommands included.
    fn every() -> impl Iterator<Item = &'static Spec> {
        TABLE
            .iter()
            .flat_map(|spec| std::iter::once(*spec).chain(spec.subcommands()))
    }

    /// One valid invocation of every command and subcommand the proxy serves.
    const SAMPLES: &[&str] = &[
        "AUTH pw",
        "BLPOP lock-signal:a lock-signal:b 1",
        "CLIENT SETNAME me",
        "CLIENT GETNAME",
        "CLIENT ID",
        "CLIENT SETINFO LIB-NAME x",
        "CLIENT INFO",
        "CLIENT KILL ID 7",
        "CLIENT HELP",
        "COMMAND",
        "COMMAND COUNT",
        "COMMAND DOCS get",
        "COMMAND INFO get",
        "COMMAND LIST",
        "COMMAND GETKEYS get k",
        "COMMAND GETKEYSANDFLAGS get k",
        "COMMAND HELP",
        "CONFIG GET save",
        "CONFIG HELP",
        "DEL a b",
        "DELEX k IFEQ t",
        "DISCARD",
        "ECHO hi",
        "ELECT.CAMPAIGN e v 1000 WAIT 10",
        "ELECT.LEADER e",
        "ELECT.OBSERVE e AFTER 0 TIMEOUT 10",
        "ELECT.RESIGN e v",
        "ELECT.UNOBSERVE e",
        "EVAL s 2 k1 k2 a",
        "EVALSHA abc 1 k a",
        "EXEC",
        "EXISTS a b",
        "EXPIRE k 10",
        "GET k",
        "GETSET k v",
        "HELLO 3",
        "INFO",
        "LLEN k",
        "LOCK.ACQUIRE k t 1000 WAIT 10",
        "LOCK.ACQUIREALL t 1000 2 a b WAIT 10",
        "LOCK.EXTEND k t 1000",
        "LOCK.FENCE k t",
        "LOCK.INFO k",
        "LOCK.RELEASE k t",
        "LOCK.RELEASEALL t 2 a b",
        "MULTI",
        "PEXPIRE k 1000 GT",
        "PING",
        "PROXY BACKENDS",
        "PROXY CONFIG",
        "PROXY LEGACY",
        "PROXY LOCKS lock:*",
        "PROXY QUARANTINE 0 LIFT",
        "PROXY HELP",
        "PTTL k",
        "QUIT",
        "RESET",
        "RWLOCK.EXTEND d t 1000",
        "RWLOCK.INFO d",
        "RWLOCK.READ d t 1000 WAIT 10 KEEPALIVE",
        "RWLOCK.RELEASE d t",
        "RWLOCK.WRITE d t 1000 KEEPALIVE WAIT 10",
        "SCRIPT LOAD s",
        "SCRIPT EXISTS abc",
        "SCRIPT FLUSH",
        "SCRIPT HELP",
        "SELECT 1",
        "SEM.ACQUIRE s t 3 1000 WAIT 10 KEEPALIVE",
        "SEM.EXTEND s t 1000",
        "SEM.INFO s",
        "SEM.RELEASE s t",
        "SET k t NX PX 1000",
        "SETNX k v",
        "TTL k",
        "UNLINK a b",
        "UNWATCH",
        "WATCH a b",
        "ZREM k m1 m2",
    ];

    /// The spec a sample invokes.
    fn spec_of(sample: &str) -> &'static Spec {
        lookup_args(&args(sample)).unwrap()
    }

    #[test]
    fn the_table_is_sorted_and_names_are_lower_case() {
        for pair in TABLE.windows(2) {
            assert!(pair[0].name < pair[1].name, "{} before {}", pair[0].name, pair[1].name);
        }
        for spec in every() {
            assert_eq!(spec.name, spec.name.to_ascii_lowercase());
            assert!(!spec.summary.is_empty() && !spec.since.is_empty(), "{}", spec.name);
        }
        assert_eq!(lookup(b"LoCk.AcQuIrE").map(|s| s.name), Some("lock.acquire"));
        assert_eq!(lookup_full(b"CLIENT|Kill").map(|s| s.name), Some("client|kill"));
        assert!(lookup(b"lock.nope").is_none() && lookup(b"").is_none());
    }

    /// Every command and subcommand in the table is parsed by its parser (a table entry whose
    /// parser does not know it would fail here), and the samples cover the whole table.
    #[test]
    fn every_sample_parses_and_every_entry_has_a_sample() {
        let mut covered = Vec::new();
        for sample in SAMPLES {
            let parsed = Command::parse(args(sample));
            assert!(parsed.is_ok(), "{sample}: {parsed:?}");
            covered.push(spec_of(sample).name);
        }
        // A container without a form of its own is served through its subcommands.
        let served = every().filter(|s| !matches!(s.handler, Handler::Container { bare: None, .. }));
        for spec in served {
            assert!(covered.contains(&spec.name), "no sample of {}", spec.name);
        }
    }

    /// The keys `COMMAND INFO` describes are the keys the proxy judges a command on
    /// (permissions, reserved keys, cluster slots).
    #[test]
    fn key_specs_find_the_keys_the_parsers_take() {
        for sample in SAMPLES {
            let args = args(sample);
            let command = Command::parse(args.clone()).unwrap();
            let spec = spec_of(sample);
            let from_table = keys_of(spec, &args);
            let (first, last, step) = spec.key_range();
            assert_eq!(command.keys(), &from_table[..], "{sample}");
            match spec.keys {
                Some(KeySpec {
                    find: Find::Range { .. },
                    ..
                }) => assert!(first >= 1 && step >= 1 && last != 0, "{sample}"),
                _ => assert_eq!((first, last, step), (0, 0, 0), "{sample}"),
            }
            if spec.keys.is_none() {
                assert!(command.keys().is_empty(), "{sample} has keys but no key spec");
            }
        }
    }

    /// The `admin` flag is what `auth::permit` enforces.
    #[test]
    fn the_admin_flag_is_what_permissions_enforce() {
        let config = crate::config::Config::parse(
            "[[users]]\nname = \"app\"\npassword = \"p\"\n[[users]]\nname = \"ops\"\npassword = \"q\"\nadmin = true\n",
        )
        .unwrap();
        let access = auth::Access::new(&config).unwrap();
        let app = access.authenticate(Some(b"app"), b"p").unwrap().unwrap();
        for sample in SAMPLES {
            let command = Command::parse(args(sample)).unwrap();
            let admin = spec_of(sample).flags.contains(&"admin");
            let refused = matches!(
                auth::permit(Some(&app), &command),
                Err(ClientError::NoPermCommand { .. })
            );
            assert_eq!(admin, refused, "{sample}");
        }
    }

    #[test]
    fn arity_is_checked_from_the_table() {
        let err = |line: &str| Command::parse(args(line)).unwrap_err().to_string();
        assert_eq!(err("GET"), "ERR wrong number of arguments for 'get' command");
        assert_eq!(
            err("lock.info"),
            "ERR wrong number of arguments for 'lock.info' command"
        );
        assert_eq!(err("CLIENT"), "ERR wrong number of arguments for 'client' command");
        assert_eq!(
            err("client help x"),
            "ERR wrong number of arguments for 'client|help' command"
        );
        assert_eq!(
            err("CONFIG GET"),
            "ERR wrong number of arguments for 'config|get' command"
        );
        assert_eq!(err("PROXY NOPE"), "ERR unknown subcommand 'NOPE'. Try PROXY HELP.");
        assert_eq!(
            err("CONFIG HELP x"),
            "ERR wrong number of arguments for 'config|help' command"
        );
    }

    #[test]
    fn help_is_every_containers() {
        for container in TABLE.iter().filter(|s| !s.subcommands().is_empty()) {
            let help = format!("{} HELP", container.name);
            assert_eq!(Command::parse(args(&help)).unwrap(), Command::Local(Local::Help(container)), "{help}");
        }
    }

    #[test]
    fn config_forms_the_proxy_does_not_serve_say_so() {
        for line in [
            "CONFIG SET timeout 1",
            "config set",
            "CONFIG REWRITE",
            "CONFIG RESETSTAT",
        ] {
            let e = Command::parse(args(line)).unwrap_err().to_string();
            assert!(e.starts_with("ERR CONFIG "), "{line}: {e}");
            assert!(e.contains("is not supported by the proxy"), "{line}: {e}");
            assert!(e.ends_with("it serves CONFIG GET, CONFIG HELP"), "{line}: {e}");
        }
        for (name, _) in NOT_SERVED {
            assert!(lookup_full(name.as_bytes()).is_none(), "{name} is served");
        }
    }

    #[test]
    fn getkeys_follows_the_key_specs() {
        let keys =
            |line: &str| key_positions(&args(line)).map(|found| found.into_iter().map(|(i, _)| i).collect::<Vec<_>>());
        assert_eq!(keys("GET k"), Ok(vec![1]));
        assert_eq!(keys("DEL a b c"), Ok(vec![1, 2, 3]));
        assert_eq!(keys("BLPOP a b 0"), Ok(vec![1, 2]));
        assert_eq!(keys("EVAL s 2 a b x"), Ok(vec![3, 4]));
        assert_eq!(keys("EVAL s 0"), Ok(vec![]));
        assert_eq!(
            keys("EVAL s 3 a"),
            Ok(vec![]),
            "no_mandatory_keys: none rather than an error"
        );
        assert_eq!(keys("EVAL s -1 a"), Ok(vec![]));
        assert_eq!(keys("NOPE k"), Err(ClientError::InvalidCommand));
        assert_eq!(keys("PING x"), Err(ClientError::NoKeyArguments));
        assert_eq!(keys("CLIENT KILL ID 1"), Err(ClientError::NoKeyArguments));
        assert_eq!(keys("GET a b"), Err(ClientError::InvalidArgumentCount));
        assert_eq!(keys("LOCK.ACQUIRE k t 10 KEEPALIVE"), Ok(vec![1]));
    }
}
