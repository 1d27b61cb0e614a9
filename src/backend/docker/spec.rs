//! caw-box's container specs ([`TurnSpec`], [`HelperSpec`]) as Docker's create bodies.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, MountVolumeOptions};

use crate::backend::{HelperSpec, MountSource, MountSpec, NetworkPolicy, TurnSpec};

/// A container's scratch: an anonymous volume, removed with the container (`rm -v`), and
/// reachable by the archive API while the container exists, stopped too (a tmpfs volume
/// would lose its files at the stop). It starts as a copy of the image's directory (the
/// base image makes it writable for any uid). Its labels find it when its container was
/// removed from outside without it (`docker rm -f`): [`super::DockerBackend::remove_unused_volumes`].
fn scratch_mount(s: &crate::backend::Scratch) -> Mount {
    Mount {
        target: Some(s.mount.clone()),
        typ: Some(MountType::VOLUME),
        volume_options: (!s.labels.is_empty()).then(|| MountVolumeOptions {
            labels: Some(s.labels.clone()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(m: &MountSpec) -> Mount {
    let (typ, source) = match &m.source {
        MountSource::Volume(name) => (MountType::VOLUME, name.clone()),
        MountSource::HostDir(path) => (MountType::BIND, path.clone()),
    };
    Mount {
        target: Some(m.target.clone()),
        source: Some(source),
        typ: Some(typ),
        read_only: m.read_only.then_some(true),
        ..Default::default()
    }
}

fn network_mode(n: &NetworkPolicy) -> Option<String> {
    match n {
        NetworkPolicy::Default => None,
        NetworkPolicy::None => Some("none".into()),
        NetworkPolicy::Host => Some("host".into()),
        NetworkPolicy::Named(name) => Some(name.clone()),
    }
}

/// A turn's container: the agent's sandbox, locked down whatever the spec says.
pub(super) fn turn_body(spec: &TurnSpec) -> ContainerCreateBody {
    let scratch = scratch_mount(&spec.runtime);
    let host_config = HostConfig {
        // The protected paths after the workspace they are in (Docker and Podman also
        // order nested mounts by depth).
        mounts: Some(
            spec.mounts()
                .chain(&spec.protected)
                .chain(&spec.checkpoint)
                .map(mount)
                .chain([scratch])
                .collect(),
        ),
        cap_drop: Some(vec!["ALL".to_string()]),
        security_opt: Some(vec!["no-new-privileges".to_string()]),
        pids_limit: Some(spec.limits.pids),
        memory: spec.limits.memory,
        nano_cpus: spec.limits.cpus.map(|c| (c * 1e9) as i64),
        readonly_rootfs: Some(true),
        extra_hosts: (!spec.extra_hosts.is_empty()).then(|| spec.extra_hosts.clone()),
        // Executable: opencode's TUI loads a native library it unpacks there (the agent can
        // run what it writes to HOME or the workspace anyway).
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            "rw,nosuid,nodev,exec,size=1g".to_string(),
        )])),
        network_mode: network_mode(&spec.network),
        privileged: Some(false),
        runtime: spec.oci_runtime.clone(),
        // A warm container ends itself (its idle loop): nothing of it stays.
        auto_remove: spec
            .labels
            .contains_key(crate::backend::warm::WARM_LABEL)
            .then_some(true),
        ..Default::default()
    };
    let mut body = ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: Some(spec.argv.clone()),
        env: Some(spec.env.clone()),
        user: Some(format!("{}:{}", spec.user.0, spec.user.1)),
        working_dir: Some(spec.working_dir.clone()),
        labels: Some(turn_labels(spec)),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        attach_stdin: Some(false),
        open_stdin: Some(false),
        tty: Some(false),
        host_config: Some(host_config),
        ..Default::default()
    };
    if !spec.hand_over.is_empty() {
        hand_over_first(&mut body, spec);
    }
    if spec.runtime_over_stdin {
        body.open_stdin = Some(true);
        body.stdin_once = Some(true);
        body.attach_stdin = Some(true);
    }
    if let Some(size) = spec.interactive {
        // A terminal for the TUI, fed from ours; Docker closes its stdin when we detach.
        body.tty = Some(true);
        body.open_stdin = Some(true);
        body.stdin_once = Some(true);
        body.attach_stdin = Some(true);
        // The size from the first frame on where the daemon takes it (API 1.42+); it is set
        // again right after the start for older ones.
        if let (Some((columns, rows)), Some(hc)) = (size, body.host_config.as_mut()) {
            hc.console_size = Some(vec![rows.into(), columns.into()]);
        }
    }
    body
}

/// The start of a turn container that hands [`TurnSpec::hand_over`] to the turn's user (uid 0:
/// only root keeps capabilities it is given): a shell with the capabilities chown needs (and
/// SETPCAP, which dropping them from the bounding set takes) chowns the paths, drops every
/// capability (bounding, inheritable and ambient sets: nothing after it can have one back,
/// under no-new-privileges too) and becomes the image's entrypoint, tini as PID 1.
const HAND_OVER: &str = r#"ids=$1; shift
while [ "$1" != -- ]; do
  chown -R -- "$ids" "$1" || { echo "caw-box: could not hand $1 to $ids" >&2; exit 1; }
  shift
done
shift
exec setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- /usr/bin/tini -- /usr/local/bin/caw-box-entry "$@""#;

/// What [`HAND_OVER`] takes: its entrypoint, and the capabilities it holds until it drops them.
fn hand_over_first(body: &mut ContainerCreateBody, spec: &TurnSpec) {
    let mut entrypoint: Vec<String> = vec![
        "/bin/sh".into(),
        "-c".into(),
        HAND_OVER.into(),
        "caw-box-hand-over".into(),
        format!("{}:{}", spec.user.0, spec.user.1),
    ];
    entrypoint.extend(spec.hand_over.iter().cloned());
    entrypoint.push("--".into());
    body.entrypoint = Some(entrypoint);
    if let Some(hc) = body.host_config.as_mut() {
        hc.cap_add = Some(
            [
                "CHOWN",
                "DAC_OVERRIDE",
                "DAC_READ_SEARCH",
                "FOWNER",
                "SETPCAP",
            ]
            .map(String::from)
            .to_vec(),
        );
    }
}

/// A turn container's labels: the turn's, and on a headless cold turn's [`ADOPTABLE`]: it
/// runs on when its driver is gone, its output stays in the container's log and its state
/// volume with it, so any caw-box can record it (`session::headless::adopt`). A warm
/// container's turns run by exec, whose output no log keeps: not adoptable.
///
/// [`ADOPTABLE`]: crate::labelling::labels::ADOPTABLE
fn turn_labels(spec: &TurnSpec) -> HashMap<String, String> {
    let mut labels = spec.labels.clone();
    let warm = labels.contains_key(crate::backend::warm::WARM_LABEL);
    if spec.interactive.is_none() && spec.runtime_over_stdin && !warm {
        labels.insert(
            crate::labelling::labels::ADOPTABLE.to_string(),
            "true".to_string(),
        );
    }
    labels
}

/// One of caw-box's helper containers.
pub(super) fn helper_body(spec: &HelperSpec) -> ContainerCreateBody {
    let list = |v: &[String]| (!v.is_empty()).then(|| v.to_vec());
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint: list(&spec.entrypoint),
        cmd: Some(spec.argv.clone()),
        env: list(&spec.env),
        user: spec.user.clone(),
        network_disabled: (spec.network == NetworkPolicy::None).then_some(true),
        labels: Some(spec.labels.clone()),
        open_stdin: spec.stdin.then_some(true),
        stdin_once: (spec.stdin && spec.stdin_once).then_some(true),
        attach_stdin: spec.stdin.then_some(true),
        tty: spec.tty.then_some(true),
        host_config: Some(HostConfig {
            // A terminal wide enough that nothing the CLI prints (a long URL) wraps.
            console_size: spec.tty.then(|| vec![50, 500]),
            mounts: {
                let scratch = spec.scratch.as_ref().map(scratch_mount);
                let all: Vec<Mount> = spec.mounts.iter().map(mount).chain(scratch).collect();
                (!all.is_empty()).then_some(all)
            },
            network_mode: network_mode(&spec.network),
            readonly_rootfs: spec.read_only_root.then_some(true),
            cap_drop: spec.drop_all_capabilities.then(|| vec!["ALL".to_string()]),
            cap_add: list(&spec.add_capabilities),
            security_opt: spec
                .no_new_privileges
                .then(|| vec!["no-new-privileges".to_string()]),
            pids_limit: spec.pids_limit,
            auto_remove: spec.auto_remove.then_some(true),
            tmpfs: spec
                .tmp
                .as_ref()
                .map(|options| HashMap::from([("/tmp".to_string(), options.clone())])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Limits;

    fn spec(network: NetworkPolicy) -> TurnSpec {
        TurnSpec {
            image: "img".into(),
            argv: vec![],
            env: vec![],
            user: (1000, 1000),
            working_dir: "/workspace".into(),
            labels: HashMap::new(),
            home: MountSpec::volume("caw-box-x", "/home/agent"),
            workspace: None,
            runtime: crate::backend::Scratch {
                mount: "/run/caw-box".into(),
                ..Default::default()
            },
            runtime_over_stdin: false,
            limits: Limits {
                memory: Some(512 << 20),
                cpus: Some(1.5),
                pids: 300,
            },
            network,
            interactive: None,
            broker: None,
            egress_allow: vec![],
            egress_policy: Default::default(),
            extra_hosts: Vec::new(),
            oci_runtime: None,
            hand_over: Vec::new(),
            checkpoint: Vec::new(),
            protected: Vec::new(),
        }
    }

    /// `--network open|none|host|NAME` as Docker sees it. (Real turns on the host network or
    /// the default bridge are not run in tests: the vendor CLIs would reach public hosts.)
    #[test]
    fn network_modes_map_to_docker() {
        let mode = |n: &str| {
            turn_body(&spec(NetworkPolicy::from_setting(n)))
                .host_config
                .unwrap()
                .network_mode
        };
        assert_eq!(mode("open"), None, "open is Docker's default bridge");
        assert_eq!(mode("none"), Some("none".into()));
        assert_eq!(mode("host"), Some("host".into()));
        assert_eq!(mode("team-gateway"), Some("team-gateway".into()));
    }

    #[test]
    fn every_turn_container_is_locked_down() {
        let body = turn_body(&spec(NetworkPolicy::None));
        let hc = body.host_config.unwrap();
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.cap_add, None);
        assert_eq!(hc.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.privileged, Some(false));
        assert_eq!(
            (hc.memory, hc.nano_cpus, hc.pids_limit),
            (Some(512 << 20), Some(1_500_000_000), Some(300))
        );
        assert!(hc.tmpfs.unwrap().contains_key("/tmp"));
        let mounts = hc.mounts.unwrap();
        assert!(mounts
            .iter()
            .all(|m| !m.source.as_deref().unwrap_or("").contains("docker.sock")));
        assert_ne!(body.user.as_deref(), Some("0:0"));
        assert_eq!(body.tty, Some(false));
    }

    /// The runtime scratch is an anonymous volume carrying the labels the session layer gave
    /// it (found by them when its container was removed without it); none without any.
    #[test]
    fn the_runtime_scratch_is_a_labelled_anonymous_volume() {
        let scratch_of = |s: &TurnSpec| {
            let mounts = turn_body(s).host_config.unwrap().mounts.unwrap();
            mounts
                .into_iter()
                .find(|m| m.target.as_deref() == Some("/run/caw-box"))
                .unwrap()
        };
        let mut s = spec(NetworkPolicy::None);
        let plain = scratch_of(&s);
        assert_eq!((plain.typ, plain.source), (Some(MountType::VOLUME), None));
        assert_eq!(plain.volume_options, None);
        let labels = HashMap::from([("io.caw-box.role".to_string(), "runtime".to_string())]);
        s.runtime.labels = labels.clone();
        let labelled = scratch_of(&s);
        assert_eq!(
            labelled.source, None,
            "anonymous: removed with its container"
        );
        assert_eq!(labelled.volume_options.unwrap().labels, Some(labels));
    }

    /// A turn that hands its volumes over starts as the hand-over shell with only the
    /// capabilities it drops before the image's entrypoint (tini, caw-box-entry) runs the
    /// turn's command; the rest of the lock-down is the same.
    #[test]
    fn a_hand_over_holds_its_capabilities_only_until_the_entrypoint() {
        let mut s = spec(NetworkPolicy::None);
        s.user = (0, 0);
        s.hand_over = vec!["/home/agent".into(), "/workspace".into()];
        let body = turn_body(&s);
        let entrypoint = body.entrypoint.unwrap();
        assert_eq!(entrypoint[..2], ["/bin/sh".to_string(), "-c".to_string()]);
        assert!(entrypoint[2].contains(
            "exec setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- /usr/bin/tini -- /usr/local/bin/caw-box-entry \"$@\""
        ));
        assert_eq!(
            entrypoint[3..],
            [
                "caw-box-hand-over",
                "0:0",
                "/home/agent",
                "/workspace",
                "--"
            ]
            .map(String::from)
        );
        assert_eq!(body.cmd, Some(s.argv.clone()));
        let hc = body.host_config.unwrap();
        assert_eq!(
            hc.cap_add.unwrap(),
            [
                "CHOWN",
                "DAC_OVERRIDE",
                "DAC_READ_SEARCH",
                "FOWNER",
                "SETPCAP"
            ]
            .map(String::from)
        );
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.security_opt, Some(vec!["no-new-privileges".to_string()]));
        // Without one, the image's entrypoint as it is.
        assert_eq!(turn_body(&spec(NetworkPolicy::None)).entrypoint, None);
    }

    /// `--runtime`: the agent's container runs under it; none: the daemon's default.
    #[test]
    fn the_turns_runtime_is_the_containers() {
        let runtime = |r: Option<&str>| {
            let mut s = spec(NetworkPolicy::None);
            s.oci_runtime = r.map(String::from);
            turn_body(&s).host_config.unwrap().runtime
        };
        assert_eq!(runtime(Some("runsc")).as_deref(), Some("runsc"));
        assert_eq!(runtime(None), None);
    }

    /// Protected paths are read-only binds nested after the workspace's own.
    #[test]
    fn protected_paths_are_read_only_binds_after_the_workspace() {
        let mut s = spec(NetworkPolicy::None);
        s.workspace = Some(MountSpec::host_dir("/src", "/workspace"));
        s.protected =
            vec![MountSpec::host_dir("/src/.git/hooks", "/workspace/.git/hooks").read_only()];
        let mounts = turn_body(&s).host_config.unwrap().mounts.unwrap();
        let targets: Vec<&str> = mounts.iter().filter_map(|m| m.target.as_deref()).collect();
        assert_eq!(
            targets,
            [
                "/home/agent",
                "/workspace",
                "/workspace/.git/hooks",
                "/run/caw-box"
            ]
        );
        let hooks = &mounts[2];
        assert_eq!(hooks.typ, Some(MountType::BIND));
        assert_eq!(hooks.source.as_deref(), Some("/src/.git/hooks"));
        assert_eq!(hooks.read_only, Some(true));
        assert_eq!(mounts[1].read_only, None);
    }

    #[test]
    fn an_interactive_turn_gets_a_terminal_of_our_size() {
        let mut s = spec(NetworkPolicy::None);
        s.interactive = Some(Some((120, 40)));
        let body = turn_body(&s);
        assert_eq!((body.tty, body.open_stdin), (Some(true), Some(true)));
        assert_eq!(body.host_config.unwrap().console_size, Some(vec![40, 120]));
    }

    #[test]
    fn a_helper_keeps_the_images_entrypoint_unless_told_and_gets_its_tmp() {
        let plain = helper_body(&HelperSpec {
            image: "img".into(),
            network: NetworkPolicy::None,
            ..Default::default()
        });
        assert_eq!(plain.entrypoint, None);
        assert_eq!(plain.network_disabled, Some(true));
        let hc = plain.host_config.unwrap();
        assert_eq!((hc.tmpfs, hc.mounts), (None, None));
        let fetch = helper_body(&HelperSpec {
            image: "img".into(),
            entrypoint: vec!["true".into()],
            tmp: Some("rw,size=16m".into()),
            network: NetworkPolicy::Named("net".into()),
            ..Default::default()
        });
        assert_eq!(fetch.entrypoint, Some(vec!["true".to_string()]));
        assert_eq!(fetch.network_disabled, None);
        let hc = fetch.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("net"));
        assert_eq!(hc.tmpfs.unwrap()["/tmp"], "rw,size=16m");
    }
}
