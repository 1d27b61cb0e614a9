//! `diff --patch`: what the agent changed, as a patch that `git apply` takes on the
//! workspace as it was when the session started — new, deleted, renamed, binary and mode
//! changes. Not the plain `diff` listing (that is [`crate::session::walls::workspace::diff`]).
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
use crate::session::store::names::{self, roles, LabelSet};
use crate::session::store::target::VolumeFacts;
use crate::session::walls::protected_out::{self, ProtectedChange};
use crate::session::walls::safe_git;
use crate::session::WorkspaceMode;

/// The copied tree as it was at session start, under HOME in the state volume.
pub const BASE_TAR_PATH: &str = ".caw-box/workspace-base.tar";

pub use crate::session::store::record::GitBase;

/// Exit codes of [`PATCH_SCRIPT`] that caw-box turns into their own messages.
const NO_BASE_TAR: i64 = 66;
const BASE_TREE_GONE: i64 = 67;

/// Records the tree of the bind-mode workspace (`CAW_WS`, default /workspace in a helper)
/// with a private repository over it ([`safe_git`]): prints `commit=` and `tree=`. The
/// tree's objects go to the workspace's object store, where [`PATCH_SCRIPT`] finds them.
const BASE_SCRIPT: &str = r#"ws="${CAW_WS:-/workspace}"
private_repo "$ws" "$CAW_TMP/git"
export GIT_OBJECT_DIRECTORY="$ws/.git/objects" GIT_INDEX_FILE="$CAW_TMP/index"
head=$(head_of "$ws")
# The real index, copied: its stat data spares hashing unchanged files; it stays untouched.
# (A split index needs its shared part, which is not copied: then without the stat data.)
if [ -f "$ws/.git/index" ]; then cp "$ws/.git/index" "$GIT_INDEX_FILE"; fi
cd "$ws"
git add -A . 2>/dev/null || { rm -f "$GIT_INDEX_FILE"; git add -A .; }
echo "commit=$head"
echo "tree=$(git write-tree)"
"#;

/// Writes the patch from the baseline to /workspace now, with a private repository
/// ([`safe_git`]); prints base64 lines (byte-exact): the patch; the protected paths it
/// changed (`git diff --name-status -z`); in copy mode, a tar of the protected paths inside
/// `.git` (a patch never carries `.git`) and the copied tree's record (`CAW_BASE_JSON`).
/// Copy mode: `CAW_BASE_TAR`, the copied tree, is unpacked and hashed too. Bind mode:
/// `CAW_BASE_TREE` is in the workspace's object store (mounted read-only), an alternate of
/// a private one. `CAW_PROTECTED`: the session's protected paths, one a line, left out of the
/// patch unless `CAW_INCLUDE_PROTECTED=1`.
const PATCH_SCRIPT: &str = r#"t=/tmp/caw-box-patch
mkdir -p "$t/objects"
private_repo /workspace "$t/git"
export GIT_OBJECT_DIRECTORY="$t/objects"
tree_of() {
  GIT_WORK_TREE="$1" GIT_INDEX_FILE="$2" git -C "$1" add -A .
  GIT_WORK_TREE="$1" GIT_INDEX_FILE="$2" git -C "$1" write-tree
}
if [ -n "${CAW_BASE_TAR:-}" ]; then
  [ -f "$CAW_BASE_TAR" ] || exit 66
  mkdir "$t/base"
  tar -xf "$CAW_BASE_TAR" -C "$t/base"
  base=$(tree_of "$t/base" "$t/base.index")
else
  export GIT_ALTERNATE_OBJECT_DIRECTORIES=/workspace/.git/objects
  base="$CAW_BASE_TREE"
  git cat-file -e "$base^{tree}" 2>/dev/null || exit 67
  if [ -f /workspace/.git/index ]; then cp /workspace/.git/index "$t/now.index"; fi
fi
now=$(tree_of /workspace "$t/now.index")
set --
while IFS= read -r p; do
  if [ -n "$p" ]; then set -- "$@" ":(literal,icase)$p"; fi
done <<EOF
${CAW_PROTECTED:-}
EOF
: > "$t/protected"
if [ $# -gt 0 ]; then
  git diff --name-status -z --no-renames "$base" "$now" -- "$@" > "$t/protected"
fi
set -- .
if [ "${CAW_INCLUDE_PROTECTED:-}" != 1 ]; then
  while IFS= read -r p; do
    if [ -n "$p" ]; then set -- "$@" ":(exclude,literal,icase)$p"; fi
  done <<EOF
${CAW_PROTECTED:-}
EOF
fi
git diff --binary -M --no-color --no-ext-diff --no-textconv "$base" "$now" -- "$@" > "$t/patch"
base64 -w0 "$t/patch"; echo
base64 -w0 "$t/protected"; echo
if [ -n "${CAW_BASE_JSON:-}" ]; then
  cd /workspace
  set --
  while IFS= read -r p; do
    case "$p" in .git/*) if [ -e "$p" ] || [ -L "$p" ]; then set -- "$@" "$p"; fi ;; esac
  done <<EOF
${CAW_PROTECTED:-}
EOF
  if [ $# -gt 0 ]; then
    tar -cf "$t/git.tar" --exclude='.git/modules/*/objects' -- "$@"
    base64 -w0 "$t/git.tar"
  fi
  echo
  if [ -f "$CAW_BASE_JSON" ]; then base64 -w0 "$CAW_BASE_JSON"; fi
  echo
fi
"#;

/// The uid:gid git writes a bind-mode workspace's objects as: the invoking user's own, so
/// objects it writes into the repository are theirs; for root, the object store's owner
/// (an object directory root made would be closed to the owner, and to an agent running as
/// the owner, whose commit then fails once its object falls in that directory).
fn object_writer(dir: &str) -> (u32, u32) {
    safe_git::writer_for_root(&std::path::Path::new(dir).join(".git/objects"))
        .unwrap_or_else(crate::dirs::host_ids)
}

fn git_helper(image: &str, session_id: Uuid, body: &str, mounts: Vec<MountSpec>) -> HelperSpec {
    HelperSpec {
        image: image.to_string(),
        entrypoint: vec!["sh".into(), "-c".into(), safe_git::script(body)],
        env: safe_git::helper_env(),
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
    // Where the daemon sees this machine's files, this machine's git does it (hardened: see
    // `safe_git`) in tens of milliseconds instead of a helper container's ~350 ms; the
    // helper remains for the rest (no git here, a repository git refuses to touch as this
    // user, a failure of any kind).
    if matches!(backend.host_dirs(), crate::backend::HostDirs::Shared) {
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
    spec.env.push("CAW_TMP=/tmp/caw-box-base".into());
    let (uid, gid) = object_writer(dir);
    spec.user = Some(format!("{uid}:{gid}"));
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

/// [`BASE_SCRIPT`] run by this machine's git, as this user (who runs caw-box in the repo;
/// root as the repository's owner: [`object_writer`]), hardened ([`safe_git::run_on_host`]).
pub async fn host_base(dir: &str) -> Option<GitBase> {
    let me = crate::dirs::host_ids();
    let writer = Some(object_writer(dir)).filter(|w| *w != me);
    let out = safe_git::run_on_host_as(BASE_SCRIPT, &[("CAW_WS", dir)], writer).await?;
    parse_base(&out)
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

/// A patch, and the agent's changes to protected paths that it leaves out (or carries).
#[derive(Debug)]
pub struct Patch {
    /// Empty: no change.
    pub bytes: Vec<u8>,
    pub protected: Vec<ProtectedChange>,
}

/// The patch from the session's baseline to its workspace now, without the changes to the
/// session's protected paths unless `include_protected` (changes inside `.git`, which a
/// patch never carries, are listed for a copied workspace all the same).
pub async fn patch(
    backend: &impl Backend,
    facts: &VolumeFacts,
    agent_ids: (u32, u32),
    include_protected: bool,
) -> Result<Patch> {
    let id = facts.session_id;
    let image = &facts.settings.image;
    let protected_paths = facts.settings.protected_paths();
    let mut spec = match facts.settings.workspace_mode {
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
            spec.env.push(format!(
                "CAW_BASE_JSON={AGENT_HOME}/{}",
                protected_out::RECORD_PATH
            ));
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
            let (uid, gid) = object_writer(&dir);
            let mut spec = git_helper(
                image,
                id,
                PATCH_SCRIPT,
                vec![MountSpec::host_dir(dir, WORKSPACE_DIR).read_only()],
            );
            spec.env.push(format!("CAW_BASE_TREE={}", base.tree));
            spec.user = Some(format!("{uid}:{gid}"));
            spec
        }
        WorkspaceMode::None => {
            return Err(Error::usage(format!(
                "session {id} has no workspace (it was started with --workspace-mode none)"
            )))
        }
    };
    spec.env
        .push(format!("CAW_PROTECTED={}", protected_paths.join("\n")));
    if include_protected {
        spec.env.push("CAW_INCLUDE_PROTECTED=1".into());
    }
    let name = names::helper_container(id, "patch");
    let (code, out, err) = backend
        .run_to_completion(&name, &spec)
        .await
        .map_err(|e| crate::session::turn::image_hint_for(e, image, facts.provider))?;
    match code {
        0 => read_patch(&out, &protected_paths, include_protected),
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

/// The lines of [`PATCH_SCRIPT`]: the patch, the protected paths git saw change, and in copy
/// mode the protected paths inside `.git` with the copy's record to judge them by.
fn read_patch(out: &str, protected_paths: &[String], include: bool) -> Result<Patch> {
    let damaged =
        |e: &dyn std::fmt::Display| Error::environment(format!("the patch came back damaged: {e}"));
    let mut lines = out.split('\n').map(|l| {
        base64::engine::general_purpose::STANDARD
            .decode(l.trim())
            .map_err(|e| damaged(&e))
    });
    let bytes = lines.next().unwrap_or(Ok(Vec::new()))?;
    let mut protected = match lines.next() {
        Some(names) => protected_out::changes_from_git(&names?, include),
        None => return Err(damaged(&"no list of protected paths")),
    };
    if let (Some(git_tar), Some(record)) = (lines.next(), lines.next()) {
        let (git_tar, record) = (git_tar?, record?);
        if git_tar.is_empty() {
            return Ok(Patch { bytes, protected });
        }
        let record: Option<protected_out::CopyRecord> = serde_json::from_slice(&record).ok();
        protected.extend(protected_out::changes_in_tar(
            &git_tar,
            &protected_out::Protected::new(protected_paths),
            record.as_ref(),
        )?);
    }
    Ok(Patch { bytes, protected })
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

    /// `git args` in `dir` with an identity, as a user would run it; stdout.
    fn git(dir: &std::path::Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The baseline by this machine's git runs neither the clean filter nor the fsmonitor
    /// program the repository names, and records the raw tree; the same repository under
    /// git as a user runs it fires both (the control).
    #[tokio::test]
    async fn the_host_baseline_runs_no_program_the_repository_names() {
        let ws = tempfile::tempdir().unwrap();
        let marks = tempfile::tempdir().unwrap();
        let (w, m) = (ws.path(), marks.path().display());
        std::fs::write(w.join("keep.txt"), "kept\n").unwrap();
        git(w, &["init", "-q"]);
        git(w, &["add", "."]);
        git(w, &["commit", "-qm", "base"]);
        let head = git(w, &["rev-parse", "HEAD"]);
        git(
            w,
            &[
                "config",
                "filter.x.clean",
                &format!("echo x >> {m}/filter; tr a-z A-Z"),
            ],
        );
        git(
            w,
            &[
                "config",
                "core.fsmonitor",
                &format!("echo x >> {m}/fsmonitor; false"),
            ],
        );
        std::fs::write(w.join(".gitattributes"), "* filter=x\n").unwrap();
        std::fs::write(w.join("new.txt"), "new\n").unwrap();

        let base = host_base(w.to_str().unwrap()).await.expect("a baseline");
        assert_eq!(base.commit.as_deref(), Some(head.as_str()));
        let fired = || {
            ["filter", "fsmonitor"]
                .into_iter()
                .filter(|f| marks.path().join(f).exists())
                .collect::<Vec<_>>()
        };
        assert_eq!(fired(), Vec::<&str>::new());
        // In the workspace's object store, as the patch helper looks for it, unfiltered.
        assert_eq!(
            git(w, &["cat-file", "-p", &format!("{}:new.txt", base.tree)]),
            "new"
        );

        let index = tempfile::NamedTempFile::new().unwrap();
        std::fs::copy(w.join(".git/index"), index.path()).unwrap();
        let control = std::process::Command::new("git")
            .args(["add", "-A", "."])
            .env("GIT_INDEX_FILE", index.path())
            .current_dir(w)
            .output()
            .unwrap();
        assert!(control.status.success(), "{control:?}");
        assert_eq!(
            fired(),
            vec!["filter", "fsmonitor"],
            "the control did not fire"
        );
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
