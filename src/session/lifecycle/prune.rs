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

use crate::backend::{Backend, HelperSpec, MountSpec};
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::session::store::checkpoint::{
    self, chain_mounts, chain_to, chain_words, copier, Checkpoint, NEW_DIR,
};
use crate::session::store::names::{self, roles, LabelSet};
use crate::session::store::target::SessionView;

/// Writes the checkpoint `CKPT_CHAIN`'s last (its chain, oldest first, at `/c/<turn>`) as a
/// whole one into `/ckpt`: its layers unpacked in turn into a scratch directory, then exactly
/// the paths its manifest lists packed again; its manifest and its stamp (by its time, what
/// the next checkpoint's changes are newer than) copied, all owned as its files were (a
/// turn's own container writes, and reads, them as the agent's user).
pub(crate) const WHOLE_SCRIPT: &str = concat!(
    r#"set -eu -o pipefail
export LC_ALL=C
umask 077
R=${CKPT_ROOT:-}
C=$R/ckpt
W=$R/tmp/whole
rm -rf "$W"
mkdir -p "$W"
"#,
    crate::session::store::restore::layers_of_fn!(),
    r#"last=
layers_of
for c in "${use[@]}"; do
    for layer in home.tar.zst home.tar.gz workspace.tar; do
        [ -f "$R/c/$c/$layer" ] || continue
        tar --numeric-owner -xpf "$R/c/$c/$layer" -C "$W"
    done
    last="$R/c/$c"
done
cd "$W"
files=0 ws_files=0
: >"$R/tmp/whole-home"
: >"$R/tmp/whole-ws"
while IFS= read -r -d '' p; do
    case $p in
    workspace | workspace/*) printf '%s\0' "$p" >>"$R/tmp/whole-ws" ;;
    *) printf '%s\0' "$p" >>"$R/tmp/whole-home" ;;
    esac
    [ -d "$p" ] && continue
    files=$((files + 1))
    case $p in workspace/*) ws_files=$((ws_files + 1)) ;; esac
done < <(gzip -dc "$last/manifest.gz")
rc=0 rc2=0
if command -v zstd >/dev/null 2>&1; then
    home=home.tar.zst pack=(zstd -1 -q)
else
    home=home.tar.gz pack=(gzip -1)
fi
tar --null --no-recursion --numeric-owner -cpf - -T "$R/tmp/whole-home" | "${pack[@]}" >"$C/$home" \
    || rc=$?
owned=("$C/$home")
if [ -s "$R/tmp/whole-ws" ]; then
    tar --null --no-recursion --numeric-owner -cpf "$C/workspace.tar" -T "$R/tmp/whole-ws" || rc2=$?
    owned+=("$C/workspace.tar")
fi
[ "$rc" -le 1 ] && [ "$rc2" -le 1 ]
cp "$last/manifest.gz" "$C/manifest.gz"
cp -p "$last/stamp" "$C/stamp"
cd /
rm -rf "$W" "$R/tmp/whole-home" "$R/tmp/whole-ws"
bytes=0
for f in "${owned[@]}" "$C/manifest.gz"; do bytes=$((bytes + $(stat -c %s "$f"))); done
printf -v info '{"turn":%s,"at":%s,"base":null,"files_changed":%s,"workspace_files_changed":%s,"deleted":0,"workspace_deleted":0,"bytes":%s}' \
    "$CKPT_TURN" "$CKPT_AT" "$files" "$ws_files" "$bytes"
printf '%s\n' "$info" >"$C/info.json"
# Owned as the checkpoint's were: the next turn's container, as the agent, reads the latest.
chown --reference="$last/manifest.gz" -- "${owned[@]}" "$C/manifest.gz" "$C/stamp" "$C/info.json"
printf '%s\n' "$info"
"#
);

/// Copies a checkpoint's files from `/from` into `/ckpt`, as they are (times too).
const COPY_SCRIPT: &str = r#"set -eu
cp -a /from/. /ckpt/
"#;

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
    checkpoint::settle(backend, f.session_id).await?;
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
        prune_to(
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

/// Prunes session `session_id`'s `checkpoints` (all of them, oldest first) to those of
/// turn `keep_from` on: a kept one whose changes are since one that goes is first written
/// again as a whole one (its chain unpacked and packed again in a scratch volume, then into
/// a fresh volume of its own name, whose labels say it is whole), then the older ones go.
/// Returns the turns removed. The caller makes sure no turn of the session runs.
async fn prune_to(
    backend: &impl Backend,
    session_id: Uuid,
    provider: ProviderKind,
    image: &str,
    checkpoints: &[Checkpoint],
    keep_from: u32,
) -> Result<Vec<u32>> {
    let id = session_id;
    for kept in checkpoints.iter().filter(|c| c.turn >= keep_from) {
        if kept.base.is_none_or(|b| b >= keep_from) {
            continue;
        }
        let chain = chain_to(checkpoints, kept.turn).ok_or_else(|| {
            Error::environment(format!(
                "the checkpoint of turn {} of session {id} misses a layer it is made of",
                kept.turn
            ))
        })?;
        make_whole(backend, id, provider, image, &chain).await?;
    }
    let mut removed = Vec::new();
    for c in checkpoints.iter().filter(|c| c.turn < keep_from) {
        backend
            .remove_volume(&names::checkpoint_volume(id, c.turn))
            .await?;
        removed.push(c.turn);
    }
    Ok(removed)
}

/// Writes the last checkpoint of `chain` again as a whole one, under its own name.
async fn make_whole(
    backend: &impl Backend,
    id: Uuid,
    provider: ProviderKind,
    image: &str,
    chain: &[Checkpoint],
) -> Result<()> {
    let last = chain.last().expect("a chain has its checkpoint");
    let scratch = format!("{}-whole", names::checkpoint_volume(id, last.turn));
    backend.remove_volume(&scratch).await?;
    backend
        .create_volume(&scratch, LabelSet::new(id, roles::PROBE).finish())
        .await?;
    let made = async {
        let mut spec = copier(
            image,
            id,
            WHOLE_SCRIPT,
            vec![
                format!("CKPT_CHAIN={}", chain_words(chain)),
                format!("CKPT_TURN={}", last.turn),
                format!("CKPT_AT={}", last.at),
            ],
        );
        spec.mounts = chain_mounts(id, chain);
        spec.mounts.push(MountSpec::volume(&scratch, NEW_DIR));
        run_helper(
            backend,
            id,
            &spec,
            last.turn,
            "writing again as a whole one",
        )
        .await?;
        // The name is what a fork and the next turn find it by, the labels what it holds:
        // both stay, so the volume is made anew.
        let volume = names::checkpoint_volume(id, last.turn);
        backend.remove_volume(&volume).await?;
        let whole = Checkpoint {
            base: None,
            ..last.clone()
        };
        backend
            .create_volume(&volume, whole.labels(id, provider))
            .await?;
        let mut spec = copier(image, id, COPY_SCRIPT, Vec::new());
        spec.mounts = vec![
            MountSpec::volume(&scratch, "/from").read_only(),
            MountSpec::volume(&volume, NEW_DIR),
        ];
        let copied = run_helper(backend, id, &spec, last.turn, "copying back").await;
        if copied.is_err() {
            // No half checkpoint for a fork to find: this one is lost, the older stay.
            let _ = backend.remove_volume(&volume).await;
        }
        copied
    };
    let outcome = made.await;
    let _ = backend.remove_volume(&scratch).await;
    outcome
}

async fn run_helper(
    backend: &impl Backend,
    id: Uuid,
    spec: &HelperSpec,
    turn: u32,
    doing: &str,
) -> Result<()> {
    let name = names::helper_container(id, "checkpoint");
    let (code, _, err) = backend.run_to_completion(&name, spec).await?;
    if code != 0 {
        return Err(Error::environment(format!(
            "{doing} the checkpoint of turn {turn} of session {id} failed: {}",
            err.trim()
        )));
    }
    Ok(())
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
