//! Process pauses: a lock holder stopped (SIGSTOP) past its TTL, on real masters.
//!
//! The holder is a child process (this test binary started again in a holder's role): it
//! takes `lock:res` with `LOCK.ACQUIRE` (a fencing token), works for a while, then writes to a
//! resource with its token. The test stops it with SIGSTOP as soon as it has the lock, and
//! keeps it stopped past its TTL: the proxy cannot tell a paused holder from a dead one, so a
//! second client, waiting with `LOCK.ACQUIRE ... WAIT`, is granted the lock when the TTL runs
//! out (with a higher token) and writes. Then the test continues the holder (SIGCONT), which
//! still believes it holds the lock and writes with its old token.
//!
//! The resource is a small server in the test (a thread serving a line protocol over TCP):
//! - fenced, it accepts a write only with a token above the highest it has seen, so the late
//!   write is refused and the second holder's write stays;
//! - the control, unfenced (it ignores tokens): the late write lands over the second holder's,
//!   which is lost. Nothing in Redlock alone prevents that (docs/safety.md, "What it does not
//!   guarantee"); fencing does.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;
use support::{ProxyProcess, fencing_ready, masters, urls};

/// Set in the holder's process: `<test>|<proxy url>|<resource address>`.
const HOLDER: &str = "REDLOCK_TEST_PAUSED_HOLDER";
/// The holder's TTL, and the work it does between taking the lock and writing: well within
/// the TTL, so that only the pause makes the write late.
const TTL_MS: u64 = 1000;
const WORK_MS: u64 = 500;

/// The resource's state: the value, who wrote it, the highest token seen, every write.
#[derive(Default)]
struct State {
    value: Option<String>,
    highest: u64,
    writes: Vec<(String, u64, bool)>,
}

/// A resource that clients write to over TCP: `WRITE <token> <value>` answers `OK`, or
/// `STALE <highest>` when it checks tokens and `token` is not above the highest seen.
struct Resource {
    addr: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl Resource {
    fn start(fenced: bool) -> Resource {
        let listener = TcpListener::bind("127.0.0.1:0").expect("resource listener");
        let addr = listener.local_addr().expect("address").to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopping) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let state = shared.clone();
                std::thread::spawn(move || serve(conn, &state, fenced));
            }
        });
        Resource { addr, state, stop }
    }

    fn value(&self) -> Option<String> {
        self.state.lock().expect("state").value.clone()
    }

    fn writes(&self) -> Vec<(String, u64, bool)> {
        self.state.lock().expect("state").writes.clone()
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

fn serve(conn: TcpStream, state: &Mutex<State>, fenced: bool) {
    let mut out = conn.try_clone().expect("clone");
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        let mut words = line.splitn(3, ' ');
        let (Some("WRITE"), Some(token), Some(value)) = (words.next(), words.next(), words.next()) else {
            let _ = out.write_all(b"ERR\n");
            continue;
        };
        let token: u64 = token.parse().unwrap_or(0);
        let reply = {
            let mut s = state.lock().expect("state");
            let accepted = !fenced || token > s.highest;
            s.writes.push((value.to_owned(), token, accepted));
            if accepted {
                s.highest = s.highest.max(token);
                s.value = Some(value.to_owned());
                "OK".to_owned()
            } else {
                format!("STALE {}", s.highest)
            }
        };
        let _ = out.write_all(format!("{reply}\n").as_bytes());
    }
}

/// One write to the resource at `addr`: its reply.
fn write(addr: &str, token: u64, value: &str) -> String {
    let mut conn = TcpStream::connect(addr).expect("resource connection");
    conn.write_all(format!("WRITE {token} {value}\n").as_bytes())
        .expect("write");
    let mut reply = String::new();
    BufReader::new(conn).read_line(&mut reply).expect("reply");
    reply.trim().to_owned()
}

/// The holder's role, in its own process: take the lock, say so, work, write, say how it went.
fn holder(test: &str, spec: &str) {
    let mut parts = spec.split('|');
    assert_eq!(parts.next(), Some(test), "a holder started for another test");
    let (proxy, resource) = (parts.next().expect("proxy"), parts.next().expect("resource"));
    let mut conn = redis::Client::open(proxy)
        .and_then(|c| c.get_connection())
        .expect("proxy connection");
    let token: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg("lock:res")
        .arg("holder-a")
        .arg(TTL_MS)
        .query(&mut conn)
        .expect("LOCK.ACQUIRE");
    println!("TOKEN {token}");
    std::io::stdout().flush().expect("flush");
    // The protected work, well within the TTL: only a pause makes the write below late.
    std::thread::sleep(Duration::from_millis(WORK_MS));
    let reply = write(resource, token as u64, "written-by-a");
    println!("WROTE {reply}");
}

/// The process state letter of `pid` (`T`: stopped).
fn state_of(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .and_then(|rest| rest.trim().chars().next())
        .unwrap_or('?')
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status();
    assert!(ok.is_ok_and(|s| s.success()), "kill {sig} {pid}");
}

/// What one pause came to.
#[derive(Debug)]
struct Outcome {
    token_a: u64,
    token_b: u64,
    /// How long the holder was stopped.
    paused: Duration,
    /// How long after the holder's grant the waiter got the lock.
    b_granted_after: Duration,
    /// The resource's answer to the late write.
    late_write: String,
    /// The resource's value at the end.
    value: Option<String>,
}

/// Plays the pause against a resource that checks tokens (`fenced`) or not.
fn pause_holder(test: &str, fenced: bool) -> Outcome {
    let servers = masters(3);
    let proxy = ProxyProcess::start(&urls(&servers), "backend_timeout_ms = 500");
    fencing_ready(&proxy);
    let resource = Resource::start(fenced);
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(HOLDER, format!("{test}|{}|{}", proxy.url(), resource.addr))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the holder");
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().expect("holder stdout"));
    let mut line = String::new();
    let token_a = loop {
        line.clear();
        let n = out.read_line(&mut line).expect("holder output");
        if n == 0 {
            panic!("the holder ended without a lock: {:?}", child.wait());
        }
        // The harness's `test <name> ... ` precedes the first line on the same line.
        if let Some((_, token)) = line.trim().split_once("TOKEN ") {
            break token.parse::<u64>().expect("a token");
        }
    };
    let granted = Instant::now();
    signal(pid, "-STOP");
    let stopped = Instant::now();
    let deadline = stopped + Duration::from_secs(5);
    while state_of(pid) != 'T' {
        assert!(Instant::now() < deadline, "the holder did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        resource.writes().is_empty(),
        "the holder wrote before it was stopped (its work is {WORK_MS} ms): this machine is too slow for the test"
    );
    // The second client waits for the lock: the proxy hands it over when the stopped holder's
    // TTL runs out.
    let mut b = proxy.client();
    let reply: redis::RedisResult<Value> = redis::cmd("LOCK.ACQUIRE")
        .arg("lock:res")
        .arg("holder-b")
        .arg(10_000)
        .arg("WAIT")
        .arg(10_000)
        .query(&mut b);
    let Ok(Value::Int(token_b)) = reply else {
        panic!("the waiter was not granted: {reply:?}");
    };
    let b_granted_after = granted.elapsed();
    // The pause covers the hand-over: the holder was stopped, believing it held the lock, when
    // the lock passed to the waiter.
    assert_eq!(
        state_of(pid),
        'T',
        "the holder is still stopped when the waiter is granted"
    );
    assert_eq!(
        write(&resource.addr, token_b as u64, "written-by-b"),
        "OK",
        "the new holder's write"
    );
    signal(pid, "-CONT");
    let paused = stopped.elapsed();
    let late_write = loop {
        line.clear();
        let n = out.read_line(&mut line).expect("holder output");
        assert!(n > 0, "the holder ended without writing");
        if let Some((_, reply)) = line.trim().split_once("WROTE ") {
            break reply.to_owned();
        }
    };
    let status = child.wait().expect("holder exit");
    assert!(status.success(), "the holder failed: {status}");
    let outcome = Outcome {
        token_a,
        token_b: token_b as u64,
        paused,
        b_granted_after,
        late_write,
        value: resource.value(),
    };
    println!(
        "{test}: holder stopped {} ms (TTL {TTL_MS} ms, work {WORK_MS} ms); the waiter was granted {} ms after the \
         holder, token {} > {}; 2 writes checked; the late write with the old token: {:?}; the resource holds {:?}",
        outcome.paused.as_millis(),
        outcome.b_granted_after.as_millis(),
        outcome.token_b,
        outcome.token_a,
        outcome.late_write,
        outcome.value
    );
    outcome
}

/// With fencing, the paused holder's late write is refused and the new holder's write stays.
#[test]
fn a_paused_holders_late_write_is_refused_by_a_fenced_resource() {
    let test = "a_paused_holders_late_write_is_refused_by_a_fenced_resource";
    if let Ok(spec) = std::env::var(HOLDER) {
        return holder(test, &spec);
    }
    let outcome = pause_holder(test, true);
    assert!(outcome.token_b > outcome.token_a, "the new holder's token is higher");
    assert_eq!(
        outcome.late_write,
        format!("STALE {}", outcome.token_b),
        "the late write is refused"
    );
    assert_eq!(
        outcome.value.as_deref(),
        Some("written-by-b"),
        "the new holder's write stays"
    );
}

/// The control: the same pause against a resource that ignores tokens. The late write lands
/// and the new holder's write is lost: the violation a pause makes possible without fencing.
#[test]
fn control_without_fencing_a_paused_holders_late_write_lands() {
    let test = "control_without_fencing_a_paused_holders_late_write_lands";
    if let Ok(spec) = std::env::var(HOLDER) {
        return holder(test, &spec);
    }
    let outcome = pause_holder(test, false);
    assert_eq!(outcome.late_write, "OK", "the unfenced resource took the late write");
    assert_eq!(
        outcome.value.as_deref(),
        Some("written-by-a"),
        "the paused holder's late write overwrote the new holder's"
    );
}
