// A rollout in Node: old instances lock with ioredis `SET key token NX PX` on the legacy Redis
// directly, upgraded ones run the same code through the proxies; every holder enters a guarded
// resource that counts double holds (two holders of the key inside at once).
//
// usage: node migration_node.js LEGACY_PORT PROXY_PORT[,PROXY_PORT...] SECONDS
// Prints `result {json}` (acquisitions per client, double holds, errors) and exits 0: the test
// judges the figures.
"use strict";

const crypto = require("node:crypto");
const { Redis } = require("ioredis");

const [legacyPort, proxyPorts, seconds] = process.argv.slice(2);
const RELEASE = 'if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end';
const KEY = "lock:node";
const TTL_MS = 2000;

const counts = {};
const errors = {};
let inside = [];
let doubleHolds = 0;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function connect(port) {
  return new Redis({ host: "127.0.0.1", port: Number(port), maxRetriesPerRequest: 1, commandTimeout: 3000 });
}

async function worker(who, port, until) {
  const r = connect(port);
  while (Date.now() < until) {
    const token = crypto.randomBytes(16).toString("hex");
    try {
      if ((await r.set(KEY, token, "PX", TTL_MS, "NX")) !== "OK") {
        await sleep(2);
        continue;
      }
      if (inside.length > 0) doubleHolds++;
      inside.push(who);
      counts[who] = (counts[who] || 0) + 1;
      await sleep(2);
      inside = inside.filter((w) => w !== who);
      await r.eval(RELEASE, 1, KEY, token);
    } catch (e) {
      errors[who] = String(e).slice(0, 160);
      await sleep(10);
    }
  }
  r.disconnect();
}

(async () => {
  const until = Date.now() + Number(seconds) * 1000;
  const workers = [worker("old-1", legacyPort, until), worker("old-2", legacyPort, until)];
  proxyPorts.split(",").forEach((port, i) => workers.push(worker(`new-${i}`, port, until)));
  await Promise.all(workers);
  console.log("result " + JSON.stringify({ counts, doubleHolds, errors }));
})();
