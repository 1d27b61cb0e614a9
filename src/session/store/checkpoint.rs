//! Checkpoints: every turn's end is one. A checkpoint is a volume of its own
//! (`caw-box-<id>-checkpoint-<turn>`, role `checkpoint`, labelled like every object of the
//! session, so `rm` and `gc` remove it with the session) holding:
//!
//! - the files of HOME, and of a copy-mode workspace, that changed since the session's
//!   previous checkpoint (by their status-change time, which no program can set back), or
//!   all of them for the session's first checkpoint: HOME's in `home.tar.zst` (the CLIs'
//!   state, databases and logs, compresses well; `zstd -1`, a third of `gzip -1`'s time on
//!   a codex turn's 4 MB of SQLite journal; `home.tar.gz` by `gzip -1` where the image has
//!   no zstd, and in checkpoints of older caw-boxes), the workspace's in
//!   `workspace.tar` (as large as the workspace in the first checkpoint, often incompressible:
//!   not worth a turn's time);
//! - `manifest.gz`: every path there was then (NUL-separated, sorted), so that a restore
//!   deletes what the turn deleted;
//! - `stamp`: touched before the scan: what the next checkpoint's changes are newer than
//!   (one walk lists every path and those changed since the previous stamp; the layers are
//!   packed beside the listing's sort and compare);
//! - `info.json`: what changed ([`CheckpointStats`]).
//!
//! A restore (`store::restore`) unpacks the layers up to the turn, in order, into fresh
//! volumes and deletes every path the turn's manifest does not list. The CLIs' own state is
//! restored whole as it was at that turn's end, so no vendor file is cut short: every
//! conversation file holds exactly the turns up to it.
//!
//! A checkpoint is written by the turn's own container once its CLI has ended ([`prepare`]
//! makes its volume before the turn; the entrypoint kills what the CLI left running, empties
//! the volume and runs `TAKE_SCRIPT` in it, the previous checkpoint read-only beside it),
//! and else by a short root helper (only the capabilities a copy needs) after the turn's
//! record is written ([`finish`]). Both while the turn still holds the session's lock, so no
//! other turn changes the volumes under it. It never holds what caw-box itself keeps per turn
//! (`~/.caw-box/session.json`, `~/.caw-box/turns/`: a fork writes its own) nor a credential
//! file of the provider (left out by path).
//! Not here: making a fork of a checkpoint (`lifecycle::fork`), pruning a session's older
//! checkpoints (`gc --checkpoints`: `lifecycle::prune`, which writes the oldest kept one
//! again as a whole one first).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::backend::{Backend, HelperSpec, MountSpec, NetworkPolicy};
use crate::error::{Error, Result};
use crate::provider::{ProviderKind, AGENT_HOME, WORKSPACE_DIR};
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{labels, roles, WorkspaceMode};

/// Paths under HOME that no checkpoint holds, beside the provider's credential files:
/// caw-box's per-turn record (a fork writes its own) and codex's snapshots of the shell
/// environment it ran with (`session export` leaves them out too).
const NEVER_KEPT: &[&str] = &[
    ".caw-box/session.json",
    ".caw-box/turns",
    ".codex/shell_snapshots",
    BASE_TAR,
];

/// A copy-mode workspace as it was when its session started (`diff`'s base): written once,
/// never changed, as large as the workspace. A checkpoint would hold the workspace twice with
/// it; a fork's restore copies it from its source's state volume instead.
pub(in crate::session) const BASE_TAR: &str = crate::session::walls::patch::BASE_TAR_PATH;

/// Where a checkpoint volume is mounted in the helper that takes it, and the previous one.
pub(in crate::session) const NEW_DIR: &str = "/ckpt";
const PREV_DIR: &str = "/prev";

/// Where the turn's own container has its new checkpoint volume (the image makes the
/// directory, mode 1777, so that a fresh volume there is writable by the turn's uid) and the
/// previous one (read-only).
pub const IN_TURN_DIR: &str = "/var/lib/caw-box/checkpoint";
const IN_TURN_PREV_DIR: &str = "/var/lib/caw-box/checkpoint-prev";

/// Takes a checkpoint into `/ckpt`, the previous one (if any) at `/prev`. Prints its
/// `info.json`. Runs as root with the capabilities a faithful copy needs. (`CKPT_ROOT`
/// moves every path under another root: the unit tests run it in a directory.)
pub(super) const TAKE_SCRIPT: &str = r#"set -eu -o pipefail
export LC_ALL=C
umask 077
R=${CKPT_ROOT:-}
C=${CKPT_DIR:-$R/ckpt}
P=${CKPT_PREV_DIR:-$R/prev}
cd "${R:-/}"
roots=(home/agent)
[ "$CKPT_WORKSPACE" = 1 ] && roots+=(workspace)
# Whatever is in the new checkpoint's directory already (a take that failed) goes.
shopt -s nullglob dotglob
stale=("$C"/*)
shopt -u nullglob dotglob
[ "${#stale[@]}" = 0 ] || rm -rf -- "${stale[@]}"
excl=()
while IFS= read -r p; do
    [ -n "$p" ] && excl+=(-path "home/agent/$p" -o)
done <<<"$CKPT_EXCLUDE"
excl+=(-false)
# One walk: every path (the listing) and, after a checkpoint, those changed since it.
: >"$C/stamp"
deleted=0 ws_deleted=0 base=null
# (Only on a whole one: a checkpoint without its info.json was never finished.)
if [ -f "$P/stamp" ] && [ -f "$P/manifest.gz" ] && [ -f "$P/info.json" ]; then
    base=$CKPT_PREV
    find "${roots[@]}" \( "${excl[@]}" \) -prune -o \
        \( -fprint0 "$C/all" -cnewer "$P/stamp" -fprint0 "$C/changed" \)
else
    find "${roots[@]}" \( "${excl[@]}" \) -prune -o -fprint0 "$C/all"
    cp "$C/all" "$C/changed"
fi
files=0 ws_files=0
: >"$C/changed-home"
: >"$C/changed-ws"
while IFS= read -r -d '' p; do
    case $p in
    workspace | workspace/*) printf '%s\0' "$p" >>"$C/changed-ws" ;;
    *) printf '%s\0' "$p" >>"$C/changed-home" ;;
    esac
    [ -d "$p" ] && continue
    files=$((files + 1))
    case $p in workspace/*) ws_files=$((ws_files + 1)) ;; esac
done <"$C/changed"
# The layers (HOME's compressed: zstd where the image has it) beside the listing.
if command -v zstd >/dev/null 2>&1; then
    home=home.tar.zst pack=(zstd -1 -q)
else
    home=home.tar.gz pack=(gzip -1)
fi
tar --null --no-recursion --numeric-owner -cpf - -T "$C/changed-home" | "${pack[@]}" >"$C/$home" &
packed=$!
layers=("$C/$home" "$C/manifest.gz")
ws=
if [ -s "$C/changed-ws" ]; then
    tar --null --no-recursion --numeric-owner -cpf "$C/workspace.tar" -T "$C/changed-ws" &
    ws=$!
    layers+=("$C/workspace.tar")
fi
sort -z "$C/all" >"$C/manifest"
if [ "$base" != null ]; then
    while IFS= read -r -d '' p; do
        deleted=$((deleted + 1))
        case $p in workspace/*) ws_deleted=$((ws_deleted + 1)) ;; esac
    done < <(comm -z -23 <(gzip -dc "$P/manifest.gz") "$C/manifest")
fi
gzip -1 <"$C/manifest" >"$C/manifest.gz"
rc=0 rc2=0
wait "$packed" || rc=$?
[ -z "$ws" ] || wait "$ws" || rc2=$?
rm -f "$C/all" "$C/changed" "$C/changed-home" "$C/changed-ws" "$C/manifest"
# 1: a file changed as it was read, or a socket was left out; not a failure here.
[ "$rc" -le 1 ] && [ "$rc2" -le 1 ]
bytes=0
while read -r n; do bytes=$((bytes + n)); done < <(stat -c %s "${layers[@]}")
[ -n "${CKPT_AT:-}" ] || printf -v CKPT_AT '%(%s)T' -1
printf -v info '{"turn":%s,"at":%s,"base":%s,"files_changed":%s,"workspace_files_changed":%s,"deleted":%s,"workspace_deleted":%s,"bytes":%s}' \
    "$CKPT_TURN" "$CKPT_AT" "$base" $((files + deleted)) $((ws_files + ws_deleted)) \
    "$deleted" "$ws_deleted" "$bytes"
# Last (files are 0600 by the umask): a checkpoint with an info.json is whole.
printf '%s\n' "$info" >"$C/info.json"
printf '%s\n' "$info"
"#;

/// One checkpoint as its volume's labels say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub turn: u32,
    /// When it was taken (Unix seconds).
    pub at: u64,
    /// The checkpoint whose changes since this one holds; `None`: it holds every file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<u32>,
    /// The vendor's resume key after the turn: what a fork of it resumes. Empty on a
    /// checkpoint made before its turn ran (`in_turn`): the turn's record has it then.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resume_key: String,
    /// Made before its turn and mounted in the turn's container, whose entrypoint writes it
    /// once the CLI has ended ([`prepare`]); else written by a helper after the turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_turn: bool,
}

/// What a checkpoint holds, from its `info.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointStats {
    pub turn: u32,
    pub at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<u32>,
    /// Files (not directories) added, changed or deleted since the previous checkpoint, in
    /// HOME and the workspace; for a session's first checkpoint, every file.
    pub files_changed: u64,
    /// Of those, the workspace's.
    pub workspace_files_changed: u64,
    pub deleted: u64,
    #[serde(default)]
    pub workspace_deleted: u64,
    /// The size of its layer.
    pub bytes: u64,
}

impl Checkpoint {
    pub(in crate::session) fn labels(
        &self,
        session_id: Uuid,
        provider: ProviderKind,
    ) -> HashMap<String, String> {
        LabelSet::new(session_id, roles::CHECKPOINT)
            .provider(provider)
            .with(labels::TURN, self.turn.to_string())
            .with(
                labels::CHECKPOINT,
                serde_json::to_string(self).expect("checkpoints serialize"),
            )
            .finish()
    }

    fn from_labels(l: &HashMap<String, String>) -> Option<Checkpoint> {
        if l.get(labels::ROLE).map(String::as_str) != Some(roles::CHECKPOINT) {
            return None;
        }
        serde_json::from_str(l.get(labels::CHECKPOINT)?).ok()
    }
}

/// The session's checkpoints, oldest first, from one listing.
pub async fn list(backend: &impl Backend, session_id: Uuid) -> Result<Vec<Checkpoint>> {
    let mut found: Vec<Checkpoint> = backend
        .list_volumes(&[
            format!("{}=true", labels::MANAGED),
            format!("{}={session_id}", labels::SESSION),
            format!("{}={}", labels::ROLE, roles::CHECKPOINT),
        ])
        .await?
        .iter()
        .filter_map(|v| Checkpoint::from_labels(&v.labels))
        .collect();
    found.sort_by_key(|c| c.turn);
    Ok(found)
}

/// Whether a session of this workspace mode has its workspace in its checkpoints.
pub fn keeps_workspace(mode: WorkspaceMode) -> bool {
    mode == WorkspaceMode::Copy
}

/// The paths under HOME a checkpoint of `provider`'s session leaves out, one per line.
pub(in crate::session) fn never_kept(provider: ProviderKind) -> String {
    let mut paths: Vec<String> = NEVER_KEPT.iter().map(|p| p.to_string()).collect();
    paths.extend(crate::auth::spec::Spec::of(provider).home_targets());
    paths.join("\n")
}

/// A root helper over the session's volumes with only what copying files faithfully needs.
pub(in crate::session) fn copier(
    image: &str,
    session_id: Uuid,
    script: &str,
    env: Vec<String>,
) -> HelperSpec {
    HelperSpec {
        image: image.to_string(),
        entrypoint: vec!["bash".into(), "-c".into(), script.into()],
        env,
        user: Some("0:0".into()),
        labels: LabelSet::new(session_id, roles::PROBE).finish(),
        network: NetworkPolicy::None,
        drop_all_capabilities: true,
        add_capabilities: vec![
            "CHOWN".into(),
            "DAC_OVERRIDE".into(),
            "DAC_READ_SEARCH".into(),
            "FOWNER".into(),
            "FSETID".into(),
        ],
        no_new_privileges: true,
        ..Default::default()
    }
}

/// What the session's checkpoint of a turn needs: its id, provider, image and workspace.
#[derive(Debug, Clone)]
pub struct Source<'a> {
    pub session_id: Uuid,
    pub provider: ProviderKind,
    pub image: &'a str,
    pub workspace_mode: WorkspaceMode,
    /// The vendor's resume key after the turn.
    pub resume_key: &'a str,
}

/// Takes the checkpoint of `turn` (replacing one of the same turn: a turn run again after a
/// usage limit): the changes since the latest earlier checkpoint. The caller holds the
/// session's lock. On failure nothing of it is left.
pub async fn take(
    backend: &impl Backend,
    source: &Source<'_>,
    turn: u32,
) -> Result<CheckpointStats> {
    let (checkpoint, volume) = new_volume(backend, source, turn).await?;
    let taken = run_take(backend, source, &checkpoint, &volume).await;
    if taken.is_err() {
        let _ = backend.remove_volume(&volume).await;
    }
    taken
}

/// The (empty) volume of `turn`'s checkpoint, made anew (one of the same turn goes: a turn
/// run again after a usage limit), on the latest earlier checkpoint; for a helper to write.
pub(super) async fn new_volume(
    backend: &impl Backend,
    source: &Source<'_>,
    turn: u32,
) -> Result<(Checkpoint, String)> {
    new_volume_of(backend, source, turn, false).await
}

/// [`new_volume`]; `in_turn`: made before the turn ended (its resume key is the turn's
/// record's).
pub(super) async fn new_volume_of(
    backend: &impl Backend,
    source: &Source<'_>,
    turn: u32,
    in_turn: bool,
) -> Result<(Checkpoint, String)> {
    let id = source.session_id;
    let earlier = list(backend, id).await?;
    let prev = earlier.iter().rev().find(|c| c.turn < turn);
    let volume = names::checkpoint_volume(id, turn);
    backend.remove_volume(&volume).await?;
    let checkpoint = Checkpoint {
        turn,
        at: crate::clock::now_secs(),
        base: prev.map(|p| p.turn),
        resume_key: if in_turn {
            String::new()
        } else {
            source.resume_key.to_string()
        },
        in_turn,
    };
    backend
        .create_volume(&volume, checkpoint.labels(id, source.provider))
        .await?;
    Ok((checkpoint, volume))
}

/// What a turn's container needs to write its own checkpoint: the mounts (the new
/// checkpoint's volume, the previous one read-only) and the entrypoint's environment.
#[derive(Debug, Clone, PartialEq)]
pub struct InTurn {
    pub mounts: Vec<MountSpec>,
    pub env: Vec<String>,
    /// The new checkpoint's volume.
    pub volume: String,
}

/// Makes the (empty) checkpoint volume of `turn` before its turn runs, for the turn's own
/// container to write once its CLI has ended (`images/base/caw-box-entry`): no helper after
/// the turn. The agent never sees an earlier checkpoint but the previous one, read-only.
/// [`finish`] checks it after the turn.
///
/// This runs before the turn holds the session's lock, so it never removes or reuses a
/// volume of the same turn: that is another process's (racing for the session: the loser
/// would pull it from under the winner's container) or an earlier attempt's (a turn run
/// again; on a cluster its claim may still be going). `Err` then, and a helper takes the
/// checkpoint after the turn, under the lock ([`finish`]).
pub async fn prepare(backend: &impl Backend, source: &Source<'_>, turn: u32) -> Result<InTurn> {
    let id = source.session_id;
    let volume = names::checkpoint_volume(id, turn);
    let (earlier, existing) = tokio::join!(list(backend, id), backend.inspect_volume(&volume));
    if existing?.is_some() {
        return Err(Error::busy(format!(
            "turn {turn}'s checkpoint volume '{volume}' exists already"
        )));
    }
    let earlier = earlier?;
    let prev = earlier.iter().rev().find(|c| c.turn < turn);
    let checkpoint = Checkpoint {
        turn,
        at: crate::clock::now_secs(),
        base: prev.map(|p| p.turn),
        resume_key: String::new(),
        in_turn: true,
    };
    backend
        .create_volume(&volume, checkpoint.labels(id, source.provider))
        .await?;
    let mut mounts = vec![MountSpec::volume(&volume, IN_TURN_DIR)];
    if let Some(base) = checkpoint.base {
        mounts.push(
            MountSpec::volume(names::checkpoint_volume(id, base), IN_TURN_PREV_DIR).read_only(),
        );
    }
    let mut env = take_env(source, &checkpoint);
    // Taken when the CLI has ended, not when the turn began.
    env.retain(|e| !e.starts_with("CKPT_AT="));
    env.extend([
        format!("CAW_BOX_CHECKPOINT={IN_TURN_DIR}"),
        format!("CAW_BOX_CHECKPOINT_SCRIPT={TAKE_SCRIPT}"),
        format!("CKPT_PREV_DIR={IN_TURN_PREV_DIR}"),
    ]);
    Ok(InTurn {
        mounts,
        env,
        volume,
    })
}

/// After the turn, while its container `name` (stopped) still holds the session's lock,
/// where its entrypoint did not say it wrote the checkpoint (`written`: `Some(false)`, it
/// did not; `None`, it could not say: no record hand-off): one its container wrote is whole
/// when its `info.json` is there (written last); else a helper takes it now, as for a turn
/// without [`prepare`] (a warm turn's, or one whose image's entrypoint does not write
/// checkpoints). `Err`: there is none; the volume of a prepared one is then the caller's to
/// remove once the container is gone.
pub async fn finish(
    backend: &impl Backend,
    source: &Source<'_>,
    turn: u32,
    name: &str,
    written: Option<bool>,
) -> Result<CheckpointStats> {
    let id = source.session_id;
    let info = format!("{IN_TURN_DIR}/info.json");
    let read = async {
        match written {
            None => backend.download_file(name, &info).await,
            Some(_) => Ok(None),
        }
    };
    let (inside, listed) = tokio::join!(read, list(backend, id));
    let prepared = listed?.into_iter().find(|c| c.turn == turn && c.in_turn);
    let Some(prepared) = prepared else {
        return take(backend, source, turn).await;
    };
    let written = inside
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice::<CheckpointStats>(&b).ok())
        .filter(|s| s.turn == turn);
    if let Some(stats) = written {
        return Ok(stats);
    }
    tracing::debug!("turn {turn}'s container wrote no checkpoint; a helper takes it");
    // In place: the volume is the turn container's until it goes.
    run_take(
        backend,
        source,
        &prepared,
        &names::checkpoint_volume(id, turn),
    )
    .await
}

/// The take script's environment for `checkpoint` of `source`.
fn take_env(source: &Source<'_>, checkpoint: &Checkpoint) -> Vec<String> {
    vec![
        format!(
            "CKPT_WORKSPACE={}",
            u8::from(keeps_workspace(source.workspace_mode))
        ),
        format!("CKPT_EXCLUDE={}", never_kept(source.provider)),
        format!("CKPT_TURN={}", checkpoint.turn),
        format!("CKPT_AT={}", checkpoint.at),
        format!("CKPT_PREV={}", checkpoint.base.unwrap_or(0)),
    ]
}

/// Waits for the helper that takes a warm turn's checkpoint behind it ([`take_behind`](super::behind::take_behind)),
/// if there is one, to be done and gone (it removes itself).
pub async fn settle(backend: &impl Backend, session_id: Uuid) -> Result<()> {
    let name = names::checkpoint_behind(session_id);
    // Normally a fraction of a second; a first checkpoint copies the whole workspace.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while let Some(c) = backend.inspect_container(&name).await? {
        if c.state == crate::backend::ContainerState::Exited && c.finished {
            // Ended: its removal is under way, or it was made without it; either way it goes.
            let _ = backend.remove_container(&name, true).await;
            continue;
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::environment(format!(
                "the checkpoint helper '{name}' of session {session_id} still runs after 10 minutes"
            ))
            .with_hint(format!(
                "see `docker logs {name}`, or remove it: `docker rm -f {name}`"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The helper that runs [`TAKE_SCRIPT`] for `checkpoint` into `volume`.
pub(super) fn take_spec(source: &Source<'_>, checkpoint: &Checkpoint, volume: &str) -> HelperSpec {
    let id = source.session_id;
    let mut spec = copier(source.image, id, TAKE_SCRIPT, take_env(source, checkpoint));
    spec.mounts = vec![
        MountSpec::volume(names::state_volume(id), AGENT_HOME).read_only(),
        MountSpec::volume(volume, NEW_DIR),
    ];
    if keeps_workspace(source.workspace_mode) {
        spec.mounts
            .push(MountSpec::volume(names::workspace_volume(id), WORKSPACE_DIR).read_only());
    }
    if let Some(base) = checkpoint.base {
        spec.mounts
            .push(MountSpec::volume(names::checkpoint_volume(id, base), PREV_DIR).read_only());
    }
    spec
}

async fn run_take(
    backend: &impl Backend,
    source: &Source<'_>,
    checkpoint: &Checkpoint,
    volume: &str,
) -> Result<CheckpointStats> {
    let id = source.session_id;
    let spec = take_spec(source, checkpoint, volume);
    let name = names::helper_container(id, "checkpoint");
    let (code, out, err) = backend.run_to_completion(&name, &spec).await?;
    if code != 0 {
        return Err(Error::environment(format!(
            "taking the checkpoint of turn {} of session {id} failed: {}",
            checkpoint.turn,
            err.trim()
        )));
    }
    serde_json::from_str(out.trim()).map_err(|e| {
        Error::environment(format!(
            "the checkpoint of turn {} of session {id} said nothing usable ({e}): {}",
            checkpoint.turn,
            out.trim()
        ))
    })
}

/// What each of `checkpoints` holds, read through one never-started holder container that
/// mounts them read-only (the engine's archive API: no process runs).
pub async fn stats(
    backend: &impl Backend,
    session_id: Uuid,
    image: &str,
    checkpoints: &[Checkpoint],
) -> Result<Vec<CheckpointStats>> {
    if checkpoints.is_empty() {
        return Ok(Vec::new());
    }
    let spec = HelperSpec {
        image: image.to_string(),
        entrypoint: vec!["true".into()],
        labels: LabelSet::new(session_id, roles::PROBE).finish(),
        mounts: chain_mounts(session_id, checkpoints),
        network: NetworkPolicy::None,
        ..Default::default()
    };
    crate::session::walls::workspace::with_holder(backend, spec, session_id, async |name: &str| {
        let mut stats = Vec::new();
        for c in checkpoints {
            let info = backend
                .download_file(name, &format!("/c/{}/info.json", c.turn))
                .await?;
            if let Some(s) = info.and_then(|b| serde_json::from_slice(&b).ok()) {
                stats.push(s);
            }
        }
        Ok(stats)
    })
    .await
}

pub(in crate::session) fn chain_words(chain: &[Checkpoint]) -> String {
    chain
        .iter()
        .map(|c| c.turn.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

pub(in crate::session) fn chain_mounts(session_id: Uuid, chain: &[Checkpoint]) -> Vec<MountSpec> {
    chain
        .iter()
        .map(|c| {
            MountSpec::volume(
                names::checkpoint_volume(session_id, c.turn),
                &format!("/c/{}", c.turn),
            )
            .read_only()
        })
        .collect()
}

/// The checkpoints a restore of `turn` applies, oldest first: from the latest one that
/// holds every file up to `turn`'s. `None`: `turn` has no checkpoint, or its chain is
/// broken.
pub fn chain_to(checkpoints: &[Checkpoint], turn: u32) -> Option<Vec<Checkpoint>> {
    let mut chain = Vec::new();
    let mut at = Some(turn);
    while let Some(t) = at {
        let c = checkpoints.iter().find(|c| c.turn == t)?;
        chain.push(c.clone());
        at = c.base;
    }
    chain.reverse();
    Some(chain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::store::restore::RESTORE_SCRIPT;

    fn c(turn: u32, base: Option<u32>) -> Checkpoint {
        Checkpoint {
            turn,
            at: 0,
            base,
            resume_key: String::new(),
            in_turn: false,
        }
    }

    #[test]
    fn a_restore_applies_the_layers_back_to_a_whole_one() {
        let all = [
            c(1, None),
            c(2, Some(1)),
            c(4, Some(2)),
            c(5, None),
            c(6, Some(5)),
        ];
        let turns = |t| chain_to(&all, t).map(|c| c.iter().map(|c| c.turn).collect::<Vec<_>>());
        assert_eq!(turns(1), Some(vec![1]));
        assert_eq!(turns(4), Some(vec![1, 2, 4]));
        assert_eq!(turns(6), Some(vec![5, 6]));
        // A turn whose checkpoint was not taken cannot be restored.
        assert_eq!(turns(3), None);
        assert_eq!(turns(7), None);
        // Nor one whose chain lost a layer.
        assert_eq!(chain_to(&[c(2, Some(1))], 2), None);
    }

    #[test]
    fn labels_carry_the_checkpoint_and_its_role() {
        let id = Uuid::new_v4();
        let l = c(3, Some(2)).labels(id, ProviderKind::Codex);
        assert_eq!(l[labels::ROLE], roles::CHECKPOINT);
        assert_eq!(l[labels::SESSION], id.to_string());
        assert_eq!(l[labels::TURN], "3");
        assert_eq!(Checkpoint::from_labels(&l), Some(c(3, Some(2))));
    }

    /// Runs one of this module's scripts under `root` (its `CKPT_ROOT`), as its helper would.
    fn script(script: &str, root: &std::path::Path, env: &[(&str, &str)]) -> String {
        let out = std::process::Command::new("bash")
            .args(["-c", script])
            .env("CKPT_ROOT", root)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn write(root: &std::path::Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// The files (not directories) under `root`'s HOME and workspace, relative to `root`.
    fn files(root: &std::path::Path) -> Vec<String> {
        fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    walk(&path, root, out);
                } else {
                    out.push(path.strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        for top in ["home/agent", "workspace"] {
            walk(&root.join(top), root, &mut out);
        }
        out.sort();
        out
    }

    /// Takes checkpoint `turn` of the tree under `src` into `into`, after `prev` (the
    /// helper's mounts are links here).
    fn take_in(
        src: &std::path::Path,
        turn: u32,
        into: &std::path::Path,
        prev: Option<&std::path::Path>,
    ) -> CheckpointStats {
        take_with_path(src, turn, into, prev, None)
    }

    /// [`take_in`] with `path` as the script's `PATH` (`None`: this host's).
    fn take_with_path(
        src: &std::path::Path,
        turn: u32,
        into: &std::path::Path,
        prev: Option<&std::path::Path>,
        path: Option<&str>,
    ) -> CheckpointStats {
        for (link, target) in [("ckpt", Some(into)), ("prev", prev)] {
            let _ = std::fs::remove_file(src.join(link));
            if let Some(t) = target {
                std::os::unix::fs::symlink(t, src.join(link)).unwrap();
            }
        }
        let turn = turn.to_string();
        let excluded = never_kept(ProviderKind::Codex);
        let out = script(
            TAKE_SCRIPT,
            src,
            &[
                ("CKPT_WORKSPACE", "1"),
                ("CKPT_EXCLUDE", &excluded),
                ("CKPT_TURN", &turn),
                ("CKPT_AT", "7"),
                ("CKPT_PREV", "1"),
                (
                    "PATH",
                    path.unwrap_or(&std::env::var("PATH").unwrap_or_default()),
                ),
            ],
        );
        serde_json::from_str(out.trim()).unwrap()
    }

    /// HOME's files compressed (`home`: `home.tar.zst`, or `home.tar.gz` where there is no
    /// zstd), the workspace's as they are, the listing gzipped; nothing else, and `bytes` is
    /// what the layers and listing hold.
    fn holds_its_layers(c: &std::path::Path, stats: &CheckpointStats, home: &str) {
        let mut held: Vec<String> = std::fs::read_dir(c)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        held.sort();
        let mut want = vec![home, "info.json", "manifest.gz", "stamp", "workspace.tar"];
        want.sort();
        assert_eq!(held, want);
        let magic: &[u8] = if home.ends_with(".zst") {
            &[0x28, 0xb5, 0x2f, 0xfd]
        } else {
            &[0x1f, 0x8b]
        };
        let layer = std::fs::read(c.join(home)).unwrap();
        assert_eq!(&layer[..magic.len()], magic, "{home}");
        assert_eq!(
            std::fs::read(c.join("manifest.gz")).unwrap()[..2],
            [0x1f, 0x8b]
        );
        let sizes: u64 = [home, "manifest.gz", "workspace.tar"]
            .iter()
            .map(|f| std::fs::metadata(c.join(f)).unwrap().len())
            .sum();
        assert_eq!(stats.bytes, sizes, "{stats:?}");
    }

    /// A `PATH` of this host's programs but zstd: an image without it.
    fn path_without_zstd() -> tempfile::TempDir {
        let bin = tempfile::tempdir().unwrap();
        for dir in ["/usr/local/bin", "/usr/bin", "/bin"] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("zstd") {
                    continue;
                }
                let _ = std::os::unix::fs::symlink(e.path(), bin.path().join(&name));
            }
        }
        bin
    }

    /// The take and restore scripts, run on this host in a directory: a later layer holds
    /// only what changed (deletions counted), credentials and caw-box's records are never
    /// in one, and a restore is the turn's tree exactly.
    #[test]
    fn layers_hold_what_changed_and_a_restore_is_the_turn_exactly() {
        layers_and_restores(None, "home.tar.zst");
    }

    /// A checkpoint never finished (its helper failed: no `info.json`) is no base: the next
    /// one holds every file, and a restore of that one applies it alone; a restore of the
    /// unfinished one is refused, never applied in part.
    #[test]
    fn a_checkpoint_never_finished_is_no_base_and_is_never_restored() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        write(&src, "home/agent/.codex/sessions/r.jsonl", "turn 1\n");
        write(&src, "workspace/a.txt", "a");
        std::fs::create_dir_all(src.join("tmp")).unwrap();
        let c: Vec<std::path::PathBuf> =
            (1..=3).map(|i| dir.path().join(format!("c{i}"))).collect();
        for d in &c {
            std::fs::create_dir_all(d).unwrap();
        }
        take_with_path(&src, 1, &c[0], None, None);
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(&src, "workspace/b.txt", "b");
        take_with_path(&src, 2, &c[1], Some(&c[0]), None);
        std::fs::remove_file(c[1].join("info.json")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(&src, "workspace/c.txt", "c");
        let third = take_with_path(&src, 3, &c[2], Some(&c[1]), None);
        assert_eq!(third.base, None, "{third:?}");
        assert_eq!(third.workspace_files_changed, 3, "{third:?}");

        let fork = |chain: &str| {
            let root = dir.path().join(format!("fork-{}", chain.replace(' ', "")));
            for sub in ["home/agent", "workspace", "tmp", "c"] {
                std::fs::create_dir_all(root.join(sub)).unwrap();
            }
            for (i, d) in c.iter().enumerate() {
                std::os::unix::fs::symlink(d, root.join(format!("c/{}", i + 1))).unwrap();
            }
            let out = std::process::Command::new("bash")
                .args(["-c", RESTORE_SCRIPT])
                .env("CKPT_ROOT", &root)
                .env("CKPT_CHAIN", chain)
                .env("CKPT_WORKSPACE", "1")
                .output()
                .unwrap();
            (out, root)
        };
        let (out, root) = fork("1 2 3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            files(&root),
            [
                "home/agent/.codex/sessions/r.jsonl",
                "workspace/a.txt",
                "workspace/b.txt",
                "workspace/c.txt"
            ]
        );
        let (out, root) = fork("1 2");
        assert_eq!(out.status.code(), Some(3));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("turn 2 was never finished"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(files(&root), Vec::<String>::new(), "applied in part");
    }

    /// An image without zstd gzips HOME's layer, and a restore reads it as well.
    #[test]
    fn without_zstd_home_is_gzipped_and_restores_the_same() {
        let bin = path_without_zstd();
        layers_and_restores(Some(bin.path().to_str().unwrap()), "home.tar.gz");
    }

    fn layers_and_restores(path: Option<&str>, home_layer: &str) {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let rollout = "home/agent/.codex/sessions/r.jsonl";
        write(&src, rollout, "turn 1\n");
        write(&src, "home/agent/.codex/auth.json", "secret");
        write(&src, "home/agent/.caw-box/session.json", "{}");
        write(&src, "home/agent/.caw-box/turns/1.raw.jsonl", "{}");
        write(&src, "home/agent/with space/old", "old");
        let base = "home/agent/.caw-box/workspace-base.json";
        write(&src, base, "{}");
        write(&src, "workspace/a.txt", "a");
        std::fs::create_dir_all(src.join("tmp")).unwrap();
        let (c1, c2) = (dir.path().join("c1"), dir.path().join("c2"));
        std::fs::create_dir_all(&c1).unwrap();
        std::fs::create_dir_all(&c2).unwrap();

        let first = take_with_path(&src, 1, &c1, None, path);
        assert_eq!((first.base, first.files_changed), (None, 4), "{first:?}");
        assert_eq!(first.workspace_files_changed, 1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(&src, rollout, "turn 1\nturn 2\n");
        write(&src, "workspace/b.txt", "b");
        std::fs::remove_file(src.join("home/agent/with space/old")).unwrap();
        let second = take_with_path(&src, 2, &c2, Some(&c1), path);
        assert_eq!(second.base, Some(1));
        assert_eq!((second.files_changed, second.deleted), (3, 1), "{second:?}");
        assert_eq!(second.workspace_files_changed, 1);
        holds_its_layers(&c2, &second, home_layer);
        let host_path = std::env::var("PATH").unwrap_or_default();
        let path = path.unwrap_or(&host_path);

        for (turn, chain, want, conversation) in [
            (
                1,
                "1",
                vec![
                    base,
                    rollout,
                    "home/agent/with space/old",
                    "workspace/a.txt",
                ],
                "turn 1\n",
            ),
            (
                2,
                "1 2",
                vec![base, rollout, "workspace/a.txt", "workspace/b.txt"],
                "turn 1\nturn 2\n",
            ),
        ] {
            let fork = dir.path().join(format!("fork-{turn}"));
            write(
                &fork,
                "home/agent/.profile",
                "the image's, not the session's",
            );
            std::fs::create_dir_all(fork.join("workspace")).unwrap();
            std::fs::create_dir_all(fork.join("tmp")).unwrap();
            std::fs::create_dir_all(fork.join("c")).unwrap();
            std::os::unix::fs::symlink(&c1, fork.join("c/1")).unwrap();
            std::os::unix::fs::symlink(&c2, fork.join("c/2")).unwrap();
            script(
                RESTORE_SCRIPT,
                &fork,
                &[
                    ("CKPT_CHAIN", chain),
                    ("CKPT_WORKSPACE", "1"),
                    ("PATH", path),
                ],
            );
            assert_eq!(files(&fork), want, "turn {turn}");
            let text = std::fs::read_to_string(fork.join(rollout)).unwrap();
            assert_eq!(text, conversation);
        }

        // A fork in another vendor's CLI: the workspace as it was, its own HOME untouched
        // but for the workspace's base.
        let other = dir.path().join("other-vendor");
        write(&other, "home/agent/.profile", "the other image's");
        std::fs::create_dir_all(other.join("workspace")).unwrap();
        std::fs::create_dir_all(other.join("tmp")).unwrap();
        std::fs::create_dir_all(other.join("c")).unwrap();
        std::os::unix::fs::symlink(&c1, other.join("c/1")).unwrap();
        std::os::unix::fs::symlink(&c2, other.join("c/2")).unwrap();
        script(
            RESTORE_SCRIPT,
            &other,
            &[
                ("CKPT_CHAIN", "1 2"),
                ("CKPT_WORKSPACE", "1"),
                ("CKPT_HOME", "0"),
                ("PATH", path),
            ],
        );
        assert_eq!(
            files(&other),
            vec![
                "home/agent/.caw-box/workspace-base.json",
                "home/agent/.profile",
                "workspace/a.txt",
                "workspace/b.txt"
            ]
        );
    }

    /// The restore script in its copy mode `mode` (`1`: the source's volumes at `srchome`
    /// and `srcws`; `cloned`: the fork's volumes are copies already), as a fork of a codex
    /// session runs it, with its record in the scratch at `run/caw-box-fork`.
    fn restore_from_volumes(root: &std::path::Path, mode: &str) {
        let excluded = never_kept(ProviderKind::Codex)
            .lines()
            .filter(|p| *p != BASE_TAR)
            .collect::<Vec<_>>()
            .join("\n");
        script(
            RESTORE_SCRIPT,
            root,
            &[
                ("CKPT_COPY", mode),
                ("CKPT_WORKSPACE", "1"),
                ("CKPT_EXCLUDE", &excluded),
                ("CKPT_RECORD", "/run/caw-box-fork/session.json"),
            ],
        );
    }

    /// A fork of the latest turn copied from the source's volumes (`CKPT_COPY`): the source's
    /// HOME and workspace, without what no checkpoint holds (its records, the provider's
    /// credentials) but with the workspace's base; none of the image's own HOME files; and
    /// the fork's record from the helper's scratch, last.
    #[test]
    fn a_fork_copied_from_the_sources_volumes_holds_what_a_checkpoint_would() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let rollout = ".codex/sessions/r.jsonl";
        for (path, text) in [
            (rollout, "turn 1\nturn 2\n"),
            (".codex/auth.json", "secret"),
            (".codex/shell_snapshots/s.sh", "export A=1"),
            (".caw-box/session.json", "{\"source\":1}"),
            (".caw-box/turns/2.raw.jsonl", "{}"),
            (".caw-box/workspace-base.tar", "base"),
        ] {
            write(root, &format!("srchome/{path}"), text);
        }
        write(root, "srcws/a.txt", "a");
        write(
            root,
            "home/agent/.profile",
            "the image's, not the session's",
        );
        write(root, "run/caw-box-fork/session.json", "{\"fork\":1}");
        std::fs::create_dir_all(root.join("workspace")).unwrap();
        restore_from_volumes(root, "1");
        assert_eq!(
            files(root),
            vec![
                "home/agent/.caw-box/session.json",
                "home/agent/.caw-box/workspace-base.tar",
                "home/agent/.codex/sessions/r.jsonl",
                "workspace/a.txt",
            ]
        );
        let home = root.join("home/agent");
        let read = |p: &str| std::fs::read_to_string(home.join(p)).unwrap();
        assert_eq!(read(".caw-box/session.json"), "{\"fork\":1}");
        assert_eq!(read(rollout), "turn 1\nturn 2\n");
    }

    /// A fork whose volumes the storage's snapshots made (`CKPT_COPY=cloned`): they hold
    /// the source's files already; only what no checkpoint holds goes, the record comes.
    #[test]
    fn a_fork_cloned_by_snapshots_loses_only_what_no_checkpoint_holds() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (path, text) in [
            ("home/agent/.codex/sessions/r.jsonl", "turn 1\n"),
            ("home/agent/.codex/auth.json", "secret"),
            ("home/agent/.caw-box/session.json", "{\"source\":1}"),
            ("home/agent/.caw-box/turns/1.raw.jsonl", "{}"),
            ("home/agent/.caw-box/workspace-base.tar", "base"),
            ("home/agent/.profile", "the source's"),
            ("workspace/a.txt", "a"),
            ("run/caw-box-fork/session.json", "{\"fork\":1}"),
        ] {
            write(root, path, text);
        }
        restore_from_volumes(root, "cloned");
        assert_eq!(
            files(root),
            vec![
                "home/agent/.caw-box/session.json",
                "home/agent/.caw-box/workspace-base.tar",
                "home/agent/.codex/sessions/r.jsonl",
                "home/agent/.profile",
                "workspace/a.txt",
            ]
        );
        let record = std::fs::read_to_string(root.join("home/agent/.caw-box/session.json"));
        assert_eq!(record.unwrap(), "{\"fork\":1}");
    }

    /// A checkpoint written again as a whole one (`gc --checkpoints`) restores alone what
    /// its chain restored, and holds every file of its turn.
    #[test]
    fn a_checkpoint_made_whole_restores_its_turn_alone() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        write(&src, "home/agent/.codex/sessions/r.jsonl", "turn 1\n");
        write(&src, "home/agent/gone", "deleted in turn 2");
        write(&src, "workspace/a.txt", "a");
        std::fs::create_dir_all(src.join("tmp")).unwrap();
        let (c1, c2, whole) = (
            dir.path().join("c1"),
            dir.path().join("c2"),
            dir.path().join("whole"),
        );
        for d in [&c1, &c2, &whole] {
            std::fs::create_dir_all(d).unwrap();
        }
        take_in(&src, 1, &c1, None);
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(
            &src,
            "home/agent/.codex/sessions/r.jsonl",
            "turn 1\nturn 2\n",
        );
        write(&src, "workspace/b.txt", "b");
        std::fs::remove_file(src.join("home/agent/gone")).unwrap();
        take_in(&src, 2, &c2, Some(&c1));

        let merge = dir.path().join("merge");
        std::fs::create_dir_all(merge.join("c")).unwrap();
        std::fs::create_dir_all(merge.join("tmp")).unwrap();
        std::os::unix::fs::symlink(&c1, merge.join("c/1")).unwrap();
        std::os::unix::fs::symlink(&c2, merge.join("c/2")).unwrap();
        std::os::unix::fs::symlink(&whole, merge.join("ckpt")).unwrap();
        let out = script(
            crate::session::lifecycle::prune::WHOLE_SCRIPT,
            &merge,
            &[("CKPT_CHAIN", "1 2"), ("CKPT_TURN", "2"), ("CKPT_AT", "9")],
        );
        let stats: CheckpointStats = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(
            (stats.turn, stats.at, stats.base),
            (2, 9, None),
            "{stats:?}"
        );
        assert_eq!((stats.files_changed, stats.workspace_files_changed), (3, 2));
        let stamp = |d: &std::path::Path| std::fs::metadata(d.join("stamp")).unwrap().modified();
        assert_eq!(
            stamp(&whole).unwrap(),
            stamp(&c2).unwrap(),
            "the stamp keeps its time"
        );

        let fork = dir.path().join("fork");
        std::fs::create_dir_all(fork.join("workspace")).unwrap();
        std::fs::create_dir_all(fork.join("home/agent")).unwrap();
        std::fs::create_dir_all(fork.join("tmp")).unwrap();
        std::fs::create_dir_all(fork.join("c")).unwrap();
        std::os::unix::fs::symlink(&whole, fork.join("c/2")).unwrap();
        script(
            RESTORE_SCRIPT,
            &fork,
            &[("CKPT_CHAIN", "2"), ("CKPT_WORKSPACE", "1")],
        );
        assert_eq!(
            files(&fork),
            [
                "home/agent/.codex/sessions/r.jsonl",
                "workspace/a.txt",
                "workspace/b.txt"
            ]
        );
        let text = std::fs::read_to_string(fork.join("home/agent/.codex/sessions/r.jsonl"));
        assert_eq!(text.unwrap(), "turn 1\nturn 2\n");
    }

    #[test]
    fn credentials_and_caw_box_records_are_never_kept() {
        let kept = never_kept(ProviderKind::Codex);
        assert!(kept.lines().any(|l| l == ".codex/auth.json"), "{kept}");
        assert!(kept.lines().any(|l| l == ".caw-box/session.json"));
        assert!(kept.lines().any(|l| l == ".caw-box/turns"));
        assert!(kept.lines().any(|l| l == ".caw-box/workspace-base.tar"));
    }

    /// The workspace's base, which no checkpoint holds, comes from the source's HOME.
    #[test]
    fn a_restore_takes_the_workspace_base_from_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        write(&src, "home/agent/.codex/a", "a");
        write(&src, "home/agent/.caw-box/workspace-base.tar", "the base");
        write(&src, "workspace/a.txt", "a");
        std::fs::create_dir_all(src.join("tmp")).unwrap();
        let c1 = dir.path().join("c1");
        std::fs::create_dir_all(&c1).unwrap();
        let first = take_in(&src, 1, &c1, None);
        assert_eq!(first.files_changed, 2, "no base in the layer: {first:?}");
        let fork = dir.path().join("fork");
        for d in ["workspace", "home/agent", "tmp", "c"] {
            std::fs::create_dir_all(fork.join(d)).unwrap();
        }
        std::os::unix::fs::symlink(&c1, fork.join("c/1")).unwrap();
        std::os::unix::fs::symlink(src.join("home/agent"), fork.join("srchome")).unwrap();
        script(
            RESTORE_SCRIPT,
            &fork,
            &[
                ("CKPT_CHAIN", "1"),
                ("CKPT_WORKSPACE", "1"),
                ("CKPT_FROM_SOURCE", BASE_TAR),
            ],
        );
        let base = std::fs::read_to_string(fork.join("home/agent").join(BASE_TAR));
        assert_eq!(base.unwrap(), "the base");
    }
}
