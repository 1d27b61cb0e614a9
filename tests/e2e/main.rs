//! End-to-end tests: the real caw-box binary, a real Docker daemon, the images built from
//! images/, the real vendor CLIs, and the stub model (tests/stub-model) on an internal
//! network per test. `make test` builds the images and the stub image first.

mod common;

mod accounts;
mod agent_config;
mod auth;
mod backoff;
mod bad_input;
mod behind;
mod broker;
mod ci_action;
mod compat;
mod config;
mod contexts;
mod control;
mod cost;
mod doors;
mod egress;
mod fork;
mod hardening;
mod images;
mod in_container;
mod interactive;
mod kubernetes;
mod limits;
mod login;
mod login_claude;
mod login_gemini;
mod manage;
mod mcp;
mod mcp_http;
mod oauth;
mod orphans;
mod park;
mod patch;
mod pool;
mod portable;
mod prompts;
mod protect;
mod release;
mod restart;
mod runtime;
mod sandbox;
mod sessions;
mod soak;
mod ssh_host;
mod stub_control;
mod user_config;
mod warm;
