//! Rule 8 for the shards of a new slot map: a shard whose master changed (a promoted replica,
//! or a master whose replication history changed) is quarantined before the map is used.

use super::ClusterBackend;
use super::slots::{Map, Shard};

impl ClusterBackend {
    /// Rule 8 for one shard of a new map: its master is quarantined from now when it was no
    /// master in the previous map (a promoted replica), or when its replication id changed
    /// since it was last asked (it was a replica in between, and took its data from a master
    /// that may have lacked the last writes). The first map has no previous one: each master
    /// is judged as any master first seen (`Health::observed`, when its connection opened).
    pub(super) async fn judge(&self, shard: &Shard, previous: &Map) {
        let key = shard.addr.to_string();
        let replid = shard.node.replication_id().await;
        let before = {
            let mut replids = self.replids.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match &replid {
                Some(id) => replids.insert(key.clone(), id.clone()),
                None => replids.get(&key).cloned(),
            }
        };
        if previous.generation == 0 {
            return;
        }
        let was_master = previous.node_at(&shard.addr).is_some();
        let history_changed = matches!((&before, &replid), (Some(b), Some(r)) if b != r);
        if !was_master || history_changed {
            let (start, _) = shard.ranges.first().copied().unwrap_or_default();
            let from = previous
                .shard(start)
                .map_or_else(|| "none".to_owned(), |s| s.addr.to_string());
            shard.node.health().switched(&from, &key);
        }
    }
}
