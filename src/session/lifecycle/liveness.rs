//! Driver liveness: whether the caw-box process that drives a turn container is gone, so
//! that a container it left behind may be taken for a leftover (and never a live turn's).

use std::time::Duration;

use crate::backend::{Backend, ContainerInfo};
use crate::dirs;
use crate::session::store::record::labels;

/// Whether the process that drives a (not running) turn container is certainly gone: a
/// container between create and start, or between exit and being recorded, belongs to a
/// live turn and must not be taken for a leftover.
pub(in crate::session) fn driver_is_gone(container: &ContainerInfo) -> bool {
    let pid = container.label(labels::DRIVER_PID);
    driver_of_is_gone(container, pid)
}

/// Whether the driver `pid` of a turn in `container` (of the container's driver host) is
/// certainly gone: a warm container's turns each have their own driver.
pub(in crate::session) fn driver_of_is_gone(container: &ContainerInfo, pid: Option<&str>) -> bool {
    let host = container.label(labels::DRIVER_HOST);
    if let (Some(pid), Some(host)) = (pid, host) {
        if host == dirs::host_name() {
            return !pid.parse().is_ok_and(is_a_caw_box);
        }
    }
    // Another host's driver (a shared daemon): only a long-idle container is a leftover.
    container
        .created
        .is_some_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(600))
}

/// Removes this host's turn containers whose CLI ended and whose driver is gone (killed
/// too hard to clean up after itself): their runtime storage may hold credentials. Their
/// sessions stay resumable; the turn was never recorded. Best effort. `own` (the turn
/// container being created) is left to its creator, which handles its own leftover.
pub(in crate::session) async fn remove_abandoned_turns(backend: &impl Backend, own: &str) {
    let filter = [
        format!("{}=true", labels::MANAGED),
        format!(
            "{}={}",
            labels::ROLE,
            crate::session::store::record::roles::TURN
        ),
        format!("{}={}", labels::DRIVER_HOST, dirs::host_name()),
    ];
    let Ok(turns) = backend.list_containers(&filter).await else {
        return;
    };
    for c in turns {
        // An adoptable one is left to be recorded by the next caw-box that meets its
        // session (`orphans::settle`).
        let recordable = c.label(labels::ADOPTABLE) == Some("true")
            && backend.capabilities().runtime_dir == crate::backend::RuntimeDir::KeptWithContainer;
        if c.name != own
            && c.state == crate::backend::ContainerState::Exited
            && driver_is_gone(&c)
            && !recordable
        {
            tracing::debug!("removing {}, abandoned by its driver", c.name);
            let _ = backend.remove_found(&c).await;
        }
    }
}

/// Whether process `pid` lives and runs the same program as this one (where /proc tells):
/// a dead driver's pid reused by another program must not keep its session busy for good.
pub(in crate::session) fn is_a_caw_box(pid: u32) -> bool {
    let comm = |p: &str| std::fs::read_to_string(format!("/proc/{p}/comm"));
    dirs::process_is_alive(pid)
        && !is_a_zombie(pid)
        && match (comm(&pid.to_string()), comm("self")) {
            // This program, or the driver it starts (a library embedded in another
            // program, Python's, hands its detached turns to the `caw-box` binary).
            (Ok(theirs), Ok(ours)) => {
                theirs == ours || Some(theirs.trim()) == driver_comm().as_deref()
            }
            _ => true,
        }
}

/// Where the detached turns' drivers (`caw-box __drive`) of `session` write their stderr
/// on this host, one `<pid>.log` each: a driver's last words (an error line, a panic) when
/// it ends without recording its turn. A driver that recorded its turn deletes its own;
/// removing the session deletes them all. Private (0700, in the data directory).
pub fn driver_logs(session: uuid::Uuid) -> crate::error::Result<std::path::PathBuf> {
    let dir = drivers_dir(session)?;
    dirs::ensure_private_dir(&dir)?;
    Ok(dir)
}

/// Driver `pid`'s log in `dir` ([`driver_logs`]).
pub fn driver_log(dir: &std::path::Path, pid: impl std::fmt::Display) -> std::path::PathBuf {
    dir.join(format!("{pid}.log"))
}

fn drivers_dir(session: uuid::Uuid) -> crate::error::Result<std::path::PathBuf> {
    Ok(dirs::data_dir()?.join("drivers").join(session.to_string()))
}

/// The last line driver `pid` of a detached turn of `session` wrote on this host, if any:
/// why it ended without recording its turn.
pub(in crate::session) fn driver_last_words(session: uuid::Uuid, pid: &str) -> Option<String> {
    let log = driver_log(&drivers_dir(session).ok()?, pid);
    last_words(&std::fs::read_to_string(log).ok()?)
}

/// What a driver said last: its error line (without the prefix), a panic's message, or
/// else its last line.
fn last_words(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if let Some(error) = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("caw-box: error: "))
    {
        return Some(error.to_string());
    }
    if let Some(at) = lines.iter().rposition(|l| l.contains("panicked at")) {
        let message = lines.get(at + 1).copied().unwrap_or_default();
        return Some(format!("{} {message}", lines[at]).trim_end().to_string());
    }
    lines.last().map(|l| l.to_string())
}

/// Deletes what the drivers of `session` wrote on this host (the session is removed).
pub(in crate::session) fn forget_driver_logs(session: uuid::Uuid) {
    if let Ok(dir) = drivers_dir(session) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Whether process `pid` lives (and is no zombie), whatever program it runs: a login's
/// driver may be a program that embeds caw-box (Python), not caw-box itself.
pub(in crate::session) fn process_lives(pid: u32) -> bool {
    dirs::process_is_alive(pid) && !is_a_zombie(pid)
}

/// The kernel's name (`comm`: the first 15 bytes of the file name) of the program this
/// process starts as a detached turn's driver.
fn driver_comm() -> Option<String> {
    let exe = crate::connection::driver().ok()?;
    let name = exe.file_name()?.to_string_lossy().into_owned();
    Some(name.chars().take(15).collect())
}

/// Whether `pid` has ended and waits to be reaped (a killed driver whose parent is gone,
/// where nobody reaps orphans, e.g. a container's init that does not): dead for caw-box.
fn is_a_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // "pid (comm) S ...": the state follows the last ')' (comm may hold any byte).
            let (_, rest) = s.rsplit_once(')')?;
            rest.split_whitespace().next().map(|state| state == "Z")
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drivers_last_words_are_its_last_line() {
        assert_eq!(last_words(""), None);
        assert_eq!(last_words("\n  \n"), None);
        let log = "WARN caw_box: slow\ncaw-box: error: the daemon went away\n\n";
        assert_eq!(last_words(log).as_deref(), Some("the daemon went away"));
        let panic = "thread 'main' panicked at src/x.rs:1:1:\nboom\nnote: RUST_BACKTRACE=1\n";
        assert_eq!(
            last_words(panic).as_deref(),
            Some("thread 'main' panicked at src/x.rs:1:1: boom")
        );
        assert_eq!(
            last_words("killed by\nsomething\n").as_deref(),
            Some("something")
        );
    }

    #[test]
    fn a_driver_is_a_live_process_of_the_same_program() {
        assert!(is_a_caw_box(std::process::id()));
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = other.id();
        // Alive, but another program (a dead driver's pid, reused).
        assert!(!is_a_caw_box(pid));
        other.kill().unwrap();
        // Killed, not yet reaped: a zombie, as gone as a reaped one.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(is_a_zombie(pid));
        other.wait().unwrap();
        assert!(!is_a_caw_box(pid));
        assert!(!is_a_zombie(std::process::id()));
    }
}
