// node-redis (the `redis` package, v5 API) against redlock-proxy, over RESP2 and over
// RESP3 (`RESP: 3`, which sends HELLO 3): SET NX PX to lock, EVAL to release, the
// client's own script helper (EVALSHA with an EVAL fallback), contention between two
// client instances.
//
// usage: node node_redis.js PORT
"use strict";

const { createClient, defineScript } = require("redis");
const { check, expectEqual, expectTtl, expectRejects, portFromArgs, pkgVersion, race, run, RELEASE } = require("./checks");

const port = portFromArgs("node node_redis.js PORT");

const releaseLock = defineScript({
  SCRIPT: RELEASE,
  NUMBER_OF_KEYS: 1,
  parseCommand(parser, key, token) {
    parser.pushKey(key);
    parser.push(token);
  },
  transformReply(reply) {
    return reply;
  },
});

async function connect(resp, name) {
  const client = createClient({
    RESP: resp,
    name, // sent as CLIENT SETNAME on connect
    socket: { host: "127.0.0.1", port, connectTimeout: 5000, reconnectStrategy: false },
    scripts: { releaseLock },
  });
  client.on("error", (err) => check(`[RESP${resp}] ${name}: no client error event`, false, err.message));
  await client.connect();
  return client;
}

async function checks(resp) {
  const p = `[RESP${resp}]`;
  const a = await connect(resp, "compat-a");
  const b = await connect(resp, "compat-b");
  try {
    expectEqual(`${p} A PING`, await a.ping(), "PONG");
    expectEqual(`${p} CLIENT GETNAME is the configured name`, await a.clientGetName(), "compat-a");
    const info = String(await a.sendCommand(["CLIENT", "INFO"]));
    check(`${p} CLIENT INFO shows resp=${resp}`, info.includes(` resp=${resp}`), JSON.stringify(info));

    const key = `lock:node-redis:${resp}`;
    await a.del(key);

    // Acquire in the exact form `SET key token NX PX ms`, then in node-redis' own option form
    // (which it sends as `SET key token PX ms NX`).
    let since = performance.now();
    expectEqual(`${p} A: SET lock tA NX PX 10000 -> OK`, await a.sendCommand(["SET", key, "tA", "NX", "PX", "10000"]), "OK");
    expectEqual(
      `${p} B: set(lock, tB, {condition: NX, expiration: PX 10000}) -> null (held)`,
      await b.set(key, "tB", { condition: "NX", expiration: { type: "PX", value: 10000 } }),
      null
    );
    expectEqual(`${p} B: SET lock tB NX PX 10000 -> null (held)`, await b.sendCommand(["SET", key, "tB", "NX", "PX", "10000"]), null);
    expectEqual(`${p} B: GET lock -> tA`, await b.get(key), "tA");
    expectTtl(`${p} B: PTTL lock is 10000 less the time spent`, await b.pTTL(key), 10000, since);

    // Release with EVAL.
    expectEqual(`${p} B: EVAL release with tB -> 0`, await b.eval(RELEASE, { keys: [key], arguments: ["tB"] }), 0);
    expectEqual(`${p} lock still tA`, await a.get(key), "tA");
    expectEqual(`${p} A: EVAL release with tA -> 1`, await a.eval(RELEASE, { keys: [key], arguments: ["tA"] }), 1);
    expectEqual(`${p} GET lock -> null after release`, await a.get(key), null);
    expectEqual(`${p} PTTL lock -> -2 after release`, await a.pTTL(key), -2);

    // After release the other client gets it, in node-redis' option form.
    since = performance.now();
    expectEqual(
      `${p} B: set(lock, tB, {NX, PX 10000}) -> OK after release`,
      await b.set(key, "tB", { condition: "NX", expiration: { type: "PX", value: 10000 } }),
      "OK"
    );
    expectTtl(`${p} A: PTTL lock is 10000 less the time spent`, await a.pTTL(key), 10000, since);

    // The client's script helper: EVALSHA, and EVAL when the proxy answers NOSCRIPT.
    expectEqual(`${p} A: scripts.releaseLock with tA -> 0 (B holds it)`, await a.releaseLock(key, "tA"), 0);
    expectEqual(`${p} B: scripts.releaseLock with tB -> 1`, await b.releaseLock(key, "tB"), 1);
    expectEqual(`${p} EXISTS lock -> 0 after release`, await b.exists(key), 0);
    await expectRejects(
      `${p} EVALSHA of an unknown SHA1 -> NOSCRIPT`,
      a.evalSha("0000000000000000000000000000000000000000", { keys: [key], arguments: ["tA"] }),
      "NOSCRIPT No matching script. Please use EVAL."
    );

    // A command the proxy does not implement is refused, and the connection stays usable.
    await expectRejects(`${p} unknown command -> ERR unknown command`, a.sendCommand(["LPUSH", "list", "x"]), "ERR unknown command");
    expectEqual(`${p} connection still usable after an error`, await a.ping(), "PONG");

    // Both clients race for the same fresh lock: never both win.
    const clients = { A: a, B: b };
    await race(p, 20, {
      keyFor: (i) => `lock:node-redis:${resp}:race:${i}`,
      acquire: (who, k, token) => clients[who].sendCommand(["SET", k, token, "NX", "PX", "10000"]),
      get: (k) => a.get(k),
      release: (who, k, token) => clients[who].eval(RELEASE, { keys: [k], arguments: [token] }),
    });
  } finally {
    await Promise.allSettled([a.close(), b.close()]);
  }
}

run(async () => {
  console.log(`node-redis ${pkgVersion("redis")} against 127.0.0.1:${port}`);
  for (const resp of [2, 3]) {
    try {
      await checks(resp);
    } catch (err) {
      check(`[RESP${resp}] ran without an exception`, false, err && err.stack ? err.stack : String(err));
    }
  }
});
