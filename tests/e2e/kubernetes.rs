//! The Kubernetes backend against a real cluster: ../shared/k8s-lab (etcd, apiserver,
//! scheduler, kubelet over its own containerd). The test brings the lab up, loads the
//! provider images and the stub model's image into it, runs the stub as a pod (addressed by
//! its pod IP: the lab has no DNS and no kube-proxy; pods reach 10.244.7.0/24 only), and
//! takes the lab down when it ends, also on failure. One test drives all four providers in
//! turn: there is one lab per machine.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

const LAB_DIR: &str = "/tmp/k8s-lab";
const KUBECTL: &str = "/var/cache/k8s-lab/bin/kubectl";
const NAMESPACE: &str = "default";

fn lab_script() -> PathBuf {
    repo_root().join("../shared/k8s-lab/k8s-lab")
}

/// The lab while it is up; `k8s-lab down` when dropped (a failed assertion included).
struct Lab {
    kubeconfig: PathBuf,
}

impl Lab {
    fn up() -> Lab {
        let script = lab_script();
        assert!(
            script.exists(),
            "the lab script {} is missing (shared/k8s-lab beside the repo)",
            script.display()
        );
        // Whatever an earlier, killed run left.
        let _ = Command::new(&script).args(["down", LAB_DIR]).output();
        let lab = Lab {
            kubeconfig: PathBuf::from(LAB_DIR).join("kubeconfig"),
        };
        let out = Command::new(&script)
            .args(["up", LAB_DIR])
            .output()
            .expect("run k8s-lab up");
        assert!(
            out.status.success(),
            "k8s-lab up failed: {}\n{}",
            stdout_of(&out),
            stderr_of(&out)
        );
        lab
    }

    fn load_images(&self, images: &[&str]) {
        let out = Command::new(lab_script())
            .arg("load-image")
            .args(images)
            .output()
            .expect("run k8s-lab load-image");
        assert!(
            out.status.success(),
            "k8s-lab load-image failed: {}",
            stderr_of(&out)
        );
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
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "stub-model",
                "labels": {"app.kubernetes.io/managed-by": "caw-box-e2e", "io.caw-box.test": "e2e"}
            },
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": false,
                "containers": [{
                    "name": "stub",
                    "image": STUB_IMAGE,
                    "imagePullPolicy": "Never",
                    "env": [{"name": "STUB_EXPECT_KEY", "value": TEST_KEY}]
                }]
            }
        });
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), pod.to_string()).unwrap();
        self.kubectl_ok(&["apply", "-f", &file.path().to_string_lossy()]);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let out = self.kubectl(&["get", "pod", "stub-model", "-o", "json"]);
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
                stdout_of(&self.kubectl(&["describe", "pod", "stub-model"]))
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let out = Command::new(lab_script()).args(["down", LAB_DIR]).output();
        if let Ok(out) = out {
            if !out.status.success() {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "k8s-lab down failed: {}",
                    stderr_of(&out)
                );
            }
        }
    }
}

fn caw_k8s(rig_data: &std::path::Path, workspace: &std::path::Path, lab: &Lab) -> Command {
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
        .stdin(std::process::Stdio::null())
        .args(["--backend", "kubernetes", "--namespace", NAMESPACE]);
    c
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
        let out = Command::new(lab_script())
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
        STUB_IMAGE,
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
        sessions.push((p, id, handle));
        // The host's caw-box data directory goes with `data`.
    }

    check("k8s-lab restart");
    lab.restart();
    let endpoint = lab.restart_stub();

    for (p, _, handle) in &sessions {
        // A fresh data directory: the handle alone resumes, and the CLI recalls turn 1.
        check(&format!("{}: resume from the handle", p.name));
        let data = tempfile::tempdir().unwrap();
        // The stub's pod has a new address after the restart.
        let mut resume = turn_cmd(
            *p,
            data.path(),
            workspace.path(),
            &lab,
            &["resume", handle, "--endpoint", &endpoint],
        );
        resume.arg("RECALL");
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
            "{}: the Docker backend refuses the handle",
            p.name
        ));
        let mut docker = Command::new(env!("CARGO_BIN_EXE_caw-box"));
        docker
            .env("CAW_BOX_DATA_DIR", data.path())
            .env_remove("CAW_BOX_BACKEND")
            .args(["show", handle]);
        let out = crate::common::run(docker);
        assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
        assert!(
            stderr_of(&out).contains("kubernetes backend"),
            "{}",
            stderr_of(&out)
        );
    }

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
        assert_eq!(row["turns"], 2, "{row}");
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
    let mut rm = caw_k8s(data.path(), workspace.path(), &lab);
    rm.arg("rm");
    for (_, id, _) in &sessions {
        rm.arg(id);
    }
    let out = crate::common::run(rm);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = lab.caw_objects();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "rm left {left:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(lab);
}
