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
use crate::session::walls::numstat::{self, FileChange};
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

/// Writes the patch from the baseline to the workspace now (`CAW_WS`, default /workspace in
/// a helper), with a private repository ([`safe_git`]); prints base64 lines (byte-exact): the
/// patch; its files as git counts them (`--numstat -z`); the protected paths it changed
/// (`git diff --name-status -z`); in copy mode, a tar of the protected paths inside `.git` (a
/// patch never carries `.git`) and the copied tree's record (`CAW_BASE_JSON`).
/// Copy mode: `CAW_BASE_TAR`, the copied tree, is unpacked and hashed too. Bind mode:
/// `CAW_BASE_TREE` is in the workspace's object store (mounted read-only), an alternate of
/// a private one. `CAW_PROTECTED`: the session's protected paths, one a line, left out of the
/// patch unless `CAW_INCLUDE_PROTECTED=1`.
///
/// The patch is UTF-8, so that it can travel as text (an MCP answer) and still apply byte
/// for byte: git C-quotes paths (`core.quotePath`), and a file whose old or new content is
/// not UTF-8 gets a binary hunk. Git diffs such a file as text (only a NUL makes a file
/// binary to it), so when the patch is not UTF-8, [`BINARY_MARKS`] marks those files
/// `binary` in the private repository's `info/attributes` (which outranks the workspace's
/// own `.gitattributes`) and git writes the patch again. Without perl (every Debian image
/// has it: git needs it) the patch stays as git wrote it, as it does for a symbolic link to
/// a name that is not UTF-8 (git diffs a link as text whatever its attributes);
/// [`Patch::text`] says so.
const PATCH_SCRIPT: &str = r#"ws="${CAW_WS:-/workspace}"
t="${CAW_TMP:-/tmp}/caw-box-patch"
mkdir -p "$t/objects"
private_repo "$ws" "$t/git"
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
  export GIT_ALTERNATE_OBJECT_DIRECTORIES="$ws/.git/objects"
  base="$CAW_BASE_TREE"
  git cat-file -e "$base^{tree}" 2>/dev/null || exit 67
  if [ -f "$ws/.git/index" ]; then cp "$ws/.git/index" "$t/now.index"; fi
fi
now=$(tree_of "$ws" "$t/now.index")
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
patch_now() {
  git -c core.quotePath=true diff --binary -M --no-color --no-ext-diff --no-textconv \
    "$base" "$now" -- "$@" > "$t/patch"
  git diff --numstat -z -M --no-ext-diff --no-textconv "$base" "$now" -- "$@" > "$t/files"
}
patch_now "$@"
if [ -s "$t/patch" ] && command -v perl >/dev/null 2>&1; then
  printf '%s' "$CAW_BINARY_MARKS" > "$t/marks.pl"
  if ! perl "$t/marks.pl" check < "$t/patch"; then
    git diff --raw -z --no-abbrev -M "$base" "$now" -- "$@" > "$t/raw"
    perl "$t/marks.pl" marks < "$t/raw" > "$GIT_DIR/info/attributes"
    patch_now "$@"
  fi
fi
base64 -w0 "$t/patch"; echo
base64 -w0 "$t/files"; echo
base64 -w0 "$t/protected"; echo
if [ -n "${CAW_BASE_JSON:-}" ]; then
  cd "$ws"
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

/// The Perl program [`PATCH_SCRIPT`] runs (`CAW_BINARY_MARKS`; Perl is in every Debian
/// image). `check`: exit 0 when stdin is UTF-8 as Rust defines it (no overlong form,
/// surrogate or code point past U+10FFFF; glibc's `iconv` lets the last pass). `marks`: reads
/// `git diff --raw -z` and prints an `info/attributes` line marking `binary` each path (both
/// names of a rename) whose old or new blob is not UTF-8. A pattern is the path anchored at
/// the top (`/`), its glob characters escaped, C-quoted (git unquotes a pattern that starts
/// with `"`); past git's line limit (2048 bytes: it ignores longer lines) its non-ASCII bytes
/// become `?`, which may mark a neighbour of the same shape too, whose binary hunk applies as
/// exactly.
const BINARY_MARKS: &str = r#"use strict;
use warnings;
sub utf8_ok {
  my ($s) = @_;
  pos($s) = 0;
  1 while $s =~ /\G(?:[\x00-\x7F]+|[\xC2-\xDF][\x80-\xBF]|\xE0[\xA0-\xBF][\x80-\xBF]
    |[\xE1-\xEC\xEE\xEF][\x80-\xBF]{2}|\xED[\x80-\x9F][\x80-\xBF]|\xF0[\x90-\xBF][\x80-\xBF]{2}
    |[\xF1-\xF3][\x80-\xBF]{3}|\xF4[\x80-\x8F][\x80-\xBF]{2})/gcx;
  return (pos($s) // 0) == length $s;
}
sub blob {
  my ($id) = @_;
  open(my $fh, '-|', 'git', 'cat-file', 'blob', $id) or die "git cat-file: $!";
  binmode $fh;
  my $s = do { local $/; <$fh> } // '';
  close $fh or die "git cat-file blob $id failed";
  return $s;
}
sub pattern {
  my ($p, $short) = @_;
  $p =~ s/[\x80-\xFF]/\x00/g if $short;
  $p =~ s/([\\*?\[])/\\$1/g;
  $p =~ s/\x00/?/g if $short;
  $p =~ s/(["\\])/\\$1/g;
  $p =~ s/([^\x20-\x7E])/sprintf('\\%03o', ord $1)/ge;
  return "\"/$p\" binary\n";
}
binmode STDIN;
binmode STDOUT;
my $in = do { local $/; <STDIN> } // '';
exit(utf8_ok($in) ? 0 : 1) if $ARGV[0] eq 'check';
my @f = split /\0/, $in;
my %marked;
while (@f) {
  my ($old_mode, $new_mode, $old_id, $new_id, $status) = split / /, substr(shift @f, 1);
  my @paths = (shift @f);
  push @paths, shift @f if $status =~ /^[RC]/;
  my $bad = 0;
  for ([$old_mode, $old_id], [$new_mode, $new_id]) {
    my ($mode, $id) = @$_;
    next if $mode eq '160000' || $id =~ /^0+$/;
    $bad ||= !utf8_ok(blob($id));
  }
  if ($bad) { $marked{$_} = 1 for @paths }
}
for my $p (sort keys %marked) {
  my $line = pattern($p, 0);
  $line = pattern($p, 1) if length $line > 2000;
  print $line;
}
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
    if matches!(
        backend.capabilities().host_dirs,
        crate::backend::HostDirs::Shared
    ) {
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

/// A patch, the files it changes, and the agent's changes to protected paths that it leaves
/// out (or carries).
#[derive(Debug)]
pub struct Patch {
    /// Empty: no change.
    pub bytes: Vec<u8>,
    /// As git counts them ([`numstat`]), in the patch's order.
    pub files: Vec<FileChange>,
    pub protected: Vec<ProtectedChange>,
}

impl Patch {
    /// The patch as text, the same bytes: it is UTF-8 unless the helper's image had no Perl
    /// to find the files that are not ([`PATCH_SCRIPT`]); then an error, as no text would
    /// apply exactly.
    pub fn text(&self) -> Result<&str> {
        std::str::from_utf8(&self.bytes).map_err(|e| {
            Error::environment(format!(
                "the patch is not UTF-8 text (at byte {}): a symbolic link to a name that is \
                 not UTF-8 (git diffs a link's target as text, whatever its attributes), or a \
                 file that is not, where the session's image has no perl to mark it binary",
                e.valid_up_to()
            ))
            .with_hint("`caw-box diff SESSION --patch FILE` writes it as bytes")
        })
    }
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
    spec.env.push(format!("CAW_BINARY_MARKS={BINARY_MARKS}"));
    if include_protected {
        spec.env.push("CAW_INCLUDE_PROTECTED=1".into());
    }
    let name = names::helper_container(id, "patch");
    let (code, out, err) = backend
        .run_to_completion(&name, &spec)
        .await
        .map_err(|e| crate::backend::image_hint_for(e, image, facts.provider))?;
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

/// The lines of [`PATCH_SCRIPT`]: the patch, its files, the protected paths git saw change,
/// and in copy mode the protected paths inside `.git` with the copy's record to judge them by.
fn read_patch(out: &str, protected_paths: &[String], include: bool) -> Result<Patch> {
    let damaged =
        |e: &dyn std::fmt::Display| Error::environment(format!("the patch came back damaged: {e}"));
    let mut lines = out.split('\n').map(|l| {
        base64::engine::general_purpose::STANDARD
            .decode(l.trim())
            .map_err(|e| damaged(&e))
    });
    let bytes = lines.next().unwrap_or(Ok(Vec::new()))?;
    let files = match lines.next() {
        Some(numstat) => numstat::parse(&numstat?),
        None => return Err(damaged(&"no list of files")),
    };
    let mut protected = match lines.next() {
        Some(names) => protected_out::changes_from_git(&names?, include),
        None => return Err(damaged(&"no list of protected paths")),
    };
    if let (Some(git_tar), Some(record)) = (lines.next(), lines.next()) {
        let (git_tar, record) = (git_tar?, record?);
        if git_tar.is_empty() {
            return Ok(Patch {
                bytes,
                files,
                protected,
            });
        }
        let record: Option<protected_out::CopyRecord> = serde_json::from_slice(&record).ok();
        protected.extend(protected_out::changes_in_tar(
            &git_tar,
            &protected_out::Protected::new(protected_paths),
            record.as_ref(),
        )?);
    }
    Ok(Patch {
        bytes,
        files,
        protected,
    })
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

    /// Writes each (path, bytes) under `dir`, with its directories.
    fn write_tree(dir: &std::path::Path, files: &[(&[u8], &[u8])]) {
        use std::os::unix::ffi::OsStrExt;
        for (path, bytes) in files {
            let path = dir.join(std::ffi::OsStr::from_bytes(path));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
    }

    /// Every file under `dir` (its path relative to `dir`, as bytes) and its content.
    fn read_tree(dir: &std::path::Path) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        let mut files = std::collections::BTreeMap::new();
        let mut dirs = vec![dir.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let rel = path
                        .strip_prefix(dir)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec();
                    files.insert(rel, std::fs::read(&path).unwrap());
                }
            }
        }
        files
    }

    /// The workspace at the start: text, text that is not UTF-8, a file to move.
    fn start(dir: &std::path::Path) {
        let moving = b"l\xe4nger line of latin-1, to be moved\n".repeat(8);
        write_tree(
            dir,
            &[
                (b"keep.txt", b"original\n"),
                (b"becomes-latin.txt", b"plain text\n"),
                (b"was-latin.txt", b"caf\xe9 before\n"),
                (b"move-latin.txt", &moving),
                (b"utf8.txt", "na\u{ef}ve\n".as_bytes()),
                (b"untouched-latin.txt", b"\xff untouched\n"),
            ],
        );
    }

    /// The path of a file three directories of 100 `é` deep: its pattern, octal-quoted,
    /// would pass git's line limit.
    fn deep_path() -> String {
        format!("{0}/{0}/{0}/x.txt", "\u{e9}".repeat(100))
    }

    /// What the agent does: changes text to text that is not UTF-8 and back, moves a file that
    /// is not, adds such files under names of every shape, a binary and a UTF-8 file.
    fn agent_changes(w: &std::path::Path) {
        let moved = [
            b"l\xe4nger line of latin-1, to be moved\n".repeat(8),
            b"and one more\n".to_vec(),
        ]
        .concat();
        std::fs::remove_file(w.join("move-latin.txt")).unwrap();
        write_tree(
            w,
            &[
                (b"keep.txt", b"changed\n"),
                (b"becomes-latin.txt", b"caf\xe9 now\n"),
                (b"was-latin.txt", "caf\u{e9} now\n".as_bytes()),
                (b"moved latin.txt", &moved),
                (
                    b"utf8.txt",
                    "na\u{ef}ve caf\u{e9} \u{65e5}\u{672c}\n".as_bytes(),
                ),
                (b"latin1.txt", b"\xff\xfe latin-1 caf\xe9\n"),
                ("\u{e9} b/x.txt".as_bytes(), b"x\n"),
                (b"a[1]*?.txt", b"glob \xe9\n"),
                (b"a1xy.txt", b"a name its pattern would match unescaped\n"),
                (b"back\\slash \"q\".txt", b"\xe9\n"),
                (b"caf\xe9.txt", b"\xe9\n"),
                (b"blob.bin", b"bin\x00\x01\x02"),
                (deep_path().as_bytes(), b"deep \xe9\n"),
            ],
        );
    }

    /// [`PATCH_SCRIPT`] run here on `ws` against a tar of `base`, read as the helper's is.
    async fn patch_here(base: &std::path::Path, ws: &std::path::Path) -> Patch {
        let scratch = tempfile::tempdir().unwrap();
        let tar = scratch.path().join("base.tar");
        let tarred = std::process::Command::new("tar")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(base)
            .arg(".")
            .status()
            .unwrap();
        assert!(tarred.success());
        let vars = [
            ("CAW_WS", ws.to_str().unwrap()),
            ("CAW_BASE_TAR", tar.to_str().unwrap()),
            ("CAW_BINARY_MARKS", BINARY_MARKS),
        ];
        let ran = safe_git::run_on_host_output(PATCH_SCRIPT, &vars, None)
            .await
            .unwrap();
        assert!(ran.status.success(), "{ran:?}");
        read_patch(&String::from_utf8(ran.stdout).unwrap(), &[], false).unwrap()
    }

    /// The script a helper runs, run here by this machine's git and perl on a copied
    /// workspace: the patch is UTF-8 (files that are not get binary hunks, their names
    /// quoted, escaped and marked whatever their shape), and `git apply --binary` of it on
    /// the start gives the agent's tree byte for byte.
    #[tokio::test]
    async fn the_patch_is_utf8_and_applies_byte_for_byte() {
        let (base, now) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        start(base.path());
        start(now.path());
        agent_changes(now.path());
        let made = patch_here(base.path(), now.path()).await;
        let text = made.text().expect("a UTF-8 patch");
        assert!(text.contains("GIT binary patch"), "{text}");

        let fresh = tempfile::tempdir().unwrap();
        start(fresh.path());
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let applied = std::process::Command::new("git")
            .args(["apply", "--binary"])
            .arg(file.path())
            .current_dir(fresh.path())
            .output()
            .unwrap();
        assert!(applied.status.success(), "{applied:?}\n{text}");
        assert_eq!(read_tree(fresh.path()), read_tree(now.path()));
        assert_files(&made.files);
    }

    /// The files of that patch, as git counts them: every path as it is, those that are not
    /// UTF-8 binary, the rest with counts, the move under its new name.
    fn assert_files(files: &[FileChange]) {
        let deep = deep_path();
        let binary = |path: &str| {
            files
                .iter()
                .find(|f| f.path == path)
                .unwrap_or_else(|| panic!("{path} not in {files:#?}"))
                .binary
        };
        let mut paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        paths.sort_unstable();
        let mut expected = vec![
            "a1xy.txt",
            "a[1]*?.txt",
            "back\\slash \"q\".txt",
            "becomes-latin.txt",
            "blob.bin",
            "caf\u{fffd}.txt",
            "keep.txt",
            "latin1.txt",
            "moved latin.txt",
            "utf8.txt",
            "was-latin.txt",
            "\u{e9} b/x.txt",
            &deep,
        ];
        expected.sort_unstable();
        assert_eq!(paths, expected);
        for not_utf8 in [
            "latin1.txt",
            "becomes-latin.txt",
            "was-latin.txt",
            "moved latin.txt",
            "a[1]*?.txt",
            "back\\slash \"q\".txt",
            "caf\u{fffd}.txt",
            &deep,
            "blob.bin",
        ] {
            assert!(binary(not_utf8), "{not_utf8} is not binary");
        }
        for text_file in ["keep.txt", "utf8.txt", "\u{e9} b/x.txt", "a1xy.txt"] {
            assert!(!binary(text_file), "{text_file} is binary");
        }
        let moved = files.iter().find(|f| f.path == "moved latin.txt");
        assert_eq!(
            moved.and_then(|f| f.renamed_from.as_deref()),
            Some("move-latin.txt")
        );
        let keep = files.iter().find(|f| f.path == "keep.txt").unwrap();
        assert_eq!((keep.added, keep.removed), (Some(1), Some(1)));
    }

    /// The script's `check` calls UTF-8 what Rust does, where glibc's `iconv` would not.
    #[test]
    fn the_perl_check_is_rusts_utf8() {
        let inputs: [&[u8]; 11] = [
            b"",
            b"plain",
            "caf\u{e9} \u{65e5}\u{672c} \u{1f600} \u{ffff}".as_bytes(),
            b"a\0b",
            b"caf\xe9",
            b"\xc0\x80",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
            b"\xf8\x88\x80\x80\x80",
            b"\xe6\x97",
            b"\x80",
        ];
        for input in inputs {
            let mut perl = std::process::Command::new("perl")
                .args(["-e", BINARY_MARKS, "check"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            perl.stdin.take().unwrap().write_all(input).unwrap();
            let utf8 = perl.wait().unwrap().success();
            assert_eq!(utf8, std::str::from_utf8(input).is_ok(), "{input:?}");
        }
    }

    #[test]
    fn a_patch_that_is_not_utf8_is_no_text() {
        let patch = |bytes: &[u8]| Patch {
            bytes: bytes.to_vec(),
            files: Vec::new(),
            protected: Vec::new(),
        };
        assert_eq!(patch(b"+caf\xc3\xa9\n").text().unwrap(), "+caf\u{e9}\n");
        let e = patch(b"+caf\xe9\n").text().unwrap_err();
        assert!(e.message.contains("at byte 4"), "{e:?}");
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
