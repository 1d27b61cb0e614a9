//! The per-turn runtime directory: a private scratch directory of the turn's container at
//! [`RUN_DIR`] (in memory, removed with it), through which caw-box and the entrypoint
//! (`caw-box-entry`) talk: the env file, credentials, stdin and the scrub list go in at the
//! start (a headless turn's on its stdin, [`Runtime::payload`]; a TUI's through the
//! archive API before the start); the stop files go in while it runs; the resume key of a
//! TUI and refreshed credentials come out after it stopped. Nothing is a host path, so a
//! daemon that does not share caw-box's filesystem runs turns too. Not what goes through
//! it (see `history.rs` for the record hand-off).

use uuid::Uuid;

use crate::backend::{Backend, Scratch, ScratchFile};
use crate::error::Result;
use crate::session::store::names::{self, labels, roles};

/// Where the turn's scratch storage is mounted.
pub const RUNTIME_MOUNT: &str = "/run/caw-box";

/// The runtime directory in the container (`CAW_BOX_RUN_DIR`): the scratch storage's root,
/// the agent's own.
pub const RUN_DIR: &str = RUNTIME_MOUNT;

/// The first line of what a headless turn's driver writes on the container's stdin:
/// `caw-box-runtime <bytes>`, then a tar archive of the runtime files of that length.
pub(in crate::session) const PAYLOAD_TAG: &str = "caw-box-runtime";

/// A file that tells the entrypoint to kill the CLI at the stop signal, without grace.
pub(in crate::session) const STOP_NOW: &str = "stop-now";

/// A file `caw-box stop` puts in the turn's runtime directory before stopping its
/// container, so the process driving the turn records it as interrupted, not as a crash.
pub const STOP_REQUEST: &str = "stop-requested";

/// The files a turn's runtime directory starts with, gathered before the container exists.
pub(in crate::session) struct Runtime(Scratch);

impl Runtime {
    /// An empty runtime directory of a container that runs as `owner` (uid:gid): its files
    /// belong to it.
    pub(in crate::session) fn new(owner: (u32, u32)) -> Self {
        Runtime(Scratch {
            mount: RUNTIME_MOUNT.to_string(),
            owner,
            files: Vec::new(),
            labels: Default::default(),
        })
    }

    /// The uid:gid the container runs as.
    pub(in crate::session) fn owner(&self) -> (u32, u32) {
        self.0.owner
    }

    /// `name` relative to the runtime directory; mode 0600.
    pub(in crate::session) fn write(&mut self, name: &str, contents: &[u8]) {
        self.0.files.push(ScratchFile {
            path: name.to_string(),
            contents: contents.to_vec(),
            mode: 0o600,
        });
    }

    /// The files as the entrypoint reads them on stdin: the tag line, then a tar archive.
    pub(in crate::session) fn payload(&self) -> Result<Vec<u8>> {
        framed(PAYLOAD_TAG, &self.0.tar_files(), self.0.owner)
    }

    /// The scratch directory the backend gives the turn's container.
    pub(in crate::session) fn into_scratch(self) -> Scratch {
        self.0
    }
}

/// Removes the runtime scratch volumes no container uses, of `session` (or, `None`, of
/// every session of this process's extra labels): what turns' containers removed from
/// outside without their volumes (`docker rm -f`) left, each with its turn's prompt in it;
/// their names. A running turn's is in use: it stays.
pub async fn remove_unused(backend: &impl Backend, session: Option<Uuid>) -> Result<Vec<String>> {
    let mut filter = vec![
        format!("{}=true", labels::MANAGED),
        format!("{}={}", labels::ROLE, roles::RUNTIME),
    ];
    match session {
        Some(id) => filter.push(format!("{}={id}", labels::SESSION)),
        None => filter.extend(
            names::extra_labels()
                .iter()
                .map(|(k, v)| format!("{k}={v}")),
        ),
    }
    backend.remove_unused_volumes(&filter).await
}

/// `<tag> <bytes>\n` and a tar archive of `files` of that length: what the entrypoint
/// reads from its stdin (`read` the line, `head -c` the bytes into `tar -x`). The files
/// belong to `owner`, the uid:gid the container runs as: a `tar -x` as uid 0 (without the
/// capability to give files away) keeps the archive's owners, and fails on any other.
pub(in crate::session) fn framed(
    tag: &str,
    files: &[crate::backend::TarFile<'_>],
    (uid, gid): (u32, u32),
) -> Result<Vec<u8>> {
    let tar = crate::backend::build_tar(files, uid.into(), gid.into())?;
    let mut out = format!("{tag} {}\n", tar.len()).into_bytes();
    out.extend_from_slice(&tar);
    Ok(out)
}

/// Puts an empty file `name` in the runtime directory of the running container `container`,
/// which runs as `owner` (uid:gid).
pub async fn signal_file(
    backend: &impl Backend,
    container: &str,
    name: &str,
    owner: (u32, u32),
) -> Result<()> {
    let file = crate::backend::TarFile {
        path: name,
        contents: b"",
        mode: 0o600,
    };
    backend
        .upload_files(container, RUN_DIR, &[file], owner)
        .await
}

/// Whether the (stopped) container's runtime directory holds `name`.
pub(in crate::session) async fn has_file(
    backend: &impl Backend,
    container: &str,
    name: &str,
) -> bool {
    matches!(
        backend
            .download_file(container, &format!("{RUN_DIR}/{name}"))
            .await,
        Ok(Some(_))
    )
}
