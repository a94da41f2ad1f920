#!/usr/bin/env python3
"""Tables, targets and plots for benches/harness.sh (standard library only).

usage: report.py OUT            reads OUT/raw, prints the tables, writes OUT/report.md,
                                OUT/throughput_p99_vs_n.svg and OUT/cycle_latency.svg
       report.py --line KIND FILE   one log line for a raw result (KIND: cycle, node, paused)
"""
import csv
import glob
import json
import math
import os
import statistics
import sys

NS = [1, 3, 5, 7]


def load(path):
    with open(path) as f:
        return json.load(f)


def rb_row(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    head, row = rows[0], rows[-1]
    d = dict(zip(head, row))
    return {
        "rps": float(d["rps"]),
        "p50": float(d["p50_latency_ms"]),
        "p99": float(d["p99_latency_ms"]),
        "avg": float(d["avg_latency_ms"]),
    }


def line(kind, path):
    d = load(path)
    if kind == "cycle":
        c = d["cycle"]
        return f"{d['locks_per_s']:.0f} locks/s, cycle p50 {c['p50_ms']} p99 {c['p99_ms']} ms, errors {d['errors']}"
    if kind == "node":
        c = d["cycle"]
        return f"{d['locks_per_s']:.0f} locks/s, cycle p50 {c['p50_ms']} p99 {c['p99_ms']} ms"
    if kind == "paused":
        a = d["acquire"]
        return (f"acquire p50 {a['p50_ms']} p99 {a['p99_ms']} max {a['max_ms']} ms, "
                f"{d['locks_per_s']:.0f} locks/s, errors {d['errors']}")
    raise SystemExit(f"unknown kind {kind}")


def fmt(v, digits=2):
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "-"
    return f"{v:.{digits}f}"


def table(headers, rows, align=None):
    """A GitHub markdown table (also readable as plain text)."""
    align = align or ["l"] + ["r"] * (len(headers) - 1)
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    def fmt_row(r):
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)) + " |"
    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2)) for w, a in zip(widths, align)) + "|"
    return "\n".join([fmt_row(headers), sep] + [fmt_row(r) for r in cells])


# ------------------------------------------------------------------------------------------
# SVG line charts


def nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw), default=10 * mag)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while True:
        ticks.append(round(v, 10))
        if v >= hi - step * 1e-9:
            return ticks
        v += step


def tick_label(v):
    if abs(v) >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel(x0, y0, w, h, title, xlabel, ylabel, series, xticks, xlog=False, xtick_labels=None, ymin=0.0):
    """series: dicts with name, color, dash (bool), points [(x, y)] or hline y."""
    ys = [p[1] for s in series for p in s.get("points", [])] + [s["hline"] for s in series if "hline" in s]
    ymax = max(ys) * 1.1 if ys else 1
    yt = nice_ticks(ymin, ymax)
    ymax = yt[-1]
    tx = (lambda v: math.log10(v)) if xlog else (lambda v: v)
    xmin, xmax = tx(xticks[0]), tx(xticks[-1])
    left, right, top, bottom = 64, 30, 34, 46
    pw, ph = w - left - right, h - top - bottom
    def X(v):
        return x0 + left + (tx(v) - xmin) / (xmax - xmin) * pw
    def Y(v):
        return y0 + top + ph - (v - ymin) / (ymax - ymin) * ph
    out = [f'<text x="{x0 + w / 2}" y="{y0 + 20}" text-anchor="middle" font-size="15" font-weight="bold">{esc(title)}</text>']
    out.append(f'<rect x="{x0 + left}" y="{y0 + top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    for v in yt:
        out.append(f'<line x1="{x0 + left}" x2="{x0 + left + pw}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 + left - 6}" y="{Y(v) + 4:.1f}" text-anchor="end" font-size="12">{tick_label(v)}</text>')
    for i, v in enumerate(xticks):
        label = xtick_labels[i] if xtick_labels else tick_label(v)
        out.append(f'<line x1="{X(v):.1f}" x2="{X(v):.1f}" y1="{y0 + top}" y2="{y0 + top + ph}" stroke="#eee"/>')
        out.append(f'<text x="{X(v):.1f}" y="{y0 + top + ph + 16}" text-anchor="middle" font-size="12">{esc(label)}</text>')
    out.append(f'<text x="{x0 + left + pw / 2}" y="{y0 + h - 8}" text-anchor="middle" font-size="13">{esc(xlabel)}</text>')
    out.append(f'<text transform="translate({x0 + 16},{y0 + top + ph / 2}) rotate(-90)" text-anchor="middle" font-size="13">{esc(ylabel)}</text>')
    for s in series:
        dash = ' stroke-dasharray="6,4"' if s.get("dash") else ""
        if "hline" in s:
            y = Y(s["hline"])
            out.append(f'<line x1="{x0 + left}" x2="{x0 + left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="{s["color"]}" stroke-width="2"{dash}/>')
            continue
        pts = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in s["points"])
        out.append(f'<polyline points="{pts}" fill="none" stroke="{s["color"]}" stroke-width="2"{dash}/>')
        if s.get("markers", True):
            for x, y in s["points"]:
                out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3.5" fill="{s["color"]}"/>')
    return out


def legend(x, y, series, cols=3, colw=260):
    out = []
    for i, s in enumerate(series):
        cx, cy = x + (i % cols) * colw, y + (i // cols) * 18
        dash = ' stroke-dasharray="6,4"' if s.get("dash") else ""
        out.append(f'<line x1="{cx}" x2="{cx + 26}" y1="{cy}" y2="{cy}" stroke="{s["color"]}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{cx + 32}" y="{cy + 4}" font-size="12">{esc(s["name"])}</text>')
    return out


def svg(width, height, parts, caption):
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">')
    bg = f'<rect width="{width}" height="{height}" fill="white"/>'
    cap = f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle" font-size="11" fill="#555">{esc(caption)}</text>'
    return "\n".join([head, bg] + parts + [cap, "</svg>"]) + "\n"


# ------------------------------------------------------------------------------------------


def main(out):
    raw = os.path.join(out, "raw")
    meta = load(os.path.join(raw, "meta.json"))
    md = []
    text = []

    # 1. redis-benchmark, median over rounds
    rb = {}
    for path in glob.glob(os.path.join(raw, "rb", "*.csv")):
        cfg, c, _ = os.path.basename(path)[:-4].split("__")
        rb.setdefault((cfg, int(c[1:])), []).append(rb_row(path))
    def med(cfg, c, field):
        rows = rb.get((cfg, c))
        return statistics.median(r[field] for r in rows) if rows else None
    names = {"direct": "direct (redis-server)", "nutcracker": "nutcracker -> 1 redis",
             **{f"proxy{n}": f"proxy N={n}" for n in NS}}
    rb_rows = []
    for c in (1, 50):
        d_rps, d_p50, d_p99 = med("direct", c, "rps"), med("direct", c, "p50"), med("direct", c, "p99")
        for cfg in ["direct", "nutcracker"] + [f"proxy{n}" for n in NS]:
            rps = med(cfg, c, "rps")
            if rps is None:
                continue
            p50, p99 = med(cfg, c, "p50"), med(cfg, c, "p99")
            spread = [r["rps"] for r in rb[(cfg, c)]]
            rb_rows.append([names[cfg], c, f"{rps:,.0f}", fmt(rps / d_rps), fmt(p50, 3), fmt(p50 / d_p50),
                            fmt(p99, 3), fmt(p99 / d_p99),
                            f"{min(spread):,.0f}-{max(spread):,.0f}" if len(spread) > 1 else "-"])
    md.append(f"### 1. Acquire (`SET lock:__rand_int__ v NX PX 10000 -r 1000000`), redis-benchmark, median of {meta['rounds']} round(s)\n")
    md.append(table(["config", "-c", "requests/s", "vs direct", "p50 ms", "p50 vs direct", "p99 ms", "p99 vs direct", "req/s range"], rb_rows))

    # CPU per request during those runs
    cpu = {}
    for path in glob.glob(os.path.join(raw, "rb", "*.cpu")):
        cfg, c, _ = os.path.basename(path)[:-4].split("__")
        d = load(path)
        n = d["requests"]
        row = {k: d[k] / n * 1e6 for k in ("client_s", "middle_s", "masters_s")}
        if d.get("wall_s"):
            # Not clamped: a negative value means the accounting is wrong, and should show.
            row["others_cores"] = (d["machine_s"] - d["client_s"] - d["middle_s"] - d["masters_s"]) / d["wall_s"]
        cpu.setdefault((cfg, int(c[1:])), []).append(row)
    cpu_rows = []
    for c in (50, 1):
        for cfg in ["direct", "nutcracker"] + [f"proxy{n}" for n in NS]:
            rows = cpu.get((cfg, c))
            if not rows:
                continue
            m = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            total = m["client_s"] + m["middle_s"] + m["masters_s"]
            rps = med(cfg, c, "rps")
            others = [r["others_cores"] for r in rows if "others_cores" in r]
            cpu_rows.append([names[cfg], c, fmt(m["client_s"], 1), fmt(m["middle_s"], 1) if cfg != "direct" else "-",
                             fmt(m["masters_s"], 1), fmt(total, 1), f"{2e6 / total:,.0f}" if total else "-",
                             fmt(rps * total / 1e6, 2) if rps else "-",
                             f"{statistics.median(others):.2f} ({min(others):.2f}-{max(others):.2f})" if others else "-"])
    if cpu_rows:
        md.append("\nCPU time (user + system, all threads, from /proc/<pid>/stat; 10 ms ticks) per request during those runs, "
                  "median over the rounds: the client (redis-benchmark), the proxy or nutcracker, and the masters it used "
                  "(one for direct and nutcracker, N for the proxy). \"2-core ceiling\" is 2 s / total: the rate this "
                  "configuration could reach if the 2 cores did nothing else; \"cores busy\" is what these processes "
                  "used at the measured rate; \"other load\" is the rest of the machine's busy CPU during the runs (other "
                  "work on the shared machine, the idle proxies' probes), in cores, median (range): the noise.\n")
        md.append(table(["config", "-c", "client us/req", "proxy us/req", "masters us/req", "total us/req",
                         "2-core ceiling req/s", "cores busy", "other load, cores"], cpu_rows))

        # Where no part shares a core (the load generator elsewhere, the proxy or nutcracker on
        # one core, each master on its own), the slowest part sets the rate.
        def apart(cfg):
            rows = cpu.get((cfg, 50))
            if not rows:
                return None
            mid = statistics.median(r["middle_s"] for r in rows)
            per_master = statistics.median(r["masters_s"] for r in rows) / (int(cfg[5:]) if cfg.startswith("proxy") else 1)
            return 1e6 / max(mid, per_master)
        a = {cfg: apart(cfg) for cfg in ["direct", "nutcracker"] + [f"proxy{n}" for n in NS]}
        if all(a.get(k) for k in ("direct", "nutcracker", "proxy1", "proxy3", "proxy5", "proxy7")):
            md.append(f"\nWith each part on a core of its own at `-c 50` (the proxy or nutcracker on one, each master on "
                      f"one; the load generator elsewhere), the slowest part sets the rate: direct {a['direct']:,.0f}, "
                      f"nutcracker {a['nutcracker']:,.0f}, proxy N=1 {a['proxy1']:,.0f}, N=3 {a['proxy3']:,.0f}, "
                      f"N=5 {a['proxy5']:,.0f}, N=7 {a['proxy7']:,.0f} req/s. That gives P1 (N=5 / direct) "
                      f"{a['proxy5'] / a['direct']:.2f}x, P3 (N=1 / nutcracker) {a['proxy1'] / a['nutcracker']:.2f}x"
                      f", P6 (N=7 / N=3) {a['proxy7'] / a['proxy3']:.2f}.")

    # 2. lock cycles
    cyc = {}
    for path in glob.glob(os.path.join(raw, "cycle", "*.json")):
        cfg, c = os.path.basename(path)[:-5].split("__")
        cyc[(cfg, int(c[1:]))] = load(path)
    cyc_rows = []
    for c in (1, 50):
        base = cyc.get(("direct", c))
        for cfg in ["direct"] + [f"proxy{n}" for n in NS]:
            d = cyc.get((cfg, c))
            if not d:
                continue
            a, y = d["acquire"], d["cycle"]
            cyc_rows.append([names[cfg], c, f"{d['locks_per_s']:,.0f}", fmt(d["locks_per_s"] / base["locks_per_s"]) if base else "-",
                             fmt(a["p50_ms"], 3), fmt(a["p99_ms"], 3), fmt(y["p50_ms"], 3), fmt(y["p99_ms"], 3),
                             fmt(y["p999_ms"], 3), fmt(y["max_ms"], 1), d["errors"] + d["release_zero"]])
    md.append("\n### 2. Full lock cycle (acquire + `EVALSHA` compare-and-delete release), `lockbench`, HdrHistogram\n")
    md.append(table(["config", "workers", "locks/s", "vs direct", "acquire p50", "acquire p99", "cycle p50", "cycle p99",
                     "cycle p999", "cycle max", "errors"], cyc_rows))
    md.append("\nLatencies in ms. `cycle_latency.svg` plots the whole percentile spectrum of the 50-worker cycles.")

    # 3. node
    nd = {os.path.basename(p)[:-5]: load(p) for p in glob.glob(os.path.join(raw, "node", "*.json"))}
    node_names = {"redlock-masters": "client-side: npm redlock over 5 masters",
                  "ioredis-proxy": "ioredis -> proxy N=5 (SET NX PX + EVALSHA)",
                  "redlock-proxy": "npm redlock -> proxy N=5 as its single client"}
    node_rows = []
    base = nd.get("redlock-masters")
    for m in ["redlock-masters", "ioredis-proxy", "redlock-proxy"]:
        d = nd.get(m)
        if not d:
            continue
        node_rows.append([node_names[m], f"{d['locks_per_s']:,.0f}", fmt(d["locks_per_s"] / base["locks_per_s"]) if base else "-",
                          fmt(d["acquire"]["p50_ms"], 3), fmt(d["acquire"]["p99_ms"], 3),
                          fmt(d["cycle"]["p50_ms"], 3), fmt(d["cycle"]["p99_ms"], 3),
                          d["not_acquired"], d.get("release_failed", 0)])
    md.append("\n### 3. Client-side Redlock vs the proxy, Node.js, 50 concurrent acquire + release loops\n")
    md.append(table(["client", "locks/s", "vs client-side", "acquire p50", "acquire p99", "cycle p50", "cycle p99",
                     "not acquired", "release failed"], node_rows))
    md.append("\nOne Node process, 50 async workers, one ioredis connection per endpoint; latencies in ms. \"Not acquired\": "
              "the random key was already held (a collision in the 1,000,000-key space), counted, not timed.")
    # CPU per lock cycle of Node, the proxy and the masters, and P4's bound: the rate through a
    # proxy that cost nothing, against client-side Redlock's rate with the same cores.
    node_cpu = {}
    for m in ["redlock-masters", "ioredis-proxy", "redlock-proxy"]:
        c = nd.get(m, {}).get("cpu")
        if c:
            locks = nd[m]["cycle"]["count"]
            node_cpu[m] = {k: c[k] / locks * 1e6 for k in ("client_s", "middle_s", "masters_s")}
            node_cpu[m]["busy"] = (c["client_s"] + c["middle_s"] + c["masters_s"]) / nd[m]["seconds"]
    if node_cpu:
        rows = []
        for m, u in node_cpu.items():
            total = u["client_s"] + u["middle_s"] + u["masters_s"]
            rows.append([node_names[m], fmt(u["client_s"], 1), fmt(u["middle_s"], 1) if u["middle_s"] else "-",
                         fmt(u["masters_s"], 1), fmt(total, 1), f"{2e6 / total:,.0f}", fmt(u["busy"], 2)])
        md.append("\nCPU time per lock cycle (µs, over the measured window: Node's own user + system time, the proxy's and the "
                  "masters' from /proc), \"2-core ceiling\" 2 s / total, \"cores busy\" what the three parts used:\n")
        md.append(table(["client", "Node us/lock", "proxy us/lock", "masters us/lock", "total us/lock",
                         "2-core ceiling locks/s", "cores busy"], rows))
        r, i = node_cpu.get("redlock-masters"), node_cpu.get("ioredis-proxy")
        if r and i:
            free = i["client_s"] + i["masters_s"]
            own = r["client_s"] + r["masters_s"]
            md.append(f"\nP4's bound on these cores: with a proxy that cost nothing, ioredis through it would need "
                      f"{free:.1f} µs per lock against client-side Redlock's {own:.1f}: at most "
                      f"{own / free:.2f}x its locks/s at equal use of the cores.")

            def apart(u):
                # Each part on cores of its own: Node and the proxy one each (one thread), each of
                # the 5 masters one. The slowest part sets the rate.
                parts = [u["client_s"], u["masters_s"] / 5] + ([u["middle_s"]] if u["middle_s"] else [])
                return 1e6 / max(parts)
            md.append(f"With each part on cores of its own (Node one, the proxy one, each master one), the "
                      f"slowest part sets the rate: {apart(i):,.0f} locks/s through the proxy against "
                      f"{apart(r):,.0f} client-side, {apart(i) / apart(r):.2f}x.")
    for m in ["redlock-masters", "ioredis-proxy", "redlock-proxy"]:
        if nd.get(m, {}).get("first_failure"):
            md.append(f"First failure of {m}: {nd[m]['first_failure']}")

    # 4. paused master
    pz = {}
    for path in glob.glob(os.path.join(raw, "paused", "*.json")):
        phase, c = os.path.basename(path)[:-5].split("__")
        pz[(phase, int(c[1:]))] = load(path)
    pz_rows = []
    for c in (1, 50):
        h = pz.get(("healthy", c))
        for phase in ("healthy", "paused"):
            d = pz.get((phase, c))
            if not d:
                continue
            a = d["acquire"]
            pz_rows.append([f"{phase}{' (1 of 5 SIGSTOPped)' if phase == 'paused' else ''}", c, f"{d['locks_per_s']:,.0f}",
                            fmt(a["p50_ms"], 3), fmt(a["p50_ms"] / h["acquire"]["p50_ms"]) if h else "-",
                            fmt(a["p99_ms"], 3), fmt(a["p99_ms"] / h["acquire"]["p99_ms"]) if h else "-",
                            fmt(a["p999_ms"], 3), fmt(a["max_ms"], 1), d["errors"]])
    md.append("\n### 4. One master of five paused (SIGSTOP), proxy N=5, full cycles, acquire latency\n")
    md.append(table(["phase", "workers", "locks/s", "acquire p50", "vs healthy", "acquire p99", "vs healthy", "p999", "max", "errors"], pz_rows))
    md.append("\nThe paused 1-worker run starts right after the SIGSTOP (no warm-up), so it includes the time before the "
              "probe marks the master down; the 50-worker run follows it.")

    # 5. memory
    mem = {}
    for path in glob.glob(os.path.join(raw, "mem", "*.json")):
        if path.endswith(".loadgen.json"):
            continue
        d = load(path)
        lg = load(path.replace(".json", ".loadgen.json"))
        d["alive"], d["checked"] = lg["alive"], lg["checked"]
        mem[d["target"]] = d
    mem_names = {"proxy5": "redlock-proxy (N=5)", "redis": "redis-server", "nutcracker": "nutcracker"}
    mem_rows = []
    for t in ("proxy5", "redis", "nutcracker"):
        d = mem.get(t)
        if not d:
            continue
        per = (d["after_kb"] - d["before_kb"]) / d["conns"]
        d["per_conn_kib"] = per
        mem_rows.append([mem_names[t], f"{d['conns']:,}", f"{d['before_kb']:,}", f"{d['after_kb']:,}", fmt(per, 2),
                         f"{d['after_close_kb']:,}", f"{d['alive']}/{d['checked']}"])
    md.append(f"\n### 5. Memory: VmRSS with {meta['conns']:,} idle client connections (each answered one PING)\n")
    md.append(table(["process", "connections", "before KiB", "with conns KiB", "KiB per conn", "after close KiB", "alive after idle"], mem_rows))

    # Targets
    targets = []
    def target(name, measured, goal, ok, detail):
        targets.append([name, measured, goal, {True: "met", False: "**missed**", None: "-"}[ok], detail])
    d50, p5_50 = med("direct", 50, "rps"), med("proxy5", 50, "rps")
    if d50 and p5_50:
        r = p5_50 / d50
        target("proxy N=5 throughput vs direct, -c 50", f"{r:.2f}x ({p5_50:,.0f} vs {d50:,.0f} req/s)", ">= 0.5x", r >= 0.5,
               f"{r / 0.5:.2f} of the target" if r < 0.5 else f"{r / 0.5 - 1:+.0%} margin")
    dp, pp = med("direct", 1, "p50"), med("proxy5", 1, "p50")
    if dp and pp:
        r = pp / dp
        target("proxy N=5 p50 latency vs direct, -c 1", f"{r:.2f}x ({pp:.3f} vs {dp:.3f} ms)", "<= 3x", r <= 3,
               f"{r / 3 - 1:+.0%} over" if r > 3 else f"{1 - r / 3:.0%} under the limit")
    p1, ncr = med("proxy1", 50, "rps"), med("nutcracker", 50, "rps")
    if p1 and ncr:
        r = p1 / ncr
        target("proxy N=1 throughput vs nutcracker, -c 50", f"{r:.2f}x ({p1:,.0f} vs {ncr:,.0f} req/s)", ">= 1.0x", r >= 1.0,
               f"{r - 1:+.0%}")
    if "redlock-masters" in nd and "ioredis-proxy" in nd:
        a, b = nd["ioredis-proxy"], nd["redlock-masters"]
        r = a["locks_per_s"] / b["locks_per_s"]
        lower = a["cycle"]["p99_ms"] < b["cycle"]["p99_ms"]
        target("ioredis via proxy vs client-side redlock (locks/s, cycle p99)",
               f"{r:.2f}x locks/s; p99 {a['cycle']['p99_ms']:.2f} vs {b['cycle']['p99_ms']:.2f} ms",
               ">= 3x and lower p99", r >= 3 and lower,
               ("" if r >= 3 else f"locks/s at {r / 3:.2f} of the target") + ("" if lower else "; p99 not lower"))
    for c in (1, 50):
        h, p = pz.get(("healthy", c)), pz.get(("paused", c))
        if h and p:
            r = p["acquire"]["p50_ms"] / h["acquire"]["p50_ms"]
            r99 = p["acquire"]["p99_ms"] / h["acquire"]["p99_ms"]
            target(f"one master paused: acquire p50 vs healthy, {c} worker(s)",
                   f"{r:.2f}x ({p['acquire']['p50_ms']:.3f} vs {h['acquire']['p50_ms']:.3f} ms; p99 {r99:.2f}x)", "<= 1.2x", r <= 1.2,
                   f"{r / 1.2 - 1:+.0%} over" if r > 1.2 else "")
    if "proxy5" in mem:
        per = mem["proxy5"]["per_conn_kib"]
        target("proxy RSS per idle client connection", f"{per:.2f} KiB", "<= 16 KiB", per <= 16,
               f"{per / 16 - 1:+.0%} over" if per > 16 else f"{1 - per / 16:.0%} under the limit")
    tgt_md = table(["target", "measured (same run)", "goal", "result", "note"], targets, align=["l", "l", "l", "l", "l"])

    # perf
    perf_md = ""
    self_txt = os.path.join(raw, "perf", "self.txt")
    if os.path.exists(self_txt) and os.path.getsize(self_txt) > 0:
        with open(self_txt) as f:
            top = [l.rstrip() for l in f][:25]
        perf_md = ("\n### 6. perf: proxy N=5 under redis-benchmark -c 50 (`perf record -e cpu-clock -g`), top self time\n\n```\n"
                   + "\n".join(top) + "\n```\n")
        dso_txt = os.path.join(raw, "perf", "dso.txt")
        if os.path.exists(dso_txt) and os.path.getsize(dso_txt) > 0:
            with open(dso_txt) as f:
                perf_md += "\nBy object (kernel, the proxy, libc):\n\n```\n" + "".join(f.readlines()[:8]) + "```\n"
    stat_rows = []
    events = [("syscalls:sys_enter_sendto", "sendto"), ("syscalls:sys_enter_recvfrom", "recvfrom"),
              ("syscalls:sys_enter_write", "write"), ("syscalls:sys_enter_writev", "writev"),
              ("syscalls:sys_enter_read", "read"),
              ("syscalls:sys_enter_epoll_wait", "epoll_wait"), ("syscalls:sys_enter_futex", "futex"),
              ("context-switches", "ctx switches"), ("task-clock", "CPU us")]
    for c in (1, 50):
        for cfg in ("direct", "nutcracker", "proxy1", "proxy5"):
            path = os.path.join(raw, "perf", f"stat_{cfg}__c{c}.csv")
            if not os.path.exists(path):
                continue
            with open(os.path.join(raw, "perf", f"stat_{cfg}__c{c}.requests")) as f:
                n = int(f.read())
            vals = {}
            with open(path) as f:
                for row in csv.reader(l for l in f if l.strip() and not l.startswith("#")):
                    if len(row) > 2:
                        try:
                            vals[row[2]] = float(row[0])
                        except ValueError:
                            pass
            if not vals:
                continue
            cells = []
            for ev, _ in events:
                v = vals.get(ev)
                if v is None:
                    cells.append("-")
                elif ev == "task-clock":
                    cells.append(fmt(v * 1000 / n, 1))  # msec -> us per request
                else:
                    cells.append(fmt(v / n, 2))
            stat_rows.append([{"direct": "redis-server (direct)"}.get(cfg, names[cfg]), c] + cells)
    if stat_rows:
        perf_md += ("\nPer request, from `perf stat -p` of the process the client talks to (redis-benchmark "
                    "`SET ... NX PX`; the proxy's own work, not its masters'):\n\n"
                    + table(["process", "-c"] + [e[1] for e in events], stat_rows) + "\n")

    header = (f"Run {meta['date']}, `{meta['command']}`, proxy at commit {meta['commit']}"
              f"{' (src/ or Cargo.toml modified)' if meta.get('src_dirty') else ''}; redis-server {meta['redis']}, "
              f"{meta['nutcracker']}, node {meta['node']} with redlock {meta['redlock']} / ioredis {meta['ioredis']}; "
              f"{meta['cpus']} CPUs ({meta['cpu_model']}), Linux {meta['kernel']}"
              f"; load average {meta.get('loadavg_start', '?')} at start, {meta.get('loadavg_end', '?')} at the end"
              f"{'; QUICK mode (short runs)' if meta.get('quick') else ''}"
              f"{'; LAYOUT=split: masters on CPU 1, proxy, nutcracker and load generators on CPU 0' if meta.get('layout') == 'split' else ''}; harness time {meta.get('seconds', '?')} s.")
    report = "\n".join([header, "", "### Targets", "", tgt_md, ""] + md) + "\n" + perf_md
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report)

    # Plots
    caption = f"redlock-proxy benches/harness.sh, {meta['date']}, commit {meta['commit']}; one run, {'masters on their own core' if meta.get('layout') == 'split' else '2 shared cores'}, loopback"
    series_t = []
    if all(med(f"proxy{n}", 50, "rps") for n in NS):
        series_t.append({"name": "proxy: SET NX PX, -c 50 (redis-benchmark)", "color": "#1f77b4",
                         "points": [(n, med(f"proxy{n}", 50, "rps")) for n in NS]})
    if all(cyc.get((f"proxy{n}", 50)) for n in NS):
        series_t.append({"name": "proxy: lock cycles/s, 50 workers (lockbench)", "color": "#d62728",
                         "points": [(n, cyc[(f"proxy{n}", 50)]["locks_per_s"]) for n in NS]})
    if d50:
        series_t.append({"name": "direct redis: SET NX PX, -c 50", "color": "#1f77b4", "dash": True, "hline": d50})
    if ncr:
        series_t.append({"name": "nutcracker: SET NX PX, -c 50", "color": "#2ca02c", "dash": True, "hline": ncr})
    if cyc.get(("direct", 50)):
        series_t.append({"name": "direct redis: lock cycles/s, 50 workers", "color": "#d62728", "dash": True,
                         "hline": cyc[("direct", 50)]["locks_per_s"]})
    series_l = []
    if all(med(f"proxy{n}", 50, "p99") for n in NS):
        series_l.append({"name": "proxy: SET NX PX p99, -c 50", "color": "#1f77b4",
                         "points": [(n, med(f"proxy{n}", 50, "p99")) for n in NS]})
        series_l.append({"name": "direct: SET NX PX p99, -c 50", "color": "#1f77b4", "dash": True, "hline": med("direct", 50, "p99")})
    if all(cyc.get((f"proxy{n}", 50)) for n in NS):
        series_l.append({"name": "proxy: lock cycle p99, 50 workers", "color": "#d62728",
                         "points": [(n, cyc[(f"proxy{n}", 50)]["cycle"]["p99_ms"]) for n in NS]})
        if cyc.get(("direct", 50)):
            series_l.append({"name": "direct: lock cycle p99, 50 workers", "color": "#d62728", "dash": True,
                             "hline": cyc[("direct", 50)]["cycle"]["p99_ms"]})
    if all(med(f"proxy{n}", 1, "p99") for n in NS):
        series_l.append({"name": "proxy: SET NX PX p99, -c 1", "color": "#9467bd",
                         "points": [(n, med(f"proxy{n}", 1, "p99")) for n in NS]})
        series_l.append({"name": "direct: SET NX PX p99, -c 1", "color": "#9467bd", "dash": True, "hline": med("direct", 1, "p99")})
    parts = panel(0, 0, 520, 380, "Throughput vs N (masters)", "N (masters behind the proxy)", "per second",
                  series_t, NS)
    parts += panel(520, 0, 520, 380, "p99 latency vs N (masters)", "N (masters behind the proxy)", "ms",
                   series_l, NS)
    parts += legend(20, 400, series_t, cols=2, colw=330)
    parts += legend(20, 400 + 18 * ((len(series_t) + 1) // 2) + 12, series_l, cols=2, colw=330)
    height = 400 + 18 * ((len(series_t) + 1) // 2) + 12 + 18 * ((len(series_l) + 1) // 2) + 28
    with open(os.path.join(out, "throughput_p99_vs_n.svg"), "w") as f:
        f.write(svg(1040, height, parts, caption))

    # Percentile spectrum of the 50-worker cycles
    short = {names["direct"]: "direct redis", **{names[f"proxy{n}"]: f"proxy N={n}" for n in NS}}
    colors = {"direct": "#000000", "proxy1": "#1f77b4", "proxy3": "#2ca02c", "proxy5": "#d62728", "proxy7": "#9467bd"}
    spec = []
    for cfg in ["direct"] + [f"proxy{n}" for n in NS]:
        path = os.path.join(raw, "cycle", f"{cfg}__c50.hist")
        if not os.path.exists(path):
            continue
        pts = []
        with open(path) as f:
            for l in f:
                if l.startswith("#"):
                    continue
                q, v = map(float, l.split())
                if q >= 0.9999:
                    break
                pts.append((1 / (1 - q), v))
        if pts:
            spec.append({"name": names[cfg], "color": colors[cfg], "points": pts, "markers": False})
    if spec:
        xt = [1, 10, 100, 1000, 10000]
        parts = panel(0, 0, 800, 420, "Lock cycle latency by percentile, 50 workers (lockbench)", "percentile",
                      "cycle latency, ms (acquire + release)", spec, xt, xlog=True,
                      xtick_labels=["0%", "90%", "99%", "99.9%", "99.99%"])
        parts += legend(70, 445, [dict(s, name=short[s["name"]]) for s in spec], cols=5, colw=140)
        with open(os.path.join(out, "cycle_latency.svg"), "w") as f:
            f.write(svg(800, 490, parts, caption))

    print(report)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--line":
        print(line(sys.argv[2], sys.argv[3]))
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        raise SystemExit(__doc__)
