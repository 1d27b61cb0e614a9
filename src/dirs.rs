//! Where caw-box keeps files on the host: a cache of session records and per-turn runtime
//! directories. Nothing here is the truth about a session (Docker is), so deleting it all
//! loses nothing that `resume` needs.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;

use crate::error::{Error, Result};

/// The data directory: `$CAW_BOX_DATA_DIR`, else the XDG data dir (`~/.local/share/caw-box`).
pub fn data_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CAW_BOX_DATA_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    directories::ProjectDirs::from("", "", "caw-box")
        .map(|p| p.data_dir().to_path_buf())
        .ok_or_else(|| {
            Error::environment("cannot find a home directory for caw-box's data")
                .with_hint("set CAW_BOX_DATA_DIR")
        })
}

/// Creates `dir` (and parents) private to the user: mode 0700.
pub fn ensure_private_dir(dir: &std::path::Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::environment(format!("failed to create '{}': {e}", dir.display())))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::environment(format!("failed to restrict '{}': {e}", dir.display())))
}

/// The cache of session records.
pub fn sessions_dir() -> Result<PathBuf> {
    Ok(data_dir()?.join("sessions"))
}

/// Writes `contents` to `path` atomically (temp file + rename), mode 0600, flushed to disk
/// first: for what must survive a crash (the credential store).
pub fn write_private(path: &std::path::Path, contents: &[u8]) -> Result<()> {
    write_atomic(path, contents, true)
}

/// [`write_private`] without the flush to disk (about 1 ms a file, on a turn's critical
/// path): for what a crash may lose, a turn's runtime files (deleted after it) and caches
/// (rebuilt from Docker).
pub fn write_private_unsynced(path: &std::path::Path, contents: &[u8]) -> Result<()> {
    write_atomic(path, contents, false)
}

fn write_atomic(path: &std::path::Path, contents: &[u8], sync: bool) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or_else(|| std::path::Path::new("."));
    ensure_private_dir(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| Error::environment(format!("failed to write in '{}': {e}", dir.display())))?;
    tmp.write_all(contents)
        .and_then(|_| {
            if sync {
                tmp.as_file().sync_all()
            } else {
                Ok(())
            }
        })
        .map_err(|e| Error::environment(format!("failed to write '{}': {e}", path.display())))?;
    tmp.persist(path)
        .map_err(|e| Error::environment(format!("failed to write '{}': {e}", path.display())))?;
    Ok(())
}

/// Whether caw-box runs as root.
/// Holds an exclusive lock on a file of the data directory while alive (dropped: released).
#[derive(Debug)]
pub struct DataLock(#[allow(dead_code)] std::fs::File);

/// Waits for the exclusive lock of the data directory's file `name` (made when missing),
/// without holding up the runtime's threads; `what` names it in the error.
pub async fn lock_data_file(name: &str, what: &str) -> Result<DataLock> {
    let path = data_dir()?.join(name);
    let what = what.to_string();
    tokio::task::spawn_blocking(move || {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .and_then(|f| f.lock().map(|()| DataLock(f)))
            .map_err(|e| Error::environment(format!("failed to lock '{}': {e}", path.display())))
    })
    .await
    .map_err(|e| Error::environment(format!("locking {what} failed: {e}")))?
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The uid:gid of caw-box's containers that touch none of a session's files (the
/// credential broker, the egress proxy, the model-list fetch): the invoking user's; for
/// root, the image's non-root `agent` (1000). A session's turns and the helpers that reach
/// into its volumes or workspace run as `session::owner::turn_ids` says.
pub fn agent_ids() -> (u32, u32) {
    if is_root() {
        (1000, 1000)
    } else {
        host_ids()
    }
}

/// The invoking user's own uid:gid (root included).
pub fn host_ids() -> (u32, u32) {
    (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    )
}

/// This machine's host name (as in a turn container's driver label).
pub fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// Whether a process `pid` exists on this machine (of any user).
pub fn process_is_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    // EPERM: it exists, as another user's.
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}
