//! Reading a headless turn's output as it comes: its stdout lines into unified events (the
//! entrypoint's markers of how the CLI ended taken out), its stderr for the parser, and
//! the deadlines that end a turn before its CLI did. Not here: what is made of it at the
//! end (`headless.rs`, `ended.rs`).

use std::time::Duration;

use futures_util::StreamExt;

use crate::backend::{Backend, OutputChunk};
use crate::error::Result;
use crate::event::Event;
use crate::lines::LineBuffer;
use crate::provider::ParseContext;
use crate::session::store::record::SessionRecord;
use crate::session::turn::ended::{EndedEarly, EXIT_MARKER, SIGNAL_MARKER};
use crate::session::turn::runtime::{signal_file, STOP_NOW};
use crate::session::turn::{
    append_event, sleep_until, Interrupts, TurnContext, DEFAULT_CONNECT_TIMEOUT, STOP_GRACE,
};
use crate::session::walls::egress::{Live, LiveRefusals};

/// How long a CLI gets, after its model is first reported unreachable, before the turn is
/// stopped for it: a CLI that was slow to start (a loaded machine) may reach its model for
/// the first time after `--connect-timeout` has run out, and the proxy says it failed before
/// the CLI has taken that in. Stopped at once, the CLI would not have said what the turn's
/// record needs (opencode names its new session only in its error log: without it the
/// session's next turn would start a new conversation, the prompt lost).
const TAKES_IN_A_FAILURE: Duration = Duration::from_secs(10);

/// What is read of a headless turn's output as it comes: the reader of its stdout lines,
/// its stderr, and the entrypoint's markers of how the CLI ended.
pub(in crate::session) struct Reading<'s> {
    pub reader: TurnReader<'s>,
    pub lines: LineBuffer,
    pub stderr_lines: LineBuffer,
    pub stderr_tail: Vec<u8>,
    /// The CLI's exit code, as the entrypoint reports it right after the CLI's last output.
    pub cli_exit: Option<i64>,
    /// The signal the container got, where the CLI ended after one (SIGNAL_MARKER).
    pub signalled: Option<String>,
    /// The model's last sign of life (an answer, or a tool's result it asked for).
    pub alive_at: tokio::time::Instant,
    /// The hosts and ports whose refusals by the egress proxy were said as they came (the
    /// rest of the turn's record's are said at its end).
    pub refusals_said: std::collections::HashSet<(String, u16)>,
    /// The egress proxy could not reach the model's host (its words), since the model's
    /// last sign of life: the model is unreachable, whatever the CLI makes of the proxy's
    /// 502.
    pub proxy_unreachable: Option<String>,
    /// When the model was first reported unreachable (by the CLI or the egress proxy) since
    /// its last sign of life.
    failing_since: Option<tokio::time::Instant>,
    /// The model's host, without its port.
    model_host: String,
}

impl<'s> Reading<'s> {
    pub fn new(record: &SessionRecord, sink: &'s mut (dyn FnMut(&Event) + Send)) -> Self {
        let mut reader = TurnReader {
            parser: record.provider.adapter().parser(ParseContext {
                previous_cumulative_usage: record.last_cumulative_usage(),
            }),
            sink,
            session_id: record.session_id.to_string(),
            provider: record.provider,
            mcp_servers: record.settings.mcp_names(),
            session_announced: false,
            raw: Vec::new(),
            events_log: Vec::new(),
            events: Vec::new(),
            model_alive: false,
            meter: crate::session::turn::budget::Meter::new(record),
        };
        if !record.resume_key.is_empty() {
            reader.announce(Some(record.resume_key.clone()));
        }
        Reading {
            reader,
            lines: LineBuffer::default(),
            stderr_lines: LineBuffer::default(),
            stderr_tail: Vec::new(),
            cli_exit: None,
            signalled: None,
            alive_at: tokio::time::Instant::now(),
            refusals_said: Default::default(),
            proxy_unreachable: None,
            failing_since: None,
            model_host: host_of(&crate::session::turn::ended::model_host(record)),
        }
    }

    fn stdout(&mut self, message: &[u8]) {
        let Reading {
            reader,
            lines,
            cli_exit,
            signalled,
            ..
        } = self;
        lines.feed(message, |l| {
            read_stdout_line(l, reader, cli_exit, signalled)
        });
    }

    fn stderr(&mut self, message: &[u8]) {
        let parser = &mut self.reader.parser;
        self.stderr_lines
            .feed(message, |l| parser.parse_stderr_line(l));
        self.stderr_tail.extend_from_slice(message);
        if self.stderr_tail.len() > 64 * 1024 {
            self.stderr_tail.drain(..self.stderr_tail.len() - 32 * 1024);
        }
    }

    /// Reads the output until the CLI ended (its exit marker, or the end of the stream), or
    /// why the turn ends before it did. An adopted turn's wait interrupted is an error:
    /// the turn is not this process's to stop.
    pub async fn read(
        &mut self,
        output: &mut crate::backend::OutputStream,
        options: &crate::session::turn::TurnOptions,
        ran: Duration,
        interrupts: &mut Interrupts,
        adopted: bool,
        mut refusals: Option<&mut LiveRefusals<'_>>,
    ) -> Result<Option<EndedEarly>> {
        let now = tokio::time::Instant::now;
        // An adopted turn's time started with its container.
        let deadline = options.timeout.map(|t| now() + t.saturating_sub(ran));
        // Reset by every line the CLI prints.
        let mut idle_deadline = options.idle_timeout.map(|t| now() + t);
        // Armed while the CLI reports that it cannot reach its model: `--connect-timeout`
        // after the model's last sign of life.
        let connect_timeout = options.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let mut link_deadline: Option<tokio::time::Instant> = None;
        loop {
            let printed = tokio::select! {
                chunk = output.next() => match chunk {
                    Some(Ok(OutputChunk::Stdout(message))) => {
                        self.stdout(&message);
                        if let Some(code) = self.cli_exit {
                            // The CLI is done; the entrypoint waits for the record.
                            tracing::debug!("the CLI exited with {code}; handing off the record");
                            return Ok(None);
                        }
                        if self.reader.meter.crossed()
                            && !adopted
                            && crate::session::turn::budget::stops_mid_turn(self.reader.provider)
                        {
                            return Ok(Some(EndedEarly::Budget));
                        }
                        true
                    }
                    Some(Ok(OutputChunk::Stderr(message))) => {
                        self.stderr(&message);
                        true
                    }
                    Some(Ok(_)) => false,
                    Some(Err(e)) => {
                        tracing::warn!("reading the CLI's output failed: {e}");
                        return Ok(None);
                    }
                    None => return Ok(None),
                },
                Some(live) = async {
                    match refusals.as_mut() {
                        Some(r) => r.next().await,
                        None => std::future::pending().await,
                    }
                } => match live {
                    Live::Refused(event) => {
                        if let Event::EgressRefused { host, port, .. } = &event {
                            self.refusals_said.insert((host.clone(), *port));
                        }
                        self.reader.emit(&event);
                        false
                    }
                    Live::Failed { target, error } => {
                        if host_of(&target) == self.model_host {
                            self.proxy_unreachable = Some(format!(
                                "the egress proxy could not reach {target} ({error})"
                            ));
                            link_deadline = self.link_deadline(connect_timeout);
                        }
                        false
                    }
                },
                _ = sleep_until(deadline) => return Ok(Some(EndedEarly::Timeout)),
                _ = sleep_until(idle_deadline) => return Ok(Some(EndedEarly::Idle)),
                _ = sleep_until(link_deadline) => return Ok(Some(EndedEarly::Unreachable)),
                _ = interrupts.recv() => {
                    if adopted {
                        // Only the waiting ends: the turn is not this process's to stop.
                        return Err(crate::Error::new(
                            crate::error::ErrorKind::Interrupted,
                            "interrupted while waiting; the turn goes on",
                        ));
                    }
                    return Ok(Some(EndedEarly::Interrupted));
                }
            };
            if printed {
                idle_deadline = options.idle_timeout.map(|t| now() + t);
                if std::mem::take(&mut self.reader.model_alive) {
                    self.alive_at = now();
                    self.proxy_unreachable = None;
                }
                link_deadline = self.link_deadline(connect_timeout);
            }
        }
    }

    /// When the turn is stopped for a model it cannot reach, while the CLI or the egress
    /// proxy says so: `--connect-timeout` after the model's last sign of life, and not
    /// before the CLI has had [`TAKES_IN_A_FAILURE`] since the first such report. `None`
    /// while nothing says so, or with no limit.
    fn link_deadline(&mut self, connect_timeout: Duration) -> Option<tokio::time::Instant> {
        let failing =
            self.reader.parser.unreachable().is_some() || self.proxy_unreachable.is_some();
        if !failing {
            self.failing_since = None;
            return None;
        }
        let since = *self
            .failing_since
            .get_or_insert_with(tokio::time::Instant::now);
        (!connect_timeout.is_zero())
            .then(|| (self.alive_at + connect_timeout).max(since + TAKES_IN_A_FAILURE))
    }

    /// Stops a turn that ends before its CLI did, and reads what the CLI printed while
    /// stopping (it still counts).
    pub async fn stop_early(
        &mut self,
        ctx: &TurnContext<'_, impl Backend>,
        output: &mut crate::backend::OutputStream,
        early: EndedEarly,
    ) -> Result<()> {
        let (backend, name) = (ctx.backend, ctx.name);
        if matches!(early, EndedEarly::Unreachable | EndedEarly::Idle) {
            // A stuck CLI gets no grace: the entrypoint kills it at once (and still takes
            // the credentials out of HOME).
            let _ = signal_file(backend, name, STOP_NOW, ctx.user).await;
        }
        backend.stop_container(name, STOP_GRACE).await?;
        // An exit marker here: the CLI ended as it was stopped, and the entrypoint waits
        // for the record (a stop that reached the CLI, not the entrypoint).
        let drain = async {
            while let Some(Ok(chunk)) = output.next().await {
                if let OutputChunk::Stdout(message) = chunk {
                    self.stdout(&message);
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
        Ok(())
    }

    pub fn finish_lines(&mut self) {
        let Reading {
            reader,
            lines,
            stderr_lines,
            ..
        } = self;
        lines.finish(|l| reader.stdout_line(l));
        let parser = &mut reader.parser;
        stderr_lines.finish(|l| parser.parse_stderr_line(l));
    }
}

/// One line of the CLI's stdout as the container printed it: the entrypoint's markers
/// (how the CLI ended) are taken out, the rest goes to the reader.
fn read_stdout_line(
    line: &str,
    reader: &mut TurnReader<'_>,
    cli_exit: &mut Option<i64>,
    signalled: &mut Option<String>,
) {
    if let Some(code) = line.strip_prefix(EXIT_MARKER) {
        *cli_exit = code.trim().parse().ok();
    } else if let Some(rest) = line.strip_prefix(SIGNAL_MARKER) {
        let name = rest.split_whitespace().next().unwrap_or("TERM");
        *signalled = Some(name.to_string());
    } else {
        reader.stdout_line(line);
    }
}

/// Reads a headless turn's output: each stdout line becomes unified events for the sink
/// and the turn's logs; stderr lines only inform the parser.
pub(in crate::session) struct TurnReader<'s> {
    pub parser: Box<dyn crate::provider::StreamParser>,
    pub sink: &'s mut (dyn FnMut(&Event) + Send),
    pub session_id: String,
    pub provider: crate::provider::ProviderKind,
    /// The session's MCP servers, whose tools the events name `mcp__server__tool`.
    pub mcp_servers: Vec<String>,
    pub session_announced: bool,
    /// The CLI's stdout, line by line (`logs --raw`).
    pub raw: Vec<u8>,
    /// The unified events, one JSON line each (`logs`).
    pub events_log: Vec<u8>,
    pub events: Vec<Event>,
    /// Set when a line showed the model at work (an answer, or a result of a tool it called).
    pub model_alive: bool,
    /// The turn's spend so far against the session's `--max-cost`.
    pub meter: crate::session::turn::budget::Meter,
}

impl TurnReader<'_> {
    fn announce(&mut self, resume_key: Option<String>) {
        (self.sink)(&Event::Session {
            session_id: self.session_id.clone(),
            provider: self.provider,
            resume_key,
        });
        self.session_announced = true;
    }

    pub fn emit(&mut self, e: &Event) {
        append_event(&mut self.events_log, e);
        (self.sink)(e);
    }

    pub fn stdout_line(&mut self, line: &str) {
        self.raw.extend_from_slice(line.as_bytes());
        self.raw.push(b'\n');
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        self.parser.parse_line(line, &mut events);
        crate::agent_config::tag_tool_groups(
            self.provider.adapter().tool_names(),
            &self.mcp_servers,
            &mut events,
        );
        if !self.session_announced {
            if let Some(key) = self.parser.resume_key().map(str::to_string) {
                self.announce(Some(key));
            }
        }
        for e in &events {
            if let Event::Usage { usage } = e {
                self.meter.add(usage);
            }
            self.model_alive |= matches!(
                e,
                Event::Text { .. }
                    | Event::Thinking { .. }
                    | Event::ToolCall { .. }
                    | Event::ToolResult { .. }
                    | Event::Usage { .. }
            );
            self.emit(e);
        }
        self.events = events;
    }
}

/// `host:port` (or a bare host) without its port, lower case.
fn host_of(target: &str) -> String {
    let host = match target.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => target,
    };
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}
