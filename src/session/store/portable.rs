//! Portable sessions: one archive that carries a session from one backend to another (a
//! Docker host, a cluster's namespace: `caw-box session export` / `import`), so that a CI
//! job's session can resume on the next job's runner by the same handle.
//!
//! The archive is a gzip-compressed tar:
//!
//! - `caw-box-session.json` first: the [`Manifest`] (format, version, the session id and
//!   provider, and every volume of the session with its labels);
//! - `volumes/<volume name>/…`: the contents of the state volume (HOME) and, in copy mode,
//!   of the workspace volume. Turn-record volumes are labels only.
//!
//! Never a credential: the provider's credential paths under HOME (what the entrypoint
//! scrubs after every turn) and caches that may hold the environment (codex's shell
//! snapshots) are left out, and so is any file holding a key value caw-box knows (stored
//! by `auth collect`, or in this process's environment).
//!
//! Import reads and checks the whole archive before it creates anything: a damaged or
//! foreign archive is a usage error (exit 2) and leaves nothing behind; so is a session
//! that exists already, unless `force` replaces it.

use std::collections::HashMap;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::spec::Spec;
use crate::backend::{Backend, HelperSpec, MountSpec, NetworkPolicy};
use crate::error::{Error, Result};
use crate::provider::{ProviderKind, AGENT_HOME, WORKSPACE_DIR};
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{labels, roles};
use crate::session::store::target::{self, VolumeFacts};
use crate::session::WorkspaceMode;

/// The first entry of every archive.
const MANIFEST_PATH: &str = "caw-box-session.json";
/// The manifest's `format`: what says an archive is ours.
const FORMAT: &str = "caw-box-session";
const VERSION: u32 = 1;
/// Under HOME: caches that may hold the environment the CLI ran with.
const NEVER_EXPORTED: &[&str] = &[".codex/shell_snapshots"];

/// What an archive holds, besides the volumes' files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub session_id: Uuid,
    pub provider: ProviderKind,
    pub exported_at: u64,
    pub caw_box_version: String,
    pub volumes: Vec<VolumeEntry>,
}

/// One volume of the session: its name, labels, and whether its files are in the archive.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VolumeEntry {
    pub name: String,
    pub labels: HashMap<String, String>,
    /// Where its files are mounted in a holder container (`/home/agent`, `/workspace`);
    /// `None` for a volume that is only labels (a turn record).
    #[serde(default)]
    pub mount: Option<String>,
}

/// Whether a checkpoint volume's files (`tar`) hold one of `secrets`: their bytes, and each
/// compressed layer (`.gz`, `.zst`) unpacked (its bytes say nothing of what it holds). One
/// that cannot be read counts as holding one: the checkpoints are then left out, never
/// carried unread.
fn checkpoint_holds_any(tar: &[u8], secrets: &[Vec<u8>]) -> bool {
    if crate::auth::holds_any(tar, secrets) {
        return true;
    }
    let mut archive = tar::Archive::new(tar);
    let Ok(entries) = archive.entries() else {
        return true;
    };
    for entry in entries {
        let Ok(mut entry) = entry else {
            return true;
        };
        let extension = entry
            .path()
            .ok()
            .and_then(|p| p.extension().map(|x| x.to_string_lossy().into_owned()));
        let mut raw = Vec::new();
        let read = match extension.as_deref() {
            Some("gz") => {
                std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&mut entry), &mut raw)
            }
            Some("zst") => match ruzstd::decoding::StreamingDecoder::new(&mut entry) {
                Ok(mut decoder) => std::io::Read::read_to_end(&mut decoder, &mut raw),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            },
            _ => continue,
        };
        if read.is_err() || crate::auth::holds_any(&raw, secrets) {
            return true;
        }
    }
    false
}

/// What `export` did.
#[derive(Debug, Default)]
pub struct ExportReport {
    pub files: usize,
    pub bytes: u64,
    /// Paths (relative to HOME) left out because they hold a known key value.
    pub withheld: Vec<String>,
    /// How many checkpoints the archive carries.
    pub checkpoints: usize,
    /// The checkpoints were asked for and left out: one held a known key value.
    pub checkpoints_withheld: bool,
}

/// Where a checkpoint volume of turn `turn` is mounted in the export's and import's holder.
fn checkpoint_mount(turn: &str) -> String {
    format!("{CHECKPOINTS_DIR}/{turn}")
}
/// Under it, each checkpoint's directory (`<turn>`).
const CHECKPOINTS_DIR: &str = "/caw-box-checkpoints";

/// The session's volumes an archive carries, in the order import makes them: its state,
/// its workspace, its checkpoints (when `all_checkpoints`), its turn records.
async fn export_volumes(
    backend: &impl Backend,
    id: Uuid,
    all_checkpoints: bool,
) -> Result<Vec<VolumeEntry>> {
    let mut volumes = Vec::new();
    for v in backend
        .list_volumes(&[
            format!("{}=true", labels::MANAGED),
            format!("{}={id}", labels::SESSION),
        ])
        .await?
    {
        let mount = if v.name == names::state_volume(id) {
            Some(AGENT_HOME.to_string())
        } else if v.name == names::workspace_volume(id) {
            Some(WORKSPACE_DIR.to_string())
        } else if v.labels.get(labels::ROLE).map(String::as_str) == Some(roles::TURN_RECORD) {
            None
        } else if all_checkpoints
            && v.labels.get(labels::ROLE).map(String::as_str) == Some(roles::CHECKPOINT)
        {
            match v.labels.get(labels::TURN) {
                Some(turn) if v.name == names::checkpoint_volume(id, turn.parse().unwrap_or(0)) => {
                    Some(checkpoint_mount(turn))
                }
                _ => continue,
            }
        } else {
            continue;
        };
        volumes.push(VolumeEntry {
            name: v.name,
            labels: v.labels,
            mount,
        });
    }
    // State first, then the workspace, the checkpoints, the turn records: import creates
    // them in order.
    volumes.sort_by_key(|v| match v.mount.as_deref() {
        Some(AGENT_HOME) => 0,
        Some(WORKSPACE_DIR) => 1,
        Some(_) => 2,
        None => 3,
    });
    Ok(volumes)
}

/// Writes session `facts` as one archive to `out`, with every checkpoint when
/// `all_checkpoints` (else none: the import takes one of the latest turn). The session must
/// not be running a turn (the caller checks; its state would be half-written).
pub async fn export(
    backend: &impl Backend,
    facts: &VolumeFacts,
    all_checkpoints: bool,
    out: &mut dyn Write,
) -> Result<ExportReport> {
    let id = facts.session_id;
    crate::session::store::checkpoint::settle(backend, id).await?;
    let mut volumes = export_volumes(backend, id, all_checkpoints).await?;
    let secrets = crate::auth::known_secrets(facts.provider);
    let mounted: Vec<VolumeEntry> = volumes
        .iter()
        .filter(|v| v.mount.is_some())
        .cloned()
        .collect();
    let mounted: Vec<&VolumeEntry> = mounted.iter().collect();
    let spec = holder(&facts.settings.image, id, &mounted, true);
    let mut trees =
        crate::session::walls::workspace::with_holder(backend, spec, id, async |name: &str| {
            let mut trees = Vec::new();
            for v in &mounted {
                let dir = v.mount.as_deref().unwrap_or_default();
                let tar = backend
                    .download_tar(name, &format!("{dir}/."))
                    .await?
                    .unwrap_or_default();
                trees.push(((*v).clone(), tar));
            }
            Ok(trees)
        })
        .await?;
    let mut report = ExportReport::default();
    // A checkpoint's layer holds HOME's files as they were: one with a known key value in
    // it leaves every checkpoint out (they restore only as a chain).
    let is_checkpoint = |v: &VolumeEntry| {
        v.mount
            .as_deref()
            .is_some_and(|m| m.starts_with(CHECKPOINTS_DIR))
    };
    if !secrets.is_empty()
        && trees
            .iter()
            .any(|(v, tar)| is_checkpoint(v) && checkpoint_holds_any(tar, &secrets))
    {
        report.checkpoints_withheld = true;
        trees.retain(|(v, _)| !is_checkpoint(v));
        volumes.retain(|v| !is_checkpoint(v));
    }
    report.checkpoints = volumes.iter().filter(|v| is_checkpoint(v)).count();
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        session_id: id,
        provider: facts.provider,
        exported_at: crate::clock::now_secs(),
        caw_box_version: env!("CARGO_PKG_VERSION").into(),
        volumes,
    };

    let credential_paths = Spec::of(facts.provider).home_targets();
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut archive = tar::Builder::new(gz);
    let manifest_json = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
    append(&mut archive, MANIFEST_PATH, &manifest_json, 0o644, (0, 0))?;

    for (volume, tree) in &trees {
        let is_home = volume.mount.as_deref() == Some(AGENT_HOME);
        let mut entries = tar::Archive::new(&tree[..]);
        for entry in entries.entries().map_err(bad_backend_tar)? {
            let mut entry = entry.map_err(bad_backend_tar)?;
            let rel = relative(&entry.path().map_err(bad_backend_tar)?);
            if rel.is_empty() {
                continue;
            }
            if is_home && withheld_path(&rel, &credential_paths) {
                continue;
            }
            let mut data = Vec::new();
            entry.read_to_end(&mut data).map_err(bad_backend_tar)?;
            if is_home && !secrets.is_empty() && crate::auth::holds_any(&data, &secrets) {
                report.withheld.push(rel);
                continue;
            }
            let path = format!("volumes/{}/{rel}", volume.name);
            if entry.header().entry_type().is_file() {
                report.files += 1;
                report.bytes += data.len() as u64;
            }
            copy_entry(&mut archive, &entry, &path, &data).map_err(write_failed)?;
        }
    }
    let gz = archive.into_inner().map_err(write_failed)?;
    gz.finish()
        .map_err(write_failed)?
        .flush()
        .map_err(write_failed)?;
    Ok(report)
}

/// An archive read and checked, ready to be created on a backend.
#[derive(Debug)]
pub struct Checked {
    pub manifest: Manifest,
    /// Per mounted volume: a tar of its files, relative to its mount.
    trees: Vec<(VolumeEntry, Vec<u8>)>,
}

/// A session archive that is not usable: `what` is wrong with it.
fn damaged(what: String) -> Error {
    Error::usage(format!("not a usable caw-box session archive: {what}"))
        .with_hint("export the session again with `caw-box session export TARGET FILE`")
}

/// The manifest's format and version are this caw-box's, and each of its volumes is its
/// session's, its state volume among them.
fn check_manifest(manifest: &Manifest) -> Result<()> {
    if manifest.format != FORMAT {
        return Err(damaged(format!("its format is '{}'", manifest.format)));
    }
    if manifest.version != VERSION {
        return Err(damaged(format!(
            "it is version {} (this caw-box reads version {VERSION})",
            manifest.version
        )));
    }
    let id = manifest.session_id;
    for v in &manifest.volumes {
        let own = v.labels.get(labels::MANAGED).map(String::as_str) == Some("true")
            && v.labels.get(labels::SESSION) == Some(&id.to_string());
        let expected_name = match v.mount.as_deref() {
            Some(AGENT_HOME) => v.name == names::state_volume(id),
            Some(WORKSPACE_DIR) => v.name == names::workspace_volume(id),
            // A checkpoint: mounted under its own turn, named for it, labelled as one.
            Some(m) => m
                .strip_prefix(CHECKPOINTS_DIR)
                .and_then(|t| t.strip_prefix('/'))
                .and_then(|t| t.parse::<u32>().ok())
                .is_some_and(|turn| {
                    v.name == names::checkpoint_volume(id, turn)
                        && v.labels.get(labels::ROLE).map(String::as_str) == Some(roles::CHECKPOINT)
                        && v.labels.get(labels::TURN) == Some(&turn.to_string())
                }),
            None => v
                .name
                .starts_with(&format!("{}-turn-", names::state_volume(id))),
        };
        if !own || !expected_name {
            return Err(damaged(format!(
                "volume '{}' is not one of session {id}'s",
                v.name
            )));
        }
    }
    let state = manifest
        .volumes
        .iter()
        .find(|v| v.mount.as_deref() == Some(AGENT_HOME))
        .ok_or_else(|| damaged("it has no state volume".into()))?;
    if VolumeFacts::from_volume(&crate::backend::VolumeInfo {
        name: state.name.clone(),
        labels: state.labels.clone(),
    })
    .is_none()
    {
        return Err(damaged(
            "its state volume's labels are not a session's".into(),
        ));
    }
    Ok(())
}

/// Reads and checks a whole archive; any fault is a usage error naming what is wrong.
pub fn check(bytes: &[u8]) -> Result<Checked> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut raw)
        .map_err(|e| damaged(format!("it does not decompress ({e})")))?;
    let mut archive = tar::Archive::new(&raw[..]);
    let mut entries = archive
        .entries()
        .map_err(|e| damaged(format!("bad tar ({e})")))?;
    let manifest: Manifest = {
        let mut first = entries
            .next()
            .ok_or_else(|| damaged("it is empty".into()))?
            .map_err(|e| damaged(format!("bad tar ({e})")))?;
        if first.path().ok().as_deref() != Some(std::path::Path::new(MANIFEST_PATH)) {
            return Err(damaged(format!("it does not start with {MANIFEST_PATH}")));
        }
        let mut json = Vec::new();
        first
            .read_to_end(&mut json)
            .map_err(|e| damaged(format!("bad tar ({e})")))?;
        serde_json::from_slice(&json)
            .map_err(|e| damaged(format!("{MANIFEST_PATH} is not valid ({e})")))?
    };
    check_manifest(&manifest)?;

    let mut builders: Vec<(VolumeEntry, tar::Builder<Vec<u8>>)> = manifest
        .volumes
        .iter()
        .filter(|v| v.mount.is_some())
        .map(|v| (v.clone(), tar::Builder::new(Vec::new())))
        .collect();
    for entry in entries {
        let mut entry = entry.map_err(|e| damaged(format!("bad tar ({e})")))?;
        let path = entry
            .path()
            .map_err(|e| damaged(format!("bad entry name ({e})")))?
            .to_string_lossy()
            .into_owned();
        let (volume, rel) = path
            .strip_prefix("volumes/")
            .and_then(|p| p.split_once('/'))
            .ok_or_else(|| damaged(format!("unexpected entry '{path}'")))?;
        if rel.split('/').any(|c| c == "..") || rel.starts_with('/') {
            return Err(damaged(format!("entry '{path}' escapes its volume")));
        }
        let (_, builder) = builders
            .iter_mut()
            .find(|(v, _)| v.name == volume)
            .ok_or_else(|| damaged(format!("entry '{path}' of an undeclared volume")))?;
        let mut data = Vec::new();
        entry
            .read_to_end(&mut data)
            .map_err(|e| damaged(format!("bad tar ({e})")))?;
        copy_entry(builder, &entry, rel, &data)
            .map_err(|e| damaged(format!("entry '{path}' ({e})")))?;
    }
    let trees = builders
        .into_iter()
        .map(|(v, b)| Ok((v, b.into_inner().map_err(|e| damaged(e.to_string()))?)))
        .collect::<Result<_>>()?;
    Ok(Checked { manifest, trees })
}

/// Creates a checked archive's session on `backend`. A session of the same id is refused,
/// unless `force`, which removes it first (never while it runs a turn); a session of
/// another id with the same name is refused. On failure, what was created is removed.
pub async fn import(backend: &impl Backend, checked: &Checked, force: bool) -> Result<VolumeFacts> {
    let m = &checked.manifest;
    let id = m.session_id;
    let state = m
        .volumes
        .iter()
        .find(|v| v.mount.as_deref() == Some(AGENT_HOME))
        .expect("checked archives have a state volume");
    let facts = VolumeFacts::from_volume(&crate::backend::VolumeInfo {
        name: state.name.clone(),
        labels: state.labels.clone(),
    })
    .expect("checked archives have a session's state volume");
    if backend.inspect_volume(&state.name).await?.is_some() {
        if !force {
            return Err(
                Error::usage(format!("session {id} exists on this host already"))
                    .with_hint("pass --force to replace it, or remove it first: `caw-box rm ID`"),
            );
        }
        if let Some(turn) = crate::session::lifecycle::running_turns(backend)
            .await?
            .get(&id)
        {
            return Err(crate::session::lifecycle::running_refusal(id, *turn));
        }
        crate::session::lifecycle::remove(backend, id).await?;
    }
    if let Some(name) = &facts.name {
        let taken = target::list_sessions(backend)
            .await?
            .into_iter()
            .find(|s| s.facts.name.as_deref() == Some(name) && s.facts.session_id != id);
        if let Some(other) = taken {
            return Err(Error::usage(format!(
                "the name '{name}' is taken by session {} on this host",
                other.facts.session_id
            ))
            .with_hint("rename or remove that session first (`caw-box rm NAME`)"));
        }
    }
    let image = &facts.settings.image;
    if backend.inspect_image(image).await?.is_none() {
        return Err(
            Error::environment(format!("image '{image}' of session {id} is not present"))
                .with_hint(format!(
                    "build it with `caw-box image build --provider {}`",
                    facts.provider
                )),
        );
    }

    let created = create_all(backend, checked, &facts).await;
    if let Err(e) = created {
        for v in m.volumes.iter().rev() {
            let _ = backend.remove_volume(&v.name).await;
        }
        return Err(e);
    }
    let carried = m
        .volumes
        .iter()
        .any(|v| v.labels.get(labels::ROLE).map(String::as_str) == Some(roles::CHECKPOINT));
    if !carried {
        checkpoint_latest(backend, &facts).await;
    }
    Ok(facts)
}

/// An imported session that came without checkpoints gets one of its latest turn, from the
/// volumes just made (they are that turn's end), so that `fork` can start from it. Failing
/// costs only that: a warning.
async fn checkpoint_latest(backend: &impl Backend, facts: &VolumeFacts) {
    if !backend.capabilities().checkpoints {
        return;
    }
    let id = facts.session_id;
    let last = match target::resolve_view(backend, &id.to_string()).await {
        Ok(view) => view.last,
        Err(e) => {
            tracing::warn!("no checkpoint of imported session {id}: {e}");
            return;
        }
    };
    let Some(last) = last else { return };
    let source = crate::session::store::checkpoint::Source {
        session_id: id,
        provider: facts.provider,
        image: &facts.settings.image,
        workspace_mode: facts.settings.workspace_mode,
        resume_key: &last.resume_key,
    };
    if let Err(e) = crate::session::store::checkpoint::take(backend, &source, last.turn).await {
        crate::output::eprintln(&format!(
            "warning: no checkpoint of session {id}'s turn {} was taken ({e}): fork it after its \
             next turn",
            last.turn
        ));
    }
}

async fn create_all(backend: &impl Backend, checked: &Checked, facts: &VolumeFacts) -> Result<()> {
    let id = checked.manifest.session_id;
    for v in &checked.manifest.volumes {
        backend.create_volume(&v.name, v.labels.clone()).await?;
    }
    let mounted: Vec<&VolumeEntry> = checked.trees.iter().map(|(v, _)| v).collect();
    let spec = holder(&facts.settings.image, id, &mounted, false);
    crate::session::walls::workspace::with_holder(backend, spec, id, async |name: &str| {
        for (v, tar) in &checked.trees {
            let dir = v.mount.as_deref().unwrap_or_default();
            backend.upload_tar(name, dir, tar.clone()).await?;
        }
        Ok(())
    })
    .await
}

/// Whether a session of this workspace mode has files outside HOME that export carries.
pub fn carries_workspace(facts: &VolumeFacts) -> bool {
    facts.settings.workspace_mode == WorkspaceMode::Copy
}

fn holder(image: &str, id: Uuid, volumes: &[&VolumeEntry], read_only: bool) -> HelperSpec {
    let mounts = volumes
        .iter()
        .map(|v| {
            let m = MountSpec::volume(v.name.clone(), v.mount.as_deref().unwrap_or_default());
            if read_only {
                m.read_only()
            } else {
                m
            }
        })
        .collect();
    HelperSpec {
        image: image.to_string(),
        entrypoint: vec!["true".into()],
        labels: LabelSet::new(id, roles::PROBE).finish(),
        mounts,
        network: NetworkPolicy::None,
        ..Default::default()
    }
}

/// An entry's path without Docker's leading `./`.
fn relative(path: &std::path::Path) -> String {
    path.components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// A credential path under HOME, or inside a cache that is never exported.
fn withheld_path(rel: &str, credential_paths: &[String]) -> bool {
    let rel = rel.trim_end_matches('/');
    credential_paths.iter().any(|c| c == rel)
        || NEVER_EXPORTED
            .iter()
            .any(|n| rel == *n || rel.starts_with(&format!("{n}/")))
}

fn append(
    archive: &mut tar::Builder<impl Write>,
    path: &str,
    data: &[u8],
    mode: u32,
    (uid, gid): (u64, u64),
) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_mtime(crate::clock::now_secs());
    header.set_entry_type(tar::EntryType::Regular);
    archive
        .append_data(&mut header, path, data)
        .map_err(write_failed)
}

/// Appends `entry` (its type, mode, owner, time, link, and `data`) under `path`, with a
/// fresh header: a copied one keeps its old name fields (a ustar prefix) and would put the
/// entry elsewhere. Long names and links get GNU extension records.
fn copy_entry<W: Write, R: Read>(
    builder: &mut tar::Builder<W>,
    entry: &tar::Entry<'_, R>,
    path: &str,
    data: &[u8],
) -> std::io::Result<()> {
    let old = entry.header();
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(old.entry_type());
    header.set_mode(old.mode()?);
    header.set_uid(old.uid()?);
    header.set_gid(old.gid()?);
    header.set_mtime(old.mtime().unwrap_or(0));
    match old.entry_type() {
        tar::EntryType::Symlink | tar::EntryType::Link => {
            let target = entry.link_name()?.unwrap_or_default().into_owned();
            header.set_size(0);
            builder.append_link(&mut header, path, target)
        }
        _ => {
            header.set_size(data.len() as u64);
            builder.append_data(&mut header, path, data)
        }
    }
}

fn bad_backend_tar(e: std::io::Error) -> Error {
    Error::environment(format!("bad archive from the backend: {e}"))
}

fn write_failed(e: std::io::Error) -> Error {
    Error::environment(format!("cannot write the archive: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key inside a checkpoint's gzipped HOME layer is found (the layer's own bytes do not
    /// show it); a volume without one, and with the key's bytes nowhere, is not held.
    #[test]
    fn a_key_in_a_gzipped_layer_holds_the_checkpoints_back() {
        let key = b"sk-test-0123456789abcdef".to_vec();
        let keys = [key.clone()];
        let volume = |inner: &[u8]| {
            let mut layer = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut layer, inner).unwrap();
            let layer = layer.finish().unwrap();
            let mut b = tar::Builder::new(Vec::new());
            append(&mut b, "./home.tar.gz", &layer, 0o600, (1000, 1000)).unwrap();
            append(&mut b, "./info.json", b"{}", 0o600, (1000, 1000)).unwrap();
            b.into_inner().unwrap()
        };
        // (Among enough text that deflate codes it, not stores it as it is.)
        let filler = b"home/agent/.codex/state.sqlite ".repeat(200);
        let holding = volume(&[filler.as_slice(), &key, &filler].concat());
        assert!(!crate::auth::holds_any(&holding, &keys), "gzip hides it");
        assert!(checkpoint_holds_any(&holding, &keys));
        assert!(!checkpoint_holds_any(&volume(b"home/agent/other\0"), &keys));
    }

    /// The same of a zstd layer (`home.tar.zst`), and one that does not unpack holds them
    /// back too.
    #[test]
    fn a_key_in_a_zstd_layer_holds_the_checkpoints_back() {
        let key = b"sk-test-0123456789abcdef".to_vec();
        let keys = [key.clone()];
        let volume = |layer: &[u8]| {
            let mut b = tar::Builder::new(Vec::new());
            append(&mut b, "./home.tar.zst", layer, 0o600, (1000, 1000)).unwrap();
            b.into_inner().unwrap()
        };
        // As the images write it: `zstd -1` (scripts/rig.sh build-deps installs it here).
        let zstd = |inner: &[u8]| {
            use std::io::Write;
            let mut child = std::process::Command::new("zstd")
                .args(["-1", "-q", "-c"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("zstd");
            child.stdin.take().unwrap().write_all(inner).unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success());
            out.stdout
        };
        // (Among text that does not repeat but is of few letters: zstd codes such literals
        // by Huffman, so the key's bytes are nowhere as they are.)
        let mut state = 0x2545_f491_u32;
        let filler: Vec<u8> = (0..4000)
            .map(|_| {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                b"abcd"[(state >> 16) as usize % 4]
            })
            .collect();
        let holding = volume(&zstd(&[filler.as_slice(), &key, &filler].concat()));
        assert!(!crate::auth::holds_any(&holding, &keys), "zstd hides it");
        assert!(checkpoint_holds_any(&holding, &keys));
        assert!(!checkpoint_holds_any(&volume(&zstd(&filler)), &keys));
        assert!(checkpoint_holds_any(&volume(b"not zstd at all"), &keys));
    }

    fn archive_of(manifest: &Manifest, files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        {
            let mut b = tar::Builder::new(&mut gz);
            let json = serde_json::to_vec(manifest).unwrap();
            append(&mut b, MANIFEST_PATH, &json, 0o644, (0, 0)).unwrap();
            for (path, data) in files {
                if path.contains("..") {
                    // The tar crate refuses to write such a name: write the header by hand.
                    let mut h = tar::Header::new_gnu();
                    h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
                    h.set_size(data.len() as u64);
                    h.set_mode(0o600);
                    h.set_cksum();
                    b.append(&h, *data).unwrap();
                } else {
                    append(&mut b, path, data, 0o600, (1000, 1000)).unwrap();
                }
            }
            b.finish().unwrap();
        }
        gz.finish().unwrap()
    }

    fn manifest() -> Manifest {
        let id = Uuid::parse_str("5b0c7e2a-1111-4222-8333-944455556666").unwrap();
        let state_labels = LabelSet::new(id, roles::STATE)
            .provider(ProviderKind::Codex)
            .finish();
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            session_id: id,
            provider: ProviderKind::Codex,
            exported_at: 1,
            caw_box_version: "0".into(),
            volumes: vec![VolumeEntry {
                name: names::state_volume(id),
                labels: state_labels,
                mount: Some(AGENT_HOME.into()),
            }],
        }
    }

    #[test]
    fn a_good_archive_is_checked_into_one_tree_per_volume() {
        let m = manifest();
        let file = format!("volumes/{}/.codex/config.toml", m.volumes[0].name);
        // Longer than a tar header's name field (codex's rollout files are).
        let long = format!(
            ".codex/sessions/2026/11/24/rollout-{}.jsonl",
            "x".repeat(120)
        );
        let long_file = format!("volumes/{}/{long}", m.volumes[0].name);
        let checked = check(&archive_of(
            &m,
            &[(&file, b"model = 'x'"), (&long_file, b"{}")],
        ))
        .unwrap();
        assert_eq!(checked.manifest, m);
        let mut tree = tar::Archive::new(&checked.trees[0].1[..]);
        let paths: Vec<String> = tree
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(paths, [".codex/config.toml".to_string(), long]);
    }

    #[test]
    fn damaged_and_foreign_archives_are_usage_errors() {
        let m = manifest();
        let good = archive_of(&m, &[]);
        let refuse = |bytes: &[u8], why: &str| {
            let e = check(bytes).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Usage, "{e}");
            assert!(e.to_string().contains(why), "{e}");
        };
        refuse(&good[..good.len() - 9], "does not decompress");
        refuse(b"hello", "does not decompress");
        let mut foreign = m.clone();
        foreign.format = "something-else".into();
        refuse(&archive_of(&foreign, &[]), "its format is 'something-else'");
        let mut newer = m.clone();
        newer.version = 9;
        refuse(&archive_of(&newer, &[]), "version 9");
        let mut other = m.clone();
        other.volumes[0].name = "caw-box-somebody-else".into();
        refuse(&archive_of(&other, &[]), "is not one of session");
        let escape = format!("volumes/{}/../../etc/passwd", m.volumes[0].name);
        refuse(&archive_of(&m, &[(&escape, b"x")]), "escapes its volume");
        refuse(
            &archive_of(&m, &[("elsewhere/x", b"x")]),
            "unexpected entry",
        );
    }

    #[test]
    fn credential_paths_and_env_caches_are_withheld() {
        let creds = vec![".codex/auth.json".to_string()];
        assert!(withheld_path(".codex/auth.json", &creds));
        assert!(withheld_path(".codex/shell_snapshots/1.sh", &creds));
        assert!(withheld_path(".codex/shell_snapshots/", &creds));
        assert!(!withheld_path(".codex/sessions/a.jsonl", &creds));
        assert!(crate::auth::holds_any(
            b"export KEY=sk-test-1234567890",
            &[b"sk-test-1234567890".to_vec()]
        ));
        assert!(!crate::auth::holds_any(
            b"nothing here",
            &[b"sk-test-1234567890".to_vec()]
        ));
    }
}
