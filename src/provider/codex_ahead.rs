//! codex started ahead of its first turn in a pool's box (`Provider::prestart_argv`,
//! docs/pools.md): `codex app-server` waiting on a socket, and the turn client
//! (`codex_turn.js`) a first turn's command goes through.

/// The turn client a box's pre-started `codex app-server` takes a first turn through
/// (`node codex_turn.js codex exec ARGS...`): it prints what `codex exec --json` would, and
/// runs `codex exec` itself where it cannot hand the turn over.
const TURN_CLIENT: &str = include_str!("codex_turn.js");

/// `bash -c PRESTART prestart CLIENT SERVER...`: writes the turn client into the box's
/// /tmp/.caw-box-warm, notes the server's proxy variables (the box's: the client hands over
/// no turn whose own differ) and when it started (nor one whose codex files in HOME are
/// newer), and starts it in the background, waiting for its socket.
const PRESTART: &str = r#"W=/tmp/.caw-box-warm
mkdir -p "$W" && printf '%s' "$1" >"$W/codex-turn.js" || exit 1
shift
env | grep -iE '^(https?|no)_proxy=' | LC_ALL=C sort >"$W/codex.env"
touch "$W/codex.started"
"$@" </dev/null >/dev/null 2>"$W/codex-server.log" &
for ((i = 0; i < 100; i++)); do [ -S "$W/codex.sock" ] && exit 0; sleep 0.05; done
exit 1"#;

/// A first turn in a box whose server was started ahead: through the turn client where it
/// is there, else as it is.
const TURN_IN_SERVER: &str = r#"c=/tmp/.caw-box-warm/codex-turn.js
[ -S /tmp/.caw-box-warm/codex.sock ] && [ -f "$c" ] && exec node "$c" "$@"
exec "$@""#;

/// `codex app-server` listening on a socket in the box's /tmp, with this crate's turn
/// client beside it ([`TURN_CLIENT`]); ends once the socket is there (0) or after 5 s
/// (1). The server has the box's environment only: no key, no turn's variable.
pub(super) fn prestart_argv() -> Vec<String> {
    let mut argv: Vec<String> = ["bash", "-c", PRESTART, "prestart", TURN_CLIENT]
        .map(String::from)
        .to_vec();
    argv.extend(
        [
            "codex",
            "app-server",
            "--listen",
            "unix:///tmp/.caw-box-warm/codex.sock",
            "--disable",
            "plugins",
            "-c",
            "analytics.enabled=false",
        ]
        .map(String::from),
    );
    argv
}

/// A headless first turn (`codex exec`, not `resume`) goes to the server through the
/// turn client, which runs `argv` itself where it cannot hand it over.
pub(super) fn prestarted_turn(argv: &[String]) -> Option<Vec<String>> {
    let first = argv.get(1).is_some_and(|a| a == "exec") && !argv.iter().any(|a| a == "resume");
    if argv.first().is_none_or(|a| a != "codex") || !first {
        return None;
    }
    let mut wrapped: Vec<String> = ["bash", "-c", TURN_IN_SERVER, "codex-turn"]
        .map(String::from)
        .to_vec();
    wrapped.extend(argv.iter().cloned());
    Some(wrapped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::test_support::request;
    use crate::provider::{Provider, TurnRequest};

    const THREAD: &str = "0199a213-81c0-7800-8aa1-bbab2a035a53";
    use crate::provider::codex::Codex;

    /// A pool's box starts `codex app-server` on a socket ahead of its claim; a headless
    /// first turn goes to it through the turn client, which falls back to `argv` itself; a
    /// resume and a TUI turn run as they are.
    #[test]
    fn a_first_headless_turn_goes_to_a_server_started_ahead_and_no_other() {
        let argv = prestart_argv();
        assert!(argv
            .windows(2)
            .any(|w| w == ["--listen", "unix:///tmp/.caw-box-warm/codex.sock"]));
        assert_eq!(argv[4], TURN_CLIENT);
        let first = Codex.turn_command(&request("list the files")).argv;
        let wrapped = Codex
            .prestarted_turn(&first)
            .expect("a first turn is handed over");
        assert_eq!(wrapped[..4], ["bash", "-c", TURN_IN_SERVER, "codex-turn"]);
        assert_eq!(wrapped[4..], first[..]);
        let resume = Codex
            .turn_command(&TurnRequest {
                resume_key: Some(THREAD),
                ..request("again")
            })
            .argv;
        assert_eq!(prestarted_turn(&resume), None);
        let tui = Codex
            .turn_command(&TurnRequest {
                interactive: true,
                ..request("hi")
            })
            .argv;
        assert_eq!(prestarted_turn(&tui), None);
    }

    /// The turn client (run by node, as in the box) runs codex itself, with the same
    /// arguments, stdin and exit, where it cannot hand the turn over: no server on its
    /// socket, a resume, a feature switch, no key in the variable the flags name, proxy
    /// variables other than the server's. A `codex`
    /// that says how it was called stands in for the CLI: what is tested is the client's
    /// choice (the handed-over turn is the pool's e2e test, with the real CLI).
    #[test]
    fn the_turn_client_runs_codex_itself_where_it_cannot_hand_the_turn_over() {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let codex = dir.path().join("codex");
        std::fs::write(&codex, "#!/bin/sh\necho \"ran codex $*\"; cat; exit 7\n").unwrap();
        std::fs::set_permissions(&codex, std::fs::Permissions::from_mode(0o755)).unwrap();
        let client = dir.path().join("codex-turn.js");
        std::fs::write(&client, TURN_CLIENT).unwrap();
        let path = format!(
            "{}:{}",
            dir.path().display(),
            std::env::var("PATH").unwrap()
        );
        let endpoint = TurnRequest {
            endpoint: Some("http://stub:8080"),
            credential_env: &["OPENAI_API_KEY".to_string()],
            ..request("the prompt")
        };
        let first = Codex.turn_command(&endpoint).argv;
        let mut switched = first.clone();
        switched.splice(2..2, ["-c".to_string(), "features.apps=false".to_string()]);
        let resume = Codex
            .turn_command(&TurnRequest {
                resume_key: Some(THREAD),
                ..endpoint.clone()
            })
            .argv;
        // A server was started (its stamp), but none answers on the socket: the first case;
        // the others are refused before the client looks for one.
        std::fs::write(dir.path().join("codex.env"), "").unwrap();
        std::fs::write(dir.path().join("codex.started"), "").unwrap();
        for (argv, key, proxy, why) in [
            (&first, Some("sk-x"), None, "the server:"),
            (&switched, Some("sk-x"), None, "-c features.apps"),
            (&resume, Some("sk-x"), None, "flag resume"),
            (&first, None, None, "no OPENAI_API_KEY"),
            (
                &first,
                Some("sk-x"),
                Some("http://p:3128"),
                "proxy variables differ",
            ),
        ] {
            let mut node = std::process::Command::new("node");
            node.arg(&client)
                .args(argv)
                .env("PATH", &path)
                .env("HOME", dir.path())
                .env("CAW_BOX_WARM_DIR", dir.path())
                .env("CAW_BOX_CODEX_TURN_DEBUG", "1")
                .env_remove("OPENAI_API_KEY")
                .env_remove("HTTPS_PROXY")
                .env_remove("HTTP_PROXY")
                .env_remove("NO_PROXY")
                .env_remove("https_proxy")
                .env_remove("http_proxy")
                .env_remove("no_proxy")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            if let Some(key) = key {
                node.env("OPENAI_API_KEY", key);
            }
            if let Some(proxy) = proxy {
                node.env("HTTPS_PROXY", proxy);
            }
            let mut child = node.spawn().expect("node runs the turn client");
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"the prompt")
                .unwrap();
            let out = child.wait_with_output().unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(7), "{argv:?}: {said}");
            assert_eq!(
                said,
                format!("ran {}\nthe prompt", argv.join(" ")),
                "{argv:?}"
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains(why), "{argv:?}: {stderr}");
        }
    }
}
