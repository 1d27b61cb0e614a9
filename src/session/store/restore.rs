//! Filling a fork's new volumes: from the checkpoints' layers up to its turn
//! ([`RestoreFrom::Checkpoints`]), or for the source's latest turn from the source's own
//! volumes ([`RestoreFrom::Volumes`]); and the fork's record, last. One root helper per fork
//! with only the capabilities a faithful copy needs (`checkpoint::copier`).

use uuid::Uuid;

use crate::backend::{HelperSpec, MountSpec};
use crate::provider::{ProviderKind, AGENT_HOME, WORKSPACE_DIR};
use crate::session::store::checkpoint::{
    chain_mounts, chain_words, copier, never_kept, Checkpoint, BASE_TAR,
};
use crate::session::store::names;

/// Where a restore helper has the source session's state volume (read-only): [`BASE_TAR`].
const SOURCE_HOME_DIR: &str = "/srchome";

/// `layers_of`: the checkpoints of `$CKPT_CHAIN` (mounted at `$R/c/<turn>`) whose layers a
/// restore of its last one applies, oldest first, into the array `use`: from that one back
/// along the bases its `info.json` names (a checkpoint taken when the one before it was never
/// finished holds every file); one never finished (no `info.json`) is refused, exit 3,
/// never applied in part.
macro_rules! layers_of_fn {
    () => {
        r#"layers_of() {
    local chain=($CKPT_CHAIN) want i c b
    want=${chain[${#chain[@]}-1]}
    use=()
    for ((i = ${#chain[@]} - 1; i >= 0; i--)); do
        c=${chain[i]}
        [ "$c" = "$want" ] || continue
        if [ ! -f "$R/c/$c/info.json" ]; then
            echo "caw-box: the checkpoint of turn $c was never finished: it cannot be restored" >&2
            exit 3
        fi
        use=("$c" "${use[@]}")
        b=$(sed -n 's/.*"base":\([0-9][0-9]*\).*/\1/p' "$R/c/$c/info.json")
        [ -n "$b" ] || return 0
        want=$b
    done
    echo "caw-box: the checkpoint of turn $want is missing from the chain" >&2
    exit 3
}
"#
    };
}
pub(crate) use layers_of_fn;

/// Restores the checkpoints `CKPT_CHAIN` (their turns, oldest first, mounted at
/// `/c/<turn>`) into HOME (unless `CKPT_HOME=0`: a fork in another vendor's CLI starts its
/// own, and gets only the copy-mode workspace's base) and `/workspace` (when
/// `CKPT_WORKSPACE=1`): each layer in turn, then every path the last one's manifest does not
/// list is deleted. With `CKPT_COPY=1` (a fork of the latest turn, in the source's CLI) it
/// copies the source's own HOME and workspace instead (at `/srchome`, `/srcws`) and deletes
/// what no checkpoint holds (`CKPT_EXCLUDE`). Then the fork's record (`CKPT_RECORD`).
pub(in crate::session) const RESTORE_SCRIPT: &str = concat!(
    r#"set -eu
export LC_ALL=C
R=${CKPT_ROOT:-}
cd "${R:-/}"
roots=()
aside=()
if [ "${CKPT_HOME:-1}" = 1 ]; then
    roots+=(home/agent)
else
    aside+=(--transform 's,^home/agent,tmp/ckpt-home,')
fi
[ "$CKPT_WORKSPACE" = 1 ] && roots+=(workspace)

"#,
    layers_of_fn!(),
    r#"from_layers() {
    local c layer last= use
    layers_of
    for c in "${use[@]}"; do
        # (HOME's layer: zstd, or gzip where the image that took it had no zstd.)
        for layer in home.tar.zst home.tar.gz workspace.tar; do
            [ -f "$R/c/$c/$layer" ] || continue
            tar --numeric-owner "${aside[@]}" -xpf "$R/c/$c/$layer" -C "${R:-/}"
        done
        last="$R/c/$c"
    done
    if [ "${CKPT_HOME:-1}" != 1 ]; then
        # Another vendor's HOME: only the copy-mode workspace's base, which `diff` compares
        # with.
        for f in workspace-base.tar workspace-base.json; do
            if [ -e "tmp/ckpt-home/.caw-box/$f" ]; then
                mkdir -p home/agent/.caw-box
                cp -p "tmp/ckpt-home/.caw-box/$f" "home/agent/.caw-box/$f"
            fi
        done
        rm -rf tmp/ckpt-home
    fi
    [ ${#roots[@]} -gt 0 ] || return 0
    find "${roots[@]}" -print0 | sort -z >"$R/tmp/now"
    comm -z -23 "$R/tmp/now" <(gzip -dc "$last/manifest.gz") | xargs -0 -r rm -rf --
    # What no checkpoint holds but the session keeps from its start: from the source's HOME.
    if [ -n "${CKPT_FROM_SOURCE:-}" ] && [ -f "$R/srchome/$CKPT_FROM_SOURCE" ]; then
        mkdir -p "home/agent/$(dirname "$CKPT_FROM_SOURCE")"
        cp -p "$R/srchome/$CKPT_FROM_SOURCE" "home/agent/$CKPT_FROM_SOURCE"
    fi
}

from_volumes() {
    local d p
    # (`cloned`: the fork's volumes are the source's already, the storage's snapshots.)
    if [ "$CKPT_COPY" != cloned ]; then
        # The fresh volumes' copy of the image's directories goes first: the fork is the
        # source.
        for d in "${roots[@]}"; do
            find "$d" -mindepth 1 -delete
        done
        # `cp` has the kernel copy each file in place where it can (a tar is read and
        # written).
        cp -a "$R/srchome/." home/agent/
        if [ "$CKPT_WORKSPACE" = 1 ]; then
            cp -a "$R/srcws/." workspace/
        fi
    fi
    while IFS= read -r p; do
        [ -z "$p" ] || rm -rf -- "home/agent/$p"
    done <<<"${CKPT_EXCLUDE:-}"
}

if [ "${CKPT_COPY:-0}" != 0 ]; then
    from_volumes
else
    from_layers
fi
# The fork's own record (a file of the helper's scratch), which no checkpoint holds: last,
# so that nothing above deletes it.
if [ -n "${CKPT_RECORD:-}" ]; then
    if [ ! -d home/agent/.caw-box ]; then
        mkdir -m 0700 home/agent/.caw-box
        chown --reference=home/agent home/agent/.caw-box
    fi
    cp -p "$R$CKPT_RECORD" home/agent/.caw-box/session.json
fi
"#
);

/// What a restore puts in the fork's HOME.
#[derive(Debug)]
pub enum Restored {
    /// The checkpoints' HOME, with the fork's record (its `session.json`, owned by `owner`).
    WithRecord { json: Vec<u8>, owner: (u32, u32) },
    /// Only the copy-mode workspace's base: a fork in another vendor's CLI, whose HOME is
    /// its own image's.
    BaseOnly,
}

/// Where a restore helper has the fork's record before it starts (its scratch).
const RECORD_SCRATCH: &str = "/run/caw-box-fork";
const RECORD_FILE: &str = "session.json";

/// Where a restore helper has the source's workspace volume (read-only), when it copies
/// the source's volumes ([`RestoreFrom::Volumes`]).
const SOURCE_WORKSPACE_DIR: &str = "/srcws";

/// What a fork's restore starts from.
#[derive(Debug, Clone, Copy)]
pub enum RestoreFrom<'a> {
    /// The checkpoints up to the turn, oldest first ([`chain_to`]).
    Checkpoints(&'a [Checkpoint]),
    /// The source session's own volumes, as its latest turn left them (of a `provider`
    /// session, whose credential files stay behind).
    Volumes(ProviderKind),
    /// The fork's volumes are copies of the source's already (the storage's snapshots): only
    /// what no checkpoint holds goes, and the record comes.
    Cloned(ProviderKind),
}

/// The helper that restores a fork `into` of session `from` (in `image`, the source's: its
/// tar and owner ids): HOME as `home` says, and the copy-mode workspace when `workspace`.
pub fn restore_spec(
    image: &str,
    from: Uuid,
    into: Uuid,
    source: RestoreFrom<'_>,
    home: Restored,
    workspace: bool,
) -> HelperSpec {
    let mut env = vec![
        format!(
            "CKPT_HOME={}",
            u8::from(!matches!(home, Restored::BaseOnly))
        ),
        format!("CKPT_WORKSPACE={}", u8::from(workspace)),
    ];
    let mut mounts = Vec::new();
    match source {
        RestoreFrom::Checkpoints(chain) => {
            env.push(format!("CKPT_CHAIN={}", chain_words(chain)));
            if workspace {
                env.push(format!("CKPT_FROM_SOURCE={BASE_TAR}"));
            }
            mounts = chain_mounts(from, chain);
        }
        RestoreFrom::Volumes(provider) | RestoreFrom::Cloned(provider) => {
            // The workspace's base stays: the fork's `diff` compares with it.
            let kept: Vec<String> = never_kept(provider)
                .lines()
                .filter(|p| *p != BASE_TAR)
                .map(str::to_string)
                .collect();
            let mode = if matches!(source, RestoreFrom::Cloned(_)) {
                "cloned"
            } else {
                "1"
            };
            env.push(format!("CKPT_COPY={mode}"));
            env.push(format!("CKPT_EXCLUDE={}", kept.join("\n")));
            if workspace && matches!(source, RestoreFrom::Volumes(_)) {
                mounts.push(
                    MountSpec::volume(names::workspace_volume(from), SOURCE_WORKSPACE_DIR)
                        .read_only(),
                );
            }
        }
    }
    // The source's HOME: copied, or where the workspace's base comes from.
    let reads_source_home = match source {
        RestoreFrom::Checkpoints(_) => workspace,
        RestoreFrom::Volumes(_) => true,
        RestoreFrom::Cloned(_) => false,
    };
    if reads_source_home {
        mounts.push(MountSpec::volume(names::state_volume(from), SOURCE_HOME_DIR).read_only());
    }
    mounts.push(MountSpec::volume(names::state_volume(into), AGENT_HOME));
    if workspace {
        mounts.push(MountSpec::volume(
            names::workspace_volume(into),
            WORKSPACE_DIR,
        ));
    }
    let mut spec = copier(image, into, RESTORE_SCRIPT, env);
    spec.mounts = mounts;
    if let Restored::WithRecord { json, owner } = home {
        spec.env
            .push(format!("CKPT_RECORD={RECORD_SCRATCH}/{RECORD_FILE}"));
        spec.scratch = Some(crate::backend::Scratch {
            mount: RECORD_SCRATCH.into(),
            owner,
            files: vec![crate::backend::ScratchFile {
                path: RECORD_FILE.into(),
                contents: json,
                mode: 0o600,
            }],
            labels: Default::default(),
        });
    }
    spec
}
