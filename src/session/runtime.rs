//! The per-turn runtime directory: a private host directory mounted at [`RUNTIME_MOUNT`]
//! in the turn's container, through which caw-box and the entrypoint (`caw-box-entry`)
//! talk: the env file, stdin, the record hand-off's FIFO, and the stop files. Removed when
//! the turn ends. Not what goes through it (see `history.rs` for the record hand-off).

use std::path::PathBuf;

use crate::dirs;
use crate::error::{Error, Result};
use crate::session::record::SessionRecord;

/// Where the per-turn runtime directory appears in the container (env file, stdin).
pub const RUNTIME_MOUNT: &str = "/run/caw-box";

/// The FIFO on which the entrypoint waits for the record.
pub(super) const HANDOFF_FIFO: &str = "handoff";

/// A file that tells the entrypoint to kill the CLI at the stop signal, without grace.
pub(super) const STOP_NOW: &str = "stop-now";

/// A file `caw-box stop` puts in the turn's runtime directory before stopping its
/// container, so the process driving the turn records it as interrupted, not as a crash.
pub const STOP_REQUEST: &str = "stop-requested";

/// A per-turn directory on the host, removed when dropped.
pub(super) struct RuntimeDir(pub(super) PathBuf);

impl RuntimeDir {
    pub(super) fn create(record: &SessionRecord, turn: u32) -> Result<Self> {
        let base = dirs::runtime_dir()?;
        dirs::ensure_private_dir(&base)?;
        dirs::sweep_runtime_dirs();
        let dir = base.join(format!(
            "{}-{turn}-{}",
            record.session_id,
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dirs::ensure_private_dir(&dir)?;
        // The CLI runs as the agent user, which must read what we put here.
        dirs::hand_to_agent(&dir)?;
        Ok(RuntimeDir(dir))
    }

    pub(super) fn make_fifo(&self, name: &str) -> Result<()> {
        let path = self.0.join(name);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .map_err(|e| Error::environment(format!("cannot create {}: {e}", path.display())))?;
        dirs::hand_to_agent(&path)
    }

    pub(super) fn write(&self, name: &str, contents: &[u8]) -> Result<()> {
        let path = self.0.join(name);
        dirs::write_private_unsynced(&path, contents)?;
        dirs::hand_to_agent(&path)
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
