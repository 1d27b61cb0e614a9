//! `--keep-warm`: whether a turn runs in the session's warm container, and taking or
//! making one (`backend::warm` holds the container's side). A warm turn is a turn like any
//! other once its container is the session's (under the session's lock name): the driver
//! attaches, waits, stops and records it the same way, and the backend runs it by exec.
//!
//! Not here: the idle loop and its protocol (`backend::warm`), naming and claiming
//! (the backend's).

use crate::backend::warm::{idle_argv, turn_argv, WarmExec, WARM_FOR_LABEL, WARM_LABEL};
use crate::backend::{Backend, BrokerPlace, TurnSpec};
use crate::error::{Error, Result};
use crate::session::store::record::SessionRecord;
use crate::session::turn::TurnOptions;

/// The image's entrypoint, which a warm turn's exec runs as a cold turn's container does.
const ENTRYPOINT: &str = "/usr/local/bin/caw-box-entry";

/// How long (seconds) this turn keeps its container warm after it, `None`: it starts cold
/// and its container goes: its `--keep-warm` where it gave one; else, where an idle
/// container waits for it (say one `caw-box warm --for` made), that one's; else the
/// session's. Headless turns only (a TUI's terminal is its container's); not with an
/// egress proxy of the turn's own (its private network goes with the turn) nor a broker of the turn's own
/// (Podman: its network does too), nor a broker in the turn's own unit (`turn_broker`,
/// Kubernetes: it would hold its keys while the turn's unit idles).
pub(in crate::session) async fn keep_for(
    backend: &impl Backend,
    record: &SessionRecord,
    name: &str,
    options: &TurnOptions,
    egress: bool,
    broker: BrokerPlace,
    turn_broker: bool,
) -> Result<Option<u64>> {
    let own_broker = broker == BrokerPlace::OwnContainer || turn_broker;
    if !backend.capabilities().keeps_warm || options.interactive || egress || own_broker {
        return Ok(None);
    }
    let said = record.settings.keep_warm_secs;
    let secs = match said.filter(|_| options.keep_warm_given) {
        Some(secs) => secs,
        None => match backend.warm_idle_for(name).await? {
            Some(waiting) => waiting,
            None => said.unwrap_or(0),
        },
    };
    Ok((secs > 0).then_some(secs))
}

/// Whether `c`, the running container under the session's lock, is a warm one that its
/// turn's driver never gave back (killed): no turn runs in it, and still none a moment
/// later with it still there (a live driver takes and gives one back around its turn's
/// exec within moments). A new turn may then remove it.
pub(in crate::session) async fn orphaned(
    backend: &impl Backend,
    c: &crate::backend::ContainerInfo,
) -> Result<bool> {
    const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);
    if c.label(WARM_LABEL).is_none() || backend.turn_in_warm(&c.name).await?.is_some() {
        return Ok(false);
    }
    tokio::time::sleep(SETTLE).await;
    let still = backend
        .inspect_container(&c.name)
        .await?
        .is_some_and(|now| now.id == c.id && now.running());
    Ok(still && backend.turn_in_warm(&c.name).await?.is_none())
}

/// Why `caw-box warm` makes nothing for `record`'s session: its next turn would run cold.
/// `whose` names the turns in the message (`session ID's turns`; a pool's box: `their
/// turns`).
pub(in crate::session) fn runs_cold(
    backend: &impl Backend,
    record: &SessionRecord,
    egress: bool,
    turn_broker: bool,
    whose: &str,
) -> Error {
    let id = record.session_id;
    if !backend.capabilities().keeps_warm {
        return Error::usage(
            "this backend runs every turn in a new container: nothing to keep warm",
        );
    }
    if egress {
        return Error::usage(format!(
            "{whose} run cold: its egress proxy's network goes with each turn"
        ));
    }
    if turn_broker {
        return Error::usage(format!(
            "{whose} run cold: the credential broker beside the agent would hold its keys while idle"
        ));
    }
    if record.settings.keep_warm_secs.is_none_or(|s| s == 0) {
        return Error::usage(format!("session {id} has no --keep-warm"))
            .with_hint(format!("say how long: `caw-box warm {id} --for 10m`"));
    }
    Error::usage(format!(
        "{whose} run cold: each has a credential broker of its own (Podman)"
    ))
}

/// What of a turn's spec its container is made with: a warm container made with other
/// values cannot run the turn.
fn fingerprint(spec: &TurnSpec) -> String {
    use sha2::Digest;
    let s = spec;
    // Stable across builds (a new caw-box still takes a container an older one kept warm).
    let text = format!(
        "{:?}{:?}{:?}{:?}{:?}{:?}{:?}{:?}{:?}{:?}{:?}{:?}",
        s.image,
        s.user,
        s.working_dir,
        s.home,
        s.workspace,
        s.protected,
        s.limits,
        s.network,
        s.extra_hosts,
        s.egress_allow,
        s.oci_runtime,
        s.runtime.mount
    );
    // A hold in the turn's own unit (a pod's proxy sidecar) says its policy's words.
    let text = match s.egress_policy {
        None => text,
        Some(policy) => format!("{text}{policy:?}"),
    };
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The warm label of a container for turns of `spec` idle `secs` after each: how long it
/// stays idle is its loop's, so another duration needs another container.
fn fingerprint_for(spec: &TurnSpec, secs: u64) -> String {
    format!("{}-{secs}", fingerprint(spec))
}

/// Makes the session's container ready for the turn `spec` under the turn's name `name`
/// (the session's lock) and has the backend run the turn in it by exec: the warm one
/// when there is one made with the same settings and it runs; else a new one, made as a
/// cold turn's would be, but idle for `secs` after each turn (a warm one that does not fit
/// or died is removed first). `create` creates a turn's container from its spec under the
/// session's lock, as a cold turn's (`runner::create_turn_container`). A pool's box
/// (`lifecycle::pool`) goes after the turn unless the session `keeps` warm.
pub(in crate::session) async fn take_or_make<F>(
    backend: &impl Backend,
    name: &str,
    spec: &TurnSpec,
    (secs, keeps): (u64, bool),
    last_turn_end: u64,
    create: impl FnOnce(TurnSpec) -> F,
) -> Result<()>
where
    F: std::future::Future<Output = Result<()>>,
{
    let fp = fingerprint_for(spec, secs);
    let mut exec = WarmExec {
        argv: turn_argv(turn_of(spec), std::process::id(), &[ENTRYPOINT], &spec.argv),
        env: spec.env.clone(),
        working_dir: spec.working_dir.clone(),
        run_dir: spec.runtime.mount.clone(),
        goes_after: false,
    };
    if let Some(c) = backend.claim_warm(name).await? {
        let fits = c.running() && c.label(WARM_LABEL) == Some(fp.as_str());
        if fits && !ends_soon(&c, secs, last_turn_end) {
            tracing::debug!("the turn runs in the warm container {}", c.id);
            let pooled = c
                .label(crate::session::store::record::labels::POOL)
                .is_some();
            exec.goes_after = !keeps && pooled;
            // A pool's box whose CLI was started ahead takes its first turn there.
            if let Some(argv) = pooled.then(|| prestarted(spec)).flatten() {
                exec.argv = turn_argv(turn_of(spec), std::process::id(), &[ENTRYPOINT], &argv);
            }
            backend.exec_in_warm(name, exec);
            return Ok(());
        }
        tracing::debug!("the warm container does not fit the turn, ends or ended: a new one");
        backend.remove_found(&c).await?;
    }
    make_idle(backend, name, spec, fp, secs, create).await?;
    backend.exec_in_warm(name, exec);
    Ok(())
}

/// The turn `spec` runs (its label).
fn turn_of(spec: &TurnSpec) -> u32 {
    spec.labels
        .get(crate::session::store::record::labels::TURN)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// `spec`'s command as it runs in a pool's box whose CLI was started ahead, where its
/// provider's CLI can be (`Provider::prestarted_turn`).
fn prestarted(spec: &TurnSpec) -> Option<Vec<String>> {
    let provider: crate::provider::ProviderKind = spec
        .labels
        .get(crate::session::store::record::labels::PROVIDER)?
        .parse()
        .ok()?;
    provider.adapter().prestarted_turn(&spec.argv)
}

/// Whether the idle container `c` (idle `secs` after a turn; its session's last turn ended
/// at `last_turn_end`, unix seconds) may end by itself before a turn's exec would start in
/// it: its loop counts from the end of the latest turn on a one-second tick. A turn then
/// starts cold rather than fail.
fn ends_soon(c: &crate::backend::ContainerInfo, secs: u64, last_turn_end: u64) -> bool {
    // (A short --keep-warm's container is taken until nearly its end.)
    let margin = (secs / 4).min(3);
    let created = c
        .created
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let idle_since = created.max(last_turn_end).saturating_sub(1);
    crate::session::store::record::now_secs() + margin >= idle_since + secs
}

/// Creates (with `create`, under the session's lock `name`) and starts the idle container
/// for turns of `spec`, staying `secs` after each.
async fn make_idle<F>(
    backend: &impl Backend,
    name: &str,
    spec: &TurnSpec,
    fp: String,
    secs: u64,
    create: impl FnOnce(TurnSpec) -> F,
) -> Result<()>
where
    F: std::future::Future<Output = Result<()>>,
{
    let mut idle = spec.clone();
    idle.argv = idle_argv(secs);
    // The turn's environment is its exec's: the loop's has nothing of it. A pool's box keeps
    // the egress proxy's variables too (no secret): a CLI started in it ahead of its first
    // turn (`Provider::prestart_argv`) reaches the model as the turn would.
    let pooled = spec
        .labels
        .contains_key(crate::session::store::record::labels::POOL);
    idle.env = spec
        .env
        .iter()
        .filter(|e| e.starts_with("HOME=") || (pooled && is_proxy_var(e)))
        .cloned()
        .collect();
    idle.labels.insert(WARM_LABEL.into(), fp);
    idle.labels.insert(WARM_FOR_LABEL.into(), secs.to_string());
    idle.runtime_over_stdin = false;
    idle.runtime.files.clear();
    create(idle).await?;
    if let Err(e) = backend.start_container(name).await {
        let _ = backend.remove_container(name, true).await;
        return Err(e);
    }
    Ok(())
}

/// Whether `entry` (`NAME=VALUE`) is one of the egress proxy's variables.
fn is_proxy_var(entry: &str) -> bool {
    let name = entry.split('=').next().unwrap_or_default();
    crate::backend::PROXY_VARS.contains(&name)
}

/// `caw-box warm`: makes the session's idle container for turns of `spec` ahead of its
/// next turn, under the session's lock `name` while it is made; `false`: one made with the
/// same settings was there already, and stays.
pub(in crate::session) async fn make_ahead<F>(
    backend: &impl Backend,
    name: &str,
    spec: &TurnSpec,
    secs: u64,
    create: impl FnOnce(TurnSpec) -> F,
) -> Result<bool>
where
    F: std::future::Future<Output = Result<()>>,
{
    let fp = fingerprint_for(spec, secs);
    if let Some(c) = backend.claim_warm(name).await? {
        if c.running() && c.label(WARM_LABEL) == Some(fp.as_str()) {
            backend.idle_warm(name).await?;
            return Ok(false);
        }
        backend.remove_found(&c).await?;
    }
    make_idle(backend, name, spec, fp, secs, create).await?;
    if let Err(e) = backend.idle_warm(name).await {
        let _ = backend.remove_container(name, true).await;
        return Err(e);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings that shape the container change the fingerprint; a turn's own (its
    /// command, environment, labels) do not.
    #[test]
    fn the_fingerprint_follows_what_the_container_is_made_with() {
        let base = TurnSpec {
            image: "caw-box/codex".into(),
            argv: vec!["codex".into()],
            env: vec!["A=1".into()],
            user: (1000, 1000),
            working_dir: "/workspace".into(),
            labels: Default::default(),
            home: crate::backend::MountSpec::volume("v", "/home/agent"),
            workspace: None,
            protected: vec![],
            runtime: Default::default(),
            runtime_over_stdin: true,
            limits: Default::default(),
            network: crate::backend::NetworkPolicy::None,
            interactive: None,
            broker: None,
            egress_allow: vec![],
            egress_policy: Default::default(),
            extra_hosts: vec![],
            oci_runtime: None,
            hand_over: Vec::new(),
            checkpoint: Vec::new(),
        };
        let mut turn = base.clone();
        turn.argv.push("resume".into());
        turn.env.push("B=2".into());
        turn.labels.insert("io.caw-box.turn".into(), "2".into());
        assert_eq!(fingerprint(&base), fingerprint(&turn));
        let mut other = base.clone();
        other.image = "caw-box/codex:2".into();
        assert_ne!(fingerprint(&base), fingerprint(&other));
        let mut other = base.clone();
        other.limits.memory = Some(1 << 30);
        assert_ne!(fingerprint(&base), fingerprint(&other));
        let mut other = base.clone();
        other.oci_runtime = Some("runsc".into());
        assert_ne!(fingerprint(&base), fingerprint(&other));
    }
}
