//! Network faults for tests, inside network namespaces the test makes and removes.
//!
//! A run has a **router** namespace and one **leaf** namespace per process (a master, a
//! proxy), each leaf joined to the router by a veth pair that is created inside the run's own
//! namespaces: nothing is added to the machine's own namespace, and no packet leaves the run's
//! namespaces. Leaf `i` is `10.77.<i>.2`, its router side `10.77.<i>.1`; the router forwards
//! between leaves. Faults are rules in the router, applied to the packets it forwards:
//!
//! - nftables drops: a link cut both ways, one way only (requests arrive, replies are lost),
//!   or a share of its packets at random (loss: TCP retransmits them, late);
//! - a **delay line**: the link's packets are routed into a TUN device, held back by a small
//!   Python loop for a fixed time, and written into a second TUN device, from which the router
//!   forwards them on. Delay is netem's job, but netem is a kernel module some kernels are built
//!   without (the one these tests were written on among them: no `sch_netem`, no modules); a TUN
//!   pair works on every kernel with `CONFIG_TUN`.
//!
//! The test's body runs **inside the router namespace**: [`isolated`] makes the namespaces
//! and runs the test binary again there (`ip netns exec <router> <test binary> --exact
//! <test>`), so the test's clients reach the proxies through the router, and the checks that
//! read a master directly are never cut (only forwarded packets are). The outer run owns the
//! namespaces and removes them when it ends, also when the body panicked: processes still in
//! them (started by this run) are killed by id, then the namespaces are deleted.
//!
//! Needs root, `ip` (iproute2), `nft` (nftables), and for delay lines `python3` and
//! `/dev/net/tun`; without them the tests fail, saying what to install.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Placement, ProxyProcess, RedisServer};

/// The environment variable that tells a re-executed test binary it is the body of a run
/// (its value: the test's name, then the run's namespaces).
const INNER: &str = "REDLOCK_TEST_NETNS";

/// How long the body of a run may take before the outer run kills it.
const BODY_TIMEOUT: Duration = Duration::from_secs(240);

/// The nftables table and chain of a run's faults, in its router namespace.
const TABLE: &str = "inet partition";
const CHAIN: &str = "links";

/// One process's namespace, as the body sees it.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The name the test gave it (`m0`, `p1`...).
    pub label: String,
    /// The namespace's name (unique to the run).
    pub ns: String,
    /// Its address.
    pub ip: String,
    /// The router's end of its veth pair.
    router_end: String,
}

/// Runs `body` inside namespaces made for this run: a router and one leaf per label. `test`
/// is the test function's name (the body runs in the test binary started again with
/// `--exact <test>`, so it must be the name of the test calling this). Panics when the body
/// fails, with its output; the namespaces are removed in every case.
pub fn isolated(test: &str, labels: &[&str], body: impl FnOnce(&Net)) {
    match std::env::var(INNER) {
        Ok(spec) => {
            let net = Net::decode(&spec);
            assert_eq!(net.test, test, "a run's body started for another test");
            body(&net);
        }
        Err(_) => outer(test, labels),
    }
}

/// The outer run: makes the namespaces, runs the body in the router namespace, prints what it
/// printed, and removes the namespaces.
fn outer(test: &str, labels: &[&str]) {
    require_tools();
    let run = Namespaces::create(labels);
    let out_dir = std::env::temp_dir().join(format!("{}-out", run.router));
    std::fs::create_dir_all(&out_dir).expect("output directory");
    let (out_path, err_path) = (out_dir.join("stdout"), out_dir.join("stderr"));
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new("ip")
        .args(["netns", "exec", &run.router])
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(INNER, run.encode(test))
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("ip netns exec");
    let deadline = Instant::now() + BODY_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&out_dir);
    print!("{out}");
    eprint!("{err}");
    let Some(status) = status else {
        panic!("{test}: the body did not finish within {BODY_TIMEOUT:?}");
    };
    assert!(status.success(), "{test}: the body failed in its namespaces ({status})");
    assert!(
        out.contains("1 passed"),
        "{test}: the test binary started in the namespaces did not run this test"
    );
}

/// Fails, saying what to install, when a tool the runs need is missing or namespaces cannot be
/// made.
fn require_tools() {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0");
    assert!(
        root,
        "the partition tests make network namespaces, veth pairs and nftables rules: run them as root"
    );
    // A missing tool fails the test (never a skip): each is named with its Debian package.
    for (tool, probe, package) in [
        ("ip", "-V", "iproute2"),
        ("nft", "--version", "nftables"),
        ("redis-server", "--version", "redis-server"),
    ] {
        if !works(tool, &[probe]) {
            panic!("the partition tests cannot run without `{tool}`: install it (`apt-get install -y {package}`)");
        }
    }
}

/// Runs a command to its end; panics with its output when it fails.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{program} {} failed ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `command` in namespace `ns`, with `input` on its stdin; its stdout. Panics when it fails.
fn in_ns(ns: &str, command: &[&str], input: Option<&str>) -> String {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run ip netns exec: {e}"));
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(input) = input {
        stdin.write_all(input.as_bytes()).expect("write stdin");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{} in {ns} failed ({}): {}{}\n{}",
        command.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        input.unwrap_or("")
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A run's namespaces, owned by the outer run: removed when dropped.
struct Namespaces {
    router: String,
    leaves: Vec<Leaf>,
    /// Every namespace made so far (the router first), for the drop.
    made: Vec<String>,
}

impl Namespaces {
    fn create(labels: &[&str]) -> Namespaces {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let id = format!("rlp{}-{}", std::process::id(), RUNS.fetch_add(1, Ordering::Relaxed));
        let router = format!("{id}-r");
        let mut run = Namespaces {
            router: router.clone(),
            leaves: Vec::new(),
            made: Vec::new(),
        };
        run.add_namespace(&router);
        // Forwarding between the leaves; no reverse-path filter (a delay line's packets come
        // back in through a TUN device, not the veth their source sits behind), also on devices
        // made later.
        in_ns(
            &router,
            &[
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/ip_forward && \
                 echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter && \
                 echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter",
            ],
            None,
        );
        in_ns(
            &router,
            &["nft", "-f", "-"],
            Some(&format!(
                "add table {TABLE}\nadd chain {TABLE} {CHAIN} {{ type filter hook forward priority 0; policy accept; }}\n"
            )),
        );
        for (i, label) in labels.iter().enumerate() {
            let i = i + 1;
            let ns = format!("{id}-{label}");
            run.add_namespace(&ns);
            let router_end = format!("l{i}");
            let (ip, gateway) = (format!("10.77.{i}.2"), format!("10.77.{i}.1"));
            run_ip(
                &router,
                &[
                    "link",
                    "add",
                    &router_end,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    &ns,
                ],
            );
            run_ip(&router, &["addr", "add", &format!("{gateway}/24"), "dev", &router_end]);
            run_ip(&router, &["link", "set", &router_end, "up"]);
            run_ip(&ns, &["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
            run_ip(&ns, &["link", "set", "eth0", "up"]);
            run_ip(&ns, &["route", "add", "default", "via", &gateway]);
            run.leaves.push(Leaf {
                label: label.to_string(),
                ns,
                ip,
                router_end,
            });
        }
        run
    }

    fn add_namespace(&mut self, ns: &str) {
        run("ip", &["netns", "add", ns]);
        self.made.push(ns.to_owned());
        run_ip(ns, &["link", "set", "lo", "up"]);
    }

    /// The body's view: `test|router|label=ns=ip=router_end;...`.
    fn encode(&self, test: &str) -> String {
        let leaves: Vec<String> = self
            .leaves
            .iter()
            .map(|l| format!("{}={}={}={}", l.label, l.ns, l.ip, l.router_end))
            .collect();
        format!("{test}|{}|{}", self.router, leaves.join(";"))
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Leaves first, the router (where the body runs) last.
        for ns in self.made.iter().rev() {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// `ip -n <ns> <args>`.
fn run_ip(ns: &str, args: &[&str]) {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run("ip", &all);
}

/// One nftables drop rule of a run.
#[derive(Clone, Debug)]
struct Rule {
    from: String,
    to: String,
    /// Drop only this share of the packets (in percent), at random; `None`: all.
    percent: Option<u8>,
}

/// The run's namespaces, as the body sees them, and the faults it applies.
pub struct Net {
    test: String,
    router: String,
    leaves: Vec<Leaf>,
    rules: Mutex<Vec<Rule>>,
    /// Packets dropped by rules since removed.
    dropped_before: AtomicU64,
    /// Delay lines made so far (each gets its own devices, table and rule numbers).
    lines: AtomicU64,
}

impl Net {
    fn decode(spec: &str) -> Net {
        let mut parts = spec.splitn(3, '|');
        let (test, router, leaves) = (
            parts.next().expect("test"),
            parts.next().expect("router"),
            parts.next().expect("leaves"),
        );
        let leaves = leaves
            .split(';')
            .map(|l| {
                let f: Vec<&str> = l.split('=').collect();
                Leaf {
                    label: f[0].into(),
                    ns: f[1].into(),
                    ip: f[2].into(),
                    router_end: f[3].into(),
                }
            })
            .collect();
        Net {
            test: test.into(),
            router: router.into(),
            leaves,
            rules: Mutex::new(Vec::new()),
            dropped_before: AtomicU64::new(0),
            lines: AtomicU64::new(0),
        }
    }

    /// The leaf labelled `label`.
    pub fn leaf(&self, label: &str) -> &Leaf {
        self.leaves
            .iter()
            .find(|l| l.label == label)
            .unwrap_or_else(|| panic!("no namespace labelled {label}"))
    }

    /// Where a process of leaf `label` runs: in its namespace, bound to its address.
    pub fn placement(&self, label: &str) -> Placement {
        let leaf = self.leaf(label);
        Placement {
            prefix: vec!["ip".into(), "netns".into(), "exec".into(), leaf.ns.clone()],
            host: leaf.ip.clone(),
        }
    }

    /// A master in leaf `label` (port 6379: the namespace is its own).
    pub fn master(&self, label: &str) -> RedisServer {
        RedisServer::start_placed(self.placement(label), 6379, &[])
    }

    /// A proxy in leaf `label` on port 7379, over `backends`, with extra config lines.
    pub fn proxy(&self, label: &str, backends: &[String], config: &str) -> ProxyProcess {
        ProxyProcess::start_placed(&self.placement(label), 7379, backends, config)
    }

    /// Cuts the link between `a` and `b`, both ways: their packets are dropped.
    pub fn cut(&self, a: &str, b: &str) {
        self.add(&[(a, b, None), (b, a, None)]);
    }

    /// Drops `from`'s packets to `to` only (`to`'s requests still arrive; `from`'s replies,
    /// acknowledgements included, do not).
    pub fn cut_one_way(&self, from: &str, to: &str) {
        self.add(&[(from, to, None)]);
    }

    /// Drops `percent` % of the packets between `a` and `b`, both ways, at random.
    pub fn lose(&self, a: &str, b: &str, percent: u8) {
        self.add(&[(a, b, Some(percent)), (b, a, Some(percent))]);
    }

    /// Removes every drop rule (delay lines stay until dropped).
    pub fn heal(&self) {
        let mut rules = self.rules.lock().expect("rules");
        rules.clear();
        self.write_rules(&rules);
    }

    /// Packets dropped by the rules so far.
    pub fn dropped(&self) -> u64 {
        self.dropped_before.load(Ordering::SeqCst) + self.counted()
    }

    /// The packets the rules in place have dropped.
    fn counted(&self) -> u64 {
        let listing = in_ns(
            &self.router,
            &["nft", "list", "chain", "inet", "partition", CHAIN],
            None,
        );
        listing
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "packets")
            .filter_map(|w| w[1].parse::<u64>().ok())
            .sum()
    }

    fn add(&self, new: &[(&str, &str, Option<u8>)]) {
        let mut rules = self.rules.lock().expect("rules");
        for &(from, to, percent) in new {
            rules.push(Rule {
                from: self.leaf(from).ip.clone(),
                to: self.leaf(to).ip.clone(),
                percent,
            });
        }
        self.write_rules(&rules);
    }

    /// Replaces the chain's rules with `rules`, in one nftables transaction (the counters of
    /// the rules replaced are kept in `dropped_before`).
    fn write_rules(&self, rules: &[Rule]) {
        self.dropped_before.fetch_add(self.counted(), Ordering::SeqCst);
        let mut script = format!("flush chain {TABLE} {CHAIN}\n");
        for rule in rules {
            let share = rule
                .percent
                .map(|p| format!(" numgen random mod 100 < {p}"))
                .unwrap_or_default();
            let _ = writeln!(
                script,
                "add rule {TABLE} {CHAIN} ip saddr {} ip daddr {}{share} counter drop",
                rule.from, rule.to
            );
        }
        in_ns(&self.router, &["nft", "-f", "-"], Some(&script));
    }

    /// Holds back every packet between `a` and each of `others`, both ways, by `delay` (the
    /// round trip grows by twice that), until the line is dropped.
    pub fn delay(&self, a: &str, others: &[&str], delay: Duration) -> DelayLine {
        let n = self.lines.fetch_add(1, Ordering::SeqCst);
        let (inlet, outlet) = (format!("d{n}i"), format!("d{n}o"));
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.router, "python3", "-c", DELAY_LINE])
            .args([&inlet, &outlet, &delay.as_millis().to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start a delay line ({e})"));
        let mut out = BufReader::new(child.stdout.take().expect("delay line stdout"));
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the delay line did not start (it needs python3, e.g. `apt-get install -y python3`, and \
                 /dev/net/tun: a kernel with CONFIG_TUN)"
            );
        }
        let table = (100 + n).to_string();
        run_ip(&self.router, &["link", "set", &inlet, "up"]);
        run_ip(&self.router, &["link", "set", &outlet, "up"]);
        run_ip(
            &self.router,
            &["route", "add", "default", "dev", &inlet, "table", &table],
        );
        let a = self.leaf(a);
        let mut prefs = Vec::new();
        for other in others {
            let b = self.leaf(other);
            for (from, to) in [(a, b), (b, a)] {
                let pref = (1000 + n * 100 + prefs.len() as u64).to_string();
                run_ip(
                    &self.router,
                    &[
                        "rule",
                        "add",
                        "pref",
                        &pref,
                        "iif",
                        &from.router_end,
                        "to",
                        &to.ip,
                        "table",
                        &table,
                    ],
                );
                prefs.push(pref);
            }
        }
        DelayLine {
            router: self.router.clone(),
            child: Some(child),
            out,
            prefs,
        }
    }
}

/// The delay line: reads packets from one TUN device and writes each into the other after a
/// fixed delay (in order). On SIGTERM it writes what it still holds, prints how many packets it
/// delayed, and exits.
const DELAY_LINE: &str = r#"
import fcntl, heapq, os, select, signal, struct, sys, time
def tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", name.encode(), 0x1001))  # TUNSETIFF, IFF_TUN | IFF_NO_PI
    return fd
inlet, outlet, delay = tun(sys.argv[1]), tun(sys.argv[2]), float(sys.argv[3]) / 1000.0
held, count = [], 0
def stop(*_):
    for _, _, packet in sorted(held):
        try:
            os.write(outlet, packet)
        except OSError:
            pass
    print(count, flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    wait = max(0.0, held[0][0] - time.monotonic()) if held else None
    if select.select([inlet], [], [], wait)[0]:
        count += 1
        heapq.heappush(held, (time.monotonic() + delay, count, os.read(inlet, 65535)))
    now = time.monotonic()
    while held and held[0][0] <= now:
        try:
            os.write(outlet, heapq.heappop(held)[2])
        except OSError:
            pass
"#;

/// A delay line in place; removed (its packets released) by [`DelayLine::stop`] or the drop.
pub struct DelayLine {
    router: String,
    child: Option<Child>,
    out: BufReader<std::process::ChildStdout>,
    prefs: Vec<String>,
}

impl DelayLine {
    /// Takes the line out of the path and stops it; returns how many packets it delayed.
    pub fn stop(mut self) -> u64 {
        self.remove()
    }

    fn remove(&mut self) -> u64 {
        let Some(mut child) = self.child.take() else {
            return 0;
        };
        for pref in self.prefs.drain(..) {
            let _ = Command::new("ip")
                .args(["-n", &self.router, "rule", "del", "pref", &pref])
                .status();
        }
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let mut line = String::new();
        let _ = self.out.read_line(&mut line);
        let _ = child.wait();
        line.trim().parse().unwrap_or(0)
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.remove();
    }
}
