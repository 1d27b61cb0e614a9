//! The Kubernetes backend against a real cluster: ../shared/k8s-lab (etcd, apiserver,
//! scheduler, kubelet over its own containerd). A test loads the provider images and the stub
//! model's image into it, runs the stub as a pod (addressed by its pod IP: the lab has no DNS
//! and no kube-proxy; pods reach 10.244.7.0/24 only) and drives caw-box against it. One test
//! drives all four providers in turn.
//!
//! One lab for the whole group (there is one lab per machine; the `k8s-lab` test group of
//! .config/nextest.toml runs these tests one at a time). The first test of a run brings the
//! lab up and marks it as this run's (`LAB_DIR/caw-box-e2e-run`: the run's id and a digest of
//! the lab's CA certificate, which every fresh `up` makes anew); a later test of the same run
//! reuses it when the mark matches and the lab is healthy (every process running, API server
//! ready, node Ready); when it is not, `k8s-lab up` again starts what stopped, keeping the
//! cluster's state and images. Any other lab (a killed earlier run's, one brought up by hand)
//! or one still unhealthy is taken down and brought up again. The run's id: `CAW_BOX_K8S_LAB_RUN`
//! (scripts/test.sh sets one for its whole suite), else nextest's `NEXTEST_RUN_ID`, else the
//! test process's id (`cargo test` runs every test in one process).
//!
//! An image goes into the lab only when the lab's containerd does not hold that very image yet
//! (the config digest of its manifest there is the Docker image ID): a rebuilt tag goes in
//! again, an unchanged one is not copied twice.
//!
//! A test leaves the lab as it found it: when it ends, failed or not, it deletes every pod,
//! claim, config map and secret caw-box made (`app.kubernetes.io/managed-by=caw-box`), the
//! stub and helper pods (`io.caw-box.test=e2e`) and its other objects
//! (`app.kubernetes.io/managed-by=caw-box-e2e`); a test first clears what a killed one left.
//!
//! The lab stays up when the run ends: `make test` (scripts/test.sh) takes it down. After a
//! run by hand (`cargo nextest run --test e2e -E 'test(/^kubernetes::/)'`), take it down with
//! `../shared/k8s-lab/k8s-lab down` (or `$CAW_BOX_K8S_LAB down`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

mod admission;
mod login;
mod mcp;
mod pool;

const LAB_DIR: &str = "/tmp/k8s-lab";
const KUBECTL: &str = "/var/cache/k8s-lab/bin/kubectl";
/// The lab's own containerd (the k8s-lab script's `SOCK`), read with Debian's `ctr`.
const LAB_CONTAINERD: &str = "/run/k8s-lab/containerd.sock";
const NAMESPACE: &str = "default";
/// The mark of the run that brought the lab up, in `LAB_DIR` (see the module doc).
const MARK: &str = "caw-box-e2e-run";
/// caw-box's objects.
const CAW_OBJECTS: &str = "app.kubernetes.io/managed-by=caw-box";
/// The tests' own pods: the stubs and the claim readers.
const TEST_PODS: &str = "io.caw-box.test=e2e";
/// The tests' other objects (storage and runtime classes, roles and bindings).
const TEST_OBJECTS: &str = "app.kubernetes.io/managed-by=caw-box-e2e";

/// The lab's script: `CAW_BOX_K8S_LAB`, else `shared/k8s-lab/k8s-lab` beside the checkout
/// or beside one of its parent folders, else the machine's `/work/shared` (a CI checkout may
/// live anywhere, e.g. under /tmp).
fn lab_script() -> PathBuf {
    if let Some(p) = std::env::var_os("CAW_BOX_K8S_LAB") {
        return PathBuf::from(p);
    }
    let relative = Path::new("shared/k8s-lab/k8s-lab");
    repo_root()
        .ancestors()
        .skip(1)
        .map(|dir| dir.join(relative))
        .chain([Path::new("/work").join(relative)])
        .find(|p| p.exists())
        .unwrap_or_else(|| repo_root().join("..").join(relative))
}

/// `k8s-lab`, holding no descriptor of this process but stdio: a lab brought up by a test run
/// under `flock /tmp/caw-box-k8s.lock` (how the helpers share it) would otherwise keep the
/// lock in its daemons, which inherit the descriptor, long after the run: every other user of
/// the lab then waits forever (seen: 35 minutes).
fn lab_command() -> Command {
    let mut c = Command::new("bash");
    c.args([
        "-c",
        r#"for fd in /proc/$$/fd/*; do n=${fd##*/}; [ "$n" -gt 2 ] && eval "exec $n>&-"; done 2>/dev/null; exec "$@""#,
        "k8s-lab",
    ])
    .arg(lab_script());
    c
}

/// The id of this test run (see the module doc).
fn run_id() -> String {
    ["CAW_BOX_K8S_LAB_RUN", "NEXTEST_RUN_ID"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|v| !v.trim().is_empty())
        .unwrap_or_else(|| format!("process-{}", std::process::id()))
}

/// The mark this run writes for the lab now in `LAB_DIR`: the run's id and the digest of the
/// lab's CA certificate; None when there is no lab (no certificate).
fn mark_for_this_run() -> Option<String> {
    use sha2::Digest;
    let ca = std::fs::read(Path::new(LAB_DIR).join("pki/ca.crt")).ok()?;
    Some(format!(
        "run {}\nca sha256:{:x}\n",
        run_id(),
        sha2::Sha256::digest(&ca)
    ))
}

/// A line on the test's stderr (shown when it fails) that does not trip the print lints.
fn note(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "k8s e2e: {text}");
}

/// One test at a time per process (`cargo test` runs tests on threads; nextest's test group
/// already runs them one at a time).
static SERIAL: Mutex<()> = Mutex::new(());

/// The run's lab, for one test. When dropped (a failed assertion included) the test's
/// objects are deleted; the lab stays up for the next test.
struct Lab {
    kubeconfig: PathBuf,
    _serial: MutexGuard<'static, ()>,
}

impl Lab {
    /// The lab of this run, healthy and clear of other tests' objects: reused when this run
    /// brought it up, else (none, another run's, unhealthy) `down` then `up`.
    fn up() -> Lab {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let script = lab_script();
        assert!(
            script.exists(),
            "the lab script {} is missing (shared/k8s-lab beside the repo; or set CAW_BOX_K8S_LAB)",
            script.display()
        );
        let lab = Lab {
            kubeconfig: PathBuf::from(LAB_DIR).join("kubeconfig"),
            _serial: serial,
        };
        let mark = Path::new(LAB_DIR).join(MARK);
        let found = std::fs::read_to_string(&mark).ok();
        let why = match (&found, mark_for_this_run()) {
            (_, None) => "no lab".to_string(),
            (None, Some(_)) => "a lab this run did not bring up".to_string(),
            (Some(found), Some(ours)) if *found != ours => {
                // Another run's, or this run's id on a lab that was replaced since.
                format!("a lab marked otherwise ({})", found.replace('\n', "; "))
            }
            _ => match lab.health().or_else(|problem| lab.repair(&problem)) {
                Ok(()) => {
                    note("reusing this run's lab");
                    let left = lab.clear();
                    if !left.is_empty() {
                        note(&format!("cleared what an earlier test left: {left:?}"));
                    }
                    lab.settle();
                    return lab;
                }
                Err(e) => format!("this run's lab is unhealthy: {e}"),
            },
        };
        note(&format!("{why}: k8s-lab down, then up"));
        let _ = std::fs::remove_file(&mark);
        let _ = lab_command().args(["down", LAB_DIR]).output();
        let out = lab_command()
            .args(["up", LAB_DIR])
            .output()
            .expect("run k8s-lab up");
        assert!(
            out.status.success(),
            "k8s-lab up failed: {}\n{}",
            stdout_of(&out),
            stderr_of(&out)
        );
        let ours = mark_for_this_run().expect("the lab's CA certificate after up");
        std::fs::write(&mark, ours).expect("write the lab's mark");
        lab
    }

    /// `k8s-lab up` again on this run's lab that has a `problem`: it starts what is not
    /// running (the lab's claim provisioner has been seen to end mid-run) and keeps the
    /// cluster's state and images. Ok when the lab is healthy after it.
    fn repair(&self, problem: &str) -> Result<(), String> {
        note(&format!("this run's lab: {problem}: k8s-lab up again"));
        let out = lab_command()
            .args(["up", LAB_DIR])
            .output()
            .map_err(|e| format!("{problem}; k8s-lab up: {e}"))?;
        if !out.status.success() {
            return Err(format!("{problem}; k8s-lab up: {}", stderr_of(&out).trim()));
        }
        self.health()
            .map_err(|e| format!("{problem}; after k8s-lab up: {e}"))
    }

    /// Ok when every process of the lab runs, the API server is ready and the node Ready.
    fn health(&self) -> Result<(), String> {
        let status = lab_command()
            .args(["status", LAB_DIR])
            .output()
            .map_err(|e| format!("k8s-lab status: {e}"))?;
        let status = stdout_of(&status);
        for process in [
            "etcd",
            "containerd",
            "apiserver",
            "controller-manager",
            "scheduler",
            "kubelet",
            "provisioner",
        ] {
            if !status.contains(&format!("{process}: running")) {
                return Err(format!("{process} is not running"));
            }
        }
        let ask = |args: &[&str]| -> Result<String, String> {
            let out = Command::new(KUBECTL)
                .env("KUBECONFIG", &self.kubeconfig)
                .arg("--request-timeout=10s")
                .args(args)
                .output()
                .map_err(|e| format!("kubectl: {e}"))?;
            if out.status.success() {
                Ok(stdout_of(&out))
            } else {
                Err(format!("kubectl {args:?}: {}", stderr_of(&out).trim()))
            }
        };
        ask(&["get", "--raw", "/readyz"])?;
        let ready = ask(&[
            "get",
            "node",
            "localhost",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
        ])?;
        if ready.trim() != "True" {
            return Err(format!("the node is not Ready ({ready:?})"));
        }
        Ok(())
    }

    /// kubectl that neither panics nor waits on an API server that does not answer: for
    /// the clearing that runs when a test ends, a failed one included.
    fn kubectl_quiet(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(KUBECTL)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(["-n", NAMESPACE, "--request-timeout=30s"])
            .args(args)
            .output()
            .map_err(|e| format!("kubectl {args:?}: {e}"))?;
        if out.status.success() {
            Ok(stdout_of(&out))
        } else {
            Err(format!("kubectl {args:?}: {}", stderr_of(&out).trim()))
        }
    }

    /// The tests' objects and caw-box's in the lab (`kind/name`).
    fn test_objects(&self) -> Result<Vec<String>, String> {
        let mut found = Vec::new();
        for (kinds, selector) in [
            ("pod,pvc,configmap,secret,lease", CAW_OBJECTS),
            ("pod", TEST_PODS),
            ("storageclass,runtimeclass,role,rolebinding", TEST_OBJECTS),
        ] {
            let names = self.kubectl_quiet(&["get", kinds, "-l", selector, "-o", "name"])?;
            found.extend(names.lines().map(str::to_string));
        }
        Ok(found)
    }

    /// Deletes the tests' objects and caw-box's; what there was. Pods first, and waited for:
    /// a claim goes only once no pod refers to it (the lab's pvc-protection finalizer). Never
    /// panics: it runs when a test ends, a failed one included.
    /// Waits until the lab's claim provisioner has caught up with earlier tests' deletions
    /// (no released volume left): it deletes them one by one, once a second, before it
    /// provisions new claims, so after a test that removed dozens of sessions a new claim
    /// waited past caw-box's 30 s bind limit (seen once in CI). Not a fixed sleep: it polls
    /// the lab's state, and returns at once when there is nothing to wait for.
    fn settle(&self) {
        let started = std::time::Instant::now();
        let released = || {
            self.kubectl_quiet(&[
                "get",
                "pv",
                "-l",
                "k8s-lab/provisioned=true",
                "-o",
                "jsonpath={range .items[?(@.status.phase==\"Released\")]}{.metadata.name}{\"\\n\"}{end}",
            ])
            .map(|names| names.lines().filter(|l| !l.trim().is_empty()).count())
            .unwrap_or(0)
        };
        let first = released();
        if first > 0 {
            while started.elapsed() < Duration::from_secs(180) && released() > 0 {
                std::thread::sleep(Duration::from_millis(500));
            }
            note(&format!(
                "waited {:.0?} for the lab's provisioner to remove {first} released volumes",
                started.elapsed()
            ));
        }
        self.binds_claims();
    }

    /// Waits until a claim binds in the lab again: after the cluster-restart test, a new
    /// claim of the next test once stayed `Pending` past caw-box's 30 s bind limit (CI on
    /// f514889), the lab's processes all running. A probe claim, bound (about a second when
    /// all is well), then deleted; said when it took longer.
    fn binds_claims(&self) {
        let started = std::time::Instant::now();
        let probe = "caw-box-e2e-bind-probe";
        let claim = serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": probe, "labels": {"app.kubernetes.io/managed-by": "caw-box-e2e"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "standard",
                "resources": {"requests": {"storage": "1Mi"}}
            }
        });
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), claim.to_string()).unwrap();
        if let Err(e) = self.kubectl_quiet(&["apply", "-f", &file.path().to_string_lossy()]) {
            note(&format!("cannot make the bind probe: {e}"));
            return;
        }
        let bound = || {
            self.kubectl_quiet(&["get", "pvc", probe, "-o", "jsonpath={.status.phase}"])
                .is_ok_and(|phase| phase.trim() == "Bound")
        };
        while started.elapsed() < Duration::from_secs(120) && !bound() {
            std::thread::sleep(Duration::from_millis(250));
        }
        let _ = self.kubectl_quiet(&["delete", "pvc", probe, "--wait=false"]);
        if started.elapsed() > Duration::from_secs(3) {
            note(&format!(
                "waited {:.0?} for a claim to bind in the lab",
                started.elapsed()
            ));
        }
    }

    fn clear(&self) -> Vec<String> {
        let found = match self.test_objects() {
            Ok(found) => found,
            Err(e) => {
                note(&format!("cannot list the tests' objects: {e}"));
                return Vec::new();
            }
        };
        if found.is_empty() {
            return found;
        }
        for (kinds, selector) in [
            ("pod", CAW_OBJECTS),
            ("pod", TEST_PODS),
            ("pvc,configmap,secret,lease", CAW_OBJECTS),
            ("storageclass,runtimeclass,role,rolebinding", TEST_OBJECTS),
        ] {
            let mut args = vec!["delete", kinds, "-l", selector, "--ignore-not-found"];
            args.extend(["--wait=true", "--timeout=120s"]);
            if kinds == "pod" {
                // A turn's CLI need not stop on SIGTERM: the kubelet kills it after 1 s.
                args.push("--grace-period=1");
            }
            if let Err(e) = self.kubectl_quiet(&args) {
                note(&format!("deleting {kinds} {selector}: {e}"));
            }
        }
        found
    }

    /// Loads `images` from the Docker daemon into the lab, each unless the lab already holds
    /// that very image.
    fn load_images(&self, images: &[&str]) {
        let missing: Vec<&str> = images.iter().copied().filter(|i| !lab_holds(i)).collect();
        if missing.is_empty() {
            note(&format!("the lab holds {images:?} already"));
            return;
        }
        for image in missing {
            note(&format!("loading {image}"));
            // A second try: one `docker save | ctr import` here failed once with a blob of its
            // own import not found, and the next load of the same image went through.
            let load = || {
                lab_command()
                    .args(["load-image", image])
                    .output()
                    .expect("run k8s-lab load-image")
            };
            let mut out = load();
            if !out.status.success() {
                note(&format!(
                    "k8s-lab load-image {image}: {}",
                    stderr_of(&out).trim()
                ));
                out = load();
            }
            assert!(
                out.status.success(),
                "k8s-lab load-image {image} failed: {}",
                stderr_of(&out)
            );
            assert!(
                lab_holds(image),
                "{image}: loaded, yet the lab's containerd does not hold Docker's image"
            );
        }
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(KUBECTL)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(["-n", NAMESPACE])
            .args(args)
            .output()
            .expect("run kubectl")
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            stderr_of(&out)
        );
        stdout_of(&out)
    }

    /// Runs the stub model as a pod; its base URL (by pod IP).
    fn start_stub(&self) -> String {
        self.start_stub_named("stub-model")
    }

    /// [`Self::start_stub`] as pod `name` (a second stub: a host not in a list).
    fn start_stub_named(&self, name: &str) -> String {
        self.start_stub_with(
            name,
            serde_json::json!([{"name": "STUB_EXPECT_KEY", "value": TEST_KEY}]),
        )
    }

    /// [`Self::start_stub`] as pod `name` with `env` (the container's `env` list).
    fn start_stub_with(&self, name: &str, env: Value) -> String {
        self.start_stub_with_spec(name, env, serde_json::json!({}))
    }

    /// [`Self::start_stub_with`], with `more` merged into the pod's spec (a
    /// `securityContext` that lets it listen on 443).
    fn start_stub_with_spec(&self, name: &str, env: Value, more: Value) -> String {
        let mut pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "caw-box-e2e", "io.caw-box.test": "e2e"}
            },
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": false,
                "containers": [{
                    "name": "stub",
                    "image": stub_image(),
                    "imagePullPolicy": "Never",
                    "env": env
                }]
            }
        });
        if let (Some(spec), Some(more)) = (pod["spec"].as_object_mut(), more.as_object()) {
            spec.extend(more.clone());
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), pod.to_string()).unwrap();
        self.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let out = self.kubectl(&["get", "pod", name, "-o", "json"]);
            if out.status.success() {
                let pod: Value = serde_json::from_slice(&out.stdout).unwrap();
                let ip = pod["status"]["podIP"].as_str().unwrap_or("");
                let running = pod["status"]["phase"] == "Running";
                if running && !ip.is_empty() {
                    let url = format!("http://{ip}:8080");
                    // The host reaches the pod network: wait for the stub to listen.
                    if std::net::TcpStream::connect_timeout(
                        &format!("{ip}:8080").parse().unwrap(),
                        Duration::from_secs(1),
                    )
                    .is_ok()
                    {
                        return url;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "the stub pod did not run: {}",
                stdout_of(&self.kubectl(&["describe", "pod", name]))
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.clear();
        match self.test_objects() {
            Ok(left) if left.is_empty() => {}
            Ok(left) => note(&format!("left in the lab after clearing: {left:?}")),
            Err(e) => note(&format!("cannot list the tests' objects: {e}")),
        }
    }
}

/// Waits until a request holds on `HOLD:<name>` at the stub pod at `endpoint` (the host
/// reaches it by its IP): the turn's CLI is mid-request (its runtime files read, its key with
/// the broker, its request through any proxy).
fn wait_held(endpoint: &str, name: &str) {
    StubControl::Http(endpoint.to_string()).wait_held(name, 1, HELD_WITHIN);
}

/// Releases `HOLD:<name>` at the stub pod at `endpoint`: the held turn gets its answer.
fn release(endpoint: &str, name: &str) {
    StubControl::Http(endpoint.to_string()).release(name);
}

/// `image` as containerd names it (Docker's normalisation: `docker.io/`, `library/`,
/// `:latest`).
fn containerd_name(image: &str) -> String {
    let (first, _) = image.split_once('/').unwrap_or(("", image));
    let mut name = if first.contains(['.', ':']) || first == "localhost" {
        image.to_string()
    } else if first.is_empty() {
        format!("docker.io/library/{image}")
    } else {
        format!("docker.io/{image}")
    };
    let last = name.rsplit('/').next().unwrap_or("");
    if !last.contains([':', '@']) {
        name.push_str(":latest");
    }
    name
}

/// Whether the lab's containerd holds `image` as the Docker daemon has it: the config digest
/// of the manifest it holds under that name is the Docker image ID.
fn lab_holds(image: &str) -> bool {
    let docker = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .output()
        .expect("run docker image inspect");
    assert!(
        docker.status.success(),
        "{image} is not in the Docker daemon: {}",
        stderr_of(&docker)
    );
    let id = stdout_of(&docker).trim().to_string();
    lab_image_config(image).is_some_and(|config| config == id)
}

/// The config digest of the image the lab's containerd holds under `image`'s name.
fn lab_image_config(image: &str) -> Option<String> {
    let ctr = |args: &[&str]| -> Option<Vec<u8>> {
        let out = Command::new("ctr")
            .args(["--address", LAB_CONTAINERD, "-n", "k8s.io"])
            .args(args)
            .output()
            .ok()?;
        out.status.success().then_some(out.stdout)
    };
    let name = containerd_name(image);
    // REF TYPE DIGEST SIZE PLATFORMS LABELS
    let list = String::from_utf8(ctr(&["images", "ls"])?).ok()?;
    let mut digest = list
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&name.as_str()))?
        .get(2)?
        .to_string();
    // A manifest names its config; an index, the manifest of each platform.
    for _ in 0..2 {
        let blob: Value = serde_json::from_slice(&ctr(&["content", "get", &digest])?).ok()?;
        if let Some(config) = blob["config"]["digest"].as_str() {
            return Some(config.to_string());
        }
        let manifests = blob["manifests"].as_array()?;
        let linux_amd64 = manifests
            .iter()
            .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == "amd64");
        digest = linux_amd64.or(manifests.first())?["digest"]
            .as_str()?
            .to_string();
    }
    None
}

fn caw_k8s(rig_data: &std::path::Path, workspace: &std::path::Path, lab: &Lab) -> Command {
    let mut c = caw_lab_env(rig_data, workspace, lab);
    c.args(["--backend", "kubernetes", "--namespace", NAMESPACE]);
    c
}

/// `caw-box` with the lab's kubeconfig and nothing else: no backend or namespace flag or
/// variable, a fresh HOME (under `rig_data`) and data directory. What a handle alone must do.
fn caw_handle_only(rig_data: &std::path::Path, workspace: &std::path::Path, lab: &Lab) -> Command {
    let mut c = caw_lab_env(rig_data, workspace, lab);
    let home = rig_data.join("home");
    std::fs::create_dir_all(&home).unwrap();
    c.env("HOME", home).env_remove("CAW_BOX_KUBE_CONTEXT");
    c
}

fn caw_lab_env(rig_data: &std::path::Path, workspace: &std::path::Path, lab: &Lab) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_caw-box"));
    c.env("CAW_BOX_DATA_DIR", rig_data)
        .env("KUBECONFIG", &lab.kubeconfig)
        .env("CAW_BOX_CONFIG", rig_data.join("no-user-config.toml"))
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CAW_BOX_BACKEND")
        .env_remove("CAW_BOX_NAMESPACE")
        .env_remove("CAW_BOX_IMAGE_REPO")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("GEMINI_API_KEY")
        .current_dir(workspace)
        .stdin(std::process::Stdio::null());
    c
}

/// The names of a pod's `containers` or `initContainers` (none: empty), from its JSON.
fn container_names(pod: &Value, key: &str) -> Vec<String> {
    pod["spec"][key]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_str(stdout_of(out).trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON object ({e}):\nstdout: {}\nstderr: {}",
            stdout_of(out),
            stderr_of(out)
        )
    })
}

impl Lab {
    /// `k8s-lab restart`: every process of the cluster stopped and started, state kept.
    fn restart(&self) {
        let out = lab_command()
            .args(["restart", LAB_DIR])
            .output()
            .expect("run k8s-lab restart");
        assert!(
            out.status.success(),
            "k8s-lab restart failed: {}",
            stderr_of(&out)
        );
    }

    /// The stub again after a restart (its pod did not survive the node's): a new IP.
    fn restart_stub(&self) -> String {
        let _ = self.kubectl(&[
            "delete",
            "pod",
            "stub-model",
            "--grace-period=0",
            "--force",
            "--wait=true",
        ]);
        self.start_stub()
    }

    /// caw-box's objects left in the namespace (`kind/name`), the stub's excluded.
    fn caw_objects(&self) -> Vec<String> {
        self.kubectl_ok(&[
            "get",
            "pod,pvc,configmap,secret",
            "-l",
            "app.kubernetes.io/managed-by=caw-box",
            "-o",
            "name",
        ])
        .lines()
        .map(str::to_string)
        .collect()
    }
}

/// `caw-box <command...> --env KEY=... -o json` for `p` on the lab.
fn turn_cmd(
    p: P,
    data: &std::path::Path,
    workspace: &std::path::Path,
    lab: &Lab,
    command: &[&str],
) -> Command {
    let mut c = caw_k8s(data, workspace, lab);
    c.args(command)
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .args(["-o", "json"]);
    c
}

/// What a codex session's tests on the cluster start from: the lab with the codex image and
/// a stub model (its endpoint), a workspace with a file in it, and a data directory.
fn codex_on_the_lab() -> (Lab, String, tempfile::TempDir, tempfile::TempDir) {
    check("lab up");
    let lab = Lab::up();
    check("load images");
    lab.load_images(&["caw-box/codex:latest", &stub_image()]);
    let endpoint = lab.start_stub();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("README.md"), "a workspace\n").unwrap();
    let data = tempfile::tempdir().unwrap();
    (lab, endpoint, workspace, data)
}

#[test]
fn kubernetes_run_and_resume_from_the_handle_alone_after_a_cluster_restart() {
    check("lab up");
    let lab = Lab::up();
    check("load images");
    lab.load_images(&[
        "caw-box/claude-code:latest",
        "caw-box/codex:latest",
        "caw-box/opencode:latest",
        "caw-box/gemini:latest",
        &stub_image(),
    ]);
    check("stub pod");
    let endpoint = lab.start_stub();

    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("README.md"), "a workspace\n").unwrap();

    // Turn 1 of a session per provider.
    let mut sessions = Vec::new();
    for p in ALL {
        check(&format!("{}: run", p.name));
        let data = tempfile::tempdir().unwrap();
        let mut run = turn_cmd(
            p,
            data.path(),
            workspace.path(),
            &lab,
            &["run", "--provider", p.name, "--endpoint", &endpoint],
        );
        if let Some(m) = p.model {
            run.args(["--model", m]);
        }
        run.arg(format!("Please REMEMBER:quince-{} for later.", p.name));
        let out = crate::common::run(run);
        let first = json_of(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: turn 1 failed: {first}\n{}",
            p.name,
            stderr_of(&out)
        );
        assert!(
            first["result"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("Noted: quince-{}", p.name)),
            "{first}"
        );
        let id = first["session_id"].as_str().unwrap().to_string();
        let handle = first["resume_handle"].as_str().unwrap().to_string();
        let h: Value = serde_json::from_str(&handle).unwrap();
        assert_eq!(h["version"], 2, "{handle}");
        assert_eq!(h["backend"], "kubernetes", "{handle}");
        assert_eq!(h["namespace"], NAMESPACE, "{handle}");
        // The state lives in a claim, and no turn pod is left.
        let objects = lab.caw_objects();
        assert!(
            objects.contains(&format!("persistentvolumeclaim/caw-box-{id}")),
            "no state claim: {objects:?}"
        );
        assert!(
            !objects.iter().any(|o| o.starts_with("pod/")),
            "a turn pod was left behind: {objects:?}"
        );
        // Seeded with the image's HOME once: later turns' pods go without seed-home (turn 2
        // then still finds the image's config, e.g. codex's, in HOME).
        let seeded = lab.kubectl_ok(&[
            "get",
            "pvc",
            &format!("caw-box-{id}"),
            "-o",
            "jsonpath={.metadata.annotations.io\\.caw-box\\.home-seeded}",
        ]);
        assert_eq!(
            seeded, "true",
            "{}: the state claim is not noted as seeded",
            p.name
        );
        sessions.push((p, id, handle));
        // The host's caw-box data directory goes with `data`.
    }

    check("k8s-lab restart");
    lab.restart();
    let endpoint = lab.restart_stub();

    for (p, _, handle) in &sessions {
        // A fresh data directory and HOME, no --backend or --namespace: the handle alone
        // resumes (it names its backend and namespace), and the CLI recalls turn 1.
        check(&format!("{}: resume from the handle", p.name));
        let data = tempfile::tempdir().unwrap();
        // The stub's pod has a new address after the restart.
        let mut resume = caw_handle_only(data.path(), workspace.path(), &lab);
        resume
            .args(["resume", handle, "--endpoint", &endpoint])
            .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
            .args(["-o", "json", "RECALL"]);
        let out = crate::common::run(resume);
        let second = json_of(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: turn 2 failed: {second}\n{}",
            p.name,
            stderr_of(&out)
        );
        assert_eq!(second["turn"], 2, "{second}");
        assert!(
            second["result"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("You told me to remember quince-{}", p.name)),
            "{}: the CLI did not get turn 1's history: {second}",
            p.name
        );

        check(&format!(
            "{}: --backend docker contradicts the handle",
            p.name
        ));
        let mut docker = Command::new(env!("CARGO_BIN_EXE_caw-box"));
        docker
            .env("CAW_BOX_DATA_DIR", data.path())
            .env_remove("CAW_BOX_BACKEND")
            .args(["--backend", "docker", "show", handle]);
        let out = crate::common::run(docker);
        assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
        assert!(
            stderr_of(&out).contains("on the kubernetes backend, not docker"),
            "{}",
            stderr_of(&out)
        );
    }

    // One session goes on from its handle alone: a detached turn, `wait` and `show` each
    // from a fresh HOME and data directory; a --namespace that contradicts the handle is
    // refused, saying both.
    let (p, _, handle) = sessions.iter().find(|(p, _, _)| p.name == "codex").unwrap();
    check("detached resume, wait and show from the handle alone");
    let data = tempfile::tempdir().unwrap();
    let mut detached = caw_handle_only(data.path(), workspace.path(), &lab);
    detached
        .args(["resume", handle, "--detach", "--endpoint", &endpoint])
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .arg("RECALL");
    let out = crate::common::run(detached);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let data = tempfile::tempdir().unwrap();
    let mut wait = caw_handle_only(data.path(), workspace.path(), &lab);
    wait.args(["wait", handle, "-o", "json"]);
    let out = crate::common::run(wait);
    let waited = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{waited}\n{}", stderr_of(&out));
    assert_eq!(waited["turn"], 3, "{waited}");
    assert!(
        result_text(&waited).contains("You told me to remember quince-codex"),
        "{waited}"
    );
    let data = tempfile::tempdir().unwrap();
    let mut show = caw_handle_only(data.path(), workspace.path(), &lab);
    show.args(["show", handle, "--json"]);
    let out = crate::common::run(show);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("quince-codex"),
        "{}",
        stdout_of(&out)
    );
    let mut other_ns = caw_handle_only(data.path(), workspace.path(), &lab);
    other_ns.args(["--namespace", "elsewhere", "show", handle]);
    let out = crate::common::run(other_ns);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("in namespace 'default', not 'elsewhere'"),
        "{}",
        stderr_of(&out)
    );

    // Issue 53 on a cluster: a checkpoint claim per turn; a fork at turn 1 recalls turn 1's
    // word and not turn 4's, made and run in the cluster.
    check("fork --at 1");
    let data = tempfile::tempdir().unwrap();
    let mut fourth = caw_handle_only(data.path(), workspace.path(), &lab);
    fourth
        .args(["resume", handle, "--endpoint", &endpoint])
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .args(["-o", "json", "REMEMBER:plum-codex"]);
    let out = crate::common::run(fourth);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let mut fork = caw_handle_only(data.path(), workspace.path(), &lab);
    fork.args(["fork", handle, "--at", "1", "--endpoint", &endpoint])
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .args(["-o", "json", "RECALL"]);
    let out = crate::common::run(fork);
    let forks = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{forks}\n{}", stderr_of(&out));
    let forked = &forks["sessions"][0];
    let answer = forked["result"]["result"].as_str().unwrap_or_default();
    assert!(answer.contains("remember quince-codex"), "{forks}");
    assert!(!answer.contains("plum"), "{forks}");
    assert_eq!(forked["result"]["turn"], 2, "{forks}");
    let fork_id = forked["session_id"].as_str().unwrap().to_string();
    let claims = lab.caw_objects();
    let codex_id = &sessions
        .iter()
        .find(|(p, _, _)| p.name == "codex")
        .unwrap()
        .1;
    for turn in 1..=4 {
        let claim = format!("persistentvolumeclaim/caw-box-{codex_id}-checkpoint-{turn}");
        assert!(claims.contains(&claim), "no {claim}: {claims:?}");
    }
    // The latest turn: the lab's StorageClass has no CSI snapshot class, which the fork
    // finds, and it copies the checkpoints through a pod as above.
    let mut latest = caw_handle_only(data.path(), workspace.path(), &lab);
    latest.args(["fork", handle, "-o", "json"]);
    let out = crate::common::run(latest);
    let made = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{made}\n{}", stderr_of(&out));
    assert_eq!(made["sessions"][0]["forked_from"]["turn"], 4, "{made}");
    let latest_id = made["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();

    check("ls from the API server");
    let data = tempfile::tempdir().unwrap();
    let mut ls = caw_k8s(data.path(), workspace.path(), &lab);
    ls.args(["ls", "--json"]);
    let out = crate::common::run(ls);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let listed: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    for (p, id, _) in &sessions {
        let row = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["session_id"] == id.as_str())
            .unwrap_or_else(|| panic!("{id} not listed: {listed}"));
        assert_eq!(row["provider"], p.name, "{row}");
        let turns = if p.name == "codex" { 4 } else { 2 };
        assert_eq!(row["turns"], turns, "{row}");
    }

    check("bind refused");
    let mut bind = caw_k8s(data.path(), workspace.path(), &lab);
    bind.args(["run", "--provider", "codex", "--workspace-mode", "bind"])
        .args(["--endpoint", &endpoint, "hello"]);
    let out = crate::common::run(bind);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("--workspace-mode bind is not available"),
        "{}",
        stderr_of(&out)
    );

    check("no secret in the cluster's objects");
    let everything = lab.kubectl_ok(&["get", "pod,secret,configmap,pvc,event", "-o", "yaml"]);
    let stub = lab.kubectl_ok(&["get", "pod", "stub-model", "-o", "yaml"]);
    // The stub's own pod carries the key it expects (test scaffolding, not caw-box's).
    assert_eq!(
        everything.matches(TEST_KEY).count(),
        stub.matches(TEST_KEY).count(),
        "a caw-box object or event holds the key"
    );

    check("rm");
    let mut ids: Vec<&str> = sessions.iter().map(|(_, id, _)| id.as_str()).collect();
    ids.extend([fork_id.as_str(), latest_id.as_str()]);
    lab.rm(data.path(), workspace.path(), &ids, Duration::from_secs(60));
    drop(lab);
}

impl Lab {
    /// `caw-box rm ids` from data directory `data`; then waits up to `within` until none of
    /// caw-box's objects is left in the namespace.
    fn rm(
        &self,
        data: &std::path::Path,
        workspace: &std::path::Path,
        ids: &[&str],
        within: Duration,
    ) {
        let mut rm = caw_k8s(data, workspace, self);
        rm.arg("rm").args(ids);
        let out = crate::common::run(rm);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let deadline = Instant::now() + within;
        loop {
            let left = self.caw_objects();
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "rm left {left:?}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The annotation caw-box keeps a label in, on session `id`'s turn pod.
    fn turn_pod_annotation(&self, id: &str, key: &str) -> String {
        let path = format!("{{.metadata.annotations.{}}}", key.replace('.', "\\."));
        self.kubectl_ok(&[
            "get",
            "pod",
            &format!("caw-box-{id}"),
            "-o",
            &format!("jsonpath={path}"),
        ])
    }
}

/// `caw-box` for the lab from a fresh process with a fresh data directory: only the
/// kubeconfig (and the id) to go on.
fn fresh(lab: &Lab, workspace: &std::path::Path, args: &[&str]) -> (Output, tempfile::TempDir) {
    let data = tempfile::tempdir().unwrap();
    let mut c = caw_k8s(data.path(), workspace, lab);
    c.args(args);
    (crate::common::run(c), data)
}

fn result_text(v: &Value) -> String {
    v["result"].as_str().unwrap_or("").to_string()
}

#[test]
fn kubernetes_detached_turns_outlive_their_driver_race_and_scale() {
    const P: P = CODEX;
    let (lab, endpoint, workspace, data) = codex_on_the_lab();
    let detached_run = |prompt: &str| {
        let mut run = turn_cmd(
            P,
            data.path(),
            workspace.path(),
            &lab,
            &["run", "-d", "--provider", P.name, "--endpoint", &endpoint],
        );
        run.args(["--model", P.model.unwrap()]).arg(prompt);
        run
    };
    let resume = |id: &str, prompt: &str, detach: bool| {
        let mut c = turn_cmd(
            P,
            data.path(),
            workspace.path(),
            &lab,
            &["resume", id, "--endpoint", &endpoint],
        );
        if detach {
            c.arg("-d");
        }
        c.arg(prompt);
        c
    };

    check("run -d, then logs -f and wait from fresh processes");
    let started = Instant::now();
    let out = crate::common::run(detached_run("SLEEP:4 REMEMBER:fig"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let id = json_of(&out)["session_id"].as_str().unwrap().to_string();
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "run -d took {:?}",
        started.elapsed()
    );
    let (logs, _d) = fresh(&lab, workspace.path(), &["logs", &id, "-f"]);
    assert_eq!(logs.status.code(), Some(0), "{}", stderr_of(&logs));
    assert!(
        stdout_of(&logs).contains("Noted: fig"),
        "logs -f: {}",
        stdout_of(&logs)
    );
    let (waited, _d) = fresh(&lab, workspace.path(), &["wait", &id, "-o", "json"]);
    assert_eq!(waited.status.code(), Some(0), "{}", stderr_of(&waited));
    let w = json_of(&waited);
    assert_eq!(w["turn"], 1, "{w}");
    assert!(result_text(&w).contains("Noted: fig"), "{w}");

    check("resume -d, the driver SIGKILLed: the turn goes on and wait records it");
    let out = crate::common::run(resume(&id, "HOLD:plum REMEMBER:plum", true));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    // Past the driver's first moment, when it feeds the pod its runtime files (a driver
    // killed before that leaves a pod that waits for them: see docs/kubernetes.md, "Not yet"): the CLI's
    // request is at the stub, which holds it until the driver is gone.
    wait_held(&endpoint, "plum");
    let pid = lab.turn_pod_annotation(&id, "io.caw-box.driver-pid");
    let pid: i32 = pid
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no driver pid: {pid:?}"));
    let killed = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -KILL {pid}");
    release(&endpoint, "plum");
    let (waited, _d) = fresh(&lab, workspace.path(), &["wait", &id, "-o", "json"]);
    assert_eq!(
        waited.status.code(),
        Some(0),
        "{}\n{}",
        stdout_of(&waited),
        stderr_of(&waited)
    );
    let w = json_of(&waited);
    assert_eq!(w["turn"], 2, "{w}");
    assert!(result_text(&w).contains("Noted: plum"), "{w}");
    // Its egress, read by the wait that recorded it from the pod's proxy sidecar's log.
    let stub_ip = endpoint
        .trim_start_matches("http://")
        .split(':')
        .next()
        .unwrap();
    assert!(
        w["egress"]["allowed"]
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["host"] == stub_ip)),
        "{w}"
    );
    assert!(
        !lab.caw_objects().iter().any(|o| o.starts_with("pod/")),
        "a pod was left: {:?}",
        lab.caw_objects()
    );

    check("stop from a fresh process: wait says 130, the session recalls");
    let out = crate::common::run(resume(&id, "SLEEP:120 REMEMBER:never", true));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let (stopped, _d) = fresh(&lab, workspace.path(), &["stop", &id]);
    assert_eq!(stopped.status.code(), Some(0), "{}", stderr_of(&stopped));
    let (waited, _d) = fresh(&lab, workspace.path(), &["wait", &id, "-o", "json"]);
    assert_eq!(
        waited.status.code(),
        Some(130),
        "{}\n{}",
        stdout_of(&waited),
        stderr_of(&waited)
    );
    assert_eq!(json_of(&waited)["status"], "interrupted");
    let out = crate::common::run(resume(&id, "RECALL", false));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let r = json_of(&out);
    assert_eq!(r["turn"], 4, "{r}");
    // The vendor conversation goes on: plum, or the stopped turn's word when its request
    // reached the model before the stop (the CLI keeps the prompt it sent).
    let recalled = result_text(&r);
    assert!(
        recalled.contains("You told me to remember plum")
            || recalled.contains("You told me to remember never"),
        "{r}"
    );

    check("two racing resumes: one runs, one is busy");
    let spawn = |c: &mut Command| {
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let a = spawn(&mut resume(&id, "SLEEP:3 REMEMBER:pear", false));
    let b = spawn(&mut resume(&id, "SLEEP:3 REMEMBER:pear", false));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let mut codes = [a.status.code(), b.status.code()];
    codes.sort();
    assert_eq!(
        codes,
        [Some(0), Some(2)],
        "a: {}\nb: {}",
        stderr_of(&a),
        stderr_of(&b)
    );
    let loser = if a.status.code() == Some(2) { &a } else { &b };
    assert!(stderr_of(loser).contains("is busy"), "{}", stderr_of(loser));

    // Before the removals and the many sessions below, while the lab's volumes are calm.
    let across = admission::one_accounts_turns_across_hosts(&lab, &endpoint, workspace.path());

    check("16 detached turns of 16 sessions at once");
    const N: usize = 16;
    let children: Vec<_> = (0..N)
        .map(|i| spawn(&mut detached_run(&format!("SLEEP:2 REMEMBER:many-{i}"))))
        .collect();
    let mut ids = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{i}: {}", stderr_of(&out));
        ids.push(json_of(&out)["session_id"].as_str().unwrap().to_string());
    }
    let (ls, _d) = fresh(&lab, workspace.path(), &["ls", "--json"]);
    assert_eq!(ls.status.code(), Some(0), "{}", stderr_of(&ls));
    let listed: Value = serde_json::from_str(stdout_of(&ls).trim()).unwrap();
    for id in &ids {
        assert!(
            listed
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["session_id"] == id.as_str()),
            "{id} not listed: {listed}"
        );
    }
    let waits: Vec<_> = ids
        .iter()
        .map(|id| {
            let mut c = caw_k8s(data.path(), workspace.path(), &lab);
            c.args(["wait", id, "-o", "json"]);
            spawn(&mut c)
        })
        .collect();
    for (i, child) in waits.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{i}: {}", stderr_of(&out));
        let w = json_of(&out);
        assert!(
            result_text(&w).contains(&format!("Noted: many-{i}")),
            "{i}: {w}"
        );
    }

    check("errors: one line, exit 3, the session kept");
    let config = std::fs::read_to_string(&lab.kubeconfig).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let variant = |file: &str, text: String| {
        let path = dir.path().join(file);
        std::fs::write(&path, text).unwrap();
        let mut c = caw_k8s(data.path(), workspace.path(), &lab);
        c.env("KUBECONFIG", path).args(["show", &id]);
        crate::common::run(c)
    };
    let unreachable = variant(
        "unreachable",
        config.replace("https://127.0.0.1:16443", "https://127.0.0.1:1"),
    );
    // RBAC: the admin acting as a user with no rights.
    let forbidden = variant(
        "forbidden",
        config.replace("user: {", "user: {as: caw-box-e2e-nobody, "),
    );
    let mut absent = resume(&id, "hello", false);
    absent
        .args(["--image", "caw-box/absent:latest"])
        .env("CAW_BOX_IMAGE_PULL_POLICY", "Never");
    let absent = crate::common::run(absent);
    for (what, out, words) in [
        (
            "unreachable",
            &unreachable,
            "cannot reach the Kubernetes API server",
        ),
        ("forbidden", &forbidden, "forbidden"),
        ("image missing", &absent, "caw-box/absent:latest"),
    ] {
        assert_eq!(out.status.code(), Some(3), "{what}: {}", stderr_of(out));
        let first = stderr_of(out);
        let first = first.lines().next().unwrap_or("");
        assert!(
            first.starts_with("caw-box: error: ") && first.contains(words),
            "{what}: {}",
            stderr_of(out)
        );
    }
    let (shown, _d) = fresh(&lab, workspace.path(), &["show", &id]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr_of(&shown));
    assert!(
        !lab.caw_objects().iter().any(|o| o.starts_with("pod/")),
        "a pod was left: {:?}",
        lab.caw_objects()
    );

    check("rm");
    across.remove(&lab, workspace.path());
    let mut all = vec![id.as_str()];
    all.extend(ids.iter().map(String::as_str));
    lab.rm(
        data.path(),
        workspace.path(),
        &all,
        Duration::from_secs(120),
    );
    drop(lab);
}

/// The one `caw-box: error:` line of a failed command's stderr (with `-q`, nothing else).
fn error_line(out: &Output) -> String {
    let stderr = stderr_of(out);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("caw-box: error: "))
        .collect();
    assert_eq!(errors.len(), 1, "not one error line: {stderr}");
    errors[0].to_string()
}

#[test]
fn kubernetes_environment_failures_are_one_line_and_keep_the_session() {
    const P: P = CODEX;
    let (lab, endpoint, workspace, data) = codex_on_the_lab();
    let run = |extra: &[&str], prompt: &str| {
        let mut c = turn_cmd(
            P,
            data.path(),
            workspace.path(),
            &lab,
            &["-q", "run", "--provider", P.name, "--endpoint", &endpoint],
        );
        c.args(["--model", P.model.unwrap()])
            .args(extra)
            .arg(prompt);
        c
    };
    let resume = |id: &str, extra: &[&str], prompt: &str| {
        let mut c = turn_cmd(
            P,
            data.path(),
            workspace.path(),
            &lab,
            &["-q", "resume", id, "--endpoint", &endpoint],
        );
        c.args(extra).arg(prompt);
        c
    };
    let session_of = |out: &Output| {
        let line = error_line(out);
        let start = line.find("session ").expect("a session id") + "session ".len();
        line[start..start + 36].to_string()
    };

    check("OOM-killed: one line naming it, exit 3; resumed with more memory, it recalls");
    let out = crate::common::run(run(
        &["--memory", "128m"],
        "REMEMBER:plum RUN:head -c 600m /dev/zero | tail",
    ));
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    let line = error_line(&out);
    assert!(
        line.contains("OOM-killed") && line.contains("128Mi (--memory)"),
        "{line}"
    );
    let id = session_of(&out);
    assert_eq!(json_of(&out)["exit_code"], 3);
    let out = crate::common::run(resume(&id, &["--memory", "1g"], "RECALL"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        result_text(&json_of(&out)).contains("You told me to remember plum"),
        "{}",
        stdout_of(&out)
    );

    check("evicted (the Eviction API, as a node drain does): one line, exit 3, resumable");
    let child = run(&[], "REMEMBER:pear HOLD:evicted")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The newest turn pod, once it runs and its driver fed it (its CLI's request is held).
    let deadline = Instant::now() + Duration::from_secs(120);
    let pod = loop {
        let pods = lab.kubectl_ok(&[
            "get",
            "pod",
            "-l",
            "app.kubernetes.io/managed-by=caw-box",
            "--field-selector=status.phase=Running",
            "-o",
            "name",
        ]);
        // A turn pod is named caw-box-<session id> (not a helper's caw-box-probe-...).
        let turn = pods
            .lines()
            .map(|p| p.trim_start_matches("pod/"))
            .find(|p| p.len() == "caw-box-".len() + 36);
        if let Some(p) = turn {
            break p.to_string();
        }
        assert!(Instant::now() < deadline, "no turn pod ran");
        std::thread::sleep(Duration::from_millis(300));
    };
    wait_held(&endpoint, "evicted");
    let eviction = serde_json::json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": NAMESPACE}
    });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), eviction.to_string()).unwrap();
    lab.kubectl_ok(&[
        "create",
        "--raw",
        &format!("/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction"),
        "-f",
        &file.path().to_string_lossy(),
    ]);
    let out = crate::common::wait_with_deadline(child, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    let line = error_line(&out);
    assert!(line.contains("evicted") && line.contains(&pod), "{line}");
    let evicted = pod.trim_start_matches("caw-box-").to_string();
    let out = crate::common::run(resume(&evicted, &[], "hello again"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    check("a claim that cannot bind: one line naming it, exit 3, nothing left");
    let before = lab.caw_objects();
    let mut nope = run(&[], "hello");
    nope.env("CAW_BOX_STORAGE_CLASS", "caw-box-e2e-absent");
    let out = crate::common::run(nope);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    let line = error_line(&out);
    assert!(
        line.contains("claim 'caw-box-") && line.contains("'caw-box-e2e-absent'"),
        "{line}"
    );
    assert_eq!(lab.caw_objects(), before, "something was left");
    // A class that exists but never provisions: the claims stay Pending.
    let class = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "caw-box-e2e-never-binds",
                     "labels": {"app.kubernetes.io/managed-by": "caw-box-e2e"}},
        "provisioner": "example.invalid/none"
    });
    std::fs::write(file.path(), class.to_string()).unwrap();
    lab.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
    let mut pending = run(&[], "hello");
    pending.env("CAW_BOX_STORAGE_CLASS", "caw-box-e2e-never-binds");
    let out = crate::common::run(pending);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    let line = error_line(&out);
    assert!(
        line.contains("claim 'caw-box-") && line.contains("not bound"),
        "{line}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while lab.caw_objects() != before {
        assert!(Instant::now() < deadline, "left: {:?}", lab.caw_objects());
        std::thread::sleep(Duration::from_millis(500));
    }

    check("--pids-limit: refused with exit 2, nothing made");
    let out = crate::common::run(run(&["--pids-limit", "100"], "hello"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        error_line(&out).contains("--pids-limit"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(lab.caw_objects(), before, "something was made");
    let out = crate::common::run(resume(&id, &["--pids-limit", "100"], "hello"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));

    check("--runtime naming no RuntimeClass: exit 3, one line naming it, nothing made");
    let out = crate::common::run(run(&["--runtime", "caw-box-e2e-absent"], "hello"));
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(
        error_line(&out).contains("no RuntimeClass 'caw-box-e2e-absent'"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(lab.caw_objects(), before, "something was made");
    let out = crate::common::run(resume(&id, &["--runtime", "caw-box-e2e-absent"], "hello"));
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert_eq!(lab.caw_objects(), before, "something was made");
    // A class of the lab's own containerd handler (runc): the next turn's pod runs with it.
    let class = serde_json::json!({
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "caw-box-e2e-runc",
                     "labels": {"app.kubernetes.io/managed-by": "caw-box-e2e"}},
        "handler": "runc"
    });
    std::fs::write(file.path(), class.to_string()).unwrap();
    lab.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);

    check("--network host (a Docker network's name too): refused with exit 2, nothing made");
    let out = crate::common::run(run(&["--network", "host", "--egress", "open"], "hello"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        error_line(&out).contains("--network host is not available with the kubernetes backend"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(lab.caw_objects(), before, "something was made");

    check("wait on a turn whose driver is gone keeps its --timeout (its pod of --runtime's class)");
    let out = crate::common::run(resume(
        &id,
        &["-d", "--timeout", "15s", "--runtime", "caw-box-e2e-runc"],
        "HOLD:timeout REMEMBER:never",
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    // Never released: the turn runs until its --timeout.
    wait_held(&endpoint, "timeout");
    let class = lab.kubectl_ok(&[
        "get",
        "pod",
        &format!("caw-box-{id}"),
        "-o",
        "jsonpath={.spec.runtimeClassName}",
    ]);
    assert_eq!(
        class, "caw-box-e2e-runc",
        "the turn's pod runs without the class"
    );
    let pid = lab.turn_pod_annotation(&id, "io.caw-box.driver-pid");
    let pid: i32 = pid
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no pid: {pid:?}"));
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let started = Instant::now();
    let (waited, _d) = fresh(&lab, workspace.path(), &["wait", &id, "-o", "json"]);
    assert_eq!(
        waited.status.code(),
        Some(124),
        "{}\n{}",
        stdout_of(&waited),
        stderr_of(&waited)
    );
    assert_eq!(json_of(&waited)["status"], "timeout");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "wait took {:?} (the turn's request is held for good)",
        started.elapsed()
    );
    let _ = lab.kubectl(&["delete", "storageclass", "caw-box-e2e-never-binds"]);
    drop(lab);
}

/// A tmux server of the test's own (its own socket), one window running `caw-box` on the
/// lab; killed when dropped.
struct LabTmux {
    socket: String,
}

impl LabTmux {
    fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]).env_remove("TMUX");
        c
    }

    fn ok(&self, args: &[&str]) {
        let out = self.tmux().args(args).output().expect("tmux");
        assert!(out.status.success(), "tmux {args:?}: {}", stderr_of(&out));
    }

    /// Starts `c` (a caw-box command) in a 120x40 window; when it ends the window prints
    /// `EXIT=<code>`.
    fn start(socket: &str, c: &Command, dir: &Path) -> LabTmux {
        let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
        let mut script = String::from("set +e\n");
        for (k, v) in c.get_envs() {
            let k = k.to_string_lossy();
            match v {
                Some(v) => {
                    script.push_str(&format!("export {k}={}\n", quote(&v.to_string_lossy())))
                }
                None => script.push_str(&format!("unset {k}\n")),
            }
        }
        if let Some(cwd) = c.get_current_dir() {
            script.push_str(&format!("cd {}\n", quote(&cwd.to_string_lossy())));
        }
        script.push_str(&quote(&c.get_program().to_string_lossy()));
        for a in c.get_args() {
            script.push(' ');
            script.push_str(&quote(&a.to_string_lossy()));
        }
        script.push_str("\necho \"EXIT=$?\"\nsleep 600\n");
        let path = dir.join("tui.sh");
        std::fs::write(&path, script).unwrap();
        let tmux = LabTmux {
            socket: socket.to_string(),
        };
        let _ = tmux.tmux().arg("kill-server").output();
        tmux.ok(&[
            "new-session",
            "-d",
            "-s",
            "main",
            "-x",
            "120",
            "-y",
            "40",
            &format!("bash {}", path.display()),
        ]);
        tmux
    }

    fn screen(&self) -> String {
        let out = self
            .tmux()
            .args(["capture-pane", "-p", "-t", "main"])
            .output()
            .unwrap();
        stdout_of(&out)
    }

    fn wait_for(&self, needle: &str, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let screen = self.screen();
            if screen.contains(needle) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: '{needle}' did not appear; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Quits codex's TUI with Ctrl-C and returns the screen once caw-box ended. A Ctrl-C
    /// that lands while codex still finishes the turn it just showed interrupts the turn
    /// instead of quitting (as `interactive::quit_codex_tui`): so once more, until it ends.
    fn quit_codex(&self) -> String {
        for _ in 0..4 {
            self.ok(&["send-keys", "-t", "main", "C-c"]);
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                let screen = self.screen();
                if screen.contains("EXIT=") {
                    return screen;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        self.wait_for("EXIT=", "caw-box did not end after the TUI")
    }

    /// Types `text`, waits until the TUI shows it, then presses Enter.
    fn type_line(&self, text: &str) {
        self.ok(&["send-keys", "-t", "main", "-l", text]);
        self.wait_for(text, "the TUI did not show the typed text");
        std::thread::sleep(Duration::from_millis(800));
        self.ok(&["send-keys", "-t", "main", "Enter"]);
    }
}

impl Drop for LabTmux {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").output();
    }
}

impl Lab {
    /// Waits until the terminal of pod `pod` (as its entrypoint sees it) has `rows columns`.
    fn assert_tty_size(&self, pod: &str, rows: u16, columns: u16) {
        let want = format!("{rows} {columns}");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let out = self.kubectl(&[
                "exec",
                pod,
                "-c",
                "agent",
                "--",
                "sh",
                "-c",
                "stty size </proc/1/fd/0",
            ]);
            let got = stdout_of(&out).trim().to_string();
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the pod's terminal is {got:?} ({}), not {want}",
                stderr_of(&out)
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

#[test]
fn kubernetes_codex_tui_through_attach_follows_resizes_and_resumes_headless() {
    let (lab, endpoint, workspace, data) = codex_on_the_lab();
    let name = format!("tui-{}", std::process::id());

    // A collected key: the TUI's turn is brokered (the broker beside it in its pod); the
    // headless resume below passes its key with --env.
    let home = tempfile::tempdir().unwrap();
    let mut collect = caw_k8s(data.path(), workspace.path(), &lab);
    collect
        .args(["auth", "collect", "--provider", "codex"])
        .env("HOME", home.path())
        .env("OPENAI_API_KEY", TEST_KEY);
    assert_eq!(crate::common::run(collect).status.code(), Some(0));

    check("the codex TUI in tmux, attached to its pod with a terminal, brokered");
    let mut c = caw_k8s(data.path(), workspace.path(), &lab);
    // gpt-6-sol: for gpt-5.5 the TUI first offers a model upgrade (a one-time question).
    c.args(["run", "--provider", "codex", "--name", &name])
        .args(["--endpoint", &endpoint, "--model", "gpt-6-sol"]);
    let tmux = LabTmux::start(&format!("cbk-{name}"), &c, data.path());
    tmux.wait_for("Ask Codex to do anything", "codex's TUI did not come up");
    let pods = lab.kubectl_ok(&[
        "get",
        "pod",
        "-l",
        "app.kubernetes.io/managed-by=caw-box",
        "-o",
        "name",
    ]);
    let pod = pods
        .lines()
        .map(|p| p.trim_start_matches("pod/"))
        .find(|p| p.len() == "caw-box-".len() + 36)
        .unwrap_or_else(|| panic!("no turn pod: {pods}"))
        .to_string();
    lab.assert_tty_size(&pod, 40, 120);
    let containers = lab.kubectl_ok(&[
        "get",
        "pod",
        &pod,
        "-o",
        "jsonpath={.spec.containers[*].name}",
    ]);
    // The broker, and the proxy that holds the default egress (balanced).
    assert_eq!(containers, "agent broker proxy");
    tmux.type_line("REMEMBER:zebra");
    tmux.wait_for("Noted: zebra.", "the TUI did not answer");
    tmux.ok(&["resize-window", "-t", "main", "-x", "100", "-y", "30"]);
    lab.assert_tty_size(&pod, 30, 100);
    let screen = tmux.quit_codex();
    assert!(screen.contains("EXIT=0"), "{screen}");

    check("a headless resume recalls what was told in the TUI");
    let mut resume = turn_cmd(
        CODEX,
        data.path(),
        workspace.path(),
        &lab,
        &["resume", &name],
    );
    resume.arg("RECALL");
    let out = crate::common::run(resume);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let r = json_of(&out);
    assert_eq!(r["turn"], 2, "{r}");
    assert_eq!(result_text(&r), "You told me to remember zebra.", "{r}");
    assert!(
        !lab.caw_objects().iter().any(|o| o.starts_with("pod/")),
        "a pod was left: {:?}",
        lab.caw_objects()
    );
    drop(tmux);
    drop(lab);
}

/// Every 12-byte piece of the key: none may show anywhere the agent can look.
fn key_pieces() -> Vec<String> {
    (0..=TEST_KEY.len() - 12)
        .map(|i| TEST_KEY[i..i + 12].to_string())
        .collect()
}

impl Lab {
    /// The running turn pod of this test's caw-box (the only one), by name.
    fn wait_for_turn_pod(&self, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.kubectl(&[
                "get",
                "pod",
                "-l",
                "app.kubernetes.io/managed-by=caw-box,io.caw-box.role=turn",
                "--field-selector=status.phase=Running",
                "-o",
                "name",
            ]);
            if let Some(name) = stdout_of(&out).lines().next() {
                return name.trim_start_matches("pod/").to_string();
            }
            if Instant::now() > deadline {
                // What the cluster shows instead: the pods and the latest events.
                let pods = stdout_of(&self.kubectl(&["get", "pods", "-o", "wide"]));
                let events =
                    stdout_of(&self.kubectl(&["get", "events", "--sort-by=.lastTimestamp"]));
                let tail: Vec<_> = events.lines().rev().take(20).collect();
                panic!(
                    "no turn pod ran in {limit:?}\npods:\n{pods}\nevents (latest first):\n{}",
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The common scan ([`secret_scan`]) for `patterns` (on the exec's stdin: in no command
    /// line or environment) inside container `container` of pod `pod`, as the container's
    /// user: every `/proc/*/environ` and `/proc/*/cmdline`, and with `all` every file under
    /// `/` outside /proc and /sys. The files that matched. Its positive controls, as on
    /// Docker: the random marker it plants is found in its own environment and, with `all`,
    /// in the file it put under /tmp, so an empty answer means nothing there, not a scan
    /// that reads nothing.
    fn scan(&self, pod: &str, container: &str, patterns: &[String], all: bool) -> Vec<String> {
        let mut exec = Command::new(KUBECTL);
        exec.env("KUBECONFIG", &self.kubeconfig)
            .args(["-n", NAMESPACE, "exec", "-i", pod, "-c", container, "--"]);
        let scope = if all {
            ScanScope::Everything
        } else {
            ScanScope::Proc
        };
        let scan = secret_scan(exec, scope, &[], patterns)
            .unwrap_or_else(|out| panic!("scan in {pod}: {}", stderr_of(&out)));
        assert!(
            scan.marker_in_environ && (scan.marker_in_file || !all),
            "scan in {pod}: its own marker not found (file: {}, environ: {}): it reads nothing",
            scan.marker_in_file,
            scan.marker_in_environ
        );
        scan.found
    }
}

/// Brokered by default (issue 14 on a cluster): with a collected API key, a turn's pod has
/// the broker as a second container, which alone gets the key (on its stdin); the agent's
/// container holds a placeholder and sends its model traffic to the broker on the pod's
/// loopback. The stub accepts only the real key, so a turn that succeeds proves the swap;
/// a scan inside the running agent's container and the pod's spec find no piece of the
/// key; `--credentials inject` is the scan's control (it finds the key there).
#[test]
fn kubernetes_brokered_turns_keep_the_key_in_the_pods_sidecar() {
    check("lab up");
    let lab = Lab::up();
    check("load images");
    lab.load_images(&[
        "caw-box/claude-code:latest",
        "caw-box/codex:latest",
        "caw-box/opencode:latest",
        "caw-box/gemini:latest",
        &stub_image(),
    ]);
    let endpoint = lab.start_stub();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("README.md"), "a workspace\n").unwrap();
    let home = tempfile::tempdir().unwrap();

    for p in ALL {
        let data = tempfile::tempdir().unwrap();
        check(&format!("{}: auth collect", p.name));
        let mut collect = caw_k8s(data.path(), workspace.path(), &lab);
        collect
            .args(["auth", "collect", "--provider", p.name])
            .env("HOME", home.path())
            .env(p.key_var, TEST_KEY);
        let out = crate::common::run(collect);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

        check(&format!(
            "{}: a brokered run, scanned while it runs",
            p.name
        ));
        let mut run = caw_k8s(data.path(), workspace.path(), &lab);
        run.args([
            "run",
            "--provider",
            p.name,
            "--endpoint",
            &endpoint,
            "-o",
            "json",
        ]);
        if let Some(m) = p.model {
            run.args(["--model", m]);
        }
        // Held until the scans are done.
        let hold = format!("scan-{}", p.name);
        run.arg(format!("HOLD:{hold} REMEMBER:medlar-{}", p.name))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let child = run.spawn().unwrap();
        let pod = lab.wait_for_turn_pod(Duration::from_secs(240));
        // Mid-turn: the CLI's request went through the broker and waits at the stub.
        wait_held(&endpoint, &hold);
        // Once the CLI read its runtime files, it holds its placeholder.
        let placeholder_seen = (0..80).any(|_| {
            let found = lab.scan(
                &pod,
                "agent",
                &["placeholder".into(), "Placeholder".into()],
                false,
            );
            if found.iter().any(|f| f.ends_with("/environ")) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(250));
            false
        });
        assert!(
            placeholder_seen,
            "{}: no process of the agent holds a placeholder key (the scan reads nothing?)",
            p.name
        );
        let found = lab.scan(&pod, "agent", &key_pieces(), true);
        assert_eq!(
            found,
            Vec::<String>::new(),
            "{}: the key in the agent's container",
            p.name
        );
        let spec = lab.kubectl_ok(&["get", "pod", &pod, "-o", "json"]);
        let v: Value = serde_json::from_str(&spec).unwrap();
        let names: Vec<&str> = v["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        // The broker, and the proxy that holds the default egress (balanced).
        assert_eq!(names, ["agent", "broker", "proxy"], "{}", p.name);
        assert!(
            !holds_a_piece(&spec),
            "{}: the key in the pod: {spec}",
            p.name
        );
        let objects = lab.kubectl_ok(&[
            "get",
            "pod,secret,configmap,pvc",
            "-l",
            "app.kubernetes.io/managed-by=caw-box",
            "-o",
            "yaml",
        ]);
        assert!(
            !holds_a_piece(&objects),
            "{}: the key in an object: {objects}",
            p.name
        );

        release(&endpoint, &hold);
        let out = wait_with_deadline(child, Duration::from_secs(240));
        let first = json_of(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: the brokered turn failed: {first}\n{}",
            p.name,
            stderr_of(&out)
        );
        assert!(
            result_text(&first).contains(&format!("Noted: medlar-{}", p.name)),
            "{first}"
        );
        let id = first["session_id"].as_str().unwrap().to_string();
        let logs = lab.kubectl_ok(&["get", "events", "-o", "yaml"]);
        assert!(!holds_a_piece(&logs), "{}: the key in an event", p.name);
        assert!(
            !lab.caw_objects().iter().any(|o| o.starts_with("pod/")),
            "{}: a turn pod was left: {:?}",
            p.name,
            lab.caw_objects()
        );

        check(&format!("{}: a brokered resume recalls", p.name));
        let mut resume = caw_k8s(data.path(), workspace.path(), &lab);
        resume.args([
            "resume",
            &id,
            "--endpoint",
            &endpoint,
            "-o",
            "json",
            "RECALL",
        ]);
        let out = crate::common::run(resume);
        let second = json_of(&out);
        assert_eq!(out.status.code(), Some(0), "{second}\n{}", stderr_of(&out));
        assert!(
            result_text(&second).contains(&format!("You told me to remember medlar-{}", p.name)),
            "{second}"
        );
    }

    check("a brokered detached turn whose driver is SIGKILLed: wait records it");
    let data = tempfile::tempdir().unwrap();
    let mut collect = caw_k8s(data.path(), workspace.path(), &lab);
    collect
        .args(["auth", "collect", "--provider", CODEX.name])
        .env("HOME", home.path())
        .env(CODEX.key_var, TEST_KEY);
    assert_eq!(crate::common::run(collect).status.code(), Some(0));
    let mut run = caw_k8s(data.path(), workspace.path(), &lab);
    run.args([
        "run",
        "-d",
        "--provider",
        CODEX.name,
        "--endpoint",
        &endpoint,
    ])
    .args([
        "--model",
        CODEX.model.unwrap(),
        "-o",
        "json",
        "HOLD:kiwi REMEMBER:kiwi",
    ]);
    let out = crate::common::run(run);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let id = json_of(&out)["session_id"].as_str().unwrap().to_string();
    // Past the driver's first moment (it hands the broker its keys and the agent its files):
    // the CLI's request came through the broker and is held at the stub.
    wait_held(&endpoint, "kiwi");
    let pid = lab.turn_pod_annotation(&id, "io.caw-box.driver-pid");
    let killed = Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -KILL {pid}");
    release(&endpoint, "kiwi");
    let (waited, _d) = fresh(&lab, workspace.path(), &["wait", &id, "-o", "json"]);
    let w = json_of(&waited);
    assert_eq!(waited.status.code(), Some(0), "{w}\n{}", stderr_of(&waited));
    assert!(result_text(&w).contains("Noted: kiwi"), "{w}");
    assert!(
        !lab.caw_objects().iter().any(|o| o.starts_with("pod/")),
        "a pod was left: {:?}",
        lab.caw_objects()
    );

    check("the scan's control: --credentials inject puts the key in the agent's container");
    let data = tempfile::tempdir().unwrap();
    let mut collect = caw_k8s(data.path(), workspace.path(), &lab);
    collect
        .args(["auth", "collect", "--provider", CODEX.name])
        .env("HOME", home.path())
        .env(CODEX.key_var, TEST_KEY);
    assert_eq!(crate::common::run(collect).status.code(), Some(0));
    let mut run = caw_k8s(data.path(), workspace.path(), &lab);
    run.args(["run", "--provider", CODEX.name, "--endpoint", &endpoint])
        .args(["--credentials", "inject", "--model", CODEX.model.unwrap()])
        .args(["-o", "json", "HOLD:injected REMEMBER:injected"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = run.spawn().unwrap();
    let pod = lab.wait_for_turn_pod(Duration::from_secs(240));
    wait_held(&endpoint, "injected");
    let found = (0..80).find_map(|_| {
        let found = lab.scan(&pod, "agent", &key_pieces(), false);
        if found.iter().any(|f| f.ends_with("/environ")) {
            return Some(found);
        }
        std::thread::sleep(Duration::from_millis(250));
        None
    });
    assert!(found.is_some(), "the scan did not find the injected key");
    let spec = lab.kubectl_ok(&["get", "pod", &pod, "-o", "json"]);
    let v: Value = serde_json::from_str(&spec).unwrap();
    // The agent, and the proxy that holds the default egress: no broker.
    let names: Vec<&str> = v["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["agent", "proxy"], "{spec}");
    release(&endpoint, "injected");
    let out = wait_with_deadline(child, Duration::from_secs(240));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

fn holds_a_piece(text: &str) -> bool {
    key_pieces().iter().any(|p| text.contains(p.as_str()))
}

/// `caw-box doctor --backend kubernetes` on the lab: one line per check (API server with
/// context and namespace, RBAC, storage class, each provider's image on the nodes), exit 0
/// when all is well; a missing image, a user whose Role lacks rights and an unreachable
/// API server are each a `✗` line and exit 3.
#[test]
fn kubernetes_doctor_checks_the_api_server_rbac_storage_and_images() {
    check("lab up");
    let lab = Lab::up();
    lab.load_images(&[
        "caw-box/claude-code:latest",
        "caw-box/codex:latest",
        "caw-box/opencode:latest",
        "caw-box/gemini:latest",
    ]);
    // The kubelet lists a node's images in its status some seconds after they came.
    let deadline = Instant::now() + Duration::from_secs(90);
    while !["claude-code", "codex", "opencode", "gemini"]
        .iter()
        .all(|i| {
            lab.kubectl_ok(&["get", "nodes", "-o", "json"])
                .contains(&format!("caw-box/{i}:latest"))
        })
    {
        assert!(
            Instant::now() < deadline,
            "the node never listed the images"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let workspace = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let doctor = |kubeconfig: Option<&Path>, env: &[(&str, &str)]| {
        let mut c = caw_k8s(data.path(), workspace.path(), &lab);
        if let Some(k) = kubeconfig {
            c.env("KUBECONFIG", k);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        // As the brief's user types it: the flag after the command.
        c.arg("doctor");
        crate::common::run(c)
    };
    let lines =
        |out: &Output| -> Vec<String> { stdout_of(out).lines().map(str::to_string).collect() };
    let has = |out: &Output, prefix: &str, words: &str| {
        lines(out)
            .iter()
            .any(|l| l.starts_with(prefix) && l.contains(words))
    };

    check("all well");
    let out = doctor(None, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    for words in [
        "kubernetes: API server https://127.0.0.1:16443/ (current context",
        "namespace 'default'",
        "rbac: every permission caw-box needs in namespace 'default'",
        "storage: default class 'standard'",
        "codex: image caw-box/codex:latest on every node (1)",
        "gemini: image caw-box/gemini:latest on every node (1)",
    ] {
        assert!(has(&out, "✓ ", words), "{words}: {}", stdout_of(&out));
    }
    // The lab has no RuntimeClass: `--runtime` has nothing to pick (a note).
    assert!(
        has(&out, "- ", "runtime classes: none"),
        "{}",
        stdout_of(&out)
    );
    assert!(!stdout_of(&out).contains('✗'), "{}", stdout_of(&out));

    check("images from a repository the nodes do not have");
    let out = doctor(None, &[("CAW_BOX_IMAGE_REPO", "caw-box-absent")]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout_of(&out));
    assert!(
        has(
            &out,
            "✗ ",
            "codex: image caw-box-absent/codex:latest on 0 of 1 nodes"
        ),
        "{}",
        stdout_of(&out)
    );
    assert!(
        stderr_of(&out).contains("4 problems found"),
        "{}",
        stderr_of(&out)
    );

    check("a user whose Role grants only reading pods");
    let user = "caw-box-e2e-limited";
    let role = serde_json::json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "caw-box-e2e-limited", "namespace": NAMESPACE,
                          "labels": {"app.kubernetes.io/managed-by": "caw-box-e2e"}},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "caw-box-e2e-limited", "namespace": NAMESPACE,
                          "labels": {"app.kubernetes.io/managed-by": "caw-box-e2e"}},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "caw-box-e2e-limited"},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}
        ]
    });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), role.to_string()).unwrap();
    lab.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
    let config = std::fs::read_to_string(&lab.kubeconfig).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let limited = dir.path().join("limited");
    std::fs::write(
        &limited,
        config.replace("user: {", &format!("user: {{as: {user}, ")),
    )
    .unwrap();
    let out = doctor(Some(&limited), &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout_of(&out));
    let rbac = lines(&out)
        .into_iter()
        .find(|l| l.starts_with("✗ rbac:"))
        .unwrap_or_else(|| panic!("no rbac problem: {}", stdout_of(&out)));
    for missing in [
        "create pods",
        "create pods/exec",
        "get pods/log",
        "create persistentvolumeclaims",
        "delete configmaps",
    ] {
        assert!(
            rbac.contains(&format!("{missing},")) || rbac.contains(&format!("{missing};")),
            "{missing}: {rbac}"
        );
    }
    for granted in ["get pods,", "list pods,"] {
        assert!(
            !rbac.contains(&format!(": {granted}")) && !rbac.contains(&format!(" {granted}")),
            "{granted}: {rbac}"
        );
    }
    // Cluster-wide reads it may not do are notes, not problems.
    assert!(
        has(&out, "- ", "storage: cannot list storage classes"),
        "{}",
        stdout_of(&out)
    );
    assert!(
        has(&out, "- ", "images: cannot list the nodes"),
        "{}",
        stdout_of(&out)
    );
    assert!(
        has(&out, "- ", "runtime classes: cannot list them"),
        "{}",
        stdout_of(&out)
    );

    check("an unreachable API server");
    let unreachable = dir.path().join("unreachable");
    std::fs::write(
        &unreachable,
        config.replace("https://127.0.0.1:16443", "https://127.0.0.1:1"),
    )
    .unwrap();
    let out = doctor(Some(&unreachable), &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout_of(&out));
    assert!(
        has(
            &out,
            "✗ ",
            "kubernetes: cannot reach the API server https://127.0.0.1:1/"
        ),
        "{}",
        stdout_of(&out)
    );
    let first = stderr_of(&out);
    assert!(
        first
            .lines()
            .next()
            .unwrap_or("")
            .starts_with("caw-box: error: the Kubernetes API server is not reachable"),
        "{first}"
    );
}

/// A login file the CLI replaced during a turn (a refreshed OAuth token) goes back to the
/// auth store, as on Docker, although the pod's runtime directory goes with the pod: it is
/// read from HOME while the entrypoint waits for the record. The next turn gets it, and no
/// credential file stays in the state claim.
#[test]
fn kubernetes_a_refreshed_login_is_written_back_and_used_next_turn() {
    use base64::Engine;
    let jwt = |exp: u64| {
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!(
            "{}.{}.sig",
            enc(r#"{"alg":"none"}"#),
            enc(&format!(r#"{{"exp":{exp}}}"#))
        )
    };
    check("lab up");
    let lab = Lab::up();
    lab.load_images(&["caw-box/codex:latest", &stub_image()]);
    let endpoint = lab.start_stub();
    let workspace = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (old, new) = (jwt(2_000_000_000), jwt(2_100_000_000));
    let path = home.path().join(".codex/auth.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        &path,
        format!(r#"{{"OPENAI_API_KEY":"{TEST_KEY}","tokens":{{"access_token":"{old}"}}}}"#),
    )
    .unwrap();
    let mut collect = caw_k8s(data.path(), workspace.path(), &lab);
    collect
        .args(["auth", "collect", "--provider", "codex"])
        .env("HOME", home.path());
    let out = crate::common::run(collect);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    check("a turn whose CLI replaces its login file by rename");
    let refresh = format!(
        r#"RUN:printf '%s' '{{"OPENAI_API_KEY":"{TEST_KEY}","tokens":{{"access_token":"{new}"}}}}' > ~/.codex/auth.tmp && mv ~/.codex/auth.tmp ~/.codex/auth.json && echo refreshed"#
    );
    let mut run = caw_k8s(data.path(), workspace.path(), &lab);
    run.args(["run", "--provider", "codex", "--endpoint", &endpoint])
        .args(["--model", CODEX.model.unwrap(), "-o", "json", &refresh]);
    let out = crate::common::run(run);
    let first = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{first}\n{}", stderr_of(&out));
    assert!(result_text(&first).contains("refreshed"), "{first}");
    let id = first["session_id"].as_str().unwrap().to_string();
    let stored =
        std::fs::read_to_string(data.path().join("auth/codex/home/.codex/auth.json")).unwrap();
    assert!(
        stored.contains(&new),
        "the store kept the old token: {stored}"
    );

    check("the next turn gets the new login; none stays in the claim");
    let mut resume = caw_k8s(data.path(), workspace.path(), &lab);
    resume.args(["resume", &id, "--endpoint", &endpoint]).args([
        "-o",
        "json",
        "RUN:cat ~/.codex/auth.json",
    ]);
    let out = crate::common::run(resume);
    let second = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{second}\n{}", stderr_of(&out));
    assert!(result_text(&second).contains(&new[..40]), "{second}");
    let found = lab.in_claim(&format!("caw-box-{id}"), "find /h -name auth.json");
    assert_eq!(found.trim(), "", "a login file at rest in the claim");
}

impl Lab {
    /// Runs `script` (sh) in a pod that mounts claim `claim` at /h; its output.
    fn in_claim(&self, claim: &str, script: &str) -> String {
        let name = format!("e2e-look-{}", &uuid_like());
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"io.caw-box.test": "e2e"}},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": false,
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                "containers": [{
                    "name": "look", "image": "caw-box/codex:latest", "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "h", "mountPath": "/h", "readOnly": true}]
                }],
                "volumes": [{"name": "h", "persistentVolumeClaim": {"claimName": claim, "readOnly": true}}]
            }
        });
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), pod.to_string()).unwrap();
        self.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let phase = self.kubectl_ok(&["get", "pod", &name, "-o", "jsonpath={.status.phase}"]);
            if phase == "Succeeded" || phase == "Failed" {
                assert_eq!(phase, "Succeeded", "{}", self.kubectl_ok(&["logs", &name]));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the look pod did not end: {phase}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        let out = self.kubectl_ok(&["logs", &name]);
        self.kubectl_ok(&["delete", "pod", &name, "--wait=true"]);
        out
    }
}

fn uuid_like() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// `--allow-host` on Kubernetes, held inside the turn's pod (iptables rules of an init
/// container in the pod's network namespace, and a proxy sidecar): a turn to an allowed
/// stub succeeds; from the running agent's container a second stub is refused directly
/// and through the proxy (which logs it, and the turn's log says so), while the proxy's
/// own uid reaches it (the rules, not the lab's network, refuse the agent); a brokered turn
/// gets out through its sidecar; `--network none` is refused as on Docker.
#[test]
fn kubernetes_allow_host_holds_the_pods_egress_without_a_network_policy() {
    const P: P = CODEX;
    check("lab up");
    let lab = Lab::up();
    check("load images");
    lab.load_images(&["caw-box/codex:latest", &stub_image()]);
    let endpoint = lab.start_stub();
    let other = lab.start_stub_named("stub-other");
    let host_of = |url: &str| url.trim_start_matches("http://").to_string();
    let (allowed, refused) = (host_of(&endpoint), host_of(&other));
    let (other_ip, other_port) = refused.split_once(':').unwrap();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("README.md"), "a workspace\n").unwrap();
    let data = tempfile::tempdir().unwrap();

    check("an --allow-host turn, probed from inside while it runs");
    // Its events as they come: a refusal is said when it happens, not at the turn's end.
    let mut run = caw_k8s(data.path(), workspace.path(), &lab);
    run.args(["run", "--provider", P.name, "--endpoint", &endpoint])
        .args(["--env", &format!("{}={TEST_KEY}", P.key_var)])
        .args(["-o", "stream-json"]);
    run.args(["--model", P.model.unwrap(), "--allow-host", &allowed])
        .arg("HOLD:probed REMEMBER:quince")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = run.spawn().unwrap();
    let pod = lab.wait_for_turn_pod(Duration::from_secs(240));
    // The agent's request came through the proxy; the stub holds it until the probes ran.
    wait_held(&endpoint, "probed");
    let spec: Value =
        serde_json::from_str(&lab.kubectl_ok(&["get", "pod", &pod, "-o", "json"])).unwrap();
    let names = |key: &str| container_names(&spec, key);
    assert_eq!(names("initContainers")[0], "egress", "{spec}");
    assert_eq!(names("containers"), ["agent", "proxy"], "{spec}");
    // `logs -f` from a fresh process, following the held turn: the refusal below comes
    // from the pod's proxy sidecar's log as it happens.
    let session = spec["metadata"]["labels"]["io.caw-box.session"]
        .as_str()
        .unwrap_or_else(|| panic!("no session label: {spec}"))
        .to_string();
    let mut follow = caw_k8s(data.path(), workspace.path(), &lab);
    follow
        .args(["logs", &session, "-f"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let follower = follow.spawn().unwrap();
    // The rules are in place before the agent runs: its init container has ended.
    let rules = lab.kubectl_ok(&["logs", &pod, "-c", "egress"]);
    assert!(rules.contains("egress held to uids"), "{rules}");
    let probe = format!(
        r#"id -u
if (exec 3<>/dev/tcp/{other_ip}/{other_port}) 2>/dev/null; then echo direct-other=open; else echo direct-other=refused; fi
if (exec 3<>/dev/tcp/{allowed_ip}/{allowed_port}) 2>/dev/null; then echo direct-allowed=open; else echo direct-allowed=refused; fi
node -e 'require("http").get({{host:"127.0.0.1",port:3128,path:"http://{refused}/v1/models"}},r=>{{console.log("proxied-other="+r.statusCode);process.exit(0)}}).on("error",e=>{{console.log("proxied-other="+e.message);process.exit(0)}})'"#,
        allowed_ip = allowed.split(':').next().unwrap(),
        allowed_port = allowed.split(':').nth(1).unwrap(),
    );
    let seen = lab.kubectl_ok(&["exec", &pod, "-c", "agent", "--", "bash", "-c", &probe]);
    assert!(seen.starts_with("1000\n"), "not the agent user: {seen}");
    assert!(seen.contains("direct-other=refused"), "{seen}");
    assert!(
        seen.contains("direct-allowed=refused"),
        "an allowed host is reached through the proxy only: {seen}"
    );
    assert!(seen.contains("proxied-other=403"), "{seen}");
    // The control: the same pod's proxy (its own uid) reaches the second stub directly.
    let control = lab.kubectl_ok(&[
        "exec",
        &pod,
        "-c",
        "proxy",
        "--",
        "bash",
        "-c",
        &format!("id -u; (exec 3<>/dev/tcp/{other_ip}/{other_port}) && echo reached"),
    ]);
    assert!(control.contains("reached"), "{control}");
    assert!(!control.starts_with("1000\n"), "{control}");

    release(&endpoint, "probed");
    let out = wait_with_deadline(child, Duration::from_secs(240));
    let events: Vec<Value> = stdout_of(&out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let v = events.last().cloned().unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{v}\n{}", stderr_of(&out));
    // The refusal came while the stub held the turn: before the model's first words.
    let refused_at = events
        .iter()
        .position(|e| e["type"] == "egress_refused" && e["host"] == *other_ip)
        .unwrap_or_else(|| panic!("no egress_refused event: {events:#?}"));
    let first_text = events
        .iter()
        .position(|e| e["type"] == "text")
        .unwrap_or_else(|| panic!("no text event: {events:#?}"));
    assert!(
        refused_at < first_text,
        "the refusal was said only at the turn's end: {events:#?}"
    );
    assert_eq!(v["status"], "success", "{v}");
    let id = v["session_id"].as_str().unwrap().to_string();
    // The turn's record, from its pod's proxy: the model's host reached, the other refused.
    let listed = |list: &str, ip: &str| {
        v["egress"][list]
            .as_array()
            .is_some_and(|l| l.iter().any(|e| e["host"] == ip))
    };
    assert_eq!(v["egress"]["policy"], "balanced", "{v}");
    assert!(listed("allowed", allowed.split(':').next().unwrap()), "{v}");
    assert!(listed("refused", other_ip), "{v}");
    let followed = wait_with_deadline(follower, Duration::from_secs(60));
    assert_eq!(followed.status.code(), Some(0), "{}", stderr_of(&followed));
    let events: Vec<Value> = stdout_of(&followed)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let refusals: Vec<usize> = (0..events.len())
        .filter(|i| events[*i]["type"] == "egress_refused" && events[*i]["host"] == *other_ip)
        .collect();
    assert_eq!(refusals.len(), 1, "logs -f: {events:#?}");
    let first_text = events
        .iter()
        .position(|e| e["type"] == "text")
        .unwrap_or_else(|| panic!("logs -f, no text event: {events:#?}"));
    assert!(
        refusals[0] < first_text,
        "logs -f said it late: {events:#?}"
    );
    let mut logs = caw_k8s(data.path(), workspace.path(), &lab);
    logs.args(["logs", &id]);
    let logs = crate::common::run(logs);
    let said = stdout_of(&logs);
    assert!(
        said.lines()
            .any(|l| l.contains("\"type\":\"egress_refused\"")
                && l.contains(&format!("\"host\":\"{other_ip}\""))),
        "what the proxy refused is not in the turn's log: {said}"
    );

    check("--egress open: the proxy records, nothing refuses");
    let mut open = turn_cmd(
        P,
        data.path(),
        workspace.path(),
        &lab,
        &["run", "--provider", P.name, "--endpoint", &endpoint],
    );
    open.args(["--model", P.model.unwrap(), "--egress", "open"])
        .arg("HOLD:open hello")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = open.spawn().unwrap();
    wait_held(&endpoint, "open");
    let pod = lab.wait_for_turn_pod(Duration::from_secs(240));
    let spec: Value =
        serde_json::from_str(&lab.kubectl_ok(&["get", "pod", &pod, "-o", "json"])).unwrap();
    let names = |key: &str| container_names(&spec, key);
    assert_eq!(names("containers"), ["agent", "proxy"], "{spec}");
    assert!(
        !names("initContainers").contains(&"egress".to_string()),
        "rules under open: {spec}"
    );
    let probe = format!(
        r#"node -e 'require("http").get({{host:"127.0.0.1",port:3128,path:"http://{refused}/v1/models"}},r=>{{console.log("proxied-other="+r.statusCode);process.exit(0)}}).on("error",e=>{{console.log("proxied-other="+e.message);process.exit(0)}})'"#
    );
    let seen = lab.kubectl_ok(&["exec", &pod, "-c", "agent", "--", "bash", "-c", &probe]);
    assert!(
        seen.contains("proxied-other=") && !seen.contains("proxied-other=403"),
        "{seen}"
    );
    release(&endpoint, "open");
    let out = wait_with_deadline(child, Duration::from_secs(240));
    let o = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{o}\n{}", stderr_of(&out));
    assert_eq!(o["egress"]["policy"], "open", "{o}");
    let listed = |list: &str, ip: &str| {
        o["egress"][list]
            .as_array()
            .is_some_and(|l| l.iter().any(|e| e["host"] == ip))
    };
    assert!(
        listed("allowed", other_ip),
        "the other stub, reached, is not recorded: {o}"
    );
    assert!(listed("allowed", allowed.split(':').next().unwrap()), "{o}");
    assert!(!listed("refused", other_ip), "{o}");

    check("a detached --allow-host resume completes and recalls");
    let mut resume = turn_cmd(
        P,
        data.path(),
        workspace.path(),
        &lab,
        &["resume", &id, "-d"],
    );
    resume.arg("RECALL");
    let out = crate::common::run(resume);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let (waited, _d) = fresh(&lab, workspace.path(), &["wait", &id, "-o", "json"]);
    let w = json_of(&waited);
    assert_eq!(waited.status.code(), Some(0), "{w}\n{}", stderr_of(&waited));
    assert!(result_text(&w).contains("quince"), "{w}");

    check("brokered: the broker sidecar gets out, the agent holds no key");
    let home = tempfile::tempdir().unwrap();
    let bdata = tempfile::tempdir().unwrap();
    let mut collect = caw_k8s(bdata.path(), workspace.path(), &lab);
    collect
        .args(["auth", "collect", "--provider", P.name])
        .env("HOME", home.path())
        .env(P.key_var, TEST_KEY);
    let out = crate::common::run(collect);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let mut brokered = caw_k8s(bdata.path(), workspace.path(), &lab);
    brokered
        .args(["run", "--provider", P.name, "--endpoint", &endpoint])
        .args(["--model", P.model.unwrap(), "--allow-host", "@provider"])
        .args(["-o", "json", "HOLD:brokered hello"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = brokered.spawn().unwrap();
    let pod = lab.wait_for_turn_pod(Duration::from_secs(240));
    // Out through the broker and the proxy: the stub holds the request.
    wait_held(&endpoint, "brokered");
    let spec: Value =
        serde_json::from_str(&lab.kubectl_ok(&["get", "pod", &pod, "-o", "json"])).unwrap();
    let containers: Vec<&str> = spec["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(containers, ["agent", "broker", "proxy"], "{spec}");
    release(&endpoint, "brokered");
    let out = wait_with_deadline(child, Duration::from_secs(240));
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{v}\n{}", stderr_of(&out));

    check("--network none: refused with exit 2 as on Docker, nothing made");
    let before = lab.caw_objects();
    let mut none = turn_cmd(
        P,
        data.path(),
        workspace.path(),
        &lab,
        &["run", "--provider", P.name, "--endpoint", &endpoint],
    );
    none.args(["--network", "none", "hello"]);
    let out = crate::common::run(none);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        error_line(&out).contains("--network none leaves the CLI no way to reach its model"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(lab.caw_objects(), before, "something was made");
    drop(lab);
}

/// Logins brokered on Kubernetes (issue 29), as on Docker (tests/e2e/oauth.rs): a Claude
/// login and a codex ChatGPT login, each in four sessions whose turns run at once, eight
/// turns across a forced expiry; then opencode's ChatGPT login in one session whose first
/// turn meets the expiry, its sidecar standing in for chatgpt.com with TLS (the pod
/// resolves it to its loopback). The pod's broker sidecar holds the login (the agent's
/// container a placeholder login file) and owns its refresh: the stub's token endpoint
/// rotates refresh tokens and rejects a used one, so exactly one refresh for the four pods'
/// brokers with none rejected shows their hand-off. The sessions are driven from two data
/// directories that share one credential store (two hosts, as far as caw-box can tell: each
/// data directory has its own refresh lock file), so that one refresh shows the hand-off's
/// lock is the namespace's Lease, not a host's file. The store ends with the newest tokens.
/// While the slow turns run, a scan of an agent's container (its processes and every file)
/// finds no real token, and finds the placeholder (the control). Then a detached codex turn
/// whose driver is SIGKILLed before the next expiry meets its broker: the `wait` that
/// finishes the turn answers the sidecar's hand-off and stores what it refreshed.
#[test]
fn kubernetes_logins_are_brokered_in_the_pods_sidecar_across_forced_expiries() {
    use crate::oauth::{at, claude_login, codex_login, opencode_login, secret_part};
    const SESSIONS: usize = 4;
    check("lab up");
    let lab = Lab::up();
    lab.load_images(&[
        "caw-box/claude-code:latest",
        "caw-box/codex:latest",
        "caw-box/opencode:latest",
        &stub_image(),
    ]);
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("README.md"), "a workspace\n").unwrap();
    // opencode's ChatGPT login (its broker stands in for chatgpt.com with TLS): one session.
    for login in [
        claude_login(SESSIONS),
        codex_login(SESSIONS),
        opencode_login(1),
    ] {
        let (p, sessions) = (login.provider, login.sessions);
        check(&format!("{p}: the login collected, its stub started"));
        let endpoint = lab.start_stub_with(
            &format!("stub-oauth-{}", p.replace('_', "-")),
            serde_json::json!([{"name": "STUB_OAUTH",
                                "value": format!("{},{}", login.access, login.refresh)}]),
        );
        let stub = StubControl::Http(endpoint.clone());
        let data = tempfile::tempdir().unwrap();
        // The second "host": its own data directory, the first one's credential store.
        let other_host = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(data.path().join("auth"), other_host.path().join("auth"))
            .unwrap();
        let hosts = [data.path(), other_host.path()];
        let home = tempfile::tempdir().unwrap();
        let file = home.path().join(login.target);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, &login.text).unwrap();
        let mut collect = caw_k8s(data.path(), workspace.path(), &lab);
        collect
            .args(["auth", "collect", "--provider", p])
            .env("HOME", home.path());
        let out = crate::common::run(collect);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let turn_on = |host: &std::path::Path, args: &[&str]| {
            let mut c = caw_k8s(host, workspace.path(), &lab);
            c.args(args)
                .env(
                    "CAW_BOX_OAUTH_TOKEN_URL",
                    format!("{endpoint}/v1/oauth/token"),
                )
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            c
        };
        let turn = |args: &[&str]| turn_on(data.path(), args);
        let run_args = |prompt: &str| -> Vec<String> {
            let mut a = vec![
                "run",
                "--provider",
                p,
                "--endpoint",
                &endpoint,
                "-o",
                "json",
            ];
            if let Some(m) = login.model {
                a.extend(["--model", m]);
            }
            a.push(prompt);
            a.into_iter().map(str::to_string).collect()
        };
        let all_ok = |children: Vec<(std::process::Child, String)>| -> Vec<Value> {
            children
                .into_iter()
                .map(|(child, word)| {
                    let out = wait_with_deadline(child, Duration::from_secs(240));
                    let v = json_of(&out);
                    assert_eq!(
                        out.status.code(),
                        Some(0),
                        "{p} {word}: {v}\n{}",
                        stderr_of(&out)
                    );
                    assert!(result_text(&v).contains(&format!("Noted: {word}")), "{v}");
                    v
                })
                .collect()
        };
        let status = || stub.json("GET", "/_stub/oauth");
        let newest_stored = |refreshes: u64, seen: &mut Vec<String>| {
            let s = status();
            assert_eq!(
                (s["refreshes"].as_u64(), s["rejected"].as_u64()),
                (Some(refreshes), Some(0)),
                "{p}: {s}"
            );
            let path = data
                .path()
                .join(format!("auth/{p}/home"))
                .join(login.target);
            let stored: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            if refreshes > 0 {
                let newest = s["refresh_token"].as_str().unwrap();
                assert_eq!(at(&stored, login.refresh_at), newest, "{p}: {stored}");
                let access = secret_part(at(&stored, login.access_at).as_str().unwrap());
                assert!(access.starts_with("stub-access-"), "{p}: {stored}");
                seen.extend([newest.to_string(), access.to_string()]);
            }
        };

        // A lone session (opencode's) starts at the expiry: its first turn is round 2's.
        let mut ids: Vec<Option<String>> = vec![None];
        let mut seen = login.secrets.clone();
        if sessions > 1 {
            check(&format!("{p}: round 1, the login valid"));
            let children = (0..sessions)
                .map(|i| {
                    let word = format!("first{i}");
                    let args = run_args(&format!("REMEMBER:{word}"));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    (turn_on(hosts[i % 2], &args).spawn().unwrap(), word)
                })
                .collect();
            ids = all_ok(children)
                .iter()
                .map(|v| Some(v["session_id"].as_str().unwrap().to_string()))
                .collect();
            newest_stored(0, &mut seen);
        }

        check(&format!("{p}: round 2, across a forced expiry"));
        // The login's model requests wait at the gate, then meet the expired token
        // together: the pods' brokers race for the refresh.
        stub.json("POST", "/_stub/oauth/expire?hold=expiry");
        let scan_hold = format!("scan-{p}");
        let children = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let word = format!("second{i}");
                let prompt = format!("HOLD:{scan_hold} REMEMBER:{word}");
                let args = match id {
                    Some(id) => ["resume", id, "-o", "json", &prompt]
                        .map(str::to_string)
                        .to_vec(),
                    None => run_args(&prompt),
                };
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                (turn_on(hosts[i % 2], &args).spawn().unwrap(), word)
            })
            .collect();
        stub.wait_held("expiry", sessions, HELD_WITHIN);
        stub.release("expiry");
        check(&format!("{p}: a slow turn's agent container scanned"));
        stub.wait_held(&scan_hold, sessions, HELD_WITHIN);
        let pod = lab.wait_for_turn_pod(Duration::from_secs(60));
        let control = lab.scan(&pod, "agent", &["cawbox-placeholder".into()], true);
        assert!(
            control.iter().any(|f| f.ends_with(login.placeholder_in)),
            "{p}: the scan finds no placeholder login: {control:?}"
        );
        let pieces: Vec<String> = seen
            .iter()
            .flat_map(|t| (0..=t.len() - 16).map(move |i| t[i..i + 16].to_string()))
            .chain(["stub-access-".to_string(), "stub-refresh-".to_string()])
            .collect();
        let found = lab.scan(&pod, "agent", &pieces, true);
        assert_eq!(found, Vec::<String>::new(), "{p}: a real token in {pod}");
        let objects = lab.kubectl_ok(&[
            "get",
            "pod,secret,configmap,pvc",
            "-l",
            CAW_OBJECTS,
            "-o",
            "yaml",
        ]);
        assert!(
            !pieces.iter().any(|x| objects.contains(x.as_str())),
            "{p}: a real token in an object"
        );
        stub.release(&scan_hold);
        all_ok(children);
        newest_stored(1, &mut seen);
        // The hand-off's lock: the login's Lease, released (no holder) after the refresh.
        let lease = lab.kubectl_ok(&[
            "get",
            "lease",
            &format!("caw-box-refresh-{}", p.replace('_', "-")),
            "-o",
            "jsonpath={.metadata.labels.app\\.kubernetes\\.io/managed-by} {.spec.holderIdentity}|",
        ]);
        assert_eq!(lease, "caw-box |", "{p}: the refresh Lease");

        if p != "codex" {
            continue;
        }
        check("codex: a detached turn's driver SIGKILLed before the expiry; wait stores");
        stub.json("POST", "/_stub/oauth/expire?hold=gone");
        let args = run_args("REMEMBER:gone");
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.insert(1, "-d");
        let out = crate::common::run(turn(&args));
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let id = json_of(&out)["session_id"].as_str().unwrap().to_string();
        stub.wait_held("gone", 1, HELD_WITHIN);
        let pid = lab.turn_pod_annotation(&id, "io.caw-box.driver-pid");
        let killed = Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status()
            .unwrap();
        assert!(killed.success(), "kill -KILL {pid}");
        // The sidecar asks for the hand-off with nobody attached; the `wait` takes over.
        stub.release("gone");
        let waited = turn(&["wait", &id, "-o", "json"]).spawn().unwrap();
        all_ok(vec![(waited, "gone".to_string())]);
        newest_stored(2, &mut seen);
    }
}

/// `--keep-warm` on a cluster (issue 31): after a codex turn the session's pod stays
/// Running, idle (no CLI process, no runtime file, no piece of the key anywhere in it); the
/// next turn runs in it by exec (the same pod uid) and recalls; of two racing resumes one
/// runs in it and one exits 2; a turn with another memory limit replaces it by a new one;
/// left idle, that one ends by itself (its idle loop, no caw-box process; its proxy sidecar
/// with it), and the next turn is cold and recalls. Under the default egress (issue 54):
/// the warm pod keeps its proxy sidecar, and each turn's record is its own (the first
/// turn's refusal is not the warm second's).
#[test]
fn kubernetes_warm_turns_exec_in_the_sessions_pod_which_ends_itself() {
    let (lab, endpoint, workspace, data) = codex_on_the_lab();
    let p = CODEX;
    let command = |args: &[&str], prompt: &str| {
        let mut c = turn_cmd(p, data.path(), workspace.path(), &lab, args);
        c.args(["--model", p.model.unwrap()]).arg(prompt);
        c
    };
    let turn = |args: &[&str], prompt: &str| -> Value {
        let out = crate::common::run(command(args, prompt));
        let json = json_of(&out);
        assert_eq!(out.status.code(), Some(0), "{json}\n{}", stderr_of(&out));
        assert_eq!(json["status"], "success", "{json}");
        json
    };
    let recalls = |json: &Value| {
        assert!(
            json["result"].as_str().unwrap_or("").contains("quince-31"),
            "no recall: {json}"
        );
    };

    check("first turn");
    let run = ["run", "--provider", "codex", "--endpoint", &endpoint];
    // Its tool asks a host off the balanced list: refused by the proxy by name, before
    // any connection.
    let first = turn(
        &[&run[..], &["--keep-warm", "60s"]].concat(),
        "Please REMEMBER:quince-31 for later. RUN:curl -s -m 5 http://decoy-31/x",
    );
    let refused = |json: &Value| -> Vec<String> {
        json["egress"]["refused"]
            .as_array()
            .map(|l| {
                l.iter()
                    .map(|e| e["host"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(first["egress"]["policy"], "balanced", "{first}");
    assert_eq!(refused(&first), ["decoy-31"], "{first}");
    let id = first["session_id"].as_str().unwrap().to_string();
    let pod = format!("caw-box-{id}");
    // The pod's uid and phase ("" when it is gone).
    let state = || {
        let out = lab.kubectl(&[
            "get",
            "pod",
            &pod,
            "-o",
            "jsonpath={.metadata.uid} {.status.phase}",
        ]);
        let text = stdout_of(&out);
        let (uid, phase) = text.split_once(' ').unwrap_or(("", ""));
        (uid.to_string(), phase.to_string())
    };
    let (uid, phase) = state();
    assert_eq!(phase, "Running", "no warm pod after the turn");

    check("idle holds nothing");
    let exec =
        |script: &str| lab.kubectl_ok(&["exec", &pod, "-c", "agent", "--", "bash", "-c", script]);
    idle_runs_no_cli(&exec(IDLE_PROCESSES));
    assert_eq!(
        exec("ls -A /run/caw-box").trim(),
        "",
        "runtime files while idle"
    );
    // Everything the agent can write (the root is read-only), and every process: no piece
    // of the key; the session's record there is the scan's control.
    let scan = |patterns: &[String]| {
        let script = r#"grep -rlsaF -D skip -f /dev/stdin /home/agent /workspace /tmp /run/caw-box /proc/[0-9]*/environ /proc/[0-9]*/cmdline; true"#;
        let mut child = Command::new(KUBECTL)
            .env("KUBECONFIG", &lab.kubeconfig)
            .args(["-n", NAMESPACE, "exec", "-i", &pod, "-c", "agent", "--"])
            .args(["bash", "-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl exec");
        let mut stdin = child.stdin.take().unwrap();
        let lines = format!("{}\n", patterns.join("\n"));
        std::io::Write::write_all(&mut stdin, lines.as_bytes()).unwrap();
        drop(stdin);
        let out = wait_with_deadline(child, Duration::from_secs(60));
        assert!(out.status.success(), "scan: {}", stderr_of(&out));
        stdout_of(&out)
    };
    let control = scan(std::slice::from_ref(&id));
    assert!(
        control.contains("/home/agent/.caw-box/session.json"),
        "the scan read nothing: {control}"
    );
    let found = scan(&key_pieces());
    assert_eq!(found.trim(), "", "the key in the idle pod");

    check("warm resume");
    let second = turn(&["resume", &id], "RECALL");
    recalls(&second);
    assert_eq!(
        state(),
        (uid.clone(), "Running".into()),
        "turn 2 ran elsewhere"
    );
    let model_host = endpoint
        .trim_start_matches("http://")
        .split(':')
        .next()
        .unwrap();
    assert!(
        second["egress"]["allowed"]
            .as_array()
            .is_some_and(|l| l.iter().any(|e| e["host"] == model_host)),
        "{second}"
    );
    assert_eq!(
        refused(&second),
        Vec::<String>::new(),
        "turn 1's refusal in turn 2's record: {second}"
    );

    check("racing resumes");
    let spawn = || {
        let mut c = command(&["resume", &id], "HOLD:warm-race RECALL");
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c.spawn().unwrap()
    };
    let (mut a, mut b) = (spawn(), spawn());
    let deadline = Instant::now() + Duration::from_secs(90);
    while a.try_wait().unwrap().is_none()
        && b.try_wait().unwrap().is_none()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    release(&endpoint, "warm-race");
    let outs = [
        wait_with_deadline(a, Duration::from_secs(120)),
        wait_with_deadline(b, Duration::from_secs(120)),
    ];
    let mut codes: Vec<i32> = outs.iter().map(|o| o.status.code().unwrap_or(-1)).collect();
    codes.sort();
    let stderrs: Vec<String> = outs.iter().map(stderr_of).collect();
    assert_eq!(codes, vec![0, 2], "{stderrs:?}");
    let winner = outs.iter().find(|o| o.status.code() == Some(0)).unwrap();
    recalls(&json_of(winner));
    assert_eq!(
        state(),
        (uid.clone(), "Running".into()),
        "the race ran elsewhere"
    );

    check("settings change");
    let third = turn(
        &["resume", &id, "--keep-warm", "4s", "--memory", "700m"],
        "RECALL",
    );
    recalls(&third);
    let (changed, phase) = state();
    assert!(
        changed != uid && phase == "Running",
        "the memory limit changed, the pod did not ({changed} {phase})"
    );
    let pods: Vec<String> = lab
        .caw_objects()
        .into_iter()
        .filter(|o| o.starts_with("pod/"))
        .collect();
    assert_eq!(pods, vec![format!("pod/{pod}")], "the old warm pod stayed");

    check("expiry");
    let deadline = Instant::now() + Duration::from_secs(30);
    while state().1 == "Running" {
        assert!(
            Instant::now() < deadline,
            "the warm pod did not end by itself"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        state(),
        (changed, "Succeeded".into()),
        "it did not end by itself"
    );
    let fourth = turn(&["resume", &id, "--keep-warm", "off"], "RECALL");
    recalls(&fourth);
    assert_eq!(state().0, "", "a turn with --keep-warm off kept its pod");
}
