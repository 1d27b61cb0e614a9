//! `caw-box auth login --provider claude` (issue 45): claude's own paste-code login, run for
//! real in a login container whose only way out is the egress proxy admitting
//! `platform.claude.com:443` and `api.anthropic.com:443`. The stub stands in for both under
//! those very names (network aliases, HTTPS with a certificate of a CA this test makes, which
//! the login container trusts through `--ca-cert`: claude reads `NODE_EXTRA_CA_CERTS`), and
//! the test stands in for the person at claude.ai. What claude 2.1.332 does (read from the
//! JS bundled in its binary, and seen here):
//! - `claude auth login` needs no terminal: it prints "Opening browser to sign in…", "If the
//!   browser didn't open, visit:", the URL, and "Paste code here if prompted > " (no line end),
//!   then reads lines from stdin; a line without a `#` gets "That doesn't look like the full
//!   code…" and another is read;
//! - the URL is a short form: `https://claude.ai/oauth/authorize?<client and scopes packed in
//!   a few characters><the 43-character PKCE challenge>` (no state; the full authorize URL,
//!   `https://claude.com/cai/oauth/authorize?code=true&client_id=…&state=…`, only with
//!   `CLAUDE_CODE_FULL_SIGN_IN_LINK`); the page then shows `code#state`;
//! - the pasted line's part before `#` is traded: `POST https://platform.claude.com/v1/oauth/
//!   token` (JSON `{"grant_type":"authorization_code","code","state","code_verifier",
//!   "redirect_uri":"https://platform.claude.com/oauth/code/callback","client_id"}`) →
//!   `{"access_token","refresh_token","expires_in","scope","account","organization"}`; a
//!   refused code: "Couldn't log in: That code wasn't accepted. …", exit 1;
//! - then `GET https://api.anthropic.com/api/oauth/profile` and `…/api/oauth/claude_cli/roles`
//!   with the new access token (the account, its organization and plan, its role);
//! - it writes `~/.claude/.credentials.json` (`claudeAiOauth`: accessToken, refreshToken,
//!   expiresAt in ms, scopes, subscriptionType …) and the account into `~/.claude.json`
//!   (`oauthAccount`); caw-box stores the first. No first-run question stops `auth login`;
//!   the turns' own onboarding answers are the provider adapter's.
//!
//! Cost: two tests, about 30 s of test time together.

use std::io::Write;
use std::process::{Child, Stdio};

use serde_json::Value;

use crate::common::*;
use crate::login::{
    auth_rig, ended_saying, expired_and_turned, failed_and_changed_nothing, nothing_left,
    read_until, spawn_login, store_snapshot, stored_from_login,
};

/// claude's login: the provider, its name in the prompt, the stub's page.
const CLAUDE: (&str, &str, &str) = ("claude", "claude_code", "claude");
/// Where claude's URL points.
const AUTHORIZE: &str = "https://claude.ai/oauth/authorize?";

/// Anthropic's hosts the flow reaches (the stub's aliases).
const HOSTS: [&str; 2] = ["platform.claude.com", "api.anthropic.com"];

/// The URL of the prompt `auth login --json` prints for a paste-code flow of `provider`.
pub(crate) fn read_url(child: &mut Child, provider: &str) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let prompt: Value = serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("no prompt on stdout ({e}): {line:?}"));
    assert_eq!(prompt["provider"], provider, "{prompt}");
    assert_eq!(prompt["needs"], "code", "{prompt}");
    assert!(prompt.get("code").is_none(), "{prompt}");
    prompt["url"].as_str().unwrap().to_string()
}

/// What the test's "browser" shows after `action` (`approve`, `deny`) at `url`, at the
/// vendor's `page` (`claude`, `google`).
pub(crate) fn browser_code(rig: &Rig, page: &str, action: &str, url: &str) -> String {
    let shown = rig.stub_control().json(
        "POST",
        &format!("/_stub/{page}/{action}?url={}", url_encoded(url)),
    );
    shown["code"].as_str().unwrap().to_string()
}

/// A paste-code login of `provider` (`name` in its prompt) to its end: the URL it asks
/// about (starting with `url_start`), `action` (`approve`, `deny`) taken there at the
/// vendor's `page`, and the code the page then shows pasted back. The ended caw-box, and
/// that code.
pub(crate) fn paste_code_login(
    rig: &Rig,
    ca: &std::path::Path,
    (provider, name, page): (&str, &str, &str),
    url_start: &str,
    action: &str,
) -> (std::process::Output, String) {
    let mut child = spawn_login(rig, provider, ca);
    let url = read_url(&mut child, name);
    assert!(url.starts_with(url_start), "{url}");
    let code = browser_code(rig, page, action, &url);
    paste(&mut child, &code);
    (
        wait_with_deadline(child, std::time::Duration::from_secs(90)),
        code,
    )
}

/// `text` percent-encoded for a query value.
pub(crate) fn url_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Pastes `code` into the running login.
pub(crate) fn paste(child: &mut Child, code: &str) {
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(format!("{code}\n").as_bytes()).unwrap();
    stdin.flush().unwrap();
}

/// claude's real `auth login` to its end: the URL asked about, the code the stub's page
/// shows pasted back; the login is stored with source `login`, nowhere else on this host;
/// a brokered claude turn on it after an expiry gets it refreshed once, and its container
/// holds the placeholder login, none of the real tokens.
#[test]
fn claude_paste_code_login_is_stored_brokered_and_refreshed() {
    let login = crate::oauth::claude_login(1);
    let (rig, ca) = auth_rig("login-claude", &login, &HOSTS);
    let (out, code) = paste_code_login(&rig, ca.path(), CLAUDE, AUTHORIZE, "approve");
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let said = format!("{}{}", stdout_of(&out), stderr_of(&out));
    for secret in [&login.access, &login.refresh, &code] {
        assert!(!said.contains(secret.as_str()), "{said}");
    }
    let last: Value = serde_json::from_str(stdout_of(&out).trim().lines().last().unwrap()).unwrap();
    assert_eq!(
        last["stored"][0]["target"], ".claude/.credentials.json",
        "{last}"
    );
    nothing_left(&rig);
    let exchanged = rig.stub_control().json("GET", "/_stub/claude");
    assert_eq!(exchanged["codes"][0]["used"], true, "{exchanged}");

    // Stored as a collected login would be, from `login`, and nowhere else on this host.
    stored_from_login(
        &rig,
        "claude_code",
        ".claude/.credentials.json",
        &login.refresh,
    );
    let file = rig
        .data_dir
        .path()
        .join("auth/claude_code/home/.claude/.credentials.json");
    let stored: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(
        stored["claudeAiOauth"]["refreshToken"],
        login.refresh.as_str()
    );
    assert_eq!(
        stored["claudeAiOauth"]["accessToken"],
        login.access.as_str()
    );

    // Expired at the stub; a brokered turn meets the 401, the broker refreshes once and
    // retries; held past that, the turn's container is scanned for the tokens.
    let child = expired_and_turned(&rig, "claude", None, "pasted");
    let s = crate::login::held_turn_holds_only_the_placeholder(
        &rig,
        child,
        &login.secrets,
        ".claude/.credentials.json",
        "Noted: pasted.",
    );
    let stored: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(stored["claudeAiOauth"]["refreshToken"], s["refresh_token"]);
    // The model saw the real, refreshed token from the broker, never the placeholder.
    let requests = rig.stub_requests();
    let model: Vec<&Value> = requests
        .iter()
        .filter(|r| r["path"] == "/v1/messages")
        .collect();
    assert!(!model.is_empty(), "{requests:#?}");
    for r in &model {
        let auth = r["headers"]["authorization"].as_str().unwrap_or("");
        assert!(!auth.contains("cawbox-placeholder"), "{r:#}");
    }
}

/// A code the vendor refuses (exit 4; `--json` and on a terminal), Ctrl-C while the code is
/// awaited (130), and stdin ending with no code (2): one line each, nothing left on Docker,
/// the store as it was.
#[test]
fn a_refused_interrupted_or_missing_claude_code_changes_nothing() {
    let login = crate::oauth::claude_login(1);
    let (rig, ca) = auth_rig("login-claude-fail", &login, &HOSTS);
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
        .write_all(b"sk-ant-api03-kept\n")
        .unwrap();
    let out = wait_with_deadline(child, std::time::Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let before = store_snapshot(&rig);
    let one_line = |out: &std::process::Output, code: i32, what: &str| {
        failed_and_changed_nothing(&rig, out, code, what, &before)
    };

    // Refused at the vendor: the code the page showed after a denial.
    let (out, code) = paste_code_login(&rig, ca.path(), CLAUDE, AUTHORIZE, "deny");
    let err = one_line(&out, 4, "a refused code");
    assert!(
        err.contains("claude_code login failed") && err.contains("wasn't accepted"),
        "{err}"
    );
    assert!(!err.contains(&code), "{err}");

    // The same on a terminal (script(1) gives caw-box one): the URL and a prompt on it,
    // the code typed there.
    let mut c = std::process::Command::new("script");
    c.arg("-qfec")
        .arg(format!(
            "{} auth login --provider claude --network {} --ca-cert {}",
            env!("CARGO_BIN_EXE_caw-box"),
            rig.network,
            ca.path().join("ca.pem").display()
        ))
        .arg("/dev/null")
        .env("CAW_BOX_DATA_DIR", rig.data_dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut screen = Vec::new();
    let mut stdout = child.stdout.take().unwrap();
    read_until(&mut stdout, &mut screen, "Code > ");
    let text = String::from_utf8_lossy(&screen).to_string();
    let url = text
        .split_whitespace()
        .find(|w| w.starts_with(AUTHORIZE))
        .unwrap_or_else(|| panic!("no URL: {text}"))
        .to_string();
    assert!(
        text.contains("To log in to claude_code: open https://claude.ai/"),
        "{text}"
    );
    paste(&mut child, &browser_code(&rig, "claude", "deny", &url));
    std::io::Read::read_to_end(&mut stdout, &mut screen).unwrap();
    let out = wait_with_deadline(child, std::time::Duration::from_secs(60));
    let text = String::from_utf8_lossy(&screen).to_string();
    assert_eq!(out.status.code(), Some(4), "{text}");
    ended_saying(&rig, &text, "wasn't accepted", "a refused code", &before);

    // Ctrl-C while the code is awaited.
    let mut child = spawn_login(&rig, "claude", ca.path());
    read_url(&mut child, "claude_code");
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = wait_with_deadline(child, std::time::Duration::from_secs(60));
    one_line(&out, 130, "Ctrl-C");

    // stdin ends with no code.
    let mut child = spawn_login(&rig, "claude", ca.path());
    read_url(&mut child, "claude_code");
    drop(child.stdin.take());
    let out = wait_with_deadline(child, std::time::Duration::from_secs(60));
    let err = one_line(&out, 2, "no code");
    assert!(err.contains("no code was pasted"), "{err}");
}
