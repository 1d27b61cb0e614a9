//! The request log: one JSON line per request on stdout (tests read them from the container's
//! logs) and an in-memory copy served at `GET /_stub/requests`.

use std::io::Write;
use std::sync::Mutex;

use serde_json::{json, Map, Value};

/// One recorded request and what the stub did with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// Lowercased header names; repeated headers joined with ", ".
    pub headers: Map<String, Value>,
    /// The body as JSON when it parses, else as a string; `null` when empty.
    pub body: Value,
    pub status: u16,
    /// Where the credential came from: `x-api-key`, `authorization`, `x-goog-api-key`,
    /// `query:key`, or none.
    pub key_header: Option<&'static str>,
    /// What the stub decided, e.g. `recall:otter`, `run`, `fail:429`, `unauthorized`.
    pub directive: String,
    /// The tool the stub called, for `RUN:`.
    pub tool: Option<String>,
    /// The token counts the response carried (see [`sent_usage`]), as the vendor names them.
    pub usage: Option<Value>,
    /// The model requests in flight when it arrived, itself included when it is one.
    pub inflight: usize,
}

/// The usage object a response body carried, as sent: the last of `usage`, `message.usage`,
/// `response.usage`, `usageMetadata` and `response.usageMetadata` in the body's JSON (each
/// `data:` line of an SSE stream, or the whole body). `None` when the response carried none
/// (an error; chat completions streamed without `stream_options.include_usage`). Tests price
/// these, not what a CLI or caw-box says it used.
pub fn sent_usage(body: &str) -> Option<Value> {
    let docs: Vec<Value> = match serde_json::from_str::<Value>(body) {
        Ok(doc) => vec![doc],
        Err(_) => body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect(),
    };
    let paths = [
        "/usage",
        "/message/usage",
        "/response/usage",
        "/usageMetadata",
        "/response/usageMetadata",
    ];
    docs.iter()
        .flat_map(|doc| paths.iter().filter_map(|p| doc.pointer(p)))
        .rev()
        .find(|u| u.is_object())
        .cloned()
}

impl Record {
    /// The record as one JSON line, fields in a fixed order with `"stub":"request"` first
    /// (serde_json sorts object keys, which would bury it).
    pub fn to_line(&self, ts_millis: u128) -> String {
        let fields = [
            ("stub", json!("request")),
            ("ts", json!(ts_millis as u64)),
            ("method", json!(self.method)),
            ("path", json!(self.path)),
            ("query", json!(self.query)),
            ("headers", Value::Object(self.headers.clone())),
            ("body", self.body.clone()),
            ("status", json!(self.status)),
            ("key_header", json!(self.key_header)),
            ("directive", json!(self.directive)),
            ("tool", json!(self.tool)),
            ("usage", json!(self.usage)),
            ("inflight", json!(self.inflight)),
        ];
        let fields: Vec<String> = fields
            .iter()
            .map(|(name, value)| format!("{}:{value}", json!(name)))
            .collect();
        format!("{{{}}}", fields.join(","))
    }

    pub fn to_json(&self, ts_millis: u128) -> Value {
        json!({
            "stub": "request",
            "ts": ts_millis as u64,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body": self.body,
            "status": self.status,
            "key_header": self.key_header,
            "directive": self.directive,
            "tool": self.tool,
            "usage": self.usage,
            "inflight": self.inflight,
        })
    }
}

/// Keeps every record and, when `echo` is set, prints it to stdout as it comes.
#[derive(Debug)]
pub struct Recorder {
    echo: bool,
    records: Mutex<Vec<Value>>,
}

impl Recorder {
    pub fn new(echo: bool) -> Self {
        Recorder {
            echo,
            records: Mutex::new(Vec::new()),
        }
    }

    pub fn record(&self, record: &Record) {
        let ts = crate::protocol::unix_millis();
        if self.echo {
            let mut stdout = std::io::stdout().lock();
            // A closed stdout must not take the server down; the in-memory copy remains.
            let _ = writeln!(stdout, "{}", record.to_line(ts)).and_then(|()| stdout.flush());
        }
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(record.to_json(ts));
    }

    /// All records so far, oldest first.
    pub fn all(&self) -> Vec<Value> {
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        let mut headers = Map::new();
        headers.insert("x-api-key".into(), json!("k"));
        Record {
            method: "POST".into(),
            path: "/v1/messages".into(),
            query: Some("beta=true".into()),
            headers,
            body: json!({"a":1}),
            status: 200,
            key_header: Some("x-api-key"),
            directive: "hello".into(),
            tool: None,
            usage: Some(json!({"input_tokens": 3, "output_tokens": 2})),
            inflight: 1,
        }
    }

    #[test]
    fn the_line_starts_with_the_marker_and_matches_the_json() {
        let record = sample();
        let line = record.to_line(1_700_000_000_000);
        assert!(line.starts_with(r#"{"stub":"request","ts":1700000000000,"method":"POST""#));
        assert!(!line.contains('\n'));
        let parsed: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed, record.to_json(1_700_000_000_000));
    }

    #[test]
    fn records_keep_every_field() {
        let recorder = Recorder::new(false);
        recorder.record(&sample());
        let all = recorder.all();
        assert_eq!(all.len(), 1);
        let line = &all[0];
        assert_eq!(line["stub"], "request");
        assert!(line["ts"].as_u64().unwrap() > 1_600_000_000_000);
        assert_eq!(line["query"], "beta=true");
        assert_eq!(line["headers"]["x-api-key"], "k");
        assert_eq!(line["body"]["a"], 1);
        assert_eq!(line["status"], 200);
        assert_eq!(line["key_header"], "x-api-key");
        assert_eq!(line["directive"], "hello");
        assert!(line["tool"].is_null());
        assert_eq!(line["usage"]["output_tokens"], 2);
        assert_eq!(line["inflight"], 1);
    }

    #[test]
    fn the_sent_usage_is_the_last_one_the_body_carried() {
        // Anthropic SSE: message_start says 1 output token, message_delta the final count.
        let sse = concat!(
            "event: message_start\n",
            r#"data: {"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}"#,
            "\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n",
            "event: message_delta\n",
            r#"data: {"type":"message_delta","usage":{"input_tokens":9,"output_tokens":4}}"#,
            "\n\n"
        );
        assert_eq!(
            sent_usage(sse),
            Some(json!({"input_tokens":9,"output_tokens":4}))
        );
        // Responses SSE: the usage of `response.completed`, not `response.created`'s null.
        let sse = concat!(
            r#"data: {"type":"response.created","response":{"usage":null}}"#,
            "\n\n",
            r#"data: {"type":"response.completed","response":{"usage":{"input_tokens":5}}}"#,
            "\n\n"
        );
        assert_eq!(sent_usage(sse), Some(json!({"input_tokens":5})));
        // One Gemini response; a chat stream without its usage chunk; an error.
        assert_eq!(
            sent_usage(r#"{"candidates":[],"usageMetadata":{"promptTokenCount":7}}"#),
            Some(json!({"promptTokenCount":7}))
        );
        assert_eq!(
            sent_usage("data: {\"choices\":[]}\n\ndata: [DONE]\n\n"),
            None
        );
        assert_eq!(sent_usage(r#"{"error":{"message":"no"}}"#), None);
    }
}
