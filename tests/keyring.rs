//! `caw_box::auth::keyring` against a real Secret Service: the throwaway, unlocked
//! gnome-keyring that scripts/with-keyring.sh starts on a private D-Bus session bus.
//!
//!     scripts/with-keyring.sh cargo nextest run --test keyring
//!
//! Outside that wrapper every test here fails and says so (no silent skip); the plain suite
//! leaves this binary out with `-E 'not binary(keyring)'`. Every test uses its own service
//! name (`caw-box-test-<uuid>`) or cleans up the one fixed name it seeds, also on failure.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use caw_box::auth::keyring::{self as kr, CLAUDE_SERVICE};
use caw_box::auth::Secret;
use caw_box::ErrorKind;

/// One test changes the process environment (the bus address): it takes this for writing,
/// every other test for reading, so they never overlap (relevant under `cargo test`, where
/// tests share a process; nextest runs each in its own).
static ENV: RwLock<()> = RwLock::new(());

/// Fails the test unless it runs inside scripts/with-keyring.sh. The wrapper's marker is
/// required too, so these tests never write to (or clear entries in) a real keyring.
fn secret_service() -> RwLockReadGuard<'static, ()> {
    let guard = ENV.read().unwrap_or_else(|e| e.into_inner());
    require_wrapper();
    guard
}

fn require_wrapper() {
    let bus = std::env::var_os("DBUS_SESSION_BUS_ADDRESS");
    let sandbox = std::env::var_os("CAW_BOX_TEST_KEYRING");
    assert!(
        bus.is_some() && sandbox.is_some(),
        "these tests need a real Secret Service: run them through the wrapper, \
         `scripts/with-keyring.sh cargo nextest run --test keyring` \
         (DBUS_SESSION_BUS_ADDRESS is {}, CAW_BOX_TEST_KEYRING is {})",
        if bus.is_some() { "set" } else { "unset" },
        if sandbox.is_some() { "set" } else { "unset" },
    );
}

fn unique_service() -> String {
    format!("caw-box-test-{}", uuid::Uuid::new_v4())
}

/// Runs its closure when dropped: cleanup that also happens when an assertion fails.
struct Cleanup<F: FnMut()>(F);

impl<F: FnMut()> Drop for Cleanup<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

fn secret_tool(args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let mut child = Command::new("secret-tool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("secret-tool (libsecret-tools) is installed by scripts/with-keyring.sh");
    {
        let mut input = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            input.write_all(bytes).unwrap();
        }
    }
    child.wait_with_output().unwrap()
}

#[test]
fn write_read_replace_delete() {
    let _env = secret_service();
    let service = unique_service();
    let account = kr::default_account();
    let _cleanup = Cleanup(|| {
        let _ = kr::delete(&service, &account);
    });

    assert_eq!(kr::read(&service, &account).unwrap(), None);

    kr::write(&service, &account, &Secret::new("first value")).unwrap();
    let got = kr::read(&service, &account)
        .unwrap()
        .expect("written entry");
    assert_eq!(got.expose_str(), Some("first value"));

    // Writing again replaces the value (one item, not a second, ambiguous one).
    kr::write(&service, &account, &Secret::new("second value")).unwrap();
    let got = kr::read(&service, &account)
        .unwrap()
        .expect("replaced entry");
    assert_eq!(got.expose_str(), Some("second value"));

    // Another account under the same service is another entry.
    assert_eq!(kr::read(&service, "someone-else").unwrap(), None);

    kr::delete(&service, &account).unwrap();
    assert_eq!(kr::read(&service, &account).unwrap(), None);
    // Deleting what is not there is fine.
    kr::delete(&service, &account).unwrap();
}

#[test]
fn binary_secrets_round_trip() {
    let _env = secret_service();
    let service = unique_service();
    let account = kr::default_account();
    let _cleanup = Cleanup(|| {
        let _ = kr::delete(&service, &account);
    });

    let bytes: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
    kr::write(&service, &account, &Secret::new(bytes.clone())).unwrap();
    let got = kr::read(&service, &account)
        .unwrap()
        .expect("written entry");
    assert_eq!(got.expose(), &bytes[..]);
}

/// An entry seeded by another program with secret-tool, under Claude Code's service name,
/// holding a `.credentials.json`-shaped value. (Claude Code itself keeps its credentials in
/// the Keychain only on macOS; on Linux it uses `~/.claude/.credentials.json`. The attributes
/// our reader matches on Linux are `service` and `username`.)
#[test]
fn reads_a_claude_entry_seeded_with_secret_tool() {
    let _env = secret_service();
    let account = kr::default_account();
    let clear = || {
        secret_tool(
            &["clear", "service", CLAUDE_SERVICE, "username", &account],
            None,
        )
    };
    // The sandbox keyring starts empty; refuse to touch an entry we did not seed.
    assert_eq!(
        kr::read(CLAUDE_SERVICE, &account).unwrap(),
        None,
        "a {CLAUDE_SERVICE} entry already exists in this keyring"
    );
    let _cleanup = Cleanup(|| {
        clear();
    });

    let json = r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-test","refreshToken":"r","expiresAt":4102444800000}}"#;
    let out = secret_tool(
        &[
            "store",
            "--label=Claude Code credentials (caw-box test)",
            "service",
            CLAUDE_SERVICE,
            "username",
            &account,
        ],
        Some(json.as_bytes()),
    );
    assert!(
        out.status.success(),
        "secret-tool store failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let secret = kr::read(CLAUDE_SERVICE, &account)
        .unwrap()
        .expect("the seeded entry");
    let value: serde_json::Value = serde_json::from_slice(secret.expose()).unwrap();
    assert_eq!(value["claudeAiOauth"]["accessToken"], "sk-ant-oat01-test");
    assert_eq!(value["claudeAiOauth"]["refreshToken"], "r");
    assert_eq!(value["claudeAiOauth"]["expiresAt"], 4102444800000u64);
    // The service list for an unset CLAUDE_CONFIG_DIR leads to the same entry.
    assert_eq!(kr::claude_services(None), vec![CLAUDE_SERVICE.to_string()]);

    let out = clear();
    assert!(out.status.success(), "secret-tool clear failed");
    assert_eq!(kr::read(CLAUDE_SERVICE, &account).unwrap(), None);
}

/// The other common Secret Service convention (libsecret/keytar: `account` instead of
/// `username`) is not what the `keyring` crate searches for; this pins that down so a change
/// of backend or convention shows up here.
#[test]
fn entries_keyed_by_an_account_attribute_are_not_found() {
    let _env = secret_service();
    let service = unique_service();
    let account = kr::default_account();
    let _cleanup = Cleanup(|| {
        secret_tool(&["clear", "service", &service, "account", &account], None);
    });
    let out = secret_tool(
        &[
            "store",
            "--label=keytar-style",
            "service",
            &service,
            "account",
            &account,
        ],
        Some(b"value"),
    );
    assert!(out.status.success(), "secret-tool store failed");
    assert_eq!(kr::read(&service, &account).unwrap(), None);
}

#[test]
fn the_secret_service_is_available() {
    let _env = secret_service();
    kr::probe().unwrap();
    assert!(kr::available());
}

/// Callers run in a current-thread tokio runtime; the backend must not try to start its own
/// runtime on that thread (a panic) nor deadlock it.
#[tokio::test(flavor = "current_thread")]
// The guard only keeps the env-changing test out; nothing else in this runtime takes it.
#[allow(clippy::await_holding_lock)]
async fn works_from_inside_a_tokio_runtime() {
    let _env = secret_service();
    let service = unique_service();
    let account = kr::default_account();
    let _cleanup = Cleanup(|| {
        let _ = kr::delete(&service, &account);
    });

    assert!(kr::available());
    kr::write(&service, &account, &Secret::new("in a runtime")).unwrap();
    // The runtime keeps working between calls.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let got = kr::read(&service, &account)
        .unwrap()
        .expect("written entry");
    assert_eq!(got.expose_str(), Some("in a runtime"));
    kr::delete(&service, &account).unwrap();
    assert_eq!(kr::read(&service, &account).unwrap(), None);
}

/// With no Secret Service to talk to, every call fails fast with a credentials error (exit
/// 4) that names the entry, says what to do, and never contains the value.
#[test]
fn an_unreachable_secret_service_is_a_credentials_error() {
    let _env = ENV.write().unwrap_or_else(|e| e.into_inner());
    require_wrapper();
    let real = std::env::var_os("DBUS_SESSION_BUS_ADDRESS").unwrap();
    let _restore = Cleanup(|| std::env::set_var("DBUS_SESSION_BUS_ADDRESS", &real));
    std::env::set_var(
        "DBUS_SESSION_BUS_ADDRESS",
        "unix:path=/nonexistent/caw-box-test/bus",
    );

    let started = Instant::now();
    assert!(!kr::available());
    assert!(kr::probe().unwrap_err().hint.is_some());

    let service = unique_service();
    let secret = "sk-ant-oat01-must-not-leak";
    let errors = [
        kr::read(&service, "alice").unwrap_err(),
        kr::write(&service, "alice", &Secret::new(secret)).unwrap_err(),
        kr::delete(&service, "alice").unwrap_err(),
    ];
    for e in errors {
        let text = e.to_string();
        assert_eq!(e.kind, ErrorKind::Credentials, "{text}");
        assert_eq!(e.exit_code(), 4);
        assert!(text.contains(&service), "{text}");
        assert!(!text.contains(secret), "{text}");
        assert!(e.hint.is_some(), "{text}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

/// `caw-box auth collect` finds Claude Code's keyring entry (the hashed service variant of a
/// CLAUDE_CONFIG_DIR, unique to this test) and stores it as `.claude/.credentials.json`.
#[test]
fn auth_collect_reads_a_seeded_claude_entry() {
    let _env = secret_service();
    let account = kr::default_account();
    let config_dir = format!("/tmp/caw-box-test-claude-{}", uuid::Uuid::new_v4().simple());
    let service = kr::claude_services(Some(&config_dir))[0].clone();
    assert_ne!(service, CLAUDE_SERVICE);
    let _cleanup = Cleanup(|| {
        secret_tool(&["clear", "service", &service, "username", &account], None);
    });
    let json = r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-collected","refreshToken":"r","expiresAt":4102444800000}}"#;
    let out = secret_tool(
        &[
            "store",
            "--label=caw-box test",
            "service",
            &service,
            "username",
            &account,
        ],
        Some(json.as_bytes()),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_caw-box"))
        .args(["auth", "collect", "--provider", "claude"])
        .env("HOME", home.path())
        .env("CLAUDE_CONFIG_DIR", &config_dir)
        .env("CAW_BOX_DATA_DIR", data.path())
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("from keyring:{service}/{account}")),
        "{stdout}"
    );
    assert!(!stdout.contains("sk-ant-oat01-collected"));
    let stored = std::fs::read_to_string(
        data.path()
            .join("auth/claude_code/home/.claude/.credentials.json"),
    )
    .unwrap();
    assert_eq!(stored, json);
    let manifest =
        std::fs::read_to_string(data.path().join("auth/claude_code/manifest.json")).unwrap();
    assert!(manifest.contains("4102444800"), "{manifest}");
    assert!(!manifest.contains("sk-ant-oat01-collected"));
}

/// `--store keyring`: the secrets live in the OS keyring, the store directory holds only
/// the manifest; a turn still gets them, write-back goes to the keyring, `auth rm` forgets.
#[test]
fn the_keyring_store_keeps_secrets_out_of_files() {
    let _env = ENV.write().unwrap_or_else(|e| e.into_inner());
    require_wrapper();
    let data = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let caw = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_caw-box"))
            .args(args)
            .env("HOME", home.path())
            .env("CAW_BOX_DATA_DIR", data.path())
            .env("OPENAI_API_KEY", "sk-keyring-only")
            .output()
            .unwrap()
    };
    let out = caw(&[
        "auth",
        "collect",
        "--provider",
        "codex",
        "--store",
        "keyring",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = data.path().join("auth/codex");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(files, vec!["manifest.json".to_string()]);
    let in_keyring = kr::read("caw-box", "codex/env")
        .unwrap()
        .expect("the keyring entry");
    assert_eq!(in_keyring.expose(), b"OPENAI_API_KEY=sk-keyring-only\0");

    // What a turn gets, materialised from the keyring into its private runtime directory.
    std::env::set_var("CAW_BOX_DATA_DIR", data.path());
    let prepared = caw_box::auth::inject::prepare(caw_box::ProviderKind::Codex, &[]).unwrap();
    let env = prepared
        .files
        .iter()
        .find(|(path, _)| path == "auth/env")
        .map(|(_, contents)| contents.clone());
    assert_eq!(
        env.as_deref(),
        Some(&b"OPENAI_API_KEY=sk-keyring-only\0"[..])
    );
    // A file the CLI wrote during the turn is written back into the keyring (the backend
    // hands back the runtime directory's `auth/home-out` as a tar).
    let mut tar = tar::Builder::new(Vec::new());
    let fresh = br#"{"OPENAI_API_KEY":"sk-new"}"#;
    let mut header = tar::Header::new_gnu();
    header.set_size(fresh.len() as u64);
    header.set_mode(0o600);
    tar.append_data(&mut header, "home-out/.codex/auth.json", &fresh[..])
        .unwrap();
    let home_out = tar.into_inner().unwrap();
    let updated = caw_box::auth::inject::finish(caw_box::ProviderKind::Codex, &home_out).unwrap();
    assert_eq!(updated, vec![".codex/auth.json".to_string()]);
    let stored = kr::read("caw-box", "codex/file:.codex/auth.json")
        .unwrap()
        .unwrap();
    assert_eq!(stored.expose(), br#"{"OPENAI_API_KEY":"sk-new"}"#);
    assert!(!dir.join("home").exists());

    let out = caw(&["auth", "rm", "--provider", "codex"]);
    assert!(out.status.success());
    assert_eq!(kr::read("caw-box", "codex/env").unwrap(), None);
    assert_eq!(
        kr::read("caw-box", "codex/file:.codex/auth.json").unwrap(),
        None
    );
}
