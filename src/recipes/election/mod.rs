//! Leader election, `ELECT.*`: leadership is a session lock on one reserved key of the
//! election, taken by the fenced acquisition; its term is the grant's fencing token.

reads_client_input!(
    pub mod command;
);
pub mod elections;
pub mod engine;
pub mod names;
pub mod observers;
reads_client_input!(
    pub mod parse;
);
pub mod serve;

pub use elections::*;
pub use engine::Leader;
pub use names::{PREFIX, lock_key, name_of};
