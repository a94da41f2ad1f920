//! TLS on both sides: a TLS client (redis-cli --tls) through the proxy's `tls_listen` to
//! TLS-only `redis-server` masters reached by `rediss://`, with certificates made here.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{ProxyProcess, free_port};

/// A self-signed certificate for `localhost` and 127.0.0.1, and its key, as PEM files.
fn certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let certified = rcgen::generate_simple_self_signed(names).expect("certificate");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).expect("write cert");
    std::fs::write(&key, certified.signing_key.serialize_pem()).expect("write key");
    (cert, key)
}

/// `redis-cli --tls` against `port`, trusting `ca`.
fn cli(port: u16, ca: &Path, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["--tls", "--cacert"])
        .arg(ca)
        .args(["-h", "localhost", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (apt-get install -y redis-tools)");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A master that speaks only TLS.
struct TlsMaster {
    port: u16,
    child: Child,
}

impl TlsMaster {
    fn start(cert: &Path, key: &Path) -> TlsMaster {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--tls-cert-file")
            .arg(cert)
            .arg("--tls-key-file")
            .arg(key)
            .arg("--tls-ca-cert-file")
            .arg(cert)
            .args(["--tls-auth-clients", "no", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install -y redis-server)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while cli(port, cert, &["PING"]) != "PONG" {
            assert!(Instant::now() < deadline, "TLS redis-server never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
        TlsMaster { port, child }
    }
}

impl Drop for TlsMaster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn tls_client_through_the_proxy_to_tls_masters() {
    let dir = std::env::temp_dir().join(format!("redlock-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (cert, key) = certificate(&dir);
    let masters: Vec<TlsMaster> = (0..3).map(|_| TlsMaster::start(&cert, &key)).collect();
    let backends: Vec<String> = masters
        .iter()
        .map(|m| format!("rediss://localhost:{}", m.port))
        .collect();
    let tls_port = free_port();
    let config = format!(
        "tls_listen = \"127.0.0.1:{tls_port}\"\ntls_cert_file = {:?}\ntls_key_file = {:?}\ntls_ca_file = {:?}",
        cert.display().to_string(),
        key.display().to_string(),
        cert.display().to_string()
    );
    let _proxy = ProxyProcess::start(&backends, &config);
    assert_eq!(
        cli(tls_port, &cert, &["SET", "lock:tls", "t", "NX", "PX", "10000"]),
        "OK"
    );
    assert_eq!(cli(tls_port, &cert, &["SET", "lock:tls", "u", "NX", "PX", "10000"]), "");
    let held = masters
        .iter()
        .filter(|m| cli(m.port, &cert, &["GET", "lock:tls"]) == "t")
        .count();
    assert!(held >= 2, "the lock is on a majority of the TLS masters ({held})");
    let release = r#"if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end"#;
    assert_eq!(cli(tls_port, &cert, &["EVAL", release, "1", "lock:tls", "t"]), "1");
    let _ = std::fs::remove_dir_all(&dir);
}
