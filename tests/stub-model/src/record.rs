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
    }
}
