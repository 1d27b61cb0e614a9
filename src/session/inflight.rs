//! This host's note of the turns its caw-box processes drive: one small file per session
//! (`<data dir>/inflight/<id>.json`: the turn, its driver, its start and prompt), written
//! before the turn's container is made and removed once the turn is recorded or never
//! started. A driver killed too hard to remove it, or one that failed after its turn began,
//! leaves it: when the turn's container is gone too (removed from outside, or by the engine:
//! a daemon restart removes a warm container), it is what says that the turn ran, so
//! whoever comes next records it as interrupted (`orphans::settle`) instead of nothing.
//!
//! Not here: a turn whose container is still there (`orphans.rs` reads its output).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::dirs;

/// What is noted of a running turn.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct Noted {
    pub turn: u32,
    pub pid: u32,
    pub started_at: u64,
    pub prompt: String,
}

fn dir() -> Option<PathBuf> {
    dirs::data_dir().ok().map(|d| d.join("inflight"))
}

fn path_in(dir: &std::path::Path, id: Uuid) -> PathBuf {
    dir.join(format!("{id}.json"))
}

/// The note of one turn, removed when dropped unless [`InFlight::keep`] left it.
#[derive(Debug)]
pub(super) struct InFlight(Option<PathBuf>);

impl InFlight {
    /// Notes turn `turn` of session `id`, driven by this process (best effort: without a
    /// data directory there is no note, and a lost turn is not recorded).
    pub fn note(id: Uuid, turn: u32, prompt: &str) -> Self {
        let Some(dir) = dir() else {
            return InFlight(None);
        };
        let noted = Noted {
            turn,
            pid: std::process::id(),
            started_at: crate::session::record::now_secs(),
            prompt: prompt.to_string(),
        };
        let path = path_in(&dir, id);
        let json = serde_json::to_vec(&noted).expect("notes serialize");
        let written = std::fs::create_dir_all(&dir)
            .map_err(|e| e.to_string())
            .and_then(|()| dirs::write_private_unsynced(&path, &json).map_err(|e| e.to_string()));
        match written {
            Ok(()) => InFlight(Some(path)),
            Err(e) => {
                tracing::debug!("could not note the turn in flight: {e}");
                InFlight(None)
            }
        }
    }

    /// Leaves the note for whoever comes next: the turn began and is not recorded.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Only this process's own note: a racing turn of the session (busy) may have
        // written its own since.
        if let Some(path) = self.0.take() {
            let ours = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Noted>(&b).ok())
                .is_some_and(|n| n.pid == std::process::id());
            if ours {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// The note of session `id`'s turn, if this host has one.
pub(super) fn read(id: Uuid) -> Option<Noted> {
    let bytes = std::fs::read(path_in(&dir()?, id)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Removes session `id`'s note (its turn is recorded, or the session is gone).
pub(super) fn forget(id: Uuid) {
    if let Some(dir) = dir() {
        let _ = std::fs::remove_file(path_in(&dir, id));
    }
}

/// The sessions this host has a note of.
pub(super) fn noted() -> Vec<Uuid> {
    let Some(entries) = dir().and_then(|d| std::fs::read_dir(d).ok()) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let name = e.ok()?.file_name();
            Uuid::parse_str(name.to_str()?.strip_suffix(".json")?).ok()
        })
        .collect()
}
