//! Lifecycle operations on existing sessions, from any process that reaches the same
//! backend: which sessions run a turn right now (and which are idle and warm), stopping a running turn, waiting for one
//! to be recorded (finishing an adoptable one whose driver is gone), and removing a session
//! with everything it left there.
//!
//! These work from the backend alone (labels, containers, volumes), never from the process
//! that drives the turn: a turn started by another caw-box (or `--detach`) is stopped,
//! waited for and removed the same way; a turn whose driver is gone is recorded by whoever
//! meets it ([`orphans`]; [`liveness`] tells whether a driver lives). Not here: running a
//! turn (`turn::runner`) and finding a session (`store::target`).

pub mod fork;
pub mod liveness;
pub mod orphans;
pub mod pool;
pub mod prune;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::backend::warm::WARM_FOR_LABEL;
use crate::backend::Backend;
use crate::dirs;
use crate::error::{Error, Result};
use crate::event::TurnResult;
use crate::session::store::names;
use crate::session::store::record::{labels, roles};
use crate::session::store::target::{self, VolumeFacts};
pub use crate::session::turn::result_of;
use crate::session::turn::runtime::STOP_REQUEST;
use crate::session::turn::STOP_GRACE;
use orphans::Orphan;

/// The running turn of every session that has one: session id -> turn number. One call.
///
/// A turn of this host waiting for its account's slot (`--per-account`) counts too: its
/// session is as busy (removed or exported meanwhile, it would run against nothing).
pub async fn running_turns(backend: &impl Backend) -> Result<HashMap<Uuid, u32>> {
    let mut running = turn_containers(backend).await?.running;
    for q in crate::session::admission::queued() {
        running.entry(q.session_id).or_insert(q.turn);
    }
    Ok(running)
}

/// The sessions' turn containers: which run a turn, which are idle and warm.
#[derive(Debug, Default)]
pub struct TurnContainers {
    /// Session id -> the turn it runs.
    pub running: HashMap<Uuid, u32>,
    /// Session id -> its idle warm container (`--keep-warm`).
    pub warm: HashMap<Uuid, WarmIdle>,
    /// Sessions whose turn ended with its driver gone, not recorded yet
    /// ([`orphans::settle`] records it).
    pub orphaned: Vec<Uuid>,
}

/// An idle warm container: when it was made, and for how long it stays idle after a turn.
#[derive(Debug, Clone, Copy)]
pub struct WarmIdle {
    pub created: u64,
    pub for_secs: u64,
}

impl WarmIdle {
    /// Until when (unix seconds) it stays, its session's last activity being `last`: its
    /// idle loop counts from the end of its latest turn (or its start).
    pub fn until(&self, last: u64) -> u64 {
        self.created.max(last) + self.for_secs
    }
}

/// [`TurnContainers`], from one listing.
pub async fn turn_containers(backend: &impl Backend) -> Result<TurnContainers> {
    let containers = backend
        .list_containers(&[
            format!("{}=true", labels::MANAGED),
            format!("{}={}", labels::ROLE, roles::TURN),
        ])
        .await?;
    let mut out = TurnContainers::default();
    for c in &containers {
        let id = c
            .label(labels::SESSION)
            .and_then(|s| Uuid::parse_str(s).ok());
        if let Some(id) = id.filter(|id| c.name == names::turn_container(*id)) {
            if orphans::is_orphan(c) && orphans::recordable_ended(backend, c) {
                out.orphaned.push(id);
            }
        }
    }
    // Turns this host noted in flight whose container is gone: lost with it, or recorded.
    for id in crate::session::store::inflight::noted() {
        if !containers
            .iter()
            .any(|c| c.name == names::turn_container(id))
        {
            out.orphaned.push(id);
        }
    }
    for c in containers.into_iter().filter(|c| c.running()) {
        let l = &c.labels;
        let Some(id) = l.get(labels::SESSION).and_then(|s| Uuid::parse_str(s).ok()) else {
            continue;
        };
        // An idle warm container has a name of its own: no turn runs in it.
        if c.name != names::turn_container(id) {
            if let Some(for_secs) = c.label(WARM_FOR_LABEL).and_then(|s| s.parse().ok()) {
                let created = c
                    .created
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs());
                out.warm.insert(id, WarmIdle { created, for_secs });
            }
            continue;
        }
        let turn = l
            .get(labels::TURN)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        out.running.insert(id, turn);
    }
    Ok(out)
}

/// The refusal to remove session `id` while it runs `turn` (without `force`).
pub fn running_refusal(id: Uuid, turn: u32) -> Error {
    Error::usage(format!(
        "session {id} is running turn {turn} (or has it queued); nothing was removed"
    ))
    .with_hint(format!(
        "stop it first (`caw-box stop {id}`), or pass --force"
    ))
}

/// Removes a session: its containers, egress networks, volumes (the state volume last) and
/// host cache. A running turn is killed with it; callers that must not do that check
/// [`running_turns`] first.
pub async fn remove(backend: &impl Backend, id: Uuid) -> Result<()> {
    // A turn waiting for its account's slot gives up its place first: it would run against
    // volumes removed meanwhile.
    crate::session::admission::stop_queued(id).await?;
    let container = names::turn_container(id);
    if let Some(turn) = backend.inspect_container(&container).await? {
        // A running turn's driver records the turn once its container ends: killed, it
        // would do so into a session removed meanwhile (a turn-record volume made after the
        // volumes went). Killed first, and its driver given the time to finish.
        if turn.running() {
            backend.stop_container(&container, Duration::ZERO).await?;
            await_release(backend, id, Duration::from_secs(10), false).await?;
        }
    }
    backend.remove_container(&container, true).await?;
    remove_containers_of(backend, id).await?;
    // What killed turns left beside them (a Docker `--allow-host` turn's network).
    backend
        .sweep(&[format!("{}={id}", labels::SESSION)], &[])
        .await?;
    // Turn records and the copy-mode workspace, then the state volume last.
    for v in backend
        .list_volumes(&[
            format!("{}=true", labels::MANAGED),
            format!("{}={id}", labels::SESSION),
        ])
        .await?
    {
        if v.name != names::state_volume(id) {
            backend.remove_volume(&v.name).await?;
        }
    }
    backend.remove_volume(&names::state_volume(id)).await?;
    if let Ok(dir) = dirs::sessions_dir() {
        let _ = std::fs::remove_file(dir.join(format!("{id}.json")));
    }
    orphans::forget(id);
    crate::session::store::inflight::forget(id);
    liveness::forget_driver_logs(id);
    Ok(())
}

/// Removes every container of session `id`. Where some remove themselves (a turn's
/// container finishing behind it, a warm turn's checkpoint helper: Docker's), it returns
/// once none is left: one whose removal was already under way (the daemon answers a second
/// removal with a conflict) holds the session's volumes until it is gone.
async fn remove_containers_of(backend: &impl Backend, id: Uuid) -> Result<()> {
    let filter = [format!("{}={id}", labels::SESSION)];
    let caps = backend.capabilities();
    let self_removing = caps.finishes_behind || caps.warm_checkpoints;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<_> = backend
            .list_containers(&filter)
            .await?
            .into_iter()
            .filter(|c| !c.id.is_empty())
            .collect();
        let Some(first) = left.first() else {
            return Ok(());
        };
        if Instant::now() > deadline {
            return Err(Error::environment(format!(
                "container '{}' of session {id} is still there after a minute of removing it",
                first.name
            ))
            .with_hint(format!(
                "remove it (`docker rm -f {}`) and retry",
                first.name
            )));
        }
        for c in &left {
            backend.remove_container(&c.id, true).await?;
        }
        if !self_removing {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What [`stop`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The running turn, recorded as interrupted.
    Turn,
    /// No turn ran: the session's idle warm container (pod), removed.
    Warm,
    /// A turn waited for a slot of its account (`--per-account`): it gave up its place, and
    /// does not run.
    Queued,
}

/// Stops session `id`'s running turn and returns once its driver recorded the turn (as
/// interrupted) and released the session, which stays resumable. Where no turn runs, the
/// session's idle warm container goes instead. An error if there is neither.
pub async fn stop(
    backend: &impl Backend,
    id: Uuid,
    settings: &crate::session::SessionSettings,
) -> Result<Stopped> {
    let container = names::turn_container(id);
    let running = backend
        .inspect_container(&container)
        .await?
        .filter(|c| c.running());
    let Some(inspect) = running else {
        // A turn waiting for a slot of its account: it gives up its place.
        if crate::session::admission::stop_queued(id).await? {
            return Ok(Stopped::Queued);
        }
        // No turn runs: a warm container idling for the next one is what there is to stop.
        if backend.remove_warm(&container).await? {
            return Ok(Stopped::Warm);
        }
        return Err(Error::usage(format!("session {id} has no running turn")));
    };
    if inspect.label(labels::ADOPTABLE) == Some("true") {
        // Right after `resume -d` returned, such a turn runs but its driver may not have
        // fed it yet: stopped then, the driver would find it gone and record nothing. The
        // prompt arrives with the runtime files, once the driver is attached.
        let prompt = crate::session::turn::headless::PROMPT_FILE;
        for _ in 0..100 {
            if crate::session::turn::runtime::has_file(backend, &container, prompt).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    // Tell the turn's driver that this is a stop, not a crash (through the backend: the
    // driver may run on another machine).
    if let Err(e) = crate::session::turn::runtime::signal_file(
        backend,
        &container,
        STOP_REQUEST,
        crate::session::walls::owner::turn_ids(settings),
    )
    .await
    {
        tracing::debug!("could not leave the stop request: {e}");
    }
    if let Err(e) = backend.note_stop(&container).await {
        tracing::debug!("could not note the stop on the container: {e}");
    }
    backend.stop_container(&container, STOP_GRACE).await?;
    await_release(backend, id, Duration::from_secs(30), true).await?;
    Ok(Stopped::Turn)
}

/// Returns once the driver of session `id`'s ended turn recorded the turn and released the
/// session (removed the container), or after `limit`. A turn whose driver is gone is
/// recorded here when `record`, else removed.
async fn await_release(
    backend: &impl Backend,
    id: Uuid,
    limit: Duration,
    record: bool,
) -> Result<()> {
    let container = &names::turn_container(id);
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match backend.inspect_container(container).await? {
            None => break,
            // A turn whose driver is gone, stopped: left for whoever comes next to record
            // (`wait`, `show`, `ls`, the next turn: `orphans::settle`; not here, so that a
            // stop stays a `Send` future for the library's callers).
            Some(c) if record && !c.running() && orphans::is_orphan(&c) => break,
            Some(c) if record && orphans::may_be_warm_orphan(&c) => {
                if orphans::warm_turn_ended_orphaned(backend, &c).await? {
                    break;
                }
            }
            // A driver killed too hard to record the turn: nobody else will remove it.
            Some(c) if !c.running() && crate::session::lifecycle::liveness::driver_is_gone(&c) => {
                backend.remove_found(&c).await?;
                break;
            }
            Some(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Waits until the session's running turn (if any) ended and was recorded, then returns
/// the result of its latest recorded turn. A turn whose driver is gone is recorded by this
/// process ([`orphans::settle`]).
pub async fn wait(backend: &impl Backend, facts: &VolumeFacts) -> Result<TurnResult> {
    let id = facts.session_id;
    let container = names::turn_container(id);
    loop {
        // A turn waiting for a slot of its account (`--per-account`), or for its account's
        // park (`--on-limit park`), has no container yet: waited for until it has one (its
        // ticket stays until it is recorded).
        while let Some(q) = crate::session::admission::queued_turn(id) {
            if q.admitted && backend.inspect_container(&container).await?.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if let Some(recorded) = until_container_gone(backend, id, &container).await? {
            return Ok(recorded);
        }
        // Gone, and recorded: unless its ticket went on to the turn after a park.
        if crate::session::admission::queued_turn(id).is_none() {
            break;
        }
    }
    // A turn that went with its container, noted in flight by a driver that is gone.
    if let Orphan::Recorded(recorded) = orphans::settle(backend, id, false).await? {
        return Ok(recorded.1);
    }
    let record = target::read_record(backend, facts)
        .await?
        .ok_or_else(|| Error::usage(format!("session {id} has no finished turn")))?;
    let Some(last) = record.turns.last() else {
        return Err(Error::usage(format!("session {id} has no finished turn")));
    };
    let mut result = result_of(&record, last, &backend.capabilities().scope);
    // What its driver moved aside (bind mode: this host's workspace, this host's data dir).
    result.quarantined = crate::session::walls::quarantine::recorded(id, last.turn);
    Ok(result)
}

/// Waits until the turn container of session `id` is gone (its turn recorded); the result,
/// when this process recorded it (a turn whose driver is gone).
async fn until_container_gone(
    backend: &impl Backend,
    id: uuid::Uuid,
    container: &str,
) -> Result<Option<TurnResult>> {
    let container = container.to_string();
    let mut stopped_since: Option<Instant> = None;
    let is_running = |c: &crate::backend::ContainerInfo| c.running();
    while let Some(c) = backend.inspect_container(&container).await? {
        if orphans::is_orphan(&c) || orphans::may_be_warm_orphan(&c) {
            // A turn whose driver was killed: it runs on (or ended), and this process
            // finishes it (reads its output, records it).
            match orphans::settle(backend, id, true).await? {
                Orphan::Recorded(recorded) => return Ok(Some(recorded.1)),
                Orphan::RecordedElsewhere | Orphan::Running => continue,
                Orphan::None => {}
            }
        }
        if is_running(&c) {
            if let Err(e) = backend.wait_container(&container).await {
                // The turn may have ended, and its driver removed the container, between
                // the inspect and the wait (the daemon's 404): then it is recorded, or
                // about to be. Only a container still running makes the error real.
                let still_running = backend
                    .inspect_container(&container)
                    .await?
                    .is_some_and(|c| is_running(&c));
                if still_running {
                    return Err(e);
                }
            }
            continue;
        }
        // The turn's driver records the turn, then removes the container; one that is gone
        // and left a turn no one can record (a TUI's) will not.
        let since = *stopped_since.get_or_insert_with(Instant::now);
        // The driver first, then the container again: `c` may be from before the driver
        // recorded the turn, removed the container and exited.
        let abandoned = liveness::driver_is_gone(&c)
            && backend
                .inspect_container(&container)
                .await?
                .is_some_and(|now| now.id == c.id && !now.running());
        if abandoned || since.elapsed() > Duration::from_secs(60) {
            let words = c
                .label(labels::DRIVER_PID)
                .and_then(|pid| liveness::driver_last_words(id, pid));
            let why = match words {
                Some(words) => format!("its caw-box process is gone; its last words: {words}"),
                None => "its caw-box process is gone".to_string(),
            };
            return Err(Error::environment(format!(
                "the turn of session {id} ended but was never recorded ({why})"
            ))
            .with_hint(format!(
                "its container is left for inspection: {}; `caw-box resume {id}` clears it",
                backend.logs_hint(&container)
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(None)
}
