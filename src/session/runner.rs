//! Runs one turn of a session in a fresh container: the orchestration between a provider
//! adapter (what to run, how to read it) and the backend (running it).
//!
//! The container name `caw-box-<session_id>` is the session's lock: the backend refuses a
//! second container of the same name atomically, so two racing turns cannot both start. Whatever
//! way the turn ends (answer, CLI crash, timeout, Ctrl-C), the container is removed and the
//! session's record in its state volume is brought up to date, so it stays resumable.
//!
//! This file is the turn's life, from its spec to its container's removal; the jobs it
//! hands out live beside it: the per-turn runtime dir (`runtime.rs`), the egress proxy
//! (`egress.rs`), the ownership helper (`owner.rs`), driver liveness (`liveness.rs`), the
//! two drivers (`headless.rs`, `interactive.rs`), what they share (`turn.rs`) and the
//! stored history with the record hand-off (`history.rs`). What other modules use is
//! re-exported here.

use super::broker::Broker;
use super::liveness::{driver_is_gone, remove_abandoned_turns};
use super::owner::{ensure_owner, fill_new_home};
use super::runtime::{Runtime, RUN_DIR};
use super::turn::{busy, image_hint, Interrupts, TurnContext, ENTRY_GRACE_SECS, STOP_GRACE};
use crate::backend::{Backend, CreateError};
use crate::backend::{Limits, MountSpec, NetworkPolicy, TurnSpec};
use crate::dirs;
use crate::error::{Error, Result};
use crate::event::{Event, TurnResult};
use crate::provider::{TurnRequest, AGENT_HOME, WORKSPACE_DIR};
use crate::session::names::{self, LabelSet};
use crate::session::record::{labels, roles, SessionRecord, WorkspaceMode};

/// A turn's process limit when the session sets none (`--pids-limit`).
pub const DEFAULT_PIDS_LIMIT: i64 = 512;

/// The turn's interception CA certificate in its runtime directory (public).
const INTERCEPT_CA_FILE: &str = "intercept-ca.pem";

pub use super::egress::{proxy_env, PROXY_ALIAS, PROXY_PORT, PROXY_SCRIPT};
pub use super::headless::model_host;
pub use super::history::cache_record;
pub use super::runtime::{RUNTIME_MOUNT, RUN_DIR as RUNTIME_DIR, STOP_REQUEST};
pub use super::turn::{
    container_name, handle_of, image_hint_for, leave_signals_to_the_caller, turn_error,
    TurnOptions, DEFAULT_CONNECT_TIMEOUT,
};

/// Runs one turn of `record`'s session and updates `record` with it.
///
/// `sink` sees every unified event as it happens, ending with the `result` event.
/// Returns the turn's result; an `Err` means the turn could not be run at all (bad
/// environment, busy session), in which case nothing about the session changed.
pub async fn run_turn(
    backend: &impl Backend,
    record: &mut SessionRecord,
    options: &TurnOptions,
    sink: &mut dyn FnMut(&Event),
) -> Result<TurnResult> {
    record.settings.check_agent_config(record.provider)?;
    let provider = record.provider.adapter();
    let turn = record.next_turn();
    let name = container_name(record);
    let mut interrupts = Interrupts::install()?;

    let image = record.settings.image.clone();
    // (A missing image shows when the turn's container is created: no inspect per turn.)

    // A new vendor conversation until the vendor has confirmed a key in its output.
    let first_turn = !record.key_confirmed || record.resume_key.is_empty();
    let mut new_key = None;
    if first_turn && provider.chooses_key_up_front() {
        if record.resume_key.is_empty() {
            record.resume_key = uuid::Uuid::new_v4().to_string();
        }
        new_key = Some(record.resume_key.clone());
    }
    let request = TurnRequest {
        prompt: &options.prompt,
        resume_key: if first_turn {
            None
        } else {
            Some(record.resume_key.as_str())
        },
        new_session_key: new_key.as_deref(),
        model: record.settings.model.as_deref(),
        endpoint: record.settings.endpoint.as_deref(),
        interactive: options.interactive,
        credential_env: &[],
        system_prompt: record.settings.system_prompt.as_deref(),
        append_system_prompt: record.settings.append_system_prompt.as_deref(),
        effort: record.settings.effort,
        tools: record.settings.tools.as_ref(),
        mcp: &record.settings.mcp,
    };
    // Who the turn runs as: decided once, here; kept in the record by `ensure_owner`.
    let ids = super::owner::turn_ids(&record.settings);
    let mut runtime = Runtime::new(ids);
    let allow = crate::settings::expand_allow_hosts(record.provider, &record.settings);
    // Planned once; the backend says how it holds the agent to it (its own network and a
    // proxy container, or the turn's own pod).
    let egress = (!allow.is_empty()).then(|| super::egress::plan(record, &allow, &name));
    let route = egress.as_ref().map(|p| backend.egress_route(p));
    let egress_network = route.as_ref().and_then(|r| r.agent_network.clone());
    // Brokered when asked for, and the turn has a network to put a broker on.
    // (A turn that outlives its driver has a broker that does too: one in its own unit.)
    let place = backend.broker_place().await;
    let in_pod = place == crate::backend::BrokerPlace::InTurn;
    let want_broker = !options.inject_credentials
        && !matches!(
            NetworkPolicy::from_setting(&record.settings.network),
            NetworkPolicy::None | NetworkPolicy::Host
        );
    let mut credentials =
        crate::auth::inject::prepare_as(record.provider, &options.env, want_broker)?;
    let brokers_any = !credentials.brokered.is_empty() || !credentials.logins.is_empty();
    let shared = brokers_any && place == crate::backend::BrokerPlace::SharedContainer;
    let broker = if in_pod {
        Broker::plan_in_pod(record, &credentials.brokered, &credentials.logins, &name)
    } else {
        Broker::plan_logins(
            record,
            egress_network.as_deref(),
            &credentials.brokered,
            &credentials.logins,
            shared,
        )
    };
    if broker.is_none() && brokers_any {
        credentials = crate::auth::inject::prepare(record.provider, &options.env)?;
    }
    if let Some(b) = &broker {
        tracing::debug!("credentials brokered by {}", b.container);
    }
    let request = TurnRequest {
        endpoint: broker
            .as_ref()
            .map_or(request.endpoint, |b| Some(b.url.as_str())),
        ..request
    };
    for (path, contents) in &credentials.files {
        runtime.write(path, contents);
    }
    let home_out = std::sync::Mutex::new(None);
    let command = provider.turn_command(&TurnRequest {
        credential_env: &credentials.names,
        ..request
    });
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
        runtime.write(super::headless::PROMPT_FILE, options.prompt.as_bytes());
        if let Some(timeout) = options.timeout {
            let millis = timeout.as_millis().to_string();
            runtime.write(super::headless::TIMEOUT_FILE, millis.as_bytes());
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
    if let Some(i) = broker.as_ref().and_then(Broker::intercept) {
        // The turn's CA: its CLI trusts the broker standing in for the intercepted hosts.
        runtime.write(INTERCEPT_CA_FILE, i.ca_pem.as_bytes());
        env.push(format!("NODE_EXTRA_CA_CERTS={RUN_DIR}/{INTERCEPT_CA_FILE}"));
    }
    if !options.interactive {
        // The runtime files and, after the CLI, the record: both on the container's stdin.
        env.push("CAW_BOX_RUNTIME=stdin".to_string());
        env.push("CAW_BOX_HANDOFF=stdin".to_string());
    }
    if let Some(stdin) = &command.stdin {
        runtime.write("stdin", stdin);
        env.push(format!("CAW_BOX_STDIN_FILE={RUN_DIR}/stdin"));
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

    // Files an adapter merges into HOME (gemini's settings.json) come with its image and
    // stay in the volume: only a custom image's first turn, or a turn after one in the TUI
    // (where they may have been changed), pays the download and upload of a merge.
    // Agent settings can live in a merged file (gemini's settings.json): merged every turn
    // that has them; so is a file that differs from the image's (gemini's login choice).
    let agent_merge = record.settings.append_system_prompt.is_some()
        || record.settings.effort.is_some()
        || record.settings.tools.is_some()
        || !record.settings.mcp.is_empty();
    let unlike_image = provider.merges_unlike_its_image(&TurnRequest {
        credential_env: &credentials.names,
        ..request
    });
    // A turn after one that merged unlike the image merges too: that undoes it.
    let merge_due = options.interactive
        || agent_merge
        || unlike_image
        || record.home_unlike_image
        || match record.turns.last() {
            Some(last) => last.interactive,
            None => image != record.provider.default_image(),
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
    if record.turns.is_empty() && !home_files.is_empty() {
        fill_new_home(backend, record, ids).await?;
    }
    let prepare_broker = async {
        match &broker {
            Some(b) => b.prepare(backend).await,
            None => Ok(()),
        }
    };
    let (owned, prepared) = tokio::join!(ensure_owner(backend, record, ids), prepare_broker);
    if let Err(e) = owned.and(prepared) {
        if let Some(b) = &broker {
            b.stop(backend).await;
        }
        return Err(e);
    }
    if let Some(plan) = &egress {
        if let Err(e) = super::egress::open(backend, record, plan).await {
            if let Some(b) = &broker {
                b.stop(backend).await;
            }
            return Err(e);
        }
    }
    if let Some(r) = &route {
        for var in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            env.push(format!("{var}={}", r.proxy_url));
        }
        let mut direct = "localhost,127.0.0.1".to_string();
        // A broker of its own is on the agent's network: model traffic goes to it
        // directly (one in the turn's pod is on its loopback).
        if let Some(b) = broker.as_ref().filter(|b| !b.in_pod()) {
            direct = format!("{direct},{}", b.container);
            // The hosts it stands in for, too: the proxy would reach the real ones.
            for host in b.intercept().map_or(&[][..], |i| &i.hosts[..]) {
                direct = format!("{direct},{host}");
            }
        }
        env.push(format!("NO_PROXY={direct}"));
        env.push(format!("no_proxy={direct}"));
        tracing::debug!("egress through {}", r.proxy_log);
    }
    let payload = if options.interactive {
        None
    } else {
        Some(runtime.payload()?)
    };
    let mut spec = turn_spec(
        record,
        turn,
        &image,
        command.argv.clone(),
        env,
        runtime.into_scratch(),
    )?;
    // The protected paths as they are now: those there are read-only to the agent.
    let guard = super::quarantine::for_turn(record, turn)?;
    spec.protected = guard.as_ref().map(|g| g.mounts()).unwrap_or_default();
    let mut container_made = false;
    spec.runtime_over_stdin = payload.is_some();
    if payload.is_some() {
        // On stdin instead: nothing to put in before the start.
        spec.runtime.files.clear();
    }
    if options.interactive {
        spec.interactive = Some(crate::terminal::size());
    }
    if let Some(b) = broker.as_ref().filter(|b| b.in_pod()) {
        tracing::debug!("credentials brokered by the sidecar {}", b.container);
        spec.broker = Some(super::broker::sidecar_entrypoint());
    }
    if let Some(net) = broker.as_ref().and_then(Broker::agent_network) {
        spec.network = net;
    }
    if let Some(net) = route.as_ref().and_then(|r| r.agent_network.clone()) {
        spec.network = NetworkPolicy::Named(net);
    }
    spec.egress_allow = allow.clone();
    // The broker starts beside the agent's container, off the turn's critical path: the
    // runtime files (and so the CLI) wait for it on the agent's stdin, not its creation.
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(broker.is_none().then_some(true));
    // A sidecar starts with the turn's pod: handed its keys once the pod runs.
    let (pod_made, mut pod_made_rx) = tokio::sync::watch::channel(false);
    let start_broker = async {
        if let Some(b) = &broker {
            if b.in_pod() && pod_made_rx.wait_for(|made| *made).await.is_err() {
                // The pod was never made: nothing to start, and the turn failed already.
                let _ = ready_tx.send(Some(false));
                return;
            }
            let started = b.start(backend).await;
            if let Err(e) = &started {
                tracing::warn!("{e}");
            }
            let _ = ready_tx.send(Some(started.is_ok()));
        }
    };
    let main = async {
        // A broker that stands in for hosts the CLI reaches directly is where the agent's
        // container resolves them: its address is known once it runs, before the container
        // is made (on that login's turns only, the broker's start is on the critical path).
        let intercepted;
        let spec = match broker.as_ref().and_then(|b| Some((b, b.intercept()?))) {
            Some((b, i)) => {
                let mut ready = ready_rx.clone();
                let started = ready.wait_for(Option::is_some).await.ok().and_then(|r| *r);
                let address = match started {
                    Some(true) => b.address(backend).await?,
                    _ => None,
                };
                let Some(address) = address else {
                    return Err(Error::environment(format!(
                        "the credential broker {} that stands in for {} did not start",
                        b.container,
                        i.hosts.join(", ")
                    )));
                };
                let mut s = spec.clone();
                s.extra_hosts = i.hosts.iter().map(|h| format!("{h}:{address}")).collect();
                intercepted = s;
                &intercepted
            }
            None => &spec,
        };
        let warm_for = super::warm::keep_for(
            backend,
            record,
            options.interactive,
            egress.is_some(),
            place,
        );
        let make = async {
            match warm_for {
                Some(secs) => {
                    let (rec, turn_name): (&SessionRecord, &str) = (record, &name);
                    let create = move |idle: TurnSpec| async move {
                        create_turn_container(backend, rec, turn_name, &idle).await
                    };
                    super::warm::take_or_make(backend, &name, spec, secs, create).await
                }
                None => create_turn_container(backend, record, &name, spec).await,
            }
        };
        let idle_goes = async {
            // A turn that starts cold when the session kept one warm: it goes.
            if warm_for.is_none() && record.settings.keep_warm_secs.is_some() {
                let _ = backend.remove_warm(&name).await;
            }
        };
        let (created, (), ()) =
            tokio::join!(make, remove_abandoned_turns(backend, &name), idle_goes);
        let created = created.inspect(|()| {
            let _ = pod_made.send(true);
        });
        // (Dropped on failure, which frees a sidecar's start from its wait.)
        drop(pod_made);
        created?;
        container_made = true;
        if let Some(plan) = &egress {
            super::egress::remove_leftovers(backend, record, plan).await;
        }
        if let Some(b) = &broker {
            b.remove_leftovers(backend).await;
        }
        // From here on the container exists: every path out must remove it.
        let ctx = TurnContext {
            backend,
            name: &name,
            turn,
            options,
            home_files: &home_files,
            home_out: crate::auth::inject::has_files(&credentials).then_some(&home_out),
            runtime_payload: payload.as_deref(),
            proxy: route.as_ref().map(|r| r.proxy_log.as_str()),
            broker_ready: ready_rx.clone(),
            guard: guard.as_ref(),
            user: ids,
        };
        let outcome = if options.interactive {
            // A TUI's runtime files go in before its start: wait for the broker here.
            let mut ready = ready_rx.clone();
            let _ = ready.wait_for(Option::is_some).await;
            super::interactive::drive_tui(&ctx, record, &mut interrupts, sink).await
        } else {
            super::headless::drive_headless(&ctx, record, &mut interrupts, sink).await
        };
        if outcome.is_err() {
            // A recorded turn's container is gone already (save_record released the lock);
            // removing it again could remove the next turn's.
            // A stop first, not a kill: the entrypoint then removes the credentials it put
            // in HOME, and writes back refreshed ones.
            let _ = backend.stop_container(&name, STOP_GRACE).await;
            let _ = backend.remove_container(&name, true).await;
        }
        outcome
    };
    let ((), mut outcome) = tokio::join!(start_broker, main);
    if let Some(g) = guard.as_ref().filter(|_| container_made) {
        // Again, now that the container is surely gone (its driver may have failed before
        // the first sweep, or an agent's process outlived it): what this one moves is said.
        let swept = g.sweep();
        match &mut outcome {
            Ok(result) if result.quarantined != swept => {
                if let Some(q) = &swept {
                    tracing::warn!("{}", q.warning());
                }
                result.quarantined = swept;
            }
            Err(_) => {
                if let Some(q) = &swept {
                    tracing::warn!("{}", q.warning());
                }
            }
            Ok(_) => {}
        }
    }
    if let Some(b) = &broker {
        b.stop(backend).await;
    }
    if let Some(plan) = &egress {
        backend.close_egress(plan).await;
    }
    let handed_back = home_out.into_inner().unwrap_or_else(|e| e.into_inner());
    match handed_back.map(|tar| crate::auth::inject::finish(record.provider, &tar)) {
        Some(Ok(updated)) if !updated.is_empty() => {
            tracing::info!("saved refreshed credentials: {}", updated.join(", "))
        }
        Some(Err(e)) => tracing::warn!("could not save refreshed credentials: {e}"),
        _ => {}
    }
    outcome
}

/// The turn as the backend runs it: the session's image, volumes and limits.
fn turn_spec(
    record: &SessionRecord,
    turn: u32,
    image: &str,
    argv: Vec<String>,
    env: Vec<String>,
    runtime: crate::backend::Scratch,
) -> Result<TurnSpec> {
    let settings = &record.settings;
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
        extra_hosts: Vec::new(),
        oci_runtime: settings.runtime.clone(),
    })
}

/// Creates the turn's container, which is also the session's lock.
async fn create_turn_container(
    backend: &impl Backend,
    record: &SessionRecord,
    name: &str,
    spec: &TurnSpec,
) -> Result<()> {
    for _ in 0..2 {
        match backend.create_turn(name, spec).await {
            Ok(_) => return Ok(()),
            Err(e @ (CreateError::Other(_) | CreateError::ImageMissing(_))) => {
                return Err(image_hint(e, record))
            }
            Err(CreateError::NameTaken) => {
                let existing = backend.inspect_container(name).await?;
                let turn = existing
                    .as_ref()
                    .and_then(|c| c.label(labels::TURN))
                    .unwrap_or("?")
                    .to_string();
                let running = existing.as_ref().is_some_and(|c| c.running());
                // Not found right after a taken name is a container still being registered
                // (Docker reserves the name first): busy, never a leftover to remove.
                let leftover = match existing {
                    Some(c) if !running && driver_is_gone(&c) => c,
                    _ => return Err(busy(record, &turn)),
                };
                // A leftover of a turn whose caw-box was killed: it holds nothing we need.
                // Removed by id: a racing resume may have replaced it meanwhile.
                backend.remove_found(&leftover).await?;
            }
        }
    }
    Err(busy(record, "?"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ProviderKind;
    use crate::session::record::SessionSettings;

    fn record(network: &str) -> SessionRecord {
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

    /// A backend that holds one turn container (or none) and records what it was asked to
    /// do: enough to check how a turn takes the session's lock.
    #[derive(Clone, Default)]
    struct FakeBackend(std::sync::Arc<std::sync::Mutex<Fake>>);

    #[derive(Default)]
    struct Fake {
        /// The container under the turn's name, if any.
        existing: Option<ContainerInfo>,
        image_missing: bool,
        calls: Vec<String>,
    }

    impl FakeBackend {
        fn calls(&self) -> Vec<String> {
            self.0.lock().unwrap().calls.clone()
        }
        fn log(&self, call: String) {
            self.0.lock().unwrap().calls.push(call);
        }
    }

    use crate::backend::{
        Attached, Backend, ContainerInfo, ContainerState, HelperSpec, ImageInfo, OutputStream,
        TarFile, VolumeInfo,
    };
    use std::collections::HashMap;

    /// The operations a lock does not use are not expected.
    macro_rules! unexpected {
        ($what:literal) => {
            unreachable!(concat!("the lock does not ", $what))
        };
    }

    impl Backend for FakeBackend {
        async fn create_turn(
            &self,
            name: &str,
            spec: &TurnSpec,
        ) -> std::result::Result<String, CreateError> {
            self.log(format!("create {name}"));
            let mut fake = self.0.lock().unwrap();
            if fake.image_missing {
                return Err(CreateError::ImageMissing(Error::environment(
                    "no such image",
                )));
            }
            if fake.existing.is_some() {
                return Err(CreateError::NameTaken);
            }
            fake.existing = Some(ContainerInfo {
                name: name.to_string(),
                labels: spec.labels.clone(),
                state: ContainerState::Created,
                ..Default::default()
            });
            Ok("id".into())
        }
        async fn inspect_container(&self, name: &str) -> Result<Option<ContainerInfo>> {
            self.log(format!("inspect {name}"));
            Ok(self.0.lock().unwrap().existing.clone())
        }
        async fn check_runtime(&self, _: &str) -> Result<()> {
            unexpected!("check a runtime")
        }
        async fn remove_container(&self, name: &str, force: bool) -> Result<()> {
            self.log(format!("remove {name} force={force}"));
            self.0.lock().unwrap().existing = None;
            Ok(())
        }
        async fn broker_place(&self) -> crate::backend::BrokerPlace {
            crate::backend::BrokerPlace::SharedContainer
        }
        async fn remove_found(&self, found: &ContainerInfo) -> Result<()> {
            self.log(format!("remove id {}", found.id));
            self.0.lock().unwrap().existing = None;
            Ok(())
        }
        async fn list_containers(&self, _: &[String]) -> Result<Vec<ContainerInfo>> {
            unexpected!("list containers")
        }
        async fn create_helper(
            &self,
            _: &str,
            _: &HelperSpec,
        ) -> std::result::Result<String, CreateError> {
            unexpected!("create helpers")
        }
        async fn attach(&self, _: &str, _: bool) -> Result<Attached> {
            unexpected!("attach")
        }
        async fn resize_tty(&self, _: &str, _: u16, _: u16) -> Result<()> {
            unexpected!("resize")
        }
        async fn start_container(&self, _: &str) -> Result<()> {
            unexpected!("start")
        }
        async fn wait_container(&self, _: &str) -> Result<i64> {
            unexpected!("wait")
        }
        async fn stop_container(&self, _: &str, _: std::time::Duration) -> Result<()> {
            unexpected!("stop")
        }
        fn host_dirs(&self) -> crate::backend::HostDirs {
            crate::backend::HostDirs::Shared
        }
        fn words(&self) -> crate::backend::Words {
            unexpected!("words")
        }
        fn logs_hint(&self, _: &str) -> String {
            unexpected!("a logs hint")
        }
        fn egress_route(&self, _: &crate::backend::EgressPlan) -> crate::backend::EgressRoute {
            unexpected!("route egress")
        }
        async fn open_egress(
            &self,
            _: &crate::backend::EgressPlan,
        ) -> std::result::Result<(), CreateError> {
            unexpected!("open egress")
        }
        async fn close_egress(&self, _: &crate::backend::EgressPlan) {
            unexpected!("close egress")
        }
        async fn open_broker(&self, _: &crate::backend::BrokerPlan) -> Result<()> {
            unexpected!("open a broker")
        }
        async fn start_broker(
            &self,
            _: &crate::backend::BrokerPlan,
        ) -> std::result::Result<Attached, CreateError> {
            unexpected!("start a broker")
        }
        async fn attach_broker(&self, _: &str) -> Result<Attached> {
            unexpected!("attach to a broker")
        }
        async fn close_broker(&self, _: &crate::backend::BrokerPlan) {
            unexpected!("close a broker")
        }
        async fn sweep(&self, _: &[String], _: &[&str]) -> Result<()> {
            unexpected!("sweep")
        }
        fn removed_under_turn(&self, _: &str) -> Error {
            unexpected!("a removed turn")
        }
        async fn run_to_completion(
            &self,
            _: &str,
            _: &HelperSpec,
        ) -> std::result::Result<(i64, String, String), CreateError> {
            unexpected!("run helpers")
        }
        fn follow_logs(&self, _: &str) -> OutputStream {
            unexpected!("follow logs")
        }
        async fn inspect_image(&self, _: &str) -> Result<Option<ImageInfo>> {
            unexpected!("inspect images")
        }
        async fn create_volume(&self, _: &str, _: HashMap<String, String>) -> Result<()> {
            unexpected!("create volumes")
        }
        async fn inspect_volume(&self, _: &str) -> Result<Option<VolumeInfo>> {
            unexpected!("inspect volumes")
        }
        async fn list_volumes(&self, _: &[String]) -> Result<Vec<VolumeInfo>> {
            unexpected!("list volumes")
        }
        async fn remove_volume(&self, _: &str) -> Result<()> {
            unexpected!("remove volumes")
        }
        async fn upload_files(
            &self,
            _: &str,
            _: &str,
            _: &[TarFile<'_>],
            _: (u32, u32),
        ) -> Result<()> {
            unexpected!("upload")
        }
        async fn upload_tar(&self, _: &str, _: &str, _: Vec<u8>) -> Result<()> {
            unexpected!("upload")
        }
        async fn download_file(&self, _: &str, _: &str) -> Result<Option<Vec<u8>>> {
            unexpected!("download")
        }
        async fn download_tar(&self, _: &str, _: &str) -> Result<Option<Vec<u8>>> {
            unexpected!("download")
        }
    }

    /// A turn container left by a driver: running or not, and whose driver is this process
    /// (alive) or a pid that cannot exist (gone).
    fn left_by(turn: u32, state: ContainerState, driver_alive: bool) -> ContainerInfo {
        let pid = if driver_alive {
            std::process::id().to_string()
        } else {
            "999999999".to_string()
        };
        ContainerInfo {
            labels: HashMap::from([
                (labels::TURN.to_string(), turn.to_string()),
                (labels::DRIVER_PID.to_string(), pid),
                (labels::DRIVER_HOST.to_string(), dirs::host_name()),
            ]),
            state,
            id: "leftover-id".into(),
            ..Default::default()
        }
    }

    /// The lock, against the neutral backend: a free name is taken; a running turn, or a
    /// stopped one whose driver lives, is busy (nothing removed); a dead driver's leftover
    /// is removed and the name taken; a missing image is the missing-image error.
    #[tokio::test(flavor = "current_thread")]
    async fn a_turn_takes_the_lock_or_says_who_holds_it() {
        let r = record("open");
        let name = container_name(&r);
        let spec = turn_spec(
            &r,
            5,
            "img",
            vec![],
            vec![],
            crate::backend::Scratch::default(),
        )
        .unwrap();

        let free = FakeBackend::default();
        create_turn_container(&free, &r, &name, &spec)
            .await
            .unwrap();
        assert_eq!(free.calls(), vec![format!("create {name}")]);
        let taken = free.0.lock().unwrap().existing.clone().unwrap();
        assert_eq!(taken.label(labels::TURN), Some("5"));

        for (state, alive) in [
            (ContainerState::Running, false),
            (ContainerState::Exited, true),
            (ContainerState::Created, true),
        ] {
            let busy = FakeBackend::default();
            busy.0.lock().unwrap().existing = Some(left_by(4, state, alive));
            let e = create_turn_container(&busy, &r, &name, &spec)
                .await
                .unwrap_err();
            assert_eq!(e.exit_code(), 2, "{state:?}");
            assert!(e.message.contains("is busy: turn 4"), "{}", e.message);
            assert!(
                !busy.calls().iter().any(|c| c.starts_with("remove")),
                "{state:?}: {:?}",
                busy.calls()
            );
        }

        let leftover = FakeBackend::default();
        leftover.0.lock().unwrap().existing = Some(left_by(4, ContainerState::Exited, false));
        create_turn_container(&leftover, &r, &name, &spec)
            .await
            .unwrap();
        assert_eq!(
            leftover.calls(),
            vec![
                format!("create {name}"),
                format!("inspect {name}"),
                // By id, never by name: a racing resume may hold the name by then.
                "remove id leftover-id".to_string(),
                format!("create {name}"),
            ]
        );

        let no_image = FakeBackend::default();
        no_image.0.lock().unwrap().image_missing = true;
        let e = create_turn_container(&no_image, &r, &name, &spec)
            .await
            .unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.message
                .contains("image 'caw-box/codex:latest' is not present"),
            "{}",
            e.message
        );
    }
}
