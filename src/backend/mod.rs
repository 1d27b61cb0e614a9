//! Backends run what the session layer describes. Docker (through bollard) is the only one
//! today, in `docker/`; nothing outside that folder names a bollard type. The session layer
//! speaks to a backend in caw-box's own terms: a [`TurnSpec`] for a turn, a [`HelperSpec`]
//! for caw-box's short-lived helpers, [`VolumeInfo`] / [`ContainerInfo`] for what exists,
//! [`OutputChunk`]s for what a container prints.
//!
//! # The backend contract
//!
//! What the session layer relies on, and so what a second backend (Kubernetes) must keep:
//!
//! - **The lock is atomic.** Creating a turn under the session's turn name
//!   ([`crate::session::names::turn_container`]) either succeeds or reports
//!   `NameTaken`; two racing creators never both succeed. The turn holds the lock from
//!   its creation until its driver removes it, after the turn is recorded.
//! - **Labels are the index.** Everything created carries the labels of
//!   [`crate::session::names`] (plus `CAW_BOX_LABELS` extras), and listing by label filter
//!   (`key=value`, all must match) is how sessions, turns and leftovers are found: there is
//!   no other database. Labels never change after creation (a turn replaces its turn-record
//!   volume instead).
//! - **"Gone" means not found.** Inspecting or removing something that does not exist is
//!   `Ok(None)` / `Ok(())`, not an error; a container being removed from outside reports
//!   [`ContainerState::Removing`] or [`ContainerState::Dead`] until it is gone.
//! - **What survives a daemon restart:** volumes (a session's state, copy-mode workspace,
//!   turn records) and their labels, so every session stays resumable. Running turns do
//!   not survive (their driver records them as failed or they are cleared by the next turn
//!   as leftovers); images survive.
//! - **Files move through the turn's container**, created or stopped: files written under
//!   HOME land in the state volume; a file that does not exist reads as `None`.
//! - **Errors say what was done to what** and carry the backend's own error as their
//!   source; an unreachable backend is an environment error (exit 3) with what to do.
//! - **A missing image is typed** (`CreateError::ImageMissing`), never recognised from text
//!   outside the backend.

pub mod docker;

pub use docker::DockerBackend;

use std::collections::HashMap;

/// One file to write: a path relative to the upload directory, its bytes and mode.
#[derive(Debug, Clone)]
pub struct TarFile<'a> {
    pub path: &'a str,
    pub contents: &'a [u8],
    pub mode: u32,
}

/// A chunk of a running container's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputChunk {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// A terminal's output (an interactive turn: stdout and stderr are one stream).
    Console(Vec<u8>),
}

impl OutputChunk {
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            OutputChunk::Stdout(b) | OutputChunk::Stderr(b) | OutputChunk::Console(b) => b,
        }
    }
}

/// A container's output as it comes.
pub type OutputStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = crate::error::Result<OutputChunk>> + Send>>;

/// An attached container: its output, and (for a terminal) its input.
pub struct Attached {
    pub output: OutputStream,
    pub input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Attached")
    }
}

/// An image on the backend's host.
#[derive(Debug, Clone, Default)]
pub struct ImageInfo {
    pub id: String,
    /// Its tags (`<none>:<none>` for an untagged one, as Docker lists it).
    pub tags: Vec<String>,
    pub labels: HashMap<String, String>,
    pub size_bytes: u64,
    /// Seconds since the Unix epoch.
    pub created: i64,
}

/// A volume: its name and labels (the labels are how caw-box finds what it made).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    pub labels: HashMap<String, String>,
}

/// Where a container is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    /// On its way out: removed from outside, or killed for good.
    Removing,
    Dead,
    #[default]
    Other,
}

/// A container as the backend reports it.
#[derive(Debug, Clone, Default)]
pub struct ContainerInfo {
    pub id: String,
    /// Its name, without Docker's leading `/`.
    pub name: String,
    pub labels: HashMap<String, String>,
    pub state: ContainerState,
    /// When it was created, where known.
    pub created: Option<std::time::SystemTime>,
    /// Whether it has run and ended (a stopped container, as opposed to one never started).
    pub finished: bool,
    /// Its mounts: (target in the container, source on the host or volume name).
    pub mounts: Vec<(String, String)>,
}

impl ContainerInfo {
    pub fn running(&self) -> bool {
        self.state == ContainerState::Running
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// How a container reaches the network.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkPolicy {
    /// The backend's default network (Docker's bridge: `--network open`).
    #[default]
    Default,
    /// No network at all.
    None,
    /// The host's network.
    Host,
    /// A network that exists already, by name (an internal one with a gateway, or a turn's
    /// egress network).
    Named(String),
}

impl NetworkPolicy {
    /// A session's `--network` setting: `open` (or empty), `none`, `host`, or a name.
    pub fn from_setting(network: &str) -> Self {
        match network {
            "open" | "" => NetworkPolicy::Default,
            "none" => NetworkPolicy::None,
            "host" => NetworkPolicy::Host,
            other => NetworkPolicy::Named(other.to_string()),
        }
    }
}

/// What a mount mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSource {
    /// A named volume of the backend (created on first use).
    Volume(String),
    /// A directory on the host that runs caw-box.
    HostDir(String),
}

/// One mount of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub source: MountSource,
    /// Where it appears in the container.
    pub target: String,
    pub read_only: bool,
}

impl MountSpec {
    pub fn volume(name: impl Into<String>, target: &str) -> Self {
        MountSpec {
            source: MountSource::Volume(name.into()),
            target: target.to_string(),
            read_only: false,
        }
    }

    pub fn host_dir(path: impl Into<String>, target: &str) -> Self {
        MountSpec {
            source: MountSource::HostDir(path.into()),
            target: target.to_string(),
            read_only: false,
        }
    }

    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }
}

/// Resource limits of a turn.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    /// Bytes.
    pub memory: Option<i64>,
    pub cpus: Option<f64>,
    pub pids: i64,
}

/// One turn of a session, in caw-box's terms: what the backend runs in the agent's
/// sandbox (non-root, no capabilities, no new privileges, read-only root with a /tmp,
/// never privileged). Its name, the session's turn container name, is the session's lock.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSpec {
    pub image: String,
    /// The command: the image's entrypoint runs it.
    pub argv: Vec<String>,
    /// `KEY=VALUE`; never secrets (those go through the runtime directory).
    pub env: Vec<String>,
    /// uid:gid the CLI runs as.
    pub user: (u32, u32),
    pub working_dir: String,
    pub labels: HashMap<String, String>,
    /// The state volume at HOME.
    pub home: MountSpec,
    /// The workspace at /workspace, unless the session has none.
    pub workspace: Option<MountSpec>,
    /// The per-turn runtime directory (env file, stdin, record hand-off).
    pub runtime: MountSpec,
    pub limits: Limits,
    pub network: NetworkPolicy,
    /// A terminal for the vendor's TUI (and its first size, columns x rows), or a headless
    /// turn read from stdout and stderr.
    pub interactive: Option<Option<(u16, u16)>>,
}

impl TurnSpec {
    pub fn mounts(&self) -> impl Iterator<Item = &MountSpec> {
        std::iter::once(&self.home)
            .chain(std::iter::once(&self.runtime))
            .chain(self.workspace.as_ref())
    }
}

/// One of caw-box's own short-lived containers (reading a volume, fixing its owner, an
/// egress proxy, a `git diff`): never the agent.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HelperSpec {
    pub image: String,
    /// Empty: the image's own entrypoint.
    pub entrypoint: Vec<String>,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    /// `uid:gid`; `None`: the image's user.
    pub user: Option<String>,
    pub labels: HashMap<String, String>,
    pub mounts: Vec<MountSpec>,
    pub network: NetworkPolicy,
    /// Hardening beyond the backend's defaults.
    pub read_only_root: bool,
    pub drop_all_capabilities: bool,
    /// Capabilities given back after dropping all (a chown as root).
    pub add_capabilities: Vec<String>,
    pub no_new_privileges: bool,
    pub pids_limit: Option<i64>,
    /// A tmpfs at /tmp with these mount options (e.g. `rw,nosuid,nodev,size=16m`).
    pub tmp: Option<String>,
}
