//! The OS keyring: the login Keychain on macOS, the Secret Service (gnome-keyring, KWallet)
//! over D-Bus on Linux, reached through the `keyring` crate.
//!
//! For: reading the credentials other programs keep there (Claude Code keeps its OAuth token
//! in the macOS Keychain, service [`CLAUDE_SERVICE`], account = the login user), and
//! writing/deleting entries of caw-box's own. Entries are addressed by (service, account).
//!
//! Not for: deciding what to collect or where it goes (that is `auth::store`), parsing what
//! an entry holds, caching, or falling back to files. Values only ever travel as [`Secret`];
//! errors and logs name the service and account, never the value.
//!
//! How entries map to the platform:
//! - macOS: a generic password in the login Keychain, `kSecAttrService` = service,
//!   `kSecAttrAccount` = account (what `security find-generic-password -s S -a A` finds).
//!   Reading an item another program created can make macOS ask the user to allow access.
//! - Linux: a Secret Service item found by the attributes `service` = service and
//!   `username` = account (the `keyring` crate's and Python keyring's convention), in any
//!   collection; items written here also get `target` = `default` and `application` =
//!   `rust-keyring`. So `secret-tool store --label=L service S username A` makes an entry
//!   [`read`] finds. Items keyed by an `account` attribute (the libsecret/keytar
//!   convention) are NOT found: the crate's search attributes are fixed.
//!
//! Every call runs on a short-lived thread of its own and is bounded by a timeout: the Linux
//! backend drives D-Bus with a private tokio runtime, which would panic if started on a
//! thread that is already inside a runtime (caw-box's callers are), and a hung or prompting
//! keyring must not hang caw-box.

use std::sync::mpsc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::auth::Secret;
use crate::error::{Error, Result};

/// The Keychain service under which Claude Code keeps its OAuth credentials (the JSON of
/// `~/.claude/.credentials.json`) when `CLAUDE_CONFIG_DIR` is not set.
pub const CLAUDE_SERVICE: &str = "Claude Code-credentials";

/// How long a read, write or delete may take (an unlock prompt may be waiting on a user).
const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`available`] waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The Keychain/Secret Service service names Claude Code uses, given the directory that
/// keys its secure storage (see [`claude_secure_storage_dir`]), most likely first.
///
/// Claude Code (2.x) derives the name as
/// `"Claude Code-credentials" + (dir set ? "-" + hex(sha256(NFC(dir)))[..8] : "")`, where
/// `dir` is the variable's value exactly as given: no `~` expansion, no canonicalisation, a
/// trailing `/` changes the hash, and setting it to the default `~/.claude` still adds the
/// suffix. An empty value counts as unset. This is taken from public reports of the
/// decompiled CLI (the service-name builder quoted in robinebers/openusage#424) and several
/// independent tools verified against real Keychains (e.g. `sha256("/Users/test/.claude-work")`
/// → `Claude Code-credentials-03abf0ee`); it is not documented by Anthropic.
///
/// Known gap: Claude Code NFC-normalises `dir` first; we hash the bytes as given, which is the
/// same for ASCII and already-NFC paths (the usual case) but not for a decomposed (NFD) path.
///
/// When `dir` is set only the hashed name is returned, on purpose: that is the only item
/// Claude Code itself reads then, and the unhashed item belongs to the default profile,
/// possibly another account; copying its rotating refresh token would log that one out.
pub fn claude_services(claude_config_dir: Option<&str>) -> Vec<String> {
    match claude_config_dir.filter(|d| !d.is_empty()) {
        None => vec![CLAUDE_SERVICE.to_string()],
        Some(dir) => {
            let digest = Sha256::digest(dir.as_bytes());
            let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
            vec![format!("{CLAUDE_SERVICE}-{hex}")]
        }
    }
}

/// The directory value Claude Code keys its Keychain service name by, from its environment
/// (`env` looks a variable up): `CLAUDE_SECURESTORAGE_CONFIG_DIR` when set (even empty,
/// which suppresses the suffix), else `CLAUDE_CONFIG_DIR`. Pass the result to
/// [`claude_services`]. The first variable is undocumented and less widely confirmed than the
/// second (reports of Claude Code 2.1.x).
pub fn claude_secure_storage_dir(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    env("CLAUDE_SECURESTORAGE_CONFIG_DIR").or_else(|| env("CLAUDE_CONFIG_DIR"))
}

/// Reads an entry; `Ok(None)` when there is none.
pub fn read(service: &str, account: &str) -> Result<Option<Secret>> {
    let (s, a) = (service.to_string(), account.to_string());
    let outcome = run(OP_TIMEOUT, move || {
        keyring::Entry::new(&s, &a).and_then(|e| e.get_secret())
    });
    match outcome {
        Ok(Ok(bytes)) => Ok(Some(Secret::new(bytes))),
        Ok(Err(keyring::Error::NoEntry)) => Ok(None),
        Ok(Err(e)) => Err(keyring_error(Op::Read, service, account, &e)),
        Err(stuck) => Err(stuck.error(Op::Read, service, account)),
    }
}

/// Creates or replaces an entry.
pub fn write(service: &str, account: &str, secret: &Secret) -> Result<()> {
    let (s, a, secret) = (service.to_string(), account.to_string(), secret.clone());
    let outcome = run(OP_TIMEOUT, move || {
        keyring::Entry::new(&s, &a).and_then(|e| e.set_secret(secret.expose()))
    });
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(keyring_error(Op::Write, service, account, &e)),
        Err(stuck) => Err(stuck.error(Op::Write, service, account)),
    }
}

/// Deletes an entry; there being none is not an error.
pub fn delete(service: &str, account: &str) -> Result<()> {
    let (s, a) = (service.to_string(), account.to_string());
    let outcome = run(OP_TIMEOUT, move || {
        keyring::Entry::new(&s, &a).and_then(|e| e.delete_credential())
    });
    match outcome {
        Ok(Ok(())) | Ok(Err(keyring::Error::NoEntry)) => Ok(()),
        Ok(Err(e)) => Err(keyring_error(Op::Delete, service, account, &e)),
        Err(stuck) => Err(stuck.error(Op::Delete, service, account)),
    }
}

/// Whether a keyring backend is reachable at all (for `doctor` / `auth status`). A locked
/// keyring counts as reachable. [`probe`] says why not.
pub fn available() -> bool {
    probe().is_ok()
}

/// Checks that a keyring backend answers, by looking up an entry that does not exist (no
/// prompt, nothing written). The error says what failed and what to do.
pub fn probe() -> Result<()> {
    const SERVICE: &str = "caw-box-probe";
    const ACCOUNT: &str = "caw-box-probe";
    let outcome = run(PROBE_TIMEOUT, || {
        keyring::Entry::new(SERVICE, ACCOUNT).and_then(|e| e.get_secret())
    });
    match outcome {
        Ok(Ok(_)) | Ok(Err(keyring::Error::NoEntry)) => Ok(()),
        Ok(Err(e)) => Err(keyring_error(Op::Probe, SERVICE, ACCOUNT, &e)),
        Err(stuck) => Err(stuck.error(Op::Probe, SERVICE, ACCOUNT)),
    }
}

/// The default account name: the login user. Like Claude Code: `$USER` when set and not
/// empty, else the name of the current uid (`id -un`), else `claude-code-user` (Claude
/// Code's own last resort).
pub fn default_account() -> String {
    if let Some(user) = std::env::var("USER").ok().filter(|u| !u.is_empty()) {
        return user;
    }
    // `id -un` rather than getpwuid_r: the crate denies unsafe code, and this is a fallback.
    std::process::Command::new("id")
        .arg("-un")
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "claude-code-user".to_string())
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Delete,
    Probe,
}

impl Op {
    fn verb(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Delete => "delete",
            Op::Probe => "reach",
        }
    }
}

/// Why a call gave no answer.
#[derive(Debug)]
enum Stuck {
    TimedOut(Duration),
    Crashed,
}

impl Stuck {
    fn error(self, op: Op, service: &str, account: &str) -> Error {
        let what = what(op, service, account);
        match self {
            Stuck::TimedOut(t) => Error::credentials(format!(
                "cannot {what}: no answer from the keyring within {} s",
                t.as_secs()
            ))
            .with_hint(if cfg!(target_os = "macos") {
                "a Keychain prompt may be waiting for you; answer it and retry"
            } else {
                "an unlock prompt may be waiting, or the Secret Service (gnome-keyring, KWallet) \
                 is hung; unlock or restart it and retry"
            }),
            Stuck::Crashed => Error::credentials(format!(
                "cannot {what}: the keyring backend failed unexpectedly"
            ))
            .with_hint("retry; if it persists, run with RUST_BACKTRACE=1 and report it"),
        }
    }
}

/// Runs `f` on a thread of its own (never inside the caller's async runtime) and waits at
/// most `timeout` for it. On a timeout the thread is left to finish on its own.
fn run<T: Send + 'static>(
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, Stuck> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("caw-box-keyring".to_string())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|_| Stuck::Crashed)?;
    rx.recv_timeout(timeout).map_err(|e| match e {
        mpsc::RecvTimeoutError::Timeout => Stuck::TimedOut(timeout),
        mpsc::RecvTimeoutError::Disconnected => Stuck::Crashed,
    })
}

fn what(op: Op, service: &str, account: &str) -> String {
    match op {
        Op::Probe => "reach the OS keyring".to_string(),
        _ => format!(
            "{} keyring entry \"{service}\" (account \"{account}\")",
            op.verb()
        ),
    }
}

/// Maps a `keyring` error to caw-box's one-line error. Only the service, the account and
/// the backend's own diagnostic reach the message; variants that carry data from the entry
/// (`BadEncoding` holds the value's bytes) are described, never printed.
fn keyring_error(op: Op, service: &str, account: &str, e: &keyring::Error) -> Error {
    let what = what(op, service, account);
    match e {
        keyring::Error::NoStorageAccess(inner) => Error::credentials(format!(
            "cannot {what}: the keyring is locked or access was denied ({inner})"
        ))
        .with_hint(if cfg!(target_os = "macos") {
            "unlock the login Keychain and allow caw-box when macOS asks, then retry"
        } else {
            "unlock the login keyring (e.g. in Seahorse, or `gnome-keyring-daemon --unlock`) \
             and retry"
        }),
        keyring::Error::PlatformFailure(inner) => {
            Error::credentials(format!("cannot {what}: {inner}")).with_hint(unreachable_hint())
        }
        keyring::Error::Ambiguous(items) => Error::credentials(format!(
            "cannot {what}: {} keyring entries match it",
            items.len()
        ))
        .with_hint(if cfg!(target_os = "macos") {
            "remove the duplicates in Keychain Access"
        } else {
            "list them with `secret-tool search --all service <service>` and remove the duplicates"
        }),
        keyring::Error::TooLong(attr, limit) => Error::credentials(format!(
            "cannot {what}: the {attr} is longer than the keyring allows ({limit})"
        )),
        keyring::Error::Invalid(attr, reason) => {
            Error::credentials(format!("cannot {what}: invalid {attr}: {reason}"))
        }
        keyring::Error::BadEncoding(_) => {
            Error::credentials(format!("cannot {what}: the stored value is not UTF-8 text"))
        }
        keyring::Error::NoEntry => Error::credentials(format!("cannot {what}: no such entry")),
        _ => Error::credentials(format!("cannot {what}: unexpected keyring error")),
    }
}

/// What to do when the keyring backend itself could not be used.
fn unreachable_hint() -> String {
    if cfg!(target_os = "macos") {
        return "check the login Keychain in Keychain Access (it may be missing or damaged)"
            .to_string();
    }
    if std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_none() {
        return "no D-Bus session bus (DBUS_SESSION_BUS_ADDRESS is unset): run inside a desktop \
                session, or start a Secret Service yourself (dbus-run-session + \
                `gnome-keyring-daemon --unlock --components=secrets`)"
            .to_string();
    }
    "is a Secret Service (gnome-keyring, KWallet) running and unlocked in this D-Bus session?"
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_service_without_a_config_dir_is_the_plain_name() {
        assert_eq!(claude_services(None), vec!["Claude Code-credentials"]);
        // An empty value is unset (Claude Code tests the value's truthiness).
        assert_eq!(claude_services(Some("")), vec!["Claude Code-credentials"]);
    }

    #[test]
    fn claude_service_with_a_config_dir_hashes_the_value_as_given() {
        // sha256("/Users/test/.claude-work") = 03abf0ee…, as published by tools that checked
        // it against real Keychains; the trailing slash is a different item.
        assert_eq!(
            claude_services(Some("/Users/test/.claude-work")),
            vec!["Claude Code-credentials-03abf0ee"]
        );
        assert_eq!(
            claude_services(Some("/Users/test/.claude-work/")),
            vec!["Claude Code-credentials-8bd6f0f5"]
        );
        // No `~` expansion: the string is hashed as it is.
        let tilde = claude_services(Some("~/.claude"));
        assert_eq!(tilde.len(), 1);
        assert!(tilde[0].starts_with("Claude Code-credentials-"));
        assert_eq!(tilde[0].len(), "Claude Code-credentials-".len() + 8);
        assert_ne!(tilde, claude_services(Some("/root/.claude")));
    }

    #[test]
    fn secure_storage_dir_prefers_the_securestorage_variable() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(claude_secure_storage_dir(env(&[])), None);
        assert_eq!(
            claude_secure_storage_dir(env(&[("CLAUDE_CONFIG_DIR", "/a")])).as_deref(),
            Some("/a")
        );
        assert_eq!(
            claude_secure_storage_dir(env(&[
                ("CLAUDE_CONFIG_DIR", "/a"),
                ("CLAUDE_SECURESTORAGE_CONFIG_DIR", "/b")
            ]))
            .as_deref(),
            Some("/b")
        );
        // Set but empty: no suffix, even with CLAUDE_CONFIG_DIR set.
        let dir = claude_secure_storage_dir(env(&[
            ("CLAUDE_CONFIG_DIR", "/a"),
            ("CLAUDE_SECURESTORAGE_CONFIG_DIR", ""),
        ]));
        assert_eq!(claude_services(dir.as_deref()), vec![CLAUDE_SERVICE]);
    }

    #[test]
    fn default_account_is_the_login_user() {
        let account = default_account();
        assert!(!account.is_empty());
        if let Some(user) = std::env::var("USER").ok().filter(|u| !u.is_empty()) {
            assert_eq!(account, user);
        }
    }

    #[test]
    fn errors_never_contain_the_secret() {
        let secret = "sk-ant-oat01-very-secret-value";
        let errors = [
            keyring::Error::BadEncoding(secret.as_bytes().to_vec()),
            keyring::Error::PlatformFailure(Box::new(std::io::Error::other(
                "org.freedesktop.DBus.Error.ServiceUnknown",
            ))),
            keyring::Error::NoStorageAccess(Box::new(std::io::Error::other("locked"))),
            keyring::Error::Ambiguous(vec![]),
            keyring::Error::TooLong("service".into(), 255),
            keyring::Error::Invalid("target".into(), "cannot be empty".into()),
            keyring::Error::NoEntry,
        ];
        for e in &errors {
            for op in [Op::Read, Op::Write, Op::Delete, Op::Probe] {
                let err = keyring_error(op, "caw-box-test", "alice", e);
                let text = err.to_string();
                assert!(!text.contains(secret), "{text}");
                assert!(!text.contains('\n'), "{text}");
                assert_eq!(err.exit_code(), 4, "{text}");
                if op != Op::Probe {
                    assert!(text.contains("\"caw-box-test\""), "{text}");
                }
            }
        }
        let locked = keyring_error(Op::Read, "s", "a", &errors[2]);
        assert!(locked.hint.is_some());
        let down = keyring_error(Op::Write, "s", "a", &errors[1]);
        assert!(down.to_string().contains("ServiceUnknown"), "{down}");
        assert!(down.hint.is_some());
        for stuck in [Stuck::TimedOut(OP_TIMEOUT), Stuck::Crashed] {
            let err = stuck.error(Op::Read, "s", "a");
            assert_eq!(err.exit_code(), 4);
            assert!(err.hint.is_some());
        }
    }

    #[test]
    fn run_reports_timeouts_and_panics() {
        let slow = run(Duration::from_millis(10), || {
            std::thread::sleep(Duration::from_millis(500))
        });
        assert!(matches!(slow, Err(Stuck::TimedOut(_))));
        let crashed = run(Duration::from_secs(5), || -> u8 { panic!("backend bug") });
        assert!(matches!(crashed, Err(Stuck::Crashed)));
        assert_eq!(run(Duration::from_secs(5), || 7).ok(), Some(7));
    }

    /// The backend must not be driven on a thread that is inside a tokio runtime (it would
    /// panic starting its own); callers are in one. Without a Secret Service this answers
    /// with an error or `false`, with one it answers for real: either way, no panic.
    #[tokio::test(flavor = "current_thread")]
    async fn calls_inside_a_tokio_runtime_do_not_panic() {
        let _ = available();
        let _ = read(
            &format!("caw-box-test-absent-{}", uuid::Uuid::new_v4()),
            "nobody",
        );
    }
}
