//! `caw-box auth login --provider gemini` (issue 45): gemini's own Google login, run for real
//! in a login container whose only way out is the egress proxy admitting
//! `oauth2.googleapis.com:443` and `www.googleapis.com:443`. The stub stands in for both under
//! those very names (network aliases, HTTPS with a certificate of a CA this test makes, which
//! the login container trusts through `--ca-cert`: gemini reads `NODE_EXTRA_CA_CERTS`), and
//! the test stands in for the person at accounts.google.com. What gemini 0.61.0 does (read
//! from its bundle, `initOauthClient` and `authWithUserCode`, and seen here):
//! - with no browser to open (`NO_BROWSER=true`, or none found) its Google login is a manual
//!   code flow, and only in an interactive session: headless (`-p`, or stdin or stdout not a
//!   terminal, or `CI=true`) it exits 41, "Manual authorization is required but the current
//!   session is non-interactive". So caw-box gives the container a terminal and runs plain
//!   `gemini`, its home for `.gemini` (`GEMINI_CLI_HOME`) the login's private directory,
//!   whose `.gemini/settings.json` chooses `security.auth.selectedType: oauth-personal` (a
//!   system settings file, `GEMINI_CLI_SYSTEM_SETTINGS_PATH`, is skipped unless root owns it:
//!   "File is insecure");
//! - before its UI it prints "Please visit the following URL to authorize the
//!   application:", `https://accounts.google.com/o/oauth2/v2/auth?redirect_uri=https://
//!   codeassist.google.com/authcode&…&code_challenge=…&state=…`, and reads a line after
//!   "Enter the authorization code: " (the page shows the code alone, no state);
//! - it trades the code: `POST https://oauth2.googleapis.com/token` (form, with the PKCE
//!   verifier and the installed-app client's id and secret), writes `.gemini/
//!   oauth_creds.json` (`access_token`, `refresh_token`, `expiry_date` in ms …), then reads
//!   `GET https://www.googleapis.com/oauth2/v2/userinfo` and keeps the account's email in
//!   `.gemini/google_accounts.json` (under `GEMINI_CLI_HOME`); caw-box stores both;
//! - a refused code: "Failed to authenticate with authorization code:<the error>", and it
//!   asks again with a new URL (twice in all, then it exits); caw-box ends the flow at the
//!   first refusal;
//! - it does not exit after the login: it goes on into its UI. caw-box ends the container
//!   once the login file is written whole.
//!
//! Cost: one test, about 25 s of test time (three logins and one brokered turn).

use serde_json::Value;

use crate::common::*;
use crate::login::{
    auth_rig, expired_and_turned, failed_and_changed_nothing, nothing_left, spawn_login,
    store_snapshot, stored_from_login,
};
use crate::login_claude::{paste_code_login, read_url};

/// gemini's login: the provider, its name in the prompt, the stub's page.
const GEMINI: (&str, &str, &str) = ("gemini", "gemini", "google");
/// Where gemini's URL points.
const AUTHORIZE: &str = "https://accounts.google.com/o/oauth2/v2/auth?";

/// Google's hosts the flow reaches (the stub's aliases).
const HOSTS: [&str; 2] = ["oauth2.googleapis.com", "www.googleapis.com"];

/// gemini's real Google login in its UI: a refused code and Ctrl-C first (one line each,
/// exit 4 and 130, nothing left on Docker, the store unchanged); then the approved code:
/// stored with source `login` (the login and the account), nowhere else on this host; a
/// brokered gemini turn on it after an expiry gets it refreshed once, and its container
/// holds only the placeholder.
#[test]
fn gemini_code_login_in_its_ui_is_stored_brokered_and_refreshed() {
    let login = crate::oauth::gemini_login(1);
    let (rig, ca) = auth_rig("login-gemini", &login, &HOSTS);
    let before = store_snapshot(&rig);
    let one_line = |out: &std::process::Output, code: i32, what: &str| {
        failed_and_changed_nothing(&rig, out, code, what, &before)
    };

    // Refused at the vendor: the code the page showed after a denial.
    let (out, code) = paste_code_login(&rig, ca.path(), GEMINI, AUTHORIZE, "deny");
    let err = one_line(&out, 4, "a refused code");
    assert!(
        err.contains("gemini login failed: Failed to authenticate with authorization code"),
        "{err}"
    );
    assert!(!err.contains(&code), "{err}");

    // Ctrl-C while the code is awaited.
    let mut child = spawn_login(&rig, "gemini", ca.path());
    read_url(&mut child, "gemini");
    let pid = child.id().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = wait_with_deadline(child, std::time::Duration::from_secs(60));
    one_line(&out, 130, "Ctrl-C");

    // Approved.
    let (out, code) = paste_code_login(&rig, ca.path(), GEMINI, AUTHORIZE, "approve");
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let said = format!("{}{}", stdout_of(&out), stderr_of(&out));
    for secret in [&login.access, &login.refresh, &code] {
        assert!(!said.contains(secret.as_str()), "{said}");
    }
    let last: Value = serde_json::from_str(stdout_of(&out).trim().lines().last().unwrap()).unwrap();
    let stored: Vec<&str> = last["stored"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["target"].as_str())
        .collect();
    assert_eq!(
        stored,
        [".gemini/oauth_creds.json", ".gemini/google_accounts.json"],
        "{last}"
    );
    nothing_left(&rig);
    let codes = rig.stub_control().json("GET", "/_stub/google");
    assert_eq!(codes["codes"][1]["used"], true, "{codes}");

    // Stored as a collected login would be, from `login`, and nowhere else on this host.
    stored_from_login(&rig, "gemini", ".gemini/oauth_creds.json", &login.refresh);
    let home = rig.data_dir.path().join("auth/gemini/home/.gemini");
    let creds: Value =
        serde_json::from_slice(&std::fs::read(home.join("oauth_creds.json")).unwrap()).unwrap();
    assert_eq!(creds["refresh_token"], login.refresh.as_str());
    assert_eq!(creds["access_token"], login.access.as_str());
    let accounts: Value =
        serde_json::from_slice(&std::fs::read(home.join("google_accounts.json")).unwrap()).unwrap();
    assert_eq!(accounts["active"], "stub@example.invalid", "{accounts}");

    // Expired at the stub; a brokered turn meets the 401, the broker refreshes once and
    // retries; held past that, the turn's container is scanned for the tokens (the
    // placeholder is in gemini's environment, `GOOGLE_CLOUD_ACCESS_TOKEN`).
    let child = expired_and_turned(&rig, "gemini", Some("gemini-2.5-flash"), "google");
    let s = crate::login::held_turn_holds_only_the_placeholder(
        &rig,
        child,
        &login.secrets,
        "/environ",
        "Noted: google.",
    );
    let creds: Value =
        serde_json::from_slice(&std::fs::read(home.join("oauth_creds.json")).unwrap()).unwrap();
    assert_eq!(creds["refresh_token"], s["refresh_token"]);
}
