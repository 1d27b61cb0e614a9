//! How Docker runs a turn's credential broker ([`BrokerPlan`]): a container of its own on a
//! network the agent shares, where the agent reaches it by name (a network made for it on
//! `--network open`, found or made once for a shared broker); and the sweep of what killed
//! turns left of brokers and egress proxies. The broker's program, keys and protocol are
//! the session layer's.

use super::DockerBackend;
use crate::backend::{Attached, BrokerPlan, CreateError};
use crate::error::Result;

impl DockerBackend {
    pub(super) async fn open_broker(&self, plan: &BrokerPlan) -> Result<()> {
        let Some(network) = &plan.network else {
            return Ok(());
        };
        if plan.shared {
            // Kept with the broker: made once (the caller holds the brokers' lock, as
            // Docker may allow two networks of one name).
            let labels: Vec<String> = plan
                .spec
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            if self.list_networks(&labels).await?.contains(network) {
                return Ok(());
            }
        }
        self.create_network(network, false, plan.spec.labels.clone())
            .await
    }

    pub(super) async fn start_broker(&self, plan: &BrokerPlan) -> Result<Attached, CreateError> {
        self.create_helper(&plan.name, &plan.spec).await?;
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
        if let Some(n) = &plan.network {
            let _ = self.remove_network(n).await;
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
