//! Backends run what the commands describe. Docker (through bollard) is the only one today;
//! the commands reach it only through [`docker::DockerBackend`], so a second backend
//! (Kubernetes) can slot in beside it.

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
