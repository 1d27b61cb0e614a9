//! `caw-box auth login`: the vendor's own headless login in a short-lived container
//! (`session::login`), or an API key read from stdin; either way the result goes to
//! caw-box's store (`auth::store::store_login`), never to the host's vendor directories.
//! What is said to the user is here; the container's life is the session layer's.

use std::io::{BufRead, IsTerminal, Read};
use std::time::Duration;

use crate::auth::spec::Spec;
use crate::auth::store::{self, Item, LoginResult, Store};
use crate::auth::Secret;
use crate::cli::AuthLoginArgs;
use crate::error::{Error, Result};
use crate::output;
use crate::provider::ProviderKind;
use crate::session::login::{self, CodeReply, LoginEvent, LoginPlan, LoginPrompt};

pub async fn login(args: AuthLoginArgs, quiet: bool, verbose: bool) -> Result<i32> {
    let p: ProviderKind = args.provider.parse()?;
    let key = if args.with_api_key {
        Some(read_key(p)?)
    } else {
        None
    };
    let json = args.json;
    let timeout = humantime::parse_duration(&args.timeout)
        .map(|t| humantime::format_duration(t).to_string())
        .unwrap_or_default();
    let mut say = |event: LoginEvent<'_>| {
        match event {
        LoginEvent::Line(line) if verbose => output::eprintln(&format!("{p}: {line}")),
        LoginEvent::Line(_) => {}
        LoginEvent::Prompt(prompt) if json => output::print_json_line(prompt),
        LoginEvent::Prompt(prompt) => output::eprintln(&format!(
            "To log in to {p}: open {} and enter the code {} (waiting up to {timeout}; Ctrl-C cancels)",
            prompt.url,
            prompt.code.as_deref().unwrap_or("-"),
        )),
        LoginEvent::AskCode(prompt, reply) => ask_code(prompt, reply, json, &timeout),
    }
    };
    let items = run_login(&args, key, None, &mut say).await?;
    if json {
        output::print_json_line(&serde_json::json!({"provider": p, "stored": items}));
    } else if !quiet {
        for item in &items {
            output::println(&format!("{p}: {} stored (source login)", item.target));
        }
        output::eprintln(&format!("stored in {}", Store::open()?.root().display()));
    }
    Ok(0)
}

/// `auth login` as the command line and the library run it: `key` (read by the caller)
/// stored as the provider's key, else the vendor's flow run (`say` told its lines and the
/// URL and code; `cancel` ends it as Ctrl-C would) and its login stored. Returns what was
/// stored (no secret).
pub(crate) async fn run_login(
    args: &AuthLoginArgs,
    key: Option<Secret>,
    cancel: Option<std::sync::Arc<tokio::sync::Notify>>,
    say: &mut (dyn FnMut(LoginEvent<'_>) + Send),
) -> Result<Vec<Item>> {
    let p: ProviderKind = args.provider.parse()?;
    let result = match key {
        Some(key) => key_login(p, key),
        None => {
            let mut plan = plan(args, p)?;
            plan.cancel = cancel;
            let spec = Spec::of(p).login;
            if spec.argv.is_empty() {
                return Err(login::unavailable(p, &spec));
            }
            let backend = crate::client::connect_backend().await?;
            login::login(&backend, &plan, say).await?
        }
    };
    store::store_login(&Store::open()?, p, &result)
}

/// The login's plan from the flags: the provider's image (or `--image`), `--network`, the
/// CA file, the timeout.
fn plan(args: &AuthLoginArgs, p: ProviderKind) -> Result<LoginPlan> {
    if matches!(args.network.as_str(), "none" | "host") {
        return Err(Error::usage(format!(
            "auth login --network {}: the login goes out through a proxy of its own, on \
             `open` (the default) or a named network",
            args.network
        )));
    }
    let timeout: Duration = humantime::parse_duration(&args.timeout)
        .map_err(|e| Error::usage(format!("--timeout {:?}: {e}", args.timeout)))?;
    let ca_cert = match &args.ca_cert {
        Some(path) => Some(super::image::read_ca_cert(path)?),
        None => None,
    };
    Ok(LoginPlan {
        provider: p,
        image: args.image.clone().unwrap_or_else(|| p.default_image()),
        network: args.network.clone(),
        ca_cert,
        timeout,
        cancel: None,
    })
}

/// A paste-code flow's URL told (`--json`: `{"provider","url","needs":"code"}` on stdout),
/// and the code read from stdin on a thread of its own (so that Ctrl-C and the timeout
/// still end the login while it waits): on a terminal after a prompt, else the first line.
/// End of input without a line drops `reply` (the login ends: no code).
fn ask_code(prompt: &LoginPrompt, reply: CodeReply, json: bool, timeout: &str) {
    let p = prompt.provider;
    if json {
        output::print_json_line(prompt);
    } else {
        output::eprintln(&format!(
            "To log in to {p}: open {} in a browser, approve, and paste the code the page \
             then shows here (waiting up to {timeout}; Ctrl-C cancels)",
            prompt.url
        ));
    }
    let terminal = std::io::stdin().is_terminal();
    std::thread::spawn(move || {
        if terminal {
            output::write_stderr("Code > ");
        }
        let mut line = String::new();
        let read = std::io::stdin().lock().take(8 * 1024).read_line(&mut line);
        if matches!(read, Ok(n) if n > 0) && !line.trim().is_empty() {
            reply.send(Secret::new(line.trim().as_bytes().to_vec()));
        }
    });
}

/// A key read from stdin: from a terminal without echo, else the first line of a pipe.
fn read_key(p: ProviderKind) -> Result<Secret> {
    let stdin = std::io::stdin();
    let text = if stdin.is_terminal() {
        read_hidden_line(&format!("{p} API key (not shown; Enter ends it):"))?
    } else {
        let mut buf = Vec::new();
        stdin
            .lock()
            .take(64 * 1024)
            .read_to_end(&mut buf)
            .map_err(|e| Error::usage(format!("cannot read the key from stdin: {e}")))?;
        String::from_utf8(buf).map_err(|_| Error::usage("the key on stdin is not UTF-8"))?
    };
    let key = text.lines().map(str::trim).find(|l| !l.is_empty());
    match key {
        Some(k) if !k.contains(char::is_whitespace) => Ok(Secret::new(k.as_bytes().to_vec())),
        Some(_) => Err(Error::usage(
            "the key on stdin contains spaces: pass the key alone",
        )),
        None => Err(Error::usage("no key on stdin").with_hint(format!(
            "pipe it in: `printenv VAR | caw-box auth login --provider {p} --with-api-key`"
        ))),
    }
}

/// One line typed on the terminal with echo off (restored after, also on an error); the
/// `prompt` shows once echo is off, so nothing typed after it is shown.
fn read_hidden_line(prompt: &str) -> Result<String> {
    use rustix::termios::{self, LocalModes, OptionalActions};
    let stdin = std::io::stdin();
    let original = termios::tcgetattr(&stdin)
        .map_err(|e| Error::usage(format!("cannot read the terminal's settings: {e}")))?;
    let mut quiet = original.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    termios::tcsetattr(&stdin, OptionalActions::Now, &quiet)
        .map_err(|e| Error::usage(format!("cannot switch the terminal's echo off: {e}")))?;
    output::eprintln(prompt);
    let mut line = String::new();
    let read = stdin.read_line(&mut line);
    let _ = termios::tcsetattr(&stdin, OptionalActions::Now, &original);
    output::eprintln("");
    read.map_err(|e| Error::usage(format!("cannot read the key: {e}")))?;
    Ok(line)
}

/// What a key from stdin is stored as: the provider's key variable, or claude's
/// long-lived OAuth token (`claude setup-token`'s `sk-ant-oat…`) as `CLAUDE_CODE_OAUTH_TOKEN`
/// (a token, not a login: nothing to refresh).
fn key_login(p: ProviderKind, key: Secret) -> LoginResult {
    let spec = Spec::of(p).login;
    let oauth_token = p == ProviderKind::ClaudeCode && key.expose().starts_with(b"sk-ant-oat");
    let var = if oauth_token {
        "CLAUDE_CODE_OAUTH_TOKEN".to_string()
    } else {
        spec.api_key_env
    };
    LoginResult {
        files: vec![],
        vars: vec![(var, key)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_goes_to_the_providers_key_variable_and_claudes_token_to_its_own() {
        let var = |p, key: &str| {
            key_login(p, Secret::new(key.as_bytes().to_vec())).vars[0]
                .0
                .clone()
        };
        assert_eq!(var(ProviderKind::Codex, "sk-proj-x"), "OPENAI_API_KEY");
        assert_eq!(var(ProviderKind::Opencode, "sk-proj-x"), "OPENAI_API_KEY");
        assert_eq!(var(ProviderKind::Gemini, "AIza-x"), "GEMINI_API_KEY");
        assert_eq!(
            var(ProviderKind::ClaudeCode, "sk-ant-api03-x"),
            "ANTHROPIC_API_KEY"
        );
        assert_eq!(
            var(ProviderKind::ClaudeCode, "sk-ant-oat01-x"),
            "CLAUDE_CODE_OAUTH_TOKEN"
        );
    }
}
