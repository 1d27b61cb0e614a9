//! The pod specs of turns (helpers': `helpers.rs`): the agent's container and its entrypoint (with an end
//! marker beside sidecars, a wait for its files in a TUI), the sidecars it gets, and the init
//! container that seeds HOME. Pure: the API server sees them in `pods.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, HostAlias, PodSpec, ResourceRequirements, Sysctl, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::sandbox::{claim_mounts, empty_dir, hardened, pod_security};
use super::sandbox::{env_vars, seed_container, SEED_MOUNT};
use super::sidecars::{broker_container, egress_init, proxy_container, BROKER_UID, PROXY_UID};
use super::sidecars::{POD_END_DIR, POD_END_FILE};
use crate::backend::PROXY_PORT;
use crate::backend::{MountSpec, NetworkPolicy, TurnSpec};
use crate::error::{Error, Result};
use crate::event::EgressPolicy;

/// How long a turn pod whose CLI ended waits for its record (the entrypoint's
/// `CAW_BOX_HANDOFF_WAIT`): long, so that a detached turn whose driver is gone is still
/// recorded by the next `caw-box wait` (Docker's 5 s suit a driver that is always there).
const HANDOFF_WAIT: Duration = Duration::from_secs(6 * 3600);

/// The pod of a turn (see the module docs).
pub fn turn_pod_spec(spec: &TurnSpec) -> Result<PodSpec> {
    let interactive = spec.interactive.is_some();
    let (uid, gid) = (i64::from(spec.user.0), i64::from(spec.user.1));
    // A proxy sidecar wherever the turn has egress rules; a firewall that holds the agent to
    // it but under `open` (there the proxy only records what goes through it).
    let proxied = spec.egress_policy.is_some();
    let held = spec.egress_policy.is_some_and(|p| p != EgressPolicy::Open);
    check_fits_a_pod(spec, uid, held, interactive)?;
    let sidecars = spec.broker.is_some() || proxied;
    let (volumes, volume_mounts) = pod_volumes(spec, sidecars, held)?;
    let env = agent_env(spec, proxied);
    let broker = spec
        .broker
        .as_ref()
        .map(|program| broker_container(spec, program, gid));
    let brokered = broker.is_some();
    let proxy = (spec.egress_policy)
        .map(|policy| proxy_container(&spec.image, policy, &spec.egress_allow, gid));
    // A TUI's runtime files are put in once the pod runs (a terminal's stdin is no way for
    // an archive): the image's entrypoint starts when they are there. Beside a broker, the
    // entrypoint leaves the end marker when it ended; a headless one announces its end.
    let command = match interactive {
        true => Some(tui_command(&spec.runtime.mount, sidecars)),
        false => Some(marked_entry(sidecars, true)),
    };
    let mut containers = vec![Container {
        name: AGENT.into(),
        image: Some(spec.image.clone()),
        command,
        args: Some(spec.argv.clone()),
        env: Some(env),
        working_dir: Some(spec.working_dir.clone()),
        stdin: Some(spec.runtime_over_stdin || interactive),
        // Open across attachments: the driver's attachment may end (a detached turn's
        // driver killed) and another caw-box hand the record in (`adopt`).
        stdin_once: Some(false),
        tty: Some(interactive),
        security_context: Some(hardened(uid, gid)),
        resources: Some(ResourceRequirements {
            limits: resource_limits(spec),
            ..Default::default()
        }),
        volume_mounts: Some(volume_mounts),
        ..Default::default()
    }];
    containers.extend(broker);
    containers.extend(proxy);
    let mut init_containers = Vec::new();
    if held {
        init_containers.push(egress_init(&spec.image, brokered));
    }
    init_containers.push(seed_home(spec, uid, gid));
    // A broker that stands in for hosts (`extra_hosts`: the pod's loopback) listens on
    // their own port, 443: below 1024, which its uid may bind only with the pod's
    // `ip_unprivileged_port_start` lowered (a safe sysctl; Docker lowers it for every
    // container).
    let mut security = pod_security(gid);
    if brokered && !spec.extra_hosts.is_empty() {
        security.sysctls = Some(vec![Sysctl {
            name: "net.ipv4.ip_unprivileged_port_start".into(),
            value: "0".into(),
        }]);
    }
    Ok(PodSpec {
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_aliases: host_aliases(&spec.extra_hosts),
        security_context: Some(security),
        termination_grace_period_seconds: Some(10),
        // The whole pod (sidecars too: they share its sandbox) runs under the class.
        runtime_class_name: spec.oci_runtime.clone(),
        init_containers: Some(init_containers),
        containers,
        volumes: Some(volumes),
        ..Default::default()
    })
}

/// Refuses what a turn pod cannot hold: another network, an agent with a sidecar's uid, and
/// (headless) runtime files put in before the pod starts.
fn check_fits_a_pod(spec: &TurnSpec, uid: i64, held: bool, interactive: bool) -> Result<()> {
    match &spec.network {
        NetworkPolicy::Default => {}
        other => {
            return Err(Error::usage(format!(
                "--network {other:?} is not available with the kubernetes backend: pods use the cluster's network (--allow-host holds a turn's egress to a list)"
            )))
        }
    }
    if held && [PROXY_UID, BROKER_UID].contains(&uid) {
        return Err(Error::usage(format!(
            "the agent's uid {uid} is the one the kubernetes backend keeps for its proxy or broker sidecar: --allow-host could not tell them apart"
        )));
    }
    if !interactive && !spec.runtime.files.is_empty() {
        return Err(Error::environment(
            "a turn's runtime files travel on its stdin on Kubernetes: none can be put in a pod before it starts",
        ));
    }
    Ok(())
}

/// The pod's volumes and the agent's mounts of them: the turn's claims, then scratch space.
fn pod_volumes(
    spec: &TurnSpec,
    sidecars: bool,
    held: bool,
) -> Result<(Vec<Volume>, Vec<VolumeMount>)> {
    // The state claim first (`seed_home`), then the workspace's, then the checkpoint's
    // (the new one, the previous one read-only: `session::checkpoint::prepare`).
    let mounts: Vec<&MountSpec> = spec.mounts().chain(&spec.checkpoint).collect();
    let (mut volumes, mut volume_mounts) = claim_mounts(&mounts)?;
    // The runtime directory holds secrets for a moment: memory, never a node's disk.
    volumes.push(empty_dir("runtime", true, "64Mi"));
    volume_mounts.push(VolumeMount {
        name: "runtime".into(),
        mount_path: spec.runtime.mount.clone(),
        ..Default::default()
    });
    volumes.push(empty_dir("tmp", false, "1Gi"));
    volume_mounts.push(VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..Default::default()
    });
    if sidecars {
        // Shared by the agent's container and its sidecars: the agent's end marker.
        volumes.push(empty_dir("pod-end", true, "1Mi"));
        volume_mounts.push(VolumeMount {
            name: "pod-end".into(),
            mount_path: POD_END_DIR.into(),
            ..Default::default()
        });
    }
    if held {
        // For iptables-legacy's lock (the egress init container's root is read-only).
        volumes.push(empty_dir("xtables", true, "1Mi"));
    }
    Ok((volumes, volume_mounts))
}

fn resource_limits(spec: &TurnSpec) -> Option<BTreeMap<String, Quantity>> {
    let mut limits = BTreeMap::new();
    if let Some(memory) = spec.limits.memory {
        limits.insert("memory".to_string(), Quantity(memory.to_string()));
    }
    if let Some(cpus) = spec.limits.cpus {
        limits.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", (cpus * 1000.0).ceil() as i64)),
        );
    }
    (!limits.is_empty()).then_some(limits)
}

/// The agent's environment: the turn's, and the waits its entrypoint is told of.
fn agent_env(spec: &TurnSpec, held: bool) -> Vec<k8s_openapi::api::core::v1::EnvVar> {
    let handoff_wait = spec
        .runtime_over_stdin
        .then(|| format!("CAW_BOX_HANDOFF_WAIT={}", HANDOFF_WAIT.as_secs()));
    let proxy_wait = held.then(|| format!("CAW_BOX_PROXY_WAIT={PROXY_PORT}"));
    env_vars(
        spec.env
            .iter()
            .chain(handoff_wait.as_ref())
            .chain(proxy_wait.as_ref()),
    )
}

/// `host:ip` entries as the pod's `/etc/hosts` lines (one per address; a host name has no
/// colon, an IPv6 address may); `None`: none.
pub(super) fn host_aliases(entries: &[String]) -> Option<Vec<HostAlias>> {
    let mut by_ip: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for entry in entries {
        if let Some((host, ip)) = entry.split_once(':') {
            by_ip.entry(ip).or_default().push(host.to_string());
        }
    }
    let aliases: Vec<HostAlias> = by_ip
        .into_iter()
        .map(|(ip, hostnames)| HostAlias {
            ip: ip.to_string(),
            hostnames: Some(hostnames),
        })
        .collect();
    (!aliases.is_empty()).then_some(aliases)
}

/// What every pod caw-box makes gets from the `cluster`'s settings, beside what its spec
/// says: the image pull policy of each of its containers (default `IfNotPresent`), and the
/// names of `host_aliases` (`CAW_BOX_HOST_ALIASES`) resolving to their addresses beside its
/// own (a cluster with no DNS for a gateway or a vendor's host, as a test cluster; the egress
/// proxy resolves through the pod's hosts file too).
pub(super) fn for_cluster(spec: &mut PodSpec, cluster: &crate::backend::ClusterSettings) {
    let policy = cluster
        .image_pull_policy
        .as_deref()
        .unwrap_or("IfNotPresent");
    let init = spec.init_containers.iter_mut().flatten();
    for container in spec.containers.iter_mut().chain(init) {
        container.image_pull_policy = Some(policy.to_string());
    }
    if let Some(more) = host_aliases(&cluster.host_aliases) {
        spec.host_aliases.get_or_insert_with(Vec::new).extend(more);
    }
}

/// The agent's container in a turn pod (the first).
const AGENT: &str = "agent";

/// Runs its arguments (the image's entrypoint and the turn's argv) as bash's child (once the
/// proxy sidecar listens, given `CAW_BOX_PROXY_WAIT`, its port), passing on its
/// stdin and the stop signals, and leaves the pod's end marker (given `CAW_BOX_POD_END`)
/// once it ended, with its exit code: the broker beside it then exits, so the pod
/// completes. Last (given `CAW_BOX_ANNOUNCE_END`: a headless turn's, not a terminal's),
/// when it ended 0 (the entrypoint took the turn's record) and no stop signal came (a
/// `caw-box stop`, a timeout, an eviction: the driver learns those from the pod's status,
/// once the container is gone, and records the turn through the claim then), it announces
/// the end on stdout ([`super::ends::ENDED`]) and stays until the driver answers it with a
/// line on stdin (a second at most, for the line to be relayed): the driver has it from its
/// attachment, before the pod's status says it. (Bash starts
/// a background child with SIGINT ignored: `env --default-signal` gives it back, so the
/// entrypoint can forward it.)
pub(super) const MARKED_ENTRY: &str = r#"if [ -n "${CAW_BOX_PROXY_WAIT:-}" ]; then
  for _ in $(seq 100); do (: <"/dev/tcp/127.0.0.1/$CAW_BOX_PROXY_WAIT") 2>/dev/null && break; sleep 0.1; done
fi
s=
trap 's=1; kill -TERM "$p" 2>/dev/null' TERM
trap 's=1; kill -INT "$p" 2>/dev/null' INT
trap 's=1; kill -HUP "$p" 2>/dev/null' HUP
env --default-signal=INT,QUIT "$@" <&0 &
p=$!
rc=
until [ -n "$rc" ]; do
  wait "$p" 2>/dev/null; r=$?
  if [ "$r" -le 128 ] || ! kill -0 "$p" 2>/dev/null; then
    wait "$p" 2>/dev/null; r2=$?
    if [ "$r2" -eq 127 ]; then rc=$r; else rc=$r2; fi
  fi
done
[ -z "${CAW_BOX_POD_END:-}" ] || : > "$CAW_BOX_POD_END"
if [ -n "${CAW_BOX_ANNOUNCE_END:-}" ] && [ "$rc" -eq 0 ] && [ -z "$s" ]; then
  printf '\036caw-box-ended %s\n' "$rc"
  # A container's last line can be lost when it exits at once (an attachment relays it
  # after): a moment's stay, until the driver answers the line (or deletes the pod).
  read -r -t 1 _ || :
fi
exit "$rc""#;

/// The agent container's command: tini, then [`MARKED_ENTRY`]; with `marker`, the end
/// marker is left (for sidecars), with `announce` the end announced (headless).
pub(super) fn marked_entry(marker: bool, announce: bool) -> Vec<String> {
    let mut command: Vec<String> = vec!["/usr/bin/tini".into(), "--".into(), "env".into()];
    if marker {
        command.push(format!("CAW_BOX_POD_END={POD_END_DIR}/{POD_END_FILE}"));
    }
    if announce {
        command.push("CAW_BOX_ANNOUNCE_END=1".into());
    }
    command.extend([
        "bash".into(),
        "-c".into(),
        MARKED_ENTRY.into(),
        "caw-box-agent".into(),
        "/usr/local/bin/caw-box-entry".into(),
    ]);
    command
}

/// The file in a TUI pod's runtime directory that says its runtime files are all there.
pub(super) const RUNTIME_READY: &str = ".caw-box-ready";

/// A TUI pod's command: waits for its runtime files, then becomes the caw-box image's
/// entrypoint (tini, `caw-box-entry`) with the turn's argv.
fn tui_command(run_dir: &str, brokered: bool) -> Vec<String> {
    let entry = if brokered {
        marked_entry(true, false)
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        "/usr/bin/tini -- /usr/local/bin/caw-box-entry".to_string()
    };
    let script = format!(
        "while [ ! -e {ready} ]; do sleep 0.1; done; exec {entry} \"$@\"",
        ready = shell_quote(&format!("{run_dir}/{RUNTIME_READY}"))
    );
    vec!["sh".into(), "-c".into(), script, "caw-box-tui".into()]
}

/// The name of [`seed_home`]'s init container.
pub(super) const SEED_HOME: &str = "seed-home";
/// Where [`seed_home`] mounts the state claim.
/// The marker [`seed_home`] leaves in HOME once it copied the image's HOME.
pub const SEEDED_MARKER: &str = ".caw-box/image-home-copied";

/// An init container that copies the image's own HOME (the vendors' config files the
/// images ship, e.g. codex's config.toml that turns its background traffic off, gemini's
/// settings.json) into the state claim once, without replacing anything there. Docker
/// does that by itself for a named volume mounted over a non-empty directory the first
/// time; a PVC starts empty.
pub(super) fn seed_home(spec: &TurnSpec, uid: i64, gid: i64) -> Container {
    let home = spec.home.target.trim_end_matches('/');
    let script = format!(
        "[ -e {seed}/{marker} ] && exit 0; cp -a -n {home}/. {seed}/ 2>/dev/null; mkdir -p {seed}/.caw-box && : > {seed}/{marker}",
        seed = SEED_MOUNT,
        marker = SEEDED_MARKER,
        home = shell_quote(home),
    );
    // The first volume is the state claim (`claim_mounts` of `spec.mounts()`).
    seed_container(SEED_HOME, &spec.image, script, (uid, gid), "v0")
}

pub(super) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
