//! Where a request goes within the cluster, and the redirections a shard answers: the route
//! from a command's keys, the sends to one shard, any shard or every shard, and the following
//! of `MOVED` and `ASK`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::ClusterBackend;
use super::slots::common_slot;
use crate::backend::health::State;
use crate::backend::locate::Addr;
use crate::backend::{Answer, BackendError, Place, Request, Sink};
use crate::protocol::Upper;
use crate::reply::Reply;

/// How many redirections one request may follow before it counts as failed (a map still
/// moving: the next request tries again with a newer one).
const MAX_HOPS: u8 = 3;

/// Where a request goes within the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// To the shard serving this slot.
    Slot(u16),
    /// To any one shard (a command without keys: `PUBLISH` reaches every node of a cluster).
    Any,
    /// To every shard (scripts are cached per node; a flush flushes all).
    All,
    /// Nowhere: its keys are in different slots.
    CrossSlot,
}

/// The route of a command, from where its keys are.
pub(super) fn route(args: &[Bytes]) -> Route {
    let Some(name) = args.first() else { return Route::Any };
    // Upper-cased on the stack: this runs for every request to a cluster member.
    let name = Upper::of(name);
    let keys: &[Bytes] = match &*name {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            let n = args.get(2).and_then(|n| crate::protocol::whole_number(n)).unwrap_or(0);
            usize::try_from(n).ok().and_then(|n| args.get(3..3 + n)).unwrap_or(&[])
        }
        b"DEL" | b"UNLINK" | b"EXISTS" | b"MGET" | b"TOUCH" | b"WATCH" => &args[1..],
        b"SCRIPT" | b"FLUSHDB" | b"FLUSHALL" | b"FUNCTION" => return Route::All,
        b"PUBLISH" | b"SCAN" | b"PING" | b"INFO" | b"DBSIZE" | b"ECHO" | b"TIME" | b"KEYS" | b"RANDOMKEY" => {
            return Route::Any;
        }
        _ => args.get(1..2).unwrap_or(&[]),
    };
    match common_slot(keys.iter().map(|k| &k[..])) {
        Ok(Some(s)) => Route::Slot(s),
        Ok(None) => Route::Any,
        Err(_) => Route::CrossSlot,
    }
}

/// A redirection a shard answered.
#[derive(Debug, PartialEq, Eq)]
enum Redirection {
    /// `MOVED slot host:port`: the slot is served elsewhere now; the map is out of date.
    Moved,
    /// `ASK slot host:port`: the slot is migrating and this key is at `host:port` already.
    Ask(Addr),
}

impl Redirection {
    fn parse(error: &[u8]) -> Option<Redirection> {
        let text = std::str::from_utf8(error).ok()?;
        let mut words = text.split(' ');
        let kind = words.next()?;
        let _slot = words.next()?;
        let addr = Addr::parse(words.next()?)?;
        match kind {
            "MOVED" => Some(Redirection::Moved),
            "ASK" => Some(Redirection::Ask(addr)),
            _ => None,
        }
    }
}

impl ClusterBackend {
    /// To the master of slot `s`, as the map says now; a redirection is followed from there.
    pub(super) fn send_to_slot(
        self: &Arc<Self>,
        s: u16,
        request: &Request,
        fallback: Option<&Request>,
        place: Place,
        hops: u8,
    ) {
        let map = self.map();
        let Some(shard) = map.shard(s) else {
            return place.complete(Err(BackendError::Io(format!("no master serves slot {s}"))));
        };
        let redirect = self.redirect(request, fallback, place, hops);
        shard.node.send(request, fallback, redirect);
    }

    /// To the first shard that is up (or the first shard).
    pub(super) fn send_to_any(&self, request: &Request, fallback: Option<&Request>, place: Place) {
        let map = self.map();
        let up = map.shards.iter().find(|s| s.node.health().state() == State::Up);
        match up.or(map.shards.first()) {
            Some(shard) => shard.node.send(request, fallback, place),
            None => place.complete(Err(BackendError::Down)),
        }
    }

    /// To every shard; the answer is the first failure, else the first shard's.
    pub(super) fn send_to_all(&self, request: &Request, fallback: Option<&Request>, place: Place) {
        let map = self.map();
        if map.shards.is_empty() {
            return place.complete(Err(BackendError::Down));
        }
        let gather = Arc::new(Gather {
            place: Pending::new(place),
            answers: Mutex::new(vec![None; map.shards.len()]),
            left: AtomicUsize::new(map.shards.len()),
        });
        for (i, shard) in map.shards.iter().enumerate() {
            shard.node.send(request, fallback, Place::new(gather.clone(), i));
        }
    }

    /// A place that hands the shard's answer on, or follows the redirection it is.
    fn redirect(self: &Arc<Self>, request: &Request, fallback: Option<&Request>, place: Place, hops: u8) -> Place {
        let sink = Arc::new(Redirect {
            member: self.clone(),
            request: request.clone(),
            fallback: fallback.cloned(),
            place: Pending::new(place),
            hops,
        });
        Place::new(sink, 0)
    }

    /// Follows `redirection`. `MOVED`: the map is out of date; the request waits for a new
    /// one and goes where it says, never straight to the node `MOVED` names: that node may be
    /// a replica promoted a moment ago, which must be quarantined before it votes (rule 8),
    /// and only reading the map decides that. `ASK`: the key is at a master of the current
    /// map already (a slot being migrated between two trusted masters): sent there, after
    /// `ASKING`.
    fn follow(self: &Arc<Self>, redirection: Redirection, sink: &Redirect, place: Place) {
        let hops = sink.hops + 1;
        if hops > MAX_HOPS {
            let why = format!("still redirected after {MAX_HOPS} redirections");
            return place.complete(Err(BackendError::Io(why)));
        }
        let (request, fallback) = (sink.request.clone(), sink.fallback.clone());
        match redirection {
            Redirection::Moved => {
                let member = self.clone();
                tokio::spawn(async move {
                    member.newer_map().await;
                    match route(&request.args) {
                        Route::Slot(s) if place.is_open() => {
                            member.send_to_slot(s, &request, fallback.as_ref(), place, hops);
                        }
                        _ => place.complete(Err(BackendError::Io("moved".into()))),
                    }
                });
            }
            Redirection::Ask(addr) => {
                let map = self.map();
                let Some(node) = map.node_at(&addr) else {
                    self.wake.notify_one();
                    let why = format!("asked to go to {addr}, which is no master in the slot map");
                    return place.complete(Err(BackendError::Io(why)));
                };
                let redirect = self.redirect(&request, fallback.as_ref(), place, hops);
                node.send_asking(&request, fallback.as_ref(), redirect);
            }
        }
    }

    /// Asks for a new map and waits until one is read (at most a request timeout).
    async fn newer_map(&self) {
        let mut generation = self.generation.subscribe();
        let seen = *generation.borrow_and_update();
        self.wake.notify_one();
        let newer = generation.wait_for(|g| *g > seen);
        let _ = tokio::time::timeout(self.settings.request_timeout, newer).await;
    }
}

/// The fan-out's place, held until a shard's answer is handed on (once).
struct Pending(Mutex<Option<Place>>);

impl Pending {
    fn new(place: Place) -> Pending {
        Pending(Mutex::new(Some(place)))
    }

    fn take(&self) -> Option<Place> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    fn is_open(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(Place::is_open)
    }
}

/// Where a shard's answer goes: on to the fan-out's place, unless it is a redirection.
struct Redirect {
    member: Arc<ClusterBackend>,
    request: Request,
    fallback: Option<Request>,
    place: Pending,
    hops: u8,
}

impl Sink for Redirect {
    fn complete(&self, _: usize, answer: Answer) {
        let Some(place) = self.place.take() else {
            return;
        };
        if let Ok(Reply::Error(error)) = &answer
            && let Some(redirection) = Redirection::parse(error)
        {
            return self.member.follow(redirection, self, place);
        }
        place.complete(answer);
    }

    fn is_open(&self, _: usize) -> bool {
        self.place.is_open()
    }
}

/// Collects every shard's answer to a request sent to all; completes the fan-out's place
/// with the first failure, or else the first shard's answer.
struct Gather {
    place: Pending,
    answers: Mutex<Vec<Option<Answer>>>,
    left: AtomicUsize,
}

impl Sink for Gather {
    fn complete(&self, index: usize, answer: Answer) {
        let mut answers = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = answers.get_mut(index) {
            *entry = Some(answer);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let answers = std::mem::take(&mut *answers);
        let failed = answers
            .iter()
            .flatten()
            .find(|a| matches!(a, Err(_) | Ok(Reply::Error(_))))
            .cloned();
        let first = answers.into_iter().flatten().next();
        let answer = failed.or(first).unwrap_or(Err(BackendError::Down));
        if let Some(place) = self.place.take() {
            place.complete(answer);
        }
    }

    fn is_open(&self, _: usize) -> bool {
        self.place.is_open()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cluster::slot;

    fn args(words: &[&str]) -> Vec<Bytes> {
        words.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    #[test]
    fn routes() {
        assert_eq!(route(&args(&["SET", "foo", "v", "NX"])), Route::Slot(12182));
        assert_eq!(
            route(&args(&["evalsha", "x", "2", "{a}1", "{a}2", "t"])),
            Route::Slot(slot(b"a"))
        );
        assert_eq!(route(&args(&["EVAL", "x", "2", "foo", "bar"])), Route::CrossSlot);
        assert_eq!(route(&args(&["EVAL", "x", "0"])), Route::Any);
        assert_eq!(route(&args(&["DEL", "foo", "bar"])), Route::CrossSlot);
        assert_eq!(route(&args(&["SCRIPT", "LOAD", "x"])), Route::All);
        assert_eq!(route(&args(&["PUBLISH", "c", "m"])), Route::Any);
    }

    #[test]
    fn redirections() {
        assert_eq!(
            Redirection::parse(b"MOVED 3999 127.0.0.1:6381"),
            Some(Redirection::Moved)
        );
        assert_eq!(
            Redirection::parse(b"ASK 3999 127.0.0.1:6381"),
            Some(Redirection::Ask(Addr {
                host: "127.0.0.1".into(),
                port: 6381
            }))
        );
        assert_eq!(Redirection::parse(b"ERR MOVED"), None);
        assert_eq!(Redirection::parse(b"WRONGTYPE Operation"), None);
    }
}
