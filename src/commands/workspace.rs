//! `export` and `diff`: what the agent changed in a session's workspace, brought out to this
//! machine as files or a patch, without the agent's changes to protected paths unless asked
//! (`--include-protected`), and saying which (stderr, `--json`).

use serde::Serialize;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::output;
use crate::session::protected_out::{Change, ProtectedChange};
use crate::session::target;

/// How `export` and `diff --patch` treat protected paths and report.
#[derive(Debug, Clone, Copy)]
pub struct Outbound {
    pub include_protected: bool,
    pub json: bool,
    pub quiet: bool,
}

/// One line on stderr for the agent's changes to protected paths: what was left out (always,
/// even with `-q`: it is why a file the agent wrote is missing) or, with
/// `--include-protected`, what was written.
fn warn_protected(changes: &[ProtectedChange], what: &str) {
    let list = |included: bool| {
        changes
            .iter()
            .filter(|c| c.included == included)
            .map(|c| format!("{} ({})", c.path, change_word(c.change)))
            .collect::<Vec<_>>()
    };
    let (out, written) = (list(false), list(true));
    if !out.is_empty() {
        let inside_git = what == "patch" && out.iter().any(|p| p.starts_with(".git/"));
        output::eprintln(&format!(
            "warning: left out of the {what} the agent's changes to protected paths, which \
             programs here may run by themselves: {}; {}",
            out.join(", "),
            if inside_git {
                "a patch never carries .git; `caw-box export --include-protected` writes them"
            } else {
                "--include-protected includes them"
            }
        ));
    }
    if !written.is_empty() {
        output::eprintln(&format!(
            "warning: the {what} has the agent's changes to protected paths \
             (--include-protected): {}; read them before git, direnv or an editor runs them",
            written.join(", ")
        ));
    }
}

fn change_word(change: Change) -> &'static str {
    match change {
        Change::Added => "added",
        Change::Modified => "modified",
        Change::Deleted => "deleted",
        Change::Unverified => "not verifiable",
    }
}

/// The `--json` of `export`.
#[derive(Serialize)]
struct ExportJson<'a> {
    session_id: Uuid,
    dir: &'a std::path::Path,
    files: usize,
    protected: &'a [ProtectedChange],
}

/// The `--json` of `diff --patch FILE`.
#[derive(Serialize)]
struct PatchJson<'a> {
    session_id: Uuid,
    file: &'a std::path::Path,
    bytes: usize,
    protected: &'a [ProtectedChange],
}

pub async fn export(
    target_arg: &str,
    dir: &std::path::Path,
    force: bool,
    how: Outbound,
) -> Result<i32> {
    let backend = crate::client::connect_backend().await?;
    let view = target::resolve_view(&backend, target_arg).await?;
    let exported =
        crate::session::workspace::export(&backend, &view.facts, dir, force, how.include_protected)
            .await?;
    warn_protected(&exported.protected, "export");
    let id = view.facts.session_id;
    if how.json {
        output::print_json(&ExportJson {
            session_id: id,
            dir,
            files: exported.files,
            protected: &exported.protected,
        });
    } else if !how.quiet {
        output::eprintln(&format!(
            "exported {} files of session {id} to {}",
            exported.files,
            dir.display()
        ));
    }
    Ok(0)
}

/// `diff`: the listing of what changed, or with `--patch [FILE]` a patch (`-`: stdout).
pub async fn diff(target_arg: &str, patch: Option<&std::path::Path>, how: Outbound) -> Result<i32> {
    let to_stdout = patch == Some(std::path::Path::new("-"));
    if how.json && to_stdout {
        return Err(
            Error::usage("--json needs --patch FILE: without one, the patch is stdout")
                .with_hint("e.g. `caw-box diff fixer --patch fixer.patch --json`"),
        );
    }
    let backend = crate::client::connect_backend().await?;
    let view = target::resolve_view(&backend, target_arg).await?;
    let ids = crate::session::owner::turn_ids(&view.facts.settings);
    let Some(file) = patch else {
        let text = crate::session::workspace::diff(&backend, &view.facts, ids).await?;
        output::write_stdout(text.as_bytes());
        return Ok(0);
    };
    let made =
        crate::session::patch::patch(&backend, &view.facts, ids, how.include_protected).await?;
    warn_protected(&made.protected, "patch");
    if to_stdout {
        output::write_stdout(&made.bytes);
        return Ok(0);
    }
    std::fs::write(file, &made.bytes)
        .map_err(|e| Error::usage(format!("cannot write '{}': {e}", file.display())))?;
    let id = view.facts.session_id;
    if how.json {
        output::print_json(&PatchJson {
            session_id: id,
            file,
            bytes: made.bytes.len(),
            protected: &made.protected,
        });
    } else if !how.quiet {
        output::eprintln(&format!(
            "wrote the patch of session {id} to {} ({} bytes)",
            file.display(),
            made.bytes.len()
        ));
    }
    Ok(0)
}
