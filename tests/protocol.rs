//! The wire: inline commands, pipelining with ordered replies, RESP3 after HELLO 3, errors
//! that keep the connection, malformed RESP that closes only its own connection.

mod support;

use std::io::{Read, Write};

use support::{ProxyProcess, expect_reply, masters, roundtrip, urls};

fn proxy() -> (Vec<support::RedisServer>, ProxyProcess) {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    (servers, proxy)
}

#[test]
fn inline_commands_like_nc() {
    let (_s, p) = proxy();
    let mut raw = p.raw();
    expect_reply(&mut raw, b"PING\r\n", "+PONG\r\n");
    expect_reply(&mut raw, b"echo \"a b\"\n", "$3\r\na b\r\n");
}

#[test]
fn pipelined_replies_come_back_in_request_order() {
    let (_s, p) = proxy();
    let mut raw = p.raw();
    let release = r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#;
    let mut request = Vec::new();
    for args in [
        vec!["SET", "lock:p1", "t", "NX", "PX", "10000"],
        vec!["SET", "lock:p2", "t", "NX", "PX", "10000"],
        vec!["GET", "lock:p1"],
        vec!["PING"],
        vec!["SET", "lock:p1", "u", "NX", "PX", "10000"],
        vec!["EVAL", release, "1", "lock:p1", "t"],
        vec!["GET", "lock:p1"],
        vec!["NOSUCH"],
        vec!["EXISTS", "lock:p2"],
    ] {
        request.extend(format!("*{}\r\n", args.len()).bytes());
        for a in args {
            request.extend(format!("${}\r\n{a}\r\n", a.len()).bytes());
        }
    }
    let expected = "+OK\r\n+OK\r\n$1\r\nt\r\n+PONG\r\n$-1\r\n:1\r\n$-1\r\n\
                    -ERR unknown command 'NOSUCH', with args beginning with: \r\n:1\r\n";
    expect_reply(&mut raw, &request, expected);
}

#[test]
fn resp3_after_hello_3() {
    let (_s, p) = proxy();
    let mut raw = p.raw();
    let hello = roundtrip(
        &mut raw,
        b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n",
        "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n",
    );
    assert!(hello.starts_with("%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n"), "{hello:?}");
    let mut rest = hello;
    while !rest.contains("modules") {
        let mut buf = [0u8; 1024];
        let n = raw.read(&mut buf).unwrap();
        rest.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(rest.contains("$5\r\nproto\r\n:3\r\n"), "{rest:?}");
    // The RESP3 null, not RESP2's $-1.
    expect_reply(&mut raw, b"*2\r\n$3\r\nGET\r\n$7\r\nmissing\r\n", "_\r\n");
}

#[test]
fn resp3_through_a_real_client() {
    let (_s, p) = proxy();
    let client = redis::Client::open(format!("{}?protocol=resp3", p.url())).unwrap();
    let mut c = client.get_connection().unwrap();
    let ok: Option<String> = redis::cmd("SET")
        .arg("lock:r3")
        .arg("t")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query(&mut c)
        .unwrap();
    assert_eq!(ok.as_deref(), Some("OK"));
    let again: Option<String> = redis::cmd("SET")
        .arg("lock:r3")
        .arg("u")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query(&mut c)
        .unwrap();
    assert_eq!(again, None);
}

#[test]
fn errors_keep_the_connection_open() {
    let (_s, p) = proxy();
    let mut raw = p.raw();
    expect_reply(
        &mut raw,
        b"FOO bar\r\n",
        "-ERR unknown command 'FOO', with args beginning with: 'bar' \r\n",
    );
    expect_reply(
        &mut raw,
        b"SET k v NX PX nope\r\n",
        "-ERR value is not an integer or out of range\r\n",
    );
    expect_reply(&mut raw, b"PING\r\n", "+PONG\r\n");
}

#[test]
fn malformed_resp_closes_only_that_connection() {
    let (_s, p) = proxy();
    let mut bystander = p.raw();
    for garbage in [
        &b"*1\r\n$x\r\n"[..],
        b"*1\r\n:1\r\n",
        b"*1\r\n$3\r\nabcde\r\n",
        b"*99999999999\r\n",
    ] {
        let mut bad = p.raw();
        bad.write_all(garbage).unwrap();
        let mut reply = String::new();
        bad.read_to_string(&mut reply).expect("the proxy closes the connection");
        assert!(reply.starts_with("-ERR Protocol error: "), "{garbage:?} → {reply:?}");
        expect_reply(&mut bystander, b"PING\r\n", "+PONG\r\n");
    }
}

#[test]
fn connection_commands_answered_by_the_proxy() {
    let (_s, p) = proxy();
    let mut c = p.client();
    let info: String = redis::cmd("INFO").arg("server").query(&mut c).unwrap();
    for field in [
        "redis_version:",
        "redis_mode:standalone",
        "role:master",
        "loading:0",
        "run_id:",
    ] {
        assert!(info.contains(field), "INFO server lacks {field}");
    }
    let backends: String = redis::cmd("INFO").arg("backends").query(&mut c).unwrap();
    assert_eq!(backends.matches("state=up").count(), 3, "{backends}");
    let _: () = redis::cmd("CLIENT").arg("SETNAME").arg("me").query(&mut c).unwrap();
    let name: String = redis::cmd("CLIENT").arg("GETNAME").query(&mut c).unwrap();
    assert_eq!(name, "me");
    let docs: redis::Value = redis::cmd("COMMAND").arg("DOCS").query(&mut c).unwrap();
    assert!(matches!(docs, redis::Value::Array(_) | redis::Value::Map(_)));
    let _: () = redis::cmd("SELECT").arg(0).query(&mut c).unwrap();
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .arg("data*")
        .query(&mut c)
        .unwrap();
    assert_eq!(config, ["save", "", "databases", "16"]);
    let echo: String = redis::cmd("ECHO").arg("hi").query(&mut c).unwrap();
    assert_eq!(echo, "hi");
}

#[test]
fn requirepass_demands_auth() {
    let servers = masters(3);
    let p = ProxyProcess::start(&urls(&servers), "requirepass = \"s3cret\"");
    let mut raw = p.raw();
    expect_reply(&mut raw, b"GET k\r\n", "-NOAUTH Authentication required.\r\n");
    let wrongpass = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    expect_reply(&mut raw, b"AUTH nope\r\n", wrongpass);
    expect_reply(&mut raw, b"AUTH s3cret\r\n", "+OK\r\n");
    expect_reply(&mut raw, b"GET k\r\n", "$-1\r\n");
}
