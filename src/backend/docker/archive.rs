//! Files in and out of a container's volumes through Docker's archive API (no shell in the
//! container, works on a read-only root), and the small tar helpers that go with it.

use std::io::Read;

use futures_util::StreamExt;

use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};

use super::{is_not_found, DockerBackend};
use crate::backend::TarFile;
use crate::error::{Error, Result};

impl DockerBackend {
    /// Writes `files` under `dir` of a (created or stopped) container, owned by `owner`
    /// (uid, gid), parent directories included.
    pub async fn upload_files(
        &self,
        name: &str,
        dir: &str,
        files: &[TarFile<'_>],
        (uid, gid): (u32, u32),
    ) -> Result<()> {
        let tar = build_tar(files, uid.into(), gid.into())?;
        self.upload_tar(name, dir, tar).await
    }

    /// Extracts a tar archive into `dir` of a (created or stopped) container; writes land in
    /// the container's volumes when `dir` is inside one.
    pub async fn upload_tar(&self, name: &str, dir: &str, tar: Vec<u8>) -> Result<()> {
        self.docker
            .upload_to_container(
                name,
                Some(UploadToContainerOptions {
                    path: dir.to_string(),
                    ..Default::default()
                }),
                bollard::body_full(tar.into()),
            )
            .await
            .map_err(|e| self.failed(format_args!("copy files into container '{name}'"), &e))
    }

    /// The contents of the file at `path` in a (created or stopped) container; `None` when
    /// there is no such file.
    pub async fn download_file(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        match self.download_tar(name, path).await? {
            Some(tar) => first_file(&tar),
            None => Ok(None),
        }
    }

    /// A tar archive of `path` in a container; `None` when the path does not exist.
    pub async fn download_tar(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let mut stream = self.docker.download_from_container(
            name,
            Some(DownloadFromContainerOptions {
                path: path.to_string(),
            }),
        );
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => out.extend_from_slice(&bytes),
                Err(e) if is_not_found(&e) => return Ok(None),
                Err(e) => {
                    return Err(
                        self.failed(format_args!("copy '{path}' out of container '{name}'"), &e)
                    )
                }
            }
        }
        Ok(Some(out))
    }
}

/// Builds a tar archive of `files` (parent directories included), owned by `uid:gid`.
pub fn build_tar(files: &[TarFile<'_>], uid: u64, gid: u64) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs_done = std::collections::BTreeSet::new();
    for f in files {
        // Parent directories first, so they get our owner rather than root.
        let mut parent = std::path::Path::new(f.path).parent();
        let mut parents = Vec::new();
        while let Some(p) = parent {
            if p.as_os_str().is_empty() {
                break;
            }
            parents.push(p.to_path_buf());
            parent = p.parent();
        }
        for dir in parents.into_iter().rev() {
            if dirs_done.insert(dir.clone()) {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o700);
                h.set_uid(uid);
                h.set_gid(gid);
                h.set_size(0);
                h.set_mtime(crate::clock::now_secs());
                builder
                    .append_data(&mut h, &dir, std::io::empty())
                    .map_err(|e| Error::environment(format!("failed to build an archive: {e}")))?;
            }
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(f.mode);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_size(f.contents.len() as u64);
        h.set_mtime(crate::clock::now_secs());
        builder
            .append_data(&mut h, f.path, f.contents)
            .map_err(|e| Error::environment(format!("failed to build an archive: {e}")))?;
    }
    builder
        .into_inner()
        .map_err(|e| Error::environment(format!("failed to build an archive: {e}")))
}

/// The contents of the first regular file in a tar archive (as Docker returns a single
/// file it was asked for).
pub fn first_file(tar_bytes: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut archive = tar::Archive::new(tar_bytes);
    let entries = archive
        .entries()
        .map_err(|e| Error::environment(format!("failed to read an archive from Docker: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            Error::environment(format!("failed to read an archive from Docker: {e}"))
        })?;
        if entry.header().entry_type().is_file() {
            let mut buf = Vec::new();
            entry.read_to_end(&mut buf).map_err(|e| {
                Error::environment(format!("failed to read an archive from Docker: {e}"))
            })?;
            return Ok(Some(buf));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_round_trip_keeps_contents_owner_and_parents() {
        let tar = build_tar(
            &[TarFile {
                path: ".caw-box/turns/1.json",
                contents: b"{}",
                mode: 0o600,
            }],
            1000,
            1000,
        )
        .unwrap();
        let mut archive = tar::Archive::new(&tar[..]);
        let names: Vec<(String, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().uid().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                (".caw-box".to_string(), 1000),
                (".caw-box/turns".to_string(), 1000),
                (".caw-box/turns/1.json".to_string(), 1000)
            ]
        );
        assert_eq!(first_file(&tar).unwrap().unwrap(), b"{}");
    }
}
