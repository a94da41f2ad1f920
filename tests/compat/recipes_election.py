"""Leader election through redlock-proxy from redis-py, with `execute_command` only.

usage: recipes_election.py PORT

A candidate campaigns with `ELECT.CAMPAIGN election value ttl_ms [WAIT ms]` and leads while its
connection stays open (the proxy keeps the leadership alive); `ELECT.LEADER` shows the leader's
[value, term] to anyone; `ELECT.RESIGN` hands it to the next campaigner in line. An observer on
RESP3 (redis-py 8's default protocol) sends `ELECT.OBSERVE election` on a connection of its own
and reads the pushes `["leader", election, value, term]` with `read_response(push_request=True)`;
a RESP2 observer long-polls with `ELECT.OBSERVE election AFTER term TIMEOUT ms`. Prints one line
per check and exits 1 when any check failed.
"""

import sys
import threading
import time

import redis

from checks import check, failures

HOST = "127.0.0.1"
ELECTION = "compat:election:py"


def client(port, protocol=None):
    kwargs = {"host": HOST, "port": port, "socket_timeout": 10, "decode_responses": True}
    if protocol is not None:
        kwargs["protocol"] = protocol
    return redis.Redis(**kwargs)


def main(port):
    print(f"redis-py {redis.__version__} against {HOST}:{port}", flush=True)
    a, b, reader = client(port), client(port), client(port, protocol=2)

    # A RESP3 observer: its own connection, the reply first, then pushes.
    observer = client(port).connection_pool.get_connection()
    observer.send_command("ELECT.OBSERVE", ELECTION)
    check("OBSERVE answers the current leader (none yet)", observer.read_response() is None)

    term_a = a.execute_command("ELECT.CAMPAIGN", ELECTION, "10.0.0.1:8080", 5000)
    check("A campaigns and leads: a term", isinstance(term_a, int) and term_a > 0, repr(term_a))
    check("ELECT.LEADER shows A's value and term",
          reader.execute_command("ELECT.LEADER", ELECTION) == ["10.0.0.1:8080", term_a])
    push = observer.read_response(push_request=True)
    check("the observer is pushed A", push == ["leader", ELECTION, "10.0.0.1:8080", term_a], repr(push))
    check("B is refused while A leads (no WAIT)",
          b.execute_command("ELECT.CAMPAIGN", ELECTION, "10.0.0.2:8080", 5000) is None)

    # B waits in line; a RESP2 observer long-polls for a change after A's term.
    got = {}

    def campaign_b():
        got["term"] = b.execute_command("ELECT.CAMPAIGN", ELECTION, "10.0.0.2:8080", 5000, "WAIT", 10000)
        got["at"] = time.monotonic()

    def poll():
        got["poll"] = client(port, protocol=2).execute_command(
            "ELECT.OBSERVE", ELECTION, "AFTER", term_a, "TIMEOUT", 10000)

    waiting, polling = threading.Thread(target=campaign_b), threading.Thread(target=poll)
    waiting.start()
    polling.start()
    time.sleep(0.2)
    resigned = time.monotonic()
    check("A resigns", a.execute_command("ELECT.RESIGN", ELECTION, "10.0.0.1:8080") == 1)
    waiting.join()
    polling.join()
    term_b = got["term"]
    check("B leads at once with a higher term",
          isinstance(term_b, int) and term_b > term_a and got["at"] - resigned < 1.0, repr(got))
    check("the long poll answers the change", got["poll"] in (None, ["10.0.0.2:8080", term_b]), repr(got["poll"]))
    push = observer.read_response(push_request=True)
    if push == ["leader", ELECTION, None, None]:
        push = observer.read_response(push_request=True)
    check("the observer is pushed B", push == ["leader", ELECTION, "10.0.0.2:8080", term_b], repr(push))

    # B's client goes away: the leadership ends with its connection.
    b.close()
    push = observer.read_response(push_request=True)
    check("B's disconnection is pushed as no leader", push == ["leader", ELECTION, None, None], repr(push))
    check("ELECT.LEADER shows nobody", reader.execute_command("ELECT.LEADER", ELECTION) is None)
    check("a RESP2 OBSERVE without AFTER is told to long-poll",
          "AFTER" in str(_error(lambda: reader.execute_command("ELECT.OBSERVE", ELECTION))))
    observer.send_command("ELECT.UNOBSERVE", ELECTION)
    check("UNOBSERVE", observer.read_response() == 1)
    observer.disconnect()


def _error(f):
    try:
        f()
    except redis.ResponseError as e:
        return e
    return None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: recipes_election.py PORT")
    main(int(sys.argv[1]))
    sys.exit(1 if failures else 0)
