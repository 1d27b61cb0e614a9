//! `caw-box auth login` (issue 45): a login made in the box, with no vendor CLI on the host.
//! (claude's paste-code flow: login_claude.rs.)
//!
//! `--with-api-key` reads the key from stdin into the store. The vendors' device-code flows
//! (codex `codex login --device-auth`; opencode `opencode auth login --provider openai
//! --method "ChatGPT Pro/Plus (headless)"`, the same OpenAI endpoints) run for real in a
//! login container whose only way out is the egress proxy admitting `auth.openai.com:443`;
//! the stub stands in for OpenAI's auth server under that very name: it is the network alias
//! of a stub container serving HTTPS with a certificate of a CA this test makes, which the
//! login container trusts through `--ca-cert` (codex reads `CODEX_CA_CERTIFICATE`, opencode
//! `NODE_EXTRA_CA_CERTS`). What the CLI asks for, as codex 0.169.0 does it
//! (codex-rs/login/src/device_code_auth.rs):
//! - `POST https://auth.openai.com/api/accounts/deviceauth/usercode` `{"client_id"}` →
//!   `{"device_auth_id","user_code","interval"}` (the interval a string of seconds; a 404 is
//!   "device code login is not enabled");
//! - it prints `https://auth.openai.com/codex/device` and the code, then polls
//!   `POST …/api/accounts/deviceauth/token` `{"device_auth_id","user_code"}`: 403 or 404 while
//!   pending, 200 `{"authorization_code","code_challenge","code_verifier"}` once approved, any
//!   other status ends it ("device auth failed with status …");
//! - `POST https://auth.openai.com/oauth/token` (form, `grant_type=authorization_code`,
//!   `redirect_uri=https://auth.openai.com/deviceauth/callback`) → `{"id_token",
//!   "access_token","refresh_token"}`, written to `~/.codex/auth.json`.
//!
//! Cost: about 80 s of test time over six tests, each login a few seconds; a codex turn on
//! a ChatGPT login takes ~25 s here (as in oauth.rs), so each device-code flow is proven with
//! one turn across an expiry (the stored login used, refreshed once) rather than two.

use std::io::Write;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::common::*;

/// `auth status --json`'s items of provider `p`.
pub(crate) fn status_items(rig: &Rig, p: &str) -> Vec<Value> {
    let mut c = rig.caw();
    c.args(["auth", "status", "--json"]);
    status_items_of(c, p)
}

/// Provider `p`'s items of `auth status --json` as `status` (that command, of any backend)
/// prints them.
pub(crate) fn status_items_of(status: Command, p: &str) -> Vec<Value> {
    let out = run(status);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|row| row["provider"] == p)
        .map(|row| row["items"].as_array().unwrap().clone())
        .unwrap_or_default()
}

/// `--with-api-key` for every provider: the key goes in on stdin (never in the process's
/// arguments, never echoed), lands in the store as the provider's key variable with source
/// `login`, and a brokered codex turn runs on it (the stub accepts only that key).
#[test]
fn with_api_key_stores_a_key_from_stdin_for_every_provider() {
    let rig = Rig::new("login-api-key");
    for p in ALL {
        let mut c = rig.caw();
        c.args(["auth", "login", "--provider", p.name, "--with-api-key"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&cmdline).contains(TEST_KEY));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{TEST_KEY}\n").as_bytes())
            .unwrap();
        let out = wait_with_deadline(child, std::time::Duration::from_secs(30));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            p.name,
            stderr_of(&out)
        );
        let said = format!("{}{}", stdout_of(&out), stderr_of(&out));
        assert!(!said.contains(TEST_KEY), "{said}");
        assert!(
            said.contains(&format!("{}: {} stored (source login)", p.name, p.key_var)),
            "{said}"
        );
        let items = status_items(&rig, p.name);
        assert!(
            items
                .iter()
                .any(|i| i["target"] == p.key_var && i["source"] == "login" && i["kind"] == "env"),
            "{items:?}"
        );
        assert!(!serde_json::to_string(&items).unwrap().contains(TEST_KEY));
    }
    let env = std::fs::read(rig.data_dir.path().join("auth/codex/env")).unwrap();
    assert!(String::from_utf8_lossy(&env).contains(TEST_KEY));
    // Typed on a terminal (script(1) gives caw-box one): not echoed.
    let typed = format!("sk-typed-{}", uuid::Uuid::new_v4().simple());
    let mut c = Command::new("script");
    c.args(["-qfec"])
        .arg(format!(
            "{} auth login --provider opencode --with-api-key",
            env!("CARGO_BIN_EXE_caw-box")
        ))
        .arg("/dev/null")
        .env("CAW_BOX_DATA_DIR", rig.data_dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Typed after the prompt, as a person would (caw-box shows it once echo is off).
    let mut screen = Vec::new();
    let mut stdout = child.stdout.take().unwrap();
    read_until(&mut stdout, &mut screen, "Enter ends it");
    stdin.write_all(format!("{typed}\n").as_bytes()).unwrap();
    std::io::Read::read_to_end(&mut stdout, &mut screen).unwrap();
    let out = wait_with_deadline(child, std::time::Duration::from_secs(30));
    drop(stdin);
    let screen = format!("{}{}", String::from_utf8_lossy(&screen), stderr_of(&out));
    assert_eq!(out.status.code(), Some(0), "{screen}");
    assert!(!screen.contains(&typed), "echoed: {screen}");
    let env = std::fs::read(rig.data_dir.path().join("auth/opencode/env")).unwrap();
    assert!(String::from_utf8_lossy(&env).contains(&typed));

    // `auth rm` removes a login's key as a collected one's.
    let out = rig.caw_run(&["auth", "rm", "--provider", "gemini"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(status_items(&rig, "gemini"), Vec::<Value>::new());

    // Downstream it is a stored key like a collected one: a brokered turn uses it.
    let (code, json, stderr) = rig.json_turn(rig.run_cmd_stored_key(CODEX, "REMEMBER:keyed", &[]));
    assert_eq!(code, 0, "{json} {stderr}");
    assert!(
        json["result"]
            .as_str()
            .unwrap_or("")
            .contains("Noted: keyed."),
        "{json}"
    );
    assert!(!stderr.contains(TEST_KEY));

    // No key, a key with spaces: exit 2, one line, nothing stored.
    for input in ["\n", "two words\n"] {
        let mut c = rig.caw();
        c.args(["auth", "login", "--provider", "gemini", "--with-api-key"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = wait_with_deadline(child, std::time::Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
        assert_eq!(
            stderr_of(&out).trim().lines().count(),
            1,
            "{}",
            stderr_of(&out)
        );
        assert!(!stderr_of(&out).contains("two words"));
    }
}

/// A login needs its way out: `--network none` or `host` is refused in one line before
/// anything is made (exit 2).
#[test]
fn a_login_network_without_a_way_out_is_refused_in_one_line() {
    let data = tempfile::tempdir().unwrap();
    // A flow needs its way out: --network none or host is refused before anything is made.
    for network in ["none", "host"] {
        let out = Command::new(env!("CARGO_BIN_EXE_caw-box"))
            .env("CAW_BOX_DATA_DIR", data.path())
            .args(["auth", "login", "--provider", "codex", "--network", network])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
        assert_eq!(
            stderr_of(&out).trim().lines().count(),
            1,
            "{}",
            stderr_of(&out)
        );
    }
}

/// The vendor's auth host the device-code flows reach (the stub's alias).
pub(crate) const OPENAI_AUTH: &str = "auth.openai.com";

/// A rig whose stub is also the vendor's auth and API `hosts` on the test's network
/// (`auth.openai.com`, …), serving HTTPS on 443 with a certificate of a CA made for the test
/// (its PEM file returned, for `--ca-cert`), holding the login `login` that an approved code
/// is traded for.
pub(crate) fn auth_rig(
    test: &str,
    login: &crate::oauth::Login,
    hosts: &[&str],
) -> (Rig, tempfile::TempDir) {
    let names: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    let tls = caw_box::auth::intercept::intercept_tls(&names).unwrap();
    let key = String::from_utf8(tls.key_pem.expose().to_vec()).unwrap();
    let rig = Rig::with_stub_aliases(
        test,
        &[
            format!("STUB_OAUTH={},{}", login.access, login.refresh),
            format!("STUB_TLS_CERT={}", tls.cert_pem),
            format!("STUB_TLS_KEY={key}"),
        ],
        hosts,
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), &tls.ca_pem).unwrap();
    (rig, dir)
}

/// `caw-box auth login --provider <p> --json` on the test's network, trusting the test's
/// CA: the running process, its stdin (a pasted code goes there), stdout (the prompt's JSON
/// line comes there) and stderr piped.
pub(crate) fn spawn_login(rig: &Rig, provider: &str, ca: &std::path::Path) -> Child {
    let mut c = rig.caw();
    c.args(["auth", "login", "--provider", provider, "--json"])
        .args(["--network", &rig.network])
        .arg("--ca-cert")
        .arg(ca.join("ca.pem"))
        .args(["--timeout", "2m"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// Reads the prompt `caw-box auth login --json` prints: (url, code).
pub(crate) fn read_prompt(child: &mut std::process::Child) -> (String, String) {
    use std::io::BufRead;
    let stdout = child.stdout.as_mut().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let prompt: Value = serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("no prompt on stdout ({e}): {line:?}"));
    (
        prompt["url"].as_str().unwrap().to_string(),
        prompt["code"].as_str().unwrap().to_string(),
    )
}

/// What the store holds, file by file (to compare before and after a failed login).
pub(crate) fn store_snapshot(rig: &Rig) -> Vec<(String, Vec<u8>)> {
    store_snapshot_of(rig.data_dir.path())
}

/// [`store_snapshot`] of the data directory `data`.
pub(crate) fn store_snapshot_of(data: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let root = data.join("auth");
    let mut out = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
            } else if !path.ends_with(".lock") {
                let rel = path.strip_prefix(&root).unwrap().display().to_string();
                out.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// A login that ended as `what` with exit `code` and one line on stderr (returned), leaving
/// nothing on Docker and the store as it was `before`.
pub(crate) fn failed_and_changed_nothing(
    rig: &Rig,
    out: &std::process::Output,
    code: i32,
    what: &str,
    before: &[(String, Vec<u8>)],
) -> String {
    let err = stderr_of(out);
    assert_eq!(out.status.code(), Some(code), "{what}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{what}: {err}");
    nothing_left(rig);
    assert!(store_snapshot(rig) == before, "{what} changed the store");
    err
}

/// Reads `from` onto `screen` byte by byte until it shows `prompt` (a terminal's prompt has
/// no line end).
pub(crate) fn read_until(from: &mut impl std::io::Read, screen: &mut Vec<u8>, prompt: &str) {
    while !String::from_utf8_lossy(screen).contains(prompt) {
        let mut byte = [0u8; 1];
        let n = from.read(&mut byte).unwrap();
        assert!(n == 1, "no prompt: {}", String::from_utf8_lossy(screen));
        screen.push(byte[0]);
    }
}

/// A login whose output `text` ends with a line saying `said`, leaving nothing on Docker and
/// the store as it was `before` (`what` ended it).
pub(crate) fn ended_saying(
    rig: &Rig,
    text: &str,
    said: &str,
    what: &str,
    before: &[(String, Vec<u8>)],
) {
    let last = text.trim().lines().last().unwrap_or_default();
    assert!(last.contains(said), "{what}: {text}");
    nothing_left(rig);
    assert!(store_snapshot(rig) == before, "{what} changed the store");
}

/// Nothing of this test's is left on Docker (containers, the logins' networks) but the stub
/// and its network.
pub(crate) fn nothing_left(rig: &Rig) {
    let left: Vec<String> = rig
        .caw_containers()
        .into_iter()
        .filter(|c| !c.trim_start_matches('/').starts_with("stub-"))
        .collect();
    assert_eq!(left, Vec::<String>::new());
    let networks = Command::new("docker")
        .args(["network", "ls", "--format", "{{.Name}}", "--filter"])
        .arg(format!("label={TEST_LABEL}={}", rig.run_id))
        .args(["--filter", "label=io.caw-box.role=login"])
        .output()
        .unwrap();
    assert_eq!(stdout_of(&networks).trim(), "", "login networks left");
}

/// `auth status` lists `target` of `provider` from source `login`, with its expiry; and the
/// login's `refresh` token is in no file of this host outside the store (HOME and the
/// temporary directories scanned; the store itself is the positive control).
pub(crate) fn stored_from_login(rig: &Rig, provider: &str, target: &str, refresh: &str) {
    let items = status_items(rig, provider);
    let item = items
        .iter()
        .find(|i| i["target"] == target)
        .unwrap_or_else(|| panic!("{items:?}"));
    assert_eq!(item["source"], "login");
    assert!(item["expires_at"].as_u64().is_some(), "{item}");
    let found = host_files_containing(refresh);
    let store = rig.data_dir.path().join("auth");
    assert!(
        found.iter().any(|f| f.starts_with(&store)),
        "the scan finds nothing: {found:?}"
    );
    let outside: Vec<_> = found.iter().filter(|f| !f.starts_with(&store)).collect();
    assert_eq!(outside, Vec::<&std::path::PathBuf>::new());
}

/// The stub expires the login's access token, and a brokered turn of `provider` on it
/// starts (prompt `HOLD:scan REMEMBER:<word>`, the broker refreshing at the stub's token
/// endpoint), for [`held_turn_holds_only_the_placeholder`].
pub(crate) fn expired_and_turned(
    rig: &Rig,
    provider: &str,
    model: Option<&str>,
    word: &str,
) -> Child {
    rig.stub_control().json("POST", "/_stub/oauth/expire");
    let endpoint = rig.endpoint();
    let mut c = rig.caw();
    c.args(["run", "--provider", provider, "--network", &rig.network])
        .args(["--endpoint", &endpoint, "-o", "json"])
        .args(model.map(|m| ["--model", m]).into_iter().flatten())
        .arg(format!("HOLD:scan REMEMBER:{word}"))
        .env(
            "CAW_BOX_OAUTH_TOKEN_URL",
            format!("{endpoint}/v1/oauth/token"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// codex's device-code login, for real: the CLI asks the stub (as auth.openai.com) for a
/// code, caw-box prints the URL and code, the test approves it at the stub, codex trades it
/// for the login and writes `~/.codex/auth.json` in the login container, which caw-box
/// stores (source `login`) and removes the container. From then on it is a brokered login:
/// a turn runs on it with a placeholder in the agent's container, the stub expires the
/// access token, and the broker refreshes it on the next turn. Nothing of the login is on
/// this host outside the store.
#[test]
fn codex_device_code_login_is_stored_brokered_and_refreshed() {
    let login = crate::oauth::codex_login(1);
    let (rig, ca) = auth_rig("login-codex", &login, &[OPENAI_AUTH]);
    let mut child = spawn_login(&rig, "codex", ca.path());
    let (url, code) = read_prompt(&mut child);
    assert_eq!(url, format!("https://{OPENAI_AUTH}/codex/device"));
    let approved = rig
        .stub_control()
        .json("POST", &format!("/_stub/device/approve?code={code}"));
    assert_eq!(approved["state"], "approve", "{approved}");
    let out = wait_with_deadline(child, std::time::Duration::from_secs(90));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let said = format!("{}{}", stdout_of(&out), stderr_of(&out));
    let done: Value = serde_json::from_str(stdout_of(&out).trim())
        .unwrap_or_else(|e| panic!("no result object ({e}): {said}"));
    assert_eq!(done["provider"], "codex", "{done}");
    assert_eq!(done["stored"][0]["target"], ".codex/auth.json", "{done}");
    assert_eq!(done["stored"][0]["source"], "login", "{done}");
    for secret in &login.secrets {
        assert!(!said.contains(secret.as_str()), "{said}");
    }
    nothing_left(&rig);

    // The store has the login codex wrote, as a collected one would be, from `login`, and
    // nothing of it is on this host outside the store.
    stored_from_login(&rig, "codex", ".codex/auth.json", &login.refresh);
    let stored: Value = serde_json::from_slice(
        &std::fs::read(rig.data_dir.path().join("auth/codex/home/.codex/auth.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(stored["tokens"]["refresh_token"], login.refresh.as_str());
    assert_eq!(stored["tokens"]["access_token"], login.access.as_str());

    // The stub expires the access token; a brokered turn on the login then runs: the broker
    // meets the 401, refreshes once, retries (one turn proves both: a codex turn on a
    // ChatGPT login costs tens of seconds here).
    // While it runs (held at the stub once past the refresh), its container is scanned:
    // it holds the placeholder login and none of the real tokens, first or refreshed.
    let child = expired_and_turned(&rig, "codex", Some("gpt-5.5"), "device");
    let patterns: Vec<String> = login
        .secrets
        .iter()
        .flat_map(|t| (0..=t.len() - 16).map(move |i| t[i..i + 16].to_string()))
        .collect();
    let s = held_turn_holds_only_the_placeholder(
        &rig,
        child,
        &patterns,
        ".codex/auth.json",
        "Noted: device.",
    );
    let stored: Value = serde_json::from_slice(
        &std::fs::read(rig.data_dir.path().join("auth/codex/home/.codex/auth.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(stored["tokens"]["refresh_token"], s["refresh_token"]);
    // The model saw the real, refreshed token from the broker, never the CLI's placeholder.
    let requests = rig.stub_requests();
    let model: Vec<&Value> = requests
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/v1/responses"))
        })
        .collect();
    assert!(!model.is_empty(), "{requests:#?}");
    for r in &model {
        let auth = r["headers"]["authorization"].as_str().unwrap_or("");
        assert!(!auth.contains("cawbox-placeholder"), "{r:#}");
    }
}

/// Files under this host's HOME and temporary directories that contain `needle` (the
/// places a CLI or caw-box could have left a copy; the test's own store is under /tmp):
/// files under 1 MiB, outside toolchains and build output.
pub(crate) fn host_files_containing(needle: &str) -> Vec<std::path::PathBuf> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let script = r#"find "$@" -xdev \( -name .cargo -o -name .rustup -o -name target \
        -o -name node_modules -o -name .cache -o -name .pyenv -o -name .npm \) -prune -o -type f -size -1024k -print0 \
        | xargs -0 grep -lsF -e "$NEEDLE" --"#;
    let out = Command::new("bash")
        .args(["-c", script, "scan", home.as_str(), "/tmp", "/var/tmp"])
        .env("NEEDLE", needle)
        .output()
        .unwrap();
    stdout_of(&out)
        .lines()
        .map(std::path::PathBuf::from)
        .collect()
}

/// A denied code, Ctrl-C mid-flow and the timeout: one line, the right exit code (4, 130,
/// 124), nothing left on Docker, the store as it was. And a flow the vendor switched off:
/// one line naming the alternatives.
#[test]
fn a_denied_interrupted_or_switched_off_device_login_changes_nothing() {
    let login = crate::oauth::codex_login(1);
    let (rig, ca) = auth_rig("login-codex-fail", &login, &[OPENAI_AUTH]);
    // Something stored already, which must stay as it is.
    let mut c = rig.caw();
    c.args(["auth", "login", "--provider", "codex", "--with-api-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(TEST_KEY.as_bytes())
        .unwrap();
    assert_eq!(
        wait_with_deadline(child, std::time::Duration::from_secs(30))
            .status
            .code(),
        Some(0)
    );
    let before = store_snapshot(&rig);

    // Denied at the vendor.
    let mut child = spawn_login(&rig, "codex", ca.path());
    let (_, code) = read_prompt(&mut child);
    rig.stub_control()
        .json("POST", &format!("/_stub/device/deny?code={code}"));
    let out = wait_with_deadline(child, std::time::Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(4), "{}", stderr_of(&out));
    assert_eq!(
        stderr_of(&out).trim().lines().count(),
        1,
        "{}",
        stderr_of(&out)
    );
    assert!(
        stderr_of(&out).contains("codex login failed"),
        "{}",
        stderr_of(&out)
    );
    nothing_left(&rig);
    assert!(
        store_snapshot(&rig) == before,
        "a denied login changed the store"
    );

    // Ctrl-C while the CLI waits for the code to be entered.
    let mut child = spawn_login(&rig, "codex", ca.path());
    read_prompt(&mut child);
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = wait_with_deadline(child, std::time::Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(130), "{}", stderr_of(&out));
    assert_eq!(
        stderr_of(&out).trim().lines().count(),
        1,
        "{}",
        stderr_of(&out)
    );
    nothing_left(&rig);
    assert!(
        store_snapshot(&rig) == before,
        "an interrupted login changed the store"
    );

    // caw-box killed outright mid-flow: its login container, proxy and network stay (no
    // process left to remove them) until the next login of this host, which removes them
    // first (here it then times out at once).
    let mut child = spawn_login(&rig, "codex", ca.path());
    read_prompt(&mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        rig.caw_containers()
            .iter()
            .any(|c| c.contains("caw-box-login-")),
        "{:?}",
        rig.caw_containers()
    );
    let out = run({
        let mut c = rig.caw();
        c.args([
            "auth",
            "login",
            "--provider",
            "codex",
            "--network",
            &rig.network,
        ])
        .args(["--timeout", "1ms"]);
        c
    });
    assert_eq!(out.status.code(), Some(124), "{}", stderr_of(&out));
    nothing_left(&rig);
    assert!(
        store_snapshot(&rig) == before,
        "a killed login changed the store"
    );

    // The timeout while the code waits to be entered: 124, one line, nothing left.
    let out = run({
        let mut c = rig.caw();
        c.args([
            "auth",
            "login",
            "--provider",
            "codex",
            "--network",
            &rig.network,
        ])
        .args(["--timeout", "4s", "--ca-cert"])
        .arg(ca.path().join("ca.pem"));
        c
    });
    assert_eq!(out.status.code(), Some(124), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("To log in to codex: open https://auth.openai.com/codex/device"),
        "{err}"
    );
    ended_saying(
        &rig,
        &err,
        "not finished within 4s",
        "a timed-out login",
        &before,
    );

    // Switched off for the account: codex gets a 404 for a code.
    rig.stub_control().json("POST", "/_stub/device/disable");
    let out = run({
        let mut c = rig.caw();
        c.args([
            "auth",
            "login",
            "--provider",
            "codex",
            "--network",
            &rig.network,
        ])
        .arg("--ca-cert")
        .arg(ca.path().join("ca.pem"));
        c
    });
    assert_eq!(out.status.code(), Some(4), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("switched off") && err.contains("--with-api-key"),
        "{err}"
    );
    nothing_left(&rig);
    assert!(
        store_snapshot(&rig) == before,
        "a refused login changed the store"
    );
}

/// opencode's ChatGPT login runs the same OpenAI device-code flow (`opencode auth login
/// --provider openai --method "ChatGPT Pro/Plus (headless)"`, opencode 1.18.33): approved at
/// the stub, opencode writes its `openai` OAuth login to `~/.local/share/opencode/auth.json`,
/// which is stored with source `login`; a turn on it after an expiry gets it refreshed.
#[test]
fn opencode_chatgpt_device_code_login_is_stored_and_refreshed() {
    let login = crate::oauth::codex_login(1);
    let (rig, ca) = auth_rig("login-opencode", &login, &[OPENAI_AUTH]);
    let mut child = spawn_login(&rig, "opencode", ca.path());
    let (url, code) = read_prompt(&mut child);
    assert!(url.starts_with(&format!("https://{OPENAI_AUTH}/")), "{url}");
    rig.stub_control()
        .json("POST", &format!("/_stub/device/approve?code={code}"));
    let out = wait_with_deadline(child, std::time::Duration::from_secs(90));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    nothing_left(&rig);
    let items = status_items(&rig, "opencode");
    assert!(
        items
            .iter()
            .any(|i| i["target"] == ".local/share/opencode/auth.json" && i["source"] == "login"),
        "{items:?}"
    );
    let stored: Value = serde_json::from_slice(
        &std::fs::read(
            rig.data_dir
                .path()
                .join("auth/opencode/home/.local/share/opencode/auth.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(stored["openai"]["type"], "oauth", "{stored}");
    assert_eq!(stored["openai"]["refresh"], login.refresh.as_str());

    // A brokered turn on it after an expiry: opencode posts to chatgpt.com, which the turn's
    // broker stands in for; it meets the 401, refreshes once and retries.
    rig.stub_control().json("POST", "/_stub/oauth/expire");
    let endpoint = rig.endpoint();
    let mut c = rig.caw();
    c.args(["run", "--provider", "opencode", "--network", &rig.network])
        .args(["--endpoint", &endpoint, "--model", "gpt-5.5", "-o", "json"])
        .arg("REMEMBER:headless")
        .env(
            "CAW_BOX_OAUTH_TOKEN_URL",
            format!("{endpoint}/v1/oauth/token"),
        );
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        json["result"]
            .as_str()
            .unwrap()
            .contains("Noted: headless."),
        "{json}"
    );
    let s = rig.stub_control().json("GET", "/_stub/oauth");
    assert_eq!(
        (s["refreshes"].as_u64(), s["rejected"].as_u64()),
        (Some(1), Some(0)),
        "{s}"
    );
}

/// claude's long-lived token (what `claude setup-token` prints, `sk-ant-oat…`) piped to
/// `--with-api-key` is stored as such, `CLAUDE_CODE_OAUTH_TOKEN` (a token, nothing to
/// refresh), and a brokered claude turn runs on it (the stub accepts only that token).
#[test]
fn claudes_long_lived_token_from_stdin_is_stored_as_its_oauth_token() {
    let token = format!("sk-ant-oat01-{}", uuid::Uuid::new_v4().simple());
    let rig = Rig::with_stub_env("login-claude-token", &[format!("STUB_EXPECT_KEY={token}")]);
    let mut c = rig.caw();
    c.args(["auth", "login", "--provider", "claude", "--with-api-key"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{token}\n").as_bytes())
        .unwrap();
    let out = wait_with_deadline(child, std::time::Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("claude_code: CLAUDE_CODE_OAUTH_TOKEN stored (source login)"),
        "{}",
        stdout_of(&out)
    );
    let items = status_items(&rig, "claude_code");
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["target"], "CLAUDE_CODE_OAUTH_TOKEN");
    assert_eq!(items[0]["source"], "login");
    let (code, json, stderr) = rig.json_turn(rig.run_cmd_stored_key(CLAUDE, "REMEMBER:oat", &[]));
    assert_eq!(code, 0, "{json} {stderr}");
    assert!(
        json["result"]
            .as_str()
            .unwrap_or("")
            .contains("Noted: oat."),
        "{json}"
    );
    assert!(!json.to_string().contains(&token) && !stderr.contains(&token));
}

/// A brokered turn held at the stub (its `scan` hold) while its agent's container is scanned:
/// none of `patterns` (the login's tokens) anywhere it could write, the placeholder in
/// `login_file` (the control: the scan could have found a token); then the turn answers with
/// `noted` and the stub refreshed the login exactly once. The stub's OAuth state.
pub fn held_turn_holds_only_the_placeholder(
    rig: &Rig,
    child: Child,
    patterns: &[String],
    login_file: &str,
    noted: &str,
) -> Value {
    rig.wait_held("scan");
    let container = rig.wait_for_running_turn(None, std::time::Duration::from_secs(60));
    let mut patterns = patterns.to_vec();
    patterns.extend(["stub-access-".to_string(), "stub-refresh-".to_string()]);
    let scan = crate::oauth::scan_writable_with_controls(
        &container,
        "1000",
        &patterns,
        &["cawbox-placeholder"],
    )
    .expect("the turn ended before its scan");
    assert!(
        scan.marker_in_file && scan.controls.iter().any(|f| f.ends_with(login_file)),
        "the scan could not have found a token: {scan:?}"
    );
    assert_eq!(scan.found, Vec::<String>::new());
    rig.stub_release("scan");
    let out = wait_with_deadline(child, std::time::Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json["result"].as_str().unwrap().contains(noted), "{json}");
    let s = rig.stub_control().json("GET", "/_stub/oauth");
    assert_eq!(
        (s["refreshes"].as_u64(), s["rejected"].as_u64()),
        (Some(1), Some(0)),
        "{s}"
    );
    s
}
