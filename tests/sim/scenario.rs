//! Scripted scenarios on the same simulated world: faults placed by hand, to show one
//! behaviour exactly.

use std::sync::Arc;

use redlock_proxy::backend::health::QuarantineMode;
use tokio::time::sleep;

use super::config::Config;
use super::report::Report;
use super::rng::Rng;
use super::run::{Proxy, acquire, runtime};
use super::world::World;

/// Rule 8's scenario at its worst: A's lock sits on exactly a bare majority (m0, m1 of three:
/// m2 was cut off while A acquired); m1 restarts empty while A still holds it; B then tries,
/// up to three times. Without the quarantine, m1 and m2 grant B the lock A holds.
pub fn restart_under_a_bare_majority(mode: QuarantineMode) -> Report {
    under_a_bare_majority(mode, |world| {
        world.crash(1);
        world.restart(1);
    })
}

/// The same with a failover in place of the restart: m1 is replaced by a replica that missed
/// A's grant (it has every other key) and has run for an hour. Its uptime says it has not
/// restarted, yet it lacks A's key: only a quarantine counted from when the proxy sees the
/// new process keeps it from granting B the lock A holds.
pub fn failover_under_a_bare_majority(mode: QuarantineMode) -> Report {
    under_a_bare_majority(mode, |world| world.fail_over(1, |key| key != b"lock:0"))
}

/// A takes `lock:0` on exactly m0 and m1 of three, `lose` makes m1 lose it while A holds it,
/// and B tries, up to three times.
fn under_a_bare_majority(mode: QuarantineMode, lose: impl FnOnce(&World)) -> Report {
    let mut cfg = Config::scripted(3, mode);
    cfg.trace = true;
    runtime().block_on(async move {
        let mut rng = Rng::new(1);
        let world = Arc::new(World::new(cfg, rng.fork()));
        let proxy = Proxy::start(&world, 0, mode, &mut rng);
        let ttl = world.cfg.max_ttl;
        // The masters have run longer than the quarantine (mode `Always` holds back masters
        // it first sees with a shorter uptime).
        sleep(world.cfg.quarantine()).await;
        world.partition(2, true);
        let a = acquire(&world, &proxy, "lock:0", "A", ttl).await;
        world.partition(2, false);
        if a.held.is_none() {
            world.fail(format!("A was refused: {:?}", a.result));
        }
        lose(&world);
        // B's first try finds the proxy's connection to m1 broken (the old process is gone);
        // its second reconnects, and reading m1's identity then is where rule 8 steps in.
        for attempt in 0..3 {
            let b = acquire(&world, &proxy, "lock:0", &format!("B{attempt}"), ttl).await;
            if b.held.is_some() {
                break;
            }
            sleep(world.cfg.timeout).await;
        }
        world.report()
    })
}

/// Property 3 in its plainest form: `down` of `masters` masters crashed, the network calm:
/// an uncontended acquisition is granted.
pub fn acquire_with_masters_down(masters: usize, down: usize) -> Report {
    let cfg = Config::scripted(masters, QuarantineMode::Restarts);
    runtime().block_on(async move {
        let mut rng = Rng::new(2);
        let world = Arc::new(World::new(cfg, rng.fork()));
        let proxy = Proxy::start(&world, 0, QuarantineMode::Restarts, &mut rng);
        for i in 0..down {
            world.crash(i);
        }
        let attempt = acquire(&world, &proxy, "lock:0", "A", world.cfg.max_ttl).await;
        if attempt.held.is_none() {
            world.fail(format!(
                "{down} of {masters} masters down, calm network: uncontended acquire answered {:?}",
                attempt.result
            ));
        }
        world.report()
    })
}
