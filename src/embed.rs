//! For programs that embed caw-box (the Python package `caw_box`): sessions started and
//! resumed with the command line's own flags, resolved exactly as `caw-box run` and
//! `caw-box resume` resolve them (config files, `CAW_BOX_*` variables, the same checks, in
//! the same order), forks of a session, a turn started detached, and what `ls --json` and
//! `auth status --json` print, as values.
//!
//! Not a second settings resolution: the flags go through the command line's parser and the
//! commands' own steps ([`crate::commands::turn::new_session`]). Nothing here prints.

use clap::Parser;

use crate::cli::{ResumeArgs, RunArgs, TurnArgs};
use crate::client::{Client, Session};
use crate::commands::turn::NewTurn;
use crate::error::{Error, Result};
use crate::session::lifecycle::fork::ForkRequest;
use crate::session::runner::TurnOptions;

/// A session ready for a turn and the options its turns are sent with (the prompt aside:
/// each turn sets its own).
#[derive(Debug)]
pub struct Prepared {
    pub client: Client,
    pub session: Session,
    pub options: TurnOptions,
}

impl From<NewTurn> for Prepared {
    fn from(t: NewTurn) -> Self {
        Prepared {
            client: t.client,
            session: t.session,
            options: t.options,
        }
    }
}

/// `caw-box run`'s flags (no prompt) as clap parses them.
#[derive(Debug, Parser)]
#[command(no_binary_name = true)]
struct RunFlags {
    #[command(flatten)]
    run: RunArgs,
}

/// `caw-box resume`'s flags (no target, no prompt).
#[derive(Debug, Parser)]
#[command(no_binary_name = true)]
struct ResumeFlags {
    #[command(flatten)]
    resume: ResumeArgs,
}

/// The prompt a turn's flags are checked with; each turn sends its own.
const PLACEHOLDER_PROMPT: &str = "(set per turn)";

fn parse<P: Parser>(flags: &[String]) -> Result<P> {
    P::try_parse_from(flags).map_err(|e| {
        let text = e.render().to_string();
        let line = text.lines().next().unwrap_or("bad flags").trim();
        Error::usage(line.trim_start_matches("error: ").to_string())
            .with_hint("the keyword arguments are `caw-box run`'s flags: `caw-box run --help`")
    })
}

/// The turn flags' checks need a prompt; the caller's turns give theirs.
fn with_placeholder(turn: &mut TurnArgs) {
    turn.prompt = Some(PLACEHOLDER_PROMPT.to_string());
    turn.prompt_file = None;
}

/// A new session, as `caw-box run FLAGS` makes it before its first turn (`flags` are `run`'s,
/// e.g. `["--provider", "codex", "--model=gpt-5.5"]`); `progress` hears what was decided
/// on the way (a model discovered).
pub async fn start(flags: &[String], progress: &(dyn Fn(&str) + Sync)) -> Result<Prepared> {
    let mut args = parse::<RunFlags>(flags)?.run;
    with_placeholder(&mut args.turn);
    let park = session_park(&args.turn)?;
    let mut t = crate::commands::turn::new_session(&mut args, true, progress).await?;
    if let Some(park) = park {
        t.session.settings_mut().park = park;
    }
    Ok(t.into())
}

/// `--on-limit` as a library session takes it: `park` (or `fail`), the session's own,
/// remembered; `wait`, `fallback`, `--max-wait` and `--detach` are per turn here.
fn session_park(turn: &TurnArgs) -> Result<Option<bool>> {
    let per_turn = || {
        Error::usage("--detach, --on-limit wait|fallback and --max-wait are per turn here, not the session's")
            .with_hint("on_limit=\"park\" is the session's: a turn stopped by its account's usage limit goes on when it resets")
    };
    if turn.detach || turn.max_wait.is_some() {
        return Err(per_turn());
    }
    crate::session::limits::parks(turn.on_limit.as_deref(), per_turn)
}

/// The session `target` (a handle, id, unique prefix or name) opened as `caw-box resume
/// TARGET FLAGS` opens it: `flags` override its remembered settings.
pub async fn resume(target: &str, flags: &[String]) -> Result<Prepared> {
    let mut args = parse::<ResumeFlags>(flags)?.resume;
    with_placeholder(&mut args.turn);
    if args.group.is_some() || args.target.is_some() {
        return Err(Error::usage(
            "resume one session: give its target, no --group",
        ));
    }
    let park = session_park(&args.turn)?;
    let mut t = crate::commands::turn::open_session(target, &args.turn).await?;
    if let Some(park) = park {
        t.session.settings_mut().park = park;
    }
    Ok(t.into())
}

/// `caw-box fork TARGET` ([`Client::fork`]: `request` says at which turn, how many, their
/// name and group), each fork opened as [`resume`] opens a session with `flags` (`resume`'s);
/// with `prompt`, each fork's first turn is started in a background driver process, as
/// `fork -d PROMPT` does. The flags and the prompt are checked (as the source's next turn)
/// before a fork is made.
pub async fn fork(
    target: &str,
    request: &ForkRequest,
    flags: &[String],
    prompt: Option<&str>,
) -> Result<Vec<Prepared>> {
    let mut args = parse::<ResumeFlags>(flags)?.resume;
    match prompt {
        Some(p) => {
            args.turn.prompt = Some(p.to_string());
            args.turn.prompt_file = None;
        }
        None => with_placeholder(&mut args.turn),
    }
    if args.group.is_some() || args.target.is_some() {
        return Err(Error::usage(
            "fork one session: give its target, no --group",
        ));
    }
    if args.turn.detach || args.turn.on_limit.is_some() || args.turn.max_wait.is_some() {
        return Err(Error::usage(
            "--detach, --on-limit and --max-wait are per turn here, not the session's",
        ));
    }
    request.check()?;
    let source = crate::commands::turn::open_session(target, &args.turn).await?;
    let forks = source.client.fork(target, request).await?;
    let mut opened = Vec::new();
    for r in &forks.sessions {
        let t = crate::commands::turn::open_session(&r.session_id.to_string(), &args.turn).await?;
        if prompt.is_some() {
            t.session.start_detached(&t.options).await?;
        }
        opened.push(t.into());
    }
    Ok(opened)
}

/// Starts `options`' turn of `session` in a background driver process (the executable of
/// [`crate::connection::driver`]) and returns once it runs, as `run -d` does.
pub async fn detach(_client: &Client, session: &Session, options: &TurnOptions) -> Result<()> {
    session.start_detached(options).await
}

/// The rows `caw-box ls --json [--group G]` prints.
pub async fn sessions(group: Option<String>) -> Result<serde_json::Value> {
    crate::commands::manage::ls_rows(false, group).await
}

/// What `caw-box auth status --json` prints.
pub fn auth_status() -> Result<serde_json::Value> {
    crate::commands::auth::status_value()
}

/// `caw-box auth collect [--provider P]... [--store keyring]`: what was collected, per
/// provider (`found`, `kept_newer`, `warnings`).
pub fn auth_collect(providers: &[String], keyring: bool) -> Result<serde_json::Value> {
    crate::commands::auth::collect_value(providers, keyring)
}

/// `caw-box auth login`'s flags (`--provider P` …) as clap parses them.
#[derive(Debug, Parser)]
#[command(no_binary_name = true)]
struct LoginFlags {
    #[command(flatten)]
    login: crate::cli::AuthLoginArgs,
}

/// `caw-box auth login` with these flags: `key` stored as the provider's key (the caller
/// read it, never a flag), else the vendor's flow run in its container, `on_prompt` given
/// `{"provider","url","code"}` once the CLI printed them (a device-code flow), or
/// `{"provider","url","needs":"code"}` (a paste-code flow: it returns the code the page
/// showed, `None` ends the login), `cancel` ending it as Ctrl-C would (this process's
/// signals are the caller's). Returns the items stored (no secret).
pub async fn auth_login(
    flags: &[String],
    key: Option<String>,
    cancel: Option<std::sync::Arc<tokio::sync::Notify>>,
    on_prompt: &mut (dyn FnMut(serde_json::Value) -> Option<String> + Send),
) -> Result<serde_json::Value> {
    let mut args = parse::<LoginFlags>(flags)?.login;
    args.with_api_key = key.is_some();
    let key = key.map(|k| crate::auth::Secret::new(k.trim().as_bytes().to_vec()));
    if key.as_ref().is_some_and(|k| k.is_empty()) {
        return Err(Error::usage("the API key is empty"));
    }
    let mut say = |event: crate::session::login::LoginEvent<'_>| match event {
        crate::session::login::LoginEvent::Prompt(p) => {
            on_prompt(serde_json::to_value(p).unwrap_or_default());
        }
        crate::session::login::LoginEvent::AskCode(p, reply) => {
            if let Some(code) = on_prompt(serde_json::to_value(p).unwrap_or_default()) {
                reply.send(crate::auth::Secret::new(code.trim().as_bytes().to_vec()));
            }
        }
        crate::session::login::LoginEvent::Line(_) => {}
    };
    let items = crate::commands::login::run_login(&args, key, cancel, &mut say).await?;
    Ok(serde_json::to_value(items).expect("items serialize"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_parse_as_the_command_lines_and_a_bad_one_is_a_usage_error() {
        let run = parse::<RunFlags>(&flags(&[
            "--provider=codex",
            "--model=gpt-5.5",
            "--env=K=V",
        ]))
        .unwrap()
        .run;
        assert_eq!(run.provider.as_deref(), Some("codex"));
        assert_eq!(run.turn.settings.model.as_deref(), Some("gpt-5.5"));
        assert_eq!(run.turn.env, vec!["K=V".to_string()]);
        let e = parse::<RunFlags>(&flags(&["--modle=x"])).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--modle"), "{e}");
    }

    #[test]
    fn per_turn_flags_are_refused_as_a_sessions() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = rt
            .block_on(start(&flags(&["--provider=codex", "--detach"]), &|_| {}))
            .unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }
}
