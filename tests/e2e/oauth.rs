//! The credential broker owns OAuth refresh (issue 14): a collected login reaches the agent
//! only as a placeholder file (placeholder access token, no refresh token, a far expiry);
//! the broker swaps in the real access token and, when the upstream says 401, refreshes the
//! login once for every turn using it, stores the new tokens and retries.
//!
//! The stub's token endpoint (`STUB_OAUTH`) rotates refresh tokens and rejects a used one,
//! and its model endpoint accepts only the access token valid now; `/_stub/oauth/expire`
//! forces the expiry, and holds the login's requests until the test lets them meet the
//! expired token together. Sessions run turns in parallel across each forced expiry: eight of
//! claude (the full fan-out, for one CLI: the quickest at it), two of each other CLI (a race
//! for the refresh all the same, and what differs between the CLIs: login file,
//! placeholder, token endpoint).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// How many sessions run turns at once: the full fan-out (one CLI), and a pair (the others).
const FAN_OUT: usize = 8;
const PAIR: usize = 2;

/// The stub's OAuth state: refreshes granted, rejected, and its newest refresh token.
fn oauth_status(rig: &Rig) -> Value {
    rig.stub_control().json("GET", "/_stub/oauth")
}

/// The access token expires now; with `gate`, the stub holds the login's model requests
/// until the test releases that name, and then checks their token.
fn expire(rig: &Rig, gate: Option<&str>) {
    let query = gate.map(|g| format!("?hold={g}")).unwrap_or_default();
    rig.stub_control()
        .json("POST", &format!("/_stub/oauth/expire{query}"));
}

/// Runs `grep -l` for `patterns` (on the exec's stdin) in the running `container` as
/// `user` over every process's environ and cmdline and the places a turn writes to (HOME,
/// /tmp, /run, /var/tmp, /dev/shm, /workspace): a token issued while the turn runs can be
/// nowhere else. `None` when the container is gone meanwhile.
fn scan_writable(container: &str, user: &str, patterns: &[String]) -> Option<Vec<String>> {
    scan_writable_with_controls(container, user, patterns, &[]).map(|s| s.found)
}

/// [`scan_writable`], also reporting what shows the scan could find something: `controls`
/// (texts known to be there) and the marker file the scan plants under /tmp (common.rs,
/// [`secret_scan`]).
pub fn scan_writable_with_controls(
    container: &str,
    user: &str,
    patterns: &[String],
    controls: &[&str],
) -> Option<SecretScan> {
    const WRITABLE: [&str; 7] = [
        "/home",
        "/tmp",
        "/run",
        "/var/tmp",
        "/dev/shm",
        "/workspace",
        "/root",
    ];
    let out = match docker_secret_scan(
        container,
        user,
        ScanScope::Dirs(&WRITABLE),
        controls,
        patterns,
    ) {
        Ok(scan) => return Some(scan),
        Err(out) => out,
    };
    // A turn that ends during the scan takes the exec with it.
    let running = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", container])
        .output()
        .is_ok_and(|o| stdout_of(&o).trim() == "true");
    assert!(
        !running,
        "scan as {user} ({:?}): {}",
        out.status,
        stderr_of(&out)
    );
    None
}

/// `docker inspect` of every container of this test still there, as JSON (turns of other
/// sessions may end while it runs).
fn inspect_all(rig: &Rig) -> Vec<(String, String)> {
    rig.caw_containers()
        .into_iter()
        .filter_map(|name| {
            let name = name.trim_start_matches('/').to_string();
            let c = rig
                .rt
                .block_on(rig.docker.inspect_container(&name, None))
                .ok()?;
            Some((name, serde_json::to_string(&c).unwrap()))
        })
        .collect()
}

/// The stored login (the auth store under the rig's data directory).
fn stored_login(rig: &Rig, provider: &str, target: &str) -> Value {
    let path = rig
        .data_dir
        .path()
        .join(format!("auth/{provider}/home"))
        .join(target);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// A caw-box turn with the stored login, its token endpoint the stub's.
fn turn(rig: &Rig, args: &[&str]) -> Command {
    let mut c = rig.caw();
    c.args(args)
        .env(
            "CAW_BOX_OAUTH_TOKEN_URL",
            format!("{}/v1/oauth/token", rig.endpoint()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Collects a login into the rig's store: `text` at `target` in a HOME of its own.
fn collect_login(rig: &Rig, provider: &str, target: &str, text: &str) {
    let home = tempfile::tempdir().unwrap();
    let creds = home.path().join(target);
    std::fs::create_dir_all(creds.parent().unwrap()).unwrap();
    std::fs::write(&creds, text).unwrap();
    let mut c = rig.caw();
    c.args(["auth", "collect", "--provider", provider])
        .env("HOME", home.path());
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

/// Waits for every turn and checks each answered `Noted: <word>.` with exit 0.
fn all_ok(children: Vec<(Child, String)>) -> Vec<Value> {
    children
        .into_iter()
        .map(|(child, word)| {
            let out = wait_with_deadline(child, Duration::from_secs(240));
            assert_eq!(out.status.code(), Some(0), "{word}: {}", stderr_of(&out));
            let json: Value = serde_json::from_str(stdout_of(&out).trim())
                .unwrap_or_else(|e| panic!("{word}: {e}: {}", stdout_of(&out)));
            assert!(
                json["result"]
                    .as_str()
                    .unwrap_or("")
                    .contains(&format!("Noted: {word}.")),
                "{json}"
            );
            json
        })
        .collect()
}

/// A fake login of one CLI, as the host keeps it.
pub struct Login {
    pub provider: &'static str,
    pub model: Option<&'static str>,
    /// The file under HOME, and its text.
    pub target: &'static str,
    pub text: String,
    /// The first access and refresh tokens (the stub's `STUB_OAUTH`).
    pub access: String,
    pub refresh: String,
    /// Where the file keeps them.
    pub access_at: &'static [&'static str],
    pub refresh_at: &'static [&'static str],
    /// What no agent container may hold (a JWT's claims are no secret: its signature is).
    pub secrets: Vec<String>,
    /// Whether `--credentials inject` works with the tokens the stub issues.
    pub inject_works: bool,
    /// Where a running agent container holds its placeholder (the scan's control): the
    /// placeholder login file, or a process's `environ`.
    pub placeholder_in: &'static str,
    /// Where the model requests must have reached the stub (a login whose CLI the broker
    /// intercepts: the path the CLI sent to the vendor's host, unchanged); `None`: unchecked.
    pub model_path: Option<&'static str>,
    /// How many sessions run turns at once.
    pub sessions: usize,
}

fn in_an_hour_ms() -> u64 {
    (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_600_000) as u64
}

pub fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| &v[*k])
}

#[test]
fn the_broker_refreshes_a_claude_login_once_for_eight_parallel_sessions() {
    refreshes_once_per_expiry(claude_login(FAN_OUT));
}

/// A fake Claude login (fresh tokens), for `sessions` sessions at once.
pub fn claude_login(sessions: usize) -> Login {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (access, refresh) = (
        format!("sk-ant-oat01-realaccess-{tag}"),
        format!("sk-ant-ort01-realrefresh-{tag}"),
    );
    let text = format!(
        r#"{{"claudeAiOauth":{{"accessToken":"{access}","refreshToken":"{refresh}","expiresAt":{},"scopes":["user:inference","user:profile"],"subscriptionType":"max"}}}}"#,
        in_an_hour_ms()
    );
    Login {
        provider: "claude_code",
        model: None,
        target: ".claude/.credentials.json",
        text,
        secrets: vec![access.clone(), refresh.clone()],
        access,
        refresh,
        access_at: &["claudeAiOauth", "accessToken"],
        refresh_at: &["claudeAiOauth", "refreshToken"],
        inject_works: true,
        placeholder_in: ".claude/.credentials.json",
        model_path: None,
        sessions,
    }
}

#[test]
fn the_broker_refreshes_a_codex_chatgpt_login_once_for_two_parallel_sessions() {
    refreshes_once_per_expiry(codex_login(PAIR));
}

/// A fake codex ChatGPT login (fresh tokens), for `sessions` sessions at once.
pub fn codex_login(sessions: usize) -> Login {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let tag = uuid::Uuid::new_v4().simple().to_string();
    // Not a secret (it is in the claims): not made of `tag`, which the secrets are.
    let account = format!("acct-{}", uuid::Uuid::new_v4().simple());
    let exp = in_an_hour_ms() / 1000;
    // A ChatGPT login as codex keeps it: JWTs whose claims name the account and plan (codex
    // decodes them, never verifies); only their signatures and the refresh token are secret.
    let header = b64(r#"{"alg":"RS256","typ":"JWT"}"#);
    let claims = b64(&format!(
        r#"{{"exp":{exp},"email":"dev@example.com","https://api.openai.com/auth":{{"chatgpt_account_id":"{account}","chatgpt_plan_type":"pro"}}}}"#
    ));
    let (access_sig, id_sig) = (format!("realaccesssig{tag}"), format!("realidsig{tag}"));
    let access = format!("{header}.{claims}.{access_sig}");
    let refresh = format!("rt_realrefresh{tag}");
    let text = format!(
        r#"{{"OPENAI_API_KEY":null,"tokens":{{"id_token":"{header}.{claims}.{id_sig}","access_token":"{access}","refresh_token":"{refresh}","account_id":"{account}"}},"last_refresh":"2026-11-24T00:00:00Z"}}"#
    );
    Login {
        provider: "codex",
        model: Some("gpt-5.5"),
        target: ".codex/auth.json",
        text,
        secrets: vec![access_sig, id_sig, refresh.clone()],
        access,
        refresh,
        access_at: &["tokens", "access_token"],
        refresh_at: &["tokens", "refresh_token"],
        inject_works: true,
        placeholder_in: ".codex/auth.json",
        model_path: None,
        sessions,
    }
}

/// gemini's Google login (Code Assist API): the CLI gets the placeholder access token in
/// `GOOGLE_CLOUD_ACCESS_TOKEN` (a login file makes it check the token with Google first),
/// sends it to the broker as `CODE_ASSIST_ENDPOINT`; Google's token endpoint takes the
/// installed-app client's secret beside its id.
#[test]
fn the_broker_refreshes_a_gemini_google_login_once_for_two_parallel_sessions() {
    refreshes_once_per_expiry(gemini_login(PAIR));
}

/// A fake Google login of gemini (fresh tokens), for `sessions` sessions at once.
pub fn gemini_login(sessions: usize) -> Login {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (access, refresh) = (
        format!("ya29.realaccess{tag}"),
        format!("1//realrefresh{tag}"),
    );
    let text = format!(
        r#"{{"access_token":"{access}","refresh_token":"{refresh}","scope":"https://www.googleapis.com/auth/cloud-platform openid","token_type":"Bearer","expiry_date":{}}}"#,
        in_an_hour_ms()
    );
    Login {
        provider: "gemini",
        model: Some("gemini-2.5-flash"),
        target: ".gemini/oauth_creds.json",
        text,
        secrets: vec![access.clone(), refresh.clone()],
        access,
        refresh,
        access_at: &["access_token"],
        refresh_at: &["refresh_token"],
        // Injected, gemini checks the login with Google's tokeninfo endpoint first: no
        // host a test may reach.
        inject_works: false,
        placeholder_in: "/environ",
        model_path: None,
        sessions,
    }
}

/// What of `token` is secret: a JWT's signature (its header and claims are not: a
/// placeholder keeps them), or the whole token.
pub fn secret_part(token: &str) -> &str {
    match token.split('.').count() {
        3 => token.rsplit('.').next().unwrap_or(token),
        _ => token,
    }
}

/// `login.sessions` sessions of its CLI run turns in parallel, valid first, then across two
/// forced expiries: every turn succeeds, the stub granted exactly one refresh per expiry
/// and rejected none, the store ends with the newest tokens, and the agent's container
/// holds none of them.
fn refreshes_once_per_expiry(login: Login) {
    let sessions = login.sessions;
    let (access, refresh) = (login.access.clone(), login.refresh.clone());
    let rig = Rig::with_stub_env(
        &format!("oauth-{}", login.provider.replace('_', "-")),
        &[format!("STUB_OAUTH={access},{refresh}")],
    );
    collect_login(&rig, login.provider, login.target, &login.text);

    // Round 1: the login is valid; every session's first turn, no refresh.
    let endpoint = rig.endpoint();
    let base = |prompt: &str| -> Vec<String> {
        let mut args = vec![
            "run",
            "--provider",
            login.provider,
            "--network",
            &rig.network,
            "--endpoint",
            &endpoint,
            "-o",
            "json",
        ];
        if let Some(m) = login.model {
            args.extend(["--model", m]);
        }
        args.push(prompt);
        args.into_iter().map(str::to_string).collect()
    };
    let children: Vec<(Child, String)> = (0..sessions)
        .map(|i| {
            let word = format!("first{i}");
            let args = base(&format!("REMEMBER:{word}"));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (turn(&rig, &args).spawn().unwrap(), word)
        })
        .collect();
    let firsts = all_ok(children);
    let ids: Vec<String> = firsts
        .iter()
        .map(|j| j["session_id"].as_str().unwrap().to_string())
        .collect();
    let s = oauth_status(&rig);
    assert_eq!(
        (s["refreshes"].as_u64(), s["rejected"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
    // What a round of turns asks the model (codex asks for its model list twice at once).
    let round_requests = model_requests(&rig.stub_requests()).len();

    // Rounds 2 and 3: the access token expires; every session's next turn, in parallel.
    // The stub gates the login's requests until as many as there are sessions wait there,
    // then lets them meet the expired token together: they race for the refresh, whatever
    // the timing of the CLIs' start. Round 3 also scans one agent container while its turn
    // runs: the stub holds every turn's answer until the scan is done.
    let mut seen_tokens = login.secrets.clone();
    for round in 2..=3u64 {
        let gate = format!("expiry{round}");
        expire(&rig, Some(&gate));
        let slow = if round == 3 { "HOLD:scan " } else { "" };
        let children: Vec<(Child, String)> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let word = format!("round{round}s{i}");
                let prompt = format!("{slow}REMEMBER:{word}");
                let args = ["resume", id.as_str(), "-o", "json", prompt.as_str()];
                (turn(&rig, &args).spawn().unwrap(), word)
            })
            .collect();
        rig.stub_control().wait_held(&gate, sessions, HELD_WITHIN);
        rig.stub_release(&gate);
        if round == 3 {
            // Every turn got past the expiry (the broker refreshed and retried) and runs.
            rig.stub_control().wait_held("scan", sessions, HELD_WITHIN);
            // Real tokens: the first login's, and every one the stub issued.
            let mut patterns: Vec<String> = seen_tokens
                .iter()
                .flat_map(|t| (0..=t.len() - 16).map(move |i| t[i..i + 16].to_string()))
                .collect();
            patterns.extend(["stub-access-".to_string(), "stub-refresh-".to_string()]);
            // The control: a running turn whose placeholder login the scan finds (a turn
            // that ends meanwhile is replaced by another).
            let mut container = rig.wait_for_running_turn(None, Duration::from_secs(90));
            let (mut gone, mut empty) = (Vec::new(), 0);
            let placeholder_seen = (0..360).any(|_| {
                match scan_writable(&container, "1000", &["cawbox-placeholder".into()]) {
                    Some(found) if found.iter().any(|f| f.ends_with(login.placeholder_in)) => {
                        return true
                    }
                    Some(_) => empty += 1,
                    None => {
                        gone.push(container.clone());
                        container = rig.wait_for_running_turn(None, Duration::from_secs(30));
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
                false
            });
            if !placeholder_seen {
                let dir = std::path::Path::new(login.target).parent().unwrap();
                let look = Command::new("docker")
                    .args(["exec", &container, "bash", "-c"])
                    .arg(format!(
                        "ls -la ~/{}; cat ~/{}; echo; ps -ef",
                        dir.display(),
                        login.target
                    ))
                    .output()
                    .unwrap();
                panic!(
                    "the scan finds no placeholder in {container} ({empty} scans found nothing; \
                     gone meanwhile: {gone:?}): {}{}",
                    stdout_of(&look),
                    stderr_of(&look)
                );
            }
            for user in ["1000", "0"] {
                let s = scan_writable_with_controls(
                    &container,
                    user,
                    &patterns,
                    &["cawbox-placeholder"],
                )
                .expect("the scanned turn ended before its scan");
                // Root without capabilities reads neither the agent's private files nor its
                // processes' environment (the scan as 1000 does): its own marker shows it
                // read.
                let placeholder = s.controls.iter().any(|f| f.ends_with(login.placeholder_in));
                assert!(
                    s.marker_in_file && s.marker_in_environ && (user == "0" || placeholder),
                    "as {user}, the scan could not have found a token: {s:?}"
                );
                assert_eq!(s.found, Vec::<String>::new(), "as {user}");
            }
            for (name, json) in inspect_all(&rig) {
                assert!(
                    !patterns.iter().any(|p| json.contains(p.as_str())),
                    "docker inspect {name}"
                );
            }
            rig.stub_release("scan");
        }
        all_ok(children);
        let s = oauth_status(&rig);
        // Exactly one refresh per expiry, and no used refresh token was ever sent again.
        assert_eq!(
            (s["refreshes"].as_u64(), s["rejected"].as_u64()),
            (Some(round - 1), Some(0)),
            "round {round}: {s}"
        );
        // The store has the newest tokens (and no turn's write-back put a placeholder there).
        let stored = stored_login(&rig, login.provider, login.target);
        let newest = s["refresh_token"].as_str().unwrap();
        assert_eq!(at(&stored, login.refresh_at), newest, "{stored}");
        let access_now = secret_part(at(&stored, login.access_at).as_str().unwrap());
        assert!(access_now.starts_with("stub-access-"), "{stored}");
        seen_tokens.push(newest.to_string());
        seen_tokens.push(access_now.to_string());
    }
    // `--credentials inject` still hands the CLI the real (current) login, no broker.
    if login.inject_works {
        inject_turn(&rig, &base);
    }
    // The model saw the real (current) tokens only: every request the CLI sent reached it
    // with a bearer token, and only the broker's first tries after an expiry were refused:
    // those of a real token the expiry ended (no placeholder), each request of a round at
    // most once per expiry.
    let requests = rig.stub_requests();
    let refused: Vec<&Value> = requests.iter().filter(|r| r["status"] == 401).collect();
    assert!(
        refused.len() <= 2 * round_requests,
        "{} refused requests, {round_requests} in a round: {requests:#?}",
        refused.len()
    );
    for r in &refused {
        let bearer = r["headers"]["authorization"].as_str().unwrap_or("");
        let token = secret_part(bearer.strip_prefix("Bearer ").unwrap_or(bearer));
        assert!(
            token == secret_part(&access) || token.starts_with("stub-access-"),
            "refused with no real token: {r:#}"
        );
    }
    if let Some(path) = login.model_path {
        let model = model_requests(&requests);
        assert!(model.len() >= 3 * sessions, "{requests:#?}");
        assert!(model.iter().all(|r| r["path"] == path), "{requests:#?}");
    }
}

/// The requests of the CLIs among the stub's records (not the broker's refreshes).
fn model_requests(requests: &[Value]) -> Vec<&Value> {
    requests
        .iter()
        .filter(|r| {
            let p = r["path"].as_str().unwrap_or("");
            !p.starts_with("/_stub") && !p.ends_with("/oauth/token")
        })
        .collect()
}

/// A `--credentials inject` turn: the real (current) login reaches the CLI, no refresh.
fn inject_turn(rig: &Rig, base: &dyn Fn(&str) -> Vec<String>) {
    let prompt = "REMEMBER:injected";
    let args = base(prompt);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.splice(1..1, ["--credentials", "inject"]);
    let injected = all_ok(vec![(turn(rig, &args).spawn().unwrap(), "injected".into())]);
    assert_eq!(injected.len(), 1);
    let s = oauth_status(rig);
    assert_eq!(s["refreshes"].as_u64(), Some(2), "{s}");
}

/// Turns on different egress networks (`--egress open` and `locked`) have brokers of their
/// own: across an expiry, every one of them gets a 401, and a refresh token is good once.
/// The first broker refreshes; the other asks its caw-box, which waits on the login's
/// refresh lock, finds the newer login in the store and hands it over: exactly one refresh,
/// none rejected, every turn answers.
#[test]
fn brokers_of_locked_down_turns_hand_a_refreshed_login_on_instead_of_refreshing_again() {
    const LOCKED: usize = 4;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (access, refresh) = (
        format!("sk-ant-oat01-realaccess-{tag}"),
        format!("sk-ant-ort01-realrefresh-{tag}"),
    );
    let rig = Rig::with_stub_env("oauth-handoff", &[format!("STUB_OAUTH={access},{refresh}")]);
    let text = format!(
        r#"{{"claudeAiOauth":{{"accessToken":"{access}","refreshToken":"{refresh}","expiresAt":{},"scopes":["user:inference"],"subscriptionType":"max"}}}}"#,
        in_an_hour_ms()
    );
    collect_login(&rig, "claude_code", ".claude/.credentials.json", &text);

    let endpoint = rig.endpoint();
    let firsts = all_ok(
        (0..LOCKED)
            .map(|i| {
                let word = format!("locked{i}");
                let prompt = format!("REMEMBER:{word}");
                let egress = if i % 2 == 0 { "open" } else { "locked" };
                let args = [
                    "run",
                    "--provider",
                    "claude_code",
                    "--network",
                    &rig.network,
                    "--endpoint",
                    &endpoint,
                    "--egress",
                    egress,
                    "-o",
                    "json",
                    &prompt,
                ];
                (turn(&rig, &args).spawn().unwrap(), word)
            })
            .collect(),
    );
    expire(&rig, None);
    let children = firsts
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let word = format!("after{i}");
            let prompt = format!("REMEMBER:{word}");
            let id = j["session_id"].as_str().unwrap();
            let args = ["resume", id, "-o", "json", prompt.as_str()];
            (turn(&rig, &args).spawn().unwrap(), word)
        })
        .collect();
    all_ok(children);
    let s = oauth_status(&rig);
    assert_eq!(
        (s["refreshes"].as_u64(), s["rejected"].as_u64()),
        (Some(1), Some(0)),
        "{s}"
    );
    let stored = stored_login(&rig, "claude_code", ".claude/.credentials.json");
    assert_eq!(
        stored["claudeAiOauth"]["refreshToken"], s["refresh_token"],
        "{stored}"
    );
}

/// opencode's ChatGPT login: its built-in codex plugin posts to `chatgpt.com` whatever the
/// provider's base URL, so the turn's own broker stands in for chatgpt.com (the agent's
/// container resolves it to the broker and trusts only the turn's CA) and forwards to the
/// login's upstream (here the `--endpoint` stub) with the real access token. The access token
/// is no JWT (opencode only decodes it for an optional header); the refresh is a form post.
#[test]
fn the_broker_refreshes_an_opencode_chatgpt_login_once_for_two_parallel_sessions() {
    refreshes_once_per_expiry(opencode_login(PAIR));
}

/// A fake opencode ChatGPT login (fresh tokens), for `sessions` sessions at once.
pub fn opencode_login(sessions: usize) -> Login {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (access, refresh) = (format!("realaccess{tag}"), format!("rt_realrefresh{tag}"));
    let account = format!("acct-{}", uuid::Uuid::new_v4().simple());
    let text = format!(
        r#"{{"openai":{{"type":"oauth","access":"{access}","refresh":"{refresh}","expires":{},"accountId":"{account}"}}}}"#,
        in_an_hour_ms()
    );
    Login {
        provider: "opencode",
        model: Some("gpt-5.5"),
        target: ".local/share/opencode/auth.json",
        text,
        secrets: vec![access.clone(), refresh.clone()],
        access,
        refresh,
        access_at: &["openai", "access"],
        refresh_at: &["openai", "refresh"],
        // Injected, opencode would post to the real chatgpt.com: no host a test may reach.
        inject_works: false,
        placeholder_in: ".local/share/opencode/auth.json",
        model_path: Some("/backend-api/codex/responses"),
        sessions,
    }
}

/// A gemini session that ran on the Google login goes on with an API key collected since
/// (the login removed): the login's choice, merged into the session's settings over the
/// image's, is merged back to the key's on the next turn (it failed with gemini's auth
/// error, exit 4, when only the login's turns merged).
#[test]
fn a_gemini_session_goes_on_with_an_api_key_after_the_google_login() {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (access, refresh) = (
        format!("ya29.realaccess{tag}"),
        format!("1//realrefresh{tag}"),
    );
    let rig = Rig::with_stub_env(
        "oauth-gemini-to-key",
        &[format!("STUB_OAUTH={access},{refresh}")],
    );
    let text = format!(
        r#"{{"access_token":"{access}","refresh_token":"{refresh}","scope":"https://www.googleapis.com/auth/cloud-platform","token_type":"Bearer","expiry_date":{}}}"#,
        in_an_hour_ms()
    );
    collect_login(&rig, "gemini", ".gemini/oauth_creds.json", &text);

    let endpoint = rig.endpoint();
    let args = [
        "run",
        "--provider",
        "gemini",
        "--network",
        &rig.network,
        "--endpoint",
        &endpoint,
        "--model",
        "gemini-2.5-flash",
        "-o",
        "json",
        "REMEMBER:switch",
    ];
    let out = turn(&rig, &args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    // The token endpoint override says where the refresh token goes, each time.
    let warning = format!(
        "warning: CAW_BOX_OAUTH_TOKEN_URL: the login's refresh token goes to {endpoint}/v1/oauth/token, not to https://"
    );
    assert!(stderr_of(&out).contains(&warning), "{}", stderr_of(&out));
    let first: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = first["session_id"].as_str().unwrap().to_string();
    assert_eq!(oauth_status(&rig)["refreshes"].as_u64(), Some(0));

    // The login goes; a key comes (the one the stub expects of a key's request).
    let mut c = rig.caw();
    c.args(["auth", "rm", "--provider", "gemini"]);
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let keyed_home = tempfile::tempdir().unwrap();
    let mut c = rig.caw();
    c.args(["auth", "collect", "--provider", "gemini"])
        .env("HOME", keyed_home.path())
        .env("GEMINI_API_KEY", TEST_KEY);
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    let out = turn(&rig, &["resume", &id, "-o", "json", "RECALL"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let second: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        second["result"].as_str().unwrap_or("").contains("switch"),
        "{second}"
    );
}
