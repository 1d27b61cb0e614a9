//! caw-box's own files in HOME: who owns them, and merging a JSON config file with what
//! the CLI keeps there.

/// The owner of files caw-box writes into HOME: the image's `agent` user.
pub const AGENT_UID: u64 = 1000;

pub use crate::provider::merge_json;
