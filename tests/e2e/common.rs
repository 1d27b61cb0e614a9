//! The end-to-end rig: each test gets an internal Docker network of its own (no way out), a
//! stub model container on it, a private caw-box data directory, and a label that every
//! object of the test carries, so everything is removed by label when the test ends, also
//! when it fails.
//!
//! The vendor CLIs under test run only on that internal network, with the stub as their
//! model: test traffic never leaves this machine's containers (TESTING.md, network rule).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, ListNetworksOptions, ListVolumesOptions,
    LogsOptions, RemoveContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use serde_json::Value;

pub const STUB_IMAGE: &str = "caw-box-test/stub-model:latest";

/// The stub's image: `CAW_BOX_TEST_STUB_IMAGE` names another tag (a stub built from a branch,
/// beside the shared one), else [`STUB_IMAGE`].
pub fn stub_image() -> String {
    std::env::var("CAW_BOX_TEST_STUB_IMAGE")
        .ok()
        .filter(|i| !i.trim().is_empty())
        .unwrap_or_else(|| STUB_IMAGE.to_string())
}
pub const TEST_KEY: &str = "sk-test-caw-box-0123456789";
pub const TEST_LABEL: &str = "io.caw-box.test-run";

/// The `CAW_BOX_*` variables that set defaults of `run` (`CAW_BOX_LABELS` the rig sets).
const CONFIG_VARS: [&str; 20] = [
    "CAW_BOX_PROVIDER",
    "CAW_BOX_MODEL",
    "CAW_BOX_IMAGE",
    "CAW_BOX_ENDPOINT",
    "CAW_BOX_NETWORK",
    "CAW_BOX_ALLOW_HOST",
    "CAW_BOX_MEMORY",
    "CAW_BOX_CPUS",
    "CAW_BOX_PIDS_LIMIT",
    "CAW_BOX_TIMEOUT",
    "CAW_BOX_IDLE_TIMEOUT",
    "CAW_BOX_CONNECT_TIMEOUT",
    "CAW_BOX_WORKSPACE_MODE",
    "CAW_BOX_GROUP",
    "CAW_BOX_SYSTEM_PROMPT",
    "CAW_BOX_APPEND_SYSTEM_PROMPT",
    "CAW_BOX_EFFORT",
    "CAW_BOX_RUNTIME",
    "CAW_BOX_PROTECT",
    "CAW_BOX_UNPROTECT",
];

/// A provider as the tests drive it: its name, its key variable, a model the stub accepts.
#[derive(Debug, Clone, Copy)]
pub struct P {
    pub name: &'static str,
    pub key_var: &'static str,
    pub model: Option<&'static str>,
}

pub const CLAUDE: P = P {
    name: "claude_code",
    key_var: "ANTHROPIC_API_KEY",
    model: None,
};
pub const CODEX: P = P {
    name: "codex",
    key_var: "OPENAI_API_KEY",
    model: Some("gpt-5.5"),
};
pub const OPENCODE: P = P {
    name: "opencode",
    key_var: "OPENAI_API_KEY",
    model: Some("stub-model"),
};
pub const GEMINI: P = P {
    name: "gemini",
    key_var: "GEMINI_API_KEY",
    model: Some("gemini-2.5-flash"),
};
pub const ALL: [P; 4] = [CLAUDE, CODEX, OPENCODE, GEMINI];

/// Creates a network as caw-box does: Podman's subnet check lists the host's interface
/// addresses and fails ("route ip+net: no such network interface") when another
/// container's veth goes mid-listing; nothing was made, so it is asked again.
pub async fn create_network(
    docker: &Docker,
    request: NetworkCreateRequest,
) -> Result<(), bollard::errors::Error> {
    let mut attempts = 0;
    loop {
        match docker.create_network(request.clone()).await {
            Err(bollard::errors::Error::DockerResponseServerError { message, .. })
                if attempts < 20 && message.contains("no such network interface") =>
            {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other.map(|_| ()),
        }
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

pub fn docker() -> Docker {
    Docker::connect_with_defaults()
        .expect("docker client")
        .with_timeout(Duration::from_secs(600))
}

/// One test's private world.
pub struct Rig {
    pub rt: tokio::runtime::Runtime,
    pub docker: Docker,
    pub run_id: String,
    pub network: String,
    pub stub: String,
    pub data_dir: tempfile::TempDir,
    pub workspace: tempfile::TempDir,
}

impl Rig {
    pub fn new(test: &str) -> Rig {
        Rig::with_stub_env(test, &[])
    }

    /// A rig whose stub gets extra environment (e.g. `STUB_MODELS=...`).
    pub fn with_stub_env(test: &str, stub_env: &[String]) -> Rig {
        Rig::with_stub_aliases(test, stub_env, &[])
    }

    /// A rig whose stub also answers, on the test's network, to `aliases` (a vendor's host
    /// names), and may listen on a privileged port (443, for `STUB_TLS_CERT`).
    pub fn with_stub_aliases(test: &str, stub_env: &[String], aliases: &[&str]) -> Rig {
        let rt = runtime();
        let docker = rt.block_on(async { docker().negotiate_version().await.expect("docker") });
        let run_id = format!(
            "{}-{}",
            test.replace('_', "-"),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let network = format!("cbt-{run_id}");
        let stub = format!("stub-{run_id}");
        let rig = Rig {
            rt,
            docker,
            run_id,
            network,
            stub,
            data_dir: tempfile::tempdir().expect("tempdir"),
            workspace: tempfile::tempdir().expect("tempdir"),
        };
        // The workspace is the images' user's, as a user's own checkout: caw-box, run as
        // root here, runs the agent as the workspace's owner, uid 1000.
        std::os::unix::fs::chown(rig.workspace.path(), Some(1000), Some(1000)).unwrap();
        rig.rt
            .block_on(rig.start_network_and_stub(stub_env, aliases));
        rig
    }

    fn labels(&self) -> HashMap<String, String> {
        HashMap::from([
            (TEST_LABEL.to_string(), self.run_id.clone()),
            ("io.caw-box.test".to_string(), "e2e".to_string()),
        ])
    }

    async fn start_network_and_stub(&self, extra_env: &[String], aliases: &[&str]) {
        create_network(
            &self.docker,
            NetworkCreateRequest {
                name: self.network.clone(),
                internal: Some(true),
                labels: Some(self.labels()),
                ..Default::default()
            },
        )
        .await
        .expect("create the test's internal network");
        let mut env = vec![format!("STUB_EXPECT_KEY={TEST_KEY}")];
        env.extend_from_slice(extra_env);
        self.start_stub_image_as(&self.stub, env, aliases).await;
    }

    /// A container of the stub image named `name` on the test's network.
    async fn start_stub_image(&self, name: &str, env: Vec<String>) {
        self.start_stub_image_as(name, env, &[]).await
    }

    /// [`Rig::start_stub_image`], also known as `aliases` on the network.
    async fn start_stub_image_as(&self, name: &str, env: Vec<String>, aliases: &[&str]) {
        let networking = (!aliases.is_empty()).then(|| bollard::models::NetworkingConfig {
            endpoints_config: Some(HashMap::from([(
                self.network.clone(),
                bollard::models::EndpointSettings {
                    aliases: Some(aliases.iter().map(|a| a.to_string()).collect()),
                    ..Default::default()
                },
            )])),
        });
        let sysctls = (!aliases.is_empty()).then(|| {
            HashMap::from([(
                "net.ipv4.ip_unprivileged_port_start".to_string(),
                "0".to_string(),
            )])
        });
        self.docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.to_string()),
                    ..Default::default()
                }),
                ContainerCreateBody {
                    image: Some(stub_image()),
                    env: Some(env),
                    labels: Some(self.labels()),
                    host_config: Some(HostConfig {
                        network_mode: Some(self.network.clone()),
                        sysctls,
                        ..Default::default()
                    }),
                    networking_config: networking,
                    ..Default::default()
                },
            )
            .await
            .expect("create a stub container (built by scripts/stub-image.sh)");
        self.docker
            .start_container(name, None)
            .await
            .expect("start a stub container");
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}:8080", self.stub)
    }

    /// A `caw-box` command with this test's data dir and labels. Its images are the
    /// default `caw-box/*`, or those of `CAW_BOX_E2E_IMAGE_REPO` (`make drift` runs tests
    /// against images of the newest CLIs that way).
    pub fn caw(&self) -> Command {
        self.caw_env(env!("CARGO_BIN_EXE_caw-box"))
    }

    /// `program` with the environment `caw()` gives caw-box: for another caw-box binary (an
    /// installed one) or a script that calls caw-box (the CI templates).
    pub fn caw_env(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("CAW_BOX_DATA_DIR", self.data_dir.path())
            .env("CAW_BOX_LABELS", format!("{TEST_LABEL}={}", self.run_id))
            .env_remove("CAW_BOX_IMAGE_REPO")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_AUTH_TOKEN")
            .env_remove("CLAUDE_CODE_OAUTH_TOKEN")
            .env_remove("OPENAI_API_KEY")
            .env_remove("CODEX_API_KEY")
            .env_remove("OPENCODE_AUTH_CONTENT")
            .env_remove("GEMINI_API_KEY")
            .env_remove("GOOGLE_API_KEY")
            .env_remove("CAW_BOX_CREDENTIALS")
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("CODEX_HOME")
            .env_remove("XDG_DATA_HOME")
            .env_remove("GEMINI_CLI_HOME")
            // No user's config file or CAW_BOX_* setting shapes a test's sessions.
            .env(
                "CAW_BOX_CONFIG",
                self.data_dir.path().join("no-user-config.toml"),
            )
            .env_remove("XDG_CONFIG_HOME")
            .current_dir(self.workspace.path())
            .stdin(Stdio::null());
        for var in CONFIG_VARS {
            c.env_remove(var);
        }
        if let Some(repo) = std::env::var_os("CAW_BOX_E2E_IMAGE_REPO") {
            c.env("CAW_BOX_IMAGE_REPO", repo);
        }
        c
    }

    /// A second server on the test's network (the stub image, not the model's stub), for
    /// an allowlist not to name; returns its name.
    pub fn start_other_server(&self) -> String {
        self.start_server_named("other")
    }

    /// Like [`Rig::start_other_server`], for a test that needs more than one: the server is
    /// `<what>-<run id>`.
    pub fn start_server_named(&self, what: &str) -> String {
        let name = format!("{what}-{}", self.run_id);
        self.rt.block_on(self.start_stub_image(&name, Vec::new()));
        name
    }

    /// A stand-in for host `alias` (a name such as `pypi.org`) on the test's network: a
    /// stub-image container answering on port 80 under that name; returns its container's
    /// name (for [`Rig::requests_of`]).
    pub fn start_stand_in(&self, alias: &str) -> String {
        let name = format!("{}-{}", alias.replace('.', "-"), self.run_id);
        self.rt
            .block_on(self.start_stub_image_as(&name, vec!["PORT=80".to_string()], &[alias]));
        name
    }

    /// The record of every request server `name` (a stub-image container of this test) got.
    pub fn requests_of(&self, name: &str) -> Vec<Value> {
        self.rt.block_on(async {
            let mut logs = self.docker.logs(
                name,
                Some(LogsOptions {
                    stdout: true,
                    ..Default::default()
                }),
            );
            let mut text = String::new();
            while let Some(Ok(chunk)) = logs.next().await {
                text.push_str(&chunk.to_string());
            }
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v["stub"] == "request")
                .collect()
        })
    }

    /// Resumes codex session `id` (started with `--allow-host <stub>:8080`) with a probe: the
    /// stub answers through the proxy, `other` is refused by it, and nothing gets out
    /// directly, and the refusal is one of the turn's events. (A bounded direct attempt:
    /// codex's shell tool returns what a command printed after 10 s, and on a busy machine a
    /// name lookup on an internal network can take longer; CI 25 failed so.)
    pub fn assert_only_the_stub_is_reachable(&self, id: &str, other: &str) {
        let probe = format!(
            "RUN:p=${{HTTPS_PROXY#http://}}; p=${{p%:*}}; for h in {stub} {other}; do exec 3<>/dev/tcp/$p/3128; printf 'GET http://%s:8080/_stub/health HTTP/1.0\\r\\n\\r\\n' $h >&3; head -1 <&3 | tr -d '\\r'; exec 3<&-; done; timeout 3 bash -c 'exec 3<>/dev/tcp/{stub}/8080' 2>/dev/null && echo direct-open || echo direct-blocked",
            stub = self.stub
        );
        let mut cmd = self.resume_cmd(CODEX, id, &probe, &[]);
        cmd.args(["-o", "stream-json"]);
        let out = run(cmd);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let events: Vec<Value> = stdout_of(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let answer = events.last().unwrap()["result"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            answer.contains("HTTP/1.1 200"),
            "the allowed host did not answer: {answer}"
        );
        assert!(
            answer.contains("HTTP/1.1 403"),
            "the other host was not refused: {answer}"
        );
        assert!(
            answer.contains("direct-blocked"),
            "a direct connection got out: {answer}"
        );
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "egress_refused" && e["host"] == other && e["port"] == 8080),
            "no refusal event: {events:#?}"
        );
        // The turn's record: the stub reached, with bytes both ways; the other refused.
        let egress = &events.last().unwrap()["egress"];
        let host = |list: &str, h: &str| {
            egress[list]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["host"] == h && e["port"] == 8080)
                .cloned()
        };
        let stub = host("allowed", &self.stub).unwrap_or_else(|| panic!("{egress:#}"));
        assert!(
            stub["connections"].as_u64() >= Some(1)
                && stub["bytes_out"].as_u64() > Some(0)
                && stub["bytes_in"].as_u64() > Some(0),
            "{egress:#}"
        );
        let refused = host("refused", other).unwrap_or_else(|| panic!("{egress:#}"));
        assert!(refused["connections"].as_u64() >= Some(1), "{egress:#}");
    }

    /// The mounts of a container, as Docker reports them.
    pub fn mounts_of(&self, container: &str) -> Vec<bollard::models::MountPoint> {
        self.rt
            .block_on(self.docker.inspect_container(container, None))
            .unwrap()
            .mounts
            .unwrap_or_default()
    }

    /// Runs `caw-box args` of this rig to completion.
    pub fn caw_run(&self, args: &[&str]) -> Output {
        let mut c = self.caw();
        c.args(args);
        run(c)
    }

    /// `caw-box run` for `p` against this test's stub, with any extra args.
    pub fn run_cmd(&self, p: P, prompt: &str, extra: &[&str]) -> Command {
        let mut c = self.caw();
        c.args(["run", "--provider", p.name, "--network", &self.network])
            .args(["--endpoint", &self.endpoint()])
            .args(["--env", &format!("{}={TEST_KEY}", p.key_var)]);
        if let Some(m) = p.model {
            c.args(["--model", m]);
        }
        c.args(extra).arg(prompt);
        c
    }

    /// `caw-box run` for `p` with no key on the command line: credentials must come from
    /// the auth store.
    pub fn run_cmd_stored_key(&self, p: P, prompt: &str, extra: &[&str]) -> Command {
        let mut c = self.caw();
        c.args(["run", "--provider", p.name, "--network", &self.network])
            .args(["--endpoint", &self.endpoint()]);
        if let Some(m) = p.model {
            c.args(["--model", m]);
        }
        c.args(extra).arg(prompt);
        c
    }

    pub fn resume_cmd(&self, p: P, target: &str, prompt: &str, extra: &[&str]) -> Command {
        let mut c = self.caw();
        c.args(["resume", target])
            .args(["--env", &format!("{}={TEST_KEY}", p.key_var)]);
        c.args(extra).arg(prompt);
        c
    }

    /// Starts one detached turn (`run -d -o json`, brokered with the stored key) per prompt,
    /// each its own caw-box process, all at once: what each printed, in order.
    pub fn run_detached_together(&self, p: P, prompts: &[String], extra: &[&str]) -> Vec<Value> {
        let mut args = vec!["-d", "-o", "json"];
        args.extend_from_slice(extra);
        let children: Vec<_> = prompts
            .iter()
            .map(|prompt| {
                let mut c = self.run_cmd_stored_key(p, prompt, &args);
                c.stdout(Stdio::piped()).stderr(Stdio::piped());
                c.spawn().unwrap()
            })
            .collect();
        children
            .into_iter()
            .map(|child| {
                let out = wait_with_deadline(child, Duration::from_secs(120));
                assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
                serde_json::from_str(stdout_of(&out).trim()).unwrap()
            })
            .collect()
    }

    /// Runs a turn with `-o json` and returns (exit code, the JSON object, stderr).
    pub fn json_turn(&self, mut cmd: Command) -> (i32, Value, String) {
        cmd.args(["-o", "json"]);
        let out = run(cmd);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!("-o json printed no JSON object ({e}):\nstdout: {stdout}\nstderr: {stderr}")
        });
        (out.status.code().unwrap_or(-1), json, stderr)
    }

    /// The stub's record of every request it got.
    pub fn stub_requests(&self) -> Vec<Value> {
        self.requests_of(&self.stub)
    }

    /// The stub's own endpoints, by an exec in its container: that works on any engine the
    /// rig runs on (Podman's service too), whether or not the host reaches container
    /// addresses.
    pub fn stub_control(&self) -> StubControl {
        StubControl::Exec(self.stub.clone())
    }

    /// Releases the stub's `HOLD:<name>`: the held turn gets its answer (a release before
    /// the request counts too).
    pub fn stub_release(&self, name: &str) {
        self.stub_control().release(name);
    }

    /// Waits until a request holds on `HOLD:<name>` at the stub: the CLI is mid-turn.
    pub fn wait_held(&self, name: &str) {
        self.stub_control().wait_held(name, 1, HELD_WITHIN);
    }

    /// The daemon's events of container `id` from now on, as they come. (A look back at
    /// its events later would read a ring of the daemon's last 256, which the tests beside
    /// this one may have filled in the meantime.)
    pub fn watch_events(&self, id: &str) -> EventWatch {
        let filters = HashMap::from([("container".to_string(), vec![id.to_string()])]);
        EventWatch::start(self.docker.clone(), filters)
    }

    /// The events of every container of this test (its label), from now on.
    pub fn watch_test_events(&self) -> EventWatch {
        let filters = HashMap::from([
            ("type".to_string(), vec!["container".to_string()]),
            (
                "label".to_string(),
                vec![format!("{TEST_LABEL}={}", self.run_id)],
            ),
        ]);
        EventWatch::start(self.docker.clone(), filters)
    }

    /// Containers of this test that caw-box made (turns, probes), as they are now: with
    /// what finishes behind a turn ([`Self::caw_containers`]).
    pub fn caw_containers_now(&self) -> Vec<String> {
        self.rt.block_on(async {
            self.docker
                .list_containers(Some(ListContainersOptions {
                    all: true,
                    filters: Some(HashMap::from([(
                        "label".to_string(),
                        vec![
                            format!("{TEST_LABEL}={}", self.run_id),
                            "io.caw-box.managed=true".to_string(),
                        ],
                    )])),
                    ..Default::default()
                }))
                .await
                .unwrap()
                .into_iter()
                .flat_map(|c| c.names.unwrap_or_default())
                // A shared egress proxy stays for the next turns and idles out on its own
                // (`egress::shared_proxies_idle_out`).
                .filter(|n| !n.trim_start_matches('/').starts_with("caw-box-proxy-"))
                .collect()
        })
    }

    /// Containers of this test that caw-box made (turns, probes), once nothing finishes
    /// behind a turn: a cold turn's container that finishes its checkpoint and exit after
    /// its turn ended (renamed `caw-box-probe-<id>-checkpoint`, removed by the `caw-box
    /// __settle` the turn started), a warm turn's checkpoint helper (the same name; it
    /// removes itself), a pool's box that went after its turn (killed; the engine removes
    /// it). Each goes within 20 s, or this fails.
    pub fn caw_containers(&self) -> Vec<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let ls = self.caw_containers_now();
            if !ls
                .iter()
                .any(|n| n.ends_with("-checkpoint") || n.ends_with("-going"))
            {
                return ls;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a checkpoint helper stayed: {ls:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Whether the rig's engine is Podman's service (its Docker-compatible API), where
    /// caw-box keeps no checkpoints yet.
    pub fn is_podman(&self) -> bool {
        self.rt
            .block_on(self.docker.version())
            .unwrap()
            .components
            .unwrap_or_default()
            .iter()
            .any(|c| c.name.starts_with("Podman"))
    }

    /// The volumes of this test's sessions: not a container's runtime scratch (role
    /// `runtime`), which goes with its container (a running turn has one).
    pub fn caw_volumes(&self) -> Vec<String> {
        self.rt.block_on(async {
            self.docker
                .list_volumes(Some(ListVolumesOptions {
                    filters: Some(HashMap::from([(
                        "label".to_string(),
                        vec![format!("{TEST_LABEL}={}", self.run_id)],
                    )])),
                }))
                .await
                .unwrap()
                .volumes
                .unwrap_or_default()
                .into_iter()
                .filter(|v| v.labels.get("io.caw-box.role").map(String::as_str) != Some("runtime"))
                .map(|v| v.name)
                .collect()
        })
    }

    /// Waits until a running turn container of `session` exists.
    pub fn wait_for_running_turn(&self, session_prefix: Option<&str>, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self.rt.block_on(async {
                self.docker
                    .list_containers(Some(ListContainersOptions {
                        all: false,
                        filters: Some(HashMap::from([(
                            "label".to_string(),
                            vec![
                                format!("{TEST_LABEL}={}", self.run_id),
                                "io.caw-box.role=turn".to_string(),
                            ],
                        )])),
                        ..Default::default()
                    }))
                    .await
                    .unwrap()
            });
            // Not the container of an earlier turn that finishes behind it (renamed).
            let finishing = |c: &bollard::models::ContainerSummary| {
                c.names.iter().flatten().any(|n| n.ends_with("-checkpoint"))
            };
            if let Some(c) = found.into_iter().filter(|c| !finishing(c)).find(|c| {
                session_prefix.is_none_or(|p| {
                    c.labels
                        .as_ref()
                        .and_then(|l| l.get("io.caw-box.session"))
                        .is_some_and(|s| s.starts_with(p))
                })
            }) {
                return c
                    .names
                    .unwrap_or_default()
                    .join("")
                    .trim_start_matches('/')
                    .to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no turn container started in {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The id of container `name`.
    pub fn exec_inspect_id(&self, name: &str) -> String {
        self.rt.block_on(async {
            self.docker
                .inspect_container(name, None)
                .await
                .expect("inspect")
                .id
                .unwrap_or_default()
        })
    }

    /// Runs `cmd` in the running `container` (as its user) to its end: its stdout.
    pub fn exec(&self, container: &str, cmd: &[&str]) -> String {
        self.rt.block_on(exec_stdout(&self.docker, container, cmd))
    }

    /// Runs a short container of the test's own (labelled, removed afterwards) to its end:
    /// (exit code, stdout, stderr).
    pub fn run_container(&self, mut body: ContainerCreateBody) -> (i64, String, String) {
        body.labels
            .get_or_insert_with(HashMap::new)
            .insert(TEST_LABEL.to_string(), self.run_id.clone());
        let name = format!("t-{}-{}", self.run_id, uuid::Uuid::new_v4().simple());
        self.rt.block_on(async {
            self.docker
                .create_container(
                    Some(CreateContainerOptions {
                        name: Some(name.clone()),
                        ..Default::default()
                    }),
                    body,
                )
                .await
                .unwrap();
            self.docker.start_container(&name, None).await.unwrap();
            let mut wait = self.docker.wait_container(&name, None);
            let code = match wait.next().await {
                Some(Ok(r)) => r.status_code,
                Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
                other => panic!("wait: {other:?}"),
            };
            let mut logs = self.docker.logs(
                &name,
                Some(LogsOptions {
                    stdout: true,
                    stderr: true,
                    ..Default::default()
                }),
            );
            let (mut out, mut err) = (String::new(), String::new());
            while let Some(Ok(chunk)) = logs.next().await {
                match chunk {
                    bollard::container::LogOutput::StdErr { message } => {
                        err.push_str(&String::from_utf8_lossy(&message))
                    }
                    other => out.push_str(&other.to_string()),
                }
            }
            let _ = self
                .docker
                .remove_container(
                    &name,
                    Some(RemoveContainerOptions {
                        force: true,
                        v: true,
                        ..Default::default()
                    }),
                )
                .await;
            (code, out, err)
        })
    }

    /// Removes every object carrying this test's label.
    pub fn cleanup(&self) {
        let label = format!("{TEST_LABEL}={}", self.run_id);
        self.rt.block_on(async {
            let filters = HashMap::from([("label".to_string(), vec![label.clone()])]);
            if let Ok(cs) = self
                .docker
                .list_containers(Some(ListContainersOptions {
                    all: true,
                    filters: Some(filters.clone()),
                    ..Default::default()
                }))
                .await
            {
                for c in cs {
                    if let Some(id) = c.id {
                        let _ = self
                            .docker
                            .remove_container(
                                &id,
                                // With its anonymous volumes (a turn's runtime scratch).
                                Some(RemoveContainerOptions {
                                    force: true,
                                    v: true,
                                    ..Default::default()
                                }),
                            )
                            .await;
                    }
                }
            }
            if let Ok(vs) = self
                .docker
                .list_volumes(Some(ListVolumesOptions {
                    filters: Some(filters.clone()),
                }))
                .await
            {
                for v in vs.volumes.unwrap_or_default() {
                    let _ = self
                        .docker
                        .remove_volume(
                            &v.name,
                            None::<bollard::query_parameters::RemoveVolumeOptions>,
                        )
                        .await;
                }
            }
            if let Ok(ns) = self
                .docker
                .list_networks(Some(ListNetworksOptions {
                    filters: Some(filters),
                }))
                .await
            {
                for n in ns {
                    if let Some(id) = n.id {
                        let _ = self.docker.remove_network(&id).await;
                    }
                }
            }
        });
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// How long a test waits for a turn to reach the stub's `HOLD:` (a CLI starting on a busy
/// machine, parallel turns), before it fails.
pub const HELD_WITHIN: Duration = Duration::from_secs(180);

/// How a test reaches a stub model's own endpoints (`/_stub/...`: holds, OAuth state), the
/// stub's container on the test's internal network or a stub pod of the Kubernetes lab.
#[derive(Debug, Clone)]
pub enum StubControl {
    /// An exec of node's `fetch` to 127.0.0.1:8080 in this container (the stub image has
    /// node), through the Docker API: for a stub on an internal network.
    Exec(String),
    /// Plain HTTP from the host to this base URL (`http://<pod IP>:8080`): a Kubernetes
    /// stub pod, which the host reaches by its IP.
    Http(String),
}

impl StubControl {
    /// `method path` at the stub: its status and body.
    /// A `GET` (it changes nothing) is asked again, up to twice, when the stub could not be
    /// reached or did not answer: a pod's network can drop one connection under load (a
    /// Kubernetes test once saw `/_stub/oauth` time out, in CI beside the main stage).
    pub fn call(&self, method: &str, path: &str) -> (u16, String) {
        let mut tries = if method == "GET" { 3 } else { 1 };
        loop {
            tries -= 1;
            match self.try_call(method, path) {
                Ok(answer) => return answer,
                Err(_) if tries > 0 => std::thread::sleep(Duration::from_secs(1)),
                Err(e) => panic!("{method} {path}: {e}"),
            }
        }
    }

    /// [`StubControl::call`], with a failure to reach the stub over HTTP as an error (the
    /// caller may try again: a pod's network can drop one connection under load).
    fn try_call(&self, method: &str, path: &str) -> Result<(u16, String), String> {
        Ok(match self {
            StubControl::Exec(container) => {
                const FETCH: &str = "const [m, p] = process.argv.slice(1); \
                    fetch('http://127.0.0.1:8080' + p, {method: m}) \
                    .then(async r => console.log(r.status + '\\n' + await r.text())) \
                    .catch(e => console.log('0\\n' + e))";
                // Through the Docker API, as the rig's own calls (also Podman's service).
                let text = runtime().block_on(async {
                    let docker = docker().negotiate_version().await.expect("docker");
                    let cmd = ["node", "-e", FETCH, method, path];
                    exec_stdout(&docker, container, &cmd).await
                });
                let (status, body) = text.split_once('\n').unwrap_or((text.trim(), ""));
                let status = status.trim().parse().unwrap_or_else(|_| {
                    panic!("{method} {path} in {container}: {text:?} (container gone?)")
                });
                (status, body.trim_end().to_string())
            }
            StubControl::Http(base) => return try_http_call(base, method, path),
        })
    }

    /// [`StubControl::call`] that must answer 200 with JSON.
    pub fn json(&self, method: &str, path: &str) -> Value {
        let (status, body) = self.call(method, path);
        assert_eq!(status, 200, "{method} {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{method} {path}: {e}: {body}"))
    }

    /// Releases `HOLD:<name>` for good; how many requests it let go.
    pub fn release(&self, name: &str) -> u64 {
        let released = self.json("POST", &format!("/_stub/release/{name}"));
        released["waiting"].as_u64().unwrap_or(0)
    }

    /// The requests held now, per name, and the names released.
    pub fn holds(&self) -> Value {
        self.json("GET", "/_stub/holds")
    }

    /// The names held at the stub now, with how many requests each holds.
    pub fn held(&self) -> Vec<(String, u64)> {
        let holds = self.holds();
        holds["waiting"]
            .as_object()
            .map(|w| {
                w.iter()
                    .filter_map(|(k, v)| v.as_u64().filter(|n| *n > 0).map(|n| (k.clone(), n)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until at least `at_least` requests hold on `HOLD:<name>` (that many turns
    /// mid-request); fails the test after `limit`.
    pub fn wait_held(&self, name: &str, at_least: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            // A long poll, in pieces well under any client's own timeout.
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = left.min(Duration::from_secs(30)).as_secs_f64();
            let path = format!("/_stub/holds/{name}?min={at_least}&wait={wait:.1}");
            match self.try_call("GET", &path) {
                Ok((200, body)) => {
                    let status: Value = serde_json::from_str(&body)
                        .unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"));
                    if status["waiting"].as_u64().unwrap_or(0) >= at_least as u64 {
                        return;
                    }
                }
                Ok((code, body)) => panic!("GET {path}: {code} {body}"),
                // One long poll lost (seen once with a pod's stub, under load): ask again,
                // until the deadline says the holds never came.
                Err(e) => {
                    #[allow(clippy::print_stderr)] // the test's own captured stderr
                    {
                        eprintln!("stub control: {e}; asking again");
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "fewer than {at_least} requests held on {name} after {limit:?}: {:?}",
                self.try_call("GET", "/_stub/holds")
            );
        }
    }
}

/// Runs `cmd` in the running `container` (as its user) to its end: its stdout.
pub async fn exec_stdout(docker: &Docker, container: &str, cmd: &[&str]) -> String {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(cmd.to_vec()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("create an exec");
    let mut stdout = Vec::new();
    if let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(&exec.id, None)
        .await
        .expect("start an exec")
    {
        while let Some(chunk) = output.next().await {
            if let Ok(bollard::container::LogOutput::StdOut { message }) = chunk {
                stdout.extend_from_slice(&message);
            }
        }
    }
    String::from_utf8_lossy(&stdout).into_owned()
}

/// One HTTP/1.0 request from the host to `base` (`http://host:port`): status and body.
fn try_http_call(base: &str, method: &str, path: &str) -> Result<(u16, String), String> {
    use std::io::{Read, Write};
    let authority = base
        .strip_prefix("http://")
        .unwrap_or(base)
        .trim_end_matches('/');
    let address = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("not an address: {base}"));
    let io = |e: std::io::Error| format!("{method} {base}{path}: {e}");
    let mut stream =
        std::net::TcpStream::connect_timeout(&address, Duration::from_secs(10)).map_err(io)?;
    // A long poll answers within its `wait` (at most 30 s here).
    stream
        .set_read_timeout(Some(Duration::from_secs(45)))
        .map_err(io)?;
    let request =
        format!("{method} {path} HTTP/1.0\r\nhost: {authority}\r\ncontent-length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(io)?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {base}{path}: no HTTP answer: {raw}"));
    Ok((status, body.to_string()))
}

/// A warm container's (pod's) processes' command lines, as a bash script run in it.
pub const IDLE_PROCESSES: &str = "cat /proc/[0-9]*/cmdline | tr '\\0' ' '";

/// Asserts that `procs` (what [`IDLE_PROCESSES`] printed) is an idle warm container's: its
/// idle loop runs (the scan read something), no codex CLI process does.
pub fn idle_runs_no_cli(procs: &str) {
    assert!(
        procs.contains(".caw-box-warm"),
        "the scan of processes read nothing: {procs}"
    );
    assert!(
        !procs.contains("codex"),
        "a CLI process while idle: {procs}"
    );
}

/// Marks the start of one check of a test that makes several in a row, on stderr: when the
/// test fails, the last mark names the check that failed (scripts/drift.sh reads it).
#[allow(clippy::print_stderr)] // the test's own captured stderr, shown when it fails
pub fn check(name: &str) {
    eprintln!("e2e check: {name}");
}

/// Runs a command to completion, with a generous bound so a hung CLI fails the test
/// instead of hanging CI.
pub fn run(mut cmd: Command) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn caw-box");
    wait_with_deadline(child, Duration::from_secs(300))
}

/// Two racing turns held at the stub's `hold`: waits until one of them has returned (the
/// other cannot start after the held one ended; both running would return only once
/// released), releases the hold, and gives both outputs.
pub fn race_held(
    rig: &Rig,
    hold: &str,
    mut a: std::process::Child,
    mut b: std::process::Child,
) -> [Output; 2] {
    let deadline = Instant::now() + Duration::from_secs(90);
    while a.try_wait().unwrap().is_none()
        && b.try_wait().unwrap().is_none()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    rig.stub_release(hold);
    [
        wait_with_deadline(a, Duration::from_secs(120)),
        wait_with_deadline(b, Duration::from_secs(120)),
    ]
}

pub fn wait_with_deadline(mut child: std::process::Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "command still running after {limit:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `git args` in `dir` (with an identity and `main` for new repositories; also in a
/// repository of another user, as the agent's uid 1000), asserting success; returns stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(["-c", "safe.directory=*"])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

pub fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The rig's dockerd PID file, when the test setup started the daemon.
pub fn rig_pid_file() -> Option<PathBuf> {
    let path = std::env::var_os("CAW_BOX_RIG_PID_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/caw-box-rig/dockerd.pid"));
    path.exists().then_some(path)
}

pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where a session keeps its own record in its state volume (under HOME, at /h in
/// [`in_volume`]): it always holds the session's id, the positive control of every scan of
/// a session's volume.
pub const SESSION_RECORD: &str = "/h/.caw-box/session.json";

/// Every file in a session's state volume that contains `needle` (read as root). The same
/// grep must find the session's id in its record ([`SESSION_RECORD`]): a scan that finds
/// nothing proves it read the session's volume, not an empty one.
pub fn volume_files_containing(rig: &Rig, id: &str, needle: &str) -> Vec<String> {
    volume_files_containing_any(rig, id, &[needle])
}

/// [`volume_files_containing`] for several needles at once (fixed strings).
pub fn volume_files_containing_any(rig: &Rig, id: &str, needles: &[&str]) -> Vec<String> {
    scan_named_volume(rig, &format!("caw-box-{id}"), needles, (SESSION_RECORD, id))
}

/// Every file in volume `volume` holding any of `needles` (fixed strings, read as root, in
/// a container of the test's own). `control` is `(file, text)`: a file the volume always
/// has and a text it holds. The same grep run must find it there, or the test fails: the
/// volume read is the real one, with the files it should have, and the grep could have
/// found something. The volume must exist beforehand ([`in_named_volume`]).
pub fn scan_named_volume(
    rig: &Rig,
    volume: &str,
    needles: &[&str],
    control: (&str, &str),
) -> Vec<String> {
    scan_in(rig, volume, needles, control, false)
}

/// [`scan_named_volume`] for a checkpoint's volume, whose layers are compressed (a grep of
/// the volume's bytes would not see into them): each `*.zst` and `*.gz` unpacked to `/tmp/z`
/// first and scanned too (a file there named as its layer without the suffix), in a
/// caw-box image (the stub's has no zstd). The control is a path every HOME layer holds,
/// found in the unpacked HOME layer: the scan reads inside it.
pub fn scan_checkpoint_volume(rig: &Rig, volume: &str, needles: &[&str]) -> Vec<String> {
    scan_in(
        rig,
        volume,
        needles,
        ("/tmp/z/home.tar", "home/agent/"),
        true,
    )
}

fn scan_in(
    rig: &Rig,
    volume: &str,
    needles: &[&str],
    control: (&str, &str),
    unpack: bool,
) -> Vec<String> {
    let (control_file, control_text) = control;
    assert!(
        !needles
            .iter()
            .any(|n| n.contains(control_text) || control_text.contains(n)),
        "a needle overlaps the control {control_text:?}"
    );
    // -o -H -Z: one `file\0match` line per match, so one pass tells the control's
    // matches from the needles'.
    const UNPACK: &str = r#"mkdir -p /tmp/z
for f in /h/*.gz; do
    [ -f "$f" ] && gzip -dc "$f" >"/tmp/z/$(basename "$f" .gz)"
done
for f in /h/*.zst; do
    [ -f "$f" ] && zstd -dcq "$f" >"/tmp/z/$(basename "$f" .zst)"
done
exec grep "$@" /h /tmp/z"#;
    let mut cmd = if unpack {
        vec!["sh", "-c", UNPACK, "scan", "-rHoaFZ", "-e", control_text]
    } else {
        vec!["grep", "-rHoaFZ", "-e", control_text]
    };
    for needle in needles {
        cmd.extend(["-e", needle]);
    }
    if !unpack {
        cmd.push("/h");
    }
    // grep: 0 something matched, 1 nothing (not even the control), 2 an error.
    let image = if unpack {
        caw_box::ProviderKind::Codex.default_image()
    } else {
        stub_image()
    };
    let (code, out, err) = run_in_named_volume_of(rig, volume, &cmd, image);
    assert!(code <= 1, "grep in volume {volume} failed ({code}): {err}");
    let mut control_seen = false;
    let mut holding = Vec::new();
    for line in out.lines() {
        let Some((file, matched)) = line.split_once('\0') else {
            panic!("grep in volume {volume}: an unexpected line {line:?}");
        };
        if matched == control_text {
            control_seen |= file == control_file;
        } else if !holding.iter().any(|f| f == file) {
            holding.push(file.to_string());
        }
    }
    assert!(
        control_seen,
        "the scan of volume {volume} did not find {control_text:?} in {control_file} \
         (grep exit {code}): not the volume it should read, or grep cannot find anything"
    );
    holding
}

/// Runs `cmd` as root in a container with the session's state volume at /h (read-only);
/// returns its output lines. It must exit 0.
pub fn in_volume(rig: &Rig, id: &str, cmd: &[&str]) -> Vec<String> {
    in_named_volume(rig, &format!("caw-box-{id}"), cmd)
}

/// Runs `cmd` as root in a container with volume `volume` at /h (read-only); returns its
/// output lines. It must exit 0, and the volume must exist ([`run_in_named_volume`]).
pub fn in_named_volume(rig: &Rig, volume: &str, cmd: &[&str]) -> Vec<String> {
    let (code, out, err) = run_in_named_volume(rig, volume, cmd);
    assert_eq!(code, 0, "{cmd:?} in volume {volume}: {out}{err}");
    out.lines().map(str::to_string).collect()
}

/// Runs `cmd` as root in a container with volume `volume` at /h (read-only): (exit code,
/// stdout, stderr). The volume must exist beforehand: Docker would silently create an empty
/// one of a name that drifted, and a search in it would find nothing.
pub fn run_in_named_volume(rig: &Rig, volume: &str, cmd: &[&str]) -> (i64, String, String) {
    run_in_named_volume_of(rig, volume, cmd, stub_image())
}

/// [`run_in_named_volume`] in `image`.
fn run_in_named_volume_of(
    rig: &Rig,
    volume: &str,
    cmd: &[&str],
    image: String,
) -> (i64, String, String) {
    use bollard::models::{ContainerCreateBody, HostConfig};
    if let Err(e) = rig.rt.block_on(rig.docker.inspect_volume(volume)) {
        panic!("volume {volume} does not exist (not scanning an empty one in its place): {e}");
    }
    rig.run_container(ContainerCreateBody {
        image: Some(image),
        entrypoint: Some(vec![cmd[0].to_string()]),
        cmd: Some(cmd[1..].iter().map(|s| s.to_string()).collect()),
        user: Some("0".into()),
        host_config: Some(HostConfig {
            binds: Some(vec![format!("{volume}:/h:ro")]),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Where a [`secret_scan`] looks besides every process's `/proc/*/environ` and
/// `/proc/*/cmdline`.
#[derive(Debug, Clone, Copy)]
pub enum ScanScope<'a> {
    /// No files: the /proc files only.
    Proc,
    /// Every file under `/` outside /proc and /sys.
    Everything,
    /// Every file under these directories (one of them `/tmp`, where the marker goes).
    Dirs(&'a [&'a str]),
}

/// What a [`secret_scan`] found, each kind on its own: a scan that finds no secret must show
/// it could have found one.
#[derive(Debug, Default)]
pub struct SecretScan {
    /// Files holding a secret.
    pub found: Vec<String>,
    /// Files holding one of the caller's controls (e.g. the placeholder a CLI holds).
    pub controls: Vec<String>,
    /// Whether the file walk found the marker file the scan planted under /tmp: it reads
    /// files. Always false for [`ScanScope::Proc`].
    pub marker_in_file: bool,
    /// Whether the scan found the marker in its own process's environment: it reads the
    /// `/proc` files it may read.
    pub marker_in_environ: bool,
}

impl SecretScan {
    /// Whether a process's environment held a control (the CLI's placeholder).
    pub fn control_in_environ(&self) -> bool {
        self.controls.iter().any(|f| f.ends_with("/environ"))
    }
}

/// The scan's script: `env CAW_SCAN_MARKER=<random> bash -c SCRIPT scan proc|all|dirs
/// [DIR...]`, the patterns on its stdin, one a line (so that no command line or environment
/// in the container holds them). Unless `proc`, it plants the marker in a file under /tmp;
/// it greps every file of the scope and every `/proc/*/environ` and `/proc/*/cmdline` for
/// the marker (in that file and its own environment) and the patterns, prints `file\0match`
/// lines, and exits with grep's status: 0, or 2 for files it may not read and processes
/// gone meanwhile. For docker and kubectl alike (the Kubernetes tests' scan can adopt it).
pub const SECRET_SCAN_SCRIPT: &str = r#"[ -n "${CAW_SCAN_MARKER:-}" ] || exit 3
d=()
case $1 in
all) for x in /*; do case $x in /proc|/sys) ;; *) d+=("$x");; esac; done ;;
dirs) shift; d=("$@") ;;
esac
if [ ${#d[@]} -gt 0 ]; then
  m=$(mktemp -d /tmp/caw-scan.XXXXXX) || exit 3
  trap 'rm -rf "$m"' EXIT
  printf '%s\n' "$CAW_SCAN_MARKER" >"$m/marker" || exit 3
fi
{ printf '%s\n' "$CAW_SCAN_MARKER"; cat; } | grep -rHoaFZs -D skip -f - "${d[@]}" /proc/[0-9]*/environ /proc/[0-9]*/cmdline"#;

/// The command after `exec` that runs the scan with `marker`, for `scope`.
pub fn secret_scan_argv(marker: &str, scope: ScanScope) -> Vec<String> {
    let mut args = vec![
        "env".to_string(),
        format!("CAW_SCAN_MARKER={marker}"),
        "bash".into(),
        "-c".into(),
        SECRET_SCAN_SCRIPT.into(),
        "scan".into(),
    ];
    match scope {
        ScanScope::Proc => args.push("proc".into()),
        ScanScope::Everything => args.push("all".into()),
        ScanScope::Dirs(dirs) => {
            assert!(
                dirs.contains(&"/tmp"),
                "the marker goes under /tmp: {dirs:?}"
            );
            args.push("dirs".into());
            args.extend(dirs.iter().map(|d| d.to_string()));
        }
    }
    args
}

/// The scan's stdin: the controls and secrets, one a line.
pub fn secret_scan_stdin(controls: &[&str], secrets: &[String]) -> Vec<u8> {
    let mut lines: Vec<&str> = controls.to_vec();
    lines.extend(secrets.iter().map(String::as_str));
    let mut text = lines.join("\n");
    text.push('\n');
    text.into_bytes()
}

/// Sorts the scan's `file\0match` lines into a [`SecretScan`].
pub fn parse_secret_scan(stdout: &str, marker: &str, controls: &[&str]) -> SecretScan {
    let mut scan = SecretScan::default();
    for line in stdout.lines() {
        let Some((file, matched)) = line.split_once('\0') else {
            panic!("the scan printed an unexpected line: {line:?}");
        };
        let list = if matched == marker {
            scan.marker_in_file |= file.starts_with("/tmp/caw-scan.");
            scan.marker_in_environ |= file.starts_with("/proc/") && file.ends_with("/environ");
            continue;
        } else if controls.contains(&matched) {
            &mut scan.controls
        } else {
            &mut scan.found
        };
        if !list.iter().any(|f| f == file) {
            list.push(file.to_string());
        }
    }
    scan
}

/// Greps for `secrets` (fixed strings) inside a running container through `exec`: a
/// command that runs its arguments there with stdin attached (`docker exec -i -u 1000 C`,
/// `kubectl exec -i POD -c C --`). The same grep looks for `controls` (distinctive texts
/// known to be there, e.g. a placeholder) and a random marker it plants in a file and in its
/// own environment, and reports each separately: the caller asserts them. `Err` with the
/// output when the scan did not run to its end (e.g. the container went away).
pub fn secret_scan(
    mut exec: Command,
    scope: ScanScope,
    controls: &[&str],
    secrets: &[String],
) -> Result<SecretScan, Output> {
    use std::io::Write;
    let marker = format!("cawscanmarker{}", uuid::Uuid::new_v4().simple());
    for c in controls {
        assert!(
            !secrets
                .iter()
                .any(|s| s.contains(c) || c.contains(s.as_str())),
            "a secret overlaps the control {c:?}"
        );
    }
    let mut child = exec
        .args(secret_scan_argv(&marker, scope))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the scan");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(&secret_scan_stdin(controls, secrets))
        .unwrap();
    drop(stdin);
    let out = wait_with_deadline(child, Duration::from_secs(120));
    // grep: 0 matches, 1 none (not even the marker: the caller's assertions say so), 2
    // errors besides (unreadable files are expected as a user).
    if !matches!(out.status.code(), Some(0..=2)) {
        return Err(out);
    }
    Ok(parse_secret_scan(&stdout_of(&out), &marker, controls))
}

/// Scans everything of the running `container` (its processes' environments and
/// arguments, its files) as `user` for `secrets`, and fails the test where the scan read
/// nothing (its planted markers) or found one: `what` names the container in the failure.
pub fn assert_holds_no_secret(container: &str, user: &str, secrets: &[String], what: &str) {
    let scan = docker_secret_scan(container, user, ScanScope::Everything, &[], secrets)
        .unwrap_or_else(|o| panic!("scan: {}", stderr_of(&o)));
    assert!(
        scan.marker_in_file && scan.marker_in_environ,
        "the scan read nothing: {scan:?}"
    );
    assert!(scan.found.is_empty(), "a secret in {what}: {scan:?}");
}

/// [`secret_scan`] in the running Docker container `container` as `user`.
pub fn docker_secret_scan(
    container: &str,
    user: &str,
    scope: ScanScope,
    controls: &[&str],
    secrets: &[String],
) -> Result<SecretScan, Output> {
    let mut exec = Command::new("docker");
    exec.args(["exec", "-i", "-u", user, container]);
    secret_scan(exec, scope, controls, secrets)
}

/// Containers' events as the daemon sends them, from when the watch began
/// ([`Rig::watch_events`], [`Rig::watch_test_events`]): each one's action, the name its
/// container had then, and when (unix nanoseconds). It stops when dropped.
pub struct EventWatch {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, String, i64)>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl EventWatch {
    fn start(docker: Docker, filters: HashMap<String, Vec<String>>) -> EventWatch {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, subscribed) = std::sync::mpsc::channel();
        let into = seen.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                // From the start of this second (the daemon replays what it has from
                // then, so an event while the subscription is made is not missed); what
                // came before the watch began does not count.
                let began = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap();
                let (since, began) = (began.as_secs(), began.as_nanos() as i64);
                let options = bollard::query_parameters::EventsOptionsBuilder::new()
                    .since(&since.to_string())
                    .filters(&filters)
                    .build();
                let mut events = docker.events(Some(options));
                let _ = ready.send(());
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        event = events.next() => match event {
                            Some(Ok(e)) => {
                                let at = e.time_nano.unwrap_or_default();
                                if at >= began {
                                    let name = e
                                        .actor
                                        .and_then(|a| a.attributes)
                                        .and_then(|mut a| a.remove("name"))
                                        .unwrap_or_default();
                                    into.lock().unwrap().push((
                                        e.action.unwrap_or_default(),
                                        name,
                                        at,
                                    ));
                                }
                            }
                            _ => break,
                        },
                    }
                }
            });
        });
        let _ = subscribed.recv_timeout(Duration::from_secs(10));
        EventWatch { seen, _stop: stop }
    }

    /// Every event so far: (action, container name, unix nanoseconds).
    pub fn all(&self) -> Vec<(String, String, i64)> {
        self.seen.lock().unwrap().clone()
    }

    /// When (unix nanoseconds) a container then named `name` first did `action`.
    pub fn first(&self, action: &str, name: &str) -> Option<i64> {
        self.all()
            .into_iter()
            .find(|(a, n, _)| a == action && n == name)
            .map(|(_, _, at)| at)
    }

    /// How many `event`s (Docker's names: `rename`, `exec_start`, ...) came since the watch
    /// began: once at least one came (within 10 s), and then none for half a second.
    pub fn count(&self, event: &str) -> usize {
        let counted = || {
            let seen = self.seen.lock().unwrap();
            (
                seen.len(),
                seen.iter()
                    .filter(|(a, _, _)| a == event || a.starts_with(&format!("{event}:")))
                    .count(),
            )
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while counted().1 == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        loop {
            let (all, _) = counted();
            std::thread::sleep(Duration::from_millis(500));
            if counted().0 == all {
                return counted().1;
            }
        }
    }
}
