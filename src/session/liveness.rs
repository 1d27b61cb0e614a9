//! Driver liveness: whether the caw-box process that drives a turn container is gone, so
//! that a container it left behind may be taken for a leftover (and never a live turn's).

use std::time::Duration;

use crate::backend::ContainerInfo;
use crate::dirs;
use crate::session::record::labels;

/// Whether the process that drives a (not running) turn container is certainly gone: a
/// container between create and start, or between exit and being recorded, belongs to a
/// live turn and must not be taken for a leftover.
pub(super) fn driver_is_gone(container: &ContainerInfo) -> bool {
    let pid = container.label(labels::DRIVER_PID);
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

/// Whether process `pid` lives and runs the same program as this one (where /proc tells):
/// a dead driver's pid reused by another program must not keep its session busy for good.
fn is_a_caw_box(pid: u32) -> bool {
    let comm = |p: &str| std::fs::read_to_string(format!("/proc/{p}/comm"));
    dirs::process_is_alive(pid)
        && match (comm(&pid.to_string()), comm("self")) {
            (Ok(theirs), Ok(ours)) => theirs == ours,
            _ => true,
        }
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
        other.wait().unwrap();
        assert!(!is_a_caw_box(pid));
    }
}
