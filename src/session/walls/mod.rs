//! The walls around an agent: its workspace, bound or copied ([`workspace`]), and the
//! patch of what it changed ([`patch`], with [`safe_git`]: a git that runs nothing a
//! repository names; [`numstat`]: the files it changes); the paths it may not write
//! ([`protect`], [`protected_out`]) and what it wrote there anyway, moved aside
//! ([`quarantine`]); who it runs as ([`owner`]); and the hosts it may reach
//! ([`admitted`], under `--egress` and `--allow-host`) through its egress proxy ([`egress`]), whose refusals another process reads as they come
//! ([`refusals`]). Not here: the credential broker (`broker`), which keeps its
//! keys out of the box.

pub mod admitted;
pub(in crate::session) mod egress;
pub mod numstat;
pub mod owner;
pub mod patch;
pub mod protect;
pub mod protected_out;
mod proxy_log;
pub mod quarantine;
pub mod refusals;
pub mod safe_git;
pub mod workspace;
