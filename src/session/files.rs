//! Small tar helpers for moving caw-box's own files in and out of a container's volumes
//! through Docker's archive API (no shell in the container, works on a read-only root).

use std::io::Read;

use crate::error::{Error, Result};

/// The owner of files caw-box writes into HOME: the image's `agent` user.
pub const AGENT_UID: u64 = 1000;

/// One file to write: a path relative to the upload directory, its bytes and mode.
#[derive(Debug, Clone)]
pub struct TarFile<'a> {
    pub path: &'a str,
    pub contents: &'a [u8],
    pub mode: u32,
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

/// Merges `overlay` into `base` (JSON objects, recursively); `overlay` wins on conflicts.
pub fn merge_json(base: &mut serde_json::Value, overlay: &serde_json::Value) {
    match (base, overlay) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                merge_json(b.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
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

    #[test]
    fn merge_keeps_existing_keys() {
        let mut base = serde_json::json!({"a": 1, "security": {"x": true}});
        merge_json(
            &mut base,
            &serde_json::json!({"security": {"auth": {"selectedType": "k"}}}),
        );
        assert_eq!(
            base,
            serde_json::json!({"a": 1, "security": {"x": true, "auth": {"selectedType": "k"}}})
        );
    }
}
