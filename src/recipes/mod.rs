//! The recipes: each lock service the proxy offers beyond the plain lock, one folder each.
//!
//! A recipe's folder holds all of it, cut by role (docs/development.md, "The recipe pattern"):
//! `parse.rs` (its commands' table rows and parsers), `serve.rs` (what the proxy does for each
//! command), `engine.rs` (its part of the quorum engine: the acquisition it runs on every
//! master and how a master's reply votes), `names.rs` (its keys on the masters) and `lua.rs`
//! (the scripts the masters run for it), with the state a proxy keeps for it where it keeps
//! any (`ledger.rs`, `elections.rs`, `observers.rs`). The layer each role sits in is in
//! docs/development.md ("Layers"); `tests/layers.rs` holds every file to it.

// Every match on a recipe's enums names each variant (no `_ =>`).
#![cfg_attr(not(test), deny(clippy::wildcard_enum_match_arm))]

pub mod election;
pub mod lock;
pub mod multikey;
pub mod reentrant;
pub mod rwlock;
pub mod semaphore;
