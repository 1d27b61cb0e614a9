//! What a backend reports exists: images, volumes and containers, in caw-box's terms
//! (labels are how caw-box finds what it made). Not how they are made: [`super::TurnSpec`],
//! [`super::HelperSpec`].

use std::collections::HashMap;

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
