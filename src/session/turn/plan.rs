//! One turn, planned once in caw-box's terms ([`TurnPlan`]): the agent and its command,
//! who it runs as, its state and workspace, its credentials (injected into its runtime
//! files, or held by a broker it reaches), its egress (open, or an allow-list held by a
//! proxy), its limits and runtime, and what happens around the CLI (a new state volume
//! filled, files put in HOME, refreshed credentials written back). `runner` realises the
//! plan through the backend, which realises its parts its own way (`backend::plan`).

use crate::auth::inject::Prepared;
use crate::backend::{Backend, BrokerPlace, EgressRoute};
use crate::backend::{Limits, MountSpec, NetworkPolicy, TurnSpec};
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::{HomeFile, Provider, TurnCommand, TurnRequest, AGENT_HOME, WORKSPACE_DIR};
use crate::session::broker::Broker;
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{labels, roles, SessionRecord, WorkspaceMode};
use crate::session::turn::runtime::{Runtime, RUN_DIR};
use crate::session::turn::{container_name, TurnOptions, ENTRY_GRACE_SECS};
use crate::session::walls::egress::Egress;
use crate::session::walls::quarantine::Guard;

/// A turn's process limit when the session sets none (`--pids-limit`).
pub const DEFAULT_PIDS_LIMIT: i64 = 512;

/// The turn's interception CA certificate in its runtime directory (public).
const INTERCEPT_CA_FILE: &str = "intercept-ca.pem";

/// One turn of a session as the session layer plans it, before anything is made: what
/// `runner::run_turn` hands the backend, and what it does before and after the CLI.
pub(in crate::session) struct TurnPlan {
    /// The turn's container (its pod), also the session's lock.
    pub name: String,
    pub turn: u32,
    /// The uid:gid the agent runs as (`owner::turn_ids`); the session's volumes are handed
    /// to it first when they belong to someone else.
    pub ids: (u32, u32),
    /// The agent: image, command, environment, state volume, workspace and protected
    /// paths, runtime files, limits, network, runtime; a broker sidecar and the
    /// allow-list where the backend holds them in the turn's own unit.
    pub spec: TurnSpec,
    /// The runtime files for the container's stdin (a headless turn), else `None`: they
    /// are in [`TurnSpec::runtime`].
    pub payload: Option<Vec<u8>>,
    /// The credentials' path: a broker holds the real ones (the agent gets placeholders),
    /// or `None`: they are injected in the runtime files.
    pub broker: Option<Broker>,
    /// The turn's egress: its proxy's plan, how the backend routes the agent through it,
    /// and what the proxy sees of the turn; `None`: no proxy (the host's network).
    pub egress: Option<Egress>,
    /// The session's first turn puts files in HOME: the new state volume gets the image's
    /// HOME first, where the backend fills one only when a container first starts
    /// ([`Capabilities::fill_volume_first`](crate::backend::Capabilities::fill_volume_first)).
    pub fill_home: bool,
    /// Files put in HOME before the CLI starts (the user's setup, the adapter's files).
    pub home_files: Vec<HomeFile>,
    /// A bound workspace's protected paths, read-only to the agent and swept after it.
    pub guard: Option<crate::session::walls::quarantine::Guard>,
    /// The turn got credential files the CLI may refresh: they are read back after it and
    /// written to the store.
    pub writes_back: bool,
    /// How long (seconds) the turn's container stays warm for the session's next turn
    /// (`--keep-warm`, `session::warm`); `None`: it goes with the turn.
    pub warm_for: Option<u64>,
}

/// Plans `record`'s next turn. Changes nothing outside `record` (its vendor key chosen up
/// front, whether its HOME is unlike the image's): an `Err` leaves nothing made.
pub(in crate::session) async fn plan_turn(
    backend: &impl Backend,
    record: &mut SessionRecord,
    options: &TurnOptions,
) -> Result<TurnPlan> {
    let provider = record.provider.adapter();
    let turn = record.next_turn();
    let name = container_name(record);

    record.cli_version = image_cli_version(backend, &record.settings.image).await;
    let (first_turn, new_key) = choose_key(record, provider);
    let request = turn_request(record, options, first_turn, new_key.as_deref());
    // Who the turn runs as: decided once, here; kept in the record by `ensure_owner`.
    let ids = crate::session::walls::owner::turn_ids(&record.settings);
    let mut runtime = Runtime::new(ids);
    // The backend says how it holds the agent to its egress (a network whose way out is a
    // proxy container, or the turn's own pod); the agent's network is known before the
    // broker, which goes there too. What the proxy admits is known after: the model's host
    // only where no broker is the way to it.
    let route = crate::session::walls::egress::plan(backend, record, &name, true)
        .map(|p| backend.egress_route(&p));
    let (place, credentials, broker) =
        plan_credentials(backend, record, options, &name, route.as_ref()).await?;
    let egress = crate::session::walls::egress::plan(backend, record, &name, broker.is_none())
        .map(|p| Egress::new(backend, p));
    let route = egress.as_ref().map(|e| e.route.clone());
    let request = TurnRequest {
        endpoint: broker
            .as_ref()
            .map_or(request.endpoint, |b| Some(b.url.as_str())),
        ..request
    };
    for (path, contents) in &credentials.files {
        runtime.write(path, contents);
    }
    let command = provider.turn_command(&TurnRequest {
        credential_env: &credentials.names,
        ..request
    });
    let mut env = agent_env(
        &mut runtime,
        options,
        provider,
        &command,
        ids,
        broker.as_ref(),
    );
    let unlike_image = provider.merges_unlike_its_image(&TurnRequest {
        credential_env: &credentials.names,
        ..request
    });
    let (home_files, fill_home) = home_files(record, options, &command, unlike_image);
    if let Some(r) = &route {
        proxy_env(&mut env, r, broker.as_ref());
    }
    let payload = if options.interactive {
        None
    } else {
        Some(runtime.payload()?)
    };
    let over_stdin = payload.is_some();
    let (mut spec, guard) = agent_spec(record, turn, options, &command, env, runtime, over_stdin)?;
    if let Some(b) = broker.as_ref().filter(|b| b.in_turn()) {
        tracing::debug!("credentials brokered beside the agent by {}", b.container);
        spec.broker = Some(crate::session::broker::LOADER.to_string());
    }
    if let Some(net) = broker.as_ref().and_then(Broker::agent_network) {
        spec.network = net;
    }
    if let Some(net) = route.as_ref().and_then(|r| r.agent_network.clone()) {
        spec.network = NetworkPolicy::Named(net);
    }
    // Where another process (`logs -f`, MCP's progress) reads the turn's refusals from.
    if let Some(e) = &egress {
        spec.labels.extend(e.labels());
    }
    // A backend that holds egress in the turn's own unit does it from the spec.
    if let Some(e) = egress.as_ref().filter(|e| !e.plan.shared) {
        spec.egress_allow = e.plan.allow.clone();
        spec.egress_policy = Some(e.plan.policy);
    }
    let warm_for = crate::session::turn::warm::keep_for(
        backend,
        record,
        &name,
        options,
        // A proxy of the turn's own goes with it; a shared one stays for a warm turn.
        egress.as_ref().is_some_and(Egress::goes_with_turn),
        place,
        spec.broker.is_some(),
    )
    .await?;
    if finishes_behind(backend, options, warm_for, egress.as_ref()) {
        spec.env.push("CAW_BOX_HANDOFF_ACK=1".to_string());
    }
    Ok(TurnPlan {
        name,
        turn,
        ids,
        spec,
        payload,
        broker,
        egress,
        fill_home,
        home_files,
        guard,
        writes_back: crate::auth::inject::has_files(&credentials),
        warm_for,
    })
}

/// Whether the turn's container may finish behind it (`Capabilities::finishes_behind`): a
/// headless turn of a container of its own, whose egress (a shared proxy, or none) does not
/// go with the turn. The entrypoint is asked to say when its record is in
/// (`CAW_BOX_HANDOFF_ACK`); whether it did decides, at the turn's end.
fn finishes_behind(
    backend: &impl Backend,
    options: &TurnOptions,
    warm_for: Option<u64>,
    egress: Option<&Egress>,
) -> bool {
    backend.capabilities().finishes_behind
        && !options.interactive
        && warm_for.is_none()
        && !egress.is_some_and(Egress::goes_with_turn)
}

/// The CLI version of the session's image, from its label; `None` when it has none (an
/// image built some other way) or the backend cannot say (a cluster's nodes hold the images):
/// the adapter then takes it to be the pinned one.
async fn image_cli_version(backend: &impl Backend, image: &str) -> Option<String> {
    let info = backend.inspect_image(image).await.ok().flatten()?;
    info.labels.get(labels::CLI_VERSION).cloned()
}

/// Whether the turn starts a new vendor conversation (until the vendor has confirmed a
/// key in its output), and the key it starts it with where caw-box chooses it.
fn choose_key(record: &mut SessionRecord, provider: &dyn Provider) -> (bool, Option<String>) {
    let first_turn = !record.key_confirmed || record.resume_key.is_empty();
    let mut new_key = None;
    if first_turn && provider.chooses_key_up_front() {
        if record.resume_key.is_empty() {
            record.resume_key = uuid::Uuid::new_v4().to_string();
        }
        new_key = Some(record.resume_key.clone());
    }
    (first_turn, new_key)
}

/// What the provider adapter is asked for, before the credentials are known.
fn turn_request<'a>(
    record: &'a SessionRecord,
    options: &'a TurnOptions,
    first_turn: bool,
    new_key: Option<&'a str>,
) -> TurnRequest<'a> {
    TurnRequest {
        prompt: &options.prompt,
        cli_version: record.cli_version.as_deref(),
        resume_key: if first_turn {
            None
        } else {
            Some(record.resume_key.as_str())
        },
        new_session_key: new_key,
        continue_last: first_turn && new_key.is_none() && !record.turns.is_empty(),
        model: record.settings.model.as_deref(),
        endpoint: record.settings.endpoint.as_deref(),
        interactive: options.interactive,
        credential_env: &[],
        system_prompt: record.settings.system_prompt.as_deref(),
        append_system_prompt: record.settings.append_system_prompt.as_deref(),
        effort: record.settings.effort,
        tools: record.settings.tools.as_ref(),
        mcp: &record.settings.mcp,
    }
}

/// The turn's credentials, and where the backend puts a broker: brokered when asked for
/// and the turn has a network to put a broker on, else (or where no broker is planned)
/// injected into the runtime files.
async fn plan_credentials(
    backend: &impl Backend,
    record: &SessionRecord,
    options: &TurnOptions,
    name: &str,
    egress: Option<&EgressRoute>,
) -> Result<(BrokerPlace, Prepared, Option<Broker>)> {
    // (A turn that outlives its driver has a broker that does too: one in its own unit.)
    let place = backend.capabilities().broker_place;
    let want_broker = !options.inject_credentials
        && !matches!(
            NetworkPolicy::from_setting(&record.settings.network),
            NetworkPolicy::None | NetworkPolicy::Host
        );
    let mut credentials =
        crate::auth::inject::prepare_as(record.provider, &options.env, want_broker)?;
    let brokers_any = !credentials.brokered.is_empty() || !credentials.logins.is_empty();
    let route = |plan: &crate::backend::BrokerPlan| backend.broker_route(plan);
    let site = crate::session::broker::Site {
        place,
        route: &route,
        turn: name,
        egress,
    };
    let broker = Broker::plan(record, &site, &credentials.brokered, &credentials.logins);
    if broker.is_none() && brokers_any {
        credentials = crate::auth::inject::prepare(record.provider, &options.env)?;
    }
    if let Some(b) = &broker {
        tracing::debug!("credentials brokered by {}", b.container);
    }
    Ok((place, credentials, broker))
}

/// The agent's environment, and the runtime files that go with it: the turn's `--env`,
/// what an adopter needs to finish the turn, the interception CA, the CLI's stdin.
fn agent_env(
    runtime: &mut Runtime,
    options: &TurnOptions,
    provider: &dyn Provider,
    command: &TurnCommand,
    ids: (u32, u32),
    broker: Option<&Broker>,
) -> Vec<String> {
    let mut env_file = Vec::new();
    for (k, v) in &options.env {
        env_file.extend_from_slice(k.as_bytes());
        env_file.push(b'=');
        env_file.extend_from_slice(v.as_bytes());
        env_file.push(0);
    }
    runtime.write("env", &env_file);
    if !options.interactive {
        // For whoever finishes the turn if this process is gone, where the backend keeps
        // it for an adopter (`labels::ADOPTABLE`, `headless::adopt`).
        runtime.write(
            crate::session::turn::headless::PROMPT_FILE,
            options.prompt.as_bytes(),
        );
        if let Some(timeout) = options.timeout {
            let millis = timeout.as_millis().to_string();
            runtime.write(
                crate::session::turn::headless::TIMEOUT_FILE,
                millis.as_bytes(),
            );
        }
    }
    let mut env: Vec<String> = command
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.push(format!("HOME={AGENT_HOME}"));
    env.push(format!("CAW_BOX_STOP_GRACE={ENTRY_GRACE_SECS}"));
    env.push(format!("CAW_BOX_RUN_DIR={RUN_DIR}"));
    if ids.0 == 0 {
        // The workspace's owner is root: claude skips its permission prompts as root only
        // in what it is told is a sandbox (the container is one; the other CLIs ignore it).
        env.push("IS_SANDBOX=1".to_string());
    }
    if let Some(i) = broker.and_then(Broker::intercept) {
        // The turn's CA: its CLI trusts the broker standing in for the intercepted hosts.
        runtime.write(INTERCEPT_CA_FILE, i.ca_pem.as_bytes());
        env.push(format!("NODE_EXTRA_CA_CERTS={RUN_DIR}/{INTERCEPT_CA_FILE}"));
    }
    if !options.interactive {
        // The runtime files and, after the CLI, the record: both on the container's stdin.
        env.push("CAW_BOX_RUNTIME=stdin".to_string());
        env.push("CAW_BOX_HANDOFF=stdin".to_string());
    }
    match &command.stdin {
        // The prompt (how every adapter hands it over): the file it is in already, so a
        // large one travels once.
        Some(stdin) if !options.interactive && *stdin == options.prompt.as_bytes() => {
            let file = crate::session::turn::headless::PROMPT_FILE;
            env.push(format!("CAW_BOX_STDIN_FILE={RUN_DIR}/{file}"));
        }
        Some(stdin) => {
            runtime.write("stdin", stdin);
            env.push(format!("CAW_BOX_STDIN_FILE={RUN_DIR}/stdin"));
        }
        None => {}
    }
    if options.interactive {
        env.push(format!("TERM={}", crate::terminal::term()));
        if let Ok(colorterm) = std::env::var("COLORTERM") {
            env.push(format!("COLORTERM={colorterm}"));
        }
        env.push(format!(
            "{}={}",
            crate::provider::KEY_SCRIPT_ENV,
            provider.latest_key_script()
        ));
    }
    env
}

/// The files put in HOME before the CLI starts, and whether the new state volume gets
/// the image's HOME first. Records whether this turn's HOME is unlike the image's.
fn home_files(
    record: &mut SessionRecord,
    options: &TurnOptions,
    command: &TurnCommand,
    unlike_image: bool,
) -> (Vec<HomeFile>, bool) {
    // Files an adapter merges into HOME (gemini's settings.json) come with its image and
    // stay in the volume: only a custom image's first turn, or a turn after one in the TUI
    // (where they may have been changed), pays the download and upload of a merge.
    // Agent settings can live in a merged file (gemini's settings.json): merged every turn
    // that has them; so is a file that differs from the image's (gemini's login choice).
    let agent_merge = record.settings.append_system_prompt.is_some()
        || record.settings.effort.is_some()
        || record.settings.tools.is_some()
        || !record.settings.mcp.is_empty();
    // A turn after one that merged unlike the image merges too: that undoes it.
    let merge_due = options.interactive
        || agent_merge
        || unlike_image
        || record.home_unlike_image
        || match record.turns.last() {
            Some(last) => last.interactive,
            None => record.settings.image != record.provider.default_image(),
        };
    record.home_unlike_image = unlike_image;
    // The user's setup first; the adapter's files after it, also those merged into a file
    // the user's setup just replaced.
    let user_paths: Vec<&str> = options.user_files.iter().map(|f| f.path.as_str()).collect();
    let home_files: Vec<_> = options
        .user_files
        .iter()
        .chain(
            command
                .home_files
                .iter()
                .filter(|f| merge_due || !f.merge_json || user_paths.contains(&f.path.as_str())),
        )
        .cloned()
        .collect();
    // The image's HOME goes into a new state volume before files are placed in it: they
    // would keep the image's own out (gemini's settings, codex's config.toml) where the
    // engine fills a volume only when it is empty at a container's first start (Podman).
    let fill_home = record.turns.is_empty() && !home_files.is_empty();
    (home_files, fill_home)
}

/// Routes the agent's web traffic through the egress proxy, all but what goes to its
/// broker.
fn proxy_env(env: &mut Vec<String>, route: &EgressRoute, broker: Option<&Broker>) {
    for var in &crate::backend::PROXY_VARS[..4] {
        env.push(format!("{var}={}", route.proxy_url));
    }
    let mut direct = route.direct.join(",");
    // Model traffic goes to the broker directly (where the agent reaches it already
    // without the proxy, it is said once).
    if let Some(b) = broker {
        if !route.direct.iter().any(|d| d == b.host()) {
            direct = format!("{direct},{}", b.host());
        }
        // The hosts it stands in for, too: the proxy would reach the real ones.
        for host in b.intercept().map_or(&[][..], |i| &i.hosts[..]) {
            direct = format!("{direct},{host}");
        }
    }
    for var in &crate::backend::PROXY_VARS[4..] {
        env.push(format!("{var}={direct}"));
    }
    tracing::debug!("egress through {}", route.proxy_log);
}

/// The agent's container: the session's [`turn_spec`] with this turn's protected paths
/// (read-only to the agent as they are now, swept after it), its runtime files (on stdin
/// instead where `over_stdin`) and its terminal.
fn agent_spec(
    record: &SessionRecord,
    turn: u32,
    options: &TurnOptions,
    command: &TurnCommand,
    env: Vec<String>,
    runtime: Runtime,
    over_stdin: bool,
) -> Result<(TurnSpec, Option<Guard>)> {
    // (A missing image shows when the turn's container is created: no inspect per turn.)
    let mut spec = turn_spec(
        record,
        turn,
        &record.settings.image,
        command.argv.clone(),
        env,
        runtime.into_scratch(),
    )?;
    // The protected paths as they are now: those there are read-only to the agent.
    let guard = crate::session::walls::quarantine::for_turn(record, turn)?;
    spec.protected = guard.as_ref().map(|g| g.mounts()).unwrap_or_default();
    spec.runtime_over_stdin = over_stdin;
    if over_stdin {
        // On stdin instead: nothing to put in before the start.
        spec.runtime.files.clear();
    }
    if options.interactive {
        spec.interactive = Some(crate::terminal::size());
    }
    Ok((spec, guard))
}

/// The turn as the backend runs it: the session's image, volumes and limits.
pub(in crate::session) fn turn_spec(
    record: &SessionRecord,
    turn: u32,
    image: &str,
    argv: Vec<String>,
    env: Vec<String>,
    mut runtime: crate::backend::Scratch,
) -> Result<TurnSpec> {
    let settings = &record.settings;
    // Found by these when its container is removed from outside without it (its prompt in
    // it): the session's next turn and `gc` remove it (`runtime::remove_unused`).
    runtime.labels = LabelSet::new(record.session_id, roles::RUNTIME)
        .provider(record.provider)
        .with(labels::TURN, turn.to_string())
        .finish();
    let workspace = match settings.workspace_mode {
        WorkspaceMode::Copy => Some(MountSpec::volume(
            names::workspace_volume(record.session_id),
            WORKSPACE_DIR,
        )),
        WorkspaceMode::Bind => match &settings.workspace {
            Some(ws) => {
                if !std::path::Path::new(ws).is_dir() {
                    return Err(Error::environment(format!(
                        "the session's workspace '{ws}' does not exist"
                    ))
                    .with_hint("recreate it, or pass --workspace DIR"));
                }
                Some(MountSpec::host_dir(ws.clone(), WORKSPACE_DIR))
            }
            None => None,
        },
        WorkspaceMode::None => None,
    };
    let mut labels = LabelSet::new(record.session_id, roles::TURN)
        .provider(record.provider)
        .with(labels::TURN, turn.to_string())
        .with(labels::DRIVER_PID, std::process::id().to_string())
        .with(labels::DRIVER_HOST, dirs::host_name());
    if let Some(name) = &record.name {
        labels = labels.with(labels::NAME, name.clone());
    }
    Ok(TurnSpec {
        image: image.to_string(),
        argv,
        env,
        user: runtime.owner,
        working_dir: WORKSPACE_DIR.to_string(),
        labels: labels.finish(),
        home: MountSpec::volume(names::state_volume(record.session_id), AGENT_HOME),
        workspace,
        protected: Vec::new(),
        runtime,
        runtime_over_stdin: false,
        limits: Limits {
            memory: settings.memory,
            cpus: settings.cpus,
            pids: settings.pids_limit.unwrap_or(DEFAULT_PIDS_LIMIT),
        },
        network: NetworkPolicy::from_setting(&settings.network),
        interactive: None,
        broker: None,
        egress_allow: vec![],
        egress_policy: Default::default(),
        extra_hosts: Vec::new(),
        oci_runtime: settings.runtime.clone(),
        hand_over: Vec::new(),
        checkpoint: Vec::new(),
    })
}

#[cfg(test)]
pub(in crate::session) mod tests {
    use super::*;
    use crate::provider::ProviderKind;
    use crate::session::store::record::SessionSettings;
    use crate::session::turn::runtime::RUNTIME_MOUNT;

    pub(in crate::session) fn record(network: &str) -> SessionRecord {
        SessionRecord {
            version: 1,
            session_id: uuid::Uuid::new_v4(),
            provider: ProviderKind::Codex,
            name: None,
            group: None,
            resume_key: String::new(),
            key_confirmed: false,
            owner: None,
            created_at: 0,
            settings: SessionSettings {
                image: "caw-box/codex:latest".into(),
                network: network.into(),
                workspace_mode: WorkspaceMode::None,
                memory: Some(512 << 20),
                cpus: Some(1.5),
                pids_limit: Some(300),
                ..Default::default()
            },
            turns: Vec::new(),
            home_unlike_image: false,
            turn_started: false,
            summary_only: false,
            cli_version: None,
        }
    }

    /// The turn as the backend gets it: the session's settings in caw-box's terms.
    #[test]
    fn the_turn_spec_carries_the_sessions_settings() {
        let dir = || {
            let mut rt = Runtime::new((1000, 1000));
            rt.write("env", b"SECRET=x");
            rt.into_scratch()
        };
        let r = record("team-gateway");
        let spec = turn_spec(
            &r,
            3,
            "img",
            vec!["codex".into()],
            vec!["A=1".into()],
            dir(),
        )
        .unwrap();
        assert_eq!(spec.network, NetworkPolicy::Named("team-gateway".into()));
        assert_eq!(
            spec.limits,
            Limits {
                memory: Some(512 << 20),
                cpus: Some(1.5),
                pids: 300
            }
        );
        assert_eq!(
            spec.home,
            MountSpec::volume(format!("caw-box-{}", r.session_id), AGENT_HOME)
        );
        // The runtime files travel in the spec, never as a host path; Debug shows no secret.
        assert_eq!(spec.runtime.mount, RUNTIME_MOUNT);
        assert_eq!(spec.runtime.files[0].path, "env");
        assert!(!format!("{spec:?}").contains("SECRET"));
        assert_eq!(spec.workspace, None, "workspace mode none");
        assert_eq!(spec.interactive, None);
        assert_eq!(spec.working_dir, WORKSPACE_DIR);
        let label = |k: &str| spec.labels.get(k).map(String::as_str);
        assert_eq!(label(labels::MANAGED), Some("true"));
        assert_eq!(label(labels::ROLE), Some(roles::TURN));
        assert_eq!(label(labels::TURN), Some("3"));
        assert_eq!(label(labels::PROVIDER), Some("codex"));
        let session = r.session_id.to_string();
        assert_eq!(label(labels::SESSION), Some(session.as_str()));
        let pid = std::process::id().to_string();
        assert_eq!(label(labels::DRIVER_PID), Some(pid.as_str()));
        // Its runtime scratch is the session's too, as the turn's runtime: found by these
        // when its container was removed without it.
        let scratch = |k: &str| spec.runtime.labels.get(k).map(String::as_str);
        assert_eq!(scratch(labels::MANAGED), Some("true"));
        assert_eq!(scratch(labels::SESSION), Some(session.as_str()));
        assert_eq!(scratch(labels::ROLE), Some(roles::RUNTIME));
        assert_eq!(scratch(labels::TURN), Some("3"));
        for (setting, policy) in [
            ("open", NetworkPolicy::Default),
            ("none", NetworkPolicy::None),
            ("host", NetworkPolicy::Host),
        ] {
            let spec = turn_spec(&record(setting), 1, "img", vec![], vec![], dir()).unwrap();
            assert_eq!(spec.network, policy, "{setting}");
        }
    }

    #[test]
    fn the_workspace_mount_follows_the_workspace_mode() {
        let dir = crate::backend::Scratch::default;
        let mut r = record("none");
        r.settings.pids_limit = None;
        r.settings.workspace_mode = WorkspaceMode::Copy;
        let spec = turn_spec(&r, 1, "img", vec![], vec![], dir()).unwrap();
        assert_eq!(spec.limits.pids, 512, "the default pids limit");
        assert_eq!(
            spec.workspace,
            Some(MountSpec::volume(
                format!("caw-box-{}-workspace", r.session_id),
                WORKSPACE_DIR
            ))
        );
        let host = tempfile::tempdir().unwrap();
        r.settings.workspace_mode = WorkspaceMode::Bind;
        r.settings.workspace = Some(host.path().display().to_string());
        let spec = turn_spec(&r, 1, "img", vec![], vec![], dir()).unwrap();
        assert_eq!(
            spec.workspace,
            Some(MountSpec::host_dir(
                host.path().display().to_string(),
                WORKSPACE_DIR
            ))
        );
        // A bind workspace that is gone refuses the turn, with what to do.
        r.settings.workspace = Some(host.path().join("gone").display().to_string());
        let e = turn_spec(&r, 1, "img", vec![], vec![], dir()).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.message.contains("does not exist"), "{}", e.message);
    }

    /// A headless turn's prompt (the CLI's stdin, from every adapter) travels in the runtime
    /// files once, however large, and is what the entrypoint feeds the CLI.
    #[test]
    fn the_prompt_is_in_the_runtime_files_once_as_the_clis_stdin() {
        let prompt = "y".repeat(300 * 1024);
        let options = TurnOptions {
            prompt: prompt.clone(),
            ..Default::default()
        };
        for kind in ProviderKind::ALL {
            let provider = kind.adapter();
            let command = provider.turn_command(&TurnRequest {
                prompt: &prompt,
                ..Default::default()
            });
            let mut runtime = Runtime::new((1000, 1000));
            let env = agent_env(
                &mut runtime,
                &options,
                provider,
                &command,
                (1000, 1000),
                None,
            );
            assert!(
                env.contains(&format!("CAW_BOX_STDIN_FILE={RUN_DIR}/prompt")),
                "{kind}: {env:?}"
            );
            let scratch = runtime.into_scratch();
            let holding: Vec<&str> = scratch
                .files
                .iter()
                .filter(|f| f.contents == prompt.as_bytes())
                .map(|f| f.path.as_str())
                .collect();
            assert_eq!(holding, ["prompt"], "{kind}");
        }
    }
}
