//! Reentrant locks (`LOCK.ACQUIRE ... REENTRANT`): a hold is an identifier placed on a quorum,
//! a release gives one back, and the lock is freed with its last one. The argument is in
//! docs/recipes-quorum.md ("Reentrancy"). Its commands are the lock's (`crate::recipes::lock`).

pub mod engine;
pub mod lua;
pub mod serve;

pub use engine::{Holds, Reentry};
