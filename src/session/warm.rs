//! `--keep-warm`: whether a turn runs in the session's warm container, and taking or
//! making one (`backend::warm` holds the container's side). A warm turn is a turn like any
//! other once its container is the session's (under the session's lock name): the driver
//! attaches, waits, stops and records it the same way, and the backend runs it by exec.
//!
//! Not here: the idle loop and its protocol (`backend::warm`), naming and claiming
//! (the backend's).

use crate::backend::warm::{idle_argv, turn_argv, WarmExec, WARM_FOR_LABEL, WARM_LABEL};
use crate::backend::{Backend, BrokerPlace, TurnSpec};
use crate::error::Result;
use crate::session::record::SessionRecord;

/// The image's entrypoint, which a warm turn's exec runs as a cold turn's container does.
const ENTRYPOINT: &str = "/usr/local/bin/caw-box-entry";

/// How long (seconds) this turn keeps its container warm after it, `None`: it starts cold
/// and its container goes. Headless turns only (a TUI's terminal is its container's);
/// not with `--allow-host` (its private network goes with the turn) nor a broker of the
/// turn's own (Podman: its network does too), nor a broker in the turn's pod
/// (`pod_broker`, Kubernetes: its sidecar would hold its keys while the pod idles).
pub(super) fn keep_for(
    backend: &impl Backend,
    record: &SessionRecord,
    interactive: bool,
    egress: bool,
    broker: BrokerPlace,
    pod_broker: bool,
) -> Option<u64> {
    let secs = record.settings.keep_warm_secs.filter(|&s| s > 0)?;
    let own_broker = broker == BrokerPlace::OwnContainer || pod_broker;
    (backend.keeps_warm() && !interactive && !egress && !own_broker).then_some(secs)
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
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes the session's container ready for the turn `spec` under the turn's name `name`
/// (the session's lock) and has the backend run the turn in it by exec: the warm one
/// when there is one made with the same settings and it runs; else a new one, made as a
/// cold turn's would be, but idle for `secs` after each turn (a warm one that does not fit
/// or died is removed first). `create` creates a turn's container from its spec under the
/// session's lock, as a cold turn's (`runner::create_turn_container`).
pub(super) async fn take_or_make<F>(
    backend: &impl Backend,
    name: &str,
    spec: &TurnSpec,
    secs: u64,
    create: impl FnOnce(TurnSpec) -> F,
) -> Result<()>
where
    F: std::future::Future<Output = Result<()>>,
{
    let fp = fingerprint(spec);
    let exec = WarmExec {
        argv: turn_argv(
            spec.labels
                .get(crate::session::record::labels::TURN)
                .and_then(|t| t.parse().ok())
                .unwrap_or(0),
            std::process::id(),
            &[ENTRYPOINT],
            &spec.argv,
        ),
        env: spec.env.clone(),
        working_dir: spec.working_dir.clone(),
        run_dir: spec.runtime.mount.clone(),
    };
    if let Some(c) = backend.claim_warm(name).await? {
        if c.running() && c.label(WARM_LABEL) == Some(fp.as_str()) {
            tracing::debug!("the turn runs in the warm container {}", c.id);
            backend.exec_in_warm(name, exec);
            return Ok(());
        }
        tracing::debug!("the warm container does not fit the turn (or ended): a new one");
        backend.remove_found(&c).await?;
    }
    let mut idle = spec.clone();
    idle.argv = idle_argv(secs);
    // The turn's environment is its exec's: the loop's has nothing of it.
    idle.env = spec
        .env
        .iter()
        .filter(|e| e.starts_with("HOME="))
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
    backend.exec_in_warm(name, exec);
    Ok(())
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
            extra_hosts: vec![],
            oci_runtime: None,
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
