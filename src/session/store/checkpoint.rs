//! Checkpoints: every turn's end is one. A checkpoint is a volume of its own
//! (`caw-box-<id>-checkpoint-<turn>`, role `checkpoint`, labelled like every object of the
//! session, so `rm` and `gc` remove it with the session) holding:
//!
//! - `layer.tar`: the files of HOME, and of a copy-mode workspace, that changed since the
//!   session's previous checkpoint (by their status-change time, which no program can set
//!   back), or all of them for the session's first checkpoint;
//! - `manifest`: every path there was then (NUL-separated, sorted), so that a restore
//!   deletes what the turn deleted;
//! - `stamp`: touched before the scan: what the next checkpoint's changes are newer than;
//! - `info.json`: what changed ([`CheckpointStats`]).
//!
//! A restore ([`restore_spec`]) unpacks the layers up to the turn, in order, into fresh
//! volumes and deletes every path the turn's manifest does not list. The CLIs' own state is
//! restored whole as it was at that turn's end, so no vendor file is cut short: every
//! conversation file holds exactly the turns up to it.
//!
//! A checkpoint is taken by a short root helper (only the capabilities a copy needs) after
//! the turn's record is written and while the turn still holds the session's lock, so no
//! other turn changes the volumes under it. It never holds what caw-box itself keeps per turn
//! (`~/.caw-box/session.json`, `~/.caw-box/turns/`: a fork writes its own) nor a credential
//! file of the provider (the entrypoint deleted them already; they are left out anyway).
//! Not here: making a fork of a checkpoint (`lifecycle::fork`).

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
];

/// Where a checkpoint volume is mounted in the helper that takes it, and the previous one.
const NEW_DIR: &str = "/ckpt";
const PREV_DIR: &str = "/prev";

/// Takes a checkpoint into `/ckpt`, the previous one (if any) at `/prev`. Prints its
/// `info.json`. Runs as root with the capabilities a faithful copy needs.
const TAKE_SCRIPT: &str = r#"set -eu
export LC_ALL=C
cd /
roots=(home/agent)
[ "$CKPT_WORKSPACE" = 1 ] && roots+=(workspace)
excl=()
while IFS= read -r p; do
    [ -n "$p" ] && excl+=(-path "home/agent/$p" -o)
done <<<"$CKPT_EXCLUDE"
excl+=(-false)
list() { find "${roots[@]}" \( "${excl[@]}" \) -prune -o "$@" -print0; }
touch /ckpt/stamp
list | sort -z >/ckpt/manifest
deleted=0 ws_deleted=0 base=null
if [ -f /prev/stamp ] && [ -f /prev/manifest ]; then
    base=$CKPT_PREV
    list -cnewer /prev/stamp >/tmp/changed
    while IFS= read -r -d '' p; do
        deleted=$((deleted + 1))
        case $p in workspace/*) ws_deleted=$((ws_deleted + 1)) ;; esac
    done < <(comm -z -23 /prev/manifest /ckpt/manifest)
else
    cp /ckpt/manifest /tmp/changed
fi
files=0 ws_files=0
while IFS= read -r -d '' p; do
    [ -d "$p" ] && continue
    files=$((files + 1))
    case $p in workspace/*) ws_files=$((ws_files + 1)) ;; esac
done </tmp/changed
rc=0
tar --null --no-recursion --numeric-owner -cpf /ckpt/layer.tar -T /tmp/changed || rc=$?
# 1: a file changed as it was read, or a socket was left out; not a failure here.
[ "$rc" -le 1 ]
bytes=$(stat -c %s /ckpt/layer.tar)
printf '{"turn":%s,"at":%s,"base":%s,"files_changed":%s,"workspace_files_changed":%s,"deleted":%s,"workspace_deleted":%s,"bytes":%s}\n' \
    "$CKPT_TURN" "$CKPT_AT" "$base" $((files + deleted)) $((ws_files + ws_deleted)) \
    "$deleted" "$ws_deleted" "$bytes" >/ckpt/info.json
chmod 600 /ckpt/layer.tar /ckpt/manifest /ckpt/info.json
cat /ckpt/info.json
"#;

/// Restores the checkpoints `CKPT_CHAIN` (their turns, oldest first, mounted at
/// `/c/<turn>`) into HOME (and `/workspace` when `CKPT_WORKSPACE=1`): each layer in turn,
/// then every path the last one's manifest does not list is deleted.
const RESTORE_SCRIPT: &str = r#"set -eu
export LC_ALL=C
cd /
roots=(home/agent)
[ "$CKPT_WORKSPACE" = 1 ] && roots+=(workspace)
last=
for c in $CKPT_CHAIN; do
    tar --numeric-owner -xpf "/c/$c/layer.tar" -C /
    last=/c/$c
done
find "${roots[@]}" -print0 | sort -z >/tmp/now
comm -z -23 /tmp/now "$last/manifest" | xargs -0 -r rm -rf --
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
    /// The vendor's resume key after the turn: what a fork of it resumes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resume_key: String,
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
    fn labels(&self, session_id: Uuid, provider: ProviderKind) -> HashMap<String, String> {
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
fn never_kept(provider: ProviderKind) -> String {
    let mut paths: Vec<String> = NEVER_KEPT.iter().map(|p| p.to_string()).collect();
    paths.extend(crate::auth::spec::Spec::of(provider).home_targets());
    paths.join("\n")
}

/// A root helper over the session's volumes with only what copying files faithfully needs.
fn copier(image: &str, session_id: Uuid, script: &str, env: Vec<String>) -> HelperSpec {
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
    let id = source.session_id;
    let earlier = list(backend, id).await?;
    let prev = earlier.iter().rev().find(|c| c.turn < turn);
    let volume = names::checkpoint_volume(id, turn);
    backend.remove_volume(&volume).await?;
    let checkpoint = Checkpoint {
        turn,
        at: crate::clock::now_secs(),
        base: prev.map(|p| p.turn),
        resume_key: source.resume_key.to_string(),
    };
    backend
        .create_volume(&volume, checkpoint.labels(id, source.provider))
        .await?;
    let taken = run_take(backend, source, &checkpoint, &volume).await;
    if taken.is_err() {
        let _ = backend.remove_volume(&volume).await;
    }
    taken
}

async fn run_take(
    backend: &impl Backend,
    source: &Source<'_>,
    checkpoint: &Checkpoint,
    volume: &str,
) -> Result<CheckpointStats> {
    let id = source.session_id;
    let workspace = keeps_workspace(source.workspace_mode);
    let mut spec = copier(
        source.image,
        id,
        TAKE_SCRIPT,
        vec![
            format!("CKPT_WORKSPACE={}", u8::from(workspace)),
            format!("CKPT_EXCLUDE={}", never_kept(source.provider)),
            format!("CKPT_TURN={}", checkpoint.turn),
            format!("CKPT_AT={}", checkpoint.at),
            format!("CKPT_PREV={}", checkpoint.base.unwrap_or(0)),
        ],
    );
    spec.mounts = vec![
        MountSpec::volume(names::state_volume(id), AGENT_HOME).read_only(),
        MountSpec::volume(volume, NEW_DIR),
    ];
    if workspace {
        spec.mounts
            .push(MountSpec::volume(names::workspace_volume(id), WORKSPACE_DIR).read_only());
    }
    if let Some(base) = checkpoint.base {
        spec.mounts
            .push(MountSpec::volume(names::checkpoint_volume(id, base), PREV_DIR).read_only());
    }
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

/// What each of `checkpoints` holds, read through one helper that mounts them read-only.
pub async fn stats(
    backend: &impl Backend,
    session_id: Uuid,
    image: &str,
    checkpoints: &[Checkpoint],
) -> Result<Vec<CheckpointStats>> {
    if checkpoints.is_empty() {
        return Ok(Vec::new());
    }
    let mut spec = copier(
        image,
        session_id,
        "for t in $CKPT_CHAIN; do cat /c/$t/info.json 2>/dev/null; echo; done",
        vec![format!("CKPT_CHAIN={}", chain_words(checkpoints))],
    );
    spec.mounts = chain_mounts(session_id, checkpoints);
    let name = names::helper_container(session_id, "checkpoints");
    let (code, out, err) = backend.run_to_completion(&name, &spec).await?;
    if code != 0 {
        return Err(Error::environment(format!(
            "reading session {session_id}'s checkpoints failed: {}",
            err.trim()
        )));
    }
    Ok(out
        .lines()
        .filter_map(|l| serde_json::from_str(l.trim()).ok())
        .collect())
}

fn chain_words(chain: &[Checkpoint]) -> String {
    chain
        .iter()
        .map(|c| c.turn.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn chain_mounts(session_id: Uuid, chain: &[Checkpoint]) -> Vec<MountSpec> {
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

/// A helper that restores `chain` (of session `from`) into the fresh volumes of session
/// `into`: its state volume and, when `workspace`, its workspace volume.
pub fn restore_spec(
    image: &str,
    from: Uuid,
    into: Uuid,
    chain: &[Checkpoint],
    workspace: bool,
) -> HelperSpec {
    let mut spec = copier(
        image,
        into,
        RESTORE_SCRIPT,
        vec![
            format!("CKPT_CHAIN={}", chain_words(chain)),
            format!("CKPT_WORKSPACE={}", u8::from(workspace)),
        ],
    );
    spec.mounts = chain_mounts(from, chain);
    spec.mounts
        .push(MountSpec::volume(names::state_volume(into), AGENT_HOME));
    if workspace {
        spec.mounts.push(MountSpec::volume(
            names::workspace_volume(into),
            WORKSPACE_DIR,
        ));
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(turn: u32, base: Option<u32>) -> Checkpoint {
        Checkpoint {
            turn,
            at: 0,
            base,
            resume_key: String::new(),
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

    #[test]
    fn credentials_and_caw_box_records_are_never_kept() {
        let kept = never_kept(ProviderKind::Codex);
        assert!(kept.lines().any(|l| l == ".codex/auth.json"), "{kept}");
        assert!(kept.lines().any(|l| l == ".caw-box/session.json"));
        assert!(kept.lines().any(|l| l == ".caw-box/turns"));
    }
}
