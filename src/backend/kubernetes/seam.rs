//! [`Backend`] for Kubernetes: turns and helpers as pods, volumes as claims and config maps,
//! files through `exec`; over the pieces in the files beside this one.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams};

use super::helpers::HELPER;
use super::sidecars::{BROKER_SIDECAR, LOOPBACK, PROXY_SIDECAR};
use super::spec::{shell_quote, turn_pod_spec, RUNTIME_READY};
use super::status::{
    container_info, deleted_under_turn, oom_kills, out_of_memory, pod_failure, pod_progress,
    Progress, OOM_COUNTERS,
};
use super::{failed, is_status, label_selector, meta, KubeBackend};
use crate::backend::warm::WARM_LABEL;
use crate::backend::{
    Attached, Backend, ContainerInfo, CreateError, HelperSpec, ImageInfo, OutputStream, TarFile,
    TurnSpec, VolumeInfo,
};
use crate::error::{Error, Result};

impl Backend for KubeBackend {
    fn capabilities(&self) -> &crate::backend::Capabilities {
        &self.capabilities
    }

    async fn list_containers(&self, labels: &[String]) -> Result<Vec<ContainerInfo>> {
        let pods = self.list_pods(&label_selector(labels)).await?;
        Ok(pods
            .iter()
            .map(container_info)
            .map(super::warm::shown)
            .filter(|c| meta::matches(&c.labels, labels))
            .collect())
    }

    async fn create_turn(
        &self,
        name: &str,
        spec: &TurnSpec,
    ) -> std::result::Result<String, CreateError> {
        let mut pod_spec = turn_pod_spec(spec).map_err(CreateError::Other)?;
        self.ends.forget(name);
        // A claim seeded once needs no seed-home init container (a container's whole
        // start, the largest step of a turn's pod start on a node).
        let state = match &spec.home.source {
            crate::backend::MountSource::Volume(v) => Some(v.as_str()),
            crate::backend::MountSource::HostDir(_) => None,
        };
        let seeded = match state {
            Some(claim) => self.home_seeded(claim).await,
            None => false,
        };
        if seeded {
            if let Some(init) = pod_spec.init_containers.as_mut() {
                init.retain(|c| c.name != super::spec::SEED_HOME);
            }
        }
        let mut labels = turn_pod_labels(spec);
        if spec.labels.contains_key(WARM_LABEL) {
            super::warm::warm_pod(spec, &mut pod_spec, &mut labels);
        }
        self.create_over_idle(&self.pod(name, &labels, pod_spec))
            .await?;
        self.wait_running(name, &spec.image).await?;
        if let (false, Some(claim)) = (seeded, state) {
            self.note_seeded(name, claim).await;
        }
        if spec.interactive.is_some() {
            let dir = &spec.runtime.mount;
            let mut files = spec.runtime.tar_files();
            files.push(TarFile {
                path: RUNTIME_READY,
                contents: b"",
                mode: 0o600,
            });
            let put = self
                .upload_files(name, dir, &files, spec.user)
                .await
                .map_err(CreateError::Other);
            if let Err(e) = put {
                let _ = self.remove_container(name, true).await;
                return Err(e);
            }
        }
        Ok(name.to_string())
    }

    async fn create_helper(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<String, CreateError> {
        self.create_waiting_helper(name, spec)
            .await
            .map(|()| name.to_string())
    }

    async fn inspect_container(&self, name: &str) -> Result<Option<ContainerInfo>> {
        self.inspect_shown(name).await
    }

    async fn attach(&self, name: &str, stdin: bool) -> Result<Attached> {
        if self.is_warm_turn(name) {
            return self.warm_attach(name).await;
        }
        let tty = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?
            .and_then(|p| p.spec?.containers.first().cloned());
        let main = tty.as_ref().map(|c| c.name.clone());
        let tty = tty.and_then(|c| c.tty).unwrap_or(false);
        if main.as_deref() == Some(HELPER) {
            return self.attach_helper(name, stdin, tty).await;
        }
        self.attach_to(name, main, stdin, tty).await
    }

    /// A container of the turn's pod ([`TurnSpec::broker`]), on the pod's loopback alone:
    /// the agent reaches it there, nothing else does.
    fn broker_route(&self, plan: &crate::backend::BrokerPlan) -> crate::backend::BrokerRoute {
        super::sidecars::broker_route(plan)
    }

    /// Held in the turn's pod (from [`TurnSpec::egress_allow`]): a proxy sidecar on the
    /// pod's loopback, and firewall rules that let out only it and the broker.
    fn egress_route(&self, plan: &crate::backend::EgressPlan) -> crate::backend::EgressRoute {
        crate::backend::EgressRoute {
            proxy_url: format!("http://{LOOPBACK}:{}", crate::backend::PROXY_PORT),
            direct: vec!["localhost".to_string(), LOOPBACK.to_string()],
            agent_network: None,
            proxy_log: format!("{}/{PROXY_SIDECAR}", plan.turn),
            shared: false,
        }
    }

    /// The pod makes its egress hold with itself: nothing comes before it.
    async fn open_egress(
        &self,
        _plan: &crate::backend::EgressPlan,
    ) -> std::result::Result<(), CreateError> {
        Ok(())
    }

    /// The hold goes with the turn's pod.
    async fn close_egress(&self, _plan: &crate::backend::EgressPlan) {}

    /// Nothing to make: the broker is a container of the turn's pod ([`TurnSpec::broker`]).
    async fn open_broker(&self, _plan: &crate::backend::BrokerPlan) -> Result<()> {
        Ok(())
    }

    /// The turn pod's broker container, attached to once it runs: it may start a moment
    /// after the agent's.
    async fn start_broker(
        &self,
        plan: &crate::backend::BrokerPlan,
    ) -> std::result::Result<Attached, CreateError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match self.attach_sidecar(&plan.turn, BROKER_SIDECAR).await {
                Ok(a) => return Ok(a),
                Err(e) if tokio::time::Instant::now() > deadline => {
                    return Err(CreateError::Other(e))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// The broker goes with the turn's pod.
    async fn attach_broker(&self, turn: &str) -> Result<Attached> {
        self.attach_sidecar(turn, BROKER_SIDECAR).await
    }

    async fn close_broker(&self, _plan: &crate::backend::BrokerPlan) {}

    /// A Lease in the namespace: one refresh of a login at a time across hosts.
    async fn hold_refresh(&self, login: &str, limit: Duration) -> Option<crate::backend::Hold> {
        self.hold_refresh_lease(login, limit).await
    }

    /// A Lease per slot in the namespace: one cap for every host's turns of the account.
    async fn try_account_slot(
        &self,
        account: &str,
        cap: u32,
    ) -> Result<Option<crate::backend::Hold>> {
        self.try_slot_lease(account, cap).await
    }

    /// Nothing of a turn's broker or egress outlives its pod; a session's pods and claims
    /// are removed as containers and volumes.
    async fn sweep(&self, _labels: &[String], _keep: &[&str]) -> Result<()> {
        Ok(())
    }

    /// A pod's egress is its own: no network of caw-box's.
    async fn remove_unused_networks(&self, _labels: &[String]) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// A pod's scratch is its memory: no volume of a container's own.
    async fn remove_unused_volumes(&self, _labels: &[String]) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    async fn resize_tty(&self, name: &str, columns: u16, rows: u16) -> Result<()> {
        let mut terminals = self
            .terminals
            .lock()
            .map_err(|_| Error::environment("the terminal sizes' lock is poisoned"))?;
        if let Some(resize) = terminals.get_mut(name) {
            if !resize(columns, rows) {
                terminals.remove(name);
            }
        }
        Ok(())
    }

    async fn start_container(&self, name: &str) -> Result<()> {
        // A turn's pod runs once created (its entrypoint waits for the runtime files on
        // stdin); a created helper's command waits for its start marker (`helpers.rs`).
        self.start_waiting_helper(name).await
    }

    async fn wait_container(&self, name: &str) -> Result<i64> {
        if self.is_warm_turn(name) {
            return self.warm_wait(name).await;
        }
        let t0 = std::time::Instant::now();
        loop {
            // The agent's own word through an attachment, else the pod's status.
            let told = self.ends.told();
            tokio::pin!(told);
            told.as_mut().enable();
            // (Only a 0 is trusted: the record taken, the turn not stopped.)
            if let Some(0) = self.ends.take(name) {
                super::timeline("the agent said it ended", t0);
                return Ok(0);
            }
            let pod = self
                .pods()
                .get_opt(name)
                .await
                .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
            let Some(pod) = pod else {
                return Err(deleted_under_turn(name));
            };
            if Self::is_warm_pod(&pod) {
                return self.wait_warm_elsewhere(&pod).await;
            }
            if let Progress::Ended(code) = pod_progress(&pod) {
                super::timeline("wait for the pod's end", t0);
                self.ends.forget(name);
                return Ok(code);
            }
            tokio::select! {
                () = tokio::time::sleep(super::poll_after(t0)) => {}
                () = told => {}
            }
        }
    }

    fn logs_hint(&self, name: &str) -> String {
        format!("`kubectl logs -n {} {name}`", self.namespace())
    }

    /// Kubernetes has no per-pod process limit (a node's kubelet sets `podPidsLimit` for
    /// all its pods, or none); and a pod cannot be put on a Docker network or the host's
    /// (`--allow-host` is held inside the turn's pod: firewall rules in its network
    /// namespace and a proxy sidecar; `--network none` is refused for every backend, by the
    /// settings).
    fn refuse_settings(&self, network: &str, pids_limit: Option<i64>) -> Result<()> {
        if !matches!(network, "open" | "") {
            return Err(Error::usage(format!(
                "--network {network} is not available with the kubernetes backend: pods use the cluster's network"
            ))
            .with_hint("drop --network (and `network` from config files); --allow-host holds a turn's egress to a list"));
        }
        if let Some(limit) = pids_limit {
            return Err(Error::usage(format!(
                "--pids-limit {limit} is not available with the kubernetes backend: a pod spec has no process limit (a node's kubelet sets one for all its pods, `podPidsLimit`)"
            ))
            .with_hint("drop --pids-limit (and `pids_limit` from config files); ask the cluster's admin for a kubelet podPidsLimit"));
        }
        Ok(())
    }

    fn removed_under_turn(&self, name: &str) -> Error {
        deleted_under_turn(name)
    }

    async fn ended_by_environment(&self, name: &str) -> Option<String> {
        let pod = self.pods().get_opt(name).await.ok().flatten()?;
        if let Some(why) = pod_failure(&pod) {
            return Some(why);
        }
        if !container_info(&pod).running() {
            return None;
        }
        // The pod still waits for its record: its memory cgroup counts the kernel's kills
        // (cgroup v1 `memory.oom_control`, v2 `memory.events`), those of a tool's process
        // as well as the CLI's.
        let out = self
            .exec(name, &["sh", "-c", OOM_COUNTERS], None)
            .await
            .ok()?;
        (oom_kills(&String::from_utf8_lossy(&out)) > 0).then(|| out_of_memory(&pod))
    }

    async fn stop_container(&self, name: &str, grace: Duration) -> Result<()> {
        // A warm pod's turn, not the pod: it stays for the record.
        if self.stop_warm_turn(name, grace).await? {
            return Ok(());
        }
        // tini forwards the signal to the entrypoint, which stops the CLI and cleans up.
        if self.exec(name, &["kill", "-TERM", "1"], None).await.is_ok() {
            let ended = tokio::time::timeout(grace, self.wait_container(name)).await;
            if ended.is_ok() {
                return Ok(());
            }
        }
        self.remove_container(name, true).await
    }

    async fn note_stop(&self, name: &str) -> Result<()> {
        let key = crate::labelling::labels::STOP_REQUESTED;
        let patch = serde_json::json!({"metadata": {"annotations": {key: "true"}}});
        self.pods()
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map_err(|e| failed(format!("annotate pod '{name}'"), &e))?;
        Ok(())
    }

    async fn stop_noted(&self, name: &str) -> bool {
        let key = crate::labelling::labels::STOP_REQUESTED;
        Backend::inspect_container(self, name)
            .await
            .ok()
            .flatten()
            .is_some_and(|c| c.label(key) == Some("true"))
    }

    async fn check_runtime(&self, name: &str) -> Result<()> {
        self.check_runtime_class(name).await
    }

    async fn remove_container(&self, name: &str, force: bool) -> Result<()> {
        if self.is_warm_turn(name) {
            return self.release_warm(name).await;
        }
        self.forget_waiting_helper(name);
        self.delete_pod(name, None, force).await
    }

    async fn rename_container(&self, name: &str, _: &str) -> Result<()> {
        // A pod keeps its name; no turn finishes behind itself here (`finishes_behind`).
        Err(Error::environment(format!(
            "pod '{name}' cannot be renamed"
        )))
    }

    async fn remove_found(&self, found: &ContainerInfo) -> Result<()> {
        let uid = (!found.id.is_empty()).then(|| found.id.clone());
        if super::warm::box_name(&found.labels).is_some() {
            return self.remove_box(&found.name, uid).await;
        }
        if let Some(pod) = super::warm::idle_pod_of(found) {
            self.remove_idle(pod, uid.as_deref()).await?;
            return Ok(());
        }
        // A warm pod's loop ends on SIGTERM: not forced (see `remove_idle`).
        let force = !found.labels.contains_key(WARM_LABEL);
        self.delete_pod(&found.name, uid, force).await
    }

    async fn claim_warm(&self, name: &str) -> Result<Option<ContainerInfo>> {
        KubeBackend::claim_warm(self, name).await
    }

    fn exec_in_warm(&self, name: &str, exec: crate::backend::warm::WarmExec) {
        KubeBackend::exec_in_warm(self, name, exec)
    }

    async fn turn_in_warm(&self, name: &str) -> Result<Option<(u32, u32)>> {
        KubeBackend::turn_in_warm(self, name).await
    }

    async fn warm_idle_for(&self, name: &str) -> Result<Option<u64>> {
        KubeBackend::warm_idle_for(self, name).await
    }

    async fn idle_warm(&self, name: &str) -> Result<()> {
        KubeBackend::idle_warm(self, name).await
    }

    async fn pool_park(&self, name: &str, box_name: &str) -> Result<()> {
        KubeBackend::pool_park(self, name, box_name).await
    }

    async fn pool_prime(&self, box_name: &str, argv: Vec<String>) -> Result<i64> {
        KubeBackend::pool_prime(self, box_name, argv).await
    }

    async fn pool_claim(&self, box_name: &str, name: &str) -> Result<bool> {
        KubeBackend::pool_claim(self, box_name, name).await
    }

    async fn remove_warm(&self, name: &str) -> Result<bool> {
        self.remove_idle(name, None).await
    }

    async fn run_to_completion(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<(i64, String, String), CreateError> {
        self.run_helper(name, spec).await
    }

    fn follow_logs(&self, name: &str) -> OutputStream {
        self.logs(name, true)
    }

    fn logs_so_far(&self, name: &str) -> OutputStream {
        self.logs(name, false)
    }

    fn logs_since(&self, name: &str, since: std::time::SystemTime, follow: bool) -> OutputStream {
        KubeBackend::logs_since(self, name, since, follow)
    }

    async fn inspect_image(&self, image: &str) -> Result<Option<ImageInfo>> {
        // The API server does not say which images its nodes have: a missing one shows
        // when a pod cannot start (`CreateError::ImageMissing`).
        Ok(Some(ImageInfo {
            tags: vec![image.to_string()],
            ..Default::default()
        }))
    }

    async fn snapshot_class(&self) -> Result<Option<String>> {
        KubeBackend::snapshot_class(self).await
    }

    async fn clone_volume(
        &self,
        class: &str,
        from: &str,
        to: &str,
        labels: HashMap<String, String>,
    ) -> Result<()> {
        self.clone_claim(class, from, to, &labels).await
    }

    async fn create_volume(&self, name: &str, labels: HashMap<String, String>) -> Result<()> {
        let (k8s_labels, annotations) = meta::split(&labels);
        let metadata = ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.namespace.clone()),
            labels: Some(k8s_labels),
            annotations: Some(annotations),
            ..Default::default()
        };
        let role = labels.get(crate::labelling::labels::ROLE);
        let created = if role.map(String::as_str) == Some(crate::labelling::roles::TURN_RECORD) {
            let map = ConfigMap {
                metadata,
                ..Default::default()
            };
            let t0 = std::time::Instant::now();
            let made = self
                .config_maps()
                .create(&PostParams::default(), &map)
                .await
                .map(|_| ());
            super::timeline("ConfigMap (turn record)", t0);
            made
        } else {
            let class = self.cluster.storage_class.clone();
            if let Some(class) = &class {
                self.check_storage_class(name, class).await?;
            }
            let size = (self.cluster.volume_size.clone()).unwrap_or_else(|| "1Gi".into());
            let claim = super::snapshots::claim(metadata, class, size, None);
            self.claims()
                .create(&PostParams::default(), &claim)
                .await
                .map(|_| ())
        };
        match created {
            // Docker's create is idempotent by name; so is this, but for a claim still being
            // deleted (a pod that mounted it would wait for it forever).
            Err(e) if is_status(&e, 409) => {
                let going = self
                    .claims()
                    .get_opt(name)
                    .await
                    .map_err(|e| failed(format!("read claim '{name}'"), &e))?
                    .is_some_and(|c| c.metadata.deletion_timestamp.is_some());
                if going {
                    return Err(Error::environment(format!(
                        "claim '{name}' is still being deleted"
                    ))
                    .with_hint("try again once `kubectl get pvc` no longer lists it"));
                }
                Ok(())
            }
            Err(e) => Err(failed(format!("create volume '{name}'"), &e)),
            Ok(()) => Ok(()),
        }
    }

    async fn inspect_volume(&self, name: &str) -> Result<Option<VolumeInfo>> {
        let claim = self
            .claims()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read claim '{name}'"), &e))?;
        if let Some(c) = claim {
            if c.metadata.deletion_timestamp.is_none() {
                return Ok(Some(meta::volume(&c.metadata)));
            }
            return Ok(None);
        }
        let map = self
            .config_maps()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read config map '{name}'"), &e))?;
        Ok(map.map(|m| meta::volume(&m.metadata)))
    }

    async fn list_volumes(&self, labels: &[String]) -> Result<Vec<VolumeInfo>> {
        let params = ListParams::default().labels(&label_selector(labels));
        let (claim_api, map_api) = (self.claims(), self.config_maps());
        let (claims, maps) = tokio::join!(
            claim_api.list_metadata(&params),
            map_api.list_metadata(&params)
        );
        let what = format!("list volumes in namespace '{}'", self.namespace);
        let claims = claims.map_err(|e| failed(&what, &e))?;
        let maps = maps.map_err(|e| failed(&what, &e))?;
        Ok(claims
            .items
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| meta::volume(&c.metadata))
            .chain(maps.items.iter().map(|m| meta::volume(&m.metadata)))
            .filter(|v| meta::matches(&v.labels, labels))
            .collect())
    }

    async fn remove_volume(&self, name: &str) -> Result<()> {
        let params = DeleteParams::default();
        let (claim_api, map_api) = (self.claims(), self.config_maps());
        let (claim, map) = tokio::join!(
            claim_api.delete(name, &params),
            map_api.delete(name, &params)
        );
        for r in [claim.map(|_| ()), map.map(|_| ())] {
            match r {
                Ok(()) => {}
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(failed(format!("delete volume '{name}'"), &e)),
            }
        }
        Ok(())
    }

    async fn upload_files(
        &self,
        name: &str,
        dir: &str,
        files: &[TarFile<'_>],
        owner: (u32, u32),
    ) -> Result<()> {
        let tar = crate::backend::build_tar(files, owner.0.into(), owner.1.into())?;
        self.upload_tar(name, dir, tar).await
    }

    async fn upload_tar(&self, name: &str, dir: &str, tar: Vec<u8>) -> Result<()> {
        // Not as root: tar keeps the files' modes, and they belong to the pod's user.
        let script = format!(
            "mkdir -p {d} && tar -x --no-same-owner -m -f - -C {d}",
            d = shell_quote(dir)
        );
        let put = self
            .exec_files(name, dir, &["sh", "-c", &script], Some(tar))
            .await?;
        if put.is_none() {
            return Err(Error::environment(format!(
                "pod '{name}' has ended: {dir} went with it"
            )));
        }
        Ok(())
    }

    async fn download_file(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let script = format!(
            "if [ -f {p} ]; then printf Y; cat {p}; else printf N; fi",
            p = shell_quote(path)
        );
        self.exec_marked(name, path, &script).await
    }

    async fn download_tar(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let p = std::path::Path::new(path);
        let parent = p.parent().map(|x| x.to_string_lossy().into_owned());
        let base = p
            .file_name()
            .map(|x| x.to_string_lossy().into_owned())
            .unwrap_or_else(|| ".".into());
        let (parent, base) = if path.ends_with("/.") {
            (path.trim_end_matches("/.").to_string(), ".".to_string())
        } else {
            (parent.unwrap_or_else(|| "/".into()), base)
        };
        let script = format!(
            "if [ -e {p} ]; then printf Y; tar -c -f - -C {parent} {base}; else printf N; fi",
            p = shell_quote(path),
            parent = shell_quote(&parent),
            base = shell_quote(&base)
        );
        self.exec_marked(name, path, &script).await
    }
}

/// A turn pod's labels: the turn's, and on a headless turn's [`ADOPTABLE`]: its pod keeps
/// its stdin and waits for its record when its driver is gone, so any caw-box can finish it
/// (`session::headless::adopt`), and is told so.
///
/// [`ADOPTABLE`]: crate::labelling::labels::ADOPTABLE
pub(super) fn turn_pod_labels(spec: &TurnSpec) -> HashMap<String, String> {
    let mut labels = spec.labels.clone();
    if spec.interactive.is_none() {
        labels.insert(
            crate::labelling::labels::ADOPTABLE.to_string(),
            "true".to_string(),
        );
    }
    labels
}

impl KubeBackend {
    /// Attaches to the input and output of the container `sidecar` of the running pod
    /// `name`.
    async fn attach_sidecar(&self, name: &str, sidecar: &str) -> Result<Attached> {
        // Running, or the attachment would wait for nothing.
        let pod = self.existing_pod(name).await?;
        let running = pod
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
            .iter()
            .any(|c| c.name == sidecar && c.state.as_ref().is_some_and(|s| s.running.is_some()));
        if !running {
            return Err(Error::environment(format!(
                "the container '{sidecar}' of pod '{name}' does not run"
            )));
        }
        self.attach_to(name, Some(sidecar.to_string()), true, false)
            .await
    }
}
