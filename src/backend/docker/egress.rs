//! How Docker realises a turn's `--allow-host` ([`EgressPlan`]): an internal network of
//! the turn's own for the agent, and the proxy (the image's proxy.js) as a container on
//! the session's outer network joined to it under the proxy's alias. Who is allowed is the
//! session layer's; the networks and the proxy's container are this backend's business.

use super::DockerBackend;
use crate::backend::{proxy_env, CreateError, EgressPlan, EgressRoute};
use crate::backend::{HelperSpec, NetworkPolicy, PROXY_PORT, PROXY_SCRIPT};

/// The proxy's name on a turn's egress network.
pub const PROXY_ALIAS: &str = "caw-box-proxy";

impl DockerBackend {
    /// The turn's egress network and the proxy's container, of `plan`'s names.
    fn egress_names(plan: &EgressPlan) -> (&str, &str) {
        (&plan.names[0], &plan.names[1])
    }

    pub(super) fn egress_route(plan: &EgressPlan) -> EgressRoute {
        let (network, proxy) = Self::egress_names(plan);
        EgressRoute {
            proxy_url: format!("http://{PROXY_ALIAS}:{PROXY_PORT}"),
            direct: vec!["localhost".to_string(), "127.0.0.1".to_string()],
            agent_network: Some(network.to_string()),
            proxy_log: proxy.to_string(),
        }
    }

    /// The proxy's container: on the session's network (the engine's default network by
    /// its name, `bridge`, as a named network is joined after), hardened, as the agent's
    /// user.
    fn proxy_spec(plan: &EgressPlan) -> HelperSpec {
        let outer = match &plan.network {
            NetworkPolicy::Default => NetworkPolicy::Named("bridge".to_string()),
            other => other.clone(),
        };
        HelperSpec {
            scratch: None,
            image: plan.image.clone(),
            entrypoint: vec!["node".into(), PROXY_SCRIPT.into()],
            argv: vec![],
            env: proxy_env(&plan.allow)
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            user: Some(format!("{}:{}", plan.user.0, plan.user.1)),
            labels: plan.labels.clone(),
            mounts: vec![],
            network: outer,
            read_only_root: true,
            drop_all_capabilities: true,
            add_capabilities: vec![],
            no_new_privileges: true,
            pids_limit: Some(128),
            tmp: None,
            stdin: false,
            tty: false,
            auto_remove: false,
            join: None,
            egress_allow: vec![],
            kept_dir: None,
        }
    }

    pub(super) async fn open_egress(&self, plan: &EgressPlan) -> Result<(), CreateError> {
        let (network, proxy) = Self::egress_names(plan);
        self.create_network(network, true, plan.labels.clone())
            .await
            .map_err(CreateError::Other)?;
        let started = async {
            self.create_helper(proxy, &Self::proxy_spec(plan)).await?;
            self.connect_network(network, proxy, PROXY_ALIAS)
                .await
                .map_err(CreateError::Other)?;
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

    pub(super) async fn close_egress(&self, plan: &EgressPlan) {
        let (network, proxy) = Self::egress_names(plan);
        let _ = self.remove_container(proxy, true).await;
        let _ = self.remove_network(network).await;
    }
}
