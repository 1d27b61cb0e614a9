//! A brokered login's refresh lock ([`super::Backend::hold_refresh`]): of every process
//! that brokers one login through a backend, one at a time refreshes it, so no broker spends
//! a refresh token another already used. Held as a [`Hold`]; how it is held is the
//! backend's: a file lock under the data directory (this host's processes: Docker), a Lease
//! in the namespace (every host's: Kubernetes).

use std::time::Duration;

/// A held lock (a login's refresh lock; on Kubernetes also a slot of an account's turns in
/// flight): [`Hold::release`] it when done (dropping it releases it too, in the
/// background).
#[derive(Debug, Default)]
pub struct Hold {
    /// A host's file lock, held while open.
    file: Option<std::fs::File>,
    /// Ends the background task that keeps the lock (and releases it then).
    end: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Hold {
    /// Holds nothing: where a backend has no lock of its own to take.
    pub fn nothing() -> Self {
        Hold::default()
    }

    /// A lock kept by a task: it renews it until `end` is sent (or dropped), then releases.
    pub fn kept(end: tokio::sync::oneshot::Sender<()>, task: tokio::task::JoinHandle<()>) -> Self {
        Hold {
            file: None,
            end: Some(end),
            task: Some(task),
        }
    }

    /// Releases the lock, and waits (a few seconds at most) until the release is done.
    pub async fn release(mut self) {
        drop(self.file.take());
        if let Some(end) = self.end.take() {
            let _ = end.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

/// Holds the file lock `refresh-<login>.lock` in the data directory, waiting up to `limit`:
/// one refresh at a time of `login` among this host's processes (of one data directory).
/// `None`: not had within `limit`, or no data directory.
pub async fn hold_on_host(login: &str, limit: Duration) -> Option<Hold> {
    let path = crate::dirs::data_dir()
        .ok()?
        .join(format!("refresh-{login}.lock"));
    hold_file(path, limit).await
}

/// Holds the file lock of `path` (made if missing), waiting up to `limit`.
async fn hold_file(path: std::path::PathBuf, limit: Duration) -> Option<Hold> {
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .ok()?;
        let deadline = std::time::Instant::now() + limit;
        loop {
            match file.try_lock() {
                Ok(()) => {
                    return Some(Hold {
                        file: Some(file),
                        end: None,
                        task: None,
                    })
                }
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(_) => return None,
            }
        }
    })
    .await
    .ok()?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's lock: a second holder waits for the first one's release.
    #[tokio::test]
    async fn the_host_lock_is_had_once_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (codex, claude) = (dir.path().join("codex"), dir.path().join("claude"));
        let short = Duration::from_millis(50);
        let first = hold_file(codex.clone(), short).await;
        assert!(first.is_some());
        let waited = std::time::Instant::now();
        assert!(hold_file(codex.clone(), Duration::from_millis(300))
            .await
            .is_none());
        assert!(waited.elapsed() >= Duration::from_millis(300));
        assert!(hold_file(claude, short).await.is_some());
        first.unwrap().release().await;
        assert!(hold_file(codex, short).await.is_some());
    }
}
