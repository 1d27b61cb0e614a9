//! `caw-box fork TARGET [--at TURN] [-n N] [--name NAME] [--group G] [PROMPT]`: new sessions
//! from a session's checkpoint (`Client::fork` makes them), then, with a PROMPT,
//! each fork's first turn, in parallel or detached (`-d`), resumed as `resume` would.
//! Prints the forks: their ids (text), or `{"sessions":[{session_id, name, handle,
//! forked_from}]}` (`-o json`; with a turn run here, each also carries its `result`).

use serde::Serialize;

use crate::backend::Backend;
use crate::cli::{ForkArgs, OutputFormat};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::event::{Event, TurnResult};
use crate::output;
use crate::session::lifecycle::fork::ForkRequest;
use crate::session::runner::handle_of;
use crate::session::{ForkedFrom, SessionRecord};
use crate::settings;

/// One fork as `-o json` prints it.
#[derive(Debug, Serialize)]
struct Shown {
    session_id: String,
    name: Option<String>,
    handle: String,
    forked_from: ForkedFrom,
    /// Its first turn's result, when it ran here (a PROMPT without `-d`).
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<TurnResult>,
}

pub async fn fork(mut args: ForkArgs, quiet: bool) -> Result<i32> {
    let provider = match &args.provider {
        Some(p) => Some(p.parse::<crate::provider_kind::ProviderKind>()?),
        None => None,
    };
    let request = ForkRequest {
        at: args.at,
        count: args.count,
        name: args.name.clone(),
        group: args.group.clone(),
        provider,
    };
    request.check()?;
    // Everything a first turn needs is checked before a fork is made.
    // No PROMPT: the forks are made and no turn runs (never a TUI here).
    let prompt = match (&args.turn.prompt, &args.turn.prompt_file) {
        (None, None) => None,
        _ => settings::resolve_prompt(&args.turn)?,
    };
    if prompt.is_none() && args.turn.detach {
        return Err(Error::usage(
            "--detach needs a PROMPT: the forks' first turn is what runs detached",
        ));
    }
    if let Some(endpoint) = &args.turn.settings.endpoint {
        settings::validate_endpoint(endpoint, "--endpoint")?;
    }
    let park = fork_parks(&args.turn)?;
    // Read once (stdin or a file), given to every fork's turn.
    args.turn.prompt = prompt.clone();
    args.turn.prompt_file = None;
    let client = Client::connect().await?;
    let forks = client.fork(&args.target, &request).await?;
    let scope = client.backend().capabilities().scope.clone();
    let from = forks.forked_from;
    if let Some(dir) = &forks.workspace_copied_from {
        if !quiet {
            output::eprintln(&format!(
                "session {} has a bind-mode workspace, which no checkpoint holds: each fork's \
                 workspace is a copy of {dir} as it is now, not as it was at turn {}",
                from.session, from.turn
            ));
        }
    }
    if !quiet && args.turn.output == OutputFormat::Text {
        output::eprintln(&format!(
            "forked session {} at the end of turn {} into {} session{}",
            from.session,
            from.turn,
            forks.sessions.len(),
            if forks.sessions.len() == 1 { "" } else { "s" }
        ));
    }
    let handed_over = forks.sessions.first().filter(|r| r.settings.handoff);
    if let (Some(r), false) = (handed_over, quiet) {
        output::eprintln(&format!(
            "{} cannot resume a conversation of another vendor's CLI: each fork's first turn \
             gets a handoff (the prompts and answers up to turn {}, the files changed) ahead \
             of its prompt; the workspace is the checkpoint's",
            r.provider, from.turn
        ));
    }
    let mut shown: Vec<Shown> = forks
        .sessions
        .iter()
        .map(|r| Shown {
            session_id: r.session_id.to_string(),
            name: r.name.clone(),
            handle: handle_of(r, &scope).to_json(),
            forked_from: from,
            result: None,
        })
        .collect();
    let mut exit = 0;
    if prompt.is_some() {
        exit = first_turns(&args, park, &forks.sessions, &mut shown).await?;
    }
    print(&shown, args.turn.output);
    Ok(exit)
}

/// `fork --on-limit`: `park` or `fail` (what the forks' turns do at a usage limit, remembered
/// by each fork); `None` when not given. `wait`, `fallback` and `--max-wait` are one
/// foreground session's, not a family's.
fn fork_parks(turn: &crate::cli::TurnArgs) -> Result<Option<bool>> {
    if turn.max_wait.is_some() {
        return Err(Error::usage(
            "fork takes no --max-wait: --on-limit wait is one session's",
        ));
    }
    crate::session::limits::parks(turn.on_limit.as_deref(), || {
        Error::usage("fork takes --on-limit fail or park")
            .with_hint("park: a fork stopped by its account's usage limit goes on when it resets")
    })
}

/// Each fork's first turn: detached, or run here in parallel; the first failure's exit code.
async fn first_turns(
    args: &ForkArgs,
    park: Option<bool>,
    sessions: &[SessionRecord],
    shown: &mut [Shown],
) -> Result<i32> {
    let mut turns = Vec::new();
    for r in sessions {
        let mut t = super::turn::open_session(&r.session_id.to_string(), &args.turn).await?;
        if let Some(park) = park {
            t.session.settings_mut().park = park;
        }
        turns.push(t);
    }
    if args.turn.detach {
        for t in &mut turns {
            t.session.start_detached(&t.options).await?;
        }
        return Ok(0);
    }
    let runs = turns.iter_mut().map(|t| async move {
        let options = t.options.clone();
        t.session.send(options, |_: &Event| {}).await
    });
    let mut exit = 0;
    for (outcome, s) in futures_util::future::join_all(runs)
        .await
        .into_iter()
        .zip(shown.iter_mut())
    {
        match outcome {
            Ok(result) => {
                if exit == 0 {
                    exit = result.exit_code;
                }
                if let Some(q) = &result.quarantined {
                    output::eprintln(&format!("{} (session {})", q.warning(), s.session_id));
                }
                s.result = Some(result);
            }
            Err(e) => {
                if exit == 0 {
                    exit = e.exit_code();
                }
                output::eprintln(&format!("caw-box: error: fork {}: {e}", s.session_id));
            }
        }
    }
    Ok(exit)
}

fn print(shown: &[Shown], format: OutputFormat) {
    match format {
        OutputFormat::Json | OutputFormat::StreamJson => {
            #[derive(Serialize)]
            struct Sessions<'a> {
                sessions: &'a [Shown],
            }
            output::print_json(&Sessions { sessions: shown });
        }
        OutputFormat::Text => {
            for s in shown {
                let mut line = s.session_id.clone();
                if let Some(name) = &s.name {
                    line.push_str(&format!("  {name}"));
                }
                if let Some(r) = &s.result {
                    line.push_str(&format!("  {}: {}", r.status, r.result.trim()));
                }
                output::println(&line);
            }
        }
    }
}
