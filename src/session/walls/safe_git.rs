//! Git over a workspace without running anything the workspace controls.
//!
//! A repository names programs that git runs by itself: a clean filter (`filter.x.clean`
//! with `* filter=x` in `.gitattributes`), `core.fsmonitor`, hooks, `core.hooksPath`, and the
//! configuration can `include` more. An agent in bind mode, or a cloned repository, can put
//! any of them there. So caw-box never lets git read the workspace's configuration, hooks or
//! info/attributes: every git step over a workspace runs with a private `GIT_DIR` (an empty
//! config, no hooks), the workspace only as `GIT_WORK_TREE` and as an object store, no
//! system or global configuration, and HEAD read from the files by the shell, not by git.
//! Without a filter, `.gitattributes`' `filter=x` names nothing; the rest of the attributes
//! (text, eol, ident) are git's own code.
//!
//! Why this and not a helper container for every step: the bind-mode baseline is taken at
//! every `run` in a git repository, and this machine's git does it in tens of milliseconds
//! against some 350 ms for a helper container, with no program of the workspace's able to
//! run either way. The helper containers (`diff --patch`, the copy-mode `diff`, and the
//! baseline where the daemon does not share this machine's paths) run the same script with
//! the same environment, so a filter does not run there either, with the workspace mounted.
//!
//! On this machine the script runs with a cleared environment (only the settings below and a
//! `PATH` of absolute directories), in a private temporary directory, and is killed after
//! [`HOST_TIMEOUT`]; any failure falls back to the helper container.

use std::time::Duration;

/// The environment of every git step over a workspace (`HOME` is set by the caller: a
/// private directory on this machine, /tmp in a helper).
pub const GIT_ENV: &[(&str, &str)] = &[
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_ATTR_NOSYSTEM", "1"),
    ("GIT_NO_REPLACE_OBJECTS", "1"),
    ("GIT_OPTIONAL_LOCKS", "0"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("LC_ALL", "C"),
];

/// [`GIT_ENV`] as `KEY=value` lines for a helper container, with `HOME=/tmp`.
pub fn helper_env() -> Vec<String> {
    std::iter::once("HOME=/tmp".to_string())
        .chain(GIT_ENV.iter().map(|(k, v)| format!("{k}={v}")))
        .collect()
}

/// Shell functions the git scripts start with.
///
/// `private_repo WS DIR`: makes DIR a repository of its own for the work tree WS (exported as
/// `GIT_DIR` and `GIT_WORK_TREE`): an empty config (the object format of WS's, when it names
/// sha256), no hooks, WS's `.git/info/exclude` copied so the same files are ignored. Objects
/// are the caller's choice (`GIT_OBJECT_DIRECTORY`).
///
/// `head_of WS`: the commit WS's HEAD names, read from `.git/HEAD`, the loose ref or
/// `packed-refs` by the shell's own `read` (empty when unborn, or in a format not read here).
/// Builtins where they do: each process costs a millisecond or two of every `run`.
pub const PRELUDE: &str = r#"
private_repo() {
  mkdir -p "$2/refs" "$2/info" "$2/objects"
  echo 'ref: refs/heads/caw-box' > "$2/HEAD"
  : > "$2/config"
  export GIT_DIR="$2" GIT_WORK_TREE="$1"
  fmt=""
  if [ -f "$1/.git/config" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
      case "$line" in *[Oo][Bb][Jj][Ee][Cc][Tt][Ff][Oo][Rr][Mm][Aa][Tt]*) fmt=ask ;; esac
    done < "$1/.git/config"
  fi
  if [ -n "$fmt" ]; then
    fmt=$(git config --file "$1/.git/config" --get extensions.objectformat || true)
  fi
  case "$fmt" in
    "" | sha1) ;;
    sha256) printf '[core]\n\trepositoryformatversion = 1\n[extensions]\n\tobjectformat = sha256\n' > "$2/config" ;;
    *) echo "caw-box: unknown git object format" >&2; exit 1 ;;
  esac
  if [ -f "$1/.git/info/exclude" ]; then cp "$1/.git/info/exclude" "$2/info/exclude"; fi
}
head_of() {
  h=""
  if [ -f "$1/.git/HEAD" ]; then read -r h < "$1/.git/HEAD" || true; fi
  case "$h" in
    "ref: refs/"*)
      r=${h#ref: }
      h=""
      case "$r" in
        *..*) ;;
        *) if [ -f "$1/.git/$r" ]; then read -r h < "$1/.git/$r" || true
           elif [ -f "$1/.git/packed-refs" ]; then
             while read -r id name; do
               if [ "$name" = "$r" ]; then h=$id; break; fi
             done < "$1/.git/packed-refs"
           fi ;;
      esac ;;
  esac
  case "$h" in "" | *[!0-9a-f]*) ;; *) echo "$h" ;; esac
}
"#;

/// `body` after the strict mode and [`PRELUDE`]: a whole script for `sh -c`.
pub fn script(body: &str) -> String {
    format!("set -eu\n{PRELUDE}\n{body}")
}

/// How long this machine's git may take before the helper container does it instead.
pub const HOST_TIMEOUT: Duration = Duration::from_secs(30);

/// `PATH` without relative entries (`.`, `bin`): those would resolve against a directory,
/// and a program found there is not this machine's own.
fn absolute_dirs(path: &str) -> String {
    path.split(':')
        .filter(|p| p.starts_with('/'))
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs `body` ([`script`]) with this machine's `sh` and git as this user, in a new
/// private directory (`CAW_TMP`, also its `HOME` and working directory) with a cleared
/// environment: [`GIT_ENV`], `PATH` of absolute directories, and `vars`. Its stdout, or
/// `None` with the reason logged when it could not run or failed.
pub async fn run_on_host(body: &str, vars: &[(&str, &str)]) -> Option<String> {
    run_on_host_as(body, vars, None).await
}

/// [`run_on_host`] as `user` (`uid`, `gid`; root may hand a step to a repository's owner),
/// or as this user.
pub async fn run_on_host_as(
    body: &str,
    vars: &[(&str, &str)],
    user: Option<(u32, u32)>,
) -> Option<String> {
    match run_as(body, vars, user).await {
        Ok(out) if out.status.success() => Some(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(out) => {
            tracing::debug!(
                "this machine's git failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Err(e) => {
            tracing::debug!("{e}");
            None
        }
    }
}

/// [`run_on_host`], its whole output (a failure's stderr is what the caller reports), or
/// why it could not run or did not end within [`HOST_TIMEOUT`].
pub async fn run_on_host_output(
    body: &str,
    vars: &[(&str, &str)],
    user: Option<(u32, u32)>,
) -> Result<std::process::Output, String> {
    run_as(body, vars, user).await
}

/// Who should write into `path` (a directory) when caw-box runs as root: its owner, where
/// that is another user (what root made there would be closed to them); `None` (this
/// user) otherwise.
pub fn writer_for_root(path: &std::path::Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    if crate::dirs::host_ids().0 != 0 {
        return None;
    }
    let m = std::fs::metadata(path).ok()?;
    (m.uid() != 0).then_some((m.uid(), m.gid()))
}

async fn run_as(
    body: &str,
    vars: &[(&str, &str)],
    user: Option<(u32, u32)>,
) -> Result<std::process::Output, String> {
    let tmp = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
    let mut cmd = tokio::process::Command::new("/bin/sh");
    if let Some((uid, gid)) = user {
        // Its private directory is its own; std drops root's supplementary groups.
        std::os::unix::fs::chown(tmp.path(), Some(uid), Some(gid))
            .map_err(|e| format!("cannot hand the temporary directory to {uid}:{gid}: {e}"))?;
        cmd.uid(uid).gid(gid);
    }
    cmd.arg("-c")
        .arg(script(body))
        .env_clear()
        .envs(GIT_ENV.iter().copied())
        .env(
            "PATH",
            absolute_dirs(
                &std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
            ),
        )
        .env("HOME", tmp.path())
        .env("CAW_TMP", tmp.path())
        .envs(vars.iter().copied())
        .current_dir(tmp.path())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    match tokio::time::timeout(HOST_TIMEOUT, cmd.output()).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("this machine's git could not run: {e}")),
        Err(_) => Err(format!(
            "this machine's git took longer than {HOST_TIMEOUT:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_path_entries_are_dropped() {
        assert_eq!(
            absolute_dirs(".:bin:/usr/bin::/bin:./x"),
            "/usr/bin:/bin".to_string()
        );
    }
}
