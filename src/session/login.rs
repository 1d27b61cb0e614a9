//! `caw-box auth login`: the vendor CLI's own headless login (its spec's `login.argv`), in a
//! short-lived container of the provider's image that has no workspace and no state volume,
//! whose only way out is the egress proxy admitting the vendor's auth hosts (as
//! `--allow-host` holds a turn, on a network or in the container's own unit, as the backend
//! routes it). What the CLI wrote under HOME is read out of the ended container (HOME kept
//! for that: [`HelperSpec::kept_dir`]) and handed back; the container and its egress are
//! removed whatever happens
//! (the flow's end, a failure, Ctrl-C, the timeout). Not the store (`auth::store` keeps the
//! result) and not the terminal (the caller is told the URL and code through `say`). Two
//! kinds of flow: a device code (codex, opencode: the person enters the code the CLI printed
//! at the vendor's page, the CLI polls) and a pasted code (claude, gemini: the person approves
//! at the URL the CLI printed and pastes the code the page shows; the caller is asked for it
//! through `say` and caw-box writes it to the CLI's stdin). gemini's flow runs only in its
//! interactive UI: its container gets a terminal, and since the CLI goes on into that UI
//! after the login, the flow is done once the login file is written.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use uuid::Uuid;

use crate::auth::spec::{LoginSpec, Spec};
use crate::auth::store::LoginResult;
use crate::auth::Secret;
use crate::backend::{Backend, CreateError, EgressPlan, HelperSpec, NetworkPolicy};
use crate::backend::{EgressRoute, OutputChunk, Scratch, ScratchFile};
use crate::error::{Error, Result};
use crate::labelling::{labels, roles};
use crate::provider::{ProviderKind, AGENT_HOME};
use crate::session::names::LabelSet;
use crate::session::record::IMAGE_IDS;

/// Where the login's container finds the extra CA (`--ca-cert`) and the spec's
/// `config_files`.
const LOGIN_DIR: &str = "/run/caw-box-login";

/// One login as the caller asks for it.
#[derive(Debug, Clone)]
pub struct LoginPlan {
    pub provider: ProviderKind,
    pub image: String,
    /// The `--network` the login's egress proxy goes out on.
    pub network: String,
    /// A CA certificate (PEM) the CLI trusts besides its own.
    pub ca_cert: Option<Vec<u8>>,
    pub timeout: Duration,
    /// Ends the flow as Ctrl-C would, for a caller that handles signals itself (Python):
    /// notified once, the login is cleaned up and ends interrupted.
    pub cancel: Option<std::sync::Arc<tokio::sync::Notify>>,
}

/// What the vendor's flow asks of the person logging in: a URL to open, and the one-time
/// code to enter there (a device-code flow), or the code the page shows to be pasted back
/// (`needs: "code"`, a paste-code flow).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LoginPrompt {
    pub provider: ProviderKind,
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needs: Option<&'static str>,
}

/// What the login tells its caller as it goes.
#[derive(Debug)]
pub enum LoginEvent<'a> {
    /// A line the vendor's CLI printed (escape sequences removed).
    Line(&'a str),
    /// The URL and code, once both are known.
    Prompt(&'a LoginPrompt),
    /// The URL of a paste-code flow: the code the vendor's page shows goes back through
    /// the reply (dropping it unanswered ends the login: no code).
    AskCode(&'a LoginPrompt, CodeReply),
}

/// Where the caller sends the pasted code (from any thread).
#[derive(Debug)]
pub struct CodeReply(tokio::sync::mpsc::Sender<Secret>);

impl CodeReply {
    /// Hands the code to the login (once).
    pub fn send(self, code: Secret) {
        let _ = self.0.try_send(code);
    }
}

/// The container's and egress's names and labels of one login.
struct Names {
    container: String,
    egress: EgressPlan,
}

fn names(plan: &LoginPlan, spec: &LoginSpec) -> Names {
    let id = Uuid::new_v4();
    let labels = LabelSet::new(id, roles::LOGIN)
        .provider(plan.provider)
        .with(labels::DRIVER_PID, std::process::id().to_string())
        .with(labels::DRIVER_HOST, crate::dirs::host_name())
        .finish();
    let container = format!("caw-box-login-{id}");
    let egress = EgressPlan {
        turn: container.clone(),
        policy: crate::session::record::EgressPolicy::Locked,
        allow: spec.hosts.clone(),
        image: plan.image.clone(),
        user: IMAGE_IDS,
        network: NetworkPolicy::from_setting(&plan.network),
        labels,
        names: [format!("{container}-egress"), format!("{container}-proxy")],
        shared: false,
        program: String::new(),
    };
    Names { container, egress }
}

/// The login's container: the CLI's login command as the image's user, hardened, on the
/// egress route's network (or holding its egress itself, where the route has none) with the
/// proxy in its environment, its HOME read after its end.
fn container_spec(
    plan: &LoginPlan,
    spec: &LoginSpec,
    route: &EgressRoute,
    egress: &EgressPlan,
) -> HelperSpec {
    let proxy = &route.proxy_url;
    let mut env = vec![
        format!("HOME={AGENT_HOME}"),
        format!("HTTPS_PROXY={proxy}"),
        format!("https_proxy={proxy}"),
        format!("HTTP_PROXY={proxy}"),
        format!("http_proxy={proxy}"),
        format!("NO_PROXY={}", route.direct.join(",")),
        "NO_COLOR=1".to_string(),
        "TERM=dumb".to_string(),
    ];
    env.extend(spec.env.iter().cloned());
    let mut files: Vec<ScratchFile> = spec
        .config_files
        .iter()
        .map(|(name, contents)| ScratchFile {
            path: name.clone(),
            contents: contents.as_bytes().to_vec(),
            mode: 0o644,
        })
        .collect();
    if let Some(pem) = &plan.ca_cert {
        env.extend(
            spec.ca_env
                .iter()
                .map(|var| format!("{var}={LOGIN_DIR}/ca.pem")),
        );
        files.push(ScratchFile {
            path: "ca.pem".to_string(),
            contents: pem.clone(),
            mode: 0o644,
        });
    }
    let scratch = (!files.is_empty()).then(|| Scratch {
        mount: LOGIN_DIR.to_string(),
        owner: IMAGE_IDS,
        files,
        labels: Default::default(),
    });
    HelperSpec {
        image: plan.image.clone(),
        entrypoint: spec.argv.clone(),
        argv: vec![],
        env,
        user: Some(format!("{}:{}", IMAGE_IDS.0, IMAGE_IDS.1)),
        labels: egress.labels.clone(),
        mounts: vec![],
        network: route
            .agent_network
            .clone()
            .map_or(NetworkPolicy::Default, NetworkPolicy::Named),
        read_only_root: false,
        drop_all_capabilities: true,
        add_capabilities: vec![],
        no_new_privileges: true,
        pids_limit: Some(256),
        tmp: Some("rw,nosuid,nodev,size=64m".to_string()),
        scratch,
        // A paste-code flow reads the code from its stdin.
        stdin: spec.paste_code.is_some(),
        stdin_once: false,
        tty: spec.tty,
        auto_remove: false,
        join: None,
        egress_allow: egress.allow.clone(),
        kept_dir: Some(AGENT_HOME.to_string()),
    }
}

/// Runs `plan`'s login to its end and returns what the CLI wrote (nothing is stored here).
/// Errors: the flow has no headless form (exit 2), the vendor refused or the flow failed
/// (exit 4, the CLI's last line), Ctrl-C (130), the timeout (124); in every case nothing of
/// the login is left on the backend.
pub async fn login(
    backend: &impl Backend,
    plan: &LoginPlan,
    say: &mut (dyn FnMut(LoginEvent<'_>) + Send),
) -> Result<LoginResult> {
    let p = plan.provider;
    let spec = Spec::of(p).login;
    if spec.argv.is_empty() {
        return Err(unavailable(p, &spec));
    }
    // A `--network` the backend cannot put the login's way out on: refused, not ignored.
    backend.refuse_settings(&plan.network, None)?;
    remove_abandoned(backend).await;
    let Names { container, egress } = names(plan, &spec);
    let route = backend.egress_route(&egress);
    let spec_of_container = container_spec(plan, &spec, &route, &egress);
    // Ctrl-C, SIGTERM, SIGHUP, as a turn's (none where the caller handles signals): from
    // before anything exists, so that one during the setup is still cleaned up after.
    let mut interrupts = crate::session::turn::Interrupts::install()?;
    if let Err(e) = backend.open_egress(&egress).await {
        return Err(created(e, plan));
    }
    // (A backend may take seconds to run it: a Ctrl-C meanwhile ends the login there.)
    let made = tokio::select! {
        made = backend.create_helper(&container, &spec_of_container) => made.map_err(|e| created(e, plan)),
        () = interrupts.recv() => Err(interrupted(p)),
    };
    let outcome = match made {
        Ok(_) => run_flow(backend, plan, &spec, &container, &mut interrupts, say).await,
        Err(e) => Err(e),
    };
    let _ = backend.remove_container(&container, true).await;
    backend.close_egress(&egress).await;
    outcome
}

/// Removes what logins of this host whose caw-box was killed left behind (their container
/// may hold the login the CLI wrote): container, proxy and network, by the login's own id.
/// A login whose driver still runs (caw-box, or a program embedding it: Python), and
/// another host's, are left alone. Best effort.
async fn remove_abandoned(backend: &impl Backend) {
    let filter = [
        format!("{}=true", labels::MANAGED),
        format!("{}={}", labels::ROLE, roles::LOGIN),
    ];
    let Ok(found) = backend.list_containers(&filter).await else {
        return;
    };
    let host = crate::dirs::host_name();
    for c in &found {
        let gone = c.label(labels::DRIVER_HOST) == Some(host.as_str())
            && !c
                .label(labels::DRIVER_PID)
                .and_then(|p| p.parse().ok())
                .is_some_and(crate::session::lifecycle::liveness::process_lives);
        if let (true, Some(id)) = (gone, c.label(labels::SESSION)) {
            let own = [
                format!("{}={id}", labels::SESSION),
                format!("{}={}", labels::ROLE, roles::LOGIN),
            ];
            let _ = backend.sweep(&own, &[]).await;
            // The container itself, where nothing was made beside it for the sweep to find.
            let _ = backend.remove_found(c).await;
        }
    }
}

fn created(e: CreateError, plan: &LoginPlan) -> Error {
    match e {
        CreateError::ImageMissing(_) => Error::missing_image(&plan.image, plan.provider),
        other => Error::from(other),
    }
}

/// Why `p` has no login caw-box can run, and what to do instead.
pub fn unavailable(p: ProviderKind, spec: &LoginSpec) -> Error {
    let why = spec
        .unavailable
        .clone()
        .unwrap_or_else(|| "no headless login of this CLI finishes in a container".into());
    Error::usage(format!("{p}: {why}"))
}

/// How a followed login ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The CLI exited with this code.
    Exited(i64),
    /// A CLI that stays (`LoginSpec::stays`) wrote its login.
    Written,
    /// The CLI said the vendor refused the code (`PasteCodeSpec::refused`).
    Refused,
}

/// The container's output fed to `transcript` until it ends, and in a paste-code flow the
/// code the caller sends on `codes` written to its stdin (a line; on a terminal, ended as
/// Enter ends it). A CLI that stays after its login is polled, once the code went in, for
/// the login it writes ([`written`]).
async fn follow(
    backend: &impl Backend,
    container: &str,
    spec: &LoginSpec,
    attached: crate::backend::Attached,
    mut codes: tokio::sync::mpsc::Receiver<Secret>,
    transcript: &mut Transcript,
    say: &mut (dyn FnMut(LoginEvent<'_>) + Send),
) -> Result<Ended> {
    let crate::backend::Attached {
        mut output,
        mut input,
    } = attached;
    let mut waiting = transcript.paste.is_some();
    let mut sent = false;
    let mut first_written = None;
    let mut poll = tokio::time::interval(Duration::from_millis(300));
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(OutputChunk::Stdout(b) | OutputChunk::Stderr(b) | OutputChunk::Console(b))) => {
                    transcript.feed(&b, say);
                    if transcript.refusal.is_some() {
                        return Ok(Ended::Refused);
                    }
                }
                _ => break,
            },
            code = codes.recv(), if waiting => {
                waiting = false;
                let with_state = spec.paste_code.as_ref().is_some_and(|p| p.with_state);
                let code = pasted(transcript.provider, with_state, code)?;
                transcript.pasted = Some(String::from_utf8_lossy(code.expose()).into_owned());
                let mut line = code.expose().to_vec();
                line.push(if spec.tty { b'\r' } else { b'\n' });
                input.write_all(&line).await.map_err(|e| {
                    Error::environment(format!("cannot hand the code to the login's container: {e}"))
                })?;
                input.flush().await.ok();
                sent = true;
            }
            _ = poll.tick(), if sent && spec.stays => {
                if written(backend, container, spec, &mut first_written).await {
                    return Ok(Ended::Written);
                }
            }
        }
    }
    drop(input);
    Ok(Ended::Exited(backend.wait_container(container).await?))
}

/// Whether a CLI that stays has written its login: the first of `files` whole (JSON that
/// parses, for a `.json` one), and the others too, or a moment passed since the first was
/// (a companion the CLI may not write: gemini's account file, when it cannot read the
/// account).
async fn written(
    backend: &impl Backend,
    container: &str,
    spec: &LoginSpec,
    first_written: &mut Option<std::time::Instant>,
) -> bool {
    let files = &spec.files;
    let whole = |target: &str, bytes: &[u8]| {
        !target.ends_with(".json") || serde_json::from_slice::<serde_json::Value>(bytes).is_ok()
    };
    let mut present = 0;
    for target in files {
        let path = format!("{}/{target}", home_of(spec));
        match backend.download_file(container, &path).await {
            Ok(Some(bytes)) if whole(target, &bytes) => present += 1,
            _ if present == 0 => return false,
            _ => {}
        }
    }
    let since = *first_written.get_or_insert_with(std::time::Instant::now);
    present == files.len() || since.elapsed() > Duration::from_secs(3)
}

/// Where the CLI writes its login's `files`: the spec's own HOME for them, else the image's.
fn home_of(spec: &LoginSpec) -> &str {
    spec.home.as_deref().unwrap_or(AGENT_HOME)
}

/// The code the caller pasted, checked for the vendor page's shape: one word, and with
/// `with_state` a `code#state` one.
fn pasted(p: ProviderKind, with_state: bool, code: Option<Secret>) -> Result<Secret> {
    let Some(code) = code else {
        let again = format!(
            "run `caw-box auth login --provider {p}` again and paste the code the page shows"
        );
        let none = format!("{p} login: no code was pasted: nothing was stored");
        return Err(Error::usage(none).with_hint(again));
    };
    let text = String::from_utf8_lossy(code.expose()).trim().to_string();
    let word = !text.is_empty() && text.len() <= 4096 && text.chars().all(|c| c.is_ascii_graphic());
    let stated = text
        .split_once('#')
        .is_some_and(|(c, s)| !c.is_empty() && !s.is_empty());
    if word && (stated || !with_state) {
        return Ok(Secret::new(text.into_bytes()));
    }
    let shape = if with_state {
        "`code#state`, with the # in the middle"
    } else {
        "one word"
    };
    Err(Error::usage(format!(
        "{p} login: that is not the whole code the page shows ({shape}): nothing was stored"
    )))
}

/// Starts the container and follows it to its end, against Ctrl-C and the timeout; then
/// reads the login files out of the ended container.
async fn run_flow(
    backend: &impl Backend,
    plan: &LoginPlan,
    spec: &LoginSpec,
    container: &str,
    interrupts: &mut crate::session::turn::Interrupts,
    say: &mut (dyn FnMut(LoginEvent<'_>) + Send),
) -> Result<LoginResult> {
    let p = plan.provider;
    let paste = spec.paste_code.is_some();
    // Attached before the start: its stdout and stderr from the first byte.
    let attached = backend.attach(container, paste).await?;
    backend.start_container(container).await?;
    let cancelled = async {
        match &plan.cancel {
            Some(cancel) => cancel.notified().await,
            None => std::future::pending().await,
        }
    };
    let (reply, codes) = tokio::sync::mpsc::channel(1);
    let mut transcript = Transcript::new(p);
    if let Some(paste) = &spec.paste_code {
        transcript.paste = Some((paste.prompt.clone(), Some(CodeReply(reply))));
        transcript.refused = paste.refused.clone();
    }
    let followed = follow(
        backend,
        container,
        spec,
        attached,
        codes,
        &mut transcript,
        say,
    );
    let ended = tokio::select! {
        ended = followed => ended?,
        () = interrupts.recv() => return Err(interrupted(p)),
        () = cancelled => return Err(interrupted(p)),
        () = tokio::time::sleep(plan.timeout) => {
            return Err(Error::new(crate::error::ErrorKind::Timeout, format!(
                "{p} login not finished within {}: nothing was stored",
                humantime::format_duration(plan.timeout)
            )).with_hint("run it again and enter the code sooner, or pass a longer --timeout"));
        }
    };
    match ended {
        Ended::Exited(0) | Ended::Written => {}
        Ended::Exited(code) => return Err(transcript.failure(spec, Some(code))),
        Ended::Refused => return Err(transcript.failure(spec, None)),
    }
    let mut result = LoginResult::default();
    for target in &spec.files {
        let path = format!("{}/{target}", home_of(spec));
        if let Some(bytes) = backend.download_file(container, &path).await? {
            result.files.push((target.clone(), Secret::new(bytes)));
        }
    }
    if result.files.is_empty() {
        return Err(Error::credentials(format!(
            "{p} login ended without writing a login ({})",
            spec.files.join(", ")
        ))
        .with_hint(format!("run `caw-box auth login --provider {p}` again")));
    }
    Ok(result)
}

fn interrupted(p: ProviderKind) -> Error {
    Error::new(
        crate::error::ErrorKind::Interrupted,
        format!("{p} login interrupted: nothing was stored"),
    )
}

/// The CLI's output, line by line: escape sequences removed, the URL and code picked out.
struct Transcript {
    provider: ProviderKind,
    /// A paste-code flow's prompt (taken off the line after it) and where the code goes,
    /// until asked for.
    paste: Option<(String, Option<CodeReply>)>,
    /// The code once pasted: a line holding it (a terminal's echo) is not kept or told.
    pasted: Option<String>,
    /// Texts that mean the vendor refused the code, and the line that said so.
    refused: Vec<String>,
    refusal: Option<String>,
    pending: Vec<u8>,
    lines: Vec<String>,
    url: Option<String>,
    code: Option<String>,
    told: bool,
}

impl Transcript {
    fn new(provider: ProviderKind) -> Self {
        Transcript {
            provider,
            paste: None,
            pasted: None,
            refused: Vec::new(),
            refusal: None,
            pending: Vec::new(),
            lines: Vec::new(),
            url: None,
            code: None,
            told: false,
        }
    }

    fn feed(&mut self, bytes: &[u8], say: &mut (dyn FnMut(LoginEvent<'_>) + Send)) {
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let raw: Vec<u8> = self.pending.drain(..=end).collect();
            let line = strip_escapes(&String::from_utf8_lossy(&raw));
            let mut line = line.trim();
            if let Some((prompt, _)) = &self.paste {
                line = line.strip_prefix(prompt.as_str()).unwrap_or(line).trim();
            }
            let echo = self
                .pasted
                .as_ref()
                .is_some_and(|c| line.contains(c.as_str()));
            if line.is_empty() || echo {
                continue;
            }
            say(LoginEvent::Line(line));
            if self.refusal.is_none() && self.refused.iter().any(|r| line.contains(r.as_str())) {
                self.refusal = Some(line.chars().take(300).collect());
            }
            self.url = self.url.take().or_else(|| find_url(line));
            if let (Some(url), Some((_, reply))) = (&self.url, &mut self.paste) {
                if let Some(reply) = reply.take() {
                    let prompt = LoginPrompt {
                        provider: self.provider,
                        url: url.clone(),
                        code: None,
                        needs: Some("code"),
                    };
                    say(LoginEvent::AskCode(&prompt, reply));
                }
                self.lines.push(line.to_string());
                continue;
            }
            self.code = self.code.take().or_else(|| find_code(line));
            self.lines.push(line.to_string());
            if let (false, Some(url), Some(code)) = (self.told, &self.url, &self.code) {
                self.told = true;
                let prompt = LoginPrompt {
                    provider: self.provider,
                    url: url.clone(),
                    code: Some(code.clone()),
                    needs: None,
                };
                say(LoginEvent::Prompt(&prompt));
            }
        }
    }

    /// The error of a flow that ended with `code` (`None`: the vendor refused the code and
    /// the CLI would ask again): the vendor's switch-off in one line, or the CLI's line.
    fn failure(&self, spec: &LoginSpec, code: Option<i64>) -> Error {
        let p = self.provider;
        let all = self.lines.join("\n");
        if spec.disabled.iter().any(|d| all.contains(d.as_str())) {
            let message = spec.disabled_message.clone().unwrap_or_default();
            return Error::credentials(format!("{p}: {message}"));
        }
        let last = self
            .lines
            .iter()
            .rev()
            .find(|l| !l.is_empty())
            .map_or("no output".to_string(), |l| l.chars().take(300).collect());
        let message = match (code, &self.refusal) {
            (Some(code), _) => format!("{p} login failed (the CLI exited {code}): {last}"),
            (None, Some(refusal)) => format!("{p} login failed: {refusal}"),
            (None, None) => format!("{p} login failed: {last}"),
        };
        Error::credentials(message).with_hint(format!(
            "run `caw-box auth login --provider {p}` again, or store an API key with --with-api-key"
        ))
    }
}

/// `text` without terminal escape sequences (colours, cursor moves).
fn strip_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            if c != '\r' {
                out.push(c);
            }
            continue;
        }
        match chars.peek() {
            Some('[') => {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            Some(']') => {
                for c in chars.by_ref() {
                    if c == '\u{7}' {
                        break;
                    }
                }
            }
            _ => {
                chars.next();
            }
        }
    }
    out
}

/// The first `https://` URL of a line.
fn find_url(line: &str) -> Option<String> {
    let start = line.find("https://")?;
    let url: String = line[start..]
        .chars()
        .take_while(|c| !c.is_whitespace() && !matches!(c, '"' | '\'' | '<' | '>' | ')'))
        .collect();
    Some(url.trim_end_matches(['.', ',', ';']).to_string())
}

/// A one-time code: a word of upper-case letters and digits in groups joined by `-`
/// (`ABCD-12345`).
fn find_code(line: &str) -> Option<String> {
    line.split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_ascii_alphanumeric()))
        .find(|w| {
            let groups: Vec<&str> = w.split('-').collect();
            groups.len() >= 2
                && groups.iter().all(|g| {
                    g.len() >= 4
                        && g.chars()
                            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
                })
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_and_code_are_read_from_codexs_prompt() {
        let mut t = Transcript::new(ProviderKind::Codex);
        let mut prompts = Vec::new();
        let out = "\nWelcome to Codex [v\x1b[90m0.169.0\x1b[0m]\n\
            1. Open this link in your browser and sign in to your account\n   \
            \x1b[94mhttps://auth.openai.com/codex/device\x1b[0m\n\n\
            2. Enter this one-time code \x1b[90m(expires in 15 minutes)\x1b[0m\n   \
            \x1b[94mABCD-12345\x1b[0m\n";
        // In two pieces, split mid-line, as a log stream may deliver it.
        let (a, b) = out.split_at(90);
        for part in [a, b] {
            t.feed(part.as_bytes(), &mut |e| {
                if let LoginEvent::Prompt(p) = e {
                    prompts.push(p.clone());
                }
            });
        }
        assert_eq!(
            prompts,
            vec![LoginPrompt {
                provider: ProviderKind::Codex,
                url: "https://auth.openai.com/codex/device".into(),
                code: Some("ABCD-12345".into()),
                needs: None,
            }]
        );
    }

    #[test]
    fn a_switched_off_flow_is_one_line_naming_the_alternatives() {
        let spec = Spec::of(ProviderKind::Codex).login;
        let mut t = Transcript::new(ProviderKind::Codex);
        t.feed(
            b"Error: device code login is not enabled for this Codex server. Use the browser login or verify the server URL.\n",
            &mut |_| {},
        );
        let e = t.failure(&spec, Some(1));
        assert_eq!(e.exit_code(), 4);
        assert!(e.message.contains("switched off"), "{}", e.message);
        assert!(e.message.contains("--with-api-key"), "{}", e.message);
        assert!(!e.message.contains('\n'));
    }

    #[test]
    fn claudes_url_is_asked_for_its_code_and_its_prompt_is_taken_off_the_next_line() {
        let spec = Spec::of(ProviderKind::ClaudeCode).login;
        let paste = spec
            .paste_code
            .clone()
            .expect("claude's flow is a paste-code one");
        let (reply, mut codes) = tokio::sync::mpsc::channel(1);
        let mut t = Transcript::new(ProviderKind::ClaudeCode);
        t.paste = Some((paste.prompt, Some(CodeReply(reply))));
        let mut asked = Vec::new();
        let out = "Opening browser to sign in\u{2026}\nIf the browser didn't open, visit:\n\
            https://claude.ai/oauth/authorize?z-W-T3S9XcZz18yQqEkwg6Y8yKsSRT7XRr5zHsL7HhdXE\n\
            Paste code here if prompted > ";
        t.feed(out.as_bytes(), &mut |e| {
            if let LoginEvent::AskCode(p, reply) = e {
                asked.push(serde_json::to_value(p).unwrap());
                reply.send(Secret::new(b"c0de#st8".to_vec()));
            }
        });
        assert_eq!(
            asked,
            vec![
                serde_json::json!({"provider": "claude_code", "needs": "code",
                "url": "https://claude.ai/oauth/authorize?z-W-T3S9XcZz18yQqEkwg6Y8yKsSRT7XRr5zHsL7HhdXE"})
            ]
        );
        assert_eq!(codes.try_recv().unwrap().expose(), b"c0de#st8");
        t.feed(
            b"Couldn't log in: That code wasn't accepted. Sign in again to get a new code.\n",
            &mut |_| {},
        );
        let e = t.failure(&spec, Some(1));
        assert_eq!(e.exit_code(), 4);
        assert!(
            e.message.ends_with(
                ": Couldn't log in: That code wasn't accepted. Sign in again to get a new code."
            ),
            "{}",
            e.message
        );
    }

    #[test]
    fn geminis_terminal_echo_is_not_told_and_a_refusal_ends_the_flow() {
        let spec = Spec::of(ProviderKind::Gemini).login;
        let paste = spec
            .paste_code
            .clone()
            .expect("gemini's flow is a paste-code one");
        assert!(spec.tty && spec.stays && !paste.with_state);
        let (reply, _codes) = tokio::sync::mpsc::channel(1);
        let mut t = Transcript::new(ProviderKind::Gemini);
        t.paste = Some((paste.prompt, Some(CodeReply(reply))));
        t.refused = paste.refused;
        let mut told = Vec::new();
        // As gemini 0.61.0 writes it on its terminal: the alternate screen, the URL, the
        // prompt with no line end, then (once the code went in) the echo and the refusal.
        let out = "\x1b[?1049h\x1b[2J\x1b[HPlease visit the following URL to authorize the application:\r\n\r\n\
            https://accounts.google.com/o/oauth2/v2/auth?redirect_uri=x&code_challenge=c&state=s\r\n\r\n\
            \x1b[1G\x1b[0JEnter the authorization code:  \x1b[1G";
        t.feed(out.as_bytes(), &mut |e| {
            if let LoginEvent::AskCode(p, _) = e {
                told.push(p.url.clone());
            }
        });
        assert_eq!(
            told,
            ["https://accounts.google.com/o/oauth2/v2/auth?redirect_uri=x&code_challenge=c&state=s"]
        );
        t.pasted = Some("4/0Secret".into());
        let mut lines = Vec::new();
        t.feed(
            b"4/0Secret\r\r\nFailed to authenticate with authorization code:invalid_grant\r\n\r\nFailed to authenticate with user code. Retrying...\r\n",
            &mut |e| {
                if let LoginEvent::Line(l) = e {
                    lines.push(l.to_string());
                }
            },
        );
        assert!(lines.iter().all(|l| !l.contains("4/0Secret")), "{lines:?}");
        let e = t.failure(&spec, None);
        assert_eq!(e.exit_code(), 4);
        assert!(
            e.message.ends_with(
                "gemini login failed: Failed to authenticate with authorization code:invalid_grant"
            ),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_spec_without_a_flow_says_why_in_one_line() {
        let spec: LoginSpec = serde_json::from_value(serde_json::json!({
            "api_key_env": "K",
            "unavailable": "no login of this CLI finishes in a container; instead: --with-api-key"
        }))
        .unwrap();
        let e = unavailable(ProviderKind::Gemini, &spec);
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.message,
            "gemini: no login of this CLI finishes in a container; instead: --with-api-key"
        );
    }

    #[test]
    fn a_pasted_code_must_be_the_whole_code() {
        let p = ProviderKind::ClaudeCode;
        let code = |s: &str| pasted(p, true, Some(Secret::new(s.as_bytes().to_vec())));
        assert_eq!(code(" abc#def\n").unwrap().expose(), b"abc#def");
        for bad in ["abc", "abc#", "#def", "a b#c", ""] {
            assert_eq!(code(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
        assert_eq!(pasted(p, true, None).unwrap_err().exit_code(), 2);
        // Google's page shows the code alone.
        let google = |s: &str| {
            pasted(
                ProviderKind::Gemini,
                false,
                Some(Secret::new(s.as_bytes().to_vec())),
            )
        };
        assert_eq!(google("4/0Ab_x-Y\n").unwrap().expose(), b"4/0Ab_x-Y");
        for bad in ["4/0 Ab", "", "\u{e9}"] {
            assert_eq!(google(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn words_that_are_no_codes_are_not_taken_for_one() {
        assert_eq!(find_code("see RFC-8628 for it"), None);
        assert_eq!(find_code("code: WXYZ-9876."), Some("WXYZ-9876".into()));
        assert_eq!(find_code("x-api-key"), None);
        assert_eq!(
            find_url("go to https://a.example/x?y=1."),
            Some("https://a.example/x?y=1".into())
        );
    }
}
