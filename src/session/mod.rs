//! Sessions: the resume handle, the labels and records that make a session live in Docker,
//! and TARGET resolution.

pub mod files;
pub mod handle;
mod interactive;
pub mod models;
pub mod names;
pub mod record;
pub mod runner;
pub mod target;
pub mod workspace;

pub use handle::{volume_name, ResumeHandle};
pub use record::{SessionRecord, SessionSettings, TurnRecord, WorkspaceMode};
