//! `apply`: a copy-mode session's patch (as `caw-box diff --patch` makes it) applied to the
//! directory the session was started from, all or nothing.
//!
//! `git apply` runs on this machine hardened as every git step over a workspace is
//! ([`crate::session::safe_git`]): a private, empty repository, no system or global
//! configuration, so no filter, hook or fsmonitor the directory names runs. `git apply`
//! checks every hunk before it writes: a conflict writes nothing. caw-box run as root in
//! another user's directory applies it as that user, so the files it writes are theirs.

use serde_json::{json, Value};

use super::read::patch_of;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::session::{safe_git, WorkspaceMode};

const APPLY_SCRIPT: &str = r#"private_repo "$CAW_WS" "$CAW_TMP/git"
export GIT_OBJECT_DIRECTORY="$CAW_TMP/git/objects"
cd "$CAW_WS"
git apply --check --binary "$CAW_PATCH"
if [ "${CAW_CHECK_ONLY:-}" != 1 ]; then git apply --binary "$CAW_PATCH"; fi
"#;

pub async fn apply(target: &str, check: bool) -> Result<Value> {
    let client = Client::connect().await?;
    let (view, made) = patch_of(&client, target).await?;
    let id = view.facts.session_id;
    let settings = &view.facts.settings;
    if settings.workspace_mode != WorkspaceMode::Copy {
        return Err(Error::usage(format!(
            "session {id} is not a copy-mode session: its changes are in its workspace already"
        )));
    }
    let dir = settings.workspace.clone().unwrap_or_default();
    if !std::path::Path::new(&dir).is_dir() {
        return Err(Error::usage(format!(
            "the directory session {id} was started from, '{dir}', is gone"
        )));
    }
    let mut out = json!({
        "session_id": id.to_string(),
        "workspace": dir,
        "files_changed": made.files,
        "protected_left_out": made.protected,
    });
    if made.bytes.is_empty() {
        out["applied"] = json!(false);
        out["note"] = json!("the session changed nothing");
        return Ok(out);
    }
    let patch = tempfile::NamedTempFile::new()
        .and_then(|f| std::fs::write(f.path(), &made.bytes).map(|()| f))
        .map_err(|e| Error::environment(format!("cannot write the patch down: {e}")))?;
    let path = patch.path().display().to_string();
    let mut vars = vec![("CAW_WS", dir.as_str()), ("CAW_PATCH", path.as_str())];
    if check {
        vars.push(("CAW_CHECK_ONLY", "1"));
    }
    // caw-box as root in another user's directory: the files go in as that user's.
    let writer = safe_git::writer_for_root(std::path::Path::new(&dir));
    if let Some((uid, gid)) = writer {
        std::os::unix::fs::chown(patch.path(), Some(uid), Some(gid)).map_err(|e| {
            Error::environment(format!("cannot hand the patch to {uid}:{gid}: {e}"))
        })?;
    }
    let ran = safe_git::run_on_host_output(APPLY_SCRIPT, &vars, writer)
        .await
        .map_err(Error::environment)?;
    if !ran.status.success() {
        let why = String::from_utf8_lossy(&ran.stderr);
        let why = why
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        return Err(Error::conflict(format!(
            "the patch of session {id} does not apply to '{dir}'; nothing was written: {why}"
        ))
        .with_hint("`diff` gives the patch to merge by hand"));
    }
    out["applied"] = json!(!check);
    out["checked"] = json!(true);
    Ok(out)
}
