//! The egress proxy's log (`images/base/caw-box-proxy.js`: a JSON line per decision and per
//! connection's end): its lines read, followed, and summed up into a turn's record.

use std::time::Duration;

use futures_util::StreamExt;

use crate::backend::{Backend, OutputChunk};
use crate::event::{EgressHost, EgressRecord};

/// One decision or end of a connection, as the proxy logs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Line {
    pub(super) decision: Option<String>,
    pub(super) closed: bool,
    pub(super) target: String,
    pub(super) from: Option<String>,
    pub(super) conn: Option<u64>,
    pub(super) up: u64,
    pub(super) down: u64,
    /// Why the proxy could not reach an allowed host (`failed`): an error code.
    pub(super) error: Option<String>,
}

impl Line {
    pub(super) fn parse(text: &str) -> Option<Line> {
        let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
        if v["proxy"] != "caw-box" {
            return None;
        }
        Some(Line {
            decision: v["decision"].as_str().map(str::to_string),
            closed: v["closed"] == true,
            target: v["target"].as_str()?.to_string(),
            from: v["from"].as_str().map(str::to_string),
            conn: v["conn"].as_u64(),
            up: v["up"].as_u64().unwrap_or(0),
            down: v["down"].as_u64().unwrap_or(0),
            error: v["error"].as_str().map(str::to_string),
        })
    }

    pub(super) fn refused(&self) -> bool {
        self.decision.as_deref() == Some("refused")
    }

    pub(super) fn failed(&self) -> bool {
        self.decision.as_deref() == Some("failed")
    }
}

/// `host:port` into its parts (`[v6]:port` too).
pub(super) fn split_target(target: &str) -> (String, u16) {
    match target.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']').to_string(),
            p.parse().unwrap_or(0),
        ),
        None => (target.to_string(), 0),
    }
}

/// The turn's record of `lines` (those of its agent): per host and port, connections and
/// bytes of what was allowed, attempts of what was refused, in the order first seen.
pub(super) fn summarise(policy: &str, lines: &[Line]) -> EgressRecord {
    let mut record = EgressRecord {
        policy: policy.to_string(),
        ..Default::default()
    };
    fn entry<'a>(list: &'a mut Vec<EgressHost>, target: &str) -> &'a mut EgressHost {
        let (host, port) = split_target(target);
        match list.iter().position(|h| h.host == host && h.port == port) {
            Some(i) => &mut list[i],
            None => {
                list.push(EgressHost {
                    host,
                    port,
                    ..Default::default()
                });
                list.last_mut().expect("just pushed")
            }
        }
    }
    let mut counted = std::collections::HashSet::new();
    for l in lines {
        if l.refused() {
            entry(&mut record.refused, &l.target).connections += 1;
        } else if l.decision.as_deref() == Some("allowed") {
            let e = entry(&mut record.allowed, &l.target);
            // A plain-HTTP connection's requests are decided one by one: counted once.
            if l.conn.is_none_or(|c| counted.insert((c, l.target.clone()))) {
                e.connections += 1;
            }
        } else if l.failed() {
            entry(&mut record.allowed, &l.target).failed += 1;
        } else if l.closed {
            let e = entry(&mut record.allowed, &l.target);
            e.bytes_out += l.up;
            e.bytes_in += l.down;
        }
    }
    record
}

/// Follows the log of a turn's own proxy `proxy` (the decisions after the first `skip`: a
/// warm pod's sidecar's earlier turns'), its refusals and failures to `tx` as they come,
/// until the turn's reading is done with them. A log not there yet (a pod's sidecar still
/// starting) or ended (a pod's sidecar ends with the turn) is followed again, from where
/// it was.
pub(super) async fn follow_own_proxy(
    backend: impl Backend,
    proxy: String,
    skip: usize,
    tx: tokio::sync::mpsc::UnboundedSender<Line>,
) {
    let mut seen = 0usize;
    while !tx.is_closed() {
        let mut logs = backend.follow_logs(&proxy);
        let mut buffer = crate::lines::LineBuffer::default();
        let mut at = 0usize;
        while let Some(Ok(chunk)) = logs.next().await {
            let OutputChunk::Stdout(b) = chunk else {
                continue;
            };
            buffer.feed(&b, |l| {
                let Some(line) = Line::parse(l) else {
                    return;
                };
                at += 1;
                if at > seen {
                    seen = at;
                    if at > skip && (line.refused() || line.failed()) {
                        let _ = tx.send(line);
                    }
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The decisions of a turn's own proxy, from its log so far (none where it is not there);
/// `ended`: the CLI ended, so the ends of its connections are waited for a moment (they
/// reach the proxy at once, and its log soon after).
pub(super) async fn own_proxy_lines(backend: &impl Backend, proxy: &str, ended: bool) -> Vec<Line> {
    let read = || async {
        let mut logs = backend.logs_so_far(proxy);
        let mut text = Vec::new();
        while let Some(Ok(chunk)) = logs.next().await {
            if let OutputChunk::Stdout(message) = chunk {
                text.extend_from_slice(&message);
            }
        }
        String::from_utf8_lossy(&text)
            .lines()
            .filter_map(Line::parse)
            .collect::<Vec<Line>>()
    };
    let mut lines = read().await;
    for _ in 0..10 {
        let opened = lines
            .iter()
            .filter(|l| l.decision.as_deref() == Some("allowed"))
            .count();
        if !ended || opened <= lines.iter().filter(|l| l.closed).count() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        lines = read().await;
    }
    lines
}
