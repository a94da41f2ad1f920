//! The one rule that turns N masters' replies into the reply a client sees.
//!
//! The proxy does not recognise scripts or commands by their text; every reply from the
//! masters, whatever produced it, is combined by [`combine`]:
//!
//! 1. Fewer than a quorum of masters answered at all (timeouts, dropped connections):
//!    `-NOQUORUM <n> of <N> masters can vote: <why the others cannot>`.
//! 2. At least a quorum answered with integers: the largest value that a quorum of masters
//!    returned *or exceeded*. A release returns 1 only if a quorum deleted; `PTTL` is the
//!    TTL a quorum still guarantees; redsync's -1/0/1 and `DEL`'s counts come out right.
//! 3. Otherwise, a reply a quorum returned identically (status, bulk, nil, array).
//! 4. Otherwise, if a quorum answered with errors: the most frequent error.
//! 5. Otherwise: nil. No value is held by a majority, so none is reported.

use super::NoQuorum;
use crate::reply::Reply;

pub use crate::backend::Answer;

/// Combines the masters' answers into one reply (see the module docs for the rule).
pub fn combine(answers: &[Answer], quorum: usize) -> Reply {
    combine_or(answers, quorum, Reply::Nil)
}

/// [`combine`], with `fallback` instead of nil as step 5. `GETSET` uses its own new value:
/// when no old value is held by a majority, the caller must not believe it took over a
/// stale lock (see docs/migrating-from-setnx.md on the legacy pattern).
pub fn combine_or(answers: &[Answer], quorum: usize, fallback: Reply) -> Reply {
    let replies: Vec<&Reply> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    if replies.len() < quorum {
        // Here every reply counts, errors included: they are what the masters answered.
        return Reply::error(NoQuorum::of(answers, |_| true).to_string());
    }
    if let Some(value) = quorum_integer(&replies, quorum) {
        return Reply::Int(value);
    }
    let non_errors: Vec<&Reply> = replies.iter().copied().filter(|r| !r.is_error()).collect();
    if let Some(same) = most_frequent(&non_errors, quorum) {
        return same.clone();
    }
    let errors: Vec<&Reply> = replies.iter().copied().filter(|r| r.is_error()).collect();
    if errors.len() >= quorum
        && let Some(error) = most_frequent(&errors, 1)
    {
        return error.clone();
    }
    fallback
}

/// The largest `v` such that at least `quorum` masters answered an integer `>= v`.
fn quorum_integer(replies: &[&Reply], quorum: usize) -> Option<i64> {
    let ints = replies.iter().filter_map(|r| match r {
        Reply::Int(i) => Some(*i),
        _ => None,
    });
    quorum_th_largest(ints.collect(), quorum)
}

/// The `quorum`-th largest of `values`: what at least a quorum of masters reported, at
/// least (a count, a TTL, a counter). `None` with fewer than `quorum` values.
pub(crate) fn quorum_th_largest<T: Ord + Copy>(mut values: Vec<T>, quorum: usize) -> Option<T> {
    values.sort_unstable_by(|a, b| b.cmp(a));
    values.get(quorum.checked_sub(1)?).copied()
}

/// The reply given identically by the most masters, if at least `min` gave it. Ties (only
/// possible below a quorum, e.g. two different errors) go to the smallest reply, so the
/// result does not depend on the order in which the masters answered.
fn most_frequent<'a>(replies: &[&'a Reply], min: usize) -> Option<&'a Reply> {
    let mut best: Option<(&Reply, usize)> = None;
    for candidate in replies {
        let count = replies.iter().filter(|r| *r == candidate).count();
        let better = match best {
            None => true,
            Some((b, c)) => count > c || (count == c && tie_key(candidate) < tie_key(b)),
        };
        if count >= min && better {
            best = Some((candidate, count));
        }
    }
    best.map(|(r, _)| r)
}

/// An order on replies for breaking ties.
fn tie_key(reply: &Reply) -> Vec<u8> {
    match reply {
        Reply::Error(b) | Reply::Status(b) | Reply::Bulk(b) => b.to_vec(),
        other => format!("{other:?}").into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Vec<Answer> {
        values.iter().map(|&v| Ok(Reply::Int(v))).collect()
    }

    fn timeout() -> Answer {
        Err(crate::backend::BackendError::Timeout)
    }

    #[test]
    fn release_returns_one_only_if_a_quorum_deleted() {
        assert_eq!(combine(&ints(&[1, 1, 1, 0, 0]), 3), Reply::Int(1));
        assert_eq!(combine(&ints(&[1, 1, 0, 0, 0]), 3), Reply::Int(0));
    }

    #[test]
    fn pttl_is_what_a_quorum_still_guarantees() {
        // pottery's locked() script returns the pttl, which differs per master.
        assert_eq!(combine(&ints(&[5000, 4990, 4980, 0, 0]), 3), Reply::Int(4980));
        assert_eq!(combine(&ints(&[-2, -2, -2, 100, 100]), 3), Reply::Int(-2));
    }

    #[test]
    fn redsync_release_minus_one_zero_one() {
        // Deleted on 3, missing on 2: released.
        assert_eq!(combine(&ints(&[1, 1, 1, -1, -1]), 3), Reply::Int(1));
        // Missing on a quorum: -1.
        assert_eq!(combine(&ints(&[1, 1, -1, -1, -1]), 3), Reply::Int(-1));
        // Another owner on a quorum: 0.
        assert_eq!(combine(&ints(&[0, 0, 0, 1, 1]), 3), Reply::Int(0));
    }

    #[test]
    fn too_few_answers_is_noquorum() {
        let answers = vec![Ok(Reply::Int(1)), Ok(Reply::Int(1)), timeout(), timeout(), timeout()];
        assert_eq!(
            combine(&answers, 3),
            Reply::error("NOQUORUM 2 of 5 masters can vote: 3 did not answer in time; see PROXY BACKENDS")
        );
    }

    #[test]
    fn timeouts_below_the_tolerance_do_not_matter() {
        let answers = vec![
            Ok(Reply::Int(1)),
            Ok(Reply::Int(1)),
            Ok(Reply::Int(1)),
            timeout(),
            timeout(),
        ];
        assert_eq!(combine(&answers, 3), Reply::Int(1));
    }

    #[test]
    fn values_need_a_quorum_of_identical_replies() {
        let v = |s: &'static str| Ok(Reply::bulk(s));
        assert_eq!(combine(&[v("a"), v("a"), v("a"), v("b"), v("b")], 3), Reply::bulk("a"));
        assert_eq!(
            combine(&[v("a"), v("a"), v("b"), v("b"), Ok(Reply::Nil)], 3),
            Reply::Nil
        );
        assert_eq!(
            combine(&[Ok(Reply::ok()), Ok(Reply::ok()), Ok(Reply::Nil)], 2),
            Reply::ok()
        );
    }

    #[test]
    fn errors_need_a_quorum() {
        let e = || Ok(Reply::error("NOSCRIPT No matching script. Please use EVAL."));
        assert_eq!(
            combine(&[e(), e(), e(), Ok(Reply::Int(1)), Ok(Reply::Int(1))], 3),
            e().unwrap()
        );
        // Two errors among five: the majority's integer would need three; nothing is held.
        assert_eq!(
            combine(&[e(), e(), Ok(Reply::Int(1)), Ok(Reply::Int(1)), Ok(Reply::Nil)], 3),
            Reply::Nil
        );
    }

    #[test]
    fn steal_without_a_majority_value_gets_the_fallback() {
        let v = |s: &'static str| Ok(Reply::bulk(s));
        let split = [v("a"), v("a"), v("b"), v("b"), Ok(Reply::Nil)];
        assert_eq!(combine_or(&split, 3, Reply::bulk("mine")), Reply::bulk("mine"));
        let held = [v("a"), v("a"), v("a"), v("b"), Ok(Reply::Nil)];
        assert_eq!(combine_or(&held, 3, Reply::bulk("mine")), Reply::bulk("a"));
    }

    #[test]
    fn integers_ignore_a_minority_of_errors() {
        let e = Ok(Reply::error("ERR x"));
        let answers = vec![Ok(Reply::Int(1)), Ok(Reply::Int(1)), Ok(Reply::Int(1)), e, timeout()];
        assert_eq!(combine(&answers, 3), Reply::Int(1));
    }
}
