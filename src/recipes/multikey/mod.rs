//! Several locks at once, `LOCK.ACQUIREALL` and `LOCK.RELEASEALL`: every key of a set or none,
//! each with its own fencing token. The argument is in docs/recipes-quorum.md ("Several locks
//! at once").

reads_client_input!(
    pub mod command;
);
pub mod engine;
pub mod lua;
reads_client_input!(
    pub mod parse;
);
pub mod serve;

pub use engine::{AllFenced, SetAnnouncement};
