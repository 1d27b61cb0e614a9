//! Sessions, in caw-box's terms and over any backend (`impl Backend`): a session lives on a
//! backend as its labels, its state volume and its records, and runs one turn at a time.
//! The layer is split by seam:
//! - [`turn`]: driving one turn, from its plan to its recorded end;
//! - [`store`]: storing sessions: records, history, names, the handle, TARGET resolution;
//! - [`walls`]: what the agent may touch: workspace, protected paths, its user, egress;
//! - `broker`: the credential broker that keeps real keys out of the box;
//! - [`lifecycle`]: existing sessions from any process: running turns, stop, wait, remove,
//!   and turns whose driver is gone;
//! - [`login`]: `caw-box auth login`'s short-lived container of the vendor's own login, held
//!   to the vendor's auth hosts as a turn's egress is.
//!
//! The modules other layers use are re-exported here under their old flat paths
//! (`session::runner`, `session::record` …): the library's public paths.

mod broker;
pub mod lifecycle;
pub mod login;
mod store;
mod turn;
mod walls;

pub use lifecycle::orphans;
pub use store::{checkpoint, files, handle, names, portable, record, target};
pub use turn::runtime::remove_unused as remove_unused_runtime_volumes;
pub use turn::{admission, budget, limits, models, park, runner};
pub use walls::egress::remove_unused_networks as remove_unused_egress_networks;
pub use walls::{
    numstat, owner, patch, protect, protected_out, quarantine, refusals, safe_git, workspace,
};

/// The broker's program and its loader, for the backends' tests that run it as they would.
#[cfg(test)]
pub(crate) use broker::{LOADER as BROKER_LOADER, SCRIPT as BROKER_SCRIPT};
pub(crate) use turn::ended::is_marker;

pub use handle::ResumeHandle;
pub use record::{ForkedFrom, SessionRecord, SessionSettings, TurnRecord, WorkspaceMode};
pub use walls::admitted::{admitted, balanced_hosts, expand_allow_hosts, host_covered};
