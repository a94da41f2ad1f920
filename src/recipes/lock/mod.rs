//! The lock: `SET key token NX PX ms` and its legacy forms (`SETNX`, `GETSET`, `DELEX`), the key
//! commands decided by a majority, and the native `LOCK.*` family for new code (fenced,
//! reentrant, waiting, kept alive). The engine's part is the quorum engine itself
//! ([`crate::quorum`]): the plain and the fenced acquisition are what every other recipe builds on.

reads_client_input!(
    pub mod command;
);
reads_client_input!(
    pub mod parse;
);
reads_client_input!(
    pub mod parse_native;
);
pub mod serve;
