//! One config file, read into a [`Layer`]: TOML syntax, no secret values, known keys only,
//! each value checked as its flag's would be. Every refusal is one line naming the file, the
//! line and the key, and never the value (it may be a secret pasted by mistake).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::secrets::why_secret;
use super::{Key, Layer, Origin, Value};
use crate::error::{Error, Result};

/// What a config file may hold (the same names as the flags, with `_`).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    provider: Option<Spanned<String>>,
    model: Option<Spanned<String>>,
    image: Option<Spanned<String>>,
    endpoint: Option<Spanned<String>>,
    network: Option<Spanned<String>>,
    allow_host: Option<Spanned<Vec<String>>>,
    egress: Option<Spanned<String>>,
    memory: Option<Spanned<MemorySize>>,
    cpus: Option<Spanned<f64>>,
    max_cost: Option<Spanned<f64>>,
    pids_limit: Option<Spanned<i64>>,
    per_account: Option<Spanned<i64>>,
    timeout: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    keep_warm: Option<Spanned<String>>,
    checkpoints: Option<Spanned<bool>>,
    connect_timeout: Option<Spanned<String>>,
    workspace_mode: Option<Spanned<String>>,
    group: Option<Spanned<String>>,
    labels: Option<Spanned<BTreeMap<String, String>>>,
    env_pass: Option<Spanned<Vec<String>>>,
    user_config: Option<Spanned<bool>>,
    image_repo: Option<Spanned<String>>,
    backend: Option<Spanned<String>>,
    system_prompt: Option<Spanned<String>>,
    append_system_prompt: Option<Spanned<String>>,
    effort: Option<Spanned<String>>,
    tools: Option<Spanned<String>>,
    allow_tool: Option<Spanned<Vec<String>>>,
    deny_tool: Option<Spanned<Vec<String>>>,
    protect: Option<Spanned<Vec<String>>>,
    unprotect: Option<Spanned<Vec<String>>>,
    mcp: Option<Spanned<BTreeMap<String, McpFileEntry>>>,
    runtime: Option<Spanned<String>>,
    prices: Option<Spanned<BTreeMap<String, PriceEntry>>>,
}

/// One model of the `prices` table: USD per million tokens.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceEntry {
    input: f64,
    output: f64,
    cache_read: Option<f64>,
    cache_write: Option<f64>,
}

/// One server of the `mcp` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpFileEntry {
    command: Option<CommandLine>,
    url: Option<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    headers: Vec<String>,
}

/// `command = "node /x/mcp.js"` or `command = ["node", "/x/mcp.js"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum CommandLine {
    Line(String),
    Words(Vec<String>),
}

/// `memory = "2g"` or `memory = 2147483648` (bytes).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MemorySize {
    Text(String),
    Bytes(i64),
}

/// Reads `text` (the contents of `path`) into a layer of `origin`'s kind.
pub fn parse(path: &Path, text: &str, origin: fn(String) -> Origin) -> Result<Layer> {
    let at = |span: std::ops::Range<usize>| format!("{}:{}", path.display(), line_of(text, span));
    let file = read(path, text)?;

    if matches!(origin(String::new()), Origin::Project(_)) {
        refuse_in_a_project(path, text, &file)?;
    }
    let mut layer = Layer::default();
    let mut put = |key: Key, value: Value, span: std::ops::Range<usize>| -> Result<()> {
        let origin = origin(at(span.clone()));
        let value = super::check(key, value, key.name()).map_err(|e| {
            // The check names the key itself (`memory '1x' is not a size`).
            let mut refused = refusal(path, line_of(text, span), None, &e.message);
            refused.hint = e.hint;
            refused
        })?;
        layer.0.insert(key, (value, origin));
        Ok(())
    };
    put_all(file, &mut put)?;
    Ok(layer)
}

/// Each key `file` sets, as a value of its kind, with where it was written.
fn put_all(
    file: ConfigFile,
    put: &mut dyn FnMut(Key, Value, std::ops::Range<usize>) -> Result<()>,
) -> Result<()> {
    let strings = [
        (Key::Provider, file.provider),
        (Key::Model, file.model),
        (Key::Image, file.image),
        (Key::Endpoint, file.endpoint),
        (Key::Network, file.network),
        (Key::Timeout, file.timeout),
        (Key::IdleTimeout, file.idle_timeout),
        (Key::KeepWarm, file.keep_warm),
        (Key::ConnectTimeout, file.connect_timeout),
        (Key::WorkspaceMode, file.workspace_mode),
        (Key::Group, file.group),
        (Key::ImageRepo, file.image_repo),
        (Key::Backend, file.backend),
        (Key::SystemPrompt, file.system_prompt),
        (Key::AppendSystemPrompt, file.append_system_prompt),
        (Key::Effort, file.effort),
        (Key::Tools, file.tools),
        (Key::Runtime, file.runtime),
        (Key::Egress, file.egress),
    ];
    for (key, v) in strings.into_iter() {
        if let Some(v) = v {
            let span = v.span();
            put(key, Value::Str(v.into_inner()), span)?;
        }
    }
    for (key, v) in [
        (Key::AllowHost, file.allow_host),
        (Key::EnvPass, file.env_pass),
        (Key::AllowTool, file.allow_tool),
        (Key::DenyTool, file.deny_tool),
        (Key::Protect, file.protect),
        (Key::Unprotect, file.unprotect),
    ] {
        if let Some(v) = v {
            let span = v.span();
            put(key, Value::List(v.into_inner()), span)?;
        }
    }
    if let Some(v) = file.memory {
        let span = v.span();
        let text = match v.into_inner() {
            MemorySize::Text(s) => s,
            MemorySize::Bytes(n) => n.to_string(),
        };
        put(Key::Memory, Value::Str(text), span)?;
    }
    for (key, v) in [(Key::Cpus, file.cpus), (Key::MaxCost, file.max_cost)] {
        if let Some(v) = v {
            let span = v.span();
            put(key, Value::Float(v.into_inner()), span)?;
        }
    }
    for (key, v) in [
        (Key::PidsLimit, file.pids_limit),
        (Key::PerAccount, file.per_account),
    ] {
        if let Some(v) = v {
            let span = v.span();
            put(key, Value::Int(v.into_inner()), span)?;
        }
    }
    if let Some(v) = file.labels {
        let span = v.span();
        put(Key::Labels, Value::Map(v.into_inner()), span)?;
    }
    if let Some(v) = file.mcp {
        let span = v.span();
        put(Key::Mcp, Value::Mcp(mcp_entries(v.into_inner())), span)?;
    }
    for (key, v) in [
        (Key::Checkpoints, file.checkpoints),
        (Key::UserConfig, file.user_config),
    ] {
        if let Some(v) = v {
            let span = v.span();
            put(key, Value::Bool(v.into_inner()), span)?;
        }
    }
    if let Some(v) = file.prices {
        let span = v.span();
        put(Key::Prices, Value::Prices(price_book(v.into_inner())), span)?;
    }
    Ok(())
}

/// What a project file (a repository's, or one an agent wrote) must not say: what would lift
/// its own walls.
fn refuse_in_a_project(path: &Path, text: &str, file: &ConfigFile) -> Result<()> {
    if let Some(v) = &file.unprotect {
        return Err(refusal(
            path,
            line_of(text, v.span()),
            Some("unprotect"),
            "a project file cannot unprotect paths: the repository would lift its own protection",
        )
        .with_hint("put `unprotect` in your user config file, or pass --unprotect PATH"));
    }
    // A repository may close its agent's egress further, never open it: only `locked`
    // is sure to be no wider than what the person chose, and its hosts would widen it.
    if let Some(v) = file
        .egress
        .as_ref()
        .filter(|v| v.get_ref().trim() != "locked")
    {
        return Err(refusal(
            path,
            line_of(text, v.span()),
            Some("egress"),
            "a project file can only set egress to \"locked\": the repository would open its own agent's egress",
        )
        .with_hint("put `egress` in your user config file, or pass --egress POLICY"));
    }
    if let Some(v) = &file.allow_host {
        return Err(refusal(
            path,
            line_of(text, v.span()),
            Some("allow_host"),
            "a project file cannot allow hosts: the repository would open its own agent's egress",
        )
        .with_hint("put `allow_host` in your user config file, or pass --allow-host HOST"));
    }
    if let Some(v) = &file.per_account {
        // The account is the person's: a repository would lift the cap on its turns.
        return Err(refusal(
            path,
            line_of(text, v.span()),
            Some("per_account"),
            "a project file cannot set per_account: the repository would decide how hard its turns use your account",
        )
        .with_hint("put `per_account` in your user config file, or pass --per-account N"));
    }
    if let Some(v) = &file.prices {
        // Prices decide what a turn counts against --max-cost: a repository would lower them.
        return Err(refusal(
            path,
            line_of(text, v.span()),
            Some("prices"),
            "a project file cannot set prices: the repository would decide what its turns count against --max-cost",
        )
        .with_hint("put `prices` in your user config file"));
    }
    Ok(())
}

fn price_book(table: BTreeMap<String, PriceEntry>) -> crate::provider::pricing::PriceBook {
    table
        .into_iter()
        .map(|(model, e)| {
            let price = crate::provider::pricing::Price {
                input: e.input,
                output: e.output,
                cache_read: e.cache_read,
                cache_write: e.cache_write,
            };
            (model, price)
        })
        .collect()
}

/// The file's keys, once it is known to be TOML without secret values.
fn read(path: &Path, text: &str) -> Result<ConfigFile> {
    let document = DeTable::parse(text).map_err(|e| {
        let line = e.span().map_or(1, |s| line_of(text, s));
        refusal(path, line, None, e.message())
    })?;
    refuse_secrets(document.get_ref(), &|span, key, why| {
        refusal(
            path,
            line_of(text, span),
            Some(key),
            &format!("{why}; config files hold no secret values (the value is not shown)"),
        )
        .with_hint("name the host variable that holds it instead: env_pass = [\"NAME\"]")
    })?;
    toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(1, |s| line_of(text, s));
        // Serde names the key of an unknown field, and no other.
        let key = e
            .span()
            .filter(|_| !e.message().starts_with("unknown field"))
            .map(|s| key_on_line(text, s));
        refusal(path, line, key.as_deref(), e.message())
    })
}

fn mcp_entries(servers: BTreeMap<String, McpFileEntry>) -> BTreeMap<String, super::McpEntry> {
    servers
        .into_iter()
        .map(|(name, e)| {
            let command = e.command.map(|c| match c {
                CommandLine::Line(l) => l,
                CommandLine::Words(w) => {
                    shlex::try_join(w.iter().map(String::as_str)).unwrap_or_else(|_| w.join(" "))
                }
            });
            let entry = super::McpEntry {
                command,
                url: e.url,
                env: e.env,
                headers: e.headers,
            };
            (name, entry)
        })
        .collect()
}

/// `FILE:LINE: KEY: what is wrong`, exit 2.
fn refusal(path: &Path, line: usize, key: Option<&str>, what: &str) -> Error {
    let key = key.map(|k| format!("{k}: ")).unwrap_or_default();
    Error::usage(format!("{}:{line}: {key}{what}", path.display()))
}

/// Walks every value of the document; `found(span, key, why)` makes the error of the first
/// secret-looking one. `key` is the innermost key above the value.
fn refuse_secrets(
    table: &DeTable<'_>,
    found: &dyn Fn(std::ops::Range<usize>, &str, &str) -> Error,
) -> Result<()> {
    for (key, value) in table.iter() {
        check_value(key.get_ref(), value, found)?;
    }
    Ok(())
}

fn check_value(
    key: &str,
    value: &Spanned<DeValue<'_>>,
    found: &dyn Fn(std::ops::Range<usize>, &str, &str) -> Error,
) -> Result<()> {
    match value.get_ref() {
        DeValue::String(s) => match why_secret(key, s) {
            Some(why) => Err(found(value.span(), key, why)),
            None => Ok(()),
        },
        DeValue::Array(items) => items
            .iter()
            .try_for_each(|item| check_value(key, item, found)),
        DeValue::Table(t) => refuse_secrets(t, found),
        // A number or a date is no key, but under a secret's name it still is one.
        _ => match why_secret(key, "0") {
            Some(why) => Err(found(value.span(), key, why)),
            None => Ok(()),
        },
    }
}

/// The 1-based line of a byte offset.
fn line_of(text: &str, span: std::ops::Range<usize>) -> usize {
    let end = span.start.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The key of the `key = value` line a span starts on (for serde's errors, which name the
/// key only for unknown fields).
fn key_on_line(text: &str, span: std::ops::Range<usize>) -> String {
    let line = text
        .lines()
        .nth(line_of(text, span) - 1)
        .unwrap_or_default();
    line.split('=')
        .next()
        .unwrap_or_default()
        .trim()
        .trim_matches('"')
        .to_string()
}
