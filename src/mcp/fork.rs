//! `fork`: new sessions from one of this server's sessions at a finished turn
//! ([`crate::Client::fork`]), so that best-of-N can start from a common prefix: one session
//! reads the repository and plans, then three forks implement. The forks are made by this
//! server and so carry its scope (`list`, `wait`, `diff`, `apply`, `remove` take them).
//!
//! A tool call narrows the server's walls, never widens them: only a session of the scope is
//! forked (one outside it is not found, as for `reply`); with a prompt, each fork's first turn
//! starts as `reply` starts one ([`CallTurn`]: the same ceilings, prompt cap, budget share and
//! queue), checked on the source before any fork is made. A fork in another vendor's CLI
//! (`provider`, as `caw-box fork --provider`) is checked against the server's ceilings for
//! that CLI, with the settings the fork will have (that CLI's image, its default model).

use serde_json::{json, Value};

use super::args::{ForkArgs, Overrides};
use super::budget::Grant;
use super::turns::{self, CallTurn};
use super::Defaults;
use crate::backend::{Backend, Scope};
use crate::client::Client;
use crate::commands::turn::NewTurn;
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::session::lifecycle::fork::{ForkRequest, MAX_FORKS};
use crate::session::runner::handle_of;
use crate::session::{SessionRecord, SessionSettings};

/// `fork`: `n` forks of a session at a finished turn, each with its first turn running in
/// the background when the call gives a prompt.
pub async fn fork(defaults: &Defaults, a: ForkArgs) -> Result<Value> {
    let policy = &defaults.policy;
    let n = a.n.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&n) {
        return Err(Error::usage(format!("n must be 1 to {MAX_FORKS}, not {n}")));
    }
    if a.at_turn == Some(0) {
        return Err(Error::usage("at_turn 0 names no turn: turns count from 1")
            .with_hint("at_turn 1 is the session as its first turn left it"));
    }
    if a.prompt.is_none() && a.overrides != Overrides::default() {
        return Err(Error::usage(
            "the settings of a fork's first turn need its prompt: give `prompt`",
        ));
    }
    let client = Client::connect().await?;
    let wanted: Option<ProviderKind> = a.provider.as_deref().map(str::parse).transpose()?;
    let view = turns::scoped(&client, policy, &a.session).await?;
    let source = view.facts.session_id.to_string();
    let handoff = wanted.filter(|p| *p != view.facts.provider);
    let provider = handoff.unwrap_or(view.facts.provider);
    turns::refuse_busy(defaults, &client, view.facts.session_id).await?;
    let record = view.record();
    // Everything the forks' first turns would be refused for is refused before a fork is
    // made: the source opened as each fork will be (a fork has its source's settings), or,
    // in another vendor's CLI, the settings the fork will have checked for that CLI.
    let first = match (&a.prompt, handoff) {
        (Some(prompt), None) => {
            let call = CallTurn::read(policy, &a.overrides, provider)?;
            call.open(defaults, &source, provider, prompt, None).await?;
            Some((call, prompt.as_str()))
        }
        (Some(prompt), Some(p)) => {
            let call = CallTurn::read(policy, &a.overrides, p)?;
            policy.admit(p, &handed_off(&record.settings, p), &[])?;
            Some((call, prompt.as_str()))
        }
        (None, _) => {
            let settings = match handoff {
                Some(p) => handed_off(&record.settings, p),
                None => record.settings.clone(),
            };
            policy.admit(provider, &settings, &[])?;
            None
        }
    };
    // Inherited turns cost a fork nothing: each starts at zero spent.
    let mut grant = match &first {
        Some((call, _)) => {
            let own = call.own_limit(&record.settings);
            turns::grant(defaults, &client, 0.0, n, own).await?
        }
        None => None,
    };
    let group = turns::group_of(a.group.as_deref(), n);
    let request = ForkRequest {
        at: a.at_turn,
        count: n,
        name: a.name.clone(),
        group: group.clone(),
        provider: handoff,
    };
    let forks = client.fork(&source, &request).await?;
    let from = json!(forks.forked_from);
    let scope = client.backend().capabilities().scope.clone();
    let mut sessions: Vec<Value> = match first {
        None => forks.sessions.iter().map(|r| made(r, &scope)).collect(),
        Some((call, prompt)) => {
            let limit = grant.as_ref().map(Grant::limit);
            let starts = forks
                .sessions
                .iter()
                .map(|r| first_turn(defaults, &call, r, provider, prompt, limit));
            let outcomes = futures_util::future::join_all(starts).await;
            let mut shown = Vec::new();
            for (outcome, r) in outcomes.into_iter().zip(&forks.sessions) {
                shown.push(match outcome {
                    Ok(started) => {
                        if let Some(g) = &mut grant {
                            g.keep(r.session_id);
                        }
                        started
                    }
                    // The fork stays, a whole session: a `reply` gives it its turn.
                    Err(e) => {
                        let mut v = made(r, &scope);
                        v["error"] = json!(e.report());
                        v
                    }
                });
            }
            shown
        }
    };
    drop(grant);
    for s in &mut sessions {
        s["forked_from"] = from.clone();
    }
    let mut answer = json!({ "group": group, "sessions": sessions });
    if let Some(dir) = forks.workspace_copied_from {
        // A bind-mode source's directory, which no checkpoint holds: copied as it is now.
        answer["workspace_copied_from"] = json!(dir);
    }
    Ok(answer)
}

/// The settings a fork of a session with `settings` has in `provider`'s CLI
/// (`lifecycle::fork`): that CLI's image and default model, the rest the session's.
fn handed_off(settings: &SessionSettings, provider: ProviderKind) -> SessionSettings {
    let mut s = settings.clone();
    s.image = provider.default_image();
    s.model = None;
    s.handoff = true;
    s
}

/// A fork as made, before (or without) its first turn.
fn made(r: &SessionRecord, scope: &Scope) -> Value {
    json!({
        "session_id": r.session_id.to_string(),
        "name": r.name,
        "group": r.group,
        "provider": r.provider.to_string(),
        "handle": handle_of(r, scope).to_json(),
    })
}

/// A fork's first turn, started (or queued) as `reply` starts a turn.
async fn first_turn(
    defaults: &Defaults,
    call: &CallTurn,
    fork: &SessionRecord,
    provider: ProviderKind,
    prompt: &str,
    limit: Option<f64>,
) -> Result<Value> {
    let NewTurn {
        client,
        session,
        options,
    } = call
        .open(
            defaults,
            &fork.session_id.to_string(),
            provider,
            prompt,
            limit,
        )
        .await?;
    let queued =
        turns::start_or_queue(defaults.queue.as_ref(), &client, &session, &options, false).await?;
    Ok(turns::started(
        &session,
        session.record().next_turn(),
        queued,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::SettingsArgs;
    use crate::mcp::policy::{Policy, PolicyArgs};

    fn defaults() -> Defaults {
        let dir = std::env::current_dir().unwrap();
        let settings = SettingsArgs::default();
        let policy = Policy::new(PolicyArgs {
            park: false,
            settings: &settings,
            env: &[],
            workspace_roots: &[dir],
            allow_bind: false,
            scope: None,
        })
        .unwrap();
        Defaults {
            settings,
            env: Vec::new(),
            policy: std::sync::Arc::new(policy),
            queue: None,
            budget: None,
            shutdown: Default::default(),
            pool: None,
        }
    }

    fn args(json: Value) -> ForkArgs {
        serde_json::from_value(json).unwrap()
    }

    /// What no session could satisfy is refused before the backend is asked (no Docker
    /// here): `n` outside 1..=8, `at_turn: 0`, a first turn's settings without its prompt, an
    /// unknown provider.
    #[tokio::test(flavor = "current_thread")]
    async fn a_bad_count_turn_or_settings_without_a_prompt_are_refused_first() {
        let d = defaults();
        for (call, says) in [
            (json!({"session": "s", "n": 0}), "n must be 1 to 8, not 0"),
            (json!({"session": "s", "n": 9, "prompt": "hi"}), "not 9"),
            (json!({"session": "s", "at_turn": 0}), "at_turn 0"),
            (json!({"session": "s", "model": "m"}), "give `prompt`"),
            (json!({"session": "s", "provider": "nope"}), "nope"),
        ] {
            let e = fork(&d, args(call.clone())).await.unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Usage, "{call}: {e}");
            assert!(e.to_string().contains(says), "{call}: {e}");
        }
    }
}
