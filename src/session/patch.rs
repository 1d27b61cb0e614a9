//! `diff --patch`: what the agent changed, as a patch that `git apply` takes on the
//! workspace as it was when the session started — new, deleted, renamed, binary and mode
//! changes. Not the plain `diff` listing (that is [`super::workspace::diff`]).
//!
//! Each session keeps a baseline from its start: a copy-mode session keeps the copied tree
//! (without `.git`) as a tar in its state volume, next to the hashes `diff` reads; a
//! bind-mode session in a git repository keeps the ids of its HEAD commit and of a tree of
//! its working tree (untracked files included), written with a temporary index, as a label
//! of its state volume. The tree's objects go to the repository's object store, unreachable:
//! no ref, no index and no file of the user's changes, and `git gc` may prune them after its
//! grace period (two weeks by default), after which the patch is refused. Git runs in a
//! short helper container of the session's image (every image has git), like `diff`.

use base64::Engine;
use uuid::Uuid;

use crate::backend::{Backend, HelperSpec, MountSpec, NetworkPolicy};
use crate::error::{Error, Result};
use crate::provider::{AGENT_HOME, WORKSPACE_DIR};
use crate::session::names::{self, roles, LabelSet};
use crate::session::target::VolumeFacts;
use crate::session::WorkspaceMode;

/// The copied tree as it was at session start, under HOME in the state volume.
pub const BASE_TAR_PATH: &str = ".caw-box/workspace-base.tar";

pub use crate::session::record::GitBase;

/// Exit codes of [`PATCH_SCRIPT`] that caw-box turns into their own messages.
const NO_BASE_TAR: i64 = 66;
const BASE_TREE_GONE: i64 = 67;

/// Records the tree of the bind-mode workspace (`CAW_WS`, default /workspace in a helper):
/// prints `commit=` and `tree=`.
const BASE_SCRIPT: &str = r#"set -eu
cd "${CAW_WS:-/workspace}"
head=$(git rev-parse -q --verify 'HEAD^{commit}' || true)
export GIT_INDEX_FILE="${CAW_INDEX:-/tmp/caw-box-base.index}"
# The real index, copied: its stat data spares hashing unchanged files; it stays untouched.
if [ -f .git/index ]; then cp .git/index "$GIT_INDEX_FILE"; fi
git add -A .
echo "commit=$head"
echo "tree=$(git write-tree)"
"#;

/// Writes the patch from the baseline to /workspace now, base64 on stdout (byte-exact).
/// Copy mode: `CAW_BASE_TAR`, the copied tree, is unpacked and hashed into a private
/// repository. Bind mode: `CAW_BASE_TREE` is in the workspace's repository, whose object
/// store (mounted read-only) is an alternate of a private one.
const PATCH_SCRIPT: &str = r#"set -eu
t=/tmp/caw-box-patch
mkdir -p "$t"
tree_of() {
  GIT_WORK_TREE="$1" GIT_INDEX_FILE="$2" git -C "$1" add -A .
  GIT_WORK_TREE="$1" GIT_INDEX_FILE="$2" git -C "$1" write-tree
}
if [ -n "${CAW_BASE_TAR:-}" ]; then
  [ -f "$CAW_BASE_TAR" ] || exit 66
  git init -q "$t/repo"
  export GIT_DIR="$t/repo/.git"
  if [ -f /workspace/.git/info/exclude ]; then cp /workspace/.git/info/exclude "$GIT_DIR/info/"; fi
  mkdir "$t/base"
  tar -xf "$CAW_BASE_TAR" -C "$t/base"
  base=$(tree_of "$t/base" "$t/base.index")
else
  export GIT_DIR=/workspace/.git GIT_OBJECT_DIRECTORY="$t/objects"
  export GIT_ALTERNATE_OBJECT_DIRECTORIES=/workspace/.git/objects
  mkdir -p "$GIT_OBJECT_DIRECTORY"
  base="$CAW_BASE_TREE"
  git cat-file -e "$base^{tree}" 2>/dev/null || exit 67
  if [ -f /workspace/.git/index ]; then cp /workspace/.git/index "$t/now.index"; fi
fi
now=$(tree_of /workspace "$t/now.index")
git diff --binary -M --no-color --no-ext-diff --no-textconv "$base" "$now" > "$t/patch"
base64 -w0 "$t/patch"
"#;

/// The uid:gid git runs as on a bind-mode workspace: the invoking user's own, so objects it
/// writes into the repository are theirs (root: root, with every capability dropped).
fn host_user() -> String {
    let (uid, gid) = crate::dirs::host_ids();
    format!("{uid}:{gid}")
}

fn git_helper(image: &str, session_id: Uuid, script: &str, mounts: Vec<MountSpec>) -> HelperSpec {
    HelperSpec {
        image: image.to_string(),
        entrypoint: vec!["sh".into(), "-c".into(), script.to_string()],
        env: vec![
            "HOME=/tmp".into(),
            "GIT_OPTIONAL_LOCKS=0".into(),
            "LC_ALL=C".into(),
        ],
        labels: LabelSet::new(session_id, roles::PROBE).finish(),
        mounts,
        network: NetworkPolicy::None,
        drop_all_capabilities: true,
        no_new_privileges: true,
        ..Default::default()
    }
}

/// The baseline of a new bind-mode session whose workspace `dir` is a git repository (its
/// `.git` a directory at its top, so the container sees it); `None` otherwise, or when git
/// failed (said in a warning: the session runs, only `diff --patch` will be refused).
pub async fn record_bind_base(
    backend: &impl Backend,
    session_id: Uuid,
    image: &str,
    dir: &str,
) -> Option<GitBase> {
    if dir.is_empty() || !std::path::Path::new(dir).join(".git").is_dir() {
        return None;
    }
    // Where the daemon sees this machine's files, this machine's git does it in ~10 ms
    // instead of a helper container's ~350 ms; the helper remains for the rest (no git
    // here, a repository git refuses to touch as this user).
    if backend.surely_shares_paths() {
        if let Some(base) = host_base(dir).await {
            return Some(base);
        }
    }
    let mut spec = git_helper(
        image,
        session_id,
        BASE_SCRIPT,
        vec![MountSpec::host_dir(dir, WORKSPACE_DIR)],
    );
    spec.user = Some(host_user());
    let name = names::helper_container(session_id, "git-base");
    let outcome = backend.run_to_completion(&name, &spec).await;
    let failed = |why: &str| {
        tracing::warn!("no baseline of workspace '{dir}' for `caw-box diff --patch`: {why}");
        None
    };
    match outcome {
        Ok((0, out, _)) => match parse_base(&out) {
            Some(base) => Some(base),
            None => failed(&format!("git printed {out:?}")),
        },
        Ok((code, _, err)) => failed(&format!("git exited with {code}: {}", err.trim())),
        Err(e) => failed(&Error::from(e).to_string()),
    }
}

/// [`BASE_SCRIPT`] run by this machine's git, as this user (who runs caw-box in the repo).
async fn host_base(dir: &str) -> Option<GitBase> {
    let index = tempfile::tempdir().ok()?;
    let out = tokio::process::Command::new("sh")
        .args(["-c", BASE_SCRIPT])
        .env("CAW_WS", dir)
        .env("CAW_INDEX", index.path().join("index"))
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .ok()?;
    if !out.status.success() {
        tracing::debug!(
            "the host's git could not record the workspace: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    parse_base(&String::from_utf8_lossy(&out.stdout))
}

fn parse_base(out: &str) -> Option<GitBase> {
    let field = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
    };
    let is_id = |s: &str| s.len() >= 40 && s.chars().all(|c| c.is_ascii_hexdigit());
    let tree = field("tree=").filter(|t| is_id(t))?;
    let commit = field("commit=").filter(|c| is_id(c));
    Some(GitBase { commit, tree })
}

/// The patch from the session's baseline to its workspace now (empty: no change).
pub async fn patch(
    backend: &impl Backend,
    facts: &VolumeFacts,
    agent_ids: (u32, u32),
) -> Result<Vec<u8>> {
    let id = facts.session_id;
    let image = &facts.settings.image;
    let spec = match facts.settings.workspace_mode {
        WorkspaceMode::Copy => {
            let mut spec = git_helper(
                image,
                id,
                PATCH_SCRIPT,
                vec![
                    MountSpec::volume(names::workspace_volume(id), WORKSPACE_DIR).read_only(),
                    MountSpec::volume(names::state_volume(id), AGENT_HOME).read_only(),
                ],
            );
            spec.env
                .push(format!("CAW_BASE_TAR={AGENT_HOME}/{BASE_TAR_PATH}"));
            spec.user = Some(format!("{}:{}", agent_ids.0, agent_ids.1));
            spec
        }
        WorkspaceMode::Bind => {
            let base = facts
                .workspace_base
                .as_ref()
                .ok_or_else(|| no_bind_base(facts))?;
            let dir = facts.settings.workspace.clone().unwrap_or_default();
            if !std::path::Path::new(&dir).is_dir() {
                return Err(Error::environment(format!(
                    "the session's workspace '{dir}' does not exist"
                )));
            }
            let mut spec = git_helper(
                image,
                id,
                PATCH_SCRIPT,
                vec![MountSpec::host_dir(dir, WORKSPACE_DIR).read_only()],
            );
            spec.env.push(format!("CAW_BASE_TREE={}", base.tree));
            spec.user = Some(host_user());
            spec
        }
        WorkspaceMode::None => {
            return Err(Error::usage(format!(
                "session {id} has no workspace (it was started with --workspace-mode none)"
            )))
        }
    };
    let name = names::helper_container(id, "patch");
    let (code, out, err) = backend
        .run_to_completion(&name, &spec)
        .await
        .map_err(|e| crate::session::turn::image_hint_for(e, image, facts.provider))?;
    match code {
        0 => base64::engine::general_purpose::STANDARD
            .decode(out.trim())
            .map_err(|e| Error::environment(format!("the patch came back damaged: {e}"))),
        NO_BASE_TAR => Err(Error::usage(format!(
            "session {id} was started before caw-box kept a baseline of copied workspaces"
        ))
        .with_hint(format!(
            "`caw-box diff {id}` lists what changed; `caw-box export {id} DIR` writes the files out"
        ))),
        BASE_TREE_GONE => Err(Error::environment(format!(
            "the workspace's tree from the start of session {id} is no longer in its git \
             repository (pruned by `git gc`?)"
        ))
        .with_hint("`git diff` in the workspace shows the changes against a commit")),
        _ => Err(Error::environment(format!(
            "git in the workspace of session {id} failed (exit {code}): {}",
            err.trim()
        ))),
    }
}

fn no_bind_base(facts: &VolumeFacts) -> Error {
    let id = facts.session_id;
    Error::usage(format!(
        "session {id} has no baseline to make a patch against: its workspace was not a git \
         repository (with .git at its top) when it started, or the session is older than \
         `diff --patch`"
    ))
    .with_hint("`git diff` in the workspace shows the changes against a commit")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_read_from_the_helpers_lines() {
        let tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
        let commit = "a".repeat(40);
        assert_eq!(
            parse_base(&format!("commit={commit}\ntree={tree}\n")),
            Some(GitBase {
                commit: Some(commit),
                tree: tree.into()
            })
        );
        // A repository without commits: a tree, no commit.
        assert_eq!(
            parse_base(&format!("commit=\ntree={tree}\n")),
            Some(GitBase {
                commit: None,
                tree: tree.into()
            })
        );
        assert_eq!(parse_base("fatal: not a git repository\n"), None);
        assert_eq!(parse_base("tree=nothex\n"), None);
    }

    #[test]
    fn the_label_round_trips() {
        let base = GitBase {
            commit: None,
            tree: "t".into(),
        };
        let json = serde_json::to_string(&base).unwrap();
        assert_eq!(json, r#"{"tree":"t"}"#);
        assert_eq!(serde_json::from_str::<GitBase>(&json).unwrap(), base);
    }
}
