//! How Docker runs a turn's credential broker ([`BrokerPlan`]): a container of its own on a
//! network the agent shares, where the agent reaches it by name: the session's named
//! network, the turn's egress network (joined under its name; the broker itself is on the
//! session's network, its way out), or on `--network open` a network made for it (the
//! default bridge resolves no names), found or made once for a shared broker; and the sweep
//! of what killed turns left of brokers and egress proxies. The broker's program, keys and
//! protocol are the session layer's.

use super::DockerBackend;
use crate::backend::{Attached, BrokerPlan, BrokerRoute, CreateError, HelperSpec, NetworkPolicy};
use crate::error::Result;

/// Where a broker's container goes: the network it is created on, the agent's network it
/// joins under its name, and a network made for it (which the agent joins).
struct BrokerNetworks {
    first: NetworkPolicy,
    join: Option<String>,
    own: Option<String>,
}

fn broker_networks(plan: &BrokerPlan) -> BrokerNetworks {
    let egress = plan.egress.as_ref().and_then(|e| e.agent_network.clone());
    match (egress, &plan.network) {
        (Some(e), _) => BrokerNetworks {
            first: plan.network.clone(),
            join: Some(e),
            own: None,
        },
        (None, NetworkPolicy::Default) => BrokerNetworks {
            first: NetworkPolicy::Named(plan.beside.clone()),
            join: None,
            own: Some(plan.beside.clone()),
        },
        (None, _) => BrokerNetworks {
            first: plan.network.clone(),
            join: None,
            own: None,
        },
    }
}

/// How Docker routes a broker: reached by its container's name, which listens on every
/// address of its container.
pub fn broker_route(plan: &BrokerPlan) -> BrokerRoute {
    BrokerRoute {
        host: plan.name.clone(),
        listen: None,
        address: None,
        agent_network: broker_networks(plan).own,
        shown: plan.name.clone(),
    }
}

impl DockerBackend {
    /// The broker's container: its program with stdin open, hardened, as the agent's user.
    fn broker_spec(plan: &BrokerPlan) -> HelperSpec {
        let nets = broker_networks(plan);
        HelperSpec {
            scratch: None,
            image: plan.image.clone(),
            entrypoint: vec!["node".into(), "-e".into(), plan.program.clone()],
            argv: vec![],
            env: vec![],
            user: Some(format!("{}:{}", plan.user.0, plan.user.1)),
            labels: plan.labels.clone(),
            mounts: vec![],
            network: nets.first,
            read_only_root: true,
            drop_all_capabilities: true,
            add_capabilities: vec![],
            no_new_privileges: true,
            pids_limit: Some(64),
            tmp: None,
            stdin: true,
            stdin_once: false,
            tty: false,
            auto_remove: plan.shared,
            join: nets.join.map(|n| (n, plan.name.clone())),
            egress_allow: vec![],
            kept_dir: None,
        }
    }

    /// The running broker's address on the network the agent reaches it on.
    pub(super) async fn broker_address(&self, plan: &BrokerPlan) -> Result<Option<String>> {
        let nets = broker_networks(plan);
        let network = match (nets.own, nets.join, nets.first) {
            (Some(n), _, _) | (None, Some(n), _) | (None, None, NetworkPolicy::Named(n)) => n,
            _ => return Ok(None),
        };
        self.container_address(&plan.name, &network).await
    }

    pub(super) async fn open_broker(&self, plan: &BrokerPlan) -> Result<()> {
        let Some(network) = broker_networks(plan).own else {
            return Ok(());
        };
        if plan.shared {
            // Kept with the broker: made once (the caller holds the brokers' lock, as
            // Docker may allow two networks of one name).
            let labels: Vec<String> = plan
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            if self.list_networks(&labels).await?.contains(&network) {
                return Ok(());
            }
        }
        self.create_network(&network, false, plan.labels.clone())
            .await
    }

    pub(super) async fn start_broker(&self, plan: &BrokerPlan) -> Result<Attached, CreateError> {
        self.create_helper(&plan.name, &Self::broker_spec(plan))
            .await?;
        let attached = self
            .attach(&plan.name, true)
            .await
            .map_err(CreateError::Other)?;
        self.start_container(&plan.name)
            .await
            .map_err(CreateError::Other)?;
        Ok(attached)
    }

    pub(super) async fn close_broker(&self, plan: &BrokerPlan) {
        if plan.shared {
            return;
        }
        let _ = self.remove_container(&plan.name, true).await;
        if let Some(n) = broker_networks(plan).own {
            let _ = self.remove_network(&n).await;
        }
    }

    /// Removes the containers and networks carrying all of `labels` but those in `keep`;
    /// the first error, once all were tried.
    pub(super) async fn sweep(&self, labels: &[String], keep: &[&str]) -> Result<()> {
        let mut first = Ok(());
        for c in self.list_containers(labels).await? {
            if !keep.contains(&c.name.as_str()) && !c.id.is_empty() {
                let removed = self.remove_container(&c.id, true).await;
                first = first.and(removed);
            }
        }
        for n in self.list_networks(labels).await? {
            if !keep.contains(&n.as_str()) {
                let removed = self.remove_network(&n).await;
                first = first.and(removed);
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::EgressRoute;

    fn plan(network: NetworkPolicy, egress: Option<&str>) -> BrokerPlan {
        BrokerPlan {
            name: "caw-box-s-broker-1".into(),
            turn: "caw-box-s".into(),
            program: "loader".into(),
            image: "img".into(),
            user: (1000, 1000),
            labels: Default::default(),
            network,
            egress: egress.map(|n| EgressRoute {
                proxy_url: "http://caw-box-proxy:3128".into(),
                direct: vec![],
                agent_network: Some(n.into()),
                proxy_log: "p".into(),
                shared: false,
            }),
            shared: false,
            beside: "caw-box-s-brokernet-1".into(),
        }
    }

    /// Where the broker's container goes, so the agent can name it: a network made for it
    /// on `--network open` (the default bridge resolves no names), which the agent joins;
    /// the session's named network; under `--allow-host` the session's network (its way
    /// out) and the turn's egress network, joined under its name.
    #[test]
    fn the_broker_sits_where_the_agent_can_name_it() {
        let open = plan(NetworkPolicy::Default, None);
        let nets = broker_networks(&open);
        let own = "caw-box-s-brokernet-1".to_string();
        assert_eq!(nets.first, NetworkPolicy::Named(own.clone()));
        assert_eq!((nets.join, nets.own.clone()), (None, Some(own.clone())));
        let route = broker_route(&open);
        assert_eq!(route.agent_network, Some(own));
        assert_eq!(
            (route.host.as_str(), route.listen),
            ("caw-box-s-broker-1", None)
        );
        let spec = DockerBackend::broker_spec(&open);
        assert_eq!(spec.entrypoint, ["node", "-e", "loader"]);
        assert!(spec.stdin && spec.read_only_root && spec.drop_all_capabilities);
        assert_eq!(spec.user.as_deref(), Some("1000:1000"));

        let named = broker_networks(&plan(NetworkPolicy::Named("gw-net".into()), None));
        assert_eq!(named.first, NetworkPolicy::Named("gw-net".into()));
        assert_eq!((named.join, named.own), (None, None));

        let egress = plan(NetworkPolicy::Default, Some("egress-net"));
        let nets = broker_networks(&egress);
        assert_eq!(nets.first, NetworkPolicy::Default);
        assert_eq!(nets.join.as_deref(), Some("egress-net"));
        assert_eq!(broker_route(&egress).agent_network, None);
        let join = DockerBackend::broker_spec(&egress).join;
        assert_eq!(
            join,
            Some(("egress-net".to_string(), "caw-box-s-broker-1".to_string()))
        );
    }
}
