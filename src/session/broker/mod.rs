//! A turn's credential broker: a small node program (`src/auth/broker.js`) in a container of
//! its own, next to the agent's, that holds the real API keys. The agent's CLI gets a
//! placeholder key and the broker's URL as its base URL (the adapters' `--endpoint`
//! mechanism); the broker swaps the placeholder for the real key and forwards to the real
//! upstream: the `--endpoint` URL, else the vendor's API host over TLS.
//!
//! The keys travel on the broker's stdin (with the program itself), never in its config,
//! environment, labels or logs. Where it runs as a unit of its own the agent reaches it by
//! its name (the backend puts both where names resolve, and keeps it reachable to an agent
//! held to `--allow-host`'s proxy; its own way out is the session's network, so the
//! provider's host need not be allowed). It starts concurrently with the agent's container;
//! the agent's runtime files (and so its CLI) wait for its "ready" line.
//!
//! Where a backend runs the broker beside the agent in the turn's own unit
//! ([`crate::backend::BrokerPlace::InTurn`], Kubernetes), it listens only where the
//! backend's route says, and the agent reaches it there. Its keys still come on its stdin
//! (through an attachment once the turn's unit runs), so nothing the backend stores holds
//! them; it ends with the agent. A login it holds is refreshed as elsewhere: the driver
//! stays attached, answers its refresh hand-offs (one refresh at a time per login, under
//! the backend's refresh lock, `Backend::hold_refresh`: across hosts where the backend's
//! turns are) and stores what it refreshed; its seal key comes from the data directory and
//! the turn's name, so a `wait` that finishes the turn after its driver is gone takes over,
//! and has what the broker refreshed meanwhile reported again (`report`).
//!
//! What is the same on every backend lives here: the plan (which broker, its config, the
//! placeholders), the keys on stdin, the leases and the refresh protocol. The session asks
//! the backend for a broker ([`crate::backend::BrokerPlan`]: its program, for this turn and
//! network) and the backend decides where it runs and how the agent reaches it
//! (`Capabilities::broker_place`, `Backend::broker_route`, `open_broker`, `start_broker`,
//! `close_broker`): Docker as a container on a network, Kubernetes as a container of the
//! turn's pod.
//!
//! - `mod.rs`: the broker's program, ports and names, and what a planned broker is
//! - `plan.rs`: which broker a turn gets, and its config (the keys, the logins)
//! - `supervise.rs`: starting (through the backend), leasing, keeping and stopping it
//! - `refresh.rs`: the logins it refreshes, stored; the refresh handoff between brokers

use std::time::Duration;

use crate::backend::{Backend, BrokerPlan, BrokerRoute, NetworkPolicy};
use crate::error::Result;
use crate::provider::ProviderKind;

mod pace;
mod plan;
mod refresh;
mod supervise;

pub(in crate::session) use plan::Site;
pub(in crate::session) use supervise::WATCH_END;

/// The port the broker listens on, inside the turn's network.
pub const BROKER_PORT: u16 = 8080;
/// The port the broker listens on with TLS for the hosts it intercepts (the hosts' own).
pub const INTERCEPT_PORT: u16 = 443;

/// How long the broker may take to say it listens.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) use crate::backend::LOADER;

pub(crate) const SCRIPT: &str = include_str!("../../auth/broker.js");

/// `N` bytes from the operating system's CSPRNG (`getrandom`): the broker's seal keys, the
/// IVs of what it seals, the salt of shared brokers' names. No fallback: a key from anything
/// weaker would look as good and not be.
fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).expect("the operating system's random source failed");
    out
}

/// Whether 16 bytes from `b` on carry a (v4) UUID's fixed version and variant bits: what a
/// key or IV made of UUIDs always does, and random bytes once in 64.
#[cfg(test)]
fn uuid_shaped(b: &[u8]) -> bool {
    b[6] >> 4 == 4 && b[8] >> 6 == 2
}

/// The vendor's API host when the session has no `--endpoint` (from its credential spec).
pub fn default_upstream(p: ProviderKind) -> String {
    crate::auth::spec::Spec::of(p).broker.upstream
}

/// The path of a base URL, without a trailing `/` (`""` for none).
fn url_path(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let path = path.split(['?', '#']).next().unwrap_or("");
    path.trim_end_matches('/').to_string()
}

/// One turn's broker, planned before anything is created.
pub(super) struct Broker {
    /// What the backend runs, and how the agent reaches it (the backend's answer).
    plan: BrokerPlan,
    route: BrokerRoute,
    /// What names it in messages (the backend's words).
    pub(super) container: String,
    provider: ProviderKind,
    session: uuid::Uuid,
    /// The JSON line for stdin (holds the real keys).
    config: crate::auth::Secret,
    /// What the adapter gets as `--endpoint`.
    pub(super) url: String,
    /// A shared broker's lease for this turn; `None`: the broker is this turn's own.
    shared: Option<Shared>,
    /// The key the broker seals refreshed tokens with, and whether it holds logins.
    seal: [u8; 32],
    logins: bool,
    /// It runs beside the agent in the turn's own unit ([`crate::backend::BrokerPlace::InTurn`]):
    /// started once that unit is made, and it ends with the agent.
    in_turn: bool,
    /// The hosts this broker stands in for with TLS (a login's `intercept`), and the
    /// turn's CA certificate the agent's container trusts for them.
    intercept: Option<Intercept>,
    /// A reader of refreshed logins of a broker in the turn's unit, awaited by [`Broker::stop`].
    watching: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What the agent's container of a turn whose broker intercepts needs: the hosts to
/// resolve to the broker, and the CA to trust (public; its key is gone).
pub(super) struct Intercept {
    pub(super) hosts: Vec<String>,
    pub(super) ca_pem: String,
}

/// This turn's part of a shared broker (see the module docs).
struct Shared {
    /// The lease line's id and its `placeholder=slot` pairs.
    lease_id: String,
    pairs: String,
    /// The running lease: ended (released) by [`Broker::stop`].
    held: std::sync::Mutex<Option<Lease>>,
}

/// A lease renewed in the background while the turn runs.
struct Lease {
    end: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// The label that names a shared broker (and its network) by its hash.
const SHARED_LABEL: &str = "io.caw-box.broker";

/// How long a lease holds without renewal, and how often it is renewed.
const LEASE_TTL: Duration = Duration::from_secs(60);
const LEASE_RENEW: Duration = Duration::from_secs(20);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Broker {
    /// The hosts this broker stands in for with TLS, and the CA the agent trusts for them.
    pub(super) fn intercept(&self) -> Option<&Intercept> {
        self.intercept.as_ref()
    }

    /// The broker's address as the agent reaches it, once it runs (for the agent's
    /// container to resolve the intercepted hosts to); the backend's route may know it
    /// before.
    pub(super) async fn address(&self, backend: &impl Backend) -> Result<Option<String>> {
        backend.broker_address(&self.plan).await
    }

    /// Whether it runs beside the agent in the turn's own unit (started once that is made).
    pub(super) fn in_turn(&self) -> bool {
        self.in_turn
    }

    /// The host the agent reaches it at.
    pub(super) fn host(&self) -> &str {
        &self.route.host
    }

    /// This turn's lease line: its placeholders, valid for [`LEASE_TTL`].
    fn lease_line(s: &Shared) -> String {
        format!(
            "lease {} {} {}\n",
            s.lease_id,
            LEASE_TTL.as_millis(),
            s.pairs
        )
    }

    /// The network the agent joins to reach it, where the backend made one for it.
    pub(super) fn agent_network(&self) -> Option<NetworkPolicy> {
        self.route.agent_network.clone().map(NetworkPolicy::Named)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `command` (a broker loader), hands it `line` and waits for its ready line; its
    /// stdin stays open while the returned handle lives.
    fn started_broker(
        command: &[String],
        line: &serde_json::Value,
    ) -> (std::process::Child, std::process::ChildStdin) {
        use std::io::{BufRead, Write};
        let mut child = std::process::Command::new(&command[0])
            .args(&command[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("node");
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{line}").unwrap();
        let mut ready = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert_eq!(ready.trim(), "caw-box-broker ready");
        (child, stdin)
    }

    /// broker.js with `tls`: a client that trusts only the turn's CA reaches it as
    /// chatgpt.com; the login's placeholder becomes the real access token, the path stays.
    #[test]
    fn the_broker_stands_in_for_an_intercepted_host_with_the_turns_certificate() {
        use std::io::{Read, Write};
        // This host's own loopback: the test's upstream and broker are local processes.
        let local = std::net::Ipv4Addr::LOCALHOST;
        let upstream = std::net::TcpListener::bind((local, 0)).unwrap();
        let up_port = upstream.local_addr().unwrap().port();
        let seen = std::thread::spawn(move || {
            let (mut s, _) = upstream.accept().unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        let tls = crate::auth::intercept::intercept_tls(&["chatgpt.com".to_string()]).unwrap();
        let free = || {
            std::net::TcpListener::bind((local, 0))
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (port, tls_port) = (free(), free());
        let line = serde_json::json!({
            "script": SCRIPT,
            "config": {"port": port, "tls_port": tls_port, "host": local.to_string(),
                       "upstream": format!("http://{local}:{up_port}"),
                       "places": ["authorization"], "keys": {}, "seal": hex(&[1u8; 32]),
                       "oauth": {"cawbox-placeholder-z": {
                           "access": "real-a", "refresh": "real-r",
                           "expires_ms": 4_102_444_800_000u64,
                           "token_url": format!("http://{local}:9/oauth/token"),
                           "client_id": "c", "body": "form"}},
                       "tls": {"cert": tls.cert_pem,
                               "key": String::from_utf8_lossy(tls.key_pem.expose())}},
        });
        let command = ["node".to_string(), "-e".into(), LOADER.into()];
        let (mut child, _stdin) = started_broker(&command, &line);
        // The turn's CA only: not the system's.
        let client = crate::auth::intercept::tests::client_trusting(&tls.ca_pem);
        let name = rustls::pki_types::ServerName::try_from("chatgpt.com").unwrap();
        let conn = rustls::ClientConnection::new(client, name).unwrap();
        let tcp = std::net::TcpStream::connect((local, tls_port)).unwrap();
        let mut s = rustls::StreamOwned::new(conn, tcp);
        s.write_all(
            b"POST /backend-api/codex/responses HTTP/1.1\r\nhost: chatgpt.com\r\n\
              authorization: Bearer cawbox-placeholder-z\r\ncontent-length: 2\r\n\
              connection: close\r\n\r\n{}",
        )
        .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        let _ = child.kill();
        let _ = child.wait();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let head = seen.join().unwrap().to_lowercase();
        assert!(
            head.starts_with("post /backend-api/codex/responses http/1.1"),
            "{head}"
        );
        assert!(head.contains("authorization: bearer real-a"), "{head}");
        assert!(!head.contains("placeholder"), "{head}");
        // Another turn's CA does not vouch for this broker.
        let other = crate::auth::intercept::intercept_tls(&["chatgpt.com".to_string()]).unwrap();
        assert!(!crate::auth::intercept::tests::handshake_ok(
            &tls,
            &other.ca_pem,
            "chatgpt.com"
        ));
    }

    #[test]
    fn the_broker_url_keeps_the_endpoint_path() {
        assert_eq!(url_path("http://stub:8080"), "");
        assert_eq!(url_path("http://stub:8080/"), "");
        assert_eq!(url_path("https://gw.example/openai/v1/?x=1"), "/openai/v1");
    }

    #[test]
    fn the_loader_reads_one_line_and_the_script_exports_a_function() {
        assert!(LOADER.contains("indexOf(10)") && !LOADER.contains('\n'));
        assert!(SCRIPT.contains("module.exports = function broker(config, rest)"));
    }
}
