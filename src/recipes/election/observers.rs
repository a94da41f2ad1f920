//! One connection's observations of elections (`ELECT.OBSERVE` on RESP3): the current leader
//! as the command's reply, then a push on every change, in the order the readings were taken.
//!
//! What a push means: "this was the leader a quorum held (or: nobody a quorum vouches for)
//! when it was read". It may be untrue by the time it is read, like any reply; the term tells
//! a newer leader from an older one, and a fenced resource refuses the older (F1–F5). The
//! rules kept here make the pushes of one connection never go back: each reading carries its
//! number ([`crate::recipes::election::Reading::seq`]), the reply is the first reading taken after the command
//! arrived, and a push is written only for a later reading that names another leader than the
//! one last told, never before the command's reply (held while the command is in flight).

use std::collections::HashMap;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;

use crate::error::ClientError;
use crate::recipes::election::{Reading, Seen};
use crate::reply::Reply;

/// The most elections one connection observes at once: each costs a task here, and each
/// election watched a reader of the masters in the proxy.
pub const MAX_OBSERVED: usize = 1024;

/// A reading forwarded to a connection.
#[derive(Debug)]
pub struct Observation {
    db: u32,
    name: Bytes,
    /// Which observation of the election it is for (one that ended may still have sent some).
    generation: u64,
    reading: Reading,
    /// The reading the `ELECT.OBSERVE` command answered.
    first: bool,
}

/// One election observed by the connection.
struct Observing {
    forwarder: AbortHandle,
    generation: u64,
    /// The number of the last reading told (as the reply or a push); 0 before the reply.
    seq: u64,
    /// The leader last told.
    told: Option<Seen>,
    /// The command's reply has been queued for writing: changes are pushed from then on.
    answered: bool,
    /// A change read before the command's reply was queued: pushed right after it.
    held: Option<Reading>,
}

/// The elections a connection observes.
#[derive(Default)]
pub struct Observers {
    /// Readings from the connection's forwarders; made with the first observation.
    channel: Option<(mpsc::UnboundedSender<Observation>, mpsc::UnboundedReceiver<Observation>)>,
    observing: HashMap<(u32, Bytes), Observing>,
    /// Observations started, to tell an ended one's readings from the current one's.
    generations: u64,
}

impl Observers {
    /// Observes election `name` through `readings` (subscribed when the command arrived, a new
    /// reading asked for): the command's future, answering the first reading taken after
    /// `readings`' current one.
    pub fn observe(
        &mut self,
        db: u32,
        name: Bytes,
        mut readings: watch::Receiver<Reading>,
        waiting: Option<crate::waiting::Waiting>,
    ) -> BoxFuture<'static, Reply> {
        let (tx, _) = self.channel.get_or_insert_with(mpsc::unbounded_channel);
        let tx = tx.clone();
        let (answer, answered) = oneshot::channel();
        let after = readings.borrow_and_update().seq;
        self.generations += 1;
        let generation = self.generations;
        let forwarded = name.clone();
        let forwarder = tokio::spawn(async move {
            // Counted (`crate::waiting`) while this observation lasts: the task holds it.
            let _waiting = waiting;
            // The first reading taken after the command arrived is the reply.
            let first = loop {
                if readings.changed().await.is_err() {
                    return;
                }
                let reading = readings.borrow_and_update().clone();
                if reading.seq > after {
                    break reading;
                }
            };
            let _ = answer.send(first.reply());
            let mut first = Some(first);
            loop {
                let reading = match first.take() {
                    Some(reading) => (reading, true),
                    None => {
                        if readings.changed().await.is_err() {
                            return;
                        }
                        (readings.borrow_and_update().clone(), false)
                    }
                };
                let observation = Observation {
                    db,
                    name: forwarded.clone(),
                    generation,
                    reading: reading.0,
                    first: reading.1,
                };
                if tx.send(observation).is_err() {
                    return;
                }
            }
        })
        .abort_handle();
        let before = self.observing.insert(
            (db, name),
            Observing {
                forwarder,
                generation,
                seq: 0,
                told: None,
                answered: false,
                held: None,
            },
        );
        if let Some(before) = before {
            before.forwarder.abort();
        }
        Box::pin(async move {
            answered
                .await
                .unwrap_or_else(|_| Reply::error("ERR the election's reader ended"))
        })
    }

    /// Whether one more election may be observed: within [`MAX_OBSERVED`], checked before
    /// anything is started (observing one already observed again is always admitted).
    pub fn admit(&self, db: u32, name: &Bytes) -> Result<(), ClientError> {
        if self.observing.len() >= MAX_OBSERVED && !self.observing.contains_key(&(db, name.clone())) {
            return Err(ClientError::Unsupported(format!(
                "too many elections observed by this connection ({MAX_OBSERVED}): ELECT.UNOBSERVE one first"
            )));
        }
        Ok(())
    }

    /// `ELECT.UNOBSERVE`: 1 when the election was observed, else 0. No push for it follows.
    pub fn unobserve(&mut self, db: u32, name: &Bytes) -> Reply {
        match self.observing.remove(&(db, name.clone())) {
            Some(gone) => {
                gone.forwarder.abort();
                Reply::Int(1)
            }
            None => Reply::Int(0),
        }
    }

    /// Ends every observation (`RESET`).
    pub fn clear(&mut self) {
        for (_, gone) in self.observing.drain() {
            gone.forwarder.abort();
        }
    }

    /// The next reading forwarded (never, while nothing is observed).
    pub async fn next(&mut self) -> Observation {
        match &mut self.channel {
            Some((_, rx)) => match rx.recv().await {
                Some(observation) => observation,
                // This holds a sender itself: the channel does not close.
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// A reading forwarded: the push to write now, if any. Before the `ELECT.OBSERVE` reply is
    /// queued (a command before it on the connection may still be in flight), a change is
    /// held, for [`Observers::answered`].
    pub fn seen(&mut self, observation: Observation) -> Option<Reply> {
        let id = (observation.db, observation.name);
        let entry = self.observing.get_mut(&id)?;
        if entry.generation != observation.generation {
            return None;
        }
        if observation.first {
            if let Ok(told) = &observation.reading.leader {
                entry.seq = observation.reading.seq;
                entry.told = told.clone();
                return None;
            }
            // No quorum answered: the command answered the error, and observes nothing.
            if let Some(gone) = self.observing.remove(&id) {
                gone.forwarder.abort();
            }
            return None;
        }
        if !entry.answered {
            entry.held = Some(observation.reading);
            return None;
        }
        entry.tell(&id.1, observation.reading)
    }

    /// The `ELECT.OBSERVE` reply for `id` (database, election) is queued: pushes follow it
    /// from now on; the change held meanwhile, if any, is the push to queue right after it.
    pub fn answered(&mut self, id: &(u32, Bytes)) -> Option<Reply> {
        let entry = self.observing.get_mut(id)?;
        entry.answered = true;
        let held = entry.held.take()?;
        entry.tell(&id.1, held)
    }
}

impl Observing {
    /// The push for `reading`, if it is newer than what was told and names another leader:
    /// `["leader", election, value, term]`, with nil value and term for "no leader". A reading
    /// without a quorum's answer tells nothing (it cannot say who leads).
    fn tell(&mut self, name: &Bytes, reading: Reading) -> Option<Reply> {
        if self.seq == 0 || reading.seq <= self.seq {
            return None;
        }
        let Ok(leader) = reading.leader else {
            return None;
        };
        self.seq = reading.seq;
        if leader == self.told {
            return None;
        }
        self.told = leader.clone();
        let (value, term) = match leader {
            Some(l) => (
                Reply::Bulk(l.value),
                Reply::Int(i64::try_from(l.term).unwrap_or(i64::MAX)),
            ),
            None => (Reply::Nil, Reply::Nil),
        };
        Some(Reply::Push(vec![
            Reply::bulk("leader"),
            Reply::Bulk(name.clone()),
            value,
            term,
        ]))
    }
}

impl Drop for Observers {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(seq: u64, leader: Option<(&str, u64)>) -> Reading {
        Reading {
            seq,
            leader: Ok(leader.map(|(v, term)| Seen {
                value: Bytes::copy_from_slice(v.as_bytes()),
                term,
            })),
        }
    }

    #[tokio::test]
    async fn the_reply_first_then_changes_in_order_never_an_older_one() {
        let (tx, rx) = watch::channel(reading(3, Some(("a", 1))));
        let mut o = Observers::default();
        let name = Bytes::from_static(b"e");
        let reply = o.observe(0, name.clone(), rx, None);
        tx.send_replace(reading(4, Some(("a", 1))));
        assert_eq!(
            reply.await,
            Reply::Array(vec![Reply::bulk("a"), Reply::Int(1)]),
            "a reading taken after the command"
        );
        let first = o.next().await;
        assert!(first.first);
        assert_eq!(o.seen(first), None);
        tx.send_replace(reading(5, Some(("b", 2))));
        let change = o.next().await;
        // Until the command's reply is queued, the change waits for it.
        assert_eq!(o.seen(change), None);
        assert_eq!(
            o.answered(&(0, name.clone())),
            Some(Reply::Push(vec![
                Reply::bulk("leader"),
                Reply::bulk("e"),
                Reply::bulk("b"),
                Reply::Int(2)
            ]))
        );
        tx.send_replace(reading(6, Some(("c", 3))));
        let change = o.next().await;
        assert!(o.seen(change).is_some(), "pushed at once after the reply");
        // An older reading, or the same leader again, tells nothing; no leader is a nil push.
        let entry = o.observing.get_mut(&(0, name.clone())).unwrap();
        assert_eq!(entry.tell(&name, reading(4, Some(("a", 1)))), None);
        assert_eq!(entry.tell(&name, reading(7, Some(("c", 3)))), None);
        assert_eq!(
            entry.tell(&name, reading(8, None)),
            Some(Reply::Push(vec![
                Reply::bulk("leader"),
                Reply::bulk("e"),
                Reply::Nil,
                Reply::Nil
            ]))
        );
        assert_eq!(o.unobserve(0, &name), Reply::Int(1));
        assert_eq!(o.unobserve(0, &name), Reply::Int(0));
    }

    #[tokio::test]
    async fn a_connection_observes_a_bounded_number_of_elections() {
        let (_tx, rx) = watch::channel(reading(0, None));
        let mut o = Observers::default();
        for i in 0..MAX_OBSERVED {
            let name = Bytes::from(format!("e{i}"));
            assert!(o.admit(0, &name).is_ok());
            drop(o.observe(0, name, rx.clone(), None));
        }
        assert!(o.admit(0, &Bytes::from_static(b"one more")).is_err());
        assert!(o.admit(0, &Bytes::from_static(b"e7")).is_ok(), "again: no more");
        assert!(o.admit(1, &Bytes::from_static(b"e7")).is_err(), "per database");
        o.clear();
        assert!(o.admit(0, &Bytes::from_static(b"one more")).is_ok());
    }
}
