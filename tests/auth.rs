//! Client authentication (requirepass, named users with key patterns, HELLO AUTH), backend
//! credentials from the environment, and the script policy.

mod support;

use support::{ProxyProcess, RELEASE, RedisServer, expect_reply, masters, urls};

const USERS: &str = r#"
requirepass = "rootpw"
[[users]]
name = "billing"
password = "billpw"
keys = ["lock:billing:*"]
[[users]]
name = "ops"
password_sha256 = "c5dd5cd4d26e7b1c2d8d1a1a7e5c46f9dc0d0b9c73c6c1e6e5bf4a0fd0b1a9d3"
admin = true
"#;

#[test]
fn named_users_are_limited_to_their_keys() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), USERS);
    let mut c = proxy.raw();
    expect_reply(
        &mut c,
        b"SET lock:billing:1 t NX PX 1000\r\n",
        "-NOAUTH Authentication required.\r\n",
    );
    expect_reply(
        &mut c,
        b"AUTH billing wrong\r\n",
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    expect_reply(&mut c, b"AUTH billing billpw\r\n", "+OK\r\n");
    expect_reply(&mut c, b"SET lock:billing:1 t NX PX 1000\r\n", "+OK\r\n");
    expect_reply(
        &mut c,
        b"SET lock:orders:1 t NX PX 1000\r\n",
        "-NOPERM User billing has no permissions to access the 'lock:orders:1' key\r\n",
    );
    let eval = format!("EVAL '{RELEASE}' 1 lock:orders:1 t\r\n");
    expect_reply(
        &mut c,
        eval.as_bytes(),
        "-NOPERM User billing has no permissions to access the 'lock:orders:1' key\r\n",
    );
    expect_reply(
        &mut c,
        b"PROXY BACKENDS\r\n",
        "-NOPERM User billing has no permissions to run the 'proxy' command\r\n",
    );
    expect_reply(
        &mut c,
        b"WATCH lock:orders:1\r\n",
        "-NOPERM User billing has no permissions to access the 'lock:orders:1' key\r\n",
    );
    // The masters' addresses are for operators: INFO leaves them out for this user.
    let mut billing = redis::Client::open(format!("redis://billing:billpw@127.0.0.1:{}", proxy.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO").query(&mut billing).unwrap();
    assert!(info.contains("# Quorum") && !info.contains("# Backends"), "{info}");
    let info: String = redis::cmd("INFO").arg("backends").query(&mut billing).unwrap();
    assert!(!info.contains("addr="), "{info}");
    // The default user, by requirepass, may do everything.
    let mut root = proxy.raw();
    expect_reply(&mut root, b"AUTH rootpw\r\n", "+OK\r\n");
    expect_reply(&mut root, b"SET lock:orders:1 t NX PX 1000\r\n", "+OK\r\n");
    // Wrong credentials are counted; no password shows anywhere.
    let mut info = redis::Client::open(format!("redis://:rootpw@127.0.0.1:{}", proxy.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let stats: String = redis::cmd("INFO").arg("stats").query(&mut info).unwrap();
    assert!(stats.contains("auth_failures:1"), "{stats}");
    let config: String = redis::cmd("PROXY").arg("CONFIG").query(&mut info).unwrap();
    assert!(!config.contains("billpw") && !config.contains("rootpw"), "{config}");
}

#[test]
fn hello_auth_and_hashed_passwords() {
    let servers = masters(3);
    // The ops user's password is stored as the SHA-256 of "opspw".
    let config = USERS.replace(
        "c5dd5cd4d26e7b1c2d8d1a1a7e5c46f9dc0d0b9c73c6c1e6e5bf4a0fd0b1a9d3",
        &sha256_hex("opspw"),
    );
    let proxy = ProxyProcess::start(&urls(&servers), &config);
    let mut c = proxy.raw();
    let hello = support::roundtrip(&mut c, b"HELLO 3 AUTH ops opspw\r\n", "%7\r\n");
    assert_eq!(hello, "%7\r\n", "HELLO 3 AUTH answers the RESP3 map");
    let mut ok = redis::Client::open(format!("redis://ops:opspw@127.0.0.1:{}", proxy.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let lines: Vec<String> = redis::cmd("PROXY").arg("BACKENDS").query(&mut ok).unwrap();
    assert_eq!(lines.len(), 3, "an admin user runs PROXY commands");
    let info: String = redis::cmd("INFO").arg("backends").query(&mut ok).unwrap();
    assert_eq!(
        info.matches("addr=").count(),
        3,
        "an admin user sees the masters: {info}"
    );
    let mut wrong = proxy.raw();
    expect_reply(
        &mut wrong,
        b"HELLO 3 AUTH ops nope\r\n",
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
}

fn sha256_hex(text: &str) -> String {
    digest_hex("sha256sum", text)
}

/// The hex digest of `text` by a coreutils tool (`sha1sum`, `sha256sum`): an oracle independent
/// of the proxy's own code.
fn digest_hex(tool: &str, text: &str) -> String {
    let out = std::process::Command::new(tool)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().expect("stdin").write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .expect(tool);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_owned()
}

#[test]
fn backend_passwords_come_from_the_environment() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(&["--requirepass", "masterpw"]))
        .collect();
    let backends: Vec<String> = servers
        .iter()
        .map(|s| format!("redis://:${{MASTER_PW}}@127.0.0.1:{}", s.port))
        .collect();
    let proxy = ProxyProcess::start_with_env(&backends, "", &[("MASTER_PW", "masterpw")]);
    let mut c = proxy.raw();
    expect_reply(&mut c, b"SET lock:env t NX PX 1000\r\n", "+OK\r\n");
    // Without the variable the proxy refuses to start, naming the field.
    let path = std::env::temp_dir().join(format!("redlock-env-{}.toml", std::process::id()));
    let list: Vec<String> = backends.iter().map(|b| format!("{b:?}")).collect();
    std::fs::write(&path, format!("backends = [{}]", list.join(", "))).expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redlock-proxy"))
        .arg("--config")
        .arg(&path)
        .arg("--check-config")
        .env_remove("MASTER_PW")
        .output()
        .expect("run");
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("backends: environment variable MASTER_PW is not set"),
        "{err}"
    );
}

#[test]
fn script_allowlist_admits_only_listed_scripts() {
    let servers = masters(3);
    let dir = std::env::temp_dir().join(format!("redlock-scripts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("release.lua");
    std::fs::write(&file, RELEASE).expect("script file");
    let config = format!(
        "script_policy = \"allowlist\"\nscript_files = [{:?}]",
        file.display().to_string()
    );
    let proxy = ProxyProcess::start(&urls(&servers), &config);
    let mut c = proxy.client();
    let ok: Option<String> = redis::cmd("SET")
        .arg("lock:s")
        .arg("t")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query(&mut c)
        .unwrap();
    assert_eq!(ok.as_deref(), Some("OK"));
    // The allowed script runs by SHA1 at once: the proxy loaded it from the file.
    let sha = sha1_hex(RELEASE);
    let released: i64 = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg("lock:s")
        .arg("t")
        .query(&mut c)
        .unwrap();
    assert_eq!(released, 1);
    let err = redis::cmd("EVAL")
        .arg("return redis.call('flushall')")
        .arg(0)
        .query::<String>(&mut c)
        .unwrap_err();
    assert_eq!(err.code(), Some("NOPERM"), "{err}");
    let err = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query::<String>(&mut c)
        .unwrap_err();
    assert_eq!(err.code(), Some("NOPERM"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn any_script_policy_runs_any_script() {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "");
    let mut c = proxy.client();
    let one: i64 = redis::cmd("EVAL").arg("return 1").arg(0).query(&mut c).unwrap();
    assert_eq!(one, 1);
}

/// The SHA1 Redis names a script by: the SHA1 of its body.
fn sha1_hex(body: &str) -> String {
    digest_hex("sha1sum", body)
}
