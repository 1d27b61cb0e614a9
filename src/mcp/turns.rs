//! The tools that start, stop and wait for turns: `start`, `reply`, `cancel`, `wait`; what
//! `fork` shares with `reply` (a call's turn of an existing session: [`CallTurn`]).
//! Each turn runs in a background `caw-box __drive` process ([`Session::start_detached`]),
//! as `run -d` does, so the server returns at once and holds nothing a later server needs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};

use std::sync::Arc;

use super::budget::Grant;
use super::policy::Policy;
use super::queue::Queue;
use super::read;
use super::{Defaults, Progress};
use crate::agent_config::ToolPolicy;
use crate::cli::{RunArgs, SettingsArgs, TurnArgs, WorkspaceModeArg};
use crate::client::{Client, Session};
use crate::commands::turn::{new_session_admitted, open_session, Admit, NewTurn};
use crate::error::{Error, Result};
use crate::event::Status;
use crate::mcp::args::{Overrides, ReplyArgs, StartArgs, WaitArgs};
use crate::provider::ProviderKind;
use crate::session::record::{EgressPolicy, SessionSettings};
use crate::session::runner::TurnOptions;
use crate::session::target::{self, SessionView};
use uuid::Uuid;

/// The most sessions one `start` makes.
const MAX_N: u32 = 8;

/// The most sessions one `wait` takes.
const MAX_WAIT: usize = 64;

/// How long `cancel` waits for the stopped turn to be recorded before it answers (the stop
/// goes on in the background after that).
const CANCEL_WITHIN: Duration = Duration::from_secs(9);

/// How often `wait` reports progress (the contract: at least every 10 s).
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The server's flags with a tool call's overrides on top, each checked against the server's
/// ceilings first (`forbidden` for one wider than the server's): `allow_host` replaces the
/// server's list (within it), the others replace its values (at most them). The system
/// prompts are not among them: [`CallPrompts`] adds them to the server's.
fn call_flags(
    policy: &Policy,
    base: &SettingsArgs,
    o: &Overrides,
    provider: ProviderKind,
) -> Result<SettingsArgs> {
    let c = &policy.ceilings;
    let mut s = base.clone();
    if let Some(usd) = o.max_cost_usd {
        crate::settings::check_max_cost(usd, "max_cost_usd")?;
        c.max_cost(Some(usd))?;
        s.max_cost = Some(usd);
    }
    if let Some(effort) = &o.effort {
        crate::agent_config::Effort::parse(effort, "effort")?;
        s.effort = Some(effort.clone());
    }
    if let Some(tools) = &o.tools {
        let server = c.server.tools.clone().unwrap_or_default();
        let groups = ToolPolicy::parse_groups(tools, "tools")?;
        c.tools(Some(&ToolPolicy { groups, ..server }))?;
        s.tools = Some(tools.clone());
    }
    if let Some(runtime) = &o.runtime {
        c.runtime(crate::settings::parse_runtime(runtime, "runtime")?.as_deref())?;
        s.runtime = Some(runtime.clone());
    }
    if let Some(warm) = &o.keep_warm {
        c.keep_warm(crate::settings::parse_limit(warm, "keep_warm")?)?;
        s.keep_warm = Some(warm.clone());
    }
    if let Some(t) = &o.timeout {
        let secs = crate::settings::parse_duration(t, "timeout")?
            .as_secs()
            .max(1);
        c.timeout(Some(secs))?;
        s.timeout = Some(t.clone());
    }
    if let Some(m) = &o.memory {
        c.memory(Some(crate::settings::parse_memory(m, "memory")?))?;
        s.memory = Some(m.clone());
    }
    if let Some(cpus) = o.cpus {
        crate::settings::check_cpus(cpus, "cpus")?;
        c.cpus(Some(cpus))?;
        s.cpus = Some(cpus);
    }
    if let Some(hosts) = &o.allow_host {
        if hosts.is_empty() {
            return Err(Error::usage("allow_host is empty")
                .with_hint("name at least one host, e.g. [\"@provider\"], or leave it out"));
        }
        for h in hosts {
            crate::settings::validate_allow_host(h, "allow_host")?;
        }
        c.hosts(provider, hosts)?;
        s.allow_host = hosts.clone();
    }
    if let Some(policy) = &o.egress {
        c.egress(EgressPolicy::parse(policy, "egress")?)?;
        s.egress = Some(policy.clone());
    }
    if let Some(model) = &o.model {
        s.model = Some(model.clone());
    }
    Ok(s)
}

/// A call's system prompts, read (an `@FILE` only under a workspace root) before anything
/// is made, and added to the server's when the turn's settings are known.
#[derive(Debug, Clone, Default)]
struct CallPrompts {
    system: Option<String>,
    append: Option<String>,
}

impl CallPrompts {
    fn read(policy: &Policy, o: &Overrides) -> Result<CallPrompts> {
        let read =
            |v: &Option<String>, what| v.as_deref().map(|v| policy.prompt_arg(v, what)).transpose();
        Ok(CallPrompts {
            system: read(&o.system_prompt, "system_prompt")?,
            append: read(&o.append_system_prompt, "append_system_prompt")?,
        })
    }

    /// The prompts added to `settings`, then every wall of the server checked on what the
    /// turn will run with.
    fn admit(
        &self,
        policy: &Policy,
        provider: ProviderKind,
        settings: &mut SessionSettings,
        options: &TurnOptions,
    ) -> Result<()> {
        policy.compose_prompts(settings, self.system.clone(), self.append.clone());
        // The server's, whatever the session remembered.
        settings.park = policy.parks();
        let env: Vec<String> = options.env.iter().map(|(k, _)| k.clone()).collect();
        policy.admit(provider, settings, &env)
    }
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
        Some(other) => {
            return Err(Error::usage(format!(
                "workspace_mode '{other}' is not one of copy, bind, none"
            )))
        }
    })
}

/// What `start`, `reply` and `fork` say of a turn they started (or queued).
pub(super) fn started(session: &Session, turn: u32, queued: bool) -> Value {
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

/// The group of `n` sessions one call makes: the one asked for; for more than one, a new
/// group when none was asked for (so that `list` and `wait` find them together).
pub(super) fn group_of(asked: Option<&str>, n: u32) -> Option<String> {
    match (asked, n) {
        (Some(g), _) => Some(g.to_string()),
        (None, 1) => None,
        (None, _) => Some(format!(
            "best-of-{}",
            &Uuid::new_v4().simple().to_string()[..8]
        )),
    }
}

/// `start`: n new sessions, each with its first turn running in the background.
pub async fn start(defaults: &Defaults, a: StartArgs) -> Result<Value> {
    let policy = &defaults.policy;
    let n = a.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(Error::usage(format!("n must be 1 to {MAX_N}, not {n}")));
    }
    let provider: ProviderKind = a.provider.parse()?;
    let mut settings = call_flags(policy, &defaults.settings, &a.overrides, provider)?;
    let mode = workspace_mode(
        a.workspace_mode.as_deref(),
        defaults.settings.workspace_mode,
    )?;
    if a.workspace_mode.is_some() {
        policy.workspace_mode(mode)?;
    }
    settings.workspace_mode = Some(mode);
    if let Some(w) = &a.workspace {
        settings.workspace = Some(policy.workspace(w)?);
    }
    let prompts = CallPrompts::read(policy, &a.overrides)?;
    let group = group_of(a.group.as_deref(), n);
    let name = |i: u32| match (&a.name, n) {
        (Some(name), 1) => Some(name.clone()),
        (Some(name), _) => Some(format!("{name}-{i}")),
        (None, _) => None,
    };
    let client = match &defaults.budget {
        Some(_) => Some(Client::connect().await?),
        None => None,
    };
    let own_limit = settings.max_cost.or(policy.ceilings.server.max_cost_usd);
    let mut grant = match (&defaults.budget, &client) {
        (Some(b), Some(c)) => Some(
            b.grant(c, &|id| defaults.queued(id), 0.0, n, own_limit)
                .await?,
        ),
        _ => None,
    };
    if let Some(g) = &grant {
        settings.max_cost = Some(g.limit());
    }
    let admit =
        |provider, s: &mut SessionSettings, o: &TurnOptions| prompts.admit(policy, provider, s, o);
    let mut runs = Vec::new();
    for i in 1..=n {
        let args = RunArgs {
            provider: Some(a.provider.clone()),
            name: name(i),
            group: group.clone(),
            user_config: false,
            turn: turn_args(defaults, settings.clone(), &a.prompt)?,
        };
        runs.push(start_one(args, defaults, &admit));
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
pub(super) async fn start_or_queue(
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

async fn start_one(mut args: RunArgs, defaults: &Defaults, admit: &Admit<'_>) -> Result<Value> {
    let NewTurn {
        client,
        session,
        options,
    } = new_session_admitted(&mut args, true, &|_| {}, admit).await?;
    if let Some((size, made)) = &defaults.pool {
        let r = session.record();
        super::keep_pool(client.backend(), r.provider, &r.settings, *size, made);
    }
    let queue = defaults.queue.as_ref();
    match start_or_queue(queue, &client, &session, &options, true).await {
        Ok(queued) => Ok(started(&session, 1, queued)),
        Err(e) => {
            session.discard_unless_recorded().await;
            Err(e)
        }
    }
}

/// `reply`: the session's next turn, in the background.
pub async fn reply(defaults: &Defaults, a: ReplyArgs) -> Result<Value> {
    let client = Client::connect().await?;
    let view = scoped(&client, &defaults.policy, &a.session).await?;
    let id = view.facts.session_id;
    let provider = view.facts.provider;
    refuse_busy(defaults, &client, id).await?;
    let call = CallTurn::read(&defaults.policy, &a.overrides, provider)?;
    let record = view.record();
    let spent = record.total_cost_usd().unwrap_or(0.0);
    let own = call.own_limit(&record.settings);
    let mut grant = grant(defaults, &client, spent, 1, own).await?;
    let limit = grant.as_ref().map(Grant::limit);
    let NewTurn {
        client,
        session,
        options,
    } = call
        .open(defaults, &id.to_string(), provider, &a.prompt, limit)
        .await?;
    let queued =
        start_or_queue(defaults.queue.as_ref(), &client, &session, &options, false).await?;
    if let Some(g) = &mut grant {
        g.keep(id);
    }
    Ok(started(&session, session.record().next_turn(), queued))
}

/// `reply`'s refusal of a session whose turn runs, or waits in this server's queue.
pub(super) async fn refuse_busy(defaults: &Defaults, client: &Client, id: Uuid) -> Result<()> {
    if let Some(turn) = client.running().await?.get(&id).copied() {
        return Err(
            Error::busy(format!("session {id} is busy: it is running turn {turn}"))
                .with_hint("`wait` for it, or `cancel` it"),
        );
    }
    if defaults.queued(id) {
        return Err(
            Error::busy(format!("session {id} is busy: it has a turn queued"))
                .with_hint("`wait` for it"),
        );
    }
    Ok(())
}

/// The share of the server's `--max-cost-usd` (when it has one) for the next turn of each of
/// `n` sessions that have spent `spent`, `own` the limit asked for; refused (`budget`) when
/// nothing is left.
pub(super) async fn grant<'a>(
    defaults: &'a Defaults,
    client: &Client,
    spent: f64,
    n: u32,
    own: Option<f64>,
) -> Result<Option<Grant<'a>>> {
    match &defaults.budget {
        Some(b) => Ok(Some(
            b.grant(client, &|id| defaults.queued(id), spent, n, own)
                .await?,
        )),
        None => Ok(None),
    }
}

/// A call's turn of an existing session (`reply`'s, and each fork's first): its settings
/// flags checked against the server's ceilings and its system prompts read, before anything
/// is looked up or made.
pub(super) struct CallTurn {
    settings: SettingsArgs,
    prompts: CallPrompts,
}

impl CallTurn {
    pub(super) fn read(policy: &Policy, o: &Overrides, provider: ProviderKind) -> Result<Self> {
        Ok(CallTurn {
            settings: call_flags(policy, &SettingsArgs::default(), o, provider)?,
            prompts: CallPrompts::read(policy, o)?,
        })
    }

    /// The spend limit the call asked for, else the session's own (`session`: its settings).
    pub(super) fn own_limit(&self, session: &SessionSettings) -> Option<f64> {
        self.settings.max_cost.or(session.max_cost_usd)
    }

    /// The session `target` names opened for this turn with `prompt` (`limit`: the spend
    /// limit its budget grant gives), as `resume` opens it, and every wall of the server
    /// checked on what the turn will run with. Nothing is started or made.
    pub(super) async fn open(
        &self,
        defaults: &Defaults,
        target: &str,
        provider: ProviderKind,
        prompt: &str,
        limit: Option<f64>,
    ) -> Result<NewTurn> {
        let mut settings = self.settings.clone();
        if limit.is_some() {
            settings.max_cost = limit;
        }
        let turn = turn_args(defaults, settings, prompt)?;
        let mut t = open_session(target, &turn).await?;
        self.prompts.admit(
            &defaults.policy,
            provider,
            t.session.settings_mut(),
            &t.options,
        )?;
        Ok(t)
    }
}

/// The session `target` names among this server's scope: one outside it is not found.
pub async fn scoped(client: &Client, policy: &Policy, target: &str) -> Result<SessionView> {
    target::resolve_view_in(client.backend(), target, Some(&policy.scope)).await
}

/// `cancel`: stops the running turn; answers within [`CANCEL_WITHIN`] (the stop goes on
/// in the background when the turn takes longer to be recorded).
pub async fn cancel(policy: &Policy, target: &str) -> Result<Value> {
    let client = Client::connect().await?;
    let id = scoped(&client, policy, target).await?.facts.session_id;
    let turn = client.running().await?.get(&id).copied();
    // A task of its own: it goes on stopping after this call answered.
    let stopping = tokio::spawn({
        let client = client.clone();
        async move { client.stop(&id.to_string()).await }
    });
    let stopping = async move {
        stopping
            .await
            .unwrap_or_else(|e| Err(Error::environment(format!("stopping the turn failed: {e}"))))
    };
    match tokio::time::timeout(CANCEL_WITHIN, stopping).await {
        Ok(Ok((_, stopped))) => Ok(json!({
            "session_id": id.to_string(),
            "turn": turn,
            "status": match stopped {
                crate::Stopped::Turn => Status::Interrupted.to_string(),
                                crate::Stopped::Warm => "idle".to_string(),
                crate::Stopped::Queued => Status::Interrupted.to_string(),
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

/// `wait`'s mode (`true`: any) and time limit, checked.
fn wait_args(a: &WaitArgs) -> Result<(bool, Duration)> {
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
    if a.sessions.len() > MAX_WAIT {
        return Err(Error::usage(format!(
            "wait takes at most {MAX_WAIT} sessions, not {}",
            a.sessions.len()
        ))
        .with_hint("wait for them in batches"));
    }
    Ok((
        any,
        Duration::from_secs(a.timeout_s.unwrap_or(300).clamp(1, 3600)),
    ))
}

/// `wait`: until every (or any) session's turn ended, or the timeout; progress on the way.
/// A call the client cancels (or leaves) is dropped, which ends the wait.
pub async fn wait(
    policy: &Policy,
    a: WaitArgs,
    queue: Option<Arc<Queue>>,
    progress: Progress,
) -> Result<Value> {
    let (any, timeout) = wait_args(&a)?;
    let client = Client::connect().await?;
    // Every target resolved first: one unknown session is refused before any wait.
    let mut ids = Vec::new();
    for t in &a.sessions {
        let id = scoped(&client, policy, t).await?.facts.session_id;
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
    use crate::mcp::policy::PolicyArgs;

    fn policy(server: &SettingsArgs) -> Policy {
        let dir = std::env::current_dir().unwrap();
        Policy::new(PolicyArgs {
            park: false,
            settings: server,
            env: &[],
            workspace_roots: &[dir],
            allow_bind: false,
            scope: None,
        })
        .unwrap()
    }

    #[test]
    fn a_call_narrows_the_servers_flags_and_may_not_widen_them() {
        let server = SettingsArgs {
            model: Some("server-model".into()),
            timeout: Some("1h".into()),
            allow_host: vec!["@provider".into(), "docs.example.com".into()],
            runtime: Some("runsc".into()),
            ..Default::default()
        };
        let p = policy(&server);
        let call = Overrides {
            model: Some("call-model".into()),
            allow_host: Some(vec!["docs.example.com".into()]),
            timeout: Some("10m".into()),
            ..Default::default()
        };
        let s = call_flags(&p, &server, &call, ProviderKind::Codex).unwrap();
        assert_eq!(s.model.as_deref(), Some("call-model"));
        assert_eq!(s.timeout.as_deref(), Some("10m"));
        // Replaced, not added to: the call's list is the session's.
        assert_eq!(s.allow_host, ["docs.example.com"]);
        let refused = |o: Overrides, names: &str| {
            let e = call_flags(&p, &server, &o, ProviderKind::Codex).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Forbidden, "{e}");
            assert!(e.to_string().contains(names), "{e} lacks {names}");
        };
        refused(
            Overrides {
                allow_host: Some(vec!["anything.example".into()]),
                ..Default::default()
            },
            "--allow-host anything.example",
        );
        refused(
            Overrides {
                runtime: Some("runc".into()),
                ..Default::default()
            },
            "--runtime runsc",
        );
        refused(
            Overrides {
                timeout: Some("2h".into()),
                ..Default::default()
            },
            "--timeout",
        );
        refused(
            Overrides {
                keep_warm: Some("5m".into()),
                ..Default::default()
            },
            "--keep-warm",
        );
        let bad = call_flags(
            &p,
            &server,
            &Overrides {
                max_cost_usd: Some(-1.0),
                ..Default::default()
            },
            ProviderKind::Codex,
        );
        assert_eq!(bad.unwrap_err().exit_code(), 2);
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
        for bad in ["host", "auto"] {
            assert_eq!(workspace_mode(Some(bad), None).unwrap_err().exit_code(), 2);
        }
    }
}
