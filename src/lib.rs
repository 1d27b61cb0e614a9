//! caw-box runs coding-agent CLIs (Claude Code, Codex, opencode, Gemini CLI) inside Docker
//! containers, unattended and resumable.
//!
//! The library is what the `caw-box` binary is a thin layer over: [`Client::start_session`]
//! creates a session, [`Session::send`] runs a turn and streams its unified
//! [`event::Event`]s, [`Session::handle`] gives the resume handle, and [`Client::open`]
//! resumes from a handle, id, prefix or name. See `examples/run_and_resume.rs`.

// No function over 100 lines (clippy.toml's threshold): a long one is split where its seams
// are. The tests and benches outside src/ are not held to it.
#![warn(clippy::too_many_lines)]

pub mod agent_config;
pub mod auth;
pub mod backend;
#[doc(hidden)]
pub mod binary;
mod cli;
pub mod client;
pub mod clock;
mod commands;
pub mod config;
pub mod connection;
pub mod dirs;
pub mod embed;
pub mod endpoint;
pub mod error;
pub mod event;
pub mod labelling;
mod lines;
mod mcp;
pub mod output;
pub mod provider;
pub mod provider_kind;
pub mod session;
pub mod settings;
pub mod terminal;

pub use client::{Client, ClientBuilder, NewSession, Session};
pub use error::{Error, ErrorKind, Result};
pub use event::{Event, Status, TurnResult, Usage};
pub use provider::ProviderKind;
pub use session::handle::ResumeHandle;
pub use session::lifecycle::fork::{ForkRequest, Forks};
pub use session::lifecycle::Stopped;
pub use session::runner::TurnOptions;

/// For the property tests of `tests/fuzz.rs`: how `auth status` words an expiry.
#[doc(hidden)]
pub use commands::auth::expiry_text;

/// caw-box's version, as `caw-box --version` says it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
