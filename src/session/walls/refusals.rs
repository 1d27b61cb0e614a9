//! A running turn's egress refusals as another process than its driver reads them (`logs -f`,
//! MCP's progress): from the log of the turn's proxy, which its container names (labels
//! `io.caw-box.egress-*`), from the turn's start on, and of a proxy other turns share, only
//! the decisions from the agent's own address. Only the proxy writes that log: nothing the
//! agent prints can make a refusal appear here.

use std::time::{Duration, SystemTime};

use futures_util::StreamExt;

use crate::backend::{Backend, ContainerInfo, EgressRoute, OutputChunk};
use crate::event::{EgressRecord, Event};
use crate::lines::LineBuffer;
use crate::session::store::record::labels;

use super::proxy_log::{split_target, summarise, Line};

/// Where and what to read of one running turn's proxy log.
#[derive(Debug, Clone)]
pub struct Watch {
    log: String,
    policy: String,
    since: SystemTime,
    /// The agent's address where it reaches a shared proxy; `None`: the proxy is the turn's
    /// own, all its decisions since the turn began are the turn's.
    from: Option<String>,
}

impl Watch {
    /// The watch of the running turn in container (pod) `c`; `ended` is when the session's
    /// turn before ended, to the second: a unit made before that is a warm one, whose
    /// proxy logged that turn too, so its refusals count from the second after. `None`
    /// where the turn's egress goes through no proxy, or the agent's address on a shared
    /// one is not known.
    pub async fn of(
        backend: &impl Backend,
        c: &ContainerInfo,
        ended: Option<SystemTime>,
    ) -> Option<Watch> {
        let log = c.label(labels::EGRESS_LOG)?.to_string();
        let policy = c.label(labels::EGRESS_POLICY)?.to_string();
        let from = match c.label(labels::EGRESS_NETWORK) {
            Some(network) => {
                let route = EgressRoute {
                    proxy_url: String::new(),
                    direct: Vec::new(),
                    agent_network: Some(network.to_string()),
                    proxy_log: log.clone(),
                    shared: true,
                };
                Some(backend.agent_address(&c.name, &route).await?)
            }
            None => None,
        };
        let since = match (c.created?, ended) {
            (created, Some(ended)) if created < ended => ended + Duration::from_secs(1),
            (created, _) => created,
        };
        Some(Watch {
            log,
            policy,
            since,
            from,
        })
    }

    /// The refusal a line of the log (its time, a space, the proxy's line) says, if it is
    /// one of this turn's.
    fn refusal(&self, text: &str) -> Option<Event> {
        self.said(&self.ours(text)?.1)
    }

    /// The event of a refusal.
    fn said(&self, line: &Line) -> Option<Event> {
        if !line.refused() {
            return None;
        }
        let (host, port) = split_target(&line.target);
        Some(Event::EgressRefused {
            host,
            port,
            policy: self.policy.clone(),
        })
    }

    /// The proxy's line a line of the log (its time, a space, the line) holds, and its
    /// time, if it is one of this turn's agent's since the turn began.
    fn ours(&self, text: &str) -> Option<(SystemTime, Line)> {
        let (at, rest) = stamped(text)?;
        if at < self.since {
            return None;
        }
        let line = Line::parse(rest)?;
        (self.from.is_none() || line.from == self.from).then_some((at, line))
    }

    /// The turn's lines of the log so far, with their times.
    async fn lines(&self, backend: &impl Backend) -> Vec<(SystemTime, Line)> {
        let mut logs = backend.logs_since(&self.log, self.since, false);
        let (mut buffer, mut out) = (LineBuffer::default(), Vec::new());
        while let Some(Ok(chunk)) = logs.next().await {
            if let OutputChunk::Stdout(b) = chunk {
                buffer.feed(&b, |l| out.extend(self.ours(l)));
            }
        }
        buffer.finish(|l| out.extend(self.ours(l)));
        out
    }

    /// The turn's refusals so far, each with when it happened.
    pub async fn so_far(&self, backend: &impl Backend) -> Vec<(SystemTime, Event)> {
        let lines = self.lines(backend).await;
        lines
            .into_iter()
            .filter_map(|(at, l)| Some((at, self.said(&l)?)))
            .collect()
    }

    /// The turn's egress record from the log, once its CLI ended (a turn whose driver is
    /// gone, recorded by another caw-box).
    pub async fn record(&self, backend: &impl Backend) -> EgressRecord {
        let lines: Vec<Line> = self
            .lines(backend)
            .await
            .into_iter()
            .map(|(_, l)| l)
            .collect();
        summarise(&self.policy, &lines)
    }

    /// The turn's refusals to `tx` as they come, until `tx` is dropped or this task is
    /// aborted. A log that ends (a pod's sidecar not running yet, or gone with the pod) is
    /// followed again from where it was.
    pub async fn follow(
        self,
        backend: impl Backend,
        tx: tokio::sync::mpsc::UnboundedSender<Event>,
    ) {
        let mut said = 0usize;
        while !tx.is_closed() {
            let mut logs = backend.logs_since(&self.log, self.since, true);
            let (mut buffer, mut at) = (LineBuffer::default(), 0usize);
            while let Some(Ok(chunk)) = logs.next().await {
                let OutputChunk::Stdout(b) = chunk else {
                    continue;
                };
                buffer.feed(&b, |l| {
                    if let Some(event) = self.refusal(l) {
                        at += 1;
                        if at > said {
                            said = at;
                            let _ = tx.send(event);
                        }
                    }
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A line of a log read with its times ([`Backend::logs_since`]): its time and the rest.
pub fn stamped(text: &str) -> Option<(SystemTime, &str)> {
    let (stamp, rest) = text.split_once(' ')?;
    Some((humantime::parse_rfc3339(stamp).ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(from: Option<&str>) -> Watch {
        Watch {
            log: "proxy".into(),
            policy: "balanced".into(),
            since: humantime::parse_rfc3339("2026-11-30T16:41:15.5Z").unwrap(),
            from: from.map(str::to_string),
        }
    }

    /// Only refusals count, from the turn's start on, and of a shared proxy only those from
    /// the agent's address.
    #[test]
    fn a_turns_refusals_are_its_agents_since_it_began() {
        let refused = |at: &str, from: &str| {
            format!(
                r#"{at} {{"proxy":"caw-box","decision":"refused","target":"decoy:80","method":"GET","from":"{from}","conn":3}}"#
            )
        };
        let shared = watch(Some("10.0.0.2"));
        let said = shared
            .refusal(&refused("2026-11-30T16:41:16.000000001Z", "10.0.0.2"))
            .unwrap();
        assert_eq!(
            said,
            Event::EgressRefused {
                host: "decoy".into(),
                port: 80,
                policy: "balanced".into()
            }
        );
        // Before the turn began: an earlier turn's (the same address, reused).
        assert!(shared
            .refusal(&refused("2026-11-30T16:41:15.400000000Z", "10.0.0.2"))
            .is_none());
        // Another turn's agent on the same proxy.
        assert!(shared
            .refusal(&refused("2026-11-30T16:41:16.000000001Z", "10.0.0.3"))
            .is_none());
        // A turn's own proxy: every refusal since it began.
        assert!(watch(None)
            .refusal(&refused("2026-11-30T16:41:16.000000001Z", "127.0.0.1"))
            .is_some());
        // What is not a refusal, or not the proxy's line.
        let allowed = r#"2026-11-30T16:41:16.1Z {"proxy":"caw-box","decision":"allowed","target":"pypi.org:443","from":"10.0.0.2","conn":1}"#;
        assert!(shared.refusal(allowed).is_none());
        assert!(shared
            .refusal(r#"2026-11-30T16:41:16.1Z {"decision":"refused","target":"x:1"}"#)
            .is_none());
        assert!(shared.refusal("caw-box-proxy ok 1").is_none());
    }
}
