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
            && backend.runtime_dir() == crate::backend::RuntimeDir::KeptWithContainer;
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
