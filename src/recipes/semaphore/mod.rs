//! Semaphores, `SEM.*`: a k-permit semaphore is k mutex slots, each taken by a majority as a
//! lock is (rule 14: a majority bounds one holder per slot, never a count of holders).

reads_client_input!(
    pub mod command;
);
pub mod engine;
pub mod ledger;
pub mod lua;
pub mod names;
reads_client_input!(
    pub mod parse;
);
pub mod serve;

pub use engine::{HeldPermit, Refusal, SemaphoreInfo, SlotTaken};
pub use ledger::Ledger;
pub use names::*;
