//! `caw-box gc --checkpoints`: a session's old checkpoints (`store::checkpoint`) pruned to
//! its latest few, never its latest. A checkpoint holds the changes since the one before, so
//! the oldest one kept is first written again as a whole one where it was not: what is kept
//! restores exactly as before, and a fork of a kept turn is what it was.
//!
//! A checkpoint a fork was made from is no more than its record of ancestry (`forked_from`):
//! the fork has volumes of its own and needs nothing of its source, so such a checkpoint is
//! pruned like any other (forking the source at that turn again is then refused). Not here:
//! which sessions (`commands`), and the checkpoints themselves.

use uuid::Uuid;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::session::store::checkpoint::{self, Checkpoint};
use crate::session::store::target::SessionView;

/// What pruning a session's checkpoints did (or, dry, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub session_id: Uuid,
    /// The turns whose checkpoints went (or would go).
    pub removed: Vec<u32>,
    /// The turns whose checkpoints stay.
    pub kept: Vec<u32>,
}

/// Refuses (exit 2) a `--keep` that would leave a session no checkpoint.
pub fn check_keep(keep: u32) -> Result<()> {
    if keep == 0 {
        return Err(Error::usage(
            "--keep 0 would prune a session's latest checkpoint, which is always kept",
        )
        .with_hint("--keep 1 (the default) keeps only the latest"));
    }
    Ok(())
}

/// The first turn whose checkpoint stays when a session keeps its latest `keep`; `None`:
/// nothing to prune.
pub fn keep_from(checkpoints: &[Checkpoint], keep: u32) -> Option<u32> {
    let keep = usize::try_from(keep).unwrap_or(usize::MAX).max(1);
    (checkpoints.len() > keep).then(|| checkpoints[checkpoints.len() - keep].turn)
}

/// Prunes the checkpoints of the session `view` shows to its latest `keep` (`dry_run`: only
/// says which would go). The caller makes sure the session runs no turn.
pub async fn prune(
    backend: &impl Backend,
    view: &SessionView,
    keep: u32,
    dry_run: bool,
) -> Result<Pruned> {
    check_keep(keep)?;
    let f = &view.facts;
    let listed = checkpoint::list(backend, f.session_id).await?;
    let Some(from) = keep_from(&listed, keep) else {
        return Ok(Pruned {
            session_id: f.session_id,
            removed: Vec::new(),
            kept: listed.iter().map(|c| c.turn).collect(),
        });
    };
    let kept = listed
        .iter()
        .filter(|c| c.turn >= from)
        .map(|c| c.turn)
        .collect();
    let removed = if dry_run {
        listed
            .iter()
            .filter(|c| c.turn < from)
            .map(|c| c.turn)
            .collect()
    } else {
        checkpoint::prune(
            backend,
            f.session_id,
            f.provider,
            &f.settings.image,
            &listed,
            from,
        )
        .await?
    };
    Ok(Pruned {
        session_id: f.session_id,
        removed,
        kept,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(list: &[u32]) -> Vec<Checkpoint> {
        list.iter()
            .map(|&turn| Checkpoint {
                turn,
                at: 0,
                base: None,
                resume_key: String::new(),
                in_turn: false,
            })
            .collect()
    }

    #[test]
    fn the_latest_checkpoints_are_kept_and_never_none() {
        let all = turns(&[1, 2, 4, 5]);
        assert_eq!(keep_from(&all, 1), Some(5));
        assert_eq!(keep_from(&all, 2), Some(4));
        assert_eq!(keep_from(&all, 4), None);
        assert_eq!(keep_from(&all, 9), None);
        assert_eq!(keep_from(&[], 1), None);
        assert!(check_keep(0).is_err());
        assert!(check_keep(1).is_ok());
    }
}
