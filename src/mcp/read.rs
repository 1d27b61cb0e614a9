//! The tools that read sessions: `status`, `events`, `result`, `diff`, `list`, and the
//! lines `wait` reports progress with. All from the backend (labels, containers, the state
//! volume), never from this server's memory: a new server reads what an old one started.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use uuid::Uuid;

use std::sync::Arc;

use super::queue::Queue;
use crate::backend::{Backend, OutputChunk};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::event::{Event, Status, TurnResult};
use crate::provider::ParseContext;
use crate::session::names;
use crate::session::patch::Patch;
use crate::session::target::{self, SessionView};

/// The longest `latest` line `status` and `wait`'s progress give.
const LATEST_CHARS: usize = 200;

/// How long reading a running turn's output waits for more before it stops: the output so
/// far arrives at once, a live turn's next line may be minutes away.
const LOG_QUIET: Duration = Duration::from_millis(400);

/// The kind of a turn's exit code, as the `-o json` error object names kinds (`null` for 0).
fn exit_kind(code: i32) -> Option<&'static str> {
    crate::error::ErrorKind::from_exit_code(code).map(|k| k.as_str())
}

/// A finished turn, short: for `wait`.
pub fn turn_brief(r: &TurnResult) -> Value {
    json!({
        "session_id": r.session_id,
        "name": r.name,
        "turn": r.turn,
        "status": r.status.to_string(),
        "exit_code": r.exit_code,
        "exit_kind": exit_kind(r.exit_code),
        "result": shorten(&r.result, LATEST_CHARS),
        "usage": r.usage,
        "handle": (!r.resume_handle.is_empty()).then_some(&r.resume_handle),
    })
}

fn shorten(s: &str, max: usize) -> String {
    let joined = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if joined.chars().count() > max {
        let cut: String = joined.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        joined
    }
}

/// One event as a line a person (or an orchestrating agent) reads at a glance.
pub fn event_line(e: &Event) -> Option<String> {
    let line = match e {
        Event::ToolCall { name, input, .. } => {
            let what = ["command", "cmd", "file_path", "path", "pattern", "url"]
                .iter()
                .find_map(|k| input.get(*k))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    Value::Array(a) => a
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" "),
                    other => other.to_string(),
                })
                .unwrap_or_default();
            format!("running tool: {name} {what}")
        }
        Event::ToolResult { is_error, .. } => {
            format!("tool {}", if *is_error { "failed" } else { "finished" })
        }
        Event::Text { text } => format!("says: {text}"),
        Event::Thinking { .. } => "thinking".to_string(),
        Event::Error { message } => format!("error: {message}"),
        Event::EgressRefused { host, port, .. } => format!("egress refused: {host}:{port}"),
        Event::Usage { .. } | Event::Session { .. } | Event::Result { .. } => return None,
    };
    Some(shorten(&line, LATEST_CHARS))
}

/// The unified events a running turn printed so far, parsed as its driver parses them, and
/// with `refusals` its egress refusals so far from its proxy's log, in the order they
/// happened. Without: a list that only grows at its end, as `events`' cursor needs (a
/// refusal placed by its time could land before a page already given); the turn's
/// recorded log has them once it ended.
async fn running_events(backend: &impl Backend, view: &SessionView, refusals: bool) -> Vec<Event> {
    let provider = view.facts.provider;
    let mcp = view.record().settings.mcp_names();
    let mut parser = provider.adapter().parser(ParseContext {
        previous_cumulative_usage: view.last.as_ref().and_then(|l| l.cumulative_usage),
    });
    let container = names::turn_container(view.facts.session_id);
    // Each line with its time: the refusals go among the CLI's events by theirs.
    let mut stream = backend.logs_since(&container, std::time::UNIX_EPOCH, true);
    let mut lines = crate::lines::LineBuffer::default();
    let mut events: Vec<(std::time::SystemTime, Event)> = Vec::new();
    let mut batch = Vec::new();
    let mut at = std::time::UNIX_EPOCH;
    let mut parse = |line: &str| {
        let line = match crate::session::refusals::stamped(line) {
            Some((t, rest)) => {
                at = t;
                rest
            }
            None => line,
        };
        if crate::session::is_marker(line) {
            return;
        }
        batch.clear();
        parser.parse_line(line, &mut batch);
        crate::agent_config::tag_tool_groups(provider.adapter().tool_names(), &mcp, &mut batch);
        events.extend(batch.drain(..).map(|e| (at, e)));
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while let Ok(Some(chunk)) = tokio::time::timeout(LOG_QUIET, stream.next()).await {
        if let Ok(OutputChunk::Stdout(bytes)) = chunk {
            lines.feed(&bytes, &mut parse);
        }
        if tokio::time::Instant::now() > until {
            break;
        }
    }
    lines.finish(&mut parse);
    let found = match refusals {
        true => backend.inspect_container(&container).await,
        false => Ok(None),
    };
    if let Ok(Some(c)) = found {
        let ended = view
            .last
            .as_ref()
            .map(|l| std::time::UNIX_EPOCH + Duration::from_secs(l.ended_at));
        if let Some(watch) = crate::session::refusals::Watch::of(backend, &c, ended).await {
            events.extend(watch.so_far(backend).await);
        }
    }
    // (A stable sort: the CLI's events keep their order.)
    events.sort_by_key(|(t, _)| *t);
    events.into_iter().map(|(_, e)| e).collect()
}

/// The usage a running turn reported so far (the latest `usage` event).
/// The running turn's usage so far: its usage events added up (each CLI's events add up to
/// its turn's usage), priced as the turn's cost will be; `None` before the first.
fn usage_so_far(events: &[Event], view: &target::SessionView) -> Option<crate::event::Usage> {
    let mut sum: Option<crate::event::Usage> = None;
    for e in events {
        if let Event::Usage { usage } = e {
            let mut usage = *usage;
            crate::provider::pricing::fill_cost(
                view.facts.provider,
                view.facts.settings.model.as_deref(),
                // The image's CLI version is the turn's to read: the pin's default here.
                None,
                &view.facts.settings.prices,
                &mut usage,
            );
            sum.get_or_insert_with(Default::default).add(&usage);
        }
    }
    sum
}

/// The session's running turn, if any.
async fn running_turn(client: &Client, id: Uuid) -> Result<Option<u32>> {
    Ok(client.running().await?.get(&id).copied())
}

/// `status`: cheap, for polling loops.
pub async fn status(target: &str, queue: Option<Arc<Queue>>) -> Result<Value> {
    let client = Client::connect().await?;
    let backend = client.backend();
    let view = target::resolve_view(backend, target).await?;
    let id = view.facts.session_id;
    let mut out = json!({
        "session_id": id.to_string(),
        "name": view.facts.name,
        "group": view.facts.group,
        "provider": view.facts.provider.to_string(),
    });
    let queued = queue.as_ref().and_then(|q| q.position(id));
    let failed = queue.as_ref().and_then(|q| q.failure(id));
    let account_queued = crate::session::admission::queued_turn(id);
    // The account the session spends, and what it has left as its latest responses said.
    if let Some((account, windows)) = account_of(view.facts.provider) {
        out["account_windows"] = windows;
        out["account"] = json!(account);
    }
    if let Some(position) = queued {
        out["status"] = json!("queued");
        out["queue_position"] = json!(position);
    } else if let Some(q) = account_queued {
        // Waiting for a slot of its account (`--per-account`), in this host's queue.
        out["status"] = json!(q.status().to_string());
        out["turn"] = json!(q.turn);
        if q.position > 0 {
            out["queue_position"] = json!(q.position);
        }
        if let Some(at) = q.resumes_at {
            out["resumes_at"] = json!(at);
        }
        out["account"] = json!(q.account);
    } else if let Some(turn) = running_turn(&client, id).await? {
        let container = backend
            .inspect_container(&names::turn_container(id))
            .await?;
        let elapsed = container
            .and_then(|c| c.created)
            .and_then(|t| t.elapsed().ok())
            .map(|d| d.as_secs());
        let events = running_events(backend, &view, true).await;
        out["status"] = json!(Status::Running.to_string());
        out["turn"] = json!(turn);
        out["elapsed_s"] = json!(elapsed);
        out["latest"] = json!(events.iter().rev().find_map(event_line));
        out["usage"] = json!(usage_so_far(&events, &view));
    } else {
        match &view.last {
            Some(last) => {
                out["status"] = json!(last.status.to_string());
                out["turn"] = json!(last.turn);
                out["elapsed_s"] = json!(last.ended_at.saturating_sub(last.started_at));
            }
            None => {
                out["status"] = json!("new");
                out["turn"] = json!(0);
            }
        }
    }
    if let Some(e) = failed {
        out["queued_turn_failed"] = json!(e.report());
    }
    out["total_cost_usd"] = json!(view.last.as_ref().and_then(|l| l.total_cost_usd));
    let max_cost = view
        .last
        .as_ref()
        .and_then(|l| l.max_cost_usd)
        .or(view.facts.settings.max_cost_usd);
    out["max_cost_usd"] = json!(max_cost);
    Ok(out)
}

/// How many events `events` returns unless asked otherwise, and at most.
pub const EVENTS_DEFAULT_LIMIT: usize = 200;
pub const EVENTS_MAX_LIMIT: usize = 1000;

/// One page of a turn's events: at most `limit` after `cursor`, the cursor to ask with next
/// (past what was returned; `cursor` itself when there was nothing after it), and whether
/// more are there already (a running turn may add more after `more: false`).
fn page(events: &[Event], cursor: usize, limit: usize) -> (&[Event], usize, bool) {
    let from = cursor.min(events.len());
    let to = from.saturating_add(limit).min(events.len());
    (&events[from..to], cursor.max(to), to < events.len())
}

/// `limit` as given, checked: 1 to [`EVENTS_MAX_LIMIT`], [`EVENTS_DEFAULT_LIMIT`] when absent.
fn events_limit(asked: Option<usize>) -> Result<usize> {
    match asked {
        None => Ok(EVENTS_DEFAULT_LIMIT),
        Some(n) if (1..=EVENTS_MAX_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(Error::usage(format!(
            "limit must be 1 to {EVENTS_MAX_LIMIT}, not {n}"
        ))),
    }
}

/// `events`: one page of a turn's unified events after `cursor` ([`page`]).
pub async fn events(
    target: &str,
    turn: Option<u32>,
    cursor: usize,
    limit: Option<usize>,
) -> Result<Value> {
    let limit = events_limit(limit)?;
    let client = Client::connect().await?;
    let backend = client.backend();
    let view = target::resolve_view(backend, target).await?;
    let id = view.facts.session_id;
    let running = running_turn(&client, id).await?;
    let last = view.last.as_ref().map_or(0, |l| l.turn);
    let (n, events) = match (turn, running) {
        (None, Some(r)) => (r, running_events(backend, &view, false).await),
        (Some(t), Some(r)) if t == r => (r, running_events(backend, &view, false).await),
        (t, _) => {
            let n = t.unwrap_or(last);
            if n == 0 {
                return Err(Error::usage(format!(
                    "session {id} has no finished turn yet"
                )));
            }
            let path = format!(".caw-box/turns/{n}.events.jsonl");
            let bytes = target::read_volume_file(backend, &view.facts, &path)
                .await?
                .ok_or_else(|| {
                    Error::not_found(format!("session {id} has no turn {n}"))
                        .with_hint(format!("its turns are 1 to {last}"))
                })?;
            let events = String::from_utf8_lossy(&bytes)
                .lines()
                .filter_map(|l| serde_json::from_str::<Event>(l).ok())
                .collect();
            (n, events)
        }
    };
    let (after, next_cursor, more) = page(&events, cursor, limit);
    Ok(json!({
        "session_id": id.to_string(),
        "turn": n,
        "running": running == Some(n),
        "events": after,
        "next_cursor": next_cursor,
        "more": more,
    }))
}

/// The patch of a session's changes, as `caw-box diff --patch` makes it, with its files.
pub async fn patch_of(client: &Client, target: &str) -> Result<(SessionView, Patch)> {
    let backend = client.backend();
    let view = target::resolve_view(backend, target).await?;
    let ids = crate::session::owner::turn_ids(&view.facts.settings);
    let made = crate::session::patch::patch(backend, &view.facts, ids, false).await?;
    Ok((view, made))
}

/// `result`: how a turn ended, its answer, usage and cost, and the files it changed.
pub async fn result(target: &str, turn: Option<u32>) -> Result<Value> {
    let client = Client::connect().await?;
    let backend = client.backend();
    let view = target::resolve_view(backend, target).await?;
    let id = view.facts.session_id;
    if let (None, Some(r)) = (turn, running_turn(&client, id).await?) {
        return Ok(json!({
            "session_id": id.to_string(),
            "turn": r,
            "status": Status::Running.to_string(),
            "hint": "the turn is still running: `wait` for it",
        }));
    }
    let record = target::read_record(backend, &view.facts)
        .await?
        .ok_or_else(|| Error::usage(format!("session {id} has no finished turn")))?;
    let t = match turn {
        Some(n) => record.turns.iter().find(|t| t.turn == n).ok_or_else(|| {
            let last = record.turns.last().map_or(0, |t| t.turn);
            Error::not_found(format!("session {id} has no finished turn {n}"))
                .with_hint(format!("its finished turns are 1 to {last}"))
        })?,
        None => record
            .turns
            .last()
            .ok_or_else(|| Error::usage(format!("session {id} has no finished turn")))?,
    };
    let r = crate::session::lifecycle::result_of(&record, t, &backend.capabilities().scope);
    let mut out = serde_json::to_value(&r).expect("results serialize");
    out["exit_kind"] = json!(exit_kind(r.exit_code));
    out["cost_usd"] = json!(r.usage.cost_usd);
    out["total_cost_usd"] = json!(record.total_cost_usd());
    if view.facts.settings.workspace_mode != crate::session::WorkspaceMode::None {
        match patch_of(&client, &id.to_string()).await {
            Ok((_, made)) => out["files_changed"] = json!(made.files),
            Err(e) => {
                out["files_changed"] = Value::Null;
                out["files_changed_unknown"] = json!(e.message);
            }
        }
    }
    Ok(out)
}

/// `list`: the sessions of scope `scope` as `caw-box ls --json` lists them, by group and
/// status.
pub async fn list(
    scope: &str,
    group: Option<String>,
    status: Option<&str>,
    queue: Option<Arc<Queue>>,
) -> Result<Value> {
    let client = Client::connect().await?;
    let mine: std::collections::HashSet<String> = target::list_sessions(client.backend())
        .await?
        .into_iter()
        .filter(|v| v.facts.scope.as_deref() == Some(scope))
        .map(|v| v.facts.session_id.to_string())
        .collect();
    let rows = crate::commands::manage::ls_rows(false, group).await?;
    let mut accounts = std::collections::HashMap::new();
    let queued = |r: &Value| {
        let id = r["session_id"]
            .as_str()
            .and_then(|s| Uuid::parse_str(s).ok());
        queue
            .as_ref()
            .zip(id)
            .is_some_and(|(q, id)| q.position(id).is_some())
    };
    let rows: Vec<Value> = rows
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["session_id"].as_str().is_some_and(|id| mine.contains(id)))
        .map(|mut r| {
            if queued(&r) {
                r["status"] = json!("queued");
            }
            r
        })
        .filter(|r| status.is_none_or(|s| r["status"] == s))
        .map(|mut r| {
            with_account(&mut r, &mut accounts);
            r
        })
        .collect();
    Ok(json!({ "sessions": rows }))
}

/// Adds to an `ls --json` row the account its session spends and that account's latest
/// windows (as `status` has them), each provider's read once per listing.
fn with_account(
    row: &mut Value,
    accounts: &mut std::collections::HashMap<String, Option<(String, Value)>>,
) {
    let Some(provider) = row["provider"].as_str() else {
        return;
    };
    let known = accounts
        .entry(provider.to_string())
        .or_insert_with(|| account_of(provider.parse().ok()?));
    if let Some((account, windows)) = known {
        row["account"] = json!(account);
        row["account_windows"] = windows.clone();
    }
}

/// The account `p`'s stored credentials spend, and what it has left as its latest responses
/// said (null until a brokered turn saw one); `None` with nothing stored.
fn account_of(p: crate::provider::ProviderKind) -> Option<(String, Value)> {
    let account = crate::auth::account::of(p)?;
    let windows = json!(crate::auth::windows::read(&account));
    Some((account, windows))
}

/// The progress line of `wait`: each running session's latest event.
pub async fn progress_line(client: &Client, running: &[Uuid], elapsed: Duration) -> String {
    let mut parts = Vec::new();
    for id in running {
        let backend = client.backend();
        let Ok(view) = target::resolve_view(backend, &id.to_string()).await else {
            continue;
        };
        let events = running_events(backend, &view, true).await;
        let who = view
            .facts
            .name
            .clone()
            .unwrap_or_else(|| id.to_string()[..8].to_string());
        let latest = events
            .iter()
            .rev()
            .find_map(event_line)
            .unwrap_or_else(|| "starting".to_string());
        let tokens = usage_so_far(&events, &view)
            .map(|u| format!(", {} tokens so far", u.input_tokens + u.output_tokens))
            .unwrap_or_default();
        parts.push(shorten(&format!("{who}: {latest}{tokens}"), LATEST_CHARS));
    }
    format!(
        "{}s: {}",
        elapsed.as_secs(),
        if parts.is_empty() {
            "waiting".to_string()
        } else {
            parts.join("; ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_a_page_at_a_time_to_the_end() {
        let events: Vec<Event> = (0..5)
            .map(|i| Event::Text {
                text: format!("e{i}"),
            })
            .collect();
        let texts = |page: &[Event]| {
            page.iter()
                .map(|e| match e {
                    Event::Text { text } => text.clone(),
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        let (mut cursor, mut seen, mut calls) = (0, Vec::new(), 0);
        loop {
            let (got, next, more) = page(&events, cursor, 2);
            assert!(got.len() <= 2);
            seen.extend(texts(got));
            cursor = next;
            calls += 1;
            if !more {
                break;
            }
        }
        assert_eq!(seen, ["e0", "e1", "e2", "e3", "e4"]);
        assert_eq!((calls, cursor), (3, 5));
        // At the end, and past it: nothing, the same cursor, no more.
        assert_eq!(page(&events, 5, 2), (&events[5..], 5, false));
        assert_eq!(page(&events, 9, 2), (&events[5..], 9, false));
        assert_eq!(page(&events, 0, usize::MAX), (&events[..], 5, false));
    }

    #[test]
    fn the_schema_tells_a_client_the_limits_bounds() {
        let schema =
            serde_json::to_value(schemars::schema_for!(super::super::args::EventsArgs)).unwrap();
        let limit = &schema["properties"]["limit"];
        assert_eq!(limit["minimum"], 1);
        assert_eq!(limit["maximum"], EVENTS_MAX_LIMIT);
        let said = limit["description"].as_str().unwrap();
        assert!(said.contains("default 200, at most 1000"), "{said}");
        assert_eq!(EVENTS_DEFAULT_LIMIT, 200);
    }

    #[test]
    fn the_limit_has_a_default_and_a_ceiling() {
        assert_eq!(events_limit(None).unwrap(), EVENTS_DEFAULT_LIMIT);
        assert_eq!(events_limit(Some(1)).unwrap(), 1);
        assert_eq!(
            events_limit(Some(EVENTS_MAX_LIMIT)).unwrap(),
            EVENTS_MAX_LIMIT
        );
        for bad in [0, EVENTS_MAX_LIMIT + 1] {
            let e = events_limit(Some(bad)).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Usage, "{e:?}");
        }
    }

    #[test]
    fn a_latest_line_is_short_and_says_what_runs() {
        let e = Event::ToolCall {
            id: "1".into(),
            name: "shell".into(),
            input: json!({"command": ["bash", "-lc", "cargo test"]}),
            group: None,
        };
        assert_eq!(
            event_line(&e).unwrap(),
            "running tool: shell bash -lc cargo test"
        );
        let long = Event::Text {
            text: "x".repeat(500),
        };
        assert_eq!(event_line(&long).unwrap().chars().count(), LATEST_CHARS);
    }
}
