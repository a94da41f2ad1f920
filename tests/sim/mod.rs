//! A deterministic simulation of the Redlock quorum engine.
//!
//! The real [`redlock_proxy::quorum::Engine`] runs against simulated masters (the crate's
//! in-process master, each on a clock drifting within the engine's allowance) over simulated
//! links that delay, lose and reorder nothing they should not (a link is one FIFO
//! connection), on tokio's paused clock in a current-thread runtime. Every random choice
//! comes from one seed, so a failing seed replays the same run, event for event.

pub mod check;
pub mod clock;
pub mod config;
pub mod faults;
pub mod link;
pub mod master;
pub mod recipes;
pub mod report;
pub mod rng;
pub mod run;
pub mod scenario;
pub mod world;
