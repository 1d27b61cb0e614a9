//! The check of a value from a file or a variable: the same as its flag's, so that a value
//! means the same wherever it was written.

use super::{Key, Value};
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::settings;

/// Checks a value from a file or a variable (`what` names it in the error) the way its flag
/// is checked, so a bad one is refused where it was written, not later.
pub(super) fn check(key: Key, value: Value, what: &str) -> Result<Value> {
    let text = value.as_str().unwrap_or_default();
    match (key, &value) {
        (Key::Provider, _) => {
            text.parse::<ProviderKind>()?;
        }
        (Key::Endpoint, _) => {
            settings::validate_endpoint(text, what)?;
        }
        (Key::Network, _) if text == "none" || text.trim().is_empty() => {
            return Err(Error::usage(format!(
                "{what} '{text}': the CLI needs a network to reach its model (open, host or a network name)"
            )))
        }
        (Key::AllowHost, Value::List(hosts)) => {
            for h in hosts {
                settings::validate_allow_host(h, what)?;
            }
        }
        (Key::Egress, _) => crate::session::record::EgressPolicy::parse(text, what).map(drop)?,
        (Key::Runtime, _) => {
            settings::parse_runtime(text, what)?;
        }
        (Key::Memory, _) => {
            settings::parse_memory(text, what)?;
        }
        (Key::Cpus, Value::Float(c)) => settings::check_cpus(*c, what)?,
        (Key::MaxCost, Value::Float(c)) => settings::check_max_cost(*c, what)?,
        (Key::PidsLimit, Value::Int(p)) => settings::check_pids_limit(*p, what)?,
                (Key::PerAccount, Value::Int(n)) => settings::check_per_account(*n, what).map(drop)?,
        (Key::Timeout, _) => {
            settings::parse_duration(text, what)?;
        }
        (Key::IdleTimeout | Key::KeepWarm | Key::ConnectTimeout, _) => {
            settings::parse_limit(text, what)?;
        }
        (Key::WorkspaceMode, _) if !matches!(text, "auto" | "bind" | "copy" | "none") => {
            return Err(Error::usage(format!(
                "{what} '{text}' is not a workspace mode: auto, bind, copy or none"
            )))
        }
        (Key::Group, _) => settings::validate_name(text, what)?,
        (Key::Effort, _) => {
            crate::agent_config::Effort::parse(text, what)?;
        }
        (Key::Tools, _) => {
            crate::agent_config::ToolPolicy::parse_groups(text, what)?;
        }
        (Key::Protect | Key::Unprotect, Value::List(paths)) => {
            for p in paths {
                crate::session::protect::parse_arg(p, what, None)?;
            }
        }
        (Key::AllowTool | Key::DenyTool, Value::List(names)) => {
            for n in names {
                crate::agent_config::ToolPolicy::check_name(n, what)?;
            }
        }
        (Key::SystemPrompt | Key::AppendSystemPrompt, _) if text.trim().is_empty() => {
            return Err(Error::usage(format!(
                "{what} is empty: give the text, or @FILE to read it from a file"
            )))
        }
        (Key::ImageRepo, _) => settings::validate_image_repo(text, what)?,
        (Key::Backend, _) => {
            crate::backend::BackendKind::parse(text)
                .map_err(|e| Error::usage(format!("{what}: {}", e.message)))?;
        }
        (Key::EnvPass, Value::List(names)) => {
            for n in names {
                settings::validate_env_name(n, what)?;
            }
        }
        (Key::Mcp, Value::Mcp(servers)) => {
            for (name, entry) in servers {
                check_mcp_server(name, entry, what)?;
            }
        }
        (Key::Prices, Value::Prices(book)) => {
            for (model, p) in book {
                let fields = [
                    ("input", Some(p.input)),
                    ("output", Some(p.output)),
                    ("cache_read", p.cache_read),
                    ("cache_write", p.cache_write),
                ];
                for (field, v) in fields {
                    if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                        return Err(Error::usage(format!(
                            "{what}.\"{model}\".{field} is not a price: USD per million tokens, 0 or more"
                        )));
                    }
                }
                if model.trim().is_empty() {
                    return Err(Error::usage(format!("{what}: a model id is empty")));
                }
            }
        }
        _ => {}
    }
    Ok(value)
}

/// An `[mcp.NAME]` table: a command or a URL, and secrets of the kind its transport takes.
fn check_mcp_server(name: &str, e: &super::McpEntry, what: &str) -> Result<()> {
    let here = format!("{what}.{name}");
    let (http, spec) = match (&e.command, &e.url) {
        (Some(c), None) => (false, c),
        (None, Some(u)) => (true, u),
        _ => return Err(Error::usage(format!("{here}: give either command or url"))),
    };
    let server = crate::agent_config::McpServer::parse(&format!("{name}={spec}"), &here)?;
    let is_http = matches!(
        server.transport,
        crate::agent_config::McpTransport::Http { .. }
    );
    if is_http != http {
        return Err(Error::usage(
            format!(
                "{here}: {} ",
                if http {
                    "url is not an http(s):// URL"
                } else {
                    "command is a URL: give it as url"
                }
            )
            .trim_end()
            .to_string(),
        ));
    }
    for n in &e.env {
        settings::validate_env_name(n, &format!("{here}.env"))?;
    }
    if is_http && !e.env.is_empty() {
        return Err(Error::usage(format!(
            "{here}: env is for a command; an HTTP server takes headers"
        )));
    }
    if !is_http && !e.headers.is_empty() {
        return Err(Error::usage(format!(
            "{here}: headers are for an HTTP server; a command takes env"
        )));
    }
    for h in &e.headers {
        let bad = || {
            Error::usage(format!(
                "{here}.headers: each is HEADER=VARIABLE (the host variable that holds the value)"
            ))
        };
        let (header, var) = h.split_once('=').ok_or_else(bad)?;
        crate::agent_config::parse_mcp_secret(
            &format!("{name}:{}=x", header.trim()),
            &format!("{here}.headers"),
        )?;
        settings::validate_env_name(var.trim(), &format!("{here}.headers"))?;
    }
    Ok(())
}
