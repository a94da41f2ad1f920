// A read-write lock through redlock-proxy from ioredis, with `call`: readers share, a writer
// is refused while they hold and granted once they release, fencing tokens rise across read
// and write grants, a reader asking to write gets an error (no upgrade), EXTEND, INFO, a
// writer waiting (WAIT) handed the lock by a release, a KEEPALIVE hold outliving its TTL.
//
// usage: node recipes_rwlock.js PORT
"use strict";

const { Redis } = require("ioredis");
const { check, expectEqual, expectRejects, portFromArgs, pkgVersion, run } = require("./checks");

const port = portFromArgs("node recipes_rwlock.js PORT");

function connect(name) {
  return new Redis({
    host: "127.0.0.1",
    port,
    connectionName: name,
    connectTimeout: 5000,
    commandTimeout: 10000,
    maxRetriesPerRequest: 1,
    retryStrategy: () => null,
  });
}

// RWLOCK.INFO's flat list (RESP2) as an object.
async function info(client, key) {
  const flat = await client.call("RWLOCK.INFO", key);
  const out = {};
  for (let i = 0; i < flat.length; i += 2) out[flat[i]] = flat[i + 1];
  return out;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

run(async () => {
  console.log(`ioredis ${pkgVersion("ioredis")} against 127.0.0.1:${port}`);
  const a = connect("rw-a");
  const b = connect("rw-b");
  const w = connect("rw-writer");
  try {
    const key = "doc:ioredis";
    const t1 = await a.call("RWLOCK.READ", key, "r1", 10000);
    const t2 = await b.call("RWLOCK.READ", key, "r2", 10000);
    check("RWLOCK.READ r1, r2 -> fencing tokens, rising", typeof t1 === "number" && t2 > t1, `${t1} ${t2}`);
    expectEqual("RWLOCK.INFO readers", (await info(a, key)).readers.sort(), ["r1", "r2"]);
    expectEqual("RWLOCK.WRITE while readers hold -> null", await w.call("RWLOCK.WRITE", key, "w1", 10000), null);
    await expectRejects("a reader asking to write is refused", a.call("RWLOCK.WRITE", key, "r1", 10000), "ERR this token already holds a read lock");
    const extended = await a.call("RWLOCK.EXTEND", key, "r1", 10000);
    check("RWLOCK.EXTEND -> validity in ms", extended > 9000 && extended <= 10000, String(extended));

    // A writer waiting is handed the lock by the last reader's release.
    const waiting = w.call("RWLOCK.WRITE", key, "w1", 10000, "WAIT", 5000);
    for (let i = 0; i < 500 && (await info(a, key)).writer_waiting !== 1; i++) await sleep(10);
    expectEqual("RWLOCK.INFO writer_waiting", (await info(a, key)).writer_waiting, 1);
    expectEqual("a new reader waits behind the writer -> null", await b.call("RWLOCK.READ", key, "r3", 10000), null);
    expectEqual("RWLOCK.RELEASE r1 -> 1", await a.call("RWLOCK.RELEASE", key, "r1"), 1);
    expectEqual("RWLOCK.RELEASE r2 -> 1", await b.call("RWLOCK.RELEASE", key, "r2"), 1);
    const tw = await waiting;
    check("the waiting writer got the lock, above the readers' tokens", typeof tw === "number" && tw > t2, String(tw));
    expectEqual("RWLOCK.INFO writer", (await info(a, key)).writer, "w1");
    expectEqual("RWLOCK.READ while the writer holds -> null", await a.call("RWLOCK.READ", key, "r4", 10000), null);
    expectEqual("RWLOCK.RELEASE w1 -> 1", await w.call("RWLOCK.RELEASE", key, "w1"), 1);

    // KEEPALIVE: the hold outlives its TTL while the connection is open.
    const kept = await a.call("RWLOCK.WRITE", key, "k", 600, "KEEPALIVE");
    check("RWLOCK.WRITE KEEPALIVE -> a token", typeof kept === "number", String(kept));
    await sleep(1000);
    expectEqual("the KEEPALIVE writer still holds after its TTL", (await info(b, key)).writer, "k");
    expectEqual("RWLOCK.RELEASE k -> 1", await a.call("RWLOCK.RELEASE", key, "k"), 1);
  } finally {
    a.disconnect();
    b.disconnect();
    w.disconnect();
  }
});
