//! `caw-box session export` / `import`: a session as one archive (see
//! `session::portable`), to move it to another Docker host.

use std::io::{Read, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::output;
use crate::session::{lifecycle, portable, target};

pub async fn export(
    target_arg: &str,
    file: &Path,
    force: bool,
    all_checkpoints: bool,
    quiet: bool,
) -> Result<i32> {
    let to_stdout = file == Path::new("-");
    if !to_stdout && file.exists() && !force {
        return Err(Error::usage(format!("'{}' exists", file.display()))
            .with_hint("pick a new file name, or pass --force to replace it"));
    }
    let backend = crate::client::connect_backend().await?;
    let view = target::resolve_view(&backend, target_arg).await?;
    let id = view.facts.session_id;
    if let Some(turn) = lifecycle::running_turns(&backend).await?.get(&id) {
        return Err(lifecycle::running_refusal(id, *turn));
    }
    let report = if to_stdout {
        let mut bytes = Vec::new();
        let report = portable::export(&backend, &view.facts, all_checkpoints, &mut bytes).await?;
        output::write_stdout(&bytes);
        report
    } else {
        // Written beside FILE and renamed into place: never a half-written archive.
        let dir = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let cannot =
            |e: std::io::Error| Error::usage(format!("cannot write '{}': {e}", file.display()));
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(cannot)?;
        let report =
            portable::export(&backend, &view.facts, all_checkpoints, tmp.as_file_mut()).await?;
        tmp.as_file_mut().flush().map_err(cannot)?;
        tmp.persist(file).map_err(|e| cannot(e.error))?;
        report
    };
    for path in &report.withheld {
        output::eprintln(&format!(
            "warning: left out ~/{path}: it holds a credential"
        ));
    }
    if report.checkpoints_withheld {
        output::eprintln(
            "warning: left out the checkpoints: one holds a credential (the import takes one \
             of the latest turn)",
        );
    }
    if !quiet {
        output::eprintln(&format!(
            "exported session {id}{} ({} files, {}{}){}",
            view.facts
                .name
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default(),
            report.files,
            human_bytes(report.bytes),
            match report.checkpoints {
                0 => String::new(),
                1 => ", 1 checkpoint".to_string(),
                n => format!(", {n} checkpoints"),
            },
            if to_stdout {
                String::new()
            } else {
                format!(" to {}", file.display())
            }
        ));
    }
    Ok(0)
}

pub async fn import(file: &Path, force: bool, quiet: bool) -> Result<i32> {
    let mut bytes = Vec::new();
    if file == Path::new("-") {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| Error::usage(format!("cannot read stdin: {e}")))?;
    } else {
        bytes = std::fs::read(file)
            .map_err(|e| Error::usage(format!("cannot read '{}': {e}", file.display())))?;
    }
    // Checked whole before Docker is asked for anything: a bad archive creates nothing.
    let checked = portable::check(&bytes)?;
    let backend = crate::client::connect_backend().await?;
    let facts = portable::import(&backend, &checked, force).await?;
    let id = facts.session_id;
    output::println(&id.to_string());
    if !quiet {
        let target = facts.name.clone().unwrap_or_else(|| id.to_string());
        output::eprintln(&format!(
            "imported session {id}{}; continue it with `caw-box resume {target} PROMPT`",
            facts
                .name
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        ));
    }
    Ok(0)
}

fn human_bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// Runs a `session` subcommand.
pub async fn session(command: crate::cli::SessionCommand, quiet: bool) -> Result<i32> {
    match command {
        crate::cli::SessionCommand::Export {
            target,
            file,
            force,
            checkpoints,
        } => export(&target, &file, force, checkpoints == "all", quiet).await,
        crate::cli::SessionCommand::Import { file, force } => import(&file, force, quiet).await,
    }
}
