// Tiny check recorder shared by the Node client programs: one printed line per check,
// exit code 1 when any failed.
"use strict";

const failures = [];

function check(label, ok, detail) {
  if (ok) {
    console.log(`ok   ${label}`);
  } else {
    failures.push(label);
    console.log(`FAIL ${label}${detail === undefined ? "" : `: ${detail}`}`);
  }
}

// Checks that `got` equals `want` (strict, or deep for arrays), printing both on failure.
function expectEqual(label, got, want) {
  const same = JSON.stringify(got) === JSON.stringify(want) && typeof got === typeof want;
  check(label, same, `got ${JSON.stringify(got)} (${typeof got}), want ${JSON.stringify(want)}`);
}

// Checks a PTTL read through the proxy: `expected` ms, less at most the time spent since
// `since` (performance.now() taken before the command that set the TTL) and a few ms for
// the masters' clocks.
function expectTtl(label, value, expected, since) {
  const spent = performance.now() - since;
  const low = expected - spent - 25;
  const ok = typeof value === "number" && value >= low && value <= expected + 5;
  check(label, ok, `got ${JSON.stringify(value)}, want ${Math.round(low)}..${expected} (${Math.round(spent)} ms since the command)`);
}

// Awaits `promise` and checks that it rejects with a message starting with `prefix`.
async function expectRejects(label, promise, prefix) {
  try {
    const got = await promise;
    check(label, false, `resolved with ${JSON.stringify(got)}, want an error starting ${JSON.stringify(prefix)}`);
  } catch (err) {
    const message = err && err.message ? err.message : String(err);
    check(label, message.startsWith(prefix), `error ${JSON.stringify(message)}, want one starting ${JSON.stringify(prefix)}`);
  }
}

function portFromArgs(usage) {
  const port = Number(process.argv[2]);
  if (!Number.isInteger(port) || port <= 0) {
    console.error(`usage: ${usage}`);
    process.exit(2);
  }
  return port;
}

// Runs `main`, reports, and exits 0 only when every check passed and nothing threw.
function run(main) {
  // A hung client must not hang the test: give up after a minute.
  const watchdog = setTimeout(() => {
    check("finished within 60 s", false);
    process.exit(1);
  }, 60_000);
  main()
    .catch((err) => check("ran without an exception", false, err && err.stack ? err.stack : String(err)))
    .finally(() => {
      clearTimeout(watchdog);
      console.log(failures.length ? `${failures.length} check(s) failed` : "all checks passed");
      process.exit(failures.length ? 1 : 0);
    });
}

// The installed version of a package (read from its package.json, which not every
// package exports).
function pkgVersion(name) {
  const file = require("node:path").join(__dirname, "node_modules", name, "package.json");
  return JSON.parse(require("node:fs").readFileSync(file, "utf8")).version;
}

// Two clients race for the same fresh lock, `rounds` times. Both may never get OK. When
// neither does (a master answered too late for either to reach a majority, which Redlock
// allows), both try again, as a client's retry loop would. The winner's token must be the
// lock's value, and its release must answer 1.
//   acquire(who, key, token) -> "OK" | null, get(key) -> value, release(who, key, token) -> int
async function race(label, rounds, { keyFor, acquire, get, release }) {
  const p = label ? `${label} ` : "";
  let wrong = 0;
  let retried = 0;
  for (let i = 0; i < rounds; i++) {
    const key = keyFor(i);
    let winner = null;
    let broken = false;
    for (let attempt = 1; winner === null && attempt <= 5; attempt++) {
      const [ra, rb] = await Promise.all([acquire("A", key, "tA"), acquire("B", key, "tB")]);
      if (![ra, rb].every((r) => r === "OK" || r === null) || (ra === "OK" && rb === "OK")) {
        check(`${p}race ${i}: at most one OK, the other null`, false, `A ${JSON.stringify(ra)}, B ${JSON.stringify(rb)}`);
        broken = true;
        break;
      }
      winner = ra === "OK" ? "A" : rb === "OK" ? "B" : null;
      if (winner === null) retried++;
    }
    if (broken || winner === null) {
      if (!broken) check(`${p}race ${i}: a winner within 5 attempts`, false);
      wrong++;
      continue;
    }
    const token = winner === "A" ? "tA" : "tB";
    const value = await get(key);
    const released = await release(winner, key, token);
    if (value !== token || released !== 1) {
      wrong++;
      check(`${p}race ${i}: the winner holds and releases it`, false, `winner ${winner}, GET ${JSON.stringify(value)}, release ${JSON.stringify(released)}`);
    }
  }
  if (retried) console.log(`info ${p}${retried} attempt(s) had no winner and were retried`);
  check(`${p}${rounds} races between two clients: never two OKs, one winner, who holds it and releases it (EVAL -> 1)`, wrong === 0);
}

const RELEASE =
  'if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end';

module.exports = { check, expectEqual, expectTtl, expectRejects, portFromArgs, pkgVersion, race, run, RELEASE };
