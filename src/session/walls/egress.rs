//! A turn's way out (`--egress`, `--allow-host`), asked for once for every backend: the
//! policy and the hosts it admits ([`super::admitted`]); the proxy that holds the agent to them (shared by the
//! turns of every session with the same egress where the backend keeps one, or the turn's
//! own); and what the proxy saw of the turn, its egress record. How the agent is held to
//! the proxy (its networks, or a pod's firewall) is the backend's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::backend::{Attached, Backend, CreateError, EgressPlan, EgressRoute, NetworkPolicy};
use crate::backend::{OutputChunk, PROXY_PORT};
use crate::dirs;
use crate::error::{Error, Result};
use crate::event::{EgressRecord, Event};
use crate::session::store::names::{self, LabelSet};
use crate::session::store::record::{labels, roles, EgressPolicy, SessionRecord, SessionSettings};

use super::proxy_log::{follow_own_proxy, own_proxy_lines, split_target, summarise, Line};

/// The proxy program (run by node; `images/base/caw-box-proxy.js`, also in the images for
/// a turn's own proxy and a pod's sidecar).
const SCRIPT: &str = include_str!("../../../images/base/caw-box-proxy.js");

/// The label that names a shared proxy's settings (its hash).
const SHARED_LABEL: &str = "io.caw-box.proxy";

/// How long a shared proxy's lease holds unless renewed, and how often it is.
const LEASE_TTL: Duration = Duration::from_secs(60);
const LEASE_RENEW: Duration = Duration::from_secs(20);

/// How long a shared proxy without a lease stays for the next turn (`CAW_BOX_PROXY_IDLE`,
/// seconds).
fn idle_ms() -> u64 {
    std::env::var("CAW_BOX_PROXY_IDLE")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(300)
        .saturating_mul(1000)
}

/// The turn's egress plan, the same on every backend: `None` on the host's network, where
/// nothing holds the agent (only `open` runs there). `model_direct`: the agent reaches its
/// model itself, not through a broker (the broker's own way out is not the proxy). Where
/// the backend keeps a shared proxy, it is named by what it admits, where, from which
/// image, for whom (the extra labels: a test's proxies are its own); its network by where
/// and for whom alone, so the agent's network is the same whatever the proxy admits.
pub(in crate::session) fn plan(
    backend: &impl Backend,
    record: &SessionRecord,
    turn: &str,
    model_direct: bool,
) -> Option<EgressPlan> {
    let network = NetworkPolicy::from_setting(&record.settings.network);
    if matches!(network, NetworkPolicy::Host | NetworkPolicy::None) {
        return None;
    }
    let policy = record.settings.egress();
    let allow = super::admitted::admitted(record.provider, &record.settings, model_direct);
    let caps = backend.capabilities();
    let shared = caps.shared_proxy;
    if !shared && !caps.proxy_in_turn && policy == EgressPolicy::Open {
        // A turn's own proxy container is there to hold the agent; under `open` it would
        // only record, at the cost of a container and network per turn and of warm turns
        // (Podman): none, and the turn's egress goes unrecorded.
        return None;
    }
    let (names, labels) = match shared {
        true => {
            let hash = shared_hash(
                &[
                    policy.as_str(),
                    &allow.join(","),
                    &record.settings.image,
                    SCRIPT,
                ],
                &record.settings,
            );
            let net_hash = shared_hash(
                &[if policy == EgressPolicy::Open {
                    "open"
                } else {
                    "internal"
                }],
                &record.settings,
            );
            let labels = names::with_extra_labels(
                [
                    (labels::MANAGED.to_string(), "true".to_string()),
                    (labels::ROLE.to_string(), roles::PROXY.to_string()),
                    (SHARED_LABEL.to_string(), hash.clone()),
                ]
                .into(),
            );
            (
                [
                    format!("caw-box-egress-{net_hash}"),
                    format!("caw-box-proxy-{hash}"),
                ],
                labels,
            )
        }
        false => {
            // Named for this driver: a second caw-box that starts on a busy session sets
            // up its own, and then fails on the lock without touching the running turn's.
            let (n, p) = names::egress_names(record.session_id, std::process::id());
            (
                [n, p],
                LabelSet::new(record.session_id, roles::PROXY).finish(),
            )
        }
    };
    Some(EgressPlan {
        turn: turn.to_string(),
        policy,
        allow,
        image: record.settings.image.clone(),
        user: dirs::agent_ids(),
        network,
        labels,
        names,
        shared,
        program: crate::backend::LOADER.to_string(),
    })
}

/// The name of what is shared for `parts`, on the session's network, for the extra labels.
fn shared_hash(parts: &[&str], settings: &SessionSettings) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let labels = names::render_labels(&names::extra_labels());
    for part in parts
        .iter()
        .copied()
        .chain([settings.network.as_str(), labels.as_str()])
    {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `gc`: removes the egress networks of this caw-box's labels that no proxy or turn is on
/// (a shared proxy's, once it idled out); their names. Under the proxy lock, so that no
/// turn finds one and then loses it before its proxy is on it.
pub async fn remove_unused_networks(backend: &impl Backend) -> Result<Vec<String>> {
    let _lock = lock_proxies().await?;
    let mut filter = vec![
        format!("{}=true", labels::MANAGED),
        format!("{}={}", labels::ROLE, roles::PROXY),
    ];
    filter.extend(
        names::extra_labels()
            .iter()
            .map(|(k, v)| format!("{k}={v}")),
    );
    backend.remove_unused_networks(&filter).await
}

/// The data directory's proxy lock (finding or starting a shared proxy).
async fn lock_proxies() -> Result<dirs::DataLock> {
    dirs::lock_data_file("proxy.lock", "the egress proxies").await
}

/// A shared proxy's lease while the turn runs: ended (released) by [`Egress::close`].
struct Lease {
    end: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// A turn's egress while it runs: its plan and route, the proxy's lease (a shared one), and
/// what the proxy said of it.
pub(in crate::session) struct Egress {
    pub plan: EgressPlan,
    pub route: EgressRoute,
    lease_id: String,
    held: Mutex<Option<Lease>>,
    /// The proxy's decisions since this turn attached (a shared proxy's, of every turn).
    lines: Arc<Mutex<Vec<Line>>>,
    /// Refusals as they come, for the turn's events.
    live: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Line>>>,
    /// The agent's address where it reaches a shared proxy.
    agent: Mutex<Option<String>>,
    /// Of a proxy in the turn's own unit, the decisions in its log before the turn: a warm
    /// pod's sidecar's, of the turns before.
    before: Mutex<usize>,
    /// Of a turn's own proxy, the following of its log for [`Egress::live`].
    follower: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Egress {
    pub(in crate::session) fn new(backend: &impl Backend, plan: EgressPlan) -> Egress {
        let route = backend.egress_route(&plan);
        Egress {
            plan,
            route,
            lease_id: uuid::Uuid::new_v4().simple().to_string(),
            held: Mutex::new(None),
            lines: Arc::default(),
            live: Mutex::new(None),
            agent: Mutex::new(None),
            before: Mutex::new(0),
            follower: Mutex::new(None),
        }
    }

    /// Whether the proxy is a container of the turn's own, on a network of its own, which
    /// go with the turn: the turn runs cold. A shared one stays, and a sidecar of the turn's
    /// pod stays with a warm pod.
    pub(in crate::session) fn goes_with_turn(&self) -> bool {
        !self.plan.shared && self.route.agent_network.is_some()
    }

    /// The turn container's labels that say where its refusals are read
    /// ([`super::refusals::Watch`]).
    pub(in crate::session) fn labels(&self) -> Vec<(String, String)> {
        let mut out = vec![
            (labels::EGRESS_LOG.to_string(), self.route.proxy_log.clone()),
            (
                labels::EGRESS_POLICY.to_string(),
                self.plan.policy.as_str().to_string(),
            ),
        ];
        if let Some(network) = self
            .route
            .agent_network
            .as_ref()
            .filter(|_| self.plan.shared)
        {
            out.push((labels::EGRESS_NETWORK.to_string(), network.clone()));
        }
        out
    }

    fn lease_line(&self) -> String {
        format!("lease {} {}\n", self.lease_id, LEASE_TTL.as_millis())
    }

    /// Makes what the turn's egress needs before its container: a shared proxy found
    /// running and leased, or started; a turn's own proxy (a taken name: the session is
    /// busy; a missing image is said so by the caller).
    pub(in crate::session) async fn open(
        &self,
        backend: &impl Backend,
    ) -> std::result::Result<(), CreateError> {
        if !self.plan.shared {
            if self.route.agent_network.is_none() {
                // A warm pod's sidecar has logged the turns before: not this turn's.
                let before = own_proxy_lines(backend, &self.route.proxy_log, false).await;
                *self.before.lock().unwrap_or_else(|e| e.into_inner()) = before.len();
            }
            return backend.open_egress(&self.plan).await;
        }
        let _lock = lock_proxies().await.map_err(CreateError::Other)?;
        backend.open_egress(&self.plan).await?;
        self.find_or_start(backend).await.map_err(|e| match e {
            // (The proxy's own name, of no session: not a busy session.)
            CreateError::NameTaken => CreateError::Other(Error::environment(format!(
                "could not start the egress proxy {}: its name is taken",
                self.plan.names[1]
            ))),
            e => e,
        })
    }

    /// A shared proxy found running and leased, or started and leased.
    async fn find_or_start(&self, backend: &impl Backend) -> std::result::Result<(), CreateError> {
        let name = &self.plan.names[1];
        for _ in 0..3 {
            match backend
                .inspect_container(name)
                .await
                .map_err(CreateError::Other)?
            {
                Some(c) if c.running() => {
                    let mut attached = backend
                        .attach(name, true)
                        .await
                        .map_err(CreateError::Other)?;
                    let leased = self.lease(&mut attached, Duration::from_secs(3)).await;
                    if leased.is_ok() {
                        tracing::debug!("leased the running egress proxy {name}");
                        self.keep(attached);
                        return Ok(());
                    }
                    // On its way out: it answers no lease any more.
                    backend.remove_found(&c).await.map_err(CreateError::Other)?;
                }
                Some(c) => backend.remove_found(&c).await.map_err(CreateError::Other)?,
                None => {
                    let attached = self.start(backend).await?;
                    self.keep(attached);
                    return Ok(());
                }
            }
        }
        Err(CreateError::Other(Error::environment(format!(
            "could not start or lease the egress proxy {name}"
        ))))
    }

    /// Starts the shared proxy, hands it its config and this turn's lease, and returns its
    /// attachment once it answered the lease.
    async fn start(&self, backend: &impl Backend) -> std::result::Result<Attached, CreateError> {
        let mut attached = backend.start_proxy(&self.plan).await?;
        let config = serde_json::json!({
            "script": SCRIPT,
            "config": {"policy": self.plan.policy.as_str(), "allow": self.plan.allow,
                       "port": PROXY_PORT, "shared": true, "idle_ms": idle_ms()},
        });
        let mut first = serde_json::to_vec(&config).expect("the proxy's config serializes");
        first.push(b'\n');
        first.extend_from_slice(self.lease_line().as_bytes());
        attached.input.write_all(&first).await.map_err(|e| {
            CreateError::Other(Error::environment(format!(
                "could not hand the egress proxy its config: {e}"
            )))
        })?;
        attached.input.flush().await.ok();
        let answered = format!("caw-box-proxy ok {}", self.lease_id);
        let mut seen = Vec::new();
        let ready = async {
            while let Some(chunk) = attached.output.next().await {
                match chunk {
                    Ok(OutputChunk::Stdout(b)) => {
                        seen.extend_from_slice(&b);
                        if String::from_utf8_lossy(&seen).contains(&answered) {
                            return Ok(());
                        }
                    }
                    Ok(OutputChunk::Stderr(b)) => {
                        tracing::warn!("egress proxy: {}", String::from_utf8_lossy(&b).trim_end());
                    }
                    Ok(_) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(Error::environment(
                "the egress proxy exited before it listened",
            ))
        };
        match tokio::time::timeout(Duration::from_secs(30), ready).await {
            Ok(r) => r.map(|()| attached).map_err(CreateError::Other),
            Err(_) => Err(CreateError::Other(Error::environment(
                "the egress proxy did not start listening within 30 s",
            ))),
        }
    }

    /// Sends this turn's lease to a running shared proxy and waits for its answer (sent
    /// again every 500 ms: a line may arrive before the proxy reads its stdin).
    async fn lease(&self, attached: &mut Attached, limit: Duration) -> Result<()> {
        let answered = format!("caw-box-proxy ok {}", self.lease_id);
        let line = self.lease_line();
        let mut seen = Vec::new();
        let wait = async {
            let mut again = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = again.tick() => {
                        attached.input.write_all(line.as_bytes()).await.ok();
                        attached.input.flush().await.ok();
                    }
                    chunk = attached.output.next() => match chunk {
                        Some(Ok(OutputChunk::Stdout(b))) => {
                            seen.extend_from_slice(&b);
                            if String::from_utf8_lossy(&seen).contains(&answered) {
                                return Ok(());
                            }
                        }
                        Some(Ok(_)) => {}
                        _ => return Err(Error::environment("the egress proxy went away")),
                    }
                }
            }
        };
        tokio::time::timeout(limit, wait)
            .await
            .map_err(|_| Error::environment("the egress proxy answered no lease"))?
    }

    /// Renews this turn's lease on `attached` until [`Egress::close`], and keeps the
    /// proxy's decisions (the refusals also go to the turn's events as they come).
    fn keep(&self, mut attached: Attached) {
        let (end, mut ended) = tokio::sync::oneshot::channel::<()>();
        let (renew, release) = (self.lease_line(), format!("release {}\n", self.lease_id));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.live.lock().unwrap_or_else(|e| e.into_inner()) = Some(rx);
        let lines = self.lines.clone();
        let task = tokio::spawn(async move {
            let mut renewal =
                tokio::time::interval_at(tokio::time::Instant::now() + LEASE_RENEW, LEASE_RENEW);
            let mut buffer = crate::lines::LineBuffer::default();
            let mut reading = true;
            loop {
                tokio::select! {
                    _ = &mut ended => break,
                    chunk = attached.output.next(), if reading => match chunk {
                        Some(Ok(OutputChunk::Stdout(b))) => buffer.feed(&b, |l| {
                            if let Some(line) = Line::parse(l) {
                                if line.refused() || line.failed() {
                                    let _ = tx.send(line.clone());
                                }
                                lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                            }
                        }),
                        Some(Ok(_)) => {}
                        _ => reading = false,
                    },
                    _ = renewal.tick() => {
                        if attached.input.write_all(renew.as_bytes()).await.is_err() {
                            tracing::warn!("lost the egress proxy's lease channel");
                        }
                        let _ = attached.input.flush().await;
                    }
                }
            }
            let _ = attached.input.write_all(release.as_bytes()).await;
            let _ = attached.input.flush().await;
        });
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(Lease { end, task });
    }

    /// Notes the address of the turn's agent container `name` where it reaches a shared
    /// proxy: the proxy's decisions from there are this turn's.
    pub(in crate::session) async fn watch_agent(&self, backend: &impl Backend, name: &str) {
        if !self.plan.shared {
            return;
        }
        let address = backend.agent_address(name, &self.route).await;
        if address.is_none() {
            tracing::warn!("the agent's address on its egress network is not known: its egress goes unrecorded");
        }
        *self.agent.lock().unwrap_or_else(|e| e.into_inner()) = address;
    }

    /// Whether a decision is this turn's: a turn's own proxy's all are; a shared one's,
    /// those from the agent's address.
    fn ours(&self, line: &Line) -> bool {
        if !self.plan.shared {
            return true;
        }
        let agent = self.agent.lock().unwrap_or_else(|e| e.into_inner());
        agent.is_some() && line.from.as_deref() == agent.as_deref()
    }

    /// The refusals as they come (taken once, by the turn's reading, once its container
    /// runs): a shared proxy's from its lease's channel, a turn's own proxy's from its log,
    /// followed from here to the turn's end.
    pub(in crate::session) fn live(&self, backend: &impl Backend) -> Option<LiveRefusals<'_>> {
        if !self.plan.shared {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let skip = *self.before.lock().unwrap_or_else(|e| e.into_inner());
            let task = tokio::spawn(follow_own_proxy(
                backend.clone(),
                self.route.proxy_log.clone(),
                skip,
                tx,
            ));
            *self.follower.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
            return Some(LiveRefusals { egress: self, rx });
        }
        let rx = self.live.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        Some(LiveRefusals { egress: self, rx })
    }

    /// The turn's egress record, once its CLI ended: a shared proxy's decisions from its
    /// agent (the ends of its connections waited for a moment), a turn's own proxy's log.
    pub(in crate::session) async fn record(&self, backend: &impl Backend) -> EgressRecord {
        let lines: Vec<Line> = match self.plan.shared {
            true => {
                // The CLI's connections end with it, and their ends reach the proxy at once:
                // each tunnel and plain-HTTP request allowed has its end line.
                for _ in 0..10 {
                    let open = {
                        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
                        let ours: Vec<&Line> = lines.iter().filter(|l| self.ours(l)).collect();
                        let opened = ours
                            .iter()
                            .filter(|l| l.decision.as_deref() == Some("allowed"))
                            .count();
                        let closed = ours.iter().filter(|l| l.closed).count();
                        opened > closed
                    };
                    if !open {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
                lines.iter().filter(|l| self.ours(l)).cloned().collect()
            }
            false => {
                let mut lines = own_proxy_lines(backend, &self.route.proxy_log, true).await;
                let before = *self.before.lock().unwrap_or_else(|e| e.into_inner());
                lines.drain(..before.min(lines.len()));
                lines
            }
        };
        summarise(self.plan.policy.as_str(), &lines)
    }

    /// Ends the turn's use of its proxy: a shared one's lease is released (it stays for
    /// the next turns), a turn's own is removed.
    pub(in crate::session) async fn close(&self, backend: &impl Backend) {
        if let Some(f) = self
            .follower
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            f.abort();
        }
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(l) = held {
            let _ = l.end.send(());
            let _ = tokio::time::timeout(Duration::from_secs(2), l.task).await;
        }
        backend.close_egress(&self.plan).await;
    }

    /// Removes the session's other proxies and egress networks of its own: once this turn
    /// holds the session's lock, they are leftovers of turns whose caw-box was killed. A
    /// shared proxy is no session's.
    pub(in crate::session) async fn remove_leftovers(
        &self,
        backend: &impl Backend,
        record: &SessionRecord,
    ) {
        let filter = [
            format!("{}={}", labels::SESSION, record.session_id),
            format!("{}={}", labels::ROLE, roles::PROXY),
        ];
        let keep = [self.plan.names[0].as_str(), self.plan.names[1].as_str()];
        let _ = backend.sweep(&filter, &keep).await;
    }
}

/// What a turn's egress proxy says of it as it happens.
pub(in crate::session) enum Live {
    /// A host refused: the event to say.
    Refused(Event),
    /// The proxy could not reach an allowed host `target` (`error`, a code such as
    /// ECONNREFUSED).
    Failed { target: String, error: String },
}

/// The refusals and failures of a turn's egress as they come, for its events and for
/// knowing the model unreachable.
pub(in crate::session) struct LiveRefusals<'a> {
    egress: &'a Egress,
    rx: tokio::sync::mpsc::UnboundedReceiver<Line>,
}

impl LiveRefusals<'_> {
    /// The next refusal or failure of this turn's agent.
    pub async fn next(&mut self) -> Option<Live> {
        loop {
            let Some(line) = self.rx.recv().await else {
                // The proxy's output ended: no more to say.
                return std::future::pending().await;
            };
            if !self.egress.ours(&line) {
                continue;
            }
            if line.failed() {
                return Some(Live::Failed {
                    target: line.target,
                    error: line.error.unwrap_or_else(|| "ERROR".to_string()),
                });
            }
            let (host, port) = split_target(&line.target);
            return Some(Live::Refused(Event::EgressRefused {
                host,
                port,
                policy: self.egress.plan.policy.as_str().to_string(),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EgressHost;

    fn line(json: &str) -> Line {
        Line::parse(json).unwrap_or_else(|| panic!("{json}"))
    }

    /// Allowed hosts count their connections once however many requests went on one, and
    /// their bytes from the ends; refusals count their attempts; nothing else is kept.
    #[test]
    fn a_turns_record_counts_connections_and_bytes_per_host() {
        let lines: Vec<Line> = [
            r#"{"proxy":"caw-box","decision":"allowed","target":"pypi.org:443","method":"CONNECT","from":"10.0.0.2","conn":1}"#,
            r#"{"proxy":"caw-box","decision":"allowed","target":"pypi.org:80","method":"GET","from":"10.0.0.2","conn":2}"#,
            r#"{"proxy":"caw-box","decision":"allowed","target":"pypi.org:80","method":"GET","from":"10.0.0.2","conn":2}"#,
            r#"{"proxy":"caw-box","decision":"refused","target":"decoy:80","method":"GET","from":"10.0.0.2","conn":3}"#,
            r#"{"proxy":"caw-box","decision":"refused","target":"decoy:80","method":"GET","from":"10.0.0.2","conn":4}"#,
            r#"{"proxy":"caw-box","closed":true,"target":"pypi.org:443","from":"10.0.0.2","conn":1,"up":100,"down":2000}"#,
            r#"{"proxy":"caw-box","closed":true,"target":"pypi.org:80","from":"10.0.0.2","conn":2,"up":10,"down":20}"#,
            r#"{"proxy":"caw-box","decision":"allowed","target":"stub:9","method":"POST","from":"10.0.0.2","conn":5}"#,
            r#"{"proxy":"caw-box","decision":"failed","target":"stub:9","method":"POST","from":"10.0.0.2","conn":5,"error":"ECONNREFUSED"}"#,
            r#"{"proxy":"caw-box","closed":true,"target":"stub:9","from":"10.0.0.2","conn":5,"up":0,"down":0}"#,
        ]
        .into_iter()
        .map(line)
        .collect();
        let r = summarise("balanced", &lines);
        assert_eq!(r.policy, "balanced");
        let host = |host: &str, port, connections, bytes_out, bytes_in, failed| EgressHost {
            host: host.into(),
            port,
            connections,
            bytes_out,
            bytes_in,
            failed,
        };
        assert_eq!(
            r.allowed,
            [
                host("pypi.org", 443, 1, 100, 2000, 0),
                host("pypi.org", 80, 1, 10, 20, 0),
                host("stub", 9, 1, 0, 0, 1),
            ]
        );
        assert_eq!(r.refused, [host("decoy", 80, 2, 0, 0, 0)]);
        assert_eq!(
            r.line(),
            "egress balanced: reached pypi.org:443 (1x, 100 B out, 2000 B in), pypi.org:80 (1x, 10 B out, 20 B in), stub:9 (1x, 1 failed, 0 B out, 0 B in); refused decoy:80 (2x)"
        );
        // Lines that are not the proxy's decisions are not read.
        assert!(Line::parse(r#"{"decision":"allowed","target":"x:1"}"#).is_none());
        assert!(Line::parse("caw-box-proxy ok 1").is_none());
    }
}
