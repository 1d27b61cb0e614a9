//! Turns whose driver is gone: a detached turn's `caw-box __drive` killed (the OOM killer, a
//! CI runner's cleanup), or a driver that lost its engine mid-turn. The turn's container
//! is adoptable (`labels::ADOPTABLE`): its output stays in its log and its state volume
//! with it, so whoever comes next — `wait`, `stop`, `show`, `logs`, `ls`, the session's next
//! turn — records it as its driver would have (result, usage, cost, status), once: one
//! process at a time holds this host's lock on the session's orphan, and the others wait
//! for the container to go.
//!
//! Not here: running turns (`runner.rs`, `headless.rs`), telling whether a driver lives
//! (`liveness.rs`).

use std::fs::{File, OpenOptions, TryLockError};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::backend::warm::{ADOPT_FILES, WARM_LABEL};
use crate::backend::{Backend, ContainerInfo, ContainerState, RuntimeDir};
use crate::backend::{HelperSpec, MountSpec, NetworkPolicy};
use crate::dirs;
use crate::error::{Error, Result};
use crate::event::Status;
use crate::event::TurnResult;
use crate::provider::AGENT_HOME;
use crate::session::lifecycle::liveness::{driver_is_gone, driver_of_is_gone, is_a_caw_box};
use crate::session::store::history::{save_record, Ending, StoredHistory, TurnLogs};
use crate::session::store::inflight;
use crate::session::store::names;
use crate::session::store::record::{labels, now_secs, roles, SessionRecord, TurnRecord};
use crate::session::store::target;
use crate::session::turn::headless::AdoptFrom;

/// What was found of a session's turn container whose driver may be gone.
#[derive(Debug)]
pub enum Orphan {
    /// Its driver lives, or there is none to record (no container, a TUI turn's).
    None,
    /// A turn whose driver is gone, recorded now by this process: the record with it.
    Recorded(Box<(SessionRecord, TurnResult)>),
    /// Recorded by another process that holds the lock (its container is gone now).
    RecordedElsewhere,
    /// Running on with its driver gone: recorded when it ends (`wait` follows it).
    Running,
}

/// Holds this host's lock on recording session `id`'s orphaned turn, while alive.
#[derive(Debug)]
struct AdoptLock(#[allow(dead_code)] File);

/// Takes the lock, or `None` while another process holds it (and records the turn).
fn try_lock(id: Uuid) -> Result<Option<AdoptLock>> {
    try_lock_in(&dirs::data_dir()?.join("adopt"), id)
}

fn try_lock_in(dir: &std::path::Path, id: Uuid) -> Result<Option<AdoptLock>> {
    let failed =
        |e: std::io::Error| Error::environment(format!("cannot lock '{}': {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(failed)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("{id}.lock")))
        .map_err(failed)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(AdoptLock(file))),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(failed(e)),
    }
}

/// Removes session `id`'s lock file (the session is gone).
pub(in crate::session) fn forget(id: Uuid) {
    if let Ok(dir) = dirs::data_dir() {
        let _ = std::fs::remove_file(dir.join("adopt").join(format!("{id}.lock")));
    }
}

/// Whether `c` is a turn container whose driver is gone and that any caw-box may record.
pub(in crate::session) fn is_orphan(c: &ContainerInfo) -> bool {
    c.label(labels::ADOPTABLE) == Some("true") && driver_is_gone(c)
}

/// Whether an ended orphan `c` can be recorded here: where its backend keeps an ended
/// container's volumes writable (Docker). A pod that ended is gone for writing.
pub(in crate::session) fn recordable_ended(backend: &impl Backend, c: &ContainerInfo) -> bool {
    let ended = c.finished || c.state == ContainerState::Exited;
    !c.running() && ended && backend.capabilities().runtime_dir == RuntimeDir::KeptWithContainer
}

/// Whether `c` is a warm container that runs a turn (claimed under the turn's name), which
/// may be one whose driver is gone ([`warm_orphan`] tells).
pub(in crate::session) fn may_be_warm_orphan(c: &ContainerInfo) -> bool {
    c.running() && c.label(WARM_LABEL).is_some()
}

/// A warm turn whose driver is gone, as its command noted it (`warm::ADOPT_FILES`).
#[derive(Debug)]
struct WarmOrphan {
    turn: u32,
    started_at: u64,
    /// The entrypoint's exit code, once it ended.
    ended: Option<i64>,
}

/// `file` in a turn's runtime directory.
fn in_run_dir(file: &str) -> String {
    format!("{}/{file}", crate::session::turn::runtime::RUN_DIR)
}

/// The turn in warm container `c` if its driver is gone; `None` when no turn was noted in
/// it (none runs, or it was released) or its driver lives.
async fn warm_orphan(backend: &impl Backend, c: &ContainerInfo) -> Result<Option<WarmOrphan>> {
    let [of, _, rc] = ADOPT_FILES.map(in_run_dir);
    let Some(noted) = backend.download_file(&c.name, &of).await? else {
        return Ok(None);
    };
    let noted = String::from_utf8_lossy(&noted);
    let mut fields = noted.split_whitespace();
    let (Some(turn), Some(pid), at) = (fields.next(), fields.next(), fields.next()) else {
        return Ok(None);
    };
    let Ok(turn) = turn.parse() else {
        return Ok(None);
    };
    if !driver_of_is_gone(c, Some(pid)) {
        return Ok(None);
    }
    let ended = backend
        .download_file(&c.name, &rc)
        .await?
        .and_then(|b| String::from_utf8_lossy(&b).trim().parse().ok());
    Ok(Some(WarmOrphan {
        turn,
        started_at: at.and_then(|t| t.parse().ok()).unwrap_or_else(now_secs),
        ended,
    }))
}

/// Whether warm container `c` holds a turn whose driver is gone and that ended (for
/// [`settle`] to record).
pub async fn warm_turn_ended_orphaned(backend: &impl Backend, c: &ContainerInfo) -> Result<bool> {
    Ok(warm_orphan(backend, c)
        .await?
        .is_some_and(|o| o.ended.is_some()))
}

/// Records session `id`'s turn whose driver is gone, if there is one that ended (or, with
/// `follow`, one that runs: followed to its end). Cheap when there is none: one inspect.
pub async fn settle(backend: &impl Backend, id: Uuid, follow: bool) -> Result<Orphan> {
    let name = names::turn_container(id);
    let Some(c) = backend.inspect_container(&name).await? else {
        return settle_lost(backend, id).await;
    };
    if may_be_warm_orphan(&c) {
        return settle_warm(backend, id, &c, follow).await;
    }
    if !is_orphan(&c) {
        return Ok(Orphan::None);
    }
    if c.running() && !follow {
        return Ok(Orphan::Running);
    }
    if !c.running() && !recordable_ended(backend, &c) {
        return Ok(Orphan::None);
    }
    let Some(_lock) = try_lock(id)? else {
        // Another caw-box records it: done once its container is gone (a minute after it
        // ended at most; while it runs, that one follows it).
        let mut deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            match backend.inspect_container(&name).await? {
                None => return Ok(Orphan::RecordedElsewhere),
                Some(c) if c.running() && !follow => return Ok(Orphan::Running),
                Some(c) if c.running() => deadline = Instant::now() + Duration::from_secs(60),
                Some(_) => {}
            }
        }
        return Err(Error::environment(format!(
            "the turn of session {id} is being recorded by another caw-box, which has not finished"
        )));
    };
    // Under the lock: the one before may have recorded it meanwhile.
    let Some(c) = backend.inspect_container(&name).await?.filter(is_orphan) else {
        return Ok(Orphan::RecordedElsewhere);
    };
    adopt(backend, id, &c).await
}

/// [`settle`] for a warm container that runs a turn: recorded from what its command kept
/// once the turn ended (followed till then with `follow`), and the container removed.
async fn settle_warm(
    backend: &impl Backend,
    id: Uuid,
    c: &ContainerInfo,
    follow: bool,
) -> Result<Orphan> {
    let Some(mut orphan) = warm_orphan(backend, c).await? else {
        return Ok(Orphan::None);
    };
    if orphan.ended.is_none() && !follow {
        return Ok(Orphan::Running);
    }
    let Some(_lock) = try_lock(id)? else {
        // Another caw-box records it: done once the container is released or gone.
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = backend.inspect_container(&c.name).await?;
            match now {
                Some(now) if now.id == c.id && warm_orphan(backend, &now).await?.is_some() => {}
                _ => return Ok(Orphan::RecordedElsewhere),
            }
        }
    };
    while orphan.ended.is_none() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        match backend.inspect_container(&c.name).await? {
            Some(now) if now.id == c.id && now.running() => {}
            // Gone meanwhile (its idle time ran out, `rm`): nothing left to record.
            _ => return Ok(Orphan::None),
        }
        let Some(now) = warm_orphan(backend, c).await? else {
            return Ok(Orphan::RecordedElsewhere);
        };
        orphan = now;
    }
    let mut record = target::resolve(backend, &id.to_string()).await?;
    if orphan.turn != record.next_turn() {
        tracing::debug!("warm container {} ran no next turn: removed", c.name);
        backend.remove_found(c).await?;
        return Ok(Orphan::RecordedElsewhere);
    }
    let stdout = backend
        .download_file(&c.name, &in_run_dir(ADOPT_FILES[1]))
        .await?
        .unwrap_or_default();
    tracing::info!(
        "recording turn {} of session {id} from its warm container: its driver is gone",
        orphan.turn
    );
    let from = AdoptFrom::Warm {
        stdout,
        exit: orphan.ended.unwrap_or_default(),
        started_at: orphan.started_at,
    };
    let result =
        crate::session::turn::headless::adopt(backend, &mut record, &c.name, orphan.turn, from)
            .await?;
    inflight::forget(id);
    Ok(Orphan::Recorded(Box::new((record, result))))
}

/// [`settle`] where session `id` has no turn container: a turn this host noted in flight
/// ([`inflight`]) whose driver is gone went with its container (removed from outside, or
/// by the engine: a daemon restart removes a warm container). Nothing of its output is
/// left: it is recorded as interrupted, through a helper container on the state volume.
async fn settle_lost(backend: &impl Backend, id: Uuid) -> Result<Orphan> {
    let Some(noted) = inflight::read(id) else {
        return Ok(Orphan::None);
    };
    // Its driver is on it (or between its note and its container); a container that
    // survives is read by the caller, and only a backend that writes into a volume
    // through a container that never ran can record it here.
    if is_a_caw_box(noted.pid)
        || backend.capabilities().runtime_dir != RuntimeDir::KeptWithContainer
    {
        return Ok(Orphan::None);
    }
    let Some(_lock) = try_lock(id)? else {
        return Ok(Orphan::RecordedElsewhere);
    };
    let mut record = target::resolve(backend, &id.to_string()).await?;
    if inflight::read(id).as_ref() != Some(&noted) || noted.turn != record.next_turn() {
        // Recorded meanwhile (the note outlived its driver by a moment), or never ran.
        inflight::forget(id);
        return Ok(Orphan::RecordedElsewhere);
    }
    let name = names::helper_container(id, "record");
    let spec = HelperSpec {
        image: record.settings.image.clone(),
        entrypoint: vec!["true".into()],
        labels: names::LabelSet::new(id, roles::PROBE).finish(),
        mounts: vec![MountSpec::volume(names::state_volume(id), AGENT_HOME)],
        network: NetworkPolicy::None,
        drop_all_capabilities: true,
        no_new_privileges: true,
        ..Default::default()
    };
    backend.create_helper(&name, &spec).await?;
    let turn = noted.turn;
    let status = Status::Interrupted;
    let result = format!(
        "the turn was interrupted by its environment: its container is gone (removed from \
         outside caw-box, or by {} on a restart); nothing of its output was kept",
        backend.capabilities().words.engine
    );
    record.turns.push(TurnRecord {
        turn,
        prompt: noted.prompt.clone(),
        status,
        result: result.clone(),
        usage: Default::default(),
        started_at: noted.started_at,
        duration_ms: 0,
        exit_code: status.exit_code(),
        cumulative_usage: None,
        interactive: false,
        limit_resets_at: None,
        account: None,
        inherited: false,
        resume_key: String::new(),
        egress: None,
    });
    tracing::info!("recording turn {turn} of session {id} as interrupted: its container is gone");
    let history = StoredHistory::fetch(backend, &name, &record, turn);
    let logs = TurnLogs {
        raw: &[],
        events: &[],
        stderr: &[],
    };
    let ending = Ending {
        handoff: None,
        output: None,
        home_out: None,
        guard: None,
        armed: None,
    };
    let saved = save_record(backend, &name, &mut record, turn, history, logs, ending).await;
    if saved.is_err() {
        let _ = backend.remove_container(&name, true).await;
    }
    saved?;
    inflight::forget(id);
    let last = record.turns.last().expect("just pushed");
    let result = crate::session::turn::result_of(&record, last, &backend.capabilities().scope);
    Ok(Orphan::Recorded(Box::new((record, result))))
}

/// Finishes turn container `c` of session `id` whose driver is gone (see
/// [`crate::session::turn::headless::adopt`]).
async fn adopt(backend: &impl Backend, id: Uuid, c: &ContainerInfo) -> Result<Orphan> {
    // The record the driver started from (labels, the host cache): the stored history
    // joins it when the turn is saved, as for the driver.
    let mut record = target::resolve(backend, &id.to_string()).await?;
    let turn = c.label(labels::TURN).and_then(|t| t.parse::<u32>().ok());
    if turn != Some(record.next_turn()) {
        // Not this session's next turn (a record written meanwhile): nothing to add to it.
        tracing::debug!("turn container {} is not the next turn: removed", c.name);
        if !c.running() {
            backend.remove_found(c).await?;
        }
        return Ok(Orphan::RecordedElsewhere);
    }
    tracing::info!("recording turn {turn:?} of session {id}: its driver is gone");
    let turn = record.next_turn();
    let from = AdoptFrom::Log { created: c.created };
    let result =
        crate::session::turn::headless::adopt(backend, &mut record, &c.name, turn, from).await?;
    inflight::forget(id);
    Ok(Orphan::Recorded(Box::new((record, result))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_at_a_time_holds_a_sessions_lock() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().join("adopt");
        let id = Uuid::new_v4();
        let held = try_lock_in(&dir, id).unwrap().expect("a free lock");
        // Another open file description: as another process would be.
        assert!(try_lock_in(&dir, id).unwrap().is_none());
        // Another session's lock is its own.
        assert!(try_lock_in(&dir, Uuid::new_v4()).unwrap().is_some());
        drop(held);
        assert!(try_lock_in(&dir, id).unwrap().is_some());
    }
}
