//! `caw-box show TARGET`: one session in full, as text or (`--json`) as its record with what
//! is derived from it (status, cost and whether every turn is priced, spend limit, protected
//! paths, warmth, fallbacks). Turns recorded unpriced are priced here where the person's
//! config prices their model now. Not here: listing sessions (`manage::ls`).

use std::time::Duration;

use serde::Serialize;

use super::ago::{ago, warm_left};
use super::manage::{fallbacks_of, settled};
use crate::error::Result;
use crate::event::Status;
use crate::output;
use crate::provider::pricing;
use crate::session::checkpoint::{self, CheckpointStats};
use crate::session::lifecycle;
use crate::session::record::SessionRecord;
use crate::session::target;

pub async fn show(target_arg: &str, json: bool) -> Result<i32> {
    let backend = crate::client::connect_backend().await?;
    let mut view = target::resolve_view(&backend, target_arg).await?;
    if settled(&backend, view.facts.session_id).await? {
        view = target::resolve_view(&backend, &view.facts.session_id.to_string()).await?;
    }
    let containers = lifecycle::turn_containers(&backend).await?;
    let running = containers.running.contains_key(&view.facts.session_id);
    let warm_until = containers
        .warm
        .get(&view.facts.session_id)
        .map(|w| w.until(view.last_activity()));
    let record = target::read_record(&backend, &view.facts)
        .await?
        .unwrap_or_else(|| view.record());
    let mut record = record;
    // Labels are the truth for what they hold (the latest turn's own for what a resume
    // changes: `--keep-warm`, `--max-cost`).
    record.name = view.facts.name.clone();
    record.group = view.facts.group.clone();
    record.settings = view.record().settings;
    price_unpriced_turns(&mut record)?;
    let queued = crate::session::admission::queued_turn(record.session_id);
    let status = if running {
        Status::Running.to_string()
    } else if queued.is_some() {
        queued
            .as_ref()
            .map(|q| q.status())
            .unwrap_or(Status::Queued)
            .to_string()
    } else {
        record
            .turns
            .last()
            .map_or("new".to_string(), |t| t.status.to_string())
    };
    let fallback_to = fallbacks_of(&target::list_sessions(&backend).await?, record.session_id);
    let checkpoints = checkpoints_of(&backend, &record).await?;
    let id = crate::auth::account::of(record.provider);
    let account = Account {
        account_windows: id.as_deref().and_then(crate::auth::windows::read),
        account: id,
        queue_position: queued.as_ref().map(|q| q.position).filter(|&p| p > 0),
        resumes_at: queued.as_ref().and_then(|q| q.resumes_at),
    };
    if json {
        print_shown_json(
            &record,
            &status,
            fallback_to,
            warm_until,
            checkpoints,
            &account,
        );
    } else {
        print_shown(&record, &status, &fallback_to, warm_until);
        account.print(record.settings.per_account);
        print_checkpoints(&checkpoints);
        if record.settings.no_checkpoints {
            output::println("\ncheckpoints off (`--checkpoints off`): its turns keep none");
        }
    }
    Ok(0)
}

/// The account the session spends (its provider's stored credentials), and its turn's place
/// in the account's queue while it waits (`--per-account`).
#[derive(Serialize)]
struct Account {
    account: Option<String>,
    /// What the account has left, as the latest brokered responses said.
    #[serde(skip_serializing_if = "Option::is_none")]
    account_windows: Option<crate::auth::windows::Standing>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_position: Option<usize>,
    /// Parked (`--on-limit park`): when its account's usage limit resets (unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    resumes_at: Option<u64>,
}

impl Account {
    fn print(&self, per_account: Option<u32>) {
        let cap = per_account.map_or(String::new(), |n| format!("; --per-account {n}"));
        let id = self.account.as_deref().unwrap_or("(none stored)");
        output::println(&format!("account    {id}{cap}"));
        if let Some(w) = &self.account_windows {
            let now = crate::clock::now_secs();
            output::println(&format!(
                "           {}",
                crate::auth::windows::summary(w, now)
            ));
        }
        if let Some(p) = self.queue_position {
            output::println(&format!(
                "queued     waiting for a slot of its account: {p} in line"
            ));
        }
        if let Some(at) = self.resumes_at {
            let left = at.saturating_sub(crate::clock::now_secs());
            output::println(&format!(
                "parked     its account met its usage limit; goes on when it resets, in {}",
                humantime::format_duration(std::time::Duration::from_secs(left))
            ));
        }
    }
}

/// The session's checkpoints and what each holds (read through one helper); where that
/// cannot be read, what their labels say.
async fn checkpoints_of(
    backend: &impl crate::backend::Backend,
    record: &SessionRecord,
) -> Result<Vec<CheckpointStats>> {
    let id = record.session_id;
    // The latest turn's, where its container finishes it behind the turn, once whole.
    if backend.capabilities().warm_checkpoints {
        checkpoint::settle(backend, id).await?;
    }
    let listed = checkpoint::list(backend, id).await?;
    match checkpoint::stats(backend, id, &record.settings.image, &listed).await {
        Ok(stats) if stats.len() == listed.len() => Ok(stats),
        outcome => {
            if let Err(e) = outcome {
                tracing::warn!("could not read what the checkpoints hold: {e}");
            }
            Ok(listed
                .iter()
                .map(|c| CheckpointStats {
                    turn: c.turn,
                    at: c.at,
                    base: c.base,
                    files_changed: 0,
                    workspace_files_changed: 0,
                    deleted: 0,
                    workspace_deleted: 0,
                    bytes: 0,
                })
                .collect())
        }
    }
}

/// `checkpoints`: one line per turn's checkpoint, what changed in it.
fn print_checkpoints(checkpoints: &[CheckpointStats]) {
    if checkpoints.is_empty() {
        return;
    }
    output::println("\ncheckpoints (`caw-box fork TARGET --at TURN` starts from one)");
    for c in checkpoints {
        let at = std::time::UNIX_EPOCH + Duration::from_secs(c.at);
        let whole = if c.base.is_none() { ", whole" } else { "" };
        output::println(&format!(
            "  turn {}  {}  {} files changed ({} in the workspace){whole}, {} KiB",
            c.turn,
            humantime::format_rfc3339_seconds(at),
            c.files_changed,
            c.workspace_files_changed,
            c.bytes.div_ceil(1024)
        ));
    }
}

/// Turns recorded with no cost (a model nothing priced then) priced now, where the person's
/// config file prices their model: what `show` and its total say.
fn price_unpriced_turns(record: &mut SessionRecord) -> Result<()> {
    let mut book = record.settings.prices.clone();
    book.extend(crate::config::Resolved::load(crate::config::Layer::default(), None)?.prices());
    for t in record
        .turns
        .iter_mut()
        .filter(|t| !pricing::is_priced(&t.usage))
    {
        pricing::fill_cost(
            record.provider,
            record.settings.model.as_deref(),
            record.cli_version.as_deref(),
            &book,
            &mut t.usage,
        );
    }
    Ok(())
}

fn print_shown_json(
    record: &SessionRecord,
    status: &str,
    fallback_to: Vec<String>,
    warm_until: Option<u64>,
    checkpoints: Vec<CheckpointStats>,
    account: &Account,
) {
    #[derive(Serialize)]
    struct Shown<'a> {
        /// `caw-box fork`: the session and turn this one was made from.
        #[serde(skip_serializing_if = "Option::is_none")]
        forked_from: Option<crate::session::ForkedFrom>,
        /// Every turn's checkpoint: when, and what changed since the one before.
        checkpoints: Vec<CheckpointStats>,
        status: &'a str,
        /// The sum of the turns' known costs.
        total_cost_usd: Option<f64>,
        /// Whether every turn's cost is known; `unpriced_turns` names those whose is not (a
        /// model neither the CLI, the price table nor the config's `[prices]` prices).
        priced: bool,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        unpriced_turns: Vec<u32>,
        /// `--on-limit fallback`: the session this one took over from, and those that
        /// took over from it.
        #[serde(skip_serializing_if = "Option::is_none")]
        fallback_of: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        fallback_to: Vec<String>,
        /// The workspace paths the agent cannot write (bind mode) and that `export` and
        /// `diff --patch` leave out (copy mode): the defaults with `protect` and
        /// without `unprotect`.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        protected_paths: Vec<String>,
        /// `--keep-warm`: until when (unix seconds) its idle container stays.
        #[serde(skip_serializing_if = "Option::is_none")]
        warm_until: Option<u64>,
        /// `--max-cost`: the limit, what is spent and left, and whether a next turn is
        /// refused.
        #[serde(skip_serializing_if = "Option::is_none")]
        budget: Option<crate::session::budget::Spend>,
        #[serde(flatten)]
        account: &'a Account,
        #[serde(flatten)]
        record: &'a SessionRecord,
    }
    let unpriced: Vec<u32> = record
        .turns
        .iter()
        .filter(|t| !pricing::is_priced(&t.usage))
        .map(|t| t.turn)
        .collect();
    output::print_json(&Shown {
        protected_paths: protected_of(&record.settings),
        status,
        total_cost_usd: record.total_cost_usd(),
        priced: unpriced.is_empty(),
        unpriced_turns: unpriced,
        fallback_of: record.settings.fallback_of.map(|id| id.to_string()),
        fallback_to,
        forked_from: record.settings.forked_from,
        checkpoints,
        warm_until,
        budget: crate::session::budget::Spend::of(record),
        account,
        record,
    });
}

fn print_shown(
    record: &SessionRecord,
    status: &str,
    fallback_to: &[String],
    warm_until: Option<u64>,
) {
    let s = &record.settings;
    output::println(&format!(
        "session {}  {}  {}",
        record.session_id, record.provider, status
    ));
    if let Some(name) = &record.name {
        output::println(&format!("name       {name}"));
    }
    if let Some(group) = &record.group {
        output::println(&format!("group      {group}"));
    }
    output::println(&format!("created    {}", ago(record.created_at)));
    if let Some(until) = warm_until {
        let at = std::time::UNIX_EPOCH + Duration::from_secs(until);
        output::println(&format!(
            "warm       its container waits for the next turn until {} ({} left)",
            humantime::format_rfc3339_seconds(at),
            &warm_left(until)["warm ".len()..]
        ));
    }
    print_settings(s);
    if let Some(b) = crate::session::budget::Spend::of(record) {
        use crate::session::budget::usd;
        let then = if b.spent {
            format!(
                "spent: the next turn is refused (`caw-box resume {} --max-cost USD` raises it)",
                record.session_id
            )
        } else {
            format!("{} left", usd(b.left_usd))
        };
        output::println(&format!(
            "budget     {} of {} --max-cost; {then}",
            usd(b.spent_usd),
            usd(b.max_cost_usd)
        ));
    }
    if let Some(id) = s.fallback_of {
        output::println(&format!("fallback of {id} (its usage limit)"));
    }
    if let Some(f) = s.forked_from {
        output::println(&format!(
            "forked from {} at the end of its turn {}",
            f.session, f.turn
        ));
    }
    for id in fallback_to {
        output::println(&format!("fell back to {id} (a usage limit)"));
    }
    for t in &record.turns {
        output::println("");
        let cost = match t.usage.cost_usd {
            Some(c) => Some(format!("  ${c:.4}")),
            None if !pricing::is_priced(&t.usage) => Some("  unpriced".to_string()),
            None => None,
        };
        let inherited = if t.inherited {
            "  (inherited: its source's turn and cost)"
        } else {
            ""
        };
        output::println(&format!(
            "turn {}  {}  {:.1}s  {} in / {} out tokens{}{inherited}",
            t.turn,
            t.status,
            t.duration_ms as f64 / 1000.0,
            t.usage.input_tokens + t.usage.cache_read_tokens,
            t.usage.output_tokens,
            cost.unwrap_or_default()
        ));
        if t.interactive {
            output::println("  > (interactive, in the vendor's TUI)");
        } else {
            output::println(&format!("  > {}", one_line(&t.prompt, 200)));
        }
        output::println(&format!("  < {}", one_line(&t.result, 400)));
        if let Some(e) = &t.egress {
            output::println(&format!("  {}", e.line()));
        }
    }
    if let Some(total) = record.total_cost_usd() {
        output::println(&format!("\ntotal cost ${total:.4}"));
    }
    if record.turns.iter().any(|t| !pricing::is_priced(&t.usage)) {
        output::println(
            "unpriced: caw-box knows no price for this session's model; price it in your config file ([prices.\"MODEL\"] with input and output in USD per million tokens)",
        );
    }
}

/// The settings lines of `show`, from the image to the MCP servers.
fn print_settings(s: &crate::session::SessionSettings) {
    output::println(&format!("image      {}", s.image));
    if let Some(ws) = &s.workspace {
        output::println(&format!("workspace  {ws}"));
    }
    let protected = protected_of(s);
    if !protected.is_empty() {
        output::println(&format!("protected  {}", protected.join(" ")));
    }
    if let Some(m) = &s.model {
        output::println(&format!("model      {m}"));
    }
    if let Some(e) = &s.endpoint {
        output::println(&format!("endpoint   {e}"));
    }
    if let Some(r) = &s.runtime {
        output::println(&format!("runtime    {r}"));
    }
    let egress = s.egress();
    match s.allow_hosts.is_empty() || egress == crate::session::record::EgressPolicy::Open {
        true => output::println(&format!("egress     {egress}")),
        false => output::println(&format!(
            "egress     {egress}, and {}",
            s.allow_hosts.join(" ")
        )),
    }
    if let Some(p) = &s.system_prompt {
        output::println(&format!("system     {}", one_line(p, 80)));
    }
    if let Some(p) = &s.append_system_prompt {
        output::println(&format!("append     {}", one_line(p, 80)));
    }
    if let Some(e) = s.effort {
        output::println(&format!("effort     {}", e.as_str()));
    }
    if let Some(t) = &s.tools {
        output::println(&format!("tools      {}", t.describe()));
    }
    for m in &s.mcp {
        let what = match &m.transport {
            crate::agent_config::McpTransport::Stdio { command } => command.join(" "),
            crate::agent_config::McpTransport::Http { url } => url.clone(),
        };
        output::println(&format!("mcp        {}={}", m.name, one_line(&what, 80)));
    }
}

/// A session's protected paths, where its workspace has any (not `--workspace-mode none`).
fn protected_of(s: &crate::session::SessionSettings) -> Vec<String> {
    match s.workspace_mode {
        crate::session::WorkspaceMode::None => Vec::new(),
        _ => s.protected_paths(),
    }
}

fn one_line(s: &str, max: usize) -> String {
    let joined = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if joined.chars().count() > max {
        format!("{}…", joined.chars().take(max).collect::<String>())
    } else {
        joined
    }
}
