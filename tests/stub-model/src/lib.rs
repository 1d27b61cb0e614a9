//! A stub model server for caw-box's tests. It speaks just enough of the vendors' wire
//! protocols (Anthropic Messages, OpenAI Responses, OpenAI chat completions, Gemini, and
//! Google's Code Assist API) for the
//! real vendor CLIs to run against it, answers from the conversation it receives, and records
//! every request. See README.md for the directives and endpoints.

pub mod account;
pub mod anthropic;
pub mod burst;
pub mod chat;
pub mod code_assist;
pub mod conversation;
pub mod device;
pub mod gemini;
pub mod hold;
pub mod inflight;
pub mod oauth;
pub mod paste_auth;
pub mod protocol;
pub mod record;
pub mod responses;
pub mod server;
pub mod sse;

pub use server::{serve, serve_tls, Config};
