// A semaphore through redlock-proxy from ioredis, with `call`: three clients for two
// permits, the third refused and then handed a permit by a release while it waits (WAIT),
// SEM.INFO, extension and release.
//
// usage: node recipes_semaphore.js PORT
"use strict";

const crypto = require("node:crypto");
const { Redis } = require("ioredis");
const { check, expectEqual, expectRejects, portFromArgs, pkgVersion, run } = require("./checks");

const port = portFromArgs("node recipes_semaphore.js PORT");

function connect() {
  return new Redis({ host: "127.0.0.1", port, connectTimeout: 5000, maxRetriesPerRequest: 1, retryStrategy: () => null });
}

// SEM.INFO's flat RESP2 map as an object.
async function info(r, key) {
  const flat = await r.call("SEM.INFO", key);
  const fields = {};
  for (let i = 0; i < flat.length; i += 2) fields[flat[i]] = flat[i + 1];
  return fields;
}

run(async () => {
  console.log(`ioredis ${pkgVersion("ioredis")} against 127.0.0.1:${port}`);
  const [a, b, c] = [connect(), connect(), connect()];
  try {
    const key = `jobs:${crypto.randomUUID()}`;
    const [ta, tb, tc] = [crypto.randomUUID(), crypto.randomUUID(), crypto.randomUUID()];
    const first = await a.call("SEM.ACQUIRE", key, ta, 2, 10000);
    const second = await b.call("SEM.ACQUIRE", key, tb, 2, 10000);
    check("two permits of 2: [slot, fencing token] each",
      Array.isArray(first) && Array.isArray(second) && first[0] + second[0] === 1 && first[1] > 0 && second[1] > 0,
      JSON.stringify([first, second]));
    expectEqual("a third holder is refused with null", await c.call("SEM.ACQUIRE", key, tc, 2, 10000), null);
    await expectRejects("another count is refused while held", c.call("SEM.ACQUIRE", key, tc, 3, 10000),
      `ERR semaphore '${key}' is held with 2 permits, not 3`);
    const held = await info(a, key);
    check("SEM.INFO: 2 permits, 2 holders, no free slot",
      held.permits === 2 && held.holders === 2 && Array.isArray(held.free_slots) && held.free_slots.length === 0, JSON.stringify(held));

    // The third waits; a release hands it the freed slot.
    const waiting = c.call("SEM.ACQUIRE", key, tc, 2, 10000, "WAIT", 8000);
    const deadline = Date.now() + 5000;
    while ((await info(a, key)).waiting !== 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    const releasedAt = performance.now();
    expectEqual("SEM.RELEASE gives the permit back", await a.call("SEM.RELEASE", key, ta), 1);
    const got = await waiting;
    const after = performance.now() - releasedAt;
    check("the waiter gets the freed slot, with a higher token",
      Array.isArray(got) && got[0] === first[0] && got[1] > first[1], JSON.stringify(got));
    check("... within a second of the release", after < 1000, `${Math.round(after)} ms`);

    const validity = await b.call("SEM.EXTEND", key, tb, 20000);
    check("SEM.EXTEND answers the validity in ms", validity > 10000 && validity <= 20000, String(validity));
    expectEqual("a stranger's release answers 0", await a.call("SEM.RELEASE", key, crypto.randomUUID()), 0);
    expectEqual("holders release", [await b.call("SEM.RELEASE", key, tb), await c.call("SEM.RELEASE", key, tc)], [1, 1]);
    expectEqual("SEM.INFO: no holder", (await info(a, key)).holders, 0);
  } finally {
    a.disconnect();
    b.disconnect();
    c.disconnect();
  }
});
