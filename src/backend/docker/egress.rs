//! How Docker realises a turn's egress ([`EgressPlan`]): the agent on a network whose way
//! out is the proxy, a container of its own (the proxy program) on the session's outer
//! network joined to it. Under `open` the agent keeps a way out of its own (its named
//! network, or one made for it) and the proxy only records what goes through it. A shared
//! proxy ([`EgressPlan::shared`]) and its network are kept for the turns of every session
//! with the same egress; a turn's own (a login's) go with it. Who is allowed is the
//! session layer's; the networks and the proxy's container are this backend's business.

use super::DockerBackend;
use crate::backend::{proxy_env, Attached, CreateError, EgressPlan, EgressRoute};
use crate::backend::{HelperSpec, NetworkPolicy, PROXY_PORT, PROXY_SCRIPT};
use crate::event::EgressPolicy;
use crate::labelling::{labels, roles};

/// A turn's own proxy's name on its egress network.
pub const PROXY_ALIAS: &str = "caw-box-proxy";

/// Where a plan's proxy and agent go: the network the proxy is created on, the network it
/// joins (the agent's, when that is not the proxy's first), the agent's network, and the
/// network to make (`internal`: no way out but the proxy).
#[derive(Debug, PartialEq)]
struct EgressNetworks {
    first: NetworkPolicy,
    join: Option<String>,
    agent: String,
    make: Option<(String, bool)>,
}

fn egress_networks(plan: &EgressPlan) -> EgressNetworks {
    let made = plan.names[0].clone();
    match (plan.policy, &plan.network) {
        // Open on a named network: the agent's way out stays its own; the proxy sits there.
        (EgressPolicy::Open, NetworkPolicy::Named(n)) => EgressNetworks {
            first: NetworkPolicy::Named(n.clone()),
            join: None,
            agent: n.clone(),
            make: None,
        },
        // Open on the default bridge, which resolves no names: a network made for it.
        (EgressPolicy::Open, _) => EgressNetworks {
            first: NetworkPolicy::Named(made.clone()),
            join: None,
            agent: made.clone(),
            make: Some((made, false)),
        },
        // The engine's default network by its name, `bridge`, as a named network is joined
        // after.
        (_, outer) => EgressNetworks {
            first: match outer {
                NetworkPolicy::Default => NetworkPolicy::Named("bridge".to_string()),
                other => other.clone(),
            },
            join: Some(made.clone()),
            agent: made.clone(),
            make: Some((made, true)),
        },
    }
}

impl DockerBackend {
    pub(super) fn egress_route(plan: &EgressPlan) -> EgressRoute {
        let nets = egress_networks(plan);
        let host = match plan.shared || nets.join.is_none() {
            true => plan.names[1].as_str(),
            false => PROXY_ALIAS,
        };
        EgressRoute {
            proxy_url: format!("http://{host}:{PROXY_PORT}"),
            direct: vec!["localhost".to_string(), "127.0.0.1".to_string()],
            agent_network: Some(nets.agent),
            proxy_log: plan.names[1].clone(),
            shared: plan.shared,
        }
    }

    /// The proxy's container: hardened, as the agent's user; a shared one runs its program
    /// with stdin open (config and leases) and goes when it idled out, a turn's own runs the
    /// image's file with its config in the environment.
    fn proxy_spec(plan: &EgressPlan) -> HelperSpec {
        let nets = egress_networks(plan);
        let (entrypoint, env) = match plan.shared {
            true => (
                vec!["node".into(), "-e".into(), plan.program.clone()],
                vec![],
            ),
            false => (
                vec!["node".into(), PROXY_SCRIPT.into()],
                proxy_env(plan.policy, &plan.allow)
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
            ),
        };
        HelperSpec {
            scratch: None,
            image: plan.image.clone(),
            entrypoint,
            argv: vec![],
            env,
            user: Some(format!("{}:{}", plan.user.0, plan.user.1)),
            labels: plan.labels.clone(),
            mounts: vec![],
            network: nets.first,
            read_only_root: true,
            drop_all_capabilities: true,
            add_capabilities: vec![],
            no_new_privileges: true,
            pids_limit: Some(128),
            tmp: None,
            stdin: plan.shared,
            stdin_once: false,
            tty: false,
            auto_remove: plan.shared,
            // A shared proxy is named by its container's name; a turn's own by its alias.
            join: match plan.shared {
                true => nets.join.map(|n| (n, plan.names[1].clone())),
                false => None,
            },
            egress_allow: vec![],
            kept_dir: None,
        }
    }

    /// Makes the plan's network; a shared one only once (the caller holds the proxies'
    /// lock, as Docker may allow two networks of one name). A turn's own proxy is started
    /// here too; a shared one by [`Self::start_proxy`].
    pub(super) async fn open_egress(&self, plan: &EgressPlan) -> Result<(), CreateError> {
        let nets = egress_networks(plan);
        if let Some((network, internal)) = &nets.make {
            let exists = match plan.shared {
                true => {
                    // By name among the proxies' networks: it serves proxies of other
                    // settings too (their labels are theirs).
                    let labels = [format!("{}={}", labels::ROLE, roles::PROXY)];
                    let listed = self
                        .list_networks(&labels)
                        .await
                        .map_err(CreateError::Other)?;
                    listed.contains(network)
                }
                false => false,
            };
            if !exists {
                self.create_network(network, *internal, plan.labels.clone())
                    .await
                    .map_err(CreateError::Other)?;
            }
        }
        if plan.shared {
            return Ok(());
        }
        let (network, proxy) = (&plan.names[0], &plan.names[1]);
        let started = async {
            self.create_helper(proxy, &Self::proxy_spec(plan)).await?;
            if nets.join.is_some() {
                self.connect_network(network, proxy, PROXY_ALIAS)
                    .await
                    .map_err(CreateError::Other)?;
            }
            self.start_container(proxy)
                .await
                .map_err(CreateError::Other)
        }
        .await;
        if started.is_err() {
            self.close_egress(plan).await;
        }
        started
    }

    pub(super) async fn start_proxy(&self, plan: &EgressPlan) -> Result<Attached, CreateError> {
        let name = &plan.names[1];
        self.create_helper(name, &Self::proxy_spec(plan)).await?;
        let attached = self.attach(name, true).await.map_err(CreateError::Other)?;
        self.start_container(name)
            .await
            .map_err(CreateError::Other)?;
        Ok(attached)
    }

    pub(super) async fn close_egress(&self, plan: &EgressPlan) {
        if plan.shared {
            return;
        }
        let _ = self.remove_container(&plan.names[1], true).await;
        if egress_networks(plan).make.is_some() {
            let _ = self.remove_network(&plan.names[0]).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(policy: EgressPolicy, network: NetworkPolicy, shared: bool) -> EgressPlan {
        EgressPlan {
            turn: "caw-box-s".into(),
            policy,
            allow: vec!["pypi.org:443".into()],
            image: "img".into(),
            user: (1000, 1000),
            network,
            labels: Default::default(),
            names: ["caw-box-egress-h".into(), "caw-box-proxy-h".into()],
            shared,
            program: "loader".into(),
        }
    }

    /// Under balanced and locked the agent is on an internal network whose only way out is
    /// the proxy, which sits on the session's network; under open the agent keeps its way
    /// out (its named network, or one made for it, which resolves names) beside the proxy.
    #[test]
    fn the_agent_reaches_the_proxy_by_name_and_only_it_under_a_closed_policy() {
        let p = plan(EgressPolicy::Balanced, NetworkPolicy::Default, true);
        let nets = egress_networks(&p);
        assert_eq!(nets.first, NetworkPolicy::Named("bridge".into()));
        assert_eq!(nets.join.as_deref(), Some("caw-box-egress-h"));
        assert_eq!(nets.make, Some(("caw-box-egress-h".to_string(), true)));
        let route = DockerBackend::egress_route(&p);
        assert_eq!(route.proxy_url, "http://caw-box-proxy-h:3128");
        assert_eq!(route.agent_network.as_deref(), Some("caw-box-egress-h"));
        assert!(route.shared);
        let spec = DockerBackend::proxy_spec(&p);
        assert_eq!(spec.entrypoint, ["node", "-e", "loader"]);
        assert!(spec.stdin && spec.auto_remove && spec.env.is_empty());
        assert!(spec.read_only_root && spec.drop_all_capabilities && spec.no_new_privileges);
        assert_eq!(
            spec.join,
            Some((
                "caw-box-egress-h".to_string(),
                "caw-box-proxy-h".to_string()
            ))
        );

        let named = plan(
            EgressPolicy::Locked,
            NetworkPolicy::Named("lab".into()),
            true,
        );
        assert_eq!(
            egress_networks(&named).first,
            NetworkPolicy::Named("lab".into())
        );
        assert_eq!(egress_networks(&named).agent, "caw-box-egress-h");

        let open = plan(EgressPolicy::Open, NetworkPolicy::Named("lab".into()), true);
        let nets = egress_networks(&open);
        assert_eq!(
            (nets.agent.as_str(), nets.make, nets.join),
            ("lab", None, None)
        );
        let open = plan(EgressPolicy::Open, NetworkPolicy::Default, true);
        let nets = egress_networks(&open);
        assert_eq!(nets.make, Some(("caw-box-egress-h".to_string(), false)));
        assert_eq!(nets.first, NetworkPolicy::Named("caw-box-egress-h".into()));

        // A turn's own (a login's): the image's file, its config in the environment.
        let own = plan(EgressPolicy::Locked, NetworkPolicy::Default, false);
        let spec = DockerBackend::proxy_spec(&own);
        assert_eq!(spec.entrypoint, ["node", PROXY_SCRIPT]);
        assert!(spec
            .env
            .contains(&"CAW_BOX_EGRESS_POLICY=locked".to_string()));
        assert!(spec.env.contains(&"CAW_BOX_ALLOW=pypi.org:443".to_string()));
        assert!(!spec.stdin && spec.join.is_none());
        assert_eq!(
            DockerBackend::egress_route(&own).proxy_url,
            "http://caw-box-proxy:3128"
        );
    }
}
