//! The CI templates (issue 16, part 4): `action.yml`'s steps run in order as a GitHub runner
//! runs them (its `${{ }}` substitutions, GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, GITHUB_PATH, a
//! git workspace), and the GitLab template's script as a GitLab runner runs it, against the
//! stub model on the test's internal network. Installing uses the caw-box under test
//! (`caw-box-bin` / CAW_BOX_BIN): nothing is downloaded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use yaml_serde::Value as Yaml;

use crate::common::*;

const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A git repository the agent may write into, as a job's checkout: root's (the agent runs as
/// its owner).
fn fake_checkout() -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("README.md"), "a project\n").unwrap();
    git(ws.path(), &["init", "-q"]);
    git(ws.path(), &["add", "."]);
    git(ws.path(), &["commit", "-q", "-m", "start"]);
    std::fs::set_permissions(
        ws.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    ws
}

/// Replaces every `${{ expr }}` by `ctx[expr]`; an expression the test does not know fails it.
fn substitute(text: &str, ctx: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${{") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("}}").expect("unclosed ${{") + start;
        let expr = rest[start + 3..end].trim();
        let value = ctx
            .get(expr)
            .unwrap_or_else(|| panic!("the test runner does not know `{expr}`"));
        out.push_str(value);
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A GitHub output file: `name=value` lines and `name<<DELIM` blocks.
fn parse_outputs(text: &str) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some((name, delim)) = line.split_once("<<") {
            let mut value = Vec::new();
            for l in lines.by_ref() {
                if l == delim {
                    break;
                }
                value.push(l);
            }
            map.insert(name.to_string(), value.join("\n"));
        } else if let Some((name, value)) = line.split_once('=') {
            map.insert(name.to_string(), value.to_string());
        }
    }
    map
}

fn s(v: &Yaml) -> String {
    match v {
        Yaml::String(s) => s.clone(),
        Yaml::Bool(b) => b.to_string(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Null => String::new(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// What one run of the action left: its outputs (resolved as `outputs.*` of action.yml), the
/// step summary, and the names of the steps it ran and the `uses:` steps it left to GitHub.
struct ActionRun {
    outputs: HashMap<String, String>,
    summary: String,
    uses: Vec<(String, HashMap<String, String>)>,
}

/// Runs action.yml's `runs.steps` in order with `with` as inputs (the action's defaults for
/// the rest), `job_env` as the calling step's `env:` (where a workflow maps a secret), the way
/// a runner does: each `run:` after substitution, in `bash --noprofile --norc -eo pipefail`,
/// with the step's `env:`, a fresh GITHUB_OUTPUT per step, GITHUB_PATH applied to later steps.
/// A step that fails stops the run, as `if: always()` steps aside, a runner would.
fn run_action(
    rig: &Rig,
    workspace: &Path,
    temp: &Path,
    with: &[(&str, String)],
    job_env: &[(&str, &str)],
) -> ActionRun {
    let action: Yaml =
        yaml_serde::from_str(&std::fs::read_to_string(repo_root().join("action.yml")).unwrap())
            .unwrap();
    assert_eq!(s(&action["runs"]["using"]), "composite");
    let mut ctx: HashMap<String, String> = HashMap::new();
    let declared = action["inputs"].as_mapping().unwrap();
    for (name, _) in with {
        assert!(
            declared.contains_key(*name),
            "the test passes input '{name}', which action.yml does not declare"
        );
    }
    ctx.insert(
        "github.action_path".into(),
        repo_root().display().to_string(),
    );
    ctx.insert("github.workspace".into(), workspace.display().to_string());
    ctx.insert("github.server_url".into(), "https://github.invalid".into());
    ctx.insert("github.action_repository".into(), "owner/caw-box".into());
    ctx.insert("runner.temp".into(), temp.display().to_string());
    for (name, spec) in declared {
        let name = s(name);
        let given = with
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone());
        let value = match given {
            Some(v) => v,
            None => substitute(&s(&spec["default"]), &ctx),
        };
        ctx.insert(format!("inputs.{name}"), value);
    }

    let summary_file = temp.join("step-summary.md");
    let path_file = temp.join("github-path");
    std::fs::write(&summary_file, "").unwrap();
    std::fs::write(&path_file, "").unwrap();
    let mut step_outputs: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut uses = Vec::new();
    for (i, step) in action["runs"]["steps"]
        .as_sequence()
        .unwrap()
        .iter()
        .enumerate()
    {
        let id = step["id"].as_str().map(str::to_string);
        if let Some(action_ref) = step["uses"].as_str() {
            // A marketplace action (the artifact upload): what it would be given is checked
            // by the caller; `if:` is evaluated for the one form the action uses.
            let cond = step["if"].as_str().unwrap_or("");
            assert_eq!(
                cond, "always() && steps.turn.outputs.patch != ''",
                "the test evaluates only this condition"
            );
            let patch = &step_outputs["turn"]["patch"];
            if !patch.is_empty() {
                let mut given = HashMap::new();
                for (k, v) in step["with"].as_mapping().unwrap() {
                    given.insert(s(k), substitute(&s(v), &ctx));
                }
                uses.push((action_ref.to_string(), given));
            }
            continue;
        }
        let script = substitute(step["run"].as_str().expect("a run: step"), &ctx);
        assert_eq!(
            s(&step["shell"]),
            "bash",
            "composite run steps name their shell"
        );
        let output_file = temp.join(format!("output-{i}"));
        std::fs::write(&output_file, "").unwrap();
        let script_file = temp.join(format!("step-{i}.sh"));
        std::fs::write(&script_file, &script).unwrap();

        let mut cmd = rig.caw_env("bash");
        cmd.args(["--noprofile", "--norc", "-eo", "pipefail"])
            .arg(&script_file)
            .current_dir(workspace)
            .env("GITHUB_OUTPUT", &output_file)
            .env("GITHUB_STEP_SUMMARY", &summary_file)
            .env("GITHUB_PATH", &path_file)
            .env("GITHUB_WORKSPACE", workspace)
            .env("RUNNER_TEMP", temp);
        let added: Vec<String> = std::fs::read_to_string(&path_file)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env(
            "PATH",
            added.iter().rev().fold(path, |p, dir| format!("{dir}:{p}")),
        );
        for (k, v) in job_env {
            cmd.env(k, v);
        }
        if let Some(env) = step["env"].as_mapping() {
            for (k, v) in env {
                cmd.env(s(k), substitute(&s(v), &ctx));
            }
        }
        let out = run(cmd);
        assert_eq!(
            out.status.code(),
            Some(0),
            "step '{}' failed:\n{}\n{}",
            s(&step["name"]),
            stdout_of(&out),
            stderr_of(&out)
        );
        let outputs = parse_outputs(&std::fs::read_to_string(&output_file).unwrap());
        if let Some(id) = id {
            for (k, v) in &outputs {
                ctx.insert(format!("steps.{id}.outputs.{k}"), v.clone());
            }
            step_outputs.insert(id, outputs);
        }
    }
    let mut outputs = HashMap::new();
    for (name, spec) in action["outputs"].as_mapping().unwrap() {
        outputs.insert(s(name), substitute(&s(&spec["value"]), &ctx));
    }
    ActionRun {
        outputs,
        summary: std::fs::read_to_string(&summary_file).unwrap(),
        uses,
    }
}

/// The image inputs that make `images: build` find the images `make images` built up to date.
fn image_inputs() -> Vec<(&'static str, String)> {
    let mut with = vec![
        ("images", "build".to_string()),
        ("base-image", "caw-box-local/node:20-bookworm".to_string()),
    ];
    if Path::new(CA_BUNDLE).exists() {
        with.push(("ca-cert", CA_BUNDLE.to_string()));
    }
    with
}

#[test]
fn the_github_action_runs_a_turn_and_publishes_result_handle_and_patch() {
    let rig = Rig::new("ci_action");
    let workspace = fake_checkout();
    let temp = tempfile::tempdir().unwrap();
    let prompt_file = temp.path().join("prompt.txt");
    std::fs::write(&prompt_file, "REMEMBER:otter\nRUN:echo from-ci > ci.txt\n").unwrap();
    let caw_box = env!("CARGO_BIN_EXE_caw-box").to_string();
    let mut with = vec![
        ("provider", "codex".to_string()),
        ("prompt-file", prompt_file.display().to_string()),
        ("model", "gpt-5.5".to_string()),
        ("allow-hosts", format!("{}:8080", rig.stub)),
        ("timeout", "5m".to_string()),
        ("key-var", "OPENAI_API_KEY".to_string()),
        ("endpoint", rig.endpoint()),
        ("network", rig.network.clone()),
        ("caw-box-bin", caw_box.clone()),
    ];
    with.extend(image_inputs());
    let first = run_action(
        &rig,
        workspace.path(),
        temp.path(),
        &with,
        &[("OPENAI_API_KEY", TEST_KEY)],
    );

    check("outputs: result, status, session, handle");
    let result: Value = serde_json::from_str(&first.outputs["result"]).unwrap();
    assert_eq!(result["status"], "success", "{result:#}");
    assert_eq!(first.outputs["status"], "success");
    assert_eq!(first.outputs["exit-code"], "0");
    let id = result["session_id"].as_str().unwrap();
    assert_eq!(first.outputs["session-id"], id);
    let handle: Value = serde_json::from_str(&first.outputs["handle"]).unwrap();
    assert_eq!(handle["session_id"], id);
    assert_eq!(handle["volume"], format!("caw-box-{id}"));
    assert!(
        !first.outputs["result"].contains(TEST_KEY) && !first.summary.contains(TEST_KEY),
        "the key leaked into the outputs"
    );

    check("the patch: a file, uploaded as an artifact");
    let patch_path = PathBuf::from(&first.outputs["patch"]);
    let patch = std::fs::read_to_string(&patch_path).unwrap();
    assert!(
        patch.contains("diff --git a/ci.txt b/ci.txt") && patch.contains("+from-ci"),
        "{patch}"
    );
    // The agent wrote into the checkout itself (bind mode): the patch is that change.
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("ci.txt")).unwrap(),
        "from-ci\n"
    );
    assert_eq!(first.uses.len(), 1, "the artifact step did not run");
    let (uses, given) = &first.uses[0];
    assert!(uses.starts_with("actions/upload-artifact@"), "{uses}");
    assert_eq!(given["name"], format!("caw-box-{id}"));
    let artifact_paths: Vec<&str> = given["path"].lines().collect();
    assert!(artifact_paths.contains(&patch_path.to_str().unwrap()));
    for p in &artifact_paths {
        assert!(Path::new(p).exists(), "artifact file {p} is missing");
    }

    check("the job summary");
    assert!(first.summary.contains("codex turn, success (exit 0)"));
    assert!(first.summary.contains(&format!("caw-box resume {id}")));
    assert!(first.summary.contains("ci.txt"), "{}", first.summary);

    check("a later job resumes from the handle output (same runner: the volume is here)");
    let again = run_action(
        &rig,
        workspace.path(),
        temp.path(),
        &[
            ("provider", "codex".to_string()),
            ("prompt", "RECALL".to_string()),
            ("resume", first.outputs["handle"].clone()),
            ("key-var", "OPENAI_API_KEY".to_string()),
            ("images", "skip".to_string()),
            ("caw-box-bin", caw_box),
        ],
        &[("OPENAI_API_KEY", TEST_KEY)],
    );
    let resumed: Value = serde_json::from_str(&again.outputs["result"]).unwrap();
    assert_eq!(resumed["session_id"], id);
    assert_eq!(resumed["turn"], 2);
    assert!(
        resumed["result"].as_str().unwrap().contains("otter"),
        "{resumed:#}"
    );
}

/// `$NAME` and `${NAME}` in a GitLab variable, from the variables defined so far.
fn expand(value: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let braced = chars.peek() == Some(&'{');
        if braced {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&n) = chars.peek() {
            if n.is_ascii_alphanumeric() || n == '_' {
                name.push(n);
                chars.next();
            } else {
                break;
            }
        }
        if braced {
            assert_eq!(chars.next(), Some('}'));
        }
        out.push_str(vars.get(&name).map(String::as_str).unwrap_or(""));
    }
    out
}

#[test]
fn the_gitlab_template_runs_a_turn_and_leaves_result_handle_patch_and_dotenv() {
    let rig = Rig::new("ci_gitlab");
    let project = fake_checkout();
    let template: Yaml = yaml_serde::from_str(
        &std::fs::read_to_string(repo_root().join("ci/gitlab/caw-box.gitlab-ci.yml")).unwrap(),
    )
    .unwrap();
    let job = &template[".caw-box"];

    // Predefined variables, the template's, then the extending job's (which win).
    let mut vars: HashMap<String, String> = HashMap::from([(
        "CI_PROJECT_DIR".to_string(),
        project.path().display().to_string(),
    )]);
    let mut ordered = Vec::new();
    for (k, v) in job["variables"].as_mapping().unwrap() {
        ordered.push((s(k), s(v)));
    }
    let mut job_vars = vec![
        ("CAW_BOX_SRC", repo_root().display().to_string()),
        ("CAW_BOX_BIN", env!("CARGO_BIN_EXE_caw-box").to_string()),
        ("CAW_BOX_PROVIDER", "codex".to_string()),
        (
            "CAW_BOX_PROMPT",
            "RUN:echo from-gitlab > gl.txt".to_string(),
        ),
        ("CAW_BOX_MODEL", "gpt-5.5".to_string()),
        ("CAW_BOX_KEY_VAR", "OPENAI_API_KEY".to_string()),
        ("CAW_BOX_ENDPOINT", rig.endpoint()),
        ("CAW_BOX_NETWORK", rig.network.clone()),
        ("CAW_BOX_ALLOW_HOSTS", format!("{}:8080", rig.stub)),
        (
            "CAW_BOX_BASE_IMAGE",
            "caw-box-local/node:20-bookworm".into(),
        ),
        ("OPENAI_API_KEY", TEST_KEY.to_string()),
    ];
    if Path::new(CA_BUNDLE).exists() {
        job_vars.push(("CAW_BOX_CA_CERT", CA_BUNDLE.to_string()));
    }
    for (k, v) in job_vars {
        ordered.retain(|(name, _)| name != k);
        ordered.push((k.to_string(), v));
    }
    for (k, v) in ordered {
        let value = expand(&v, &vars);
        vars.insert(k, value);
    }

    // GitLab runs the script lines in one shell that stops at the first failing line.
    let script: Vec<String> = job["script"].as_sequence().unwrap().iter().map(s).collect();
    let mut cmd = rig.caw_env("bash");
    cmd.args(["--noprofile", "--norc", "-eo", "pipefail", "-c"])
        .arg(script.join("\n"))
        .current_dir(project.path())
        .envs(&vars);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    check("artifacts: result.json, handle.json, caw-box.patch under the artifact paths");
    let artifact_dirs: Vec<String> = job["artifacts"]["paths"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(s)
        .collect();
    assert_eq!(artifact_dirs, ["caw-box-out/"]);
    let out_dir = project.path().join("caw-box-out");
    let result: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("result.json")).unwrap())
            .unwrap();
    assert_eq!(result["status"], "success", "{result:#}");
    let id = result["session_id"].as_str().unwrap();
    let handle: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("handle.json")).unwrap())
            .unwrap();
    assert_eq!(handle["session_id"], id);
    let patch = std::fs::read_to_string(out_dir.join("caw-box.patch")).unwrap();
    assert!(patch.contains("+from-gitlab"), "{patch}");

    check("the dotenv report later jobs read");
    let dotenv_path = s(&job["artifacts"]["reports"]["dotenv"]);
    let dotenv = std::fs::read_to_string(project.path().join(dotenv_path)).unwrap();
    let env: HashMap<&str, &str> = dotenv.lines().filter_map(|l| l.split_once('=')).collect();
    assert_eq!(env["CAW_BOX_SESSION_ID"], id);
    assert_eq!(env["CAW_BOX_STATUS"], "success");
    assert_eq!(env["CAW_BOX_EXIT_CODE"], "0");
    let from_dotenv: Value = serde_json::from_str(env["CAW_BOX_HANDLE"]).unwrap();
    assert_eq!(from_dotenv, handle);
    assert!(!dotenv.contains(TEST_KEY));

    check("the handle resumes the session");
    let (code, resumed, err) = rig.json_turn({
        let mut c = rig.caw();
        c.args(["resume", env["CAW_BOX_HANDLE"], "--env"])
            .arg(format!("OPENAI_API_KEY={TEST_KEY}"))
            .arg("RUN:cat gl.txt");
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(resumed["result"].as_str().unwrap().contains("from-gitlab"));
}

/// The release and images workflows, read as data (actionlint checks their syntax in
/// scripts/lint-workflows.sh): every release target, archives holding the man pages and the
/// completions under the names the install step fetches, and every provider image for two
/// architectures, from the Dockerfiles the binary embeds.
#[test]
fn the_release_and_image_workflows_cover_every_target_and_image() {
    let read = |p: &str| -> Yaml {
        yaml_serde::from_str(&std::fs::read_to_string(repo_root().join(p)).unwrap()).unwrap()
    };
    let release = read(".github/workflows/release.yml");
    let targets: Vec<String> = release["jobs"]["build"]["strategy"]["matrix"]["include"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|t| s(&t["target"]))
        .collect();
    for t in [
        "x86_64-unknown-linux-musl",
        "aarch64-unknown-linux-musl",
        "x86_64-apple-darwin",
        "aarch64-apple-darwin",
    ] {
        assert!(targets.iter().any(|x| x == t), "no {t} in {targets:?}");
    }
    // Its steps are scripts/dist.sh's (`make dist`, which the dist stage of `make test` runs).
    let text = std::fs::read_to_string(repo_root().join(".github/workflows/release.yml")).unwrap();
    for needle in [
        "scripts/dist.sh docs docs target/debug/caw-box",
        "scripts/dist.sh\n",
        r#"scripts/dist.sh archive "${{ matrix.target }}""#,
        "scripts/dist.sh sums",
    ] {
        assert!(text.contains(needle), "release.yml lacks {needle}");
    }
    let dist = std::fs::read_to_string(repo_root().join("scripts/dist.sh")).unwrap();
    for needle in [
        r#""$bin" man --dir "$dir/man""#,
        "completions bash",
        "completions zsh",
        "completions fish",
        r#"cp -R "$docs/man" "$docs/completions""#,
        r#"name="caw-box-$(version)-$target""#,
        r#">"$name.tar.gz.sha256""#,
    ] {
        assert!(dist.contains(needle), "scripts/dist.sh lacks {needle}");
    }
    // One toolchain: rust-toolchain.toml's version in every workflow that builds.
    let toolchain = std::fs::read_to_string(repo_root().join("rust-toolchain.toml")).unwrap();
    let channel = toolchain
        .lines()
        .find_map(|l| l.strip_prefix("channel = "))
        .expect("a channel in rust-toolchain.toml")
        .trim_matches('"');
    for workflow in ["release.yml", "drift.yml"] {
        let text =
            std::fs::read_to_string(repo_root().join(".github/workflows").join(workflow)).unwrap();
        let pins: Vec<&str> = text
            .split("dtolnay/rust-toolchain@")
            .skip(1)
            .map(|rest| rest.split_whitespace().next().unwrap_or(""))
            .collect();
        assert!(
            !pins.is_empty() && pins.iter().all(|p| *p == channel),
            "{workflow} installs {pins:?}, rust-toolchain.toml says {channel}"
        );
    }
    // The names the CI templates' install step downloads.
    let script = std::fs::read_to_string(repo_root().join("ci/run-turn.sh")).unwrap();
    assert!(script.contains(r#"name="caw-box-${CAW_BOX_VERSION}-$triple""#));
    assert!(script.contains(r#""$CAW_BOX_RELEASES/v${CAW_BOX_VERSION}/$name.tar.gz.sha256""#));

    let images = read(".github/workflows/images.yml");
    let matrix: Vec<String> = images["jobs"]["provider"]["strategy"]["matrix"]["image"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(s)
        .collect();
    let mut expected: Vec<String> = caw_box::provider::ProviderKind::ALL
        .iter()
        .map(|p| p.image_name().to_string())
        .collect();
    expected.sort();
    let mut got = matrix.clone();
    got.sort();
    assert_eq!(got, expected);
    for p in &matrix {
        assert!(repo_root()
            .join("images")
            .join(p)
            .join("Dockerfile")
            .is_file());
    }
    assert_eq!(
        s(&images["env"]["PLATFORMS"]),
        "linux/amd64,linux/arm64",
        "multi-arch"
    );
    let images_text =
        std::fs::read_to_string(repo_root().join(".github/workflows/images.yml")).unwrap();
    assert!(images_text.contains("ghcr.io/$owner/caw-box"));
    assert!(images_text.contains("docker/build-push-action"));
}
