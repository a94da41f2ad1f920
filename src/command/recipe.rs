//! The register of recipes: with the list of their rows in `super::table::TABLE` and their
//! `mod` lines in `crate::recipes`, the only place a recipe is named outside its folder
//! (docs/development.md, "The recipe pattern"). One line each: the variant of [`Recipe`] and its
//! typed command. From it come [`Recipe`], its [`Recipe::call`] and [`Recipe::serve`] (each a
//! match that names every recipe), [`named_key`] and [`queue_of`] (each asks every recipe). The
//! rows are listed apart because the parsers build a [`Recipe`]: listed here, this file and
//! theirs would import each other.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;

use super::call::{Call, LockOp, Serve};
use crate::recipes;

/// Declares [`Recipe`], its delegation to each recipe's command, and [`ROWS`], from one list.
macro_rules! register {
    ($($(#[doc = $doc:expr])* $variant:ident($command:ty);)*) => {
        /// A call of a recipe's native commands, typed in the recipe's folder
        /// (`recipes/*/command.rs`).
        #[derive(Clone, Debug, PartialEq)]
        pub enum Recipe {
            $($(#[doc = $doc])* $variant($command),)*
        }

        impl Recipe {
            /// What the connection, the session bounds and the limits ask of the call.
            pub fn call(&self) -> &dyn Call {
                match self {
                    $(Recipe::$variant(c) => c,)*
                }
            }

            /// The call's work on `host`, as the recipe serves it (its `serve.rs`).
            pub fn serve<H: ?Sized, Out>(
                self,
                host: &Arc<H>,
                db: u32,
                closed: &watch::Sender<bool>,
                metered: (&'static str, LockOp),
            ) -> Out
            where
                $($command: Serve<H, Out>,)*
            {
                match self {
                    $(Recipe::$variant(c) => c.serve(host, db, closed, metered),)*
                }
            }
        }

        /// The key a client named for a recipe's key on the masters (`Call::named_key`).
        pub fn named_key(key: &Bytes) -> Option<Bytes> {
            None$(.or_else(|| <$command as Call>::named_key(key)))*
        }

        /// The waiting line a release of `key` is queued under (`Call::queue_of`): the key
        /// itself unless a recipe names another.
        pub fn queue_of(key: &Bytes) -> Bytes {
            None$(.or_else(|| <$command as Call>::queue_of(key)))*.unwrap_or_else(|| key.clone())
        }
    };
}

register! {
    /// `LOCK.ACQUIRE | EXTEND | RELEASE | INFO | FENCE`: the native lock commands.
    Lock(recipes::lock::command::LockCmd);
    /// `SEM.ACQUIRE | EXTEND | RELEASE | INFO`: semaphores as k mutex slots.
    Sem(recipes::semaphore::command::SemCmd);
    /// `RWLOCK.READ | WRITE | EXTEND | RELEASE | INFO`: read-write locks.
    RwLock(recipes::rwlock::command::RwCmd);
    /// `ELECT.CAMPAIGN | LEADER | RESIGN | OBSERVE | UNOBSERVE`: leader election.
    Elect(recipes::election::command::ElectCmd);
    /// `LOCK.ACQUIREALL | RELEASEALL`: several locks at once.
    LockAll(recipes::multikey::command::LockAllCmd);
}
