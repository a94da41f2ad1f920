//! Read-write locks, `RWLOCK.*`: many readers or one writer, each hold taken by a majority as a
//! fenced lock is (rule 14: reader–writer and writer–writer conflicts are pairs).

reads_client_input!(
    pub mod command;
);
pub mod engine;
pub mod lua;
pub mod names;
reads_client_input!(
    pub mod parse;
);
pub mod serve;

pub use engine::{Mode, RwInfo, RwTaken};
pub use names::*;
