// Reentrant locks and several locks at once through ioredis' `call`, against redlock-proxy:
// a holder takes its lock again with REENTRANT and gives each hold back with LOCK.RELEASE;
// another client is refused until the last. A set of locks is taken with LOCK.ACQUIREALL (a
// token per key), an overlapping set is refused whole, and LOCK.RELEASEALL frees them.
//
// usage: node recipes_locks.js PORT
"use strict";

const crypto = require("node:crypto");
const { Redis } = require("ioredis");
const { check, expectEqual, portFromArgs, run } = require("./checks");

const port = portFromArgs("node recipes_locks.js PORT");

function connect() {
  return new Redis({ host: "127.0.0.1", port, commandTimeout: 5000, maxRetriesPerRequest: 1, retryStrategy: () => null });
}

// Several locks at once: all or none.
async function several(a, b) {
  const base = `recipes:${crypto.randomUUID()}`;
  const [me, you] = [crypto.randomUUID(), crypto.randomUUID()];
  const [x, y, z] = [`${base}:x`, `${base}:y`, `${base}:z`];
  const tokens = await a.call("LOCK.ACQUIREALL", me, 10000, 2, x, y);
  check(
    "a set is taken with a fencing token per key",
    Array.isArray(tokens) && tokens.length === 2 && tokens.every(Number.isInteger),
    String(tokens),
  );
  expectEqual("an overlapping set is refused whole", await b.call("LOCK.ACQUIREALL", you, 10000, 2, y, z), null);
  check("nothing of it was taken", (await b.call("LOCK.ACQUIRE", z, you, 10000)) !== null);
  await b.call("LOCK.RELEASE", z, you);
  expectEqual("a key of the set is a lock of its own", await b.call("LOCK.ACQUIRE", x, you, 10000), null);
  expectEqual("both released", await a.call("LOCK.RELEASEALL", me, 2, x, y), 2);
  const again = await b.call("LOCK.ACQUIREALL", you, 10000, 2, y, z);
  check("the overlapping set is free now", Array.isArray(again) && again[0] > tokens[1], String(again));
  await b.call("LOCK.RELEASEALL", you, 2, y, z);
}

run(async () => {
  const a = connect();
  const b = connect();
  try {
    const key = `recipes:${crypto.randomUUID()}`;
    const [me, you] = [crypto.randomUUID(), crypto.randomUUID()];
    const token = await a.call("LOCK.ACQUIRE", key, me, 10000, "REENTRANT");
    check("a reentrant lock is taken with a fencing token", Number.isInteger(token), String(token));
    expectEqual("taken again, the same fencing token", await a.call("LOCK.ACQUIRE", key, me, 10000, "REENTRANT"), token);
    const info = await a.call("LOCK.INFO", key);
    expectEqual("LOCK.INFO shows two holds", info[info.indexOf("holds") + 1], 2);
    expectEqual("another token is refused", await b.call("LOCK.ACQUIRE", key, you, 10000), null);
    expectEqual("one hold given back", await a.call("LOCK.RELEASE", key, me), 1);
    expectEqual("still held after one", await b.call("LOCK.ACQUIRE", key, you, 10000), null);
    expectEqual("the last hold given back", await a.call("LOCK.RELEASE", key, me), 1);
    const taken = await b.call("LOCK.ACQUIRE", key, you, 10000);
    check("free after the last hold", Number.isInteger(taken) && taken > token, String(taken));
    await b.call("LOCK.RELEASE", key, you);
    await several(a, b);
  } finally {
    a.disconnect();
    b.disconnect();
  }
});
