//! The tools that start, stop and wait for turns: `start`, `reply`, `cancel`, `wait`.
//! Each turn runs in a background `caw-box __drive` process ([`Session::start_detached`]),
//! as `run -d` does, so the server returns at once and holds nothing a later server needs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};

use std::sync::Arc;

use super::queue::Queue;
use super::read;
use super::{Defaults, Progress};
use crate::cli::{RunArgs, SettingsArgs, TurnArgs, WorkspaceModeArg};
use crate::client::{Client, Session};
use crate::commands::turn::{new_session, open_session, NewTurn};
use crate::error::{Error, Result};
use crate::event::Status;
use crate::mcp::args::{Overrides, ReplyArgs, StartArgs, WaitArgs};
use crate::session::runner::TurnOptions;
use crate::session::target;

/// The most sessions one `start` makes.
const MAX_N: u32 = 8;

/// How long `cancel` waits for the stopped turn to be recorded before it answers (the stop
/// goes on in the background after that).
const CANCEL_WITHIN: Duration = Duration::from_secs(9);

/// How often `wait` reports progress (the contract: at least every 10 s).
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// `settings` with a tool call's overrides on top, as flags given after the server's.
fn merged(settings: &SettingsArgs, o: &Overrides) -> Result<SettingsArgs> {
    let mut s = settings.clone();
    if let Some(c) = o.max_cost_usd {
        crate::settings::check_max_cost(c, "max_cost_usd")?;
        s.max_cost = Some(c);
    }
    let set = |field: &mut Option<String>, value: &Option<String>| {
        if let Some(v) = value {
            *field = Some(v.clone());
        }
    };
    set(&mut s.model, &o.model);
    set(&mut s.effort, &o.effort);
    set(&mut s.system_prompt, &o.system_prompt);
    set(&mut s.append_system_prompt, &o.append_system_prompt);
    set(&mut s.tools, &o.tools);
    set(&mut s.runtime, &o.runtime);
    set(&mut s.keep_warm, &o.keep_warm);
    set(&mut s.timeout, &o.timeout);
    if let Some(hosts) = &o.allow_host {
        s.allow_host.extend(hosts.iter().cloned());
    }
    Ok(s)
}

/// A turn's flags with `prompt`: started detached, the server's `--env` passed again (values
/// are never remembered by a session).
fn turn_args(defaults: &Defaults, settings: SettingsArgs, prompt: &str) -> Result<TurnArgs> {
    // `-` would read the prompt from stdin: the server's stdin is the MCP connection.
    if prompt.trim() == "-" {
        return Err(
            Error::usage("the prompt '-' is not a prompt here").with_hint("give the prompt's text")
        );
    }
    Ok(TurnArgs {
        prompt: Some(prompt.to_string()),
        settings,
        env: defaults.env.clone(),
        detach: true,
        ..Default::default()
    })
}

fn workspace_mode(
    mode: Option<&str>,
    default: Option<WorkspaceModeArg>,
) -> Result<WorkspaceModeArg> {
    Ok(match mode {
        None => default.unwrap_or(WorkspaceModeArg::Copy),
        Some("copy") => WorkspaceModeArg::Copy,
        Some("bind") => WorkspaceModeArg::Bind,
        Some("none") => WorkspaceModeArg::None,
        Some("auto") => WorkspaceModeArg::Auto,
        Some(other) => {
            return Err(Error::usage(format!(
                "workspace_mode '{other}' is not one of copy, bind, none, auto"
            )))
        }
    })
}

/// What `start` and `reply` say of a turn they started (or queued).
fn started(session: &Session, turn: u32, queued: bool) -> Value {
    let r = session.record();
    let status = if queued {
        "queued".to_string()
    } else {
        Status::Running.to_string()
    };
    json!({
        "session_id": r.session_id.to_string(),
        "name": r.name,
        "group": r.group,
        "provider": r.provider.to_string(),
        "turn": turn,
        "status": status,
        // The vendor's own session id (in the handle) is known once the CLI started its
        // conversation: `wait`, `status` and `result` give the handle then.
        "handle": (!r.resume_key.is_empty()).then(|| session.handle().to_json()),
    })
}

/// `start`: n new sessions, each with its first turn running in the background.
pub async fn start(defaults: &Defaults, a: StartArgs) -> Result<Value> {
    let n = a.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(Error::usage(format!("n must be 1 to {MAX_N}, not {n}")));
    }
    let mut settings = merged(&defaults.settings, &a.overrides)?;
    settings.workspace_mode = Some(workspace_mode(
        a.workspace_mode.as_deref(),
        defaults.settings.workspace_mode,
    )?);
    if let Some(w) = &a.workspace {
        settings.workspace = Some(w.into());
    }
    let group = match (&a.group, n) {
        (Some(g), _) => Some(g.clone()),
        (None, 1) => None,
        (None, _) => Some(format!(
            "best-of-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        )),
    };
    let name = |i: u32| match (&a.name, n) {
        (Some(name), 1) => Some(name.clone()),
        (Some(name), _) => Some(format!("{name}-{i}")),
        (None, _) => None,
    };
    let client = match &defaults.budget {
        Some(_) => Some(Client::connect().await?),
        None => None,
    };
    let mut grant = match (&defaults.budget, &client) {
        (Some(b), Some(c)) => Some(
            b.grant(c, &|id| defaults.queued(id), 0.0, n, settings.max_cost)
                .await?,
        ),
        _ => None,
    };
    if let Some(g) = &grant {
        settings.max_cost = Some(g.limit());
    }
    let mut runs = Vec::new();
    for i in 1..=n {
        let args = RunArgs {
            provider: Some(a.provider.clone()),
            name: name(i),
            group: group.clone(),
            user_config: false,
            turn: turn_args(defaults, settings.clone(), &a.prompt)?,
        };
        runs.push(start_one(args, defaults.queue.clone()));
    }
    let outcomes = futures_util::future::join_all(runs).await;
    if let Some(g) = &mut grant {
        for o in outcomes.iter().flatten() {
            if let Some(id) = o["session_id"].as_str().and_then(|s| s.parse().ok()) {
                g.keep(id);
            }
        }
    }
    drop(grant);
    let errors: Vec<&Error> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    if errors.len() == outcomes.len() {
        // Nothing started: the first refusal says why (they are the same refusal).
        return Err(outcomes
            .into_iter()
            .find_map(|o| o.err())
            .expect("an error"));
    }
    let sessions: Vec<Value> = outcomes
        .into_iter()
        .map(|o| o.unwrap_or_else(|e| json!({"error": e.report()})))
        .collect();
    Ok(json!({ "group": group, "sessions": sessions }))
}

/// Starts `session`'s turn now, or queues it behind `--max-parallel`; `true` when queued.
async fn start_or_queue(
    queue: Option<&Arc<Queue>>,
    client: &Client,
    session: &Session,
    options: &TurnOptions,
    first: bool,
) -> Result<bool> {
    match queue {
        Some(q) => q.start_or_queue(client, session, options, first).await,
        None => session.start_detached(options).await.map(|()| false),
    }
}

async fn start_one(mut args: RunArgs, queue: Option<Arc<Queue>>) -> Result<Value> {
    let NewTurn {
        client,
        session,
        options,
    } = new_session(&mut args, true, &|_| {}).await?;
    match start_or_queue(queue.as_ref(), &client, &session, &options, true).await {
        Ok(queued) => Ok(started(&session, 1, queued)),
        Err(e) => {
            session.discard_unless_recorded().await;
            Err(e)
        }
    }
}

/// The turn running in session `target` now, if any: its id and turn.
async fn running_turn(client: &Client, target: &str) -> Result<(uuid::Uuid, Option<u32>)> {
    let id = target::resolve_view(client.backend(), target)
        .await?
        .facts
        .session_id;
    Ok((id, client.running().await?.get(&id).copied()))
}

/// `reply`: the session's next turn, in the background.
pub async fn reply(defaults: &Defaults, a: ReplyArgs) -> Result<Value> {
    let client = Client::connect().await?;
    let (id, running) = running_turn(&client, &a.session).await?;
    if let Some(turn) = running {
        return Err(
            Error::busy(format!("session {id} is busy: it is running turn {turn}"))
                .with_hint("`wait` for it, or `cancel` it"),
        );
    }
    if defaults.queue.as_ref().is_some_and(|q| q.holds(id)) {
        return Err(
            Error::busy(format!("session {id} is busy: it has a turn queued"))
                .with_hint("`wait` for it"),
        );
    }
    let mut settings = merged(&SettingsArgs::default(), &a.overrides)?;
    let mut grant = match &defaults.budget {
        Some(b) => {
            let record = target::resolve(client.backend(), &a.session).await?;
            let own = settings.max_cost.or(record.settings.max_cost_usd);
            let spent = record.total_cost_usd().unwrap_or(0.0);
            Some(
                b.grant(&client, &|id| defaults.queued(id), spent, 1, own)
                    .await?,
            )
        }
        None => None,
    };
    if let Some(g) = &grant {
        settings.max_cost = Some(g.limit());
    }
    let turn = turn_args(defaults, settings, &a.prompt)?;
    let NewTurn {
        client,
        session,
        options,
    } = open_session(&a.session, &turn).await?;
    let queued =
        start_or_queue(defaults.queue.as_ref(), &client, &session, &options, false).await?;
    if let Some(g) = &mut grant {
        g.keep(id);
    }
    Ok(started(&session, session.record().next_turn(), queued))
}

/// `cancel`: stops the running turn; answers within [`CANCEL_WITHIN`] (the stop goes on
/// in the background when the turn takes longer to be recorded).
pub async fn cancel(target: &str) -> Result<Value> {
    let client = Client::connect().await?;
    let (id, turn) = running_turn(&client, target).await?;
    // On a thread of its own: it goes on stopping after this call answered.
    let stopping = super::off_thread({
        let target = target.to_string();
        move || async move { Client::connect().await?.stop(&target).await }
    });
    match tokio::time::timeout(CANCEL_WITHIN, stopping).await {
        Ok(Ok((_, stopped))) => Ok(json!({
            "session_id": id.to_string(),
            "turn": turn,
            "status": match stopped {
                crate::Stopped::Turn => Status::Interrupted.to_string(),
                crate::Stopped::Warm => "idle".to_string(),
            },
            "resumable": true,
        })),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(json!({
            "session_id": id.to_string(),
            "turn": turn,
            "status": "stopping",
            "resumable": true,
        })),
    }
}

/// `wait`: until every (or any) session's turn ended, or the timeout; progress on the way.
/// `cancelled`: the client cancelled the call (or went away): the wait ends then, not at its
/// timeout (it runs on a thread of its own, which dropping the call does not stop).
pub async fn wait(
    a: WaitArgs,
    queue: Option<Arc<Queue>>,
    progress: Progress,
    cancelled: tokio_util::sync::CancellationToken,
) -> Result<Value> {
    let any = match a.mode.as_deref() {
        None | Some("all") => false,
        Some("any") => true,
        Some(other) => {
            return Err(Error::usage(format!(
                "mode '{other}' is not `all` or `any`"
            )))
        }
    };
    if a.sessions.is_empty() {
        return Err(Error::usage("say which sessions to wait for: sessions"));
    }
    let timeout = Duration::from_secs(a.timeout_s.unwrap_or(300).clamp(1, 3600));
    let client = Client::connect().await?;
    // Every target resolved first: one unknown session is refused before any wait.
    let mut ids = Vec::new();
    for t in &a.sessions {
        let id = target::resolve_view(client.backend(), t)
            .await?
            .facts
            .session_id;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pending: FuturesUnordered<_> = ids
        .iter()
        .map(|&id| {
            let client = client.clone();
            let queue = queue.clone();
            async move {
                if let Some(q) = &queue {
                    if let Err(e) = q.until_started(id).await {
                        return (id, Err(e));
                    }
                }
                (id, client.wait(&id.to_string()).await)
            }
        })
        .collect();
    let mut done: HashMap<uuid::Uuid, Value> = HashMap::new();
    let mut ticker = tokio::time::interval(PROGRESS_EVERY);
    ticker.tick().await;
    let mut step = 0u32;
    loop {
        if pending.is_empty() || (any && !done.is_empty()) {
            break;
        }
        tokio::select! {
            Some((id, outcome)) = pending.next() => {
                let v = match outcome {
                    Ok(r) => read::turn_brief(&r),
                    Err(e) => json!({"session_id": id.to_string(), "status": "error", "error": e.report()}),
                };
                done.insert(id, v);
            }
            _ = ticker.tick() => {
                step += 1;
                let running: Vec<_> = ids.iter().filter(|id| !done.contains_key(id)).copied().collect();
                let line = read::progress_line(&client, &running, started.elapsed()).await;
                progress.send(step, &line).await;
            }
            _ = tokio::time::sleep_until(deadline) => break,
            _ = cancelled.cancelled() => {
                return Err(Error::new(crate::error::ErrorKind::Interrupted, "the wait was cancelled"));
            }
        }
    }
    drop(pending);
    let running = client.running().await.unwrap_or_default();
    let sessions: Vec<Value> = ids
        .iter()
        .map(|id| {
            done.remove(id).unwrap_or_else(|| {
                let queued = queue.as_ref().is_some_and(|q| q.holds(*id));
                json!({
                    "session_id": id.to_string(),
                    "status": if queued { "queued".to_string() } else { Status::Running.to_string() },
                    "turn": running.get(id),
                })
            })
        })
        .collect();
    let ended = sessions
        .iter()
        .filter(|s| s["status"] != "running" && s["status"] != "queued")
        .count();
    let satisfied = if any {
        ended > 0
    } else {
        ended == sessions.len()
    };
    Ok(json!({
        "timed_out": !satisfied,
        "elapsed_s": started.elapsed().as_secs(),
        "sessions": sessions,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_overrides_go_over_the_servers_flags() {
        let server = SettingsArgs {
            model: Some("server-model".into()),
            timeout: Some("1h".into()),
            allow_host: vec!["@provider".into()],
            ..Default::default()
        };
        let call = Overrides {
            model: Some("call-model".into()),
            allow_host: Some(vec!["docs.example.com".into()]),
            ..Default::default()
        };
        let s = merged(&server, &call).unwrap();
        assert_eq!(s.model.as_deref(), Some("call-model"));
        assert_eq!(s.timeout.as_deref(), Some("1h"));
        assert_eq!(s.allow_host, ["@provider", "docs.example.com"]);
        let spend = |usd| Overrides {
            max_cost_usd: Some(usd),
            ..Default::default()
        };
        assert_eq!(merged(&server, &spend(1.5)).unwrap().max_cost, Some(1.5));
        assert_eq!(merged(&server, &spend(-1.0)).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn copy_is_the_default_workspace_mode() {
        assert_eq!(workspace_mode(None, None).unwrap(), WorkspaceModeArg::Copy);
        assert_eq!(
            workspace_mode(None, Some(WorkspaceModeArg::Bind)).unwrap(),
            WorkspaceModeArg::Bind
        );
        assert_eq!(
            workspace_mode(Some("none"), Some(WorkspaceModeArg::Bind)).unwrap(),
            WorkspaceModeArg::None
        );
        assert_eq!(
            workspace_mode(Some("host"), None).unwrap_err().exit_code(),
            2
        );
    }
}
