//! `--on-limit park`: an account that met its usage limit is parked until the limit resets.
//! Its mark, `<data dir>/accounts/<account>/parked.json`, is what every caw-box process of the
//! host reads: a parking session's turn of that account waits in the account's queue
//! until then ([`super::admission`]), instead of starting and failing; the turn the limit
//! stopped goes on then with [`CONTINUE_PROMPT`] in its own conversation.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::dirs;
use crate::error::Result;
use crate::event::TurnResult;
use crate::session::store::record::SessionRecord;

/// How long an account is parked when the CLI's words name no reset: then the next turn
/// tries again, and parks again if the limit still holds.
pub const DEFAULT_PARK: Duration = Duration::from_secs(15 * 60);

/// The prompt of the turn that goes on after a park, in the same conversation.
pub const CONTINUE_PROMPT: &str = "Continue where you left off: your previous turn was stopped by a usage limit, which has reset.";

/// An account's park mark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parked {
    /// Unix seconds: the limit's reset; turns go on from then.
    pub until: u64,
    /// Unix seconds: when a turn met the limit.
    pub since: u64,
    /// The session whose turn met it.
    pub by: Uuid,
    /// Whether the CLI named the reset (else [`DEFAULT_PARK`] was taken).
    pub named: bool,
}

/// The mark's path in an account's directory.
fn mark(dir: &Path) -> std::path::PathBuf {
    dir.join("parked.json")
}

/// The account's park mark in `dir` (`<accounts>/<account>`), if it is parked now.
pub fn parked(dir: &Path) -> Option<Parked> {
    let bytes = std::fs::read(mark(dir)).ok()?;
    let p: Parked = serde_json::from_slice(&bytes).ok()?;
    (p.until > crate::clock::now_secs()).then_some(p)
}

/// Parks the account of `dir` until `p.until`; a later reset already marked is kept.
pub fn park(dir: &Path, p: &Parked) -> Result<Parked> {
    dirs::ensure_private_dir(dir)?;
    let kept = parked(dir).filter(|old| old.until >= p.until);
    let p = kept.unwrap_or_else(|| p.clone());
    dirs::write_private(
        &mark(dir),
        &serde_json::to_vec(&p).expect("marks serialize"),
    )?;
    Ok(p)
}

/// The park a turn's usage limit calls for: until the reset the vendor's limit headers
/// said during the turn (brokered turns: to the second), else the one the CLI named
/// (recorded with the turn, else read from its words; a clock time is to the minute), or
/// [`DEFAULT_PARK`] from now.
pub fn after_limit(record: &SessionRecord, result: &TurnResult, account: &str) -> Parked {
    let now = crate::clock::now_secs();
    let began = now.saturating_sub(result.duration_ms.div_ceil(1000) + 1);
    let named = crate::auth::windows::read(account)
        .and_then(|w| w.spent_until(began, now))
        .or_else(|| {
            record
                .turns
                .last()
                .filter(|t| t.turn == result.turn)
                .and_then(|t| t.limit_resets_at)
        })
        .or_else(|| {
            super::limits::reset_at(&result.result, super::limits::now_unix())
                .map(|at| at.ceil() as u64)
        })
        // A reset just passed while still limited: a second on.
        .map(|at| at.max(now + 1));
    Parked {
        until: named.unwrap_or(now + DEFAULT_PARK.as_secs()),
        since: now,
        by: record.session_id,
        named: named.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_park_holds_until_its_reset_and_a_later_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::clock::now_secs();
        assert_eq!(parked(dir.path()), None);
        let by = Uuid::new_v4();
        let first = Parked {
            until: now + 60,
            since: now,
            by,
            named: true,
        };
        assert_eq!(park(dir.path(), &first).unwrap(), first);
        // An earlier reset does not shorten it; a later one lengthens it.
        let earlier = Parked {
            until: now + 30,
            ..first.clone()
        };
        assert_eq!(park(dir.path(), &earlier).unwrap(), first);
        let later = Parked {
            until: now + 90,
            ..first.clone()
        };
        park(dir.path(), &later).unwrap();
        assert_eq!(parked(dir.path()).map(|p| p.until), Some(now + 90));
        // Past its reset, it is no park.
        let past = Parked {
            until: now - 1,
            ..first
        };
        dirs::write_private(&mark(dir.path()), &serde_json::to_vec(&past).unwrap()).unwrap();
        assert_eq!(parked(dir.path()), None);
    }
}
