//! The `commands` target: a client's whole session through a real [`Connection`] over an
//! in-memory stream, with the proxy over embedded masters and a paused clock (waits, TTLs,
//! keepalives and timeouts run in virtual time, as soon as nothing else can).
//!
//! The input is read as a list of commands built from a dictionary of every command the
//! proxy serves (native `LOCK.*` ones, `WAIT`, `KEEPALIVE` and `BLPOP` arguments included)
//! and of the arguments that break parsers (huge, negative, fractional and non-numbers, the
//! proxy's own key prefix), with the input's own bytes as arguments too. What must hold:
//! no panic anywhere in the connection's task or the proxy's; every byte the proxy writes is
//! a well-formed RESP reply; the connection ends when the client closes its side.

use std::sync::{Arc, OnceLock};

use bytes::BytesMut;
use redis_protocol::resp3::decode::complete::decode_bytes_mut;
use redlock_proxy::config::Config;
use redlock_proxy::connection::Connection;
use redlock_proxy::proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use tokio::sync::watch;

/// Every command name the proxy serves, and some it does not.
const NAMES: &[&str] = &[
    "SET", "SETNX", "GETSET", "DELEX", "PEXPIRE", "EXPIRE", "EVAL", "EVALSHA", "SCRIPT", "BLPOP", "GET", "PTTL",
    "TTL", "LLEN", "EXISTS", "DEL", "UNLINK", "ZREM", "MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH",
    "LOCK.ACQUIRE", "LOCK.EXTEND", "LOCK.RELEASE", "LOCK.INFO", "LOCK.FENCE", "LOCK.NOPE", "CLIENT", "HELLO", "AUTH",
    "SELECT", "INFO", "CONFIG", "COMMAND", "PROXY", "PING", "ECHO", "RESET", "QUIT", "FLUSHALL", "",
];

/// Arguments that break parsers and arithmetic, keywords, keys and scripts.
const ARGS: &[&str] = &[
    "k", "k", "lock:a", "t", "A", "0", "1", "-1", "2", "100", "1000", "30000", "300001", "1e20", "-1e20", "1.5",
    "0.001", "inf", "-inf", "nan", "+5", "007", "9223372036854775807", "-9223372036854775808",
    "18446744073709551616", "99999999999999999999", "", " ", "NX", "XX", "PX", "EX", "PXAT", "EXAT", "GET", "IFEQ",
    "IFNE", "IFDEQ", "KEEPTTL", "WAIT", "KEEPALIVE", "GT", "LT", "SETNAME", "ID", "KILL", "LIST", "INFO", "GETNAME",
    "LOAD", "EXISTS", "FLUSH", "COUNT", "DOCS", "BACKENDS", "LOCKS", "QUARANTINE", "LIFT", "default", "3", "2",
    "redlock-proxy:fence:x", "redlock-proxy:a:{k}k", "{k}x", "*", "lock:*",
    "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end",
    "return redis.call('pttl',KEYS[1])", "return redis.call('set',KEYS[1],ARGV[1])",
    "return redis.call('set',KEYS[1],ARGV[1],'PX',ARGV[2])", "return {1,2,{3}}", "return redis.error_reply('x')",
    "redis.call('lpush',KEYS[1],1)", "(((", "return tonumber(ARGV[1]) * 1e308",
    "e0b2ab79c3e1bed35e1b9dae8a0e8dcd4d2b0bd4",
];

/// The proxy, made once per process (its state carries over from input to input, as a
/// long-lived proxy's does), and the runtime with the paused clock it runs on.
fn world() -> &'static (Runtime, Arc<Proxy>) {
    static WORLD: OnceLock<(Runtime, Arc<Proxy>)> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let config = "embedded_backends = 3\nmax_pipeline = 16\nmax_waiters_per_key = 4\nmax_session_locks_per_client = 4\n\
                      max_hold_ms = 5000\ntimeout = 0\nproto_max_bulk_len = 4096\nmax_args = 64\n";
        let config = Config::parse(config).expect("config");
        let proxy = runtime.block_on(Proxy::start(config)).expect("proxy");
        (runtime, proxy)
    })
}

/// Reads the input as commands.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn arg(&mut self) -> Option<Vec<u8>> {
        let b = self.byte()?;
        let i = usize::from(b);
        if i < ARGS.len() {
            return Some(ARGS[i].as_bytes().to_vec());
        }
        // The input's own bytes: a length, then that many.
        let len = usize::from(b % 16);
        let taken: Vec<u8> = self.0.iter().copied().take(len).collect();
        self.0 = &self.0[taken.len()..];
        Some(taken)
    }

    fn command(&mut self) -> Option<Vec<Vec<u8>>> {
        let name = NAMES[usize::from(self.byte()?) % NAMES.len()];
        let argc = usize::from(self.byte()? % 8);
        let mut args = vec![name.as_bytes().to_vec()];
        for _ in 0..argc {
            args.push(self.arg()?);
        }
        Some(args)
    }
}

fn encode(args: &[Vec<u8>], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// The `commands` target.
pub fn commands(data: &[u8]) {
    let mut input = Input(data);
    // The first byte: RESP3 or not.
    let resp3 = input.byte().is_some_and(|b| b & 1 == 1);
    let mut wire = Vec::new();
    if resp3 {
        encode(&[b"HELLO".to_vec(), b"3".to_vec()], &mut wire);
    }
    let mut count = 0;
    while let Some(command) = input.command() {
        encode(&command, &mut wire);
        count += 1;
        if count == 24 {
            break;
        }
    }
    let (runtime, proxy) = world();
    runtime.block_on(async {
        let (mut ours, theirs) = tokio::io::duplex(1 << 20);
        let (_keep, shutdown) = watch::channel(false);
        let connection = Connection::new(Box::new(theirs), "fuzz".into(), proxy.clone(), shutdown);
        let client = async move {
            ours.write_all(&wire).await.expect("write");
            // A second of virtual time for what was sent (short waits end, TTLs run out,
            // keepalives run three times), then the client leaves while longer ones wait.
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            ours.shutdown().await.expect("shutdown");
            let mut replies = Vec::new();
            ours.read_to_end(&mut replies).await.expect("read");
            BytesMut::from(&replies[..])
        };
        // The connection runs here, not in a task of its own: a panic in it fails the target.
        let (_, replies) = tokio::join!(connection.run(), client);
        check_replies(replies);
    });
    // Every session lock of the input's connection was released with it.
    assert_eq!(proxy.sessions.total(), 0, "session locks left after the connection ended");
}

/// Checks that `bytes` are whole RESP frames, each in RESP3 or RESP2 (the input may switch
/// protocols with `HELLO` and `RESET`).
fn check_replies(mut bytes: BytesMut) {
    while !bytes.is_empty() {
        if let Ok(Some(_)) = decode_bytes_mut(&mut bytes) {
            continue;
        }
        match redis_protocol::resp2::decode::decode_bytes_mut(&mut bytes) {
            Ok(Some(_)) => {}
            other => panic!("not a RESP reply: {other:?} at {bytes:?}"),
        }
    }
}
