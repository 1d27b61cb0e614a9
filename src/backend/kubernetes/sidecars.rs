//! The containers beside the agent in a turn's pod: the credential broker, the egress proxy
//! (`--allow-host`), and the init container whose firewall lets out only those two.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ResourceRequirements, SecurityContext, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::sandbox::hardened;
use crate::backend::{proxy_env, BrokerPlan, BrokerRoute, TurnSpec, PROXY_SCRIPT};

/// The proxy sidecar's container in a turn pod that holds its own egress; `<pod>/proxy`
/// names its log.
pub const PROXY_SIDECAR: &str = "proxy";
/// The broker's container beside the agent in a turn's pod
/// ([`BrokerPlace::InTurn`](crate::backend::BrokerPlace::InTurn)).
pub const BROKER_SIDECAR: &str = "broker";
/// A directory the agent's and the sidecars' containers of a turn's pod share (memory): the
/// agent's container leaves [`POD_END_FILE`] there when it ends, and the sidecars exit.
pub const POD_END_DIR: &str = "/caw-box-pod";
pub const POD_END_FILE: &str = "agent-ended";
/// The pod's loopback, where the agent reaches its sidecars and they alone listen.
pub const LOOPBACK: &str = "127.0.0.1";

/// The uid of a turn pod's proxy sidecar (`--allow-host`), and of its broker sidecar: each
/// its own, not the agent's, as the pod's firewall lets out these two alone
/// ([`egress_init`]).
pub const PROXY_UID: i64 = 10_001;
pub const BROKER_UID: i64 = 10_002;

/// How the agent reaches its broker beside it: on the pod's loopback, where it alone
/// listens.
pub fn broker_route(plan: &BrokerPlan) -> BrokerRoute {
    BrokerRoute {
        host: LOOPBACK.to_string(),
        listen: Some(LOOPBACK.to_string()),
        address: Some(LOOPBACK.to_string()),
        agent_network: None,
        shown: format!("{}/{BROKER_SIDECAR}", plan.turn),
    }
}

/// The credential broker beside the agent (`crate::session::broker`): its `program` in the
/// same image and sandbox under a uid of its own, its keys on its stdin (never in its
/// spec), the pod's end marker read-only.
pub(super) fn broker_container(spec: &TurnSpec, program: &str, gid: i64) -> Container {
    Container {
        stdin: Some(true),
        stdin_once: Some(false),
        ..sidecar(
            BROKER_SIDECAR,
            &spec.image,
            broker_command(program, &end_marker()),
            BROKER_UID,
            gid,
            "256Mi",
        )
    }
}

/// The pod's end marker, which the agent's container leaves when it ended.
fn end_marker() -> String {
    format!("{POD_END_DIR}/{POD_END_FILE}")
}

/// The broker's command beside the agent: its `program`, and an exit once `marker` appears
/// (the agent's container ended), so the pod completes.
pub(super) fn broker_command(program: &str, marker: &str) -> Vec<String> {
    let watch = format!(
        "setInterval(()=>{{if(require('fs').existsSync({}))process.exit(0);}},300);",
        serde_json::Value::String(marker.to_string())
    );
    vec!["node".into(), "-e".into(), format!("{program}{watch}")]
}

/// A helper beside the agent: the turn's image and the agent's sandbox under a uid of its
/// own, a memory limit, and the pod's end marker read-only (it exits when it appears).
fn sidecar(
    name: &str,
    image: &str,
    command: Vec<String>,
    uid: i64,
    gid: i64,
    memory: &str,
) -> Container {
    Container {
        name: name.into(),
        image: Some(image.to_string()),
        command: Some(command),
        security_context: Some(hardened(uid, gid)),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity(memory.into()),
            )])),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "pod-end".into(),
            mount_path: POD_END_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// `--allow-host` on Kubernetes, held inside the turn pod's own network namespace (as
/// Istio's init container does), so no NetworkPolicy is needed and any CNI will do: this
/// init container (the turn's image, root with NET_ADMIN and NET_RAW alone, no privilege
/// escalation) sets the pod's OUTPUT rules, IPv4 and IPv6: loopback, the proxy sidecar's
/// uid and (brokered) the broker's uid get out; every other packet is rejected. The
/// agent's container then reaches only the proxy on 127.0.0.1, which admits the allowed
/// hosts. It has no secret. A PodSecurity level of `baseline` or `restricted` forbids it.
/// (A helper pod that goes out, a login, gets the same: `helpers.rs`.)
pub(super) fn egress_init(image: &str, brokered: bool) -> Container {
    let mut uids = vec![PROXY_UID];
    if brokered {
        uids.push(BROKER_UID);
    }
    let uids = uids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    Container {
        name: EGRESS_INIT.into(),
        image: Some(image.to_string()),
        command: Some(vec![
            "bash".into(),
            "-c".into(),
            EGRESS_RULES.into(),
            "caw-box-egress".into(),
            uids,
        ]),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(false),
            run_as_user: Some(0),
            run_as_group: Some(0),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                add: Some(vec!["NET_ADMIN".to_string(), "NET_RAW".to_string()]),
            }),
            ..Default::default()
        }),
        // iptables-legacy's lock file, on a read-only root.
        volume_mounts: Some(vec![VolumeMount {
            name: "xtables".into(),
            mount_path: "/run".into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// The egress init container's name.
pub const EGRESS_INIT: &str = "egress";

/// [`egress_init`]'s rules, `$1` the uids let out: nft if the node's kernel has it, else
/// legacy; IPv6 too unless the pod has none.
const EGRESS_RULES: &str = r#"set -e
pick() {
  for v in nft legacy; do
    if "$1-$v" -w -S OUTPUT >/dev/null 2>&1; then echo "$1-$v"; return 0; fi
  done
  return 1
}
hold() {
  "$1" -w -A OUTPUT -o lo -j ACCEPT
  for u in $2; do "$1" -w -A OUTPUT -m owner --uid-owner "$u" -j ACCEPT; done
  "$1" -w -A OUTPUT -p tcp -j REJECT --reject-with tcp-reset
  "$1" -w -A OUTPUT -j REJECT
}
command -v iptables-nft >/dev/null || command -v iptables-legacy >/dev/null ||
  { echo "caw-box: the image has no iptables" >&2; exit 1; }
v4=$(pick iptables) || { echo "caw-box: iptables works neither as nft nor as legacy in this pod" >&2; exit 1; }
hold "$v4" "$1"
if v6=$(pick ip6tables); then
  hold "$v6" "$1"
elif [ -e /proc/net/if_inet6 ]; then
  echo "caw-box: the pod has IPv6 but ip6tables works neither as nft nor as legacy" >&2; exit 1
fi
echo "caw-box: egress held to uids $1 ($v4${v6:+, $v6})""#;

/// The proxy beside the agent under `--allow-host` (the image's proxy.js, as on Docker):
/// on the pod's loopback only, a uid of its own, the same sandbox; it exits on the pod's
/// end marker, as the broker does.
pub(super) fn proxy_container(
    image: &str,
    policy: crate::event::EgressPolicy,
    allow: &[String],
    gid: i64,
) -> Container {
    let marker = serde_json::Value::String(end_marker());
    let script = format!(
        "setInterval(()=>{{if(require('fs').existsSync({marker}))process.exit(0);}},300);require('{PROXY_SCRIPT}');"
    );
    let env = proxy_env(policy, allow)
        .into_iter()
        .chain([("CAW_BOX_PROXY_HOST", LOOPBACK.to_string())])
        .map(|(k, v)| k8s_openapi::api::core::v1::EnvVar {
            name: k.to_string(),
            value: Some(v),
            value_from: None,
        })
        .collect();
    let command = vec!["node".into(), "-e".into(), script];
    Container {
        env: Some(env),
        ..sidecar(PROXY_SIDECAR, image, command, PROXY_UID, gid, "128Mi")
    }
}
