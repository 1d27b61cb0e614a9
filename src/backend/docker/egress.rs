//! How Docker realises a turn's `--allow-host` ([`EgressPlan`]): an internal network of
//! the turn's own for the agent, and the proxy as a container on the session's outer
//! network joined to it under the proxy's alias. The plan (who is allowed, the proxy's
//! spec) is the session layer's; the networks are this backend's business.

use super::DockerBackend;
use crate::backend::{CreateError, EgressPlan, EgressRoute};

impl DockerBackend {
    pub(super) fn egress_route(plan: &EgressPlan) -> EgressRoute {
        EgressRoute {
            proxy_url: format!("http://{}:{}", plan.alias, plan.port),
            agent_network: Some(plan.network.clone()),
            proxy_log: plan.proxy_name.clone(),
        }
    }

    pub(super) async fn open_egress(&self, plan: &EgressPlan) -> Result<(), CreateError> {
        self.create_network(&plan.network, true, plan.proxy.labels.clone())
            .await
            .map_err(CreateError::Other)?;
        let started = async {
            self.create_helper(&plan.proxy_name, &plan.proxy).await?;
            self.connect_network(&plan.network, &plan.proxy_name, &plan.alias)
                .await
                .map_err(CreateError::Other)?;
            self.start_container(&plan.proxy_name)
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
        let _ = self.remove_container(&plan.proxy_name, true).await;
        let _ = self.remove_network(&plan.network).await;
    }
}
