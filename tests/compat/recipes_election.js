// Leader election through redlock-proxy from ioredis, with `call` only.
//
// A candidate campaigns with `ELECT.CAMPAIGN election value ttl_ms [WAIT ms]` and leads while
// its connection stays open; `ELECT.LEADER` shows [value, term] to anyone; `ELECT.RESIGN` hands
// the leadership to the next campaigner in line. ioredis drops RESP3 push frames it does not know
// (it handles pub/sub pushes only), so an observer long-polls: `ELECT.OBSERVE election AFTER term
// TIMEOUT ms` answers once the leader's term differs from `term` (0: no leader).
//
// usage: node recipes_election.js PORT
"use strict";

const { Redis } = require("ioredis");
const { check, expectEqual, portFromArgs, pkgVersion, run } = require("./checks");

const port = portFromArgs("node recipes_election.js PORT");
const election = "compat:election:js";

function connect(name) {
  return new Redis({
    host: "127.0.0.1",
    port,
    connectionName: name,
    connectTimeout: 5000,
    maxRetriesPerRequest: 1,
    retryStrategy: () => null,
  });
}

run(async () => {
  console.log(`ioredis ${pkgVersion("ioredis")} against 127.0.0.1:${port}`);
  const a = connect("candidate-a");
  const b = connect("candidate-b");
  const observer = connect("observer");
  const reader = connect("reader");
  try {
    expectEqual("nobody leads yet", await reader.call("ELECT.LEADER", election), null);
    const termA = await a.call("ELECT.CAMPAIGN", election, "10.0.0.1:8080", 5000);
    check("A campaigns and leads: a term", Number.isInteger(termA) && termA > 0, JSON.stringify(termA));
    expectEqual("ELECT.LEADER shows A", await reader.call("ELECT.LEADER", election), ["10.0.0.1:8080", termA]);
    expectEqual("a long poll after term 0 answers A at once",
      await observer.call("ELECT.OBSERVE", election, "AFTER", 0, "TIMEOUT", 10000), ["10.0.0.1:8080", termA]);
    expectEqual("B is refused while A leads", await b.call("ELECT.CAMPAIGN", election, "10.0.0.2:8080", 5000), null);

    // B waits in line, the observer long-polls after A's term; A resigns.
    const waiting = b.call("ELECT.CAMPAIGN", election, "10.0.0.2:8080", 5000, "WAIT", 10000).then((term) => ({ term, at: performance.now() }));
    const polled = observer.call("ELECT.OBSERVE", election, "AFTER", termA, "TIMEOUT", 10000);
    await new Promise((resolve) => setTimeout(resolve, 200));
    const resigned = performance.now();
    expectEqual("A resigns", await a.call("ELECT.RESIGN", election, "10.0.0.1:8080"), 1);
    const { term: termB, at } = await waiting;
    check("B leads at once with a higher term", Number.isInteger(termB) && termB > termA && at - resigned < 1000,
      JSON.stringify({ termB, ms: at - resigned }));
    const change = await polled;
    check("the long poll answers the change", change === null || JSON.stringify(change) === JSON.stringify(["10.0.0.2:8080", termB]),
      JSON.stringify(change));

    // B's client goes away: its leadership ends with its connection, and a poll says so.
    b.disconnect();
    let seen = await observer.call("ELECT.OBSERVE", election, "AFTER", termB, "TIMEOUT", 10000);
    expectEqual("B's disconnection ends its leadership", seen, null);
    expectEqual("ELECT.LEADER shows nobody", await reader.call("ELECT.LEADER", election), null);
  } finally {
    for (const c of [a, b, observer, reader]) c.disconnect();
  }
});
