//! `caw-box auth login --backend kubernetes` (issue 45): the vendor's login as a pod of the
//! lab, its result in this host's store, as on Docker (tests/e2e/login.rs, login_claude.rs,
//! login_gemini.rs): codex's failure cases, then each of the four vendors' flows approved.
//!
//! The stub stands in for OpenAI's and Google's auth servers as on Docker: a pod serving HTTPS
//! on 443 with a certificate for `auth.openai.com`, `oauth2.googleapis.com` and
//! `www.googleapis.com` of a CA the test makes (`--ca-cert`). The lab has no DNS:
//! `CAW_BOX_HOST_ALIASES` gives caw-box's pods a hosts-file line for those names (the login
//! pod's proxy sidecar resolves them there). The stub runs as nobody, so its pod lowers
//! `ip_unprivileged_port_start` (a safe sysctl) to listen on 443.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use super::{caw_k8s, Lab};
use crate::common::*;
use crate::login::{read_prompt, status_items_of, store_snapshot_of, OPENAI_AUTH};

/// The auth hosts the stub stands in for.
const HOSTS: [&str; 5] = [
    OPENAI_AUTH,
    "platform.claude.com",
    "api.anthropic.com",
    "oauth2.googleapis.com",
    "www.googleapis.com",
];

/// The lab with the four providers' images and the stub as the auth `HOSTS` holding `login`:
/// the stub's pod IP, and the test CA's PEM file (in a directory kept while the test runs).
fn auth_stub_on_the_lab(lab: &Lab, login: &crate::oauth::Login) -> (String, tempfile::TempDir) {
    lab.load_images(&[
        "caw-box/codex:latest",
        "caw-box/opencode:latest",
        "caw-box/claude-code:latest",
        "caw-box/gemini:latest",
        &stub_image(),
    ]);
    let names: Vec<String> = HOSTS.iter().map(|h| h.to_string()).collect();
    let tls = caw_box::auth::intercept::intercept_tls(&names).unwrap();
    let key = String::from_utf8(tls.key_pem.expose().to_vec()).unwrap();
    let env = serde_json::json!([
        {"name": "STUB_EXPECT_KEY", "value": TEST_KEY},
        {"name": "STUB_OAUTH", "value": format!("{},{}", login.access, login.refresh)},
        {"name": "STUB_TLS_CERT", "value": tls.cert_pem},
        {"name": "STUB_TLS_KEY", "value": key},
    ]);
    let port_443 = serde_json::json!({"securityContext": {"sysctls": [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}
    ]}});
    let endpoint = lab.start_stub_with_spec("stub-auth", env, port_443);
    let ip = endpoint
        .trim_start_matches("http://")
        .split(':')
        .next()
        .unwrap()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), &tls.ca_pem).unwrap();
    (ip, dir)
}

/// `caw-box --backend kubernetes auth login --provider <provider> --json`, trusting the
/// test's CA, the auth `HOSTS` resolved to the stub's pod: running, stdin (a pasted code),
/// stdout and stderr piped.
fn spawn_login(
    lab: &Lab,
    data: &std::path::Path,
    stub_ip: &str,
    ca: &std::path::Path,
    provider: &str,
) -> std::process::Child {
    let aliases: Vec<String> = HOSTS.iter().map(|h| format!("{h}:{stub_ip}")).collect();
    let mut c = caw_k8s(data, data, lab);
    c.args(["auth", "login", "--provider", provider, "--json"])
        .arg("--ca-cert")
        .arg(ca.join("ca.pem"))
        .args(["--timeout", "2m"])
        .env("CAW_BOX_HOST_ALIASES", aliases.join(","))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// A login that ended well (`out`): it told none of `login`'s tokens, left no caw-box
/// object in the cluster, and `auth status` lists `targets` of `provider` from source `login`.
fn stored_from_the_pod(
    lab: &Lab,
    data: &std::path::Path,
    out: &std::process::Output,
    login: &crate::oauth::Login,
    provider: &str,
    targets: &[&str],
) {
    assert_eq!(out.status.code(), Some(0), "{provider}: {}", stderr_of(out));
    let said = format!("{}{}", stdout_of(out), stderr_of(out));
    for secret in &login.secrets {
        assert!(!said.contains(secret.as_str()), "{said}");
    }
    assert_eq!(lab.caw_objects(), Vec::<String>::new());
    let mut status = caw_k8s(data, data, lab);
    status.args(["auth", "status", "--json"]);
    let items = status_items_of(status, provider);
    for target in targets {
        assert!(
            items
                .iter()
                .any(|i| i["target"] == *target && i["source"] == "login"),
            "{provider}: {items:?}"
        );
    }
}

/// The login pods in the lab now.
fn login_pods(lab: &Lab) -> Vec<String> {
    lab.kubectl_ok(&["get", "pod", "-l", "io.caw-box.role=login", "-o", "name"])
        .lines()
        .map(str::to_string)
        .collect()
}

/// codex's device-code login as a pod of the lab, for real. First what must change nothing
/// (a store holding a key already): a code the vendor denies (exit 4, one line), Ctrl-C while
/// the CLI waits for the code (exit 130, one line), a caw-box killed outright mid-flow (its
/// pod stays, holding nobody's login yet, until the next login of this host removes it):
/// each leaves the store byte for byte as it was and no pod of its own. Then the login
/// approved at the stub: codex writes `~/.codex/auth.json` in the pod, caw-box reads it out
/// of the pod after the CLI ended and stores it (source `login`, the stub's tokens), and no
/// caw-box object is left in the cluster.
#[test]
fn kubernetes_logins_run_as_pods_and_leave_nothing() {
    check("lab up");
    let lab = Lab::up();
    let login = crate::oauth::codex_login(1);
    let (stub_ip, ca) = auth_stub_on_the_lab(&lab, &login);
    let data = tempfile::tempdir().unwrap();
    let mut key = caw_k8s(data.path(), data.path(), &lab);
    key.args(["auth", "login", "--provider", "codex", "--with-api-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = key.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), TEST_KEY.as_bytes()).unwrap();
    let out = wait_with_deadline(child, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let before = store_snapshot_of(data.path());
    // Exit `code` and one line (returned), nothing of caw-box's left, the store as it was.
    let changed_nothing = |out: &std::process::Output, code: i32, what: &str| {
        let err = stderr_of(out);
        assert_eq!(out.status.code(), Some(code), "{what}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{what}: {err}");
        assert_eq!(lab.caw_objects(), Vec::<String>::new(), "{what}");
        let now = store_snapshot_of(data.path());
        assert!(now == before, "{what} changed the store");
        err
    };

    check("a denied code: exit 4, one line, nothing left, the store unchanged");
    let mut child = spawn_login(&lab, data.path(), &stub_ip, ca.path(), "codex");
    let (url, code) = read_prompt(&mut child);
    assert_eq!(url, format!("https://{OPENAI_AUTH}/codex/device"));
    assert_eq!(login_pods(&lab).len(), 1, "the login runs as a pod");
    let stub = StubControl::Http(format!("http://{stub_ip}:8080"));
    stub.json("POST", &format!("/_stub/device/deny?code={code}"));
    let out = wait_with_deadline(child, Duration::from_secs(90));
    assert!(changed_nothing(&out, 4, "a denied login").contains("codex login failed"));

    check("Ctrl-C while the CLI waits: exit 130, one line, nothing left");
    let mut child = spawn_login(&lab, data.path(), &stub_ip, ca.path(), "codex");
    read_prompt(&mut child);
    let pid = child.id().to_string();
    let int = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status();
    assert!(int.unwrap().success());
    let out = wait_with_deadline(child, Duration::from_secs(90));
    assert!(changed_nothing(&out, 130, "an interrupted login").contains("interrupted"));

    check("caw-box killed mid-flow: its pod stays until the next login");
    let mut child = spawn_login(&lab, data.path(), &stub_ip, ca.path(), "codex");
    read_prompt(&mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(login_pods(&lab).len(), 1, "the killed login's pod");
    assert!(
        store_snapshot_of(data.path()) == before,
        "a killed login changed the store"
    );

    check("approved: stored from the pod, source login, nothing left");
    let mut child = spawn_login(&lab, data.path(), &stub_ip, ca.path(), "codex");
    let (_, code) = read_prompt(&mut child);
    // The killed login's pod went first: this login's is the only one.
    assert_eq!(login_pods(&lab).len(), 1, "{:?}", login_pods(&lab));
    let approved = stub.json("POST", &format!("/_stub/device/approve?code={code}"));
    assert_eq!(approved["state"], "approve", "{approved}");
    let out = wait_with_deadline(child, Duration::from_secs(90));
    stored_from_the_pod(
        &lab,
        data.path(),
        &out,
        &login,
        "codex",
        &[".codex/auth.json"],
    );
    let stored: Value = serde_json::from_slice(
        &std::fs::read(data.path().join("auth/codex/home/.codex/auth.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(stored["tokens"]["refresh_token"], login.refresh.as_str());

    check("opencode's device-code login as a pod: stored");
    let mut child = spawn_login(&lab, data.path(), &stub_ip, ca.path(), "opencode");
    let (_, code) = read_prompt(&mut child);
    stub.json("POST", &format!("/_stub/device/approve?code={code}"));
    let out = wait_with_deadline(child, Duration::from_secs(90));
    stored_from_the_pod(
        &lab,
        data.path(),
        &out,
        &login,
        "opencode",
        &[".local/share/opencode/auth.json"],
    );

    // The paste-code flows: the code goes to the pod's stdin (claude's, a pipe) or to its
    // terminal (gemini's: its login runs only in its UI, which stays after it).
    let pastes = [
        (
            "claude",
            "claude_code",
            "claude",
            ".claude/.credentials.json",
        ),
        ("gemini", "gemini", "google", ".gemini/oauth_creds.json"),
    ];
    for (provider, name, page, target) in pastes {
        check(&format!(
            "{provider}'s login as a pod, the code pasted: stored"
        ));
        let mut child = spawn_login(&lab, data.path(), &stub_ip, ca.path(), provider);
        let url = crate::login_claude::read_url(&mut child, name);
        let shown = stub.json(
            "POST",
            &format!(
                "/_stub/{page}/approve?url={}",
                crate::login_claude::url_encoded(&url)
            ),
        );
        let code = shown["code"].as_str().unwrap().to_string();
        crate::login_claude::paste(&mut child, &code);
        let out = wait_with_deadline(child, Duration::from_secs(90));
        assert!(!stdout_of(&out).contains(&code) && !stderr_of(&out).contains(&code));
        stored_from_the_pod(&lab, data.path(), &out, &login, name, &[target]);
    }
    drop(lab);
}
