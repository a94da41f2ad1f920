//! Masters whose wall clock a test moves while they run: `redis-server` built with the C
//! library's allocator (`tests/clock/build-redis.sh`) under libfaketime, which reads its
//! setting from a file on every clock read (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE=1`).
//!
//! The setting is libfaketime's relative form: an offset in seconds, fractions allowed
//! (`+30`, `-0.25`), optionally followed by a speed (`+0 x1.1`: the clock runs 10 % fast).
//! `FAKETIME_XRESET=1` makes a new speed apply from the moment it is written (without it,
//! libfaketime applies it from the process's start, and the clock jumps by the difference);
//! `FAKETIME_DONT_FAKE_MONOTONIC=1` leaves the monotonic clock alone, as a wall-clock step or
//! a fast NTP-disciplined clock would. Redis expires keys by its wall clock: a jump forward
//! expires keys at once, and a fast clock runs every TTL down early.
//!
//! Nothing is skipped: a missing build or a missing libfaketime fails the test with the
//! command that installs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::RedisServer;

/// The command that builds the servers (from the repository's root).
pub const BUILD_COMMAND: &str = "bash tests/clock/build-redis.sh";

/// A Redis version that `tests/clock/build-redis.sh` builds with `MALLOC=libc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// Redis 6.2.14.
    V6_2,
    /// Redis 7.0.15.
    V7_0,
}

impl Version {
    /// The directory of the build under [`builds_dir`].
    pub fn dir(self) -> &'static str {
        match self {
            Version::V6_2 => "6.2",
            Version::V7_0 => "7.0",
        }
    }

    /// The version the binary reports.
    pub fn full(self) -> &'static str {
        match self {
            Version::V6_2 => "6.2.14",
            Version::V7_0 => "7.0.15",
        }
    }
}

/// Where the builds are: `$REDIS_LIBC_DIR`, else `target/redis-libc` in the repository.
pub fn builds_dir() -> PathBuf {
    match std::env::var_os("REDIS_LIBC_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("redis-libc"),
    }
}

/// The libc build of `version`; panics, with the command that builds it, when it is missing
/// or is not that version built with the libc allocator.
pub fn server_binary(version: Version) -> PathBuf {
    let path = builds_dir().join(version.dir()).join("redis-server");
    let build = format!("build it with `{BUILD_COMMAND}` (REDIS_LIBC_DIR chooses another directory)");
    let reported = Command::new(&path).arg("--version").output().unwrap_or_else(|e| {
        panic!(
            "Redis {} (MALLOC=libc) is missing at {} ({e}): {build}",
            version.full(),
            path.display()
        )
    });
    let reported = String::from_utf8_lossy(&reported.stdout);
    assert!(
        reported.contains(&format!("v={} ", version.full())) && reported.contains("malloc=libc"),
        "{} is not Redis {} built with malloc=libc ({}): {build}",
        path.display(),
        version.full(),
        reported.trim()
    );
    path
}

/// libfaketime's preload library: `$FAKETIME_LIB`, else where Debian's `libfaketime` puts it.
pub fn libfaketime() -> PathBuf {
    if let Some(lib) = std::env::var_os("FAKETIME_LIB") {
        return PathBuf::from(lib);
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime").join("libfaketime.so.1"))
        .collect();
    candidates.push(PathBuf::from("/usr/local/lib/faketime/libfaketime.so.1"));
    candidates.push(PathBuf::from("/usr/lib/faketime/libfaketime.so.1"));
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("libfaketime is not installed: `apt-get install -y faketime` (or set FAKETIME_LIB to libfaketime.so.1)")
    })
}

/// A master of `version` (the libc build) with the machine's clock.
pub fn plain_master(version: Version) -> RedisServer {
    RedisServer::start_program(&server_binary(version), &[])
}

/// The machine's wall clock, in ms since the epoch.
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// A master of a given version under libfaketime, whose wall clock the test jumps or speeds up.
/// Dereferences to its [`RedisServer`].
pub struct FakeClockMaster {
    server: RedisServer,
    /// libfaketime's setting, rewritten (atomically) on every change.
    setting: PathBuf,
    /// The offset written last, in seconds.
    offset_s: f64,
    /// The speed written last (1: the machine's).
    speed: f64,
}

impl FakeClockMaster {
    /// Starts a master of `version` with its clock at the machine's (offset 0, speed 1).
    pub fn start(version: Version) -> FakeClockMaster {
        static SETTINGS: AtomicU64 = AtomicU64::new(0);
        let program = server_binary(version);
        let lib = libfaketime();
        let setting = std::env::temp_dir().join(format!(
            "redlock-proxy-faketime-{}-{}",
            std::process::id(),
            SETTINGS.fetch_add(1, Ordering::Relaxed)
        ));
        write_setting(&setting, "+0");
        let env: Vec<(String, String)> = [
            ("LD_PRELOAD", lib.to_string_lossy().into_owned()),
            ("FAKETIME_TIMESTAMP_FILE", setting.to_string_lossy().into_owned()),
            ("FAKETIME_NO_CACHE", "1".to_owned()),
            ("FAKETIME_XRESET", "1".to_owned()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let server = RedisServer::start_program(&program, &env);
        FakeClockMaster {
            server,
            setting,
            offset_s: 0.0,
            speed: 1.0,
        }
    }

    /// Moves the master's wall clock by `by` (forward), at once.
    pub fn jump_forward(&mut self, by: Duration) {
        self.offset_s += by.as_secs_f64();
        self.apply(false);
    }

    /// Makes the master's wall clock run `speed` times as fast as the machine's from now on
    /// (1.1: 10 % fast), without a jump.
    pub fn set_speed(&mut self, speed: f64) {
        self.speed = speed;
        self.apply(true);
    }

    /// Writes the setting. A speed is written only when it changes, `x1` included: libfaketime
    /// keeps the last speed it read while a setting names none (a clock set back to 1 by
    /// omitting it ran on at 1.5), and with `FAKETIME_XRESET` a setting that names a speed is
    /// read as a change of speed, whose offset it does not apply (a jump written with an
    /// unchanged `x1` did not move the clock).
    fn apply(&self, speed_changed: bool) {
        let mut text = format!("{:+.3}", self.offset_s);
        if speed_changed {
            text.push_str(&format!(" x{}", self.speed));
        }
        write_setting(&self.setting, &text);
    }

    /// The master's `TIME`, in ms since the epoch.
    pub fn time_ms(&self) -> i64 {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut self.server.client()).expect("TIME");
        secs * 1000 + micros / 1000
    }

    /// How far the master's wall clock is ahead of the machine's, in ms (read by `TIME`; the
    /// middle of [`FakeClockMaster::clock_ahead_bounds`]).
    pub fn clock_ahead_ms(&self) -> i64 {
        let (low, high) = self.clock_ahead_bounds();
        (low + high) / 2
    }

    /// Bounds of how far the master's wall clock is ahead of the machine's, in ms: its `TIME`
    /// against the machine's clock read before the request and after the reply (±1 ms of
    /// rounding).
    pub fn clock_ahead_bounds(&self) -> (i64, i64) {
        let before = wall_ms();
        let master = self.time_ms();
        let after = wall_ms();
        (master - after - 1, master - before + 1)
    }
}

impl std::ops::Deref for FakeClockMaster {
    type Target = RedisServer;
    fn deref(&self) -> &RedisServer {
        &self.server
    }
}

impl Drop for FakeClockMaster {
    fn drop(&mut self) {
        let pid = self.server.child.as_ref().map(std::process::Child::id);
        self.server.kill();
        remove_shm(pid);
        let _ = std::fs::remove_file(&self.setting);
    }
}

/// libfaketime keeps a shared-memory segment and a semaphore named after the process, which a
/// `kill -9` leaves behind; a later process with the same id would fail to start over them.
fn remove_shm(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = std::fs::remove_file(format!("/dev/shm/faketime_shm_{pid}"));
        let _ = std::fs::remove_file(format!("/dev/shm/sem.faketime_sem_{pid}"));
    }
}

/// Writes libfaketime's setting through a rename, so the master never reads half a line.
fn write_setting(path: &Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, format!("{text}\n")).expect("write the faketime setting");
    std::fs::rename(&partial, path).expect("install the faketime setting");
}

/// `PTTL key` through a connection to a master, in ms (-2: no such key, -1: no TTL). Polls
/// keep one connection: a new one for each would churn through loopback ports, and a connect
/// that meets a port still in `TIME_WAIT` can stall for a second.
pub fn pttl(connection: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(connection).expect("PTTL")
}
