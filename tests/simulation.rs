//! Deterministic simulation of the quorum engine: the real `Engine`, simulated masters and
//! network (see `tests/sim/mod.rs`), seeded faults, and checks of the properties Redlock
//! promises:
//!
//! 1. mutual exclusion within validity: no two grants of one key overlap in time;
//! 2. no orphans: a refused acquisition under clean conditions and every release leave the
//!    token on no master that answered, and once every TTL has passed every master is empty;
//! 3. liveness: with a quorum of masters up, admitted and answering within the timeout, an
//!    uncontended acquisition succeeds;
//! 4. the checker can fail: with the restart quarantine (rule 8) off, restarts at the worst
//!    moment, and failovers to a replica that missed the grant, produce violations, and it
//!    reports them; so do master clocks drifting beyond the engine's allowance;
//! 5. fencing: half the clients take their locks with fencing tokens (`LOCK.ACQUIRE`); a
//!    token is above every token of the same lock answered before its acquisition was sent
//!    (checked with the quarantine on, and off: fencing does not rest on it);
//! 6. replies are true when they arrive: a fifth of the acquisitions have their reply
//!    queued behind a slower command of a shared connection and settled when written (rule
//!    4a); a grant never reaches its client after its validity ended (and the checker can
//!    fail: with settling off it catches stale replies).
//!
//! 7. semaphores (rule 14): a semaphore client per proxy takes permits of two 2-permit
//!    semaphores as the proxy serves them, each slot a fenced lock (its grants join property 1
//!    and 5 per slot), and no instant has more than 2 holders of one semaphore;
//! 8. the other recipes, one client of each per proxy (`sim/recipes.rs`): a read-write lock
//!    (never a writer's grant overlapping any other grant of the lock, readers overlapping
//!    readers; tokens rising per lock, readers' and writers' alike), several locks at once
//!    (each key of a set a grant of that key, meeting the lock clients' grants under property
//!    1 and 5), an election (one leader at a time: property 1 on its lock key; terms
//!    strictly rising: property 5), and a reentrant holder of the lock clients' keys (it takes
//!    its lock again and gives the extra holds back one by one while it believes the lock:
//!    property 1 against the lock clients).
//!
//! Clients also re-send their acquisition with their own token while holding, and legacy
//! clients write timestamps shared by every client in the same second (rule 5a: an undo
//! never removes a key another acquisition owns, even with an equal value).
//!
//! `cargo test --test simulation -- --nocapture` prints what each run did. Environment:
//! `SIM_SEED=n` replays seed `n` alone and prints its event trace; `SIM_LONG=1` runs at
//! least 1,000,000 operations (use `--release`).

mod sim;

use std::time::Instant;

use redlock_proxy::backend::health::QuarantineMode;
use sim::config::Config;
use sim::report::{Report, Summary};
use sim::run::run;
use sim::scenario;

/// How many seeds, of how many operations each.
#[derive(Clone, Copy)]
struct Plan {
    seeds: u64,
    ops_per_seed: u64,
}

/// The default run: a few seeds, over 20,000 operations, seconds in a debug build.
const QUICK: Plan = Plan {
    seeds: 6,
    ops_per_seed: 3_500,
};

/// `SIM_LONG=1`: over 1,000,000 operations.
const LONG: Plan = Plan {
    seeds: 250,
    ops_per_seed: 4_000,
};

/// The quarantine-off runs: fewer, shorter seeds suffice to show violations.
const QUICK_OFF: Plan = Plan {
    seeds: 4,
    ops_per_seed: 1_500,
};
const LONG_OFF: Plan = Plan {
    seeds: 40,
    ops_per_seed: 4_000,
};

fn long() -> bool {
    std::env::var("SIM_LONG").is_ok_and(|v| v == "1")
}

/// The seed to replay, from `SIM_SEED`.
fn replay_seed() -> Option<u64> {
    std::env::var("SIM_SEED").ok().map(|s| {
        s.trim()
            .parse()
            .unwrap_or_else(|_| panic!("SIM_SEED must be an integer, not {s:?}"))
    })
}

/// Seeds `1..=count`, or only the one `SIM_SEED` names.
fn seeds(count: u64) -> Vec<u64> {
    match replay_seed() {
        Some(seed) => vec![seed],
        None => (1..=count).collect(),
    }
}

/// Runs `config(seed)` for every seed, printing the summary line (and, when replaying one
/// seed, its whole trace).
fn run_all(name: &str, seeds: &[u64], config: impl Fn(u64) -> Config) -> Summary {
    let started = Instant::now();
    let mut summary = Summary::default();
    for &seed in seeds {
        let mut cfg = config(seed);
        cfg.trace = replay_seed().is_some();
        let report = run(cfg);
        print_trace(&report);
        summary.add(&report);
    }
    summary.wall = started.elapsed();
    println!("{}", summary.line(name));
    summary
}

fn print_trace(report: &Report) {
    if !report.trace.is_empty() {
        println!("--- trace of seed {} ---\n{}", report.seed, report.trace.join("\n"));
    }
}

/// The first few of `lines`, for an assertion message, with how to replay one of them.
fn first(lines: &[String], test: &str) -> String {
    let shown: Vec<&str> = lines.iter().take(10).map(String::as_str).collect();
    format!(
        "{}{}\nreplay one with: SIM_SEED=<seed> cargo test --test simulation {test} -- --nocapture",
        shown.join("\n"),
        if lines.len() > 10 { "\n..." } else { "" }
    )
}

#[test]
fn random_runs_keep_mutual_exclusion_liveness_and_leave_no_orphans() {
    let plan = if long() { LONG } else { QUICK };
    let summary = run_all("(quarantine on)", &seeds(plan.seeds), |seed| {
        Config::random(seed, plan.ops_per_seed, QuarantineMode::Restarts)
    });
    assert!(
        summary.violations.is_empty(),
        "{} mutual exclusion violations:\n{}",
        summary.violations.len(),
        first(&summary.violations, "random_runs_keep")
    );
    assert!(
        summary.failures.is_empty(),
        "{} property failures:\n{}",
        summary.failures.len(),
        first(&summary.failures, "random_runs_keep")
    );
    assert!(
        summary.fence_violations.is_empty(),
        "{} fencing violations:\n{}",
        summary.fence_violations.len(),
        first(&summary.fence_violations, "random_runs_keep")
    );
    if replay_seed().is_none() {
        assert!(
            summary.ops >= plan.seeds * plan.ops_per_seed,
            "{}",
            summary.line("short")
        );
        assert!(
            summary.grants > 0 && summary.fences > 0 && summary.tally.liveness_checks > 0 && summary.tally.permits > 0,
            "{}",
            summary.line("idle")
        );
        let t = &summary.tally;
        assert!(
            t.read_holds > 0 && t.write_holds > 0 && t.lock_sets > 0 && t.leaderships > 0 && t.reentries > 0,
            "a recipe's client was never granted anything: {}",
            summary.line("idle")
        );
        assert!(
            summary.tally.clean_failures > 0,
            "no refusal under clean conditions was checked"
        );
    }
}

/// Property 6 can fail: without settling a reply when it is written (rule 4a), grants whose
/// reply waited behind a slower command reach their client after their validity ended.
#[test]
fn unsettled_replies_are_caught_as_stale() {
    let summary = run_all("(replies not settled)", &seeds(QUICK_OFF.seeds), |seed| {
        let mut cfg = Config::random(seed, QUICK_OFF.ops_per_seed, QuarantineMode::Restarts);
        cfg.settle_replies = false;
        cfg
    });
    let stale = summary.failures.iter().filter(|f| f.contains("stale reply")).count();
    assert!(
        stale > 0 || replay_seed().is_some(),
        "no stale reply was caught: {}",
        summary.line("unsettled")
    );
}

/// The scenario with the quarantine off: B was granted the lock A holds, and the checker says so.
fn b_granted_too(off: &Report) {
    println!("--- quarantine off ---\n{}", off.trace.join("\n"));
    assert!(
        !off.violations.is_empty(),
        "quarantine off: B should have been granted the lock A holds, and the checker should say so\n{}",
        off.trace.join("\n")
    );
    assert!(off.failures.is_empty(), "{:?}", off.failures);
}

#[test]
fn without_quarantine_a_restart_under_a_bare_majority_grants_a_held_lock_twice() {
    let off = scenario::restart_under_a_bare_majority(QuarantineMode::Off);
    b_granted_too(&off);
    let on = scenario::restart_under_a_bare_majority(QuarantineMode::Restarts);
    println!("--- quarantine on ---\n{}", on.trace.join("\n"));
    assert!(
        on.violations.is_empty() && on.grants == 1,
        "quarantine on: only A may be granted\n{}",
        on.trace.join("\n")
    );
    assert!(on.failures.is_empty(), "{:?}", on.failures);
}

/// Rule 8 for a failover: the replica that replaced m1 has run for an hour, so its uptime
/// does not say it lost anything, but it missed A's grant. Quarantined from when the proxy
/// sees the new process (whatever its uptime), it cannot grant B the lock A holds.
#[test]
fn without_quarantine_a_failover_under_a_bare_majority_grants_a_held_lock_twice() {
    let off = scenario::failover_under_a_bare_majority(QuarantineMode::Off);
    b_granted_too(&off);
    for mode in [QuarantineMode::Restarts, QuarantineMode::Always] {
        let on = scenario::failover_under_a_bare_majority(mode);
        println!("--- quarantine {mode:?} ---\n{}", on.trace.join("\n"));
        assert!(
            on.violations.is_empty() && on.grants == 1,
            "quarantine {mode:?}: only A may be granted\n{}",
            on.trace.join("\n")
        );
        assert!(on.failures.is_empty(), "{:?}", on.failures);
        assert_eq!(on.tally.failovers, 1);
    }
}

#[test]
fn random_runs_without_quarantine_show_violations_and_the_same_faults_with_it_do_not() {
    let plan = if long() { LONG_OFF } else { QUICK_OFF };
    let seeds = seeds(plan.seeds);
    let off = run_all("(quarantine off, worst-moment restarts)", &seeds, |seed| {
        Config::quarantine_off(seed, plan.ops_per_seed)
    });
    // A replayed seed (SIM_SEED) need not be one that shows a violation.
    assert!(
        !off.violations.is_empty() || replay_seed().is_some(),
        "seeds {seeds:?}: with rule 8 off and restarts at the worst moment, the checker found no violation"
    );
    // Fencing does not rest on the quarantine: a restarted master has no epoch, so it
    // does not vote on tokens until a write-back rewrites its counter (F3).
    assert!(
        off.fence_violations.is_empty() && off.fences > 0,
        "{} fencing violations with the quarantine off:\n{}",
        off.fence_violations.len(),
        first(&off.fence_violations, "random_runs_without")
    );
    let on = run_all("(quarantine on, same faults)", &seeds, |seed| {
        let mut cfg = Config::quarantine_off(seed, plan.ops_per_seed);
        cfg.mode = QuarantineMode::Restarts;
        cfg
    });
    assert!(
        on.violations.is_empty(),
        "{} violations with the quarantine on:\n{}",
        on.violations.len(),
        first(&on.violations, "random_runs_without")
    );
    assert!(
        on.fence_violations.is_empty(),
        "{} fencing violations with the quarantine on:\n{}",
        on.fence_violations.len(),
        first(&on.fence_violations, "random_runs_without")
    );
    assert!(on.failures.is_empty(), "{}", first(&on.failures, "random_runs_without"));
}

#[test]
fn clocks_drifting_beyond_the_allowance_show_violations() {
    let plan = if long() { LONG_OFF } else { QUICK_OFF };
    let seeds = seeds(plan.seeds);
    let fast = run_all("(every master clock 10 % fast)", &seeds, |seed| {
        Config::drifting(seed, plan.ops_per_seed, 1.10)
    });
    assert!(
        !fast.violations.is_empty() || replay_seed().is_some(),
        "seeds {seeds:?}: keys expiring 10 % early went unnoticed by the checker"
    );
}

#[test]
fn a_minority_down_does_not_stop_an_uncontended_acquire() {
    for (masters, down) in [(3, 1), (5, 2), (7, 3)] {
        let report = scenario::acquire_with_masters_down(masters, down);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.grants, 1, "{down} of {masters} down");
    }
}

#[test]
fn a_seed_replays_exactly() {
    let seed = replay_seed().unwrap_or(7);
    let config = || Config::random(seed, 1_500, QuarantineMode::Restarts);
    let (a, b) = (run(config()), run(config()));
    assert_eq!(
        (a.fingerprint, a.ops, a.grants, &a.tally, a.sim_time),
        (b.fingerprint, b.ops, b.grants, &b.tally, b.sim_time),
        "seed {seed} ran differently twice"
    );
}
