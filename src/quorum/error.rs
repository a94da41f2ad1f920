//! What the quorum layer answers when it cannot decide: too few masters could vote
//! ([`NoQuorum`]), or too few could vouch for their fencing counters ([`Unfenced`]). Both are
//! told to a client as `-NOQUORUM ...`: the text is theirs, the conversion into a client's
//! reply is made above, in the proxy, which uses this layer.

use std::time::Duration;

use crate::backend::{Answer, BackendError};
use crate::reply::Reply;

/// The lock service could not decide: fewer than a quorum of masters could vote. The reply
/// says why the others could not, so a client's error is enough to tell a newcomer's
/// quarantined masters from a dead network (`PROXY BACKENDS` has the details).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NoQuorum {
    /// Masters that gave a reply that counts (for an acquisition: a grant or a refusal).
    pub answered: usize,
    /// All configured masters.
    pub total: usize,
    /// Masters quarantined after a (possible) restart (rule 8).
    pub quarantined: usize,
    /// The shortest quarantine left among them.
    pub votes_again_in: Option<Duration>,
    /// Masters known to be down (nothing was sent).
    pub down: usize,
    /// Masters that are another member's server under a second URL (rule 15; nothing sent).
    pub duplicates: usize,
    /// Masters whose wall clock was just seen to have jumped ahead (rule 15): their answers
    /// are no votes, and they are quarantined from now on.
    pub clocks_ahead: usize,
    /// Masters that did not answer within `backend_timeout_ms`, or whose connection failed.
    pub no_reply: usize,
    /// Masters that answered an error reply (`OOM`, `NOPERM`, `READONLY`, ...): a failure, not
    /// a vote (rule 5a).
    pub errors: usize,
    /// The first of those errors, to show the client.
    pub error: Option<String>,
    /// The legacy member's name, when it is the one that could not decide (its answer is the
    /// only one counted above): a bridged key is granted only with its agreement.
    pub legacy: Option<Box<str>>,
}

impl NoQuorum {
    /// Why fewer than a quorum of `answers` could vote; `votes(reply)` says whether a reply
    /// counts.
    pub fn of<'a>(answers: impl IntoIterator<Item = &'a Answer>, votes: impl Fn(&Reply) -> bool) -> NoQuorum {
        let mut why = NoQuorum::default();
        for answer in answers {
            why.total += 1;
            match answer {
                Ok(reply) if votes(reply) => why.answered += 1,
                Ok(reply) => {
                    why.errors += 1;
                    if why.error.is_none() {
                        why.error = Some(reply_text(reply));
                    }
                }
                Err(BackendError::Quarantined { remaining }) => {
                    why.quarantined += 1;
                    why.votes_again_in = Some(why.votes_again_in.map_or(*remaining, |r| r.min(*remaining)));
                }
                Err(BackendError::Down) => why.down += 1,
                Err(BackendError::Duplicate { .. }) => why.duplicates += 1,
                Err(BackendError::ClockAhead { .. }) => why.clocks_ahead += 1,
                Err(BackendError::Timeout | BackendError::Pending | BackendError::Io(_)) => why.no_reply += 1,
            }
        }
        why
    }
}

impl NoQuorum {
    /// Why the legacy member could not decide, as the end of "it ...".
    fn legacy_reason(&self) -> String {
        if self.quarantined > 0 {
            let left = self.votes_again_in.map_or(0, |l| l.as_millis().div_ceil(1000));
            format!(
                "is quarantined after a (possible) restart, which loses the old code's locks too; it votes again in {left} s"
            )
        } else if self.down > 0 {
            "is down".to_owned()
        } else if self.duplicates > 0 {
            "is the same server (same run_id) as a master".to_owned()
        } else if self.clocks_ahead > 0 {
            "had its wall clock jump ahead, and is quarantined".to_owned()
        } else if let Some(error) = &self.error {
            format!("answered an error ({error})")
        } else {
            "did not answer in time".to_owned()
        }
    }
}

/// A reply as one line of text for an error message.
fn reply_text(reply: &Reply) -> String {
    match reply {
        Reply::Error(e) | Reply::Status(e) | Reply::Bulk(e) => String::from_utf8_lossy(e).into_owned(),
        other => format!("{other:?}"),
    }
}

impl std::fmt::Display for NoQuorum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.legacy {
            Some(name) => write!(f, "NOQUORUM legacy member {name} cannot vote")?,
            None => write!(f, "NOQUORUM {} of {} masters can vote", self.answered, self.total)?,
        }
        let mut reasons = Vec::new();
        if self.quarantined > 0 {
            let mut r = format!("{} quarantined after a (possible) restart", self.quarantined);
            if let Some(left) = self.votes_again_in {
                r.push_str(&format!(
                    ", the first votes again in {} s",
                    left.as_millis().div_ceil(1000)
                ));
            }
            reasons.push(r);
        }
        if self.down > 0 {
            reasons.push(format!("{} down", self.down));
        }
        if self.duplicates > 0 {
            reasons.push(format!(
                "{} the same server (same run_id) as another member",
                self.duplicates
            ));
        }
        if self.clocks_ahead > 0 {
            reasons.push(format!(
                "{} whose wall clock jumped ahead, now quarantined",
                self.clocks_ahead
            ));
        }
        if self.no_reply > 0 {
            reasons.push(format!("{} did not answer in time", self.no_reply));
        }
        if let Some(error) = &self.error {
            reasons.push(format!("{} answered an error ({error})", self.errors));
        }
        if self.legacy.is_some() {
            return write!(
                f,
                ": it {}; no lock on a key it bridges is granted until it answers (old code may hold it there); \
                 see PROXY LEGACY",
                self.legacy_reason()
            );
        }
        if !reasons.is_empty() {
            write!(f, ": {}; see PROXY BACKENDS", reasons.join(", "))?;
        }
        Ok(())
    }
}

impl std::error::Error for NoQuorum {}

/// A quorum answered, but fewer than a quorum of masters had fencing counters they can vouch
/// for (they lost their data and have not been rewritten yet; `docs/fencing.md`, F3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unfenced {
    /// Masters with trusted counters among those that answered.
    pub trusted: usize,
    /// All configured masters.
    pub total: usize,
    /// When the database has no counters yet: the members whose answer the first counters
    /// wait for (F4 starts them only when every master answered).
    pub genesis_waits_for: Vec<usize>,
}

impl std::fmt::Display for Unfenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let quorum = super::quorum(self.total);
        if self.genesis_waits_for.is_empty() {
            return write!(
                f,
                "NOQUORUM fencing: {} of {} masters can vouch for their fencing counters and {quorum} are needed: the \
                 others lost their data (restart, flush) and are being repaired from the rest; see PROXY BACKENDS",
                self.trusted, self.total
            );
        }
        let members: Vec<String> = self.genesis_waits_for.iter().map(usize::to_string).collect();
        write!(
            f,
            "NOQUORUM fencing: this database has no fencing counters yet, and they start only when every master \
             answers (member {} did not, and may hold counters from before): fenced locks work once it answers; \
             SET NX locks are not affected",
            members.join(", ")
        )
    }
}

impl std::error::Error for Unfenced {}
