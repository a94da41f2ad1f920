//! The fault injector's background actors: crashes and restarts, failovers, partitions,
//! storms. Each stops acting once the run winds down (the world then heals everything itself).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;

use super::rng::Rng;
use super::world::World;

/// Starts every fault actor the configuration asks for.
pub fn spawn(world: &Arc<World>, rng: &mut Rng) {
    for i in 0..world.masters.len() {
        if let Some(gap) = world.cfg.faults.crash_gap {
            tokio::spawn(crashes(world.clone(), i, gap, rng.fork()));
        }
        if let Some(gap) = world.cfg.faults.partition_gap {
            tokio::spawn(partitions(world.clone(), i, gap, rng.fork()));
        }
    }
    if world.cfg.faults.storms {
        tokio::spawn(weather(world.clone(), rng.fork()));
    }
    if let Some(gap) = world.cfg.faults.failover_gap {
        for i in 0..world.masters.len() {
            tokio::spawn(failovers(world.clone(), i, gap, rng.fork()));
        }
    }
}

/// A gap of `mean` on average, from half to one and a half times it.
fn around(rng: &mut Rng, mean: Duration) -> Duration {
    rng.between(mean / 2, mean * 3 / 2)
}

/// Master `i` crashes now and then, stays down for up to a TTL, and restarts empty.
async fn crashes(world: Arc<World>, i: usize, gap: Duration, mut rng: Rng) {
    loop {
        sleep(around(&mut rng, gap)).await;
        if world.stopped() {
            return;
        }
        world.crash(i);
        sleep(rng.between(Duration::ZERO, world.cfg.max_ttl)).await;
        world.restart(i);
    }
}

/// Master `i` fails over now and then to a replica that missed about half the keys.
async fn failovers(world: Arc<World>, i: usize, gap: Duration, mut rng: Rng) {
    loop {
        sleep(around(&mut rng, gap)).await;
        if world.stopped() {
            return;
        }
        world.fail_over(i, keeps_half(rng.next_u64()));
    }
}

/// Which keys a replica received, drawn from `salt`: about half of them, each decided by the
/// key alone, so that the choice does not depend on the order the keyspace is walked in (a
/// hash map's, which differs from run to run) and a seed replays exactly.
pub fn keeps_half(salt: u64) -> impl FnMut(&[u8]) -> bool {
    move |key| {
        // FNV-1a over the key, then one SplitMix64 step to spread it.
        let hash = key.iter().fold(salt ^ 0xCBF2_9CE4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
        });
        Rng::new(hash).next_u64() & 1 == 0
    }
}

/// Master `i` is cut off the network now and then, for between a timeout and a TTL.
async fn partitions(world: Arc<World>, i: usize, gap: Duration, mut rng: Rng) {
    loop {
        sleep(around(&mut rng, gap)).await;
        if world.stopped() {
            return;
        }
        world.partition(i, true);
        sleep(rng.between(world.cfg.timeout, world.cfg.max_ttl)).await;
        world.partition(i, false);
    }
}

/// Calm and stormy spells alternate.
async fn weather(world: Arc<World>, mut rng: Rng) {
    let ttl = world.cfg.max_ttl;
    loop {
        sleep(rng.between(ttl, ttl * 5)).await;
        if world.stopped() {
            return;
        }
        world.storm(true);
        sleep(rng.between(ttl / 2, ttl * 3)).await;
        world.storm(false);
    }
}
