//! Storing sessions: a session's record and its turns' history in its state volume
//! ([`record`], [`history`]), the names and labels of its objects ([`names`]), its resume
//! handle ([`handle`]), finding it by TARGET ([`target`]), moving it between hosts
//! ([`portable`]), caw-box's own files in HOME ([`files`]) and this host's note of the turns
//! it drives ([`inflight`]), and each turn's checkpoint ([`checkpoint`]). Not here: running a turn (`turn`), or what a turn may touch
//! (`walls`).

pub mod behind;
pub mod checkpoint;
pub mod files;
pub mod handle;
pub(in crate::session) mod history;
pub(in crate::session) mod inflight;
pub mod names;
pub mod portable;
pub mod record;
pub mod restore;
pub mod target;
