//! A container's private scratch directory, as the session layer hands it to a backend
//! ([`super::TurnSpec::runtime`], [`super::HelperSpec::scratch`]): the files, never where
//! they go (a Docker volume of the container's own, a pod's memory).

use std::collections::HashMap;

use super::TarFile;

/// A container's private scratch directory at `mount`: storage of its own, removed with
/// the container, holding `files` (owned by `owner`) before the container starts. Nothing of it is a host path, so it works with a daemon that does not share
/// caw-box's filesystem. The files may be secrets: `Debug` shows their paths only.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Scratch {
    pub mount: String,
    /// Owner (uid, gid) of the files and of their parent directories.
    pub owner: (u32, u32),
    /// Paths relative to `mount`; parent directories are made (mode 0700).
    pub files: Vec<ScratchFile>,
    /// The labels of its storage where that is an object of the backend's that could outlive
    /// the container (Docker: an anonymous volume, left behind by a `docker rm` without
    /// `-v`), so that caw-box finds it then; empty: none.
    pub labels: HashMap<String, String>,
}

#[derive(Clone, PartialEq, Eq)]
pub struct ScratchFile {
    pub path: String,
    pub contents: Vec<u8>,
    pub mode: u32,
}

impl std::fmt::Debug for ScratchFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} bytes)", self.path, self.contents.len())
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths: Vec<&str> = self.files.iter().map(|x| x.path.as_str()).collect();
        f.debug_struct("Scratch")
            .field("mount", &self.mount)
            .field("owner", &self.owner)
            .field("files", &paths)
            .field("labels", &self.labels)
            .finish()
    }
}

impl Scratch {
    pub fn tar_files(&self) -> Vec<TarFile<'_>> {
        self.files
            .iter()
            .map(|f| TarFile {
                path: &f.path,
                contents: &f.contents,
                mode: f.mode,
            })
            .collect()
    }
}
