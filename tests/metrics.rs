//! What `/metrics` tells, on real masters: quorum latency apart from waiting time, a `# HELP`
//! and `# TYPE` for every metric, `EVALSHA`'s `NOSCRIPT` retry counted as its own outcome, and
//! the operator's material (docs/operations.md's table, deploy/prometheus-alerts.yml,
//! deploy/grafana-dashboard.json) naming only metrics a proxy exports.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use support::sentinel::wait_until;
use support::shards::Cluster;
use support::{fencing_ready, masters, proxy_with_metrics, query, scrape, total, urls};

/// Polls `/metrics` until `done` holds for it (the state gauges are refreshed every 250 ms,
/// and some counters are counted when a connection hears of an event): its body.
fn scrape_until(port: u16, what: &str, done: impl Fn(&str) -> bool) -> String {
    let mut body = String::new();
    wait_until(what, || {
        body = scrape(port);
        done(&body)
    });
    body
}

/// What one scrape says of each metric family: its `# TYPE` (counter, gauge, histogram),
/// whether it has a `# HELP`, and the names its samples use.
#[derive(Debug, Default)]
struct Family {
    kind: Option<String>,
    help: bool,
    samples: BTreeSet<String>,
}

/// The families of a scrape, by name. A sample belongs to the family named by its `# TYPE`
/// line (a histogram's `_bucket`, `_sum` and `_count` to the histogram's); one that matches no
/// `# TYPE` becomes a family of its own, without a type.
fn families(body: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in body.lines() {
        let mut words = line.split(' ');
        match (words.next(), words.next(), words.next()) {
            (Some("#"), Some("TYPE"), Some(name)) => {
                families.entry(name.to_owned()).or_default().kind = words.next().map(str::to_owned);
            }
            (Some("#"), Some("HELP"), Some(name)) => {
                let family = families.entry(name.to_owned()).or_default();
                family.help = words.next().is_some_and(|w| !w.is_empty());
            }
            _ => {}
        }
    }
    for line in body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|base| {
                families
                    .get(*base)
                    .is_some_and(|f| f.kind.as_deref() == Some("histogram"))
            })
            .unwrap_or(name);
        families
            .entry(family.to_owned())
            .or_default()
            .samples
            .insert(name.to_owned());
    }
    families
}

/// Every series name Prometheus stores for these families (a histogram's `_bucket`, `_sum`
/// and `_count` with its own name): what a query may name.
fn queryable(families: &BTreeMap<String, Family>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (name, family) in families {
        names.insert(name.clone());
        if family.kind.as_deref() == Some("histogram") {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// Every `redlock_...` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("redlock_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// Fails with what each of two sets has that the other lacks.
fn same(left_name: &str, left: &BTreeSet<String>, right_name: &str, right: &BTreeSet<String>) {
    let only_left: Vec<&String> = left.difference(right).collect();
    let only_right: Vec<&String> = right.difference(left).collect();
    assert!(
        only_left.is_empty() && only_right.is_empty(),
        "{left_name} but not {right_name}: {only_left:?}; {right_name} but not {left_name}: {only_right:?}"
    );
}

/// A file of this repository.
fn repository_file(path: &str) -> String {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The metric of each row of docs/operations.md's metrics table (the first cell's name).
fn documented_metrics(doc: &str) -> Vec<String> {
    metric_rows(doc)
        .into_iter()
        .map(|(name, _, _)| {
            assert!(
                name.starts_with("redlock_") && !name.contains(['`', ' ', '{']),
                "a row of the metrics table names one metric, in backticks: {name}"
            );
            name
        })
        .collect()
}

/// The dashboard's panels, rows' nested panels included.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("a dashboard has panels") {
        all.push(panel);
        if let Some(nested) = panel["panels"].as_array() {
            all.extend(nested);
        }
    }
    all
}

/// Every PromQL expression of the dashboard: its panels' targets and its variables' queries.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    let mut queries: Vec<String> = panels(dashboard)
        .into_iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(definition) = variable["definition"].as_str() {
            queries.push(definition.to_owned());
        }
    }
    queries
}

#[test]
fn waiting_is_timed_apart_from_the_quorum_rounds() {
    let servers = masters(3);
    let (proxy, metrics) = proxy_with_metrics(&urls(&servers), "");
    fencing_ready(&proxy);
    let mut holder = proxy.client();
    assert!(matches!(
        query(&mut holder, &["LOCK.ACQUIRE", "lock:wait", "holder", "30000"]),
        Ok(redis::Value::Int(_))
    ));
    let before = scrape(metrics);
    let waiter = {
        let mut c = proxy.client();
        std::thread::spawn(move || {
            let started = Instant::now();
            let reply = query(
                &mut c,
                &["LOCK.ACQUIRE", "lock:wait", "waiter", "30000", "WAIT", "20000"],
            );
            (reply, started.elapsed())
        })
    };
    scrape_until(metrics, "the request to wait", |body| {
        total(body, "redlock_waiters") == 1.0
    });
    // The time the lock stays held is what is measured, not a synchronisation.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        query(&mut holder, &["LOCK.RELEASE", "lock:wait", "holder"]).unwrap(),
        redis::Value::Int(1)
    );
    let (reply, waited) = waiter.join().unwrap();
    assert!(matches!(reply, Ok(redis::Value::Int(_))), "{reply:?}");
    let after = scrape_until(metrics, "the wait to be counted", |body| {
        total(body, "redlock_wait_seconds_count") > total(&before, "redlock_wait_seconds_count")
    });
    let delta = |series: &str| total(&after, series) - total(&before, series);
    let (wait, rounds) = (delta("redlock_wait_seconds_sum"), delta("redlock_acquire_seconds_sum"));
    assert!(
        (1.0..=waited.as_secs_f64() + 0.05).contains(&wait),
        "the wait ({waited:?}) counted as {wait} s"
    );
    // Two quorum rounds (refused, then granted), each a few milliseconds: never the second
    // the lock was held.
    assert!(rounds < 0.25, "{rounds} s of acquisition rounds for a wait of {wait} s");
    assert!(
        total(&after, "redlock_wait_seconds_count{outcome=\"acquired\"}") == 1.0,
        "{after}"
    );
    // One observation per try: refused, then granted (a third only if a round met no quorum
    // on a loaded machine).
    assert!(delta("redlock_acquire_seconds_count") >= 2.0, "{after}");
    assert_eq!(delta("redlock_handoffs_total"), 1.0);
    // The waiting command itself is still counted among the commands.
    assert_eq!(
        delta("redlock_commands_total{command=\"lock.acquire\",outcome=\"acquired\"}"),
        1.0
    );

    // A wait that runs out is timed too, as a timeout.
    let mut other = proxy.client();
    assert_eq!(
        query(
            &mut other,
            &["LOCK.ACQUIRE", "lock:wait", "other", "30000", "WAIT", "100"]
        )
        .unwrap(),
        redis::Value::Nil
    );
    let last = scrape(metrics);
    assert!(
        total(&last, "redlock_wait_seconds_sum{outcome=\"timeout\"}") >= 0.1,
        "{last}"
    );
}

#[test]
fn noscript_retry_is_its_own_outcome() {
    let servers = masters(3);
    let (proxy, metrics) = proxy_with_metrics(&urls(&servers), "");
    let mut c = proxy.client();
    assert_eq!(support::acquire(&mut c, "lock:ns", "t", 10_000).as_deref(), Some("OK"));
    // A release script the proxy has never seen (a comment makes its SHA1 unique), run the
    // way redis-py's `Lock` runs it: EVALSHA first, then EVAL on NOSCRIPT.
    let body = format!("{} -- metrics test", support::RELEASE);
    let sha = redis::Script::new(&body).get_hash().to_owned();
    let first = query(&mut c, &["EVALSHA", &sha, "1", "lock:ns", "t"]).unwrap_err();
    assert_eq!(first.code(), Some("NOSCRIPT"), "{first}");
    assert_eq!(
        query(&mut c, &["EVAL", &body, "1", "lock:ns", "t"]).unwrap(),
        redis::Value::Int(1)
    );
    let body = scrape(metrics);
    for series in [
        "redlock_commands_total{command=\"evalsha\",outcome=\"noscript\"} 1",
        "redlock_commands_total{command=\"eval\",outcome=\"ok\"} 1",
    ] {
        assert!(body.contains(series), "missing {series} in:\n{body}");
    }
    assert!(!body.contains("outcome=\"error\""), "{body}");
    // The NOSCRIPT answer released nothing: only the EVAL is timed as a release.
    assert_eq!(total(&body, "redlock_release_seconds_count"), 1.0, "{body}");
}

#[test]
fn every_metric_is_described_documented_and_queried_by_its_exported_name() {
    // A proxy whose every metric has a series: locks taken, released, extended and refused;
    // a request that waits; session locks held, lost and ended by a disconnect; a master
    // paused, then another killed (timeouts, connection errors, NOQUORUM).
    let mut servers = masters(3);
    let (proxy, metrics) = proxy_with_metrics(
        &urls(&servers),
        "backend_timeout_ms = 200\nclient_output_buffer_limit = 65536",
    );
    fencing_ready(&proxy);
    let client = || proxy.client();
    let mut c = client();
    assert!(matches!(
        query(&mut c, &["LOCK.ACQUIRE", "lock:a", "t", "10000"]),
        Ok(redis::Value::Int(_))
    ));
    query(&mut c, &["LOCK.EXTEND", "lock:a", "t", "10000"]).unwrap();
    query(&mut c, &["LOCK.RELEASE", "lock:a", "t"]).unwrap();
    assert_eq!(support::acquire(&mut c, "lock:b", "t", 10_000).as_deref(), Some("OK"));
    assert_eq!(support::acquire(&mut c, "lock:b", "u", 10_000), None);
    query(&mut c, &["PEXPIRE", "lock:b", "10000"]).unwrap();
    assert_eq!(support::release(&mut c, "lock:b", "t"), 1);
    assert_eq!(
        query(&mut c, &["LOCK.ACQUIRE", "lock:b", "w", "1000", "WAIT", "10"])
            .map(|v| matches!(v, redis::Value::Int(_))),
        Ok(true)
    );
    // A session lock lost: another client deletes it (its holder hears of it).
    let mut holder = client();
    assert!(matches!(
        query(&mut holder, &["LOCK.ACQUIRE", "lock:s", "h", "1000", "KEEPALIVE"]),
        Ok(redis::Value::Int(_))
    ));
    query(&mut c, &["DEL", "lock:s"]).unwrap();
    scrape_until(metrics, "the session lock's loss", |body| {
        body.contains("redlock_session_locks_lost_total{reason=\"deleted\"} 1")
    });
    // A session lock ended by its client going away.
    assert!(matches!(
        query(&mut holder, &["LOCK.ACQUIRE", "lock:s2", "h", "1000", "KEEPALIVE"]),
        Ok(redis::Value::Int(_))
    ));
    drop(holder);
    scrape_until(metrics, "the disconnect to end the session lock", |body| {
        total(body, "redlock_session_locks_ended_by_disconnect_total") == 1.0
    });
    // A client dropped past its output limit: it asks for up to 40 MB of replies and reads none; once
    // the sockets' buffers are full, the next reply (200 KB) waits in the proxy, past the limit.
    {
        use std::io::Write;
        let mut big = proxy.raw();
        let payload = "x".repeat(200_000);
        let echo = format!("*2\r\n$4\r\nECHO\r\n${}\r\n{payload}\r\n", payload.len());
        let writer = std::thread::spawn(move || {
            for _ in 0..200 {
                if big.write_all(echo.as_bytes()).is_err() {
                    return;
                }
            }
        });
        scrape_until(metrics, "the client dropped past its output limit", |body| {
            body.contains("redlock_clients_dropped_total{limit=\"client_output_buffer_limit\"} 1")
        });
        let _ = writer.join();
    }
    // Masters failing: one paused (timeouts), another killed (connection errors): NOQUORUM.
    servers[0].pause();
    assert_eq!(support::acquire(&mut c, "lock:c", "t", 10_000).as_deref(), Some("OK"));
    servers[1].kill();
    let refused = query(&mut c, &["SET", "lock:d", "t", "NX", "PX", "10000"]).unwrap_err();
    assert_eq!(refused.code(), Some("NOQUORUM"), "{refused}");
    let body = scrape_until(metrics, "the masters' failures to show", |body| {
        total(body, "redlock_backend_timeouts_total") >= 1.0 && body.contains("outcome=\"noquorum\"")
    });
    servers[0].resume();

    // Cluster members have metrics of their own (per shard).
    let cluster = Cluster::start(3, false);
    let (_cluster_proxy, cluster_metrics) = proxy_with_metrics(&[cluster.url()], "");
    let cluster_body = scrape_until(cluster_metrics, "the shard gauges", |body| {
        body.contains("redlock_shard_slots{")
    });

    let mut exported = families(&body);
    for (name, family) in families(&cluster_body) {
        let known = exported.entry(name).or_default();
        known.kind = known.kind.take().or(family.kind);
        known.help |= family.help;
        known.samples.extend(family.samples);
    }

    // Every family has a HELP and a TYPE line, and is one the code declares.
    for (name, family) in &exported {
        assert!(family.help, "{name} has no # HELP line");
        assert!(family.kind.is_some(), "{name} has no # TYPE line");
        assert!(!family.samples.is_empty(), "{name} is described but has no sample");
    }
    let declared: BTreeSet<String> = redlock_proxy::metrics::ALL.iter().map(|m| m.name.to_owned()).collect();
    let names: BTreeSet<String> = exported.keys().cloned().collect();
    same("exported", &names, "declared in src/metrics.rs", &declared);

    // docs/operations.md's table lists exactly the exported metrics.
    let doc = repository_file("docs/operations.md");
    let table = documented_metrics(&doc);
    let rows: BTreeSet<String> = table.iter().cloned().collect();
    assert_eq!(rows.len(), table.len(), "a metric listed twice: {table:?}");
    same("in docs/operations.md's table", &rows, "exported", &names);

    // Every metric named anywhere in the operator's material exists.
    let queryable = queryable(&exported);
    let dashboard: serde_json::Value =
        serde_json::from_str(&repository_file("deploy/grafana-dashboard.json")).expect("the dashboard is JSON");
    for (file, text) in [
        ("docs/operations.md", doc.clone()),
        (
            "docs/waiting-and-sessions.md",
            repository_file("docs/waiting-and-sessions.md"),
        ),
        (
            "deploy/prometheus-alerts.yml",
            repository_file("deploy/prometheus-alerts.yml"),
        ),
        (
            "deploy/grafana-dashboard.json",
            dashboard_queries(&dashboard).join("\n"),
        ),
        (
            "deploy/grafana-dashboard.json",
            repository_file("deploy/grafana-dashboard.json"),
        ),
    ] {
        let named = metric_names(&text);
        assert!(!named.is_empty(), "{file} names no metric");
        let unknown: Vec<&String> = named.difference(&queryable).collect();
        assert!(
            unknown.is_empty(),
            "{file} names metrics the proxy does not export: {unknown:?}"
        );
    }
}

#[test]
fn the_dashboard_imports_and_every_panel_queries() {
    let text = repository_file("deploy/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let input = &dashboard["__inputs"][0];
    assert_eq!(input["name"], "DS_PROMETHEUS", "{input}");
    assert_eq!(input["type"], "datasource", "{input}");
    assert_eq!(input["pluginId"], "prometheus", "{input}");
    assert!(
        dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "Grafana 10 reads schema 36+"
    );
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(
        dashboard["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty() && u.len() <= 40)
    );
    let mut ids = BTreeSet::new();
    let all = panels(&dashboard);
    assert!(all.len() > 10, "{} panels", all.len());
    for panel in all {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {panel}");
        assert!(
            ids.insert(panel["id"].as_u64().expect("a panel id")),
            "panel id repeated: {title}"
        );
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{title} has no place");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
        let targets = panel["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title} has no targets"));
        assert!(!targets.is_empty(), "{title} has no targets");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(expr.contains("redlock_"), "{title}: {target}");
            assert!(target["refId"].as_str().is_some(), "{title}: {target}");
            // Each query follows the dashboard's variables: the job and the proxies chosen.
            assert!(
                expr.contains("job=~\"$job\"") && expr.contains("instance=~\"$instance\""),
                "{title}: {expr}"
            );
        }
    }
    // What it is for: each of these shows somewhere.
    let queries = dashboard_queries(&dashboard).join("\n");
    for metric in [
        "redlock_backend_state",
        "redlock_backend_quarantine_remaining_seconds",
        "redlock_commands_total",
        "redlock_acquire_seconds_bucket",
        "redlock_waiters",
        "redlock_handoffs_total",
        "redlock_wait_seconds_bucket",
        "redlock_session_locks",
        "redlock_session_locks_lost_total",
        "redlock_client_connections",
        "redlock_backend_timeouts_total",
        "redlock_backend_errors_total",
    ] {
        assert!(queries.contains(metric), "the dashboard never shows {metric}");
    }
    for variable in ["job", "instance"] {
        assert!(
            dashboard["templating"]["list"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["name"] == variable),
            "no ${variable} variable"
        );
    }
}

/// The rows of docs/operations.md's metrics table: (metric, labels cell, meaning cell).
fn metric_rows(doc: &str) -> Vec<(String, String, String)> {
    let mut lines = doc
        .lines()
        .skip_while(|l| !l.starts_with("| metric | type | labels | meaning |"));
    assert!(lines.next().is_some(), "docs/operations.md has no metrics table");
    lines
        .take_while(|l| l.starts_with('|'))
        .filter(|l| !l.starts_with("|---"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (
                cells[1].trim_matches('`').to_owned(),
                cells[3].to_owned(),
                cells[4..].join("|"),
            )
        })
        .collect()
}

/// What docs/operations.md says (label-less metrics are exported at 0 from the start) holds
/// for every one of them, histograms included: a scrape before any traffic has each.
#[test]
fn metrics_without_labels_are_exported_from_the_start() {
    let servers = masters(3);
    let (_proxy, metrics) = proxy_with_metrics(&urls(&servers), "");
    let body = scrape(metrics);
    let doc = repository_file("docs/operations.md");
    let unlabelled: Vec<String> = metric_rows(&doc)
        .into_iter()
        .filter(|(_, labels, _)| labels.is_empty())
        .map(|(name, _, _)| name)
        .collect();
    assert!(unlabelled.len() >= 10, "{unlabelled:?}");
    let missing: Vec<&String> = unlabelled
        .iter()
        .filter(|name| {
            !body
                .lines()
                .any(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}_count ")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "not exported before their first event: {missing:?}\n{body}"
    );
}

/// Every `command` label a recipe command is counted under (its `metered` name in
/// `src/recipes/*/command.rs`) is listed in docs/operations.md's row and in the `# HELP`
/// text of `redlock_commands_total`.
#[test]
fn every_command_label_is_listed() {
    let mut labels = BTreeSet::new();
    let recipes = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/recipes");
    for entry in std::fs::read_dir(&recipes).expect("src/recipes") {
        let path = entry.expect("entry").path().join("command.rs");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for line in text.lines() {
            if let Some((_, rest)) = line.split_once("=> \"")
                && let Some((label, _)) = rest.split_once('"')
                && label.contains('.')
            {
                labels.insert(label.to_owned());
            }
        }
    }
    assert!(labels.contains("lock.acquire") && labels.len() >= 20, "{labels:?}");
    let doc = repository_file("docs/operations.md");
    let (_, _, meaning) = metric_rows(&doc)
        .into_iter()
        .find(|(name, _, _)| name == "redlock_commands_total")
        .expect("the commands row");
    let help = redlock_proxy::metrics::ALL
        .iter()
        .find(|m| m.name == "redlock_commands_total")
        .expect("declared")
        .help();
    for label in &labels {
        assert!(
            meaning.contains(&format!("`{label}`")),
            "docs/operations.md omits {label}"
        );
        assert!(
            [",", ".", " "]
                .iter()
                .any(|end| help.contains(&format!(" {label}{end}"))),
            "# HELP omits {label}: {help}"
        );
    }
}
