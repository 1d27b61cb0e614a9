//! What comes back out of a copied workspace: `export` and `diff --patch` leave out the
//! agent's changes to the session's protected paths ([`crate::session::walls::protect`]: git's config and
//! hooks, `.envrc`, editor tasks, ...) and say which; `--include-protected` brings them too.
//! A protected file the agent left as it was copied (same bytes, same executable bit) is
//! the user's own and is written as usual. Paths match case-insensitively, as a host's
//! filesystem may fold case (`.GIT/hooks` is `.git/hooks` on macOS), and an entry that would
//! land in a protected path through a symbolic link is judged by where it lands.
//! Not the bind-mode walls: those are the turn's.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Where the [`CopyRecord`] of a copied workspace is kept, under HOME in the state volume.
pub const RECORD_PATH: &str = ".caw-box/workspace-base.json";

/// The copied tree's regular files at session start.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CopyRecord {
    /// SHA-256 of every regular file, by path relative to the workspace root.
    pub files: BTreeMap<String, String>,
    /// The executable ones (`None`: a session from before this was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executable: Option<BTreeSet<String>>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    Added,
    Modified,
    Deleted,
    /// The session kept no record of its copied tree to compare with.
    Unverified,
}

impl Change {
    fn from_git_status(status: &str) -> Change {
        match status.chars().next() {
            Some('A') => Change::Added,
            Some('D') => Change::Deleted,
            _ => Change::Modified,
        }
    }
}

/// One change of the agent's to a protected path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProtectedChange {
    pub path: String,
    pub change: Change,
    /// Written by `export` / carried by the patch (`--include-protected`).
    pub included: bool,
}

/// A session's protected paths, for matching.
#[derive(Debug)]
pub struct Protected {
    lower: Vec<String>,
}

impl Protected {
    pub fn new(paths: &[String]) -> Protected {
        Protected {
            lower: paths.iter().map(|p| p.to_lowercase()).collect(),
        }
    }

    /// Whether `rel` (relative, `/`-separated) is a protected path or inside one.
    pub fn covers(&self, rel: &str) -> bool {
        let rel = rel.to_lowercase();
        self.lower.iter().any(|p| {
            rel == *p
                || rel
                    .strip_prefix(p.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        })
    }
}

/// An entry of the agent's tree against the copy at session start: `None` when it is the
/// file that was copied (same bytes; same executable bit where that was recorded).
fn judge(record: Option<&CopyRecord>, rel: &str, now: Option<(&[u8], bool)>) -> Option<Change> {
    let Some(record) = record else {
        return Some(Change::Unverified);
    };
    let Some(was) = record.files.get(rel) else {
        return Some(Change::Added);
    };
    let Some((bytes, executable)) = now else {
        // A link or another kind where a regular file was.
        return Some(Change::Modified);
    };
    let same_mode = record
        .executable
        .as_ref()
        .is_none_or(|x| x.contains(rel) == executable);
    (sha256_hex(bytes) != *was || !same_mode).then_some(Change::Modified)
}

/// The relative path of a tar entry (Docker names them `./…`); `None` for the root.
fn relative(path: &Path) -> Option<String> {
    let rel: PathBuf = path
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect();
    (!rel.as_os_str().is_empty()).then(|| rel.to_string_lossy().into_owned())
}

fn bad_archive(e: impl std::fmt::Display) -> Error {
    Error::environment(format!("bad archive of the workspace: {e}"))
}

/// The protected entries of a tar of the agent's tree that differ from the copy at start
/// (directories never count: they run nothing). `included` is false.
pub fn changes_in_tar(
    tar: &[u8],
    protected: &Protected,
    record: Option<&CopyRecord>,
) -> Result<Vec<ProtectedChange>> {
    let mut out = Vec::new();
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(bad_archive)? {
        let mut entry = entry.map_err(bad_archive)?;
        let Some(rel) = relative(&entry.path().map_err(bad_archive)?) else {
            continue;
        };
        let kind = entry.header().entry_type();
        if kind.is_dir() || !protected.covers(&rel) {
            continue;
        }
        let change = if kind.is_file() {
            let executable = entry.header().mode().map_err(bad_archive)? & 0o111 != 0;
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map_err(bad_archive)?;
            judge(record, &rel, Some((&bytes, executable)))
        } else {
            judge(record, &rel, None)
        };
        if let Some(change) = change {
            out.push(ProtectedChange {
                path: rel,
                change,
                included: false,
            });
        }
    }
    Ok(out)
}

/// The changes `git diff --name-status -z` printed (`M\0path\0A\0path\0…`).
pub fn changes_from_git(name_status: &[u8], included: bool) -> Vec<ProtectedChange> {
    let fields: Vec<&[u8]> = name_status
        .split(|b| *b == 0)
        .filter(|f| !f.is_empty())
        .collect();
    fields
        .chunks(2)
        .filter(|pair| pair.len() == 2)
        .map(|pair| ProtectedChange {
            path: String::from_utf8_lossy(pair[1]).into_owned(),
            change: Change::from_git_status(&String::from_utf8_lossy(pair[0])),
            included,
        })
        .collect()
}

/// Where `rel` lands under `dir` as the disk is now: the deepest existing ancestor resolved
/// (symbolic links followed), the rest appended; `None` when that leaves `dir`.
fn landing(dir: &Path, rel: &str) -> Option<String> {
    let root = dir.canonicalize().ok()?;
    let target = dir.join(rel);
    let mut existing = target.parent()?.to_path_buf();
    let mut rest = vec![target.file_name()?.to_os_string()];
    while !existing.exists() {
        rest.push(existing.file_name()?.to_os_string());
        existing = existing.parent()?.to_path_buf();
    }
    let mut real = existing.canonicalize().ok()?;
    for part in rest.iter().rev() {
        real.push(part);
    }
    Some(
        real.strip_prefix(&root)
            .ok()?
            .to_string_lossy()
            .into_owned(),
    )
}

/// Writes the agent's tree (a tar as Docker archives `/workspace/.`) into `dir`, leaving out
/// the changes to protected paths unless `include`; returns the regular files written and
/// the protected changes.
pub fn unpack(
    tar: &[u8],
    dir: &Path,
    protected: &Protected,
    record: Option<&CopyRecord>,
    include: bool,
) -> Result<(usize, Vec<ProtectedChange>)> {
    // First the verdicts (reading the protected files), then the writing.
    let mut changes: Vec<ProtectedChange> = changes_in_tar(tar, protected, record)?;
    let changed: BTreeSet<String> = changes.iter().map(|c| c.path.clone()).collect();
    let mut count = 0;
    let mut archive = tar::Archive::new(tar);
    archive.set_preserve_ownerships(false);
    archive.set_overwrite(true);
    for entry in archive.entries().map_err(bad_archive)? {
        let mut entry = entry.map_err(bad_archive)?;
        let Some(rel) = relative(&entry.path().map_err(bad_archive)?) else {
            continue;
        };
        let kind = entry.header().entry_type();
        if !include && !kind.is_dir() {
            if changed.contains(&rel) {
                continue;
            }
            // Through a symbolic link (or a hard link) into a protected path: by where it lands.
            let through_link = match landing(dir, &rel) {
                Some(lands) => !protected.covers(&rel) && protected.covers(&lands),
                None => true,
            };
            let hard_link_to_protected = kind.is_hard_link()
                && entry
                    .link_name()
                    .ok()
                    .flatten()
                    .and_then(|l| relative(&l))
                    .is_some_and(|l| protected.covers(&l));
            if through_link || hard_link_to_protected {
                changes.push(ProtectedChange {
                    path: landing(dir, &rel).unwrap_or(rel),
                    change: Change::Added,
                    included: false,
                });
                continue;
            }
        }
        if kind.is_file() {
            count += 1;
        }
        entry.unpack_in(dir).map_err(|e| {
            Error::environment(format!("cannot write into '{}': {e}", dir.display()))
        })?;
    }
    if include {
        for c in &mut changes {
            c.included = true;
        }
    }
    Ok((count, changes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(files: &[(&str, &[u8], bool)]) -> CopyRecord {
        CopyRecord {
            files: files
                .iter()
                .map(|(p, b, _)| (p.to_string(), sha256_hex(b)))
                .collect(),
            executable: Some(
                files
                    .iter()
                    .filter(|f| f.2)
                    .map(|f| f.0.to_string())
                    .collect(),
            ),
        }
    }

    fn tar_of(entries: &[(&str, &[u8], u32)], links: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, bytes, mode) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(*mode);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, path, *bytes).unwrap();
        }
        for (path, target) in links {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, path, target).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn protected() -> Protected {
        Protected::new(&crate::session::walls::protect::effective(&[], &[]))
    }

    #[test]
    fn paths_match_inside_and_across_case() {
        let p = protected();
        assert!(p.covers(".git/hooks/pre-commit"));
        assert!(p.covers(".GIT/Hooks/pre-commit"));
        assert!(p.covers(".git/config"));
        assert!(p.covers(".envrc"));
        assert!(!p.covers(".git/configs"));
        assert!(!p.covers(".envrc.example"));
        assert!(!p.covers(".git/objects/ab/cdef"));
        assert!(!p.covers("src/main.rs"));
    }

    #[test]
    fn export_leaves_out_what_the_agent_changed_and_keeps_the_rest() {
        let rec = record(&[
            (".git/config", b"[core]\n", false),
            (".git/hooks/pre-push", b"#!/bin/sh\n", true),
            (".git/hooks/commit-msg.sample", b"sample\n", false),
            (".git/HEAD", b"ref: refs/heads/main\n", false),
            ("keep.txt", b"original\n", false),
        ]);
        let tar = tar_of(
            &[
                (".git/config", b"[core]\n\tfsmonitor = evil\n", 0o644),
                (".git/hooks/pre-push", b"#!/bin/sh\n", 0o755),
                (".git/hooks/commit-msg.sample", b"sample\n", 0o755),
                (".git/hooks/pre-commit", b"#!/bin/sh\nevil\n", 0o755),
                (".git/HEAD", b"ref: refs/heads/main\n", 0o644),
                (".envrc", b"evil\n", 0o644),
                ("keep.txt", b"changed\n", 0o644),
            ],
            &[],
        );
        let dir = tempfile::tempdir().unwrap();
        let (n, changes) = unpack(&tar, dir.path(), &protected(), Some(&rec), false).unwrap();
        let d = dir.path();
        assert_eq!(std::fs::read(d.join("keep.txt")).unwrap(), b"changed\n");
        assert_eq!(
            std::fs::read(d.join(".git/HEAD")).unwrap(),
            b"ref: refs/heads/main\n"
        );
        // Unchanged, so the user's own: written.
        assert!(d.join(".git/hooks/pre-push").exists());
        for gone in [
            ".git/config",
            ".git/hooks/pre-commit",
            ".git/hooks/commit-msg.sample",
            ".envrc",
        ] {
            assert!(!d.join(gone).exists(), "{gone}");
        }
        assert_eq!(n, 3);
        let mut got: Vec<(String, Change)> =
            changes.iter().map(|c| (c.path.clone(), c.change)).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (".envrc".into(), Change::Added),
                (".git/config".into(), Change::Modified),
                (".git/hooks/commit-msg.sample".into(), Change::Modified),
                (".git/hooks/pre-commit".into(), Change::Added),
            ]
        );
        assert!(changes.iter().all(|c| !c.included));

        let all = tempfile::tempdir().unwrap();
        let (n, changes) = unpack(&tar, all.path(), &protected(), Some(&rec), true).unwrap();
        assert_eq!(n, 7);
        assert!(all.path().join(".git/hooks/pre-commit").exists());
        assert_eq!(changes.len(), 4);
        assert!(changes.iter().all(|c| c.included));
    }

    #[test]
    fn a_symbolic_link_does_not_carry_a_file_into_a_protected_path() {
        let rec = record(&[(".git/HEAD", b"x", false)]);
        // `sneaky` -> .git/hooks, then sneaky/pre-commit: it would land in .git/hooks.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        b.append_data(&mut h, ".git/hooks", std::io::empty())
            .unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "sneaky", ".git/hooks").unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(5);
        h.set_mode(0o755);
        b.append_data(&mut h, "sneaky/pre-commit", &b"evil\n"[..])
            .unwrap();
        let tar = b.into_inner().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (_, changes) = unpack(&tar, dir.path(), &protected(), Some(&rec), false).unwrap();
        assert!(!dir.path().join(".git/hooks/pre-commit").exists());
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].path, ".git/hooks/pre-commit");
    }

    #[test]
    fn without_a_record_nothing_protected_is_written() {
        let tar = tar_of(&[(".git/config", b"[core]\n", 0o644)], &[]);
        let dir = tempfile::tempdir().unwrap();
        let (_, changes) = unpack(&tar, dir.path(), &protected(), None, false).unwrap();
        assert!(!dir.path().join(".git/config").exists());
        assert_eq!(changes[0].change, Change::Unverified);
    }

    #[test]
    fn git_name_status_is_read() {
        let changes =
            changes_from_git(b"A\0.envrc\0M\0.vscode/tasks.json\0D\0.gitmodules\0", false);
        assert_eq!(
            changes
                .iter()
                .map(|c| (c.path.as_str(), c.change))
                .collect::<Vec<_>>(),
            vec![
                (".envrc", Change::Added),
                (".vscode/tasks.json", Change::Modified),
                (".gitmodules", Change::Deleted)
            ]
        );
    }
}
