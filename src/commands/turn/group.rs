//! `resume --group G PROMPT`: one prompt to every session of a group, in parallel.

use super::{add_config_mcp_env, check_runtime, refuse_unsupported, turn_options};
use crate::cli::{OutputFormat, ResumeArgs};
use crate::client::Client;
use crate::config::{Layer, Resolved};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::output;
use crate::session::target;
use crate::settings;

/// `resume --group G PROMPT`: every session of the group, in parallel, each with its own
/// vendor resume; one result per session.
pub(super) async fn resume_group(args: ResumeArgs, group: &str, quiet: bool) -> Result<i32> {
    let mut turn_args = args.turn.clone();
    match (&args.target, &turn_args.prompt) {
        (Some(_), Some(_)) => {
            return Err(Error::usage(
                "with --group, give only the prompt (the group names the sessions)",
            ))
        }
        (Some(p), None) => turn_args.prompt = Some(p.clone()),
        _ => {}
    }
    if turn_args.detach {
        return Err(Error::usage("--detach does not combine with --group"));
    }
    if turn_args.prompt.is_none() && turn_args.prompt_file.is_none() {
        return Err(Error::usage(
            "--group needs a PROMPT: a group's sessions cannot share one terminal",
        )
        .with_hint("resume one session in its TUI: `caw-box resume TARGET`"));
    }
    let config = Resolved::load(Layer::default(), turn_args.settings.workspace.as_deref())?;
    let options = turn_options(&turn_args, &config)?;
    let client = Client::connect().await?;
    let members: Vec<_> = target::list_sessions(client.backend())
        .await?
        .into_iter()
        .filter(|v| v.facts.group.as_deref() == Some(group))
        .collect();
    if members.is_empty() {
        return Err(
            Error::not_found(format!("no session is in group '{group}'"))
                .with_hint("start sessions with `caw-box run --group G ...`"),
        );
    }
    let mut sessions = Vec::new();
    for view in &members {
        let mut session = client.open(&view.facts.session_id.to_string()).await?;
        settings::apply_resume_overrides(session.settings_mut(), &turn_args.settings)?;
        refuse_unsupported(client.backend(), session.settings_mut())?;
        check_runtime(client.backend(), session.settings_mut()).await?;
        super::warn_if_workspace_unwritable(session.settings_mut());
        sessions.push(session);
    }
    if !quiet && turn_args.output == OutputFormat::Text {
        output::eprintln(&format!(
            "resuming {} sessions of group {group}",
            sessions.len()
        ));
    }
    let mut each = Vec::new();
    for s in &mut sessions {
        let mut options = options.clone();
        add_config_mcp_env(&mut options, &config, s.settings_mut())?;
        each.push(options);
    }
    let runs = sessions
        .iter_mut()
        .zip(each)
        .map(|(s, options)| async move {
            let id = s.id();
            (id, s.send(options, |_| {}).await)
        });
    let outcomes = futures_util::future::join_all(runs).await;
    let (exit, failed, results) = tally(outcomes);
    print_results(&results, turn_args.output);
    // Not silenced by -q ("only errors on stderr"): it is this exit's one error line.
    if exit != 0 {
        output::eprintln(&format!(
            "caw-box: error: {failed} of {} sessions of group {group} did not succeed",
            members.len()
        ));
    }
    Ok(exit)
}

/// The group's exit code (its first failure's), how many failed, and the results of the
/// turns that ran; each failure and quarantine said on stderr.
fn tally(
    outcomes: Vec<(uuid::Uuid, Result<crate::event::TurnResult>)>,
) -> (i32, usize, Vec<crate::event::TurnResult>) {
    let mut exit = 0;
    let mut failed = 0;
    let mut results = Vec::new();
    for (id, outcome) in outcomes {
        match outcome {
            Ok(r) => {
                if r.exit_code != 0 {
                    failed += 1;
                }
                if exit == 0 {
                    exit = r.exit_code;
                }
                if let Some(q) = &r.quarantined {
                    output::eprintln(&format!("{} (session {id})", q.warning()));
                }
                results.push(r);
            }
            Err(e) => {
                // A session whose turn never ran (busy, image missing) failed too.
                failed += 1;
                if exit == 0 {
                    exit = e.exit_code();
                }
                output::eprintln(&format!("caw-box: error: session {id}: {e}"));
            }
        }
    }
    (exit, failed, results)
}

/// The group's results in the output format asked for.
fn print_results(results: &[crate::event::TurnResult], format: OutputFormat) {
    match format {
        OutputFormat::Json => output::print_json(&results),
        OutputFormat::StreamJson => {
            for r in results {
                if let Ok(json) = serde_json::to_string(&Event::Result { result: r.clone() }) {
                    output::println(&json);
                }
            }
        }
        OutputFormat::Text => {
            for r in results {
                let who = r
                    .name
                    .clone()
                    .unwrap_or_else(|| r.session_id[..8].to_string());
                output::println(&format!(
                    "{who} ({}): {}: {}",
                    r.provider,
                    r.status,
                    r.result.trim()
                ));
            }
        }
    }
}
