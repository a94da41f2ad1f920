// Reentrant locks through ioredis' `call`, against redlock-proxy: a holder takes its lock
// again with REENTRANT and gives each hold back with LOCK.RELEASE; another client is
// refused until the last.
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
  } finally {
    a.disconnect();
    b.disconnect();
  }
});
