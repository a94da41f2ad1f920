// The npm `redlock` package (v5) with the proxy as its single client (over ioredis).
// redlock runs its own multi-key scripts (EVALSHA, EVAL on NOSCRIPT) and counts a
// success only when the reply equals the number of keys; with one client, its quorum is
// that one client, so the proxy's combined reply is all it sees.
//
// usage: node node_redlock.js PORT
"use strict";

const { Redis } = require("ioredis");
const RedlockModule = require("redlock");
const { check, expectEqual, expectTtl, portFromArgs, pkgVersion, run } = require("./checks");

const Redlock = RedlockModule.default;
const { ExecutionError, ResourceLockedError } = RedlockModule;
const port = portFromArgs("node node_redlock.js PORT");

function connect() {
  return new Redis({
    host: "127.0.0.1",
    port,
    connectTimeout: 5000,
    commandTimeout: 5000,
    maxRetriesPerRequest: 1,
    retryStrategy: () => null,
  });
}

// Acquire that is expected to fail: returns the error, or null when it was acquired.
async function acquireError(redlock, resources, ttl) {
  try {
    const lock = await redlock.acquire(resources, ttl);
    return { lock };
  } catch (err) {
    return { err };
  }
}

// What the attempts of an ExecutionError say, for failure messages.
async function describeAttempts(err) {
  if (!(err instanceof ExecutionError)) return String(err && err.stack ? err.stack : err);
  const stats = await Promise.all(err.attempts);
  return JSON.stringify(
    stats.map((s) => ({ for: s.votesFor.size, against: [...s.votesAgainst.values()].map((e) => e.message) }))
  );
}

run(async () => {
  console.log(`redlock ${pkgVersion("redlock")} over ioredis ${pkgVersion("ioredis")} against 127.0.0.1:${port}`);
  const c1 = connect();
  const c2 = connect();
  const observer = connect();
  // Two independent Redlock instances, each with the proxy as its only client.
  const first = new Redlock([c1], { retryCount: 0 });
  const second = new Redlock([c2], { retryCount: 0 });
  const errors = [];
  first.on("error", (e) => errors.push(e));
  second.on("error", (e) => errors.push(e));
  try {
    const resource = "lock:redlock";
    await observer.del(resource);

    // acquire
    let lock;
    let since = performance.now();
    try {
      lock = await first.acquire([resource], 10_000);
      check("acquire([lock:redlock], 10000)", true);
    } catch (err) {
      check("acquire([lock:redlock], 10000)", false, await describeAttempts(err));
      return;
    }
    expectEqual("GET through the proxy is the lock's value", await observer.get(resource), lock.value);
    expectTtl("PTTL after acquire is 10000 less the time spent", await observer.pttl(resource), 10_000, since);
    check("lock.expiration is in the future", lock.expiration > Date.now(), `expiration ${lock.expiration}, now ${Date.now()}`);

    // a second acquire of the same resource fails (retryCount: 0)
    const refused = await acquireError(second, [resource], 10_000);
    check("second acquire of the same resource is refused with ExecutionError", refused.err instanceof ExecutionError, refused.lock ? "it was acquired" : String(refused.err));
    if (refused.err instanceof ExecutionError) {
      expectEqual("the refusal was one attempt", refused.err.attempts.length, 1);
      const [stats] = await Promise.all(refused.err.attempts);
      const reasons = [...stats.votesAgainst.values()];
      check(
        "the single client voted against with ResourceLockedError (script replied 0 of 1)",
        reasons.length === 1 && reasons[0] instanceof ResourceLockedError,
        reasons.map((e) => `${e.name}: ${e.message}`).join("; ")
      );
    }
    expectEqual("the holder's value is untouched by the refused attempt", await observer.get(resource), lock.value);

    // extend
    since = performance.now();
    const previousExpiration = lock.expiration;
    try {
      const extended = await lock.extend(20_000);
      check("extend(20000)", true);
      expectTtl("PTTL after extend(20000) is 20000 less the time spent", await observer.pttl(resource), 20_000, since);
      expectEqual("extend keeps the value", extended.value, lock.value);
      check(
        "the extended lock expires later than the first, within 20000 ms",
        extended.expiration > previousExpiration && extended.expiration <= Date.now() + 20_000,
        `expiration in ${extended.expiration - Date.now()} ms, the first's in ${previousExpiration - Date.now()} ms`
      );
      lock = extended;
    } catch (err) {
      check("extend(20000)", false, await describeAttempts(err));
    }

    // release
    try {
      await lock.release();
      check("release()", true);
    } catch (err) {
      check("release()", false, await describeAttempts(err));
    }
    expectEqual("GET after release -> null", await observer.get(resource), null);

    // acquire again succeeds, from the other instance
    const again = await acquireError(second, [resource], 10_000);
    check("acquire again after release succeeds", Boolean(again.lock), again.err ? await describeAttempts(again.err) : "");
    if (again.lock) {
      expectEqual("GET is the new lock's value", await observer.get(resource), again.lock.value);
      try {
        await again.lock.release();
        check("release() of the new lock", true);
      } catch (err) {
        check("release() of the new lock", false, await describeAttempts(err));
      }
    }

    // A multi-resource lock: the script replies #KEYS (2) only when it set both.
    const pair = ["lock:redlock:a", "lock:redlock:b"];
    await observer.del(...pair);
    const both = await acquireError(first, pair, 10_000);
    check("acquire([a, b]) (multi-key script replies 2)", Boolean(both.lock), both.err ? await describeAttempts(both.err) : "");
    const overlap = await acquireError(second, ["lock:redlock:b", "lock:redlock:c"], 10_000);
    check("acquire([b, c]) refused while b is held", overlap.err instanceof ExecutionError, overlap.lock ? "it was acquired" : String(overlap.err));
    expectEqual("c was not left behind by the refused multi-key attempt", await observer.exists("lock:redlock:c"), 0);
    if (both.lock) {
      await both.lock.release();
      expectEqual("both keys gone after release", await observer.exists(...pair), 0);
    }

    // After SCRIPT FLUSH the proxy answers redlock's EVALSHA with NOSCRIPT; redlock then
    // sends EVAL with the script's body.
    expectEqual("SCRIPT FLUSH -> OK", await observer.script("FLUSH"), "OK");
    const afterFlush = await acquireError(first, [resource], 10_000);
    check("acquire after SCRIPT FLUSH (NOSCRIPT -> EVAL)", Boolean(afterFlush.lock), afterFlush.err ? await describeAttempts(afterFlush.err) : "");
    if (afterFlush.lock) {
      expectEqual("GET is that lock's value", await observer.get(resource), afterFlush.lock.value);
      await observer.script("FLUSH");
      try {
        await afterFlush.lock.release();
        check("release() after another SCRIPT FLUSH", true);
      } catch (err) {
        check("release() after another SCRIPT FLUSH", false, await describeAttempts(err));
      }
      expectEqual("GET after that release -> null", await observer.get(resource), null);
    }

    // using(): acquire, run, release.
    let inside = null;
    await second.using([resource], 5_000, async () => {
      inside = await observer.get(resource);
    });
    check("using() held the lock while the routine ran", typeof inside === "string" && inside.length > 0, JSON.stringify(inside));
    expectEqual("using() released it afterwards", await observer.get(resource), null);

    const unexpected = errors.filter((e) => !(e instanceof ResourceLockedError));
    check("no error events other than ResourceLockedError", unexpected.length === 0, unexpected.map((e) => e.message).join("; "));
  } finally {
    c1.disconnect();
    c2.disconnect();
    observer.disconnect();
  }
});
