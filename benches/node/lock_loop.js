// Acquire + release loops from Node, for benches/harness.sh: client-side Redlock (the npm
// `redlock` package talking to every master itself) against a plain ioredis client whose
// Redlock is done by the proxy. Uses the pinned packages of the compatibility suite
// (tests/compat/setup.sh installs them); the harness sets NODE_PATH to tests/compat/node_modules.
//
// usage: node lock_loop.js MODE SECONDS WORKERS PORT...
//   redlock-masters PORT...  redlock over one ioredis client per master (client-side Redlock)
//   ioredis-proxy PORT       ioredis through the proxy: SET key token NX PX, release script (EVALSHA)
//   redlock-proxy PORT       redlock with the proxy as its single client
// Prints one JSON object: locks/s and acquire / cycle latency percentiles in ms.
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const { Redis } = require("ioredis");
const RedlockModule = require("redlock");

const Redlock = RedlockModule.default;
const TTL = 10000;
const KEYSPACE = 1000000;
const RELEASE =
  'if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end';

const [mode, secondsArg, workersArg, ...portArgs] = process.argv.slice(2);
const seconds = Number(secondsArg);
const workers = Number(workersArg);
const ports = portArgs.map(Number);
if (!mode || !(seconds > 0) || !(workers > 0) || ports.length === 0 || ports.some((p) => !(p > 0))) {
  console.error("usage: node lock_loop.js redlock-masters|ioredis-proxy|redlock-proxy SECONDS WORKERS PORT...");
  process.exit(2);
}

function connect(port) {
  return new Redis({ host: "127.0.0.1", port, maxRetriesPerRequest: 1, enableAutoPipelining: false });
}

function percentile(sorted, q) {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

function summary(values) {
  const sorted = Float64Array.from(values).sort();
  const round = (v) => Math.round(v * 10000) / 10000;
  return {
    count: sorted.length,
    p50_ms: round(percentile(sorted, 0.5)),
    p99_ms: round(percentile(sorted, 0.99)),
    p999_ms: round(percentile(sorted, 0.999)),
    max_ms: round(sorted.length ? sorted[sorted.length - 1] : 0),
  };
}

const randomKey = () => `lock:${String(Math.floor(Math.random() * KEYSPACE)).padStart(12, "0")}`;
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

// One lock cycle per call: returns [acquire ms, cycle ms], or null when not acquired.
function cycleFor(clients) {
  if (mode === "ioredis-proxy") {
    const client = clients[0];
    client.defineCommand("releaseLock", { numberOfKeys: 1, lua: RELEASE });
    return async () => {
      const key = randomKey();
      const token = crypto.randomBytes(16).toString("hex");
      const t0 = nowMs();
      const ok = await client.set(key, token, "PX", TTL, "NX");
      const t1 = nowMs();
      if (ok !== "OK") return null;
      const released = await client.releaseLock(key, token);
      if (released !== 1) throw new Error(`release answered ${released}`);
      return [t1 - t0, nowMs() - t0];
    };
  }
  const redlock = new Redlock(clients, { retryCount: 0, driftFactor: 0.01 });
  redlock.on("error", () => {});
  return async () => {
    const t0 = nowMs();
    let lock;
    try {
      lock = await redlock.acquire([randomKey()], TTL);
    } catch (err) {
      if (err instanceof RedlockModule.ExecutionError) {
        await noteFailure("acquire", err);
        return null;
      }
      throw err;
    }
    const t1 = nowMs();
    try {
      await lock.release();
    } catch (err) {
      if (!(err instanceof RedlockModule.ExecutionError)) throw err;
      await noteFailure("release", err);
      releaseFailed += 1;
      return null;
    }
    return [t1 - t0, nowMs() - t0];
  };
}

// CPU time (user + system, seconds) of the processes named in the environment variable `name`
// (pids, space-separated; set by benches/harness.sh for the masters and the proxy), read from
// /proc at the edges of the measured window, warm-up excluded. CLK_TCK: ticks per second.
const HZ = Number(process.env.CLK_TCK || 100);
function cpuOf(name) {
  return (process.env[name] || "").split(" ").filter(Boolean).reduce((total, pid) => {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return total + (Number(fields[11]) + Number(fields[12])) / HZ;
  }, 0);
}

// Why redlock gave up (the first time only): its attempts' votes against.
let releaseFailed = 0;
let firstFailure = null;
async function noteFailure(what, err) {
  if (firstFailure !== null) return;
  firstFailure = `${what}: ${err.message}`;
  try {
    const stats = await Promise.all(err.attempts);
    const against = stats.flatMap((s) => [...s.votesAgainst.values()].map((e) => String(e && e.message ? e.message : e)));
    firstFailure += ` (votes for ${stats.map((s) => s.votesFor.size).join("/")}; against: ${against.join("; ") || "none"})`;
  } catch (e) {
    firstFailure += ` (${e})`;
  }
}

async function main() {
  if (mode === "ioredis-proxy" || mode === "redlock-proxy") ports.length = 1;
  else if (mode !== "redlock-masters") throw new Error(`unknown mode ${mode}`);
  const clients = ports.map(connect);
  await Promise.all(clients.map((c) => c.ping()));
  const one = cycleFor(clients);
  // Warm up (scripts loaded, JIT), then measure.
  const warmEnd = nowMs() + 500;
  await Promise.all(Array.from({ length: workers }, async () => { while (nowMs() < warmEnd) await one(); }));
  const acquire = [];
  const cycle = [];
  let failed = 0;
  const start = nowMs();
  const end = start + seconds * 1000;
  const cpuStart = [process.cpuUsage(), cpuOf("MIDDLE_PIDS"), cpuOf("MASTER_PIDS")];
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (nowMs() < end) {
        const r = await one();
        if (r === null) failed += 1;
        else {
          acquire.push(r[0]);
          cycle.push(r[1]);
        }
      }
    })
  );
  const elapsed = (nowMs() - start) / 1000;
  const own = process.cpuUsage(cpuStart[0]);
  const cpu = {
    client_s: (own.user + own.system) / 1e6,
    middle_s: cpuOf("MIDDLE_PIDS") - cpuStart[1],
    masters_s: cpuOf("MASTER_PIDS") - cpuStart[2],
  };
  console.log(
    JSON.stringify({
      label: mode,
      ports,
      workers,
      seconds: Math.round(elapsed * 1000) / 1000,
      locks_per_s: Math.round((cycle.length / elapsed) * 10) / 10,
      not_acquired: failed - releaseFailed,
      release_failed: releaseFailed,
      first_failure: firstFailure,
      acquire: summary(acquire),
      cycle: summary(cycle),
      // CPU seconds over the measured window: this process, the proxy, the masters.
      cpu,
    })
  );
  await Promise.all(clients.map((c) => c.quit()));
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
