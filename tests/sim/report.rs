//! What runs came to: per seed, and summed over many seeds.

use std::time::Duration;

/// Counters of what was checked and injected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Uncontended acquisitions made with a quorum of good masters (property 3).
    pub liveness_checks: u64,
    /// Failed acquisitions under clean conditions, checked to leave nothing behind.
    pub clean_failures: u64,
    /// Masters checked to be free of a token after a release they answered.
    pub released_masters: u64,
    /// Masters a release did not reach (down, quarantined, cut off, too slow) that still
    /// held the token afterwards: keys left to expire by their TTL. Not a failure (rule 3
    /// lets a dead master cost one timeout, not a retry), but worth watching.
    pub unreleased: u64,
    /// Master crashes (each followed by a restart without persistence).
    pub crashes: u64,
    /// Failovers of a master to a replica that missed some writes.
    pub failovers: u64,
    /// Network partitions of one master.
    pub partitions: u64,
    /// Stormy spells.
    pub storms: u64,
    /// Worst-moment restarts by the nemesis.
    pub worst_moments: u64,
    /// Messages lost on the wire.
    pub lost: u64,
    /// Grants whose reply waited past their validity and became a refusal (rule 4a).
    pub stale_replies: u64,
    /// Holders that re-sent their acquisition with their own token (rule 5a).
    pub resends: u64,
    /// Semaphore permits granted (each also counted among the grants).
    pub permits: u64,
    /// Read holds of a read-write lock granted.
    pub read_holds: u64,
    /// Write holds of a read-write lock granted.
    pub write_holds: u64,
    /// Sets of several locks granted at once (each key also counted among the grants).
    pub lock_sets: u64,
    /// Leaderships won by campaigning.
    pub leaderships: u64,
    /// Reentrant locks taken (first holds), and the count-ups of their holders.
    pub reentrant_holds: u64,
    pub reentries: u64,
    /// Session locks kept by extensions (rules 16 and 17), and the extensions a quorum
    /// confirmed (each also heals the lock onto the voting masters that lack it).
    pub sessions: u64,
    pub session_extensions: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.liveness_checks += other.liveness_checks;
        self.clean_failures += other.clean_failures;
        self.released_masters += other.released_masters;
        self.unreleased += other.unreleased;
        self.crashes += other.crashes;
        self.failovers += other.failovers;
        self.partitions += other.partitions;
        self.storms += other.storms;
        self.worst_moments += other.worst_moments;
        self.lost += other.lost;
        self.stale_replies += other.stale_replies;
        self.resends += other.resends;
        self.permits += other.permits;
        self.read_holds += other.read_holds;
        self.write_holds += other.write_holds;
        self.lock_sets += other.lock_sets;
        self.leaderships += other.leaderships;
        self.reentrant_holds += other.reentrant_holds;
        self.reentries += other.reentries;
        self.sessions += other.sessions;
        self.session_extensions += other.session_extensions;
    }
}

/// One seed's run.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed that replays it.
    pub seed: u64,
    /// Acquire and release calls made.
    pub ops: u64,
    /// Acquisitions granted.
    pub grants: u64,
    /// Property 1's violations, each naming the seed.
    pub violations: Vec<String>,
    /// The other properties' failures, each naming the seed.
    pub failures: Vec<String>,
    /// Fencing tokens handed out.
    pub fences: u64,
    /// Property 5's violations: tokens not above an earlier one.
    pub fence_violations: Vec<String>,
    /// What was checked and injected.
    pub tally: Tally,
    /// Simulated time the run covered.
    pub sim_time: Duration,
    /// A hash of the run's history: equal for two runs of one seed.
    pub fingerprint: u64,
    /// Every event, when the run was traced.
    pub trace: Vec<String>,
}

/// Many seeds' runs.
#[derive(Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Operations in all.
    pub ops: u64,
    /// Grants in all.
    pub grants: u64,
    /// Property 1's violations in all.
    pub violations: Vec<String>,
    /// Other failures in all.
    pub failures: Vec<String>,
    /// Fencing tokens in all.
    pub fences: u64,
    /// Property 5's violations in all.
    pub fence_violations: Vec<String>,
    /// Seeds that showed at least one violation.
    pub violating_seeds: Vec<u64>,
    /// Counters summed.
    pub tally: Tally,
    /// Simulated time summed.
    pub sim_time: Duration,
    /// Real time taken.
    pub wall: Duration,
}

impl Summary {
    /// Adds one seed's report.
    pub fn add(&mut self, report: &Report) {
        self.seeds += 1;
        self.ops += report.ops;
        self.grants += report.grants;
        self.violations.extend(report.violations.iter().cloned());
        self.failures.extend(report.failures.iter().cloned());
        self.fences += report.fences;
        self.fence_violations.extend(report.fence_violations.iter().cloned());
        if !report.violations.is_empty() {
            self.violating_seeds.push(report.seed);
        }
        self.tally.add(&report.tally);
        self.sim_time += report.sim_time;
    }

    /// The one-line account printed at the end of every run.
    pub fn line(&self, name: &str) -> String {
        let t = &self.tally;
        format!(
            "simulation {name}: seeds={} operations={} grants={} violations={} (seeds {:?}) failures={} \
             fencing tokens={} fencing violations={} | \
             liveness checks={} clean failed acquisitions={} released masters checked={} left to expire={} | \
             crashes={} failovers={} partitions={} storms={} worst-moment restarts={} lost messages={} | \
             stale replies undone={} re-sends by holders={} | semaphore permits={} read holds={} \
             write holds={} lock sets={} leaderships={} reentrant locks={} count-ups={} \
             sessions={} session extensions={} | \
             simulated {:.0}s in {:.2}s real",
            self.seeds,
            self.ops,
            self.grants,
            self.violations.len(),
            self.violating_seeds,
            self.failures.len(),
            self.fences,
            self.fence_violations.len(),
            t.liveness_checks,
            t.clean_failures,
            t.released_masters,
            t.unreleased,
            t.crashes,
            t.failovers,
            t.partitions,
            t.storms,
            t.worst_moments,
            t.lost,
            t.stale_replies,
            t.resends,
            t.permits,
            t.read_holds,
            t.write_holds,
            t.lock_sets,
            t.leaderships,
            t.reentrant_holds,
            t.reentries,
            t.sessions,
            t.session_extensions,
            self.sim_time.as_secs_f64(),
            self.wall.as_secs_f64()
        )
    }
}
