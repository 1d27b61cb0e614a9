//! A turn's history in the session's state volume: the stored record read while the CLI
//! runs, the record and logs written when the turn ends (by the record hand-off to the
//! entrypoint, else an upload), the turn-record volume, and the host's record cache.

use crate::backend::Backend;
use crate::backend::{ContainerState, RuntimeDir, TarFile};
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::AGENT_HOME;
use crate::session::store::record::{labels, roles, SessionRecord, TurnRecord, TurnSummary};
use crate::session::turn::runtime::RUN_DIR;

/// The first line of the record hand-off on the container's stdin:
/// `caw-box-record <bytes>`, then a tar archive of `session.json` and `turns/*`.
const HANDOFF_TAG: &str = "caw-box-record";

/// The container's stdin, held by the driver for the record hand-off.
pub(in crate::session) type Stdin = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// How a turn's container ended, for [`save_record`].
#[derive(Default)]
pub(in crate::session) struct Ending<'a> {
    /// The CLI ended on its own and the entrypoint waits on this stdin for the record.
    pub(in crate::session) handoff: Option<Stdin>,
    /// The container's output after the CLI's exit marker, where the entrypoint says when
    /// the record is in (`CAW_BOX_HANDOFF_ACK`): the container may then finish behind
    /// the turn (`Capabilities::finishes_behind`).
    pub(in crate::session) output: Option<&'a mut crate::backend::OutputStream>,
    /// Where to put the credential files the entrypoint handed back (the runtime
    /// directory's `auth/home-out`, as a tar), read before the container goes.
    pub(in crate::session) home_out: Option<&'a std::sync::Mutex<Option<Vec<u8>>>>,
    /// The turn's protected paths: swept once the agent's processes are gone (the
    /// container ended) and before the lock is released, so `wait` finds the sweep done.
    pub(in crate::session) guard: Option<&'a crate::session::walls::quarantine::Guard>,
    /// A warm turn's checkpoint, armed beside it (`checkpoint::arm`): fired once recorded.
    pub(in crate::session) armed: Option<&'a crate::session::store::behind::Arming>,
}

/// The session record stored in the state volume before this turn, read through the turn's
/// container while the CLI runs (the CLI never touches it), so saving the turn does not wait
/// for it.
pub(in crate::session) struct StoredHistory(
    Option<tokio::task::JoinHandle<Result<Option<Vec<u8>>>>>,
);

impl StoredHistory {
    /// Starts reading; call once the container runs (a read holds Docker's lock on the
    /// container, which would hold up its start). Nothing to read when `record` already
    /// holds every earlier turn (turn 1, or a record completed from the host cache).
    pub(in crate::session) fn fetch(
        backend: &impl Backend,
        name: &str,
        record: &SessionRecord,
        turn: u32,
    ) -> StoredHistory {
        if record.has_every_turn_before(turn) {
            return StoredHistory(None);
        }
        let (backend, name) = (backend.clone(), name.to_string());
        StoredHistory(Some(tokio::spawn(async move {
            backend
                .download_file(
                    &name,
                    &format!(
                        "{AGENT_HOME}/{}",
                        crate::session::store::record::RECORD_PATH
                    ),
                )
                .await
        })))
    }

    async fn get(self) -> Result<Option<SessionRecord>> {
        let Some(read) = self.0 else {
            return Ok(None);
        };
        let bytes = read.await.map_err(|e| {
            Error::environment(format!("reading the stored session record failed: {e}"))
        })??;
        Ok(bytes.and_then(|b| serde_json::from_slice(&b).ok()))
    }
}

/// A turn's output as it goes into the state volume.
pub(in crate::session) struct TurnLogs<'a> {
    pub(in crate::session) raw: &'a [u8],
    pub(in crate::session) events: &'a [u8],
    pub(in crate::session) stderr: &'a [u8],
}

/// Writes the session record and this turn's logs into the state volume (through the
/// stopped turn container), replaces the session's turn-record volume, and caches the
/// record on the host; returns what the sweep of the turn's protected paths moved aside.
///
/// The record stored in the volume ([`StoredHistory`]) is merged in here, so an in-memory
/// record that only knows the latest turn (a session resumed from Docker labels alone) never
/// loses the history of earlier turns.
pub(in crate::session) async fn save_record(
    backend: &impl Backend,
    name: &str,
    record: &mut SessionRecord,
    turn: u32,
    history: StoredHistory,
    logs: TurnLogs<'_>,
    ending: Ending<'_>,
) -> Result<Option<crate::event::Quarantined>> {
    merge_history(record, turn, history).await?;
    let json = serde_json::to_vec_pretty(&*record).expect("records serialize");
    let raw_path = format!(".caw-box/turns/{turn}.raw.jsonl");
    let events_path = format!(".caw-box/turns/{turn}.events.jsonl");
    let stderr_path = format!(".caw-box/turns/{turn}.stderr.log");
    let files = [
        TarFile {
            path: crate::session::store::record::RECORD_PATH,
            contents: &json,
            mode: 0o600,
        },
        TarFile {
            path: &raw_path,
            contents: logs.raw,
            mode: 0o600,
        },
        TarFile {
            path: &events_path,
            contents: logs.events,
            mode: 0o600,
        },
        TarFile {
            path: &stderr_path,
            contents: logs.stderr,
            mode: 0o600,
        },
    ];
    // Where a turn's runtime directory goes with it (a pod's memory: Kubernetes), the
    // credential files the CLI changed are read from HOME now, while the entrypoint waits
    // for the record: it writes them to the runtime directory and deletes them from HOME
    // only once it has the record.
    if let (Some(slot), Some(_)) = (ending.home_out, ending.handoff.as_ref()) {
        if backend.capabilities().runtime_dir == RuntimeDir::GoesWithTurn {
            read_changed_home(backend, name, record.provider, slot).await;
        }
    }
    // The turn's uid:gid (its `ensure_owner` made the record's owner so).
    let owner = record.owner_ids();
    let output = ending
        .output
        .filter(|_| backend.capabilities().finishes_behind);
    let write_record = async {
        if let Some(stdin) = ending.handoff {
            match hand_off(backend, name, stdin, &files, owner, output).await {
                Ok(Some(handed)) => return Ok(Some(handed)),
                Ok(None) => tracing::debug!("the record hand-off did not happen; uploading"),
                Err(e) => tracing::debug!("the record hand-off failed ({e}); uploading"),
            }
        }
        match backend.upload_files(name, AGENT_HOME, &files, owner).await {
            Err(e) if being_removed(backend, name).await => {
                tracing::debug!("{e}");
                Err(backend.removed_under_turn(name))
            }
            other => other.map(|()| None),
        }
    };
    // The record goes into the volume while the new turn-record volume is made: independent.
    let record_now: &SessionRecord = record;
    let (written, stale) = tokio::join!(write_record, write_turn_summary(backend, record_now));
    let handed = match written {
        Ok(handed) => handed,
        Err(e) => {
            if stale.is_ok() {
                unclaim(backend, record, turn).await;
            }
            return Err(e);
        }
    };
    let stale = stale?;
    let behind = handed == Some(HandedOff::Recorded);
    let broken_checkpoint = take_checkpoint(
        backend,
        record,
        turn,
        name,
        HandedOff::checkpointed(handed),
        ending.armed,
    )
    .await;
    // The turn is recorded: release the session's lock (the container) while the older
    // turn-record volumes go. A listing meanwhile finds the new one, the latest.
    let remove_stale = futures_util::future::join_all(stale.iter().map(|v| async move {
        if let Err(e) = backend.remove_volume(v).await {
            // Harmless: the latest turn-record volume wins, and the next turn removes it.
            tracing::warn!("could not remove an old turn-record volume: {e}");
        }
    }));
    // (Nothing was handed back where the container finishes behind the turn: the entrypoint
    // says so only then.)
    if let Some(slot) = ending
        .home_out
        .filter(|_| !behind && backend.capabilities().runtime_dir == RuntimeDir::KeptWithContainer)
    {
        read_home_out(backend, name, slot).await;
    }
    let quarantined = ending.guard.and_then(|g| g.sweep());
    let (removed, _) = tokio::join!(
        release(backend, name, record.session_id, behind),
        remove_stale
    );
    removed?;
    if let Some(volume) = broken_checkpoint {
        // Freed by its container now: no fork finds half a checkpoint.
        if let Err(e) = backend.remove_volume(&volume).await {
            tracing::warn!("could not remove the unfinished checkpoint '{volume}': {e}");
        }
    }
    cache_record(record);
    Ok(quarantined)
}

/// The history stored in the volume before this turn ([`StoredHistory`]) into `record`,
/// whose turns from `turn` on are this process's.
async fn merge_history(
    record: &mut SessionRecord,
    turn: u32,
    history: StoredHistory,
) -> Result<()> {
    if let Some(stored) = history.get().await? {
        let mut turns: Vec<TurnRecord> =
            stored.turns.into_iter().filter(|t| t.turn < turn).collect();
        turns.extend(record.turns.iter().filter(|t| t.turn >= turn).cloned());
        record.turns = turns;
        record.summary_only = false;
    }
    Ok(())
}

/// The credential files the CLI changed in the running turn `name`'s HOME
/// ([`changed_home_files`]), into `slot`.
async fn read_changed_home(
    backend: &impl Backend,
    name: &str,
    provider: crate::provider::ProviderKind,
    slot: &std::sync::Mutex<Option<Vec<u8>>>,
) {
    match changed_home_files(backend, name, provider).await {
        Ok(tar) => *slot.lock().unwrap_or_else(|e| e.into_inner()) = tar,
        Err(e) => tracing::warn!("could not read the refreshed credentials: {e}"),
    }
}

/// The credential files the entrypoint handed back in the runtime directory of the ended
/// turn's container `name` (`auth/home-out`), as a tar, into `slot`.
async fn read_home_out(
    backend: &impl Backend,
    name: &str,
    slot: &std::sync::Mutex<Option<Vec<u8>>>,
) {
    let path = format!("{RUN_DIR}/{}", crate::auth::inject::HOME_OUT);
    match backend.download_tar(name, &path).await {
        Ok(tar) => *slot.lock().unwrap_or_else(|e| e.into_inner()) = tar,
        Err(e) => tracing::warn!("could not read the refreshed credentials: {e}"),
    }
}

/// The recorded turn's container `name` lets the session's lock go: removed, or, where it
/// finishes `behind` the turn, left to ([`finish_behind`]).
async fn release(
    backend: &impl Backend,
    name: &str,
    session_id: uuid::Uuid,
    behind: bool,
) -> Result<()> {
    if behind {
        finish_behind(backend, name, session_id).await
    } else {
        backend.remove_container(name, true).await
    }
}

/// Not recorded: its turn-record volume must not claim it was (nor outlive a session
/// removed meanwhile, `caw-box rm --force`).
async fn unclaim(backend: &impl Backend, record: &SessionRecord, turn: u32) {
    let fresh = crate::session::store::names::turn_record_volume(record.session_id, turn);
    if let Err(e) = backend.remove_volume(&fresh).await {
        tracing::debug!("could not remove the unrecorded turn's record volume: {e}");
    }
}

/// The turn's checkpoint, while its container still holds the session's lock: no other turn
/// changes the volumes under it. Mostly written by that container already
/// (`checkpoint::prepare`); this checks it, or takes it where it was not. A failure costs
/// only this checkpoint (the next one then holds the changes since the one before), never
/// the turn. Returns the volume of a checkpoint that failed, to remove once the container
/// that has it mounted is gone.
async fn take_checkpoint(
    backend: &impl Backend,
    record: &SessionRecord,
    turn: u32,
    name: &str,
    checkpointed: Option<bool>,
    armed: Option<&crate::session::store::behind::Arming>,
) -> Option<String> {
    let caps = backend.capabilities();
    // (A turn that ran warm where the session keeps none, in a pool's box or a container
    // `caw-box warm` made, was armed beside it as well.)
    let warm = record.settings.keep_warm_secs.is_some() || armed.is_some_and(|a| a.is_armed());
    if !caps.checkpoints || record.settings.no_checkpoints || (warm && !caps.warm_checkpoints) {
        return None;
    }
    if checkpointed == Some(true) {
        // Its container wrote it, and said so as it exited: nothing to ask Docker.
        return None;
    }
    let source = crate::session::store::checkpoint::Source {
        session_id: record.session_id,
        provider: record.provider,
        image: &record.settings.image,
        workspace_mode: record.settings.workspace_mode,
        resume_key: &record.resume_key,
    };
    if warm {
        // Behind the turn: the next turn (or a fork) waits for it, the turn does not. Its
        // helper mostly waits for the word already (armed beside the turn), which its
        // driver gives once done with the turn.
        if let Some(arming) = armed {
            if arming.recorded().await {
                return None;
            }
        }
        if let Err(e) = crate::session::store::behind::take_behind(backend, &source, turn).await {
            tracing::warn!("no checkpoint of turn {turn}: {e}");
        }
        return None;
    }
    match crate::session::store::checkpoint::finish(backend, &source, turn, name, checkpointed)
        .await
    {
        Ok(_) => None,
        Err(e) => {
            tracing::warn!("no checkpoint of turn {turn}: {e}");
            Some(crate::session::store::names::checkpoint_volume(
                record.session_id,
                turn,
            ))
        }
    }
}

/// The provider's credential files in the running turn `name`'s HOME that differ from the
/// store's (what the turn got, unless another turn refreshed it since: the store then
/// keeps the later expiry), as the archive `auth::inject::finish` reads (`home-out/<path>`);
/// `None` when none changed.
async fn changed_home_files(
    backend: &impl Backend,
    name: &str,
    provider: crate::provider::ProviderKind,
) -> Result<Option<Vec<u8>>> {
    let store = crate::auth::store::Store::open()?;
    let mut archive = tar::Builder::new(Vec::new());
    let mut any = false;
    for target in crate::auth::spec::Spec::of(provider).home_targets() {
        let Some(now) = backend
            .download_file(name, &format!("{AGENT_HOME}/{target}"))
            .await?
        else {
            continue;
        };
        if store
            .file(provider, &target)
            .is_some_and(|s| s.expose() == now.as_slice())
        {
            continue;
        }
        let mut header = tar::Header::new_gnu();
        header.set_size(now.len() as u64);
        header.set_mode(0o600);
        header.set_cksum();
        archive
            .append_data(&mut header, format!("home-out/{target}"), now.as_slice())
            .map_err(|e| Error::environment(format!("archiving refreshed credentials: {e}")))?;
        any = true;
    }
    let tar = archive
        .into_inner()
        .map_err(|e| Error::environment(format!("archiving refreshed credentials: {e}")))?;
    Ok(any.then_some(tar))
}

/// Whether a turn's container is gone, or on its way (removed from outside: it no longer
/// has its volumes).
async fn being_removed(backend: &impl Backend, name: &str) -> bool {
    match backend.inspect_container(name).await {
        Ok(None) => true,
        Ok(Some(c)) => matches!(c.state, ContainerState::Removing | ContainerState::Dead),
        Err(_) => false,
    }
}

/// How the entrypoint took the turn's record ([`hand_off`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HandedOff {
    /// It took it and exited; `checkpointed`: it wrote the turn's checkpoint too.
    Exited { checkpointed: bool },
    /// It took it and said so, with nothing of the agent running and nothing handed back:
    /// the container finishes (its checkpoint, its exit) behind the turn.
    Recorded,
}

impl HandedOff {
    /// Whether the turn's checkpoint was written, as [`take_checkpoint`] reads it: where
    /// the container finishes behind the turn, the checkpoint is its own to finish.
    fn checkpointed(handed: Option<HandedOff>) -> Option<bool> {
        match handed? {
            HandedOff::Exited { checkpointed } => Some(checkpointed),
            HandedOff::Recorded => Some(true),
        }
    }
}

/// The line the entrypoint prints once it took the record, where asked to
/// (`CAW_BOX_HANDOFF_ACK`, `images/base/caw-box-entry`).
const RECORDED_MARKER: &[u8] = b"\x1ecaw-box-recorded\n";

/// Gives the turn's record files to the entrypoint on its stdin, while it waits after the
/// CLI ended; it copies them into HOME (`session.json` by rename) and exits 0 once it did
/// ([`CHECKPOINTED`] when it also wrote the turn's checkpoint). Where `output` is given,
/// the entrypoint may say it took the record before it exits ([`HandedOff::Recorded`]).
/// Returns `None` when it did not take the record. No archive request: a stopped
/// container's volumes would have to be mounted again for one.
async fn hand_off(
    backend: &impl Backend,
    name: &str,
    mut stdin: Stdin,
    files: &[TarFile<'_>],
    owner: (u32, u32),
    output: Option<&mut crate::backend::OutputStream>,
) -> Result<Option<HandedOff>> {
    use tokio::io::AsyncWriteExt;
    // The layout the entrypoint expects: session.json and turns/*, from ~/.caw-box.
    let mut relative = Vec::new();
    for f in files {
        let Some(rel) = f.path.strip_prefix(".caw-box/") else {
            return Ok(None);
        };
        relative.push(TarFile { path: rel, ..*f });
    }
    let framed = crate::session::turn::runtime::framed(HANDOFF_TAG, &relative, owner)?;
    let sent = async {
        stdin.write_all(&framed).await?;
        stdin.flush().await?;
        stdin.shutdown().await
    };
    if let Err(e) = sent.await {
        tracing::debug!("the entrypoint does not take the record: {e}");
        return Ok(None);
    }
    tracing::debug!("the record is on its way");
    let code = match output {
        Some(output) => match recorded_or_exit(backend, name, output).await? {
            Some(code) => code,
            None => {
                tracing::debug!("the record is in; the container finishes behind the turn");
                return Ok(Some(HandedOff::Recorded));
            }
        },
        None => backend.wait_container(name).await?,
    };
    tracing::debug!("the container exited with {code}");
    Ok(match code {
        0 => Some(HandedOff::Exited {
            checkpointed: false,
        }),
        CHECKPOINTED => Some(HandedOff::Exited { checkpointed: true }),
        _ => None,
    })
}

/// Reads the container's output for [`RECORDED_MARKER`] while waiting for its exit:
/// `None` once the marker came, else the exit code.
async fn recorded_or_exit(
    backend: &impl Backend,
    name: &str,
    output: &mut crate::backend::OutputStream,
) -> Result<Option<i64>> {
    use futures_util::StreamExt;
    let exited = backend.wait_container(name);
    tokio::pin!(exited);
    let mut seen: Vec<u8> = Vec::new();
    let mut open = true;
    loop {
        tokio::select! {
            code = &mut exited => return code.map(Some),
            chunk = output.next(), if open => match chunk {
                Some(Ok(crate::backend::OutputChunk::Stdout(bytes))) => {
                    seen.extend_from_slice(&bytes);
                    if seen
                        .windows(RECORDED_MARKER.len())
                        .any(|w| w == RECORDED_MARKER)
                    {
                        return Ok(None);
                    }
                    // (Nothing else is printed after the record: a bound against the odd.)
                    if seen.len() > 4096 {
                        seen.drain(..seen.len() - RECORDED_MARKER.len());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => open = false,
            },
        }
    }
}

/// Leaves the turn's container `name`, its record in, to finish behind the turn: renamed
/// to the session's checkpoint-behind name (the session's lock is free at once; its next
/// turn, fork, export and prune wait for it: `checkpoint::settle`), and a `caw-box
/// __settle` started in the background that waits for its end and removes it. Where the
/// rename fails, or no background process can be started, it is waited for and removed
/// here, as without this.
async fn finish_behind(backend: &impl Backend, name: &str, session_id: uuid::Uuid) -> Result<()> {
    let behind = crate::session::store::names::checkpoint_behind(session_id);
    if let Err(e) = backend.rename_container(name, &behind).await {
        tracing::debug!("could not leave '{name}' to finish behind the turn: {e}");
        let _ = backend.wait_container(name).await;
        return backend.remove_container(name, true).await;
    }
    if !crate::session::store::behind::settle_in_background(session_id) {
        crate::session::store::checkpoint::settle(backend, session_id).await?;
    }
    Ok(())
}

/// The entrypoint's exit code when it took the record and its turn's checkpoint is whole
/// (`CAW_BOX_CHECKPOINT`, `images/base/caw-box-entry`); 0: it took the record only.
const CHECKPOINTED: i64 = 73;

/// Creates the session's turn-record volume for its latest turn; returns the names of the
/// older ones, for the caller to remove: the new one exists before the old ones go, so a
/// listing never finds none.
pub(in crate::session) async fn write_turn_summary(
    backend: &impl Backend,
    record: &SessionRecord,
) -> Result<Vec<String>> {
    let Some(last) = record.turns.last() else {
        return Ok(Vec::new());
    };
    let summary = TurnSummary {
        turn: last.turn,
        status: last.status,
        started_at: last.started_at,
        ended_at: last.started_at + last.duration_ms / 1000,
        resume_key: record.resume_key.clone(),
        key_confirmed: record.key_confirmed,
        cumulative_usage: record.last_cumulative_usage(),
        total_cost_usd: record.total_cost_usd(),
        owner: record.owner,
        interactive: last.interactive,
        home_unlike_image: record.home_unlike_image,
        keep_warm_secs: record.settings.keep_warm_secs,
        max_cost_usd: record.settings.max_cost_usd,
    };
    let id = record.session_id;
    let fresh = crate::session::store::names::turn_record_volume(id, last.turn);
    let filter = [
        format!("{}={id}", labels::SESSION),
        format!("{}={}", labels::ROLE, roles::TURN_RECORD),
    ];
    // A leftover of the same name goes first: Docker's create is idempotent by name and
    // would keep its stale labels.
    let (_, old) = tokio::join!(backend.remove_volume(&fresh), backend.list_volumes(&filter));
    backend
        .create_volume(&fresh, summary.labels(id, record.provider))
        .await?;
    Ok(old?
        .into_iter()
        .map(|v| v.name)
        .filter(|n| *n != fresh)
        .collect())
}

/// Caches a record on the host; failures only cost speed later, so they are not errors.
pub fn cache_record(record: &SessionRecord) {
    let Ok(dir) = dirs::sessions_dir() else {
        return;
    };
    let path = dir.join(format!("{}.json", record.session_id));
    if let Ok(json) = serde_json::to_vec_pretty(record) {
        if let Err(e) = dirs::write_private_unsynced(&path, &json) {
            tracing::debug!("could not cache the session record: {e}");
        }
    }
}
