//! [`Backend`] for Docker: each operation is the [`DockerBackend`] method of the same name.
//! The inherent methods stay, for the commands that use Docker-only operations beside them
//! (image builds, `doctor`).

use std::collections::HashMap;
use std::time::Duration;

use super::{CreateError, DockerBackend};
use crate::backend::{
    Attached, Backend, ContainerInfo, HelperSpec, ImageInfo, OutputStream, TarFile, TurnSpec,
    VolumeInfo,
};
use crate::error::Result;

impl Backend for DockerBackend {
    fn capabilities(&self) -> &crate::backend::Capabilities {
        DockerBackend::capabilities(self)
    }

    async fn list_containers(&self, labels: &[String]) -> Result<Vec<ContainerInfo>> {
        DockerBackend::list_containers(self, labels).await
    }

    async fn create_turn(
        &self,
        name: &str,
        spec: &TurnSpec,
    ) -> std::result::Result<String, CreateError> {
        DockerBackend::create_turn(self, name, spec).await
    }

    async fn create_helper(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<String, CreateError> {
        DockerBackend::create_helper(self, name, spec).await
    }

    async fn inspect_container(&self, name: &str) -> Result<Option<ContainerInfo>> {
        DockerBackend::inspect_container(self, name).await
    }

    fn egress_route(&self, plan: &crate::backend::EgressPlan) -> crate::backend::EgressRoute {
        DockerBackend::egress_route(plan)
    }

    async fn open_egress(
        &self,
        plan: &crate::backend::EgressPlan,
    ) -> std::result::Result<(), CreateError> {
        DockerBackend::open_egress(self, plan).await
    }

    async fn close_egress(&self, plan: &crate::backend::EgressPlan) {
        DockerBackend::close_egress(self, plan).await
    }

    async fn start_proxy(
        &self,
        plan: &crate::backend::EgressPlan,
    ) -> std::result::Result<Attached, CreateError> {
        DockerBackend::start_proxy(self, plan).await
    }

    async fn agent_address(
        &self,
        name: &str,
        route: &crate::backend::EgressRoute,
    ) -> Option<String> {
        let network = route.agent_network.as_deref()?;
        self.container_address(name, network).await.ok().flatten()
    }

    fn broker_route(&self, plan: &crate::backend::BrokerPlan) -> crate::backend::BrokerRoute {
        super::broker::broker_route(plan)
    }

    async fn broker_address(&self, plan: &crate::backend::BrokerPlan) -> Result<Option<String>> {
        DockerBackend::broker_address(self, plan).await
    }

    async fn open_broker(&self, plan: &crate::backend::BrokerPlan) -> Result<()> {
        DockerBackend::open_broker(self, plan).await
    }

    async fn start_broker(
        &self,
        plan: &crate::backend::BrokerPlan,
    ) -> std::result::Result<Attached, CreateError> {
        DockerBackend::start_broker(self, plan).await
    }

    async fn attach_broker(&self, name: &str) -> Result<Attached> {
        self.attach(name, true).await
    }

    async fn close_broker(&self, plan: &crate::backend::BrokerPlan) {
        DockerBackend::close_broker(self, plan).await
    }

    async fn sweep(&self, labels: &[String], keep: &[&str]) -> Result<()> {
        DockerBackend::sweep(self, labels, keep).await
    }

    async fn remove_unused_networks(&self, labels: &[String]) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        for n in self.list_networks(labels).await? {
            match self.docker.remove_network(&n).await {
                Ok(()) => removed.push(n),
                // In use (a proxy or a turn on it), or gone meanwhile: not this one.
                Err(e) if super::is_conflict(&e) || super::is_not_found(&e) => {}
                Err(e) => tracing::debug!("could not remove network '{n}': {e}"),
            }
        }
        Ok(removed)
    }

    async fn remove_unused_volumes(&self, labels: &[String]) -> Result<Vec<String>> {
        DockerBackend::remove_unused_volumes(self, labels).await
    }

    fn logs_hint(&self, name: &str) -> String {
        format!("`docker logs {name}`")
    }

    fn removed_under_turn(&self, name: &str) -> crate::error::Error {
        let id = name.strip_prefix("caw-box-").unwrap_or(name);
        crate::error::Error::environment(format!(
            "the turn's container '{name}' was removed while the turn ran (`docker rm`, a prune?), so the turn is not recorded"
        ))
        .with_hint(format!(
            "the session's state is kept: `caw-box resume {id}` continues it"
        ))
    }

    async fn attach(&self, name: &str, stdin: bool) -> Result<Attached> {
        if self.is_warm_turn(name) {
            return self.warm_attach(name, stdin).await;
        }
        DockerBackend::attach(self, name, stdin).await
    }

    async fn resize_tty(&self, name: &str, columns: u16, rows: u16) -> Result<()> {
        DockerBackend::resize_tty(self, name, columns, rows).await
    }

    async fn start_container(&self, name: &str) -> Result<()> {
        if self.is_warm_turn(name) {
            // Started by its attach.
            return Ok(());
        }
        DockerBackend::start_container(self, name).await
    }

    async fn wait_container(&self, name: &str) -> Result<i64> {
        if self.is_warm_turn(name) {
            return self.warm_wait(name).await;
        }
        if let Some(c) = self
            .inspect_container(name)
            .await?
            .filter(|c| c.label(crate::backend::warm::WARM_LABEL).is_some())
        {
            return self.wait_warm_elsewhere(&c).await;
        }
        DockerBackend::wait_container(self, name).await
    }

    async fn stop_container(&self, name: &str, grace: Duration) -> Result<()> {
        // A warm container's turn, not the container: it stays for the record.
        if self.stop_warm_turn(name, grace).await? {
            return Ok(());
        }
        DockerBackend::stop_container(self, name, grace).await
    }

    async fn check_runtime(&self, name: &str) -> Result<()> {
        DockerBackend::check_runtime(self, name).await
    }

    async fn remove_container(&self, name: &str, force: bool) -> Result<()> {
        if self.is_warm_turn(name) {
            return self.release_warm(name).await;
        }
        DockerBackend::remove_container(self, name, force).await
    }

    async fn claim_warm(&self, name: &str) -> Result<Option<ContainerInfo>> {
        DockerBackend::claim_warm(self, name).await
    }

    fn exec_in_warm(&self, name: &str, exec: crate::backend::warm::WarmExec) {
        DockerBackend::exec_in_warm(self, name, exec)
    }

    async fn turn_in_warm(&self, name: &str) -> Result<Option<(u32, u32)>> {
        DockerBackend::turn_in_warm(self, name).await
    }

    async fn warm_idle_for(&self, name: &str) -> Result<Option<u64>> {
        DockerBackend::warm_idle_for(self, name).await
    }

    async fn idle_warm(&self, name: &str) -> Result<()> {
        DockerBackend::idle_warm(self, name).await
    }

    async fn pool_park(&self, name: &str, box_name: &str) -> Result<()> {
        DockerBackend::pool_park(self, name, box_name).await
    }

    async fn pool_prime(&self, box_name: &str, argv: Vec<String>) -> Result<i64> {
        DockerBackend::exec_to_end(self, box_name, argv).await
    }

    async fn pool_claim(&self, box_name: &str, name: &str) -> Result<bool> {
        DockerBackend::pool_claim(self, box_name, name).await
    }

    async fn remove_warm(&self, name: &str) -> Result<bool> {
        DockerBackend::remove_warm(self, name).await
    }

    async fn rename_container(&self, name: &str, to: &str) -> Result<()> {
        DockerBackend::rename_container(self, name, to).await
    }

    async fn remove_found(&self, found: &ContainerInfo) -> Result<()> {
        // By id: a name passes on to the next container that takes it.
        let id = if found.id.is_empty() {
            &found.name
        } else {
            &found.id
        };
        DockerBackend::remove_container(self, id, true).await
    }

    async fn run_to_completion(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<(i64, String, String), CreateError> {
        DockerBackend::run_to_completion(self, name, spec).await
    }

    fn follow_logs(&self, name: &str) -> OutputStream {
        DockerBackend::follow_logs(self, name)
    }

    fn logs_so_far(&self, name: &str) -> OutputStream {
        DockerBackend::logs(self, name, false)
    }

    fn logs_since(&self, name: &str, since: std::time::SystemTime, follow: bool) -> OutputStream {
        DockerBackend::logs_since(self, name, since, follow)
    }

    async fn inspect_image(&self, image: &str) -> Result<Option<ImageInfo>> {
        DockerBackend::inspect_image(self, image).await
    }

    async fn create_volume(&self, name: &str, labels: HashMap<String, String>) -> Result<()> {
        DockerBackend::create_volume(self, name, labels).await
    }

    async fn inspect_volume(&self, name: &str) -> Result<Option<VolumeInfo>> {
        DockerBackend::inspect_volume(self, name).await
    }

    async fn list_volumes(&self, labels: &[String]) -> Result<Vec<VolumeInfo>> {
        DockerBackend::list_volumes(self, labels).await
    }

    async fn remove_volume(&self, name: &str) -> Result<()> {
        DockerBackend::remove_volume(self, name).await
    }

    async fn upload_files(
        &self,
        name: &str,
        dir: &str,
        files: &[TarFile<'_>],
        owner: (u32, u32),
    ) -> Result<()> {
        DockerBackend::upload_files(self, name, dir, files, owner).await
    }

    async fn upload_tar(&self, name: &str, dir: &str, tar: Vec<u8>) -> Result<()> {
        DockerBackend::upload_tar(self, name, dir, tar).await
    }

    async fn download_file(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        DockerBackend::download_file(self, name, path).await
    }

    async fn download_tar(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        DockerBackend::download_tar(self, name, path).await
    }
}
