//! The fault injector's background actors: crashes and restarts, partitions, storms. Each
//! stops acting once the run winds down (the world then heals everything itself).

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
