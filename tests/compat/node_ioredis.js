// ioredis against redlock-proxy: SET NX PX to lock, the canonical compare-and-delete
// script to release (EVAL, EVALSHA after SCRIPT LOAD, and ioredis' defineCommand),
// contention between two client instances.
//
// usage: node node_ioredis.js PORT
"use strict";

const crypto = require("node:crypto");
const { Redis } = require("ioredis");
const { check, expectEqual, expectTtl, expectRejects, portFromArgs, pkgVersion, race, run, RELEASE } = require("./checks");

const port = portFromArgs("node node_ioredis.js PORT");

function connect(name) {
  return new Redis({
    host: "127.0.0.1",
    port,
    connectionName: name, // sent as CLIENT SETNAME on connect
    connectTimeout: 5000,
    commandTimeout: 5000,
    maxRetriesPerRequest: 1,
    retryStrategy: () => null, // fail, don't reconnect forever
  });
}

run(async () => {
  console.log(`ioredis ${pkgVersion("ioredis")} against 127.0.0.1:${port}`);
  const a = connect("compat-a");
  const b = connect("compat-b");
  try {
    // ioredis' ready check (INFO) must pass before commands go out.
    expectEqual("client A PING", await a.ping(), "PONG");
    expectEqual("client B PING", await b.ping(), "PONG");
    expectEqual("client A status ready", a.status, "ready");
    expectEqual("CLIENT GETNAME is the connectionName", await a.client("GETNAME"), "compat-a");

    const key = "lock:ioredis";
    await a.del(key);

    // Acquire and contend, exactly as `SET key token NX PX ms`.
    let since = performance.now();
    expectEqual("A: SET lock tA NX PX 10000 -> OK", await a.set(key, "tA", "NX", "PX", 10000), "OK");
    expectEqual("B: SET lock tB NX PX 10000 -> null (held)", await b.set(key, "tB", "NX", "PX", 10000), null);
    expectEqual("B: GET lock -> tA", await b.get(key), "tA");
    expectTtl("B: PTTL lock is 10000 less the time spent", await b.pttl(key), 10000, since);
    expectEqual("B: EXISTS lock -> 1", await b.exists(key), 1);

    // Release with EVAL: a non-owner gets 0, the owner 1.
    expectEqual("B: EVAL release with tB -> 0", await b.eval(RELEASE, 1, key, "tB"), 0);
    expectEqual("lock still tA after the non-owner's release", await a.get(key), "tA");
    expectEqual("A: EVAL release with tA -> 1", await a.eval(RELEASE, 1, key, "tA"), 1);
    expectEqual("GET lock -> null after release", await a.get(key), null);
    expectEqual("PTTL lock -> -2 after release", await a.pttl(key), -2);
    expectEqual("A: EVAL release again -> 0", await a.eval(RELEASE, 1, key, "tA"), 0);
    expectEqual("B: SET lock tB NX PX 10000 -> OK after release", await b.set(key, "tB", "NX", "PX", 10000), "OK");

    // EVALSHA after SCRIPT LOAD.
    const sha = crypto.createHash("sha1").update(RELEASE).digest("hex");
    expectEqual("SCRIPT LOAD -> the script's SHA1", await a.script("LOAD", RELEASE), sha);
    expectEqual("SCRIPT EXISTS sha -> [1]", await b.script("EXISTS", sha), [1]);
    expectEqual("A: EVALSHA release with tA -> 0 (B holds it)", await a.evalsha(sha, 1, key, "tA"), 0);
    expectEqual("lock still tB", await a.get(key), "tB");
    expectEqual("B: EVALSHA release with tB -> 1", await b.evalsha(sha, 1, key, "tB"), 1);
    expectEqual("GET lock -> null after EVALSHA release", await b.get(key), null);
    await expectRejects(
      "EVALSHA of an unknown SHA1 -> NOSCRIPT",
      a.evalsha("ffffffffffffffffffffffffffffffffffffffff", 1, key, "tA"),
      "NOSCRIPT No matching script. Please use EVAL."
    );

    // ioredis' own script helper: EVALSHA, falling back to EVAL on NOSCRIPT.
    const ACQUIRE_OR_PTTL =
      'if redis.call("set",KEYS[1],ARGV[1],"NX","PX",ARGV[2]) then return 0 else return redis.call("pttl",KEYS[1]) end';
    for (const c of [a, b]) {
      c.defineCommand("releaseLock", { numberOfKeys: 1, lua: RELEASE });
      c.defineCommand("acquireOrPttl", { numberOfKeys: 1, lua: ACQUIRE_OR_PTTL });
    }
    since = performance.now();
    expectEqual("A: defineCommand acquireOrPttl -> 0 (acquired)", await a.acquireOrPttl(key, "tA", 8000), 0);
    expectTtl("B: defineCommand acquireOrPttl -> holder's PTTL", await b.acquireOrPttl(key, "tB", 8000), 8000, since);
    expectEqual("B: defineCommand releaseLock with tB -> 0", await b.releaseLock(key, "tB"), 0);
    expectEqual("A: defineCommand releaseLock with tA -> 1", await a.releaseLock(key, "tA"), 1);

    // Pipelined: acquire, read back, release in one write.
    const piped = await a
      .pipeline()
      .set(key, "tP", "NX", "PX", 5000)
      .get(key)
      .set(key, "tQ", "NX", "PX", 5000)
      .eval(RELEASE, 1, key, "tP")
      .exists(key)
      .exec();
    expectEqual(
      "pipeline [SET NX, GET, SET NX, EVAL release, EXISTS] replies",
      piped.map(([err, value]) => (err ? `error: ${err.message}` : value)),
      ["OK", "tP", null, 1, 0]
    );

    // The proxy's own waiting and session locks, through ioredis's generic call.
    const held = await a.call("LOCK.ACQUIRE", key, "w-holder", 10000, "KEEPALIVE");
    expectEqual("LOCK.ACQUIRE ... KEEPALIVE -> a fencing token", typeof held, "number");
    expectEqual("LOCK.ACQUIRE ... WAIT 200 while held -> null", await b.call("LOCK.ACQUIRE", key, "w-waiter", 10000, "WAIT", 200), null);
    // B waits while A releases: B gets the lock as soon as it is free.
    const waiting = b.call("LOCK.ACQUIRE", key, "w-waiter", 10000, "WAIT", 5000);
    expectEqual("LOCK.RELEASE of the session lock -> 1", await a.call("LOCK.RELEASE", key, "w-holder"), 1);
    const got = await waiting;
    expectEqual("the waiter gets a higher token", typeof got === "number" && got > held, true);
    expectEqual("LOCK.RELEASE by the waiter -> 1", await b.call("LOCK.RELEASE", key, "w-waiter"), 1);

    // Both clients race for the same fresh lock: never both win.
    const clients = { A: a, B: b };
    await race("", 20, {
      keyFor: (i) => `lock:ioredis:race:${i}`,
      acquire: (who, k, token) => clients[who].set(k, token, "NX", "PX", 10000),
      get: (k) => a.get(k),
      release: (who, k, token) => clients[who].eval(RELEASE, 1, k, token),
    });
  } finally {
    a.disconnect();
    b.disconnect();
  }
});
