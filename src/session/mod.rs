//! Sessions: the resume handle, the labels and records that make a session live on a backend,
//! and TARGET resolution.

mod broker;
mod egress;
mod ended;
pub mod files;
pub mod handle;
mod headless;
mod history;
mod inflight;
mod interactive;
pub mod lifecycle;
pub mod limits;
mod liveness;
pub mod models;
pub mod names;
pub mod orphans;
pub mod owner;
pub mod patch;
mod plan;
pub mod portable;
pub mod protect;
pub mod protected_out;
pub mod quarantine;
pub mod record;
pub mod runner;
#[cfg(test)]
pub(crate) use broker::sidecar_entrypoint;
pub(crate) use broker::{POD_END_DIR, POD_END_FILE, SIDECAR};
pub(crate) use ended::is_marker;
mod runtime;
pub mod safe_git;
pub mod target;
mod turn;
mod warm;
pub mod workspace;

pub use handle::ResumeHandle;
pub use record::{SessionRecord, SessionSettings, TurnRecord, WorkspaceMode};
