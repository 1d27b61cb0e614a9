//! `run`, `resume` and `handle`: start a session, continue one, print its handle.

use crate::cli::{ResumeArgs, RunArgs, TurnArgs};
use crate::client::{Client, NewSession};
use crate::error::Result;
use crate::event::TurnResult;
use crate::output::{self, Printer};
use crate::provider::ProviderKind;
use crate::session::runner::{self, TurnOptions};
use crate::settings;

/// Everything about a turn that can be checked before Docker is touched.
fn turn_options(args: &TurnArgs) -> Result<TurnOptions> {
    let prompt = settings::resolve_prompt(args)?.unwrap_or_default();
    let env = settings::resolve_env(&args.env)?;
    let timeout = args
        .timeout
        .as_deref()
        .map(|t| settings::parse_duration(t, "--timeout"))
        .transpose()?;
    Ok(TurnOptions {
        prompt,
        env,
        timeout,
    })
}

pub async fn run(args: RunArgs, quiet: bool, verbose: bool) -> Result<i32> {
    let provider: ProviderKind = args.provider.parse()?;
    if let Some(name) = &args.name {
        settings::validate_name(name, "--name")?;
    }
    if let Some(group) = &args.group {
        settings::validate_name(group, "--group")?;
    }
    let session_settings = settings::new_session_settings(provider, &args.turn)?;
    let options = turn_options(&args.turn)?;
    let mut printer = Printer::new(args.turn.output, quiet, verbose);

    let client = Client::connect().await?;
    let mut session = client
        .start_session(NewSession {
            provider,
            name: args.name.clone(),
            group: args.group.clone(),
            settings: session_settings,
        })
        .await?;
    printer.progress(&format!("started {provider} session {}", session.id()));
    match session.send(options, |e| printer.event(e)).await {
        Ok(result) => finish(&result),
        Err(e) => {
            // The first turn never ran: take the session back, so nothing half-made stays.
            let _ = session.discard_if_unused().await;
            Err(e)
        }
    }
}

pub async fn resume(args: ResumeArgs, quiet: bool, verbose: bool) -> Result<i32> {
    let options = turn_options(&args.turn)?;
    let mut printer = Printer::new(args.turn.output, quiet, verbose);
    let client = Client::connect().await?;
    let mut session = client.open(&args.target).await?;
    settings::apply_overrides(session.settings_mut(), &args.turn)?;
    printer.progress(&format!(
        "resuming {} session {} (turn {})",
        session.record().provider,
        session.id(),
        session.record().next_turn()
    ));
    let result = session.send(options, |e| printer.event(e)).await?;
    finish(&result)
}

fn finish(result: &TurnResult) -> Result<i32> {
    match runner::turn_error(result) {
        None => Ok(0),
        Some(e) => Err(e),
    }
}

pub async fn handle(target: &str) -> Result<i32> {
    let client = Client::connect().await?;
    let session = client.open(target).await?;
    if session.record().resume_key.is_empty() {
        return Err(crate::Error::usage(format!(
            "session {} has no vendor conversation yet (its first turn never started one)",
            session.id()
        ))
        .with_hint(format!(
            "run a turn: `caw-box resume {} PROMPT`",
            session.id()
        )));
    }
    output::println(&session.handle().to_json());
    Ok(0)
}
