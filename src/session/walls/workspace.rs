//! Copy-mode workspaces (`--workspace-mode copy`): the host tree is archived once, at session
//! creation, into a workspace volume that the session's turns mount at /workspace; the host
//! tree is never touched again. `export` writes the volume's current tree to a directory,
//! `diff` says what the agent changed (a git diff for a repository, else added, changed and
//! removed files against the hashes recorded at creation).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use base64::Engine;
use uuid::Uuid;

use crate::backend::{Backend, CreateError};
use crate::backend::{HelperSpec, MountSpec, NetworkPolicy, TarFile};
use crate::error::{Error, Result};
use crate::provider::{AGENT_HOME, WORKSPACE_DIR};
use crate::session::store::names::{self, labels, roles, LabelSet};
use crate::session::store::target::VolumeFacts;
use crate::session::walls::protected_out::{self, sha256_hex as hash, ProtectedChange};
use crate::session::walls::protected_out::{CopyRecord as Base, RECORD_PATH as BASE_PATH};
use crate::session::walls::safe_git;

/// A workspace as copied at session start.
struct Copied {
    /// The tree for the workspace volume.
    tar: Vec<u8>,
    /// The same without `.git`: the baseline `diff --patch` compares with.
    baseline: Vec<u8>,
    base: Base,
}

/// Archives `dir` (honouring .gitignore, .ignore and .git/info/exclude, keeping .git itself)
/// as a tar owned by `uid:gid`, with the hash of every regular file.
fn archive(dir: &Path, uid: u64, gid: u64) -> Result<Copied> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut baseline = tar::Builder::new(Vec::new());
    let mut base = Base {
        executable: Some(Default::default()),
        ..Default::default()
    };
    let walker = ignore::WalkBuilder::new(dir)
        .hidden(false)
        .git_ignore(true)
        .git_exclude(true)
        .git_global(false)
        .require_git(false)
        .parents(false)
        .follow_links(false)
        .build();
    let fail = |e: &dyn std::fmt::Display| {
        Error::usage(format!("cannot copy workspace '{}': {e}", dir.display()))
    };
    for entry in walker {
        let entry = entry.map_err(|e| fail(&e))?;
        let path = entry.path();
        let rel = match path.strip_prefix(dir) {
            Ok(r) if !r.as_os_str().is_empty() => r.to_string_lossy().to_string(),
            _ => continue,
        };
        let in_git = rel == ".git" || rel.starts_with(".git/");
        let meta = entry.metadata().map_err(|e| fail(&e))?;
        let mut h = tar::Header::new_gnu();
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mtime(
            meta.modified()
                .ok()
                .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs()),
        );
        use std::os::unix::fs::PermissionsExt;
        h.set_mode(meta.permissions().mode() & 0o7777);
        let ft = meta.file_type();
        if ft.is_dir() {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            builder
                .append_data(&mut h.clone(), &rel, std::io::empty())
                .map_err(|e| fail(&e))?;
            if !in_git {
                baseline
                    .append_data(&mut h, &rel, std::io::empty())
                    .map_err(|e| fail(&e))?;
            }
        } else if ft.is_symlink() {
            let target = std::fs::read_link(path).map_err(|e| fail(&e))?;
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            builder
                .append_link(&mut h.clone(), &rel, &target)
                .map_err(|e| fail(&e))?;
            if !in_git {
                baseline
                    .append_link(&mut h, &rel, &target)
                    .map_err(|e| fail(&e))?;
            }
        } else if ft.is_file() {
            let bytes = std::fs::read(path).map_err(|e| fail(&e))?;
            base.files.insert(rel.clone(), hash(&bytes));
            if meta.permissions().mode() & 0o111 != 0 {
                base.executable.get_or_insert_default().insert(rel.clone());
            }
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(bytes.len() as u64);
            builder
                .append_data(&mut h.clone(), &rel, &bytes[..])
                .map_err(|e| fail(&e))?;
            if !in_git {
                baseline
                    .append_data(&mut h, &rel, &bytes[..])
                    .map_err(|e| fail(&e))?;
            }
        }
    }
    Ok(Copied {
        tar: builder.into_inner().map_err(|e| fail(&e))?,
        baseline: baseline.into_inner().map_err(|e| fail(&e))?,
        base,
    })
}

/// A never-started container holding the session's volumes, for the archive API.
fn holder(image: &str, session_id: Uuid, with_state: bool, read_only: bool) -> HelperSpec {
    let ro = |m: MountSpec| if read_only { m.read_only() } else { m };
    let mut mounts = vec![ro(MountSpec::volume(
        names::workspace_volume(session_id),
        WORKSPACE_DIR,
    ))];
    if with_state {
        mounts.push(ro(MountSpec::volume(
            names::state_volume(session_id),
            AGENT_HOME,
        )));
    }
    HelperSpec {
        image: image.to_string(),
        entrypoint: vec!["true".into()],
        labels: LabelSet::new(session_id, roles::PROBE).finish(),
        mounts,
        network: NetworkPolicy::None,
        ..Default::default()
    }
}

pub(in crate::session) async fn with_holder<T>(
    backend: &impl Backend,
    spec: HelperSpec,
    session_id: Uuid,
    f: impl AsyncFnOnce(&str) -> Result<T>,
) -> Result<T> {
    let name = names::helper_container(session_id, "");
    match backend.create_helper(&name, &spec).await {
        Ok(_) => {}
        Err(CreateError::NameTaken) => {
            return Err(Error::environment(format!(
                "helper container '{name}' exists"
            )))
        }
        Err(e) => return Err(e.into()),
    }
    let out = f(&name).await;
    let _ = backend.remove_container(&name, true).await;
    out
}

/// Creates the workspace volume of a new copy-mode session and fills it from `dir`.
pub async fn populate(
    backend: &impl Backend,
    session_id: Uuid,
    provider: crate::provider::ProviderKind,
    image: &str,
    dir: &Path,
    (uid, gid): (u32, u32),
) -> Result<()> {
    let (owner_uid, owner_gid) = (uid, gid);
    let (uid, gid) = (u64::from(uid), u64::from(gid));
    let Copied {
        tar,
        baseline,
        base,
    } = archive(dir, uid, gid)?;
    backend
        .create_volume(
            &names::workspace_volume(session_id),
            LabelSet::new(session_id, roles::WORKSPACE)
                .provider(provider)
                .finish(),
        )
        .await?;
    let base_json = serde_json::to_vec(&base).expect("bases serialize");
    with_holder(
        backend,
        holder(image, session_id, true, false),
        session_id,
        async |name: &str| {
            backend.upload_tar(name, WORKSPACE_DIR, tar).await?;
            let base_files = [
                TarFile {
                    path: BASE_PATH,
                    contents: &base_json,
                    mode: 0o600,
                },
                TarFile {
                    path: crate::session::walls::patch::BASE_TAR_PATH,
                    contents: &baseline,
                    mode: 0o600,
                },
            ];
            backend
                .upload_files(name, AGENT_HOME, &base_files, (owner_uid, owner_gid))
                .await
        },
    )
    .await
}

fn require_copy_mode(facts: &VolumeFacts) -> Result<()> {
    if facts.settings.workspace_mode != crate::session::WorkspaceMode::Copy {
        return Err(Error::usage(format!(
            "session {} has no copy-mode workspace (it was started with --workspace-mode {})",
            facts.session_id,
            match facts.settings.workspace_mode {
                crate::session::WorkspaceMode::Bind =>
                    "bind: its files are in the host directory already",
                crate::session::WorkspaceMode::None => "none",
                crate::session::WorkspaceMode::Copy => "copy",
            }
        )));
    }
    Ok(())
}

/// The workspace volume's current tree, as Docker archives it (entries under `workspace/`).
async fn current_tree(backend: &impl Backend, facts: &VolumeFacts) -> Result<Vec<u8>> {
    with_holder(
        backend,
        holder(&facts.settings.image, facts.session_id, false, true),
        facts.session_id,
        async |name: &str| {
            Ok(backend
                .download_tar(name, &format!("{WORKSPACE_DIR}/."))
                .await?
                .unwrap_or_default())
        },
    )
    .await
}

/// What `export` wrote.
#[derive(Debug)]
pub struct Exported {
    /// Regular files written.
    pub files: usize,
    /// The agent's changes to protected paths: left out, or written (`included`).
    pub protected: Vec<ProtectedChange>,
}

/// Writes the workspace to `dir` (which must be empty or absent, unless `force`), without
/// the agent's changes to the session's protected paths unless `include_protected`.
pub async fn export(
    backend: &impl Backend,
    facts: &VolumeFacts,
    dir: &Path,
    force: bool,
    include_protected: bool,
) -> Result<Exported> {
    require_copy_mode(facts)?;
    if dir.exists() {
        let non_empty = std::fs::read_dir(dir)
            .map_err(|e| Error::usage(format!("cannot read '{}': {e}", dir.display())))?
            .next()
            .is_some();
        if non_empty && !force {
            return Err(Error::usage(format!("'{}' is not empty", dir.display()))
                .with_hint("pick an empty or new directory, or pass --force to write over it"));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::usage(format!("cannot create '{}': {e}", dir.display())))?;
    // The tree and the record of the copy it is judged against, from one holder.
    let (tar, record) = with_holder(
        backend,
        holder(&facts.settings.image, facts.session_id, true, true),
        facts.session_id,
        async |name: &str| {
            let tree = backend
                .download_tar(name, &format!("{WORKSPACE_DIR}/."))
                .await?
                .unwrap_or_default();
            let record = backend
                .download_file(name, &format!("{AGENT_HOME}/{BASE_PATH}"))
                .await?;
            Ok((tree, record))
        },
    )
    .await?;
    let record: Option<Base> = record.and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let protected = protected_out::Protected::new(&facts.settings.protected_paths());
    let (files, protected) =
        protected_out::unpack(&tar, dir, &protected, record.as_ref(), include_protected)?;
    Ok(Exported { files, protected })
}

/// What the agent changed: `git status` + `git diff` for a repository, else `A`/`M`/`D`
/// lines against the tree as it was copied.
pub async fn diff(
    backend: &impl Backend,
    facts: &VolumeFacts,
    (uid, gid): (u32, u32),
) -> Result<String> {
    require_copy_mode(facts)?;
    let tar = current_tree(backend, facts).await?;
    let mut now: BTreeMap<String, String> = BTreeMap::new();
    let mut is_repo = false;
    let mut archive = tar::Archive::new(&tar[..]);
    for entry in archive
        .entries()
        .map_err(|e| Error::environment(format!("bad archive from the backend: {e}")))?
    {
        let mut entry =
            entry.map_err(|e| Error::environment(format!("bad archive from the backend: {e}")))?;
        let path = entry
            .path()
            .map_err(|e| Error::environment(e.to_string()))?;
        let rel = path.to_string_lossy().trim_start_matches("./").to_string();
        if rel == ".git" || rel.starts_with(".git/") {
            is_repo = true;
            continue;
        }
        if entry.header().entry_type().is_file() {
            let mut bytes = Vec::new();
            entry
                .read_to_end(&mut bytes)
                .map_err(|e| Error::environment(e.to_string()))?;
            now.insert(rel, hash(&bytes));
        }
    }
    if is_repo {
        return git_listing(backend, facts, (uid, gid)).await;
    }
    let base: Base = read_base(backend, facts).await?;
    let mut out = String::new();
    for (path, h) in &now {
        match base.files.get(path) {
            None => out.push_str(&format!("A {path}\n")),
            Some(old) if old != h => out.push_str(&format!("M {path}\n")),
            _ => {}
        }
    }
    for path in base.files.keys().filter(|p| !now.contains_key(*p)) {
        out.push_str(&format!("D {path}\n"));
    }
    Ok(out)
}

/// `git status --short` and `git diff` of the copy, each a base64 line, by a private
/// repository over it ([`safe_git`]) with the copy's HEAD, refs and index: no config, hook
/// or filter of the agent's runs, even here in a helper container.
const LISTING_SCRIPT: &str = r#"t=/tmp/caw-box-diff
private_repo /workspace "$t/git"
if [ -f /workspace/.git/HEAD ]; then cp /workspace/.git/HEAD "$t/git/HEAD"; fi
if [ -d /workspace/.git/refs ]; then cp -R /workspace/.git/refs/. "$t/git/refs/"; fi
if [ -f /workspace/.git/packed-refs ]; then cp /workspace/.git/packed-refs "$t/git/"; fi
export GIT_OBJECT_DIRECTORY=/workspace/.git/objects GIT_INDEX_FILE="$t/index"
if [ -f /workspace/.git/index ]; then cp /workspace/.git/index "$GIT_INDEX_FILE"; fi
cd /workspace
git status --short > "$t/status"
git diff --no-color --no-ext-diff --no-textconv > "$t/diff" || true
base64 -w0 "$t/status"; echo
base64 -w0 "$t/diff"; echo
"#;

async fn git_listing(
    backend: &impl Backend,
    facts: &VolumeFacts,
    (uid, gid): (u32, u32),
) -> Result<String> {
    let mut spec = holder(&facts.settings.image, facts.session_id, false, true);
    spec.entrypoint = vec!["sh".into(), "-c".into(), safe_git::script(LISTING_SCRIPT)];
    spec.env = safe_git::helper_env();
    spec.user = Some(format!("{uid}:{gid}"));
    spec.drop_all_capabilities = true;
    spec.no_new_privileges = true;
    let name = names::helper_container(facts.session_id, "status");
    let (code, out, err) = backend
        .run_to_completion(&name, &spec)
        .await
        .map_err(Error::from)?;
    if code != 0 {
        return Err(Error::environment(format!(
            "git status in the workspace failed: {}",
            err.trim()
        )));
    }
    let mut parts = out.split('\n').map(|line| {
        base64::engine::general_purpose::STANDARD
            .decode(line.trim())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| Error::environment(format!("git's listing came back damaged: {e}")))
    });
    let status = parts.next().transpose()?.unwrap_or_default();
    let diff = parts.next().transpose()?.unwrap_or_default();
    Ok(format!(
        "{status}{}{diff}",
        if diff.is_empty() { "" } else { "\n" }
    ))
}

async fn read_base(backend: &impl Backend, facts: &VolumeFacts) -> Result<Base> {
    let bytes = crate::session::store::target::read_volume_file(backend, facts, BASE_PATH)
        .await?
        .ok_or_else(|| {
            Error::environment(format!(
                "session {} lost the record of its copied workspace",
                facts.session_id
            ))
        })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::environment(format!("the copied workspace's record is unreadable: {e}"))
    })
}

/// Whether a bind-mode workspace `dir` can be mounted as it is: the backend sees this
/// process's paths (a local daemon, caw-box not in a container), or it shows the same file
/// there. `Err(reason)` when it cannot: a daemon that does not share caw-box's filesystem
/// (caw-box in a CI job's container with the host's socket, a remote `DOCKER_HOST`).
pub async fn daemon_sees(
    backend: &impl Backend,
    image: &str,
    dir: &Path,
) -> std::result::Result<(), String> {
    if matches!(
        backend.capabilities().host_dirs,
        crate::backend::HostDirs::Shared
    ) {
        return Ok(());
    }
    // One file of the directory, read back through the daemon: the same bytes, the same
    // directory (a CI runner mounts the job's directory at the same path, or another).
    let sample = std::fs::read_dir(dir)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| e.metadata().is_ok_and(|m| m.len() <= 1 << 20))
        .map(|e| e.file_name())
        .min();
    let Some(sample) = sample else {
        return Err("it holds no file to compare through the daemon".into());
    };
    let local = std::fs::read(dir.join(&sample)).map_err(|e| e.to_string())?;
    let name = names::helper_container(Uuid::new_v4(), "sees");
    let spec = HelperSpec {
        image: image.to_string(),
        entrypoint: vec!["true".into()],
        labels: crate::session::store::record::with_extra_labels(std::collections::HashMap::from(
            [
                (labels::MANAGED.to_string(), "true".to_string()),
                (labels::ROLE.to_string(), roles::PROBE.to_string()),
            ],
        )),
        mounts: vec![MountSpec::host_dir(dir.display().to_string(), "/probe").read_only()],
        network: NetworkPolicy::None,
        ..Default::default()
    };
    if let Err(e) = backend.create_helper(&name, &spec).await {
        let e = Error::from(e);
        return Err(match std::error::Error::source(&e) {
            Some(source) => source.to_string(),
            None => e.message,
        });
    }
    let remote = backend
        .download_file(&name, &format!("/probe/{}", sample.to_string_lossy()))
        .await;
    let _ = backend.remove_container(&name, true).await;
    match remote {
        Ok(Some(bytes)) if bytes == local => Ok(()),
        Ok(_) => Err("the daemon's directory of that path is another one".into()),
        Err(e) => Err(e.message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_honours_gitignore_and_keeps_git() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join(".gitignore"), "*.log\nbuild/\n").unwrap();
        std::fs::write(d.join("main.rs"), "fn main() {}").unwrap();
        std::fs::write(d.join("debug.log"), "noise").unwrap();
        std::fs::create_dir_all(d.join("build")).unwrap();
        std::fs::write(d.join("build/out.o"), "obj").unwrap();
        std::fs::create_dir_all(d.join(".git")).unwrap();
        std::fs::write(d.join(".git/HEAD"), "ref: refs/heads/main").unwrap();
        let copied = archive(d, 1000, 1000).unwrap();
        let names_in = |tar: &[u8]| -> Vec<String> {
            tar::Archive::new(tar)
                .entries()
                .unwrap()
                .map(|e| e.unwrap().path().unwrap().display().to_string())
                .collect()
        };
        let names = names_in(&copied.tar);
        let base = copied.base;
        assert!(names.contains(&"main.rs".to_string()), "{names:?}");
        assert!(names.contains(&".git/HEAD".to_string()), "{names:?}");
        assert!(names.contains(&".gitignore".to_string()), "{names:?}");
        assert!(
            !names
                .iter()
                .any(|n| n.ends_with(".log") || n.starts_with("build")),
            "{names:?}"
        );
        assert_eq!(base.files.get("main.rs"), Some(&hash(b"fn main() {}")));
        // The baseline of `diff --patch`: the same tree, without .git.
        let mut baseline = names_in(&copied.baseline);
        let mut want: Vec<String> = names
            .into_iter()
            .filter(|n| !n.starts_with(".git/") && n != ".git")
            .collect();
        baseline.sort();
        want.sort();
        assert_eq!(baseline, want);
    }
}
