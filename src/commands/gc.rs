//! `gc` (`--checkpoints`: old checkpoints pruned): what sessions and turns left behind,
//! found by label and removed.

use super::ago::ago;
use crate::error::Result;
use crate::output;
use crate::session::lifecycle;
use crate::session::record::now_secs;
use crate::session::target::{self, SessionView};

/// `gc`: sessions idle for `older_than` removed, or with `checkpoints` (`--keep N`) every
/// session's checkpoints pruned to its latest N.
pub async fn gc(
    older_than: &str,
    checkpoints: Option<u32>,
    dry_run: bool,
    group: Option<String>,
) -> Result<i32> {
    let group = group.as_deref();
    if let Some(keep) = checkpoints {
        return gc_checkpoints(keep, dry_run, group).await;
    }
    let age = crate::settings::parse_duration(older_than, "--older-than")?;
    let backend = crate::client::connect_backend().await?;
    let (all, running) = tokio::try_join!(
        target::list_sessions(&backend),
        lifecycle::running_turns(&backend)
    )?;
    let cutoff = now_secs().saturating_sub(age.as_secs());
    let mut old: Vec<&SessionView> = all
        .iter()
        .filter(|v| !running.contains_key(&v.facts.session_id))
        .filter(|v| group.is_none() || v.facts.group.as_deref() == group)
        .filter(|v| v.last_activity() < cutoff)
        .collect();
    old.sort_by_key(|v| v.last_activity());
    for v in &old {
        let label = v
            .facts
            .name
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        if dry_run {
            output::println(&format!(
                "would remove {}{label}, idle since {}",
                v.facts.session_id,
                ago(v.last_activity())
            ));
        } else {
            lifecycle::remove(&backend, v.facts.session_id).await?;
            output::println(&format!("removed {}{label}", v.facts.session_id));
        }
    }
    if old.is_empty() {
        output::eprintln(&format!(
            "no finished session has been idle for {}",
            humantime::format_duration(age)
        ));
    }
    if !dry_run {
        // What nobody uses any more: egress networks whose shared proxy idled out, and the
        // runtime scratch (a prompt) of turns whose container was removed without it.
        let networks = crate::session::remove_unused_egress_networks(&backend).await?;
        let scratch = crate::session::remove_unused_runtime_volumes(&backend, None).await?;
        let boxes = lifecycle::pool::sweep(&backend).await?;
        for (n, one, more) in [
            (
                networks.len(),
                "unused egress network",
                "unused egress networks",
            ),
            (
                scratch.len(),
                "unused runtime volume",
                "unused runtime volumes",
            ),
            (boxes, "pool box left over", "pool boxes left over"),
        ] {
            if n > 0 {
                output::println(&format!("removed {n} {}", if n == 1 { one } else { more }));
            }
        }
    }
    Ok(0)
}

/// `gc --checkpoints`: every session (of `group`) keeps its latest `keep` checkpoints; a
/// session running a turn is left alone (said on stderr).
async fn gc_checkpoints(keep: u32, dry_run: bool, group: Option<&str>) -> Result<i32> {
    lifecycle::prune::check_keep(keep)?;
    let backend = crate::client::connect_backend().await?;
    let (all, running) = tokio::try_join!(
        target::list_sessions(&backend),
        lifecycle::running_turns(&backend)
    )?;
    let mut pruned_any = false;
    for v in all
        .iter()
        .filter(|v| group.is_none() || v.facts.group.as_deref() == group)
    {
        let id = v.facts.session_id;
        if let Some(turn) = running.get(&id) {
            output::eprintln(&format!(
                "{id} is running turn {turn}: its checkpoints are left as they are"
            ));
            continue;
        }
        let pruned = lifecycle::prune::prune(&backend, v, keep, dry_run).await?;
        if pruned.removed.is_empty() {
            continue;
        }
        pruned_any = true;
        let label = v
            .facts
            .name
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        let turns = |t: &[u32]| t.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        output::println(&format!(
            "{} {id}{label}: turns {}; kept: turns {}",
            if dry_run {
                "would prune the checkpoints of"
            } else {
                "pruned the checkpoints of"
            },
            turns(&pruned.removed),
            turns(&pruned.kept)
        ));
    }
    if !pruned_any {
        output::eprintln(&format!(
            "no session has more than {keep} checkpoint{}",
            if keep == 1 { "" } else { "s" }
        ));
    }
    Ok(0)
}
