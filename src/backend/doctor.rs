//! `caw-box doctor`'s checks of the chosen backend, in caw-box's terms: each a line of the
//! report, said as soon as it is known. Docker's (`docker/doctor.rs`): the daemon, its
//! runtimes, whether it sees this host's files, the provider images and leftover images;
//! Kubernetes' (`kubernetes/doctor.rs`): the API server, RBAC, storage, RuntimeClasses and
//! the images on the nodes.
//!
//! The chosen backend's are run by `backend::checkup`. Not here: the credentials' checks,
//! which are the same on every backend (the command's).

/// One line of the report.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    Ok(String),
    /// Works, but worth knowing.
    Note(String),
    /// More about the line before it.
    Detail(String),
    Problem(String),
}

impl Check {
    /// The line as the report prints it.
    pub fn line(&self) -> String {
        match self {
            Check::Ok(l) => format!("✓ {l}"),
            Check::Note(l) => format!("- {l}"),
            Check::Detail(l) => format!("  {l}"),
            Check::Problem(l) => format!("✗ {l}"),
        }
    }
}
