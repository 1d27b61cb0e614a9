//! The `caw-box` binary's user-facing text, pinned by snapshots: the help of the main
//! commands and the error lines of input refused before Docker is reached.
//!
//! No Docker: every case here is refused before caw-box connects. DOCKER_HOST points at a
//! socket that does not exist, so a case that reached for the daemon would fail with another
//! error (exit 3) instead of touching a shared one. Update the snapshots with
//! `INSTA_UPDATE=always cargo nextest run --test cli` and review the diff.

use std::path::Path;
use std::process::{Command, Stdio};

/// What one run of caw-box printed, as the snapshot shows it.
struct Ran {
    code: Option<i32>,
    text: String,
}

/// Runs caw-box with `args`, no terminal on stdin, and a clean environment of its own (no
/// config file: HOME and the current directory are an empty temp dir).
fn caw_box(args: &[&str]) -> Ran {
    let data = tempfile::tempdir().expect("a temp dir");
    caw_box_in(args, data.path(), data.path(), &[])
}

/// [`caw_box`] with this HOME and current directory, and extra variables.
fn caw_box_in(args: &[&str], home: &Path, cwd: &Path, vars: &[(&str, &str)]) -> Ran {
    let data = tempfile::tempdir().expect("a temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_caw-box"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("CAW_BOX_DATA_DIR", data.path().join("data"))
        .envs(vars.iter().copied())
        .current_dir(cwd)
        .env(
            "DOCKER_HOST",
            format!("unix://{}/no-docker.sock", data.path().display()),
        )
        // The help wraps at a fixed width, whatever terminal runs the tests.
        .env("COLUMNS", "100")
        .stdin(Stdio::null())
        .output()
        .expect("caw-box runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = match out.status.code() {
        Some(c) => c.to_string(),
        None => "killed by a signal".to_string(),
    };
    let mut text = format!("$ caw-box {}\nexit: {code}\n", args.join(" "));
    if !stdout.is_empty() {
        text.push_str(&format!("--- stdout\n{stdout}"));
    }
    if !stderr.is_empty() {
        text.push_str(&format!("--- stderr\n{stderr}"));
    }
    Ran {
        code: out.status.code(),
        text,
    }
}

/// A refusal: the exit code, one line on stderr, nothing on stdout.
fn refused(args: &[&str], code: i32) -> String {
    check_refused(caw_box(args), code)
}

fn check_refused(ran: Ran, code: i32) -> String {
    assert_eq!(ran.code, Some(code), "{}", ran.text);
    assert!(!ran.text.contains("--- stdout"), "{}", ran.text);
    let stderr = ran.text.split("--- stderr\n").nth(1).unwrap_or_default();
    assert_eq!(stderr.lines().count(), 1, "one error line: {}", ran.text);
    assert!(stderr.starts_with("caw-box: error: "), "{}", ran.text);
    ran.text
}

fn help(args: &[&str]) -> String {
    let ran = caw_box(args);
    assert_eq!(ran.code, Some(0), "{}", ran.text);
    assert!(!ran.text.contains("--- stderr"), "{}", ran.text);
    ran.text
}

#[test]
fn top_level_help() {
    insta::assert_snapshot!("help", help(&["--help"]));
}

#[test]
fn run_help() {
    insta::assert_snapshot!("run_help", help(&["run", "--help"]));
}

#[test]
fn resume_help() {
    insta::assert_snapshot!("resume_help", help(&["resume", "--help"]));
}

#[test]
fn fork_help() {
    insta::assert_snapshot!("fork_help", help(&["fork", "--help"]));
}

/// What no session could satisfy is refused before Docker is asked anything (the e2e tests
/// prove the refusals that need a session).
#[test]
fn fork_refuses_a_count_or_turn_no_session_has() {
    insta::assert_snapshot!("fork_count", refused(&["fork", "x", "-n", "9"], 2));
    insta::assert_snapshot!("fork_at_zero", refused(&["fork", "x", "--at", "0"], 2));
}

#[test]
fn pool_input_no_pool_can_take_is_refused_before_docker() {
    insta::assert_snapshot!("pool_stop_nothing", refused(&["pool", "stop"], 2));
    insta::assert_snapshot!(
        "pool_stop_unknown",
        refused(&["pool", "stop", "0123abcd"], 2)
    );
    insta::assert_snapshot!(
        "pool_size",
        refused(&["pool", "start", "--provider", "codex", "--size", "0"], 2)
    );
}

#[test]
fn an_unknown_provider_is_refused_with_the_valid_ones() {
    insta::assert_snapshot!(
        "unknown_provider",
        refused(&["run", "--provider", "gpt", "hi"], 2)
    );
}

#[test]
fn a_bad_env_name_is_refused_without_its_value() {
    let text = refused(
        &[
            "run",
            "--provider",
            "codex",
            "--env",
            "BAD-NAME=s3cret",
            "hi",
        ],
        2,
    );
    assert!(!text.split("--- stderr").nth(1).unwrap().contains("s3cret"));
    insta::assert_snapshot!("bad_env_name", text);
}

#[test]
fn network_none_is_refused_with_what_to_use_instead() {
    insta::assert_snapshot!(
        "network_none",
        refused(
            &["run", "--provider", "codex", "--network", "none", "hi"],
            2
        )
    );
}

/// A model URL with a user or password in it would be kept in the session's labels: refused
/// (exit 2, before Docker is reached: its absence would be exit 3) wherever it comes from,
/// `run` and `resume` flags, a variable, a config file, its secret never echoed, and nothing
/// made, not even caw-box's data directory.
#[test]
fn an_endpoint_with_a_user_or_password_is_refused_and_nothing_is_made() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let data_var = [("CAW_BOX_DATA_DIR", data.to_str().unwrap())];
    let url = "http://ci-bot:s3cret@gateway:8080/v1";
    let run = ["run", "--provider", "codex", "--endpoint", url, "hi"];
    let text = check_refused(caw_box_in(&run, home.path(), home.path(), &data_var), 2);
    assert!(!text.split("--- stderr").nth(1).unwrap().contains("s3cret"));
    insta::assert_snapshot!("endpoint_with_password", text);
    let resume = ["resume", "some-session", "--endpoint", url, "hi"];
    let text = check_refused(caw_box_in(&resume, home.path(), home.path(), &data_var), 2);
    assert!(
        text.contains("'http://***@gateway:8080/v1' has a user or password"),
        "{text}"
    );
    let from_var = [data_var[0], ("CAW_BOX_ENDPOINT", "https://s3cret@gateway")];
    let run = ["run", "--provider", "codex", "hi"];
    let text = check_refused(caw_box_in(&run, home.path(), home.path(), &from_var), 2);
    assert!(text.contains("has a user or password"), "{text}");
    // A user alone is not a secret to the config files' check, but is not kept either.
    let world = ConfigWorld::new("", "endpoint = \"https://ci-bot@gateway\"\n");
    let text = check_refused(world.run(&run, &data_var), 2);
    assert!(
        text.contains("'https://***@gateway' has a user or password"),
        "{text}"
    );
    assert!(!data.exists(), "caw-box made its data directory");
}

#[test]
fn a_bad_memory_size_is_refused() {
    insta::assert_snapshot!(
        "bad_memory",
        refused(&["run", "--provider", "codex", "--memory", "lots", "hi"], 2)
    );
}

#[test]
fn no_prompt_without_a_terminal_is_refused() {
    insta::assert_snapshot!(
        "no_prompt_no_terminal",
        refused(&["run", "--provider", "codex"], 2)
    );
}

#[test]
fn resume_without_a_target_is_refused() {
    insta::assert_snapshot!("resume_without_target", refused(&["resume"], 2));
}

#[test]
fn a_bad_timeout_is_refused() {
    insta::assert_snapshot!(
        "bad_timeout",
        refused(
            &["run", "--provider", "codex", "--timeout", "soon", "hi"],
            2
        )
    );
}

/// The binary parses a TARGET only once it reached Docker (a TARGET may be a name), so a
/// malformed handle's line is pinned through the library, printed the way `main` prints
/// every error.
#[test]
fn a_malformed_handle_is_refused() {
    let mut lines = Vec::new();
    for handle in [
        r#"{"version":1,"provider":"codex""#,
        r#"{"version":9,"provider":"codex"}"#,
        r#"{"version":1,"provider":"gpt","session_id":"x","resume_key":"k","volume":"v"}"#,
    ] {
        let e = caw_box::ResumeHandle::parse(handle).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        lines.push(format!("{handle}\n  caw-box: error: {e}"));
    }
    insta::assert_snapshot!("malformed_handle", lines.join("\n"));
}

/// A home with a user config file and a repository with a project file, its workspace a
/// subdirectory: `config` and `run` as a user in that repository would meet them.
struct ConfigWorld {
    dir: tempfile::TempDir,
}

impl ConfigWorld {
    fn new(user: &str, project: &str) -> ConfigWorld {
        let dir = tempfile::tempdir().expect("a temp dir");
        let config = dir.path().join(".config/caw-box");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("config.toml"), user).unwrap();
        std::fs::create_dir_all(dir.path().join("repo/.git")).unwrap();
        std::fs::create_dir_all(dir.path().join("repo/app")).unwrap();
        std::fs::write(dir.path().join("repo/.caw-box.toml"), project).unwrap();
        ConfigWorld { dir }
    }

    /// caw-box in repo/app, HOME the world's root.
    fn run(&self, args: &[&str], vars: &[(&str, &str)]) -> Ran {
        caw_box_in(
            args,
            self.dir.path(),
            &self.dir.path().join("repo/app"),
            vars,
        )
    }

    fn filtered(&self, text: &str) -> String {
        let real = self.dir.path().canonicalize().unwrap();
        text.replace(&real.display().to_string(), "[TMP]")
            .replace(&self.dir.path().display().to_string(), "[TMP]")
    }
}

const USER_CONFIG: &str = "\
provider = \"codex\"
model = \"user-model\"
memory = \"2g\"
timeout = \"10m\"
idle_timeout = \"5m\"
";

const PROJECT_CONFIG: &str = "\
# committed with the repository
model = \"project-model\"
egress = \"locked\"
timeout = \"20m\"
labels = { team = \"ci\" }
env_pass = [\"OPENAI_API_KEY\"]
";

/// Every source at once: a flag, a variable, the project file, the user file, defaults.
#[test]
fn config_show_says_where_each_setting_came_from() {
    let world = ConfigWorld::new(USER_CONFIG, PROJECT_CONFIG);
    let ran = world.run(
        &["config", "show", "--json", "--memory", "4g"],
        &[("CAW_BOX_TIMEOUT", "45m")],
    );
    assert_eq!(ran.code, Some(0), "{}", ran.text);
    let shown = world.filtered(&ran.text);
    // The precedence, row by row (the snapshot pins the whole).
    let json: serde_json::Value =
        serde_json::from_str(shown.split("--- stdout\n").nth(1).unwrap()).unwrap();
    let source = |key: &str| {
        let s = json["settings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["key"] == key)
            .unwrap();
        (
            s["value"].clone(),
            s["source"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(source("memory"), ("4g".into(), "flag".into()));
    assert_eq!(source("timeout"), ("45m".into(), "env".into()));
    assert_eq!(source("model"), ("project-model".into(), "project".into()));
    assert_eq!(source("idle_timeout"), ("5m".into(), "user".into()));
    assert_eq!(source("network"), ("open".into(), "default".into()));
    insta::assert_snapshot!("config_show_json", shown);
}

#[test]
fn config_show_as_a_table() {
    let world = ConfigWorld::new(USER_CONFIG, PROJECT_CONFIG);
    let ran = world.run(&["config", "show", "--provider", "gemini"], &[]);
    assert_eq!(ran.code, Some(0), "{}", ran.text);
    insta::assert_snapshot!("config_show_table", world.filtered(&ran.text));
}

#[test]
fn config_path_lists_the_files_considered() {
    let world = ConfigWorld::new("", "");
    let ran = world.run(&["config", "path"], &[]);
    assert_eq!(ran.code, Some(0), "{}", ran.text);
    insta::assert_snapshot!("config_path", world.filtered(&ran.text));
    // CAW_BOX_CONFIG names the user file instead.
    let other = world.dir.path().join("elsewhere.toml");
    let ran = world.run(
        &["config", "path"],
        &[("CAW_BOX_CONFIG", other.to_str().unwrap())],
    );
    assert!(
        world
            .filtered(&ran.text)
            .contains("user     missing  [TMP]/elsewhere.toml"),
        "{}",
        ran.text
    );
}

#[test]
fn a_secret_in_a_config_file_is_refused_without_its_value() {
    let world = ConfigWorld::new(
        "",
        "model = \"m\"\nendpoint = \"https://gw.example.com/v1?key=sk-proj-Zx81Kq0PmWv3Lr7Tn2Yb\"\n",
    );
    let text = world.filtered(&check_refused(
        world.run(&["run", "--provider", "codex", "hi"], &[]),
        2,
    ));
    assert!(!text.contains("Zx81Kq0"), "the value leaked: {text}");
    insta::assert_snapshot!("config_secret_refused", text);
}

#[test]
fn a_bad_key_in_a_config_file_is_refused_naming_file_and_line() {
    let world = ConfigWorld::new(
        "provider = \"codex\"\n\nallow_hosts = [\"x.example.com\"]\n",
        "",
    );
    let text = world.filtered(&check_refused(world.run(&["run", "hi"], &[]), 2));
    assert!(
        text.contains("[TMP]/.config/caw-box/config.toml:3: unknown field `allow_hosts`"),
        "{text}"
    );
    insta::assert_snapshot!("config_bad_key", text);
}

#[test]
fn a_bad_value_in_a_config_file_is_refused_naming_file_line_and_key() {
    let world = ConfigWorld::new("", "model = \"m\"\nmemory = \"lots\"\n");
    let text = world.filtered(&check_refused(world.run(&["config", "show"], &[]), 2));
    insta::assert_snapshot!("config_bad_value", text);
}

#[test]
fn run_needs_a_provider_from_a_flag_or_a_config_file() {
    insta::assert_snapshot!("run_without_provider", refused(&["run", "hi"], 2));
}

#[test]
fn config_help() {
    insta::assert_snapshot!("config_show_help", help(&["config", "show", "--help"]));
}

#[test]
fn the_man_page_renders() {
    let ran = caw_box(&["man"]);
    assert_eq!(ran.code, Some(0), "{}", ran.text);
    assert!(ran.text.contains(".TH caw-box 1"), "{}", ran.text);
    assert!(ran.text.contains("config"), "{}", ran.text);
    let dir = tempfile::tempdir().unwrap();
    let ran = caw_box(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert_eq!(ran.code, Some(0), "{}", ran.text);
    for page in ["caw-box.1", "caw-box-run.1", "caw-box-config-show.1"] {
        assert!(dir.path().join(page).is_file(), "{page} missing");
    }
}

/// A failure under `-o json` or `-o stream-json`: the documented object as the last line of
/// stdout (the only line, here: nothing ran), the exit code it names, and the usual error
/// on stderr.
fn json_failure(args: &[&str], code: i32) -> (serde_json::Value, String, String) {
    let ran = caw_box(args);
    assert_eq!(ran.code, Some(code), "{}", ran.text);
    let stdout = ran
        .text
        .split("--- stdout\n")
        .nth(1)
        .and_then(|s| s.split("--- stderr\n").next())
        .unwrap_or_default();
    let stderr = ran.text.split("--- stderr\n").nth(1).unwrap_or_default();
    assert_eq!(
        stdout.lines().count(),
        1,
        "one object on stdout: {}",
        ran.text
    );
    assert!(stderr.contains("error: "), "{}", ran.text);
    let object: serde_json::Value = serde_json::from_str(stdout).expect("stdout is JSON");
    assert_eq!(object["status"], "error", "{object}");
    assert_eq!(object["exit_code"], code, "{object}");
    assert!(object["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    let keys: Vec<&String> = object["error"].as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 3, "kind, message, hint: {object}");
    (object, stdout.trim_end().to_string(), ran.text)
}

#[test]
fn failures_before_the_turn_answer_in_json_under_o_json() {
    // A bad flag value clap refuses: the format is read from the arguments themselves.
    let (clap, clap_line, clap_text) = json_failure(
        &[
            "run",
            "--provider",
            "codex",
            "-o",
            "json",
            "--cpus",
            "lots",
            "hi",
        ],
        2,
    );
    assert_eq!(clap["error"]["kind"], "usage");
    assert!(clap_text.contains("For more information, try '--help'."));
    // A bad value caw-box itself refuses, in the stream-json spelling.
    let (_, memory_line, _) = json_failure(
        &[
            "run",
            "--provider",
            "codex",
            "--memory",
            "lots",
            "--output=stream-json",
            "hi",
        ],
        2,
    );
    let (_, provider_line, _) = json_failure(&["run", "--provider", "gpt", "-o", "json", "hi"], 2);
    // No daemon: DOCKER_HOST points nowhere.
    let (no_daemon, _, _) = json_failure(&["resume", "fixer", "-o", "json", "hi"], 3);
    assert_eq!(no_daemon["error"]["kind"], "environment");
    let (wait, _, _) = json_failure(&["wait", "fixer", "-o", "json"], 3);
    assert_eq!(wait["error"]["kind"], "environment");
    insta::assert_snapshot!(
        "json_failures",
        [clap_line, memory_line, provider_line].join("\n")
    );
}

#[test]
fn text_output_keeps_stdout_empty_on_failure() {
    let ran = caw_box(&["run", "--provider", "codex", "--cpus", "lots", "hi"]);
    assert_eq!(ran.code, Some(2), "{}", ran.text);
    assert!(!ran.text.contains("--- stdout"), "{}", ran.text);
}

/// `--version` names the CLI versions the images pin; `-V` is the one line.
#[test]
fn version_names_the_pinned_cli_versions() {
    insta::assert_snapshot!("version", help(&["--version"]));
    insta::assert_snapshot!("version_short", help(&["-V"]));
}

/// `--version --json` is what scripts read the pins from (`make drift`): every provider, its
/// image, npm package and pinned version, the same as `--version` prints. `--json` alone is
/// refused: it means nothing without `--version`.
#[test]
fn version_json_lists_every_provider_pin() {
    for args in [&["--version", "--json"][..], &["--json", "--version"][..]] {
        let ran = caw_box(args);
        assert_eq!(ran.code, Some(0), "{}", ran.text);
        let stdout = ran.text.split("--- stdout\n").nth(1).unwrap_or_default();
        assert!(!stdout.contains("--- stderr"), "{}", ran.text);
        let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        insta::assert_snapshot!(
            "version_json",
            serde_json::to_string_pretty(&report).unwrap()
        );
        let text = help(&["--version"]);
        for p in report["providers"].as_array().unwrap() {
            let line = format!(
                "{} {}",
                p["npm_package"].as_str().unwrap(),
                p["cli_version"].as_str().unwrap()
            );
            assert!(text.contains(&line), "--version lacks {line}: {text}");
        }
    }
    let ran = caw_box(&["--json", "ls"]);
    assert_eq!(ran.code, Some(2), "{}", ran.text);
    assert!(ran.text.contains("--version"), "{}", ran.text);
}

#[test]
fn image_pull_help_and_refusals() {
    insta::assert_snapshot!("image_pull_help", help(&["image", "pull", "--help"]));
    // Nothing to pull from: the default repository is that of local builds.
    insta::assert_snapshot!(
        "image_pull_without_a_repo",
        refused(&["image", "pull", "--provider", "codex"], 2)
    );
    insta::assert_snapshot!(
        "image_pull_bad_repo",
        refused(
            &["image", "pull", "--all", "--image-repo", "ghcr.io/x/y:v1"],
            2
        )
    );
    insta::assert_snapshot!(
        "image_pull_nothing_chosen",
        refused(&["image", "pull", "--image-repo", "ghcr.io/x/y"], 2)
    );
}

/// `caw-box image` with the Kubernetes backend is refused before anything is reached (exit 2,
/// not an unreachable daemon's 3), in the backend seam's words: a cluster has no image store
/// caw-box builds in, and what to do instead.
#[test]
fn image_commands_are_refused_on_kubernetes_before_any_daemon() {
    for what in ["build", "pull", "ls", "prune"] {
        let ran = caw_box(&["--backend", "kubernetes", "image", what]);
        assert_eq!(ran.code, Some(2), "{}", ran.text);
        assert!(!ran.text.contains("--- stdout"), "{}", ran.text);
        let said = format!(
            "`caw-box image {what}` works on a Docker daemon's images, not a cluster's: a cluster's nodes take images from a registry"
        );
        assert!(ran.text.contains(&said), "{}", ran.text);
        let hint = format!("run `caw-box --backend docker image {what}`");
        assert!(ran.text.contains(&hint), "{}", ran.text);
    }
}

/// `--ca-cert` (an image build's, a login's): a file that cannot be read, or holds no PEM
/// certificate, is one line and exit 2, before anything is built or started.
#[test]
fn a_bad_ca_cert_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let not_pem = not_pem.to_str().unwrap();
    let missing = dir.path().join("missing.pem");
    let missing = missing.to_str().unwrap();
    for cmd in [
        &["image", "build", "--provider", "codex"][..],
        &["auth", "login", "--provider", "codex"][..],
    ] {
        let text = refused(&[cmd, &["--ca-cert", not_pem]].concat(), 2);
        assert!(text.contains("holds no PEM certificate"), "{text}");
        let text = refused(&[cmd, &["--ca-cert", missing]].concat(), 2);
        assert!(text.contains("cannot read --ca-cert"), "{text}");
    }
}

/// `--on-limit park` is the one usage-limit behaviour a background or family of turns can
/// take: `wait` and `fallback` belong to one turn in the foreground, refused elsewhere
/// before anything is made (exit 2).
#[test]
fn on_limit_wait_is_refused_where_turns_run_in_the_background() {
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "run",
                "--provider",
                "codex",
                "-d",
                "--on-limit",
                "wait",
                "hi",
            ],
            "--on-limit wait and fallback need a turn in the foreground",
        ),
        (
            &["fork", "x", "--on-limit", "fallback=claude", "hi"],
            "fork takes --on-limit fail or park",
        ),
        (
            &["mcp", "--on-limit", "wait"],
            "caw-box mcp --on-limit takes fail or park",
        ),
        (
            &["run", "--provider", "codex", "--on-limit", "nap", "hi"],
            "'nap' is not understood",
        ),
    ];
    for (args, says) in cases {
        let ran = caw_box(args);
        assert_eq!(ran.code, Some(2), "{args:?}: {}", ran.text);
        assert!(ran.text.contains(says), "{args:?}: {}", ran.text);
        assert!(!ran.text.contains("--- stdout"), "{args:?}: {}", ran.text);
    }
}
