//! Server-sent events: writing the stub's streams and reading them back (for tests).

use serde_json::Value;

/// One SSE event with an optional `event:` name and a JSON `data:` payload.
pub fn event(name: Option<&str>, data: &Value) -> String {
    match name {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// A parsed SSE event: its name (if any) and its raw data.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: Option<String>,
    pub data: String,
}

impl Event {
    /// The data as JSON (`Null` when it is not JSON, e.g. `[DONE]`).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// Parses an SSE stream into events (multi-line data joined with `\n`; comments skipped).
pub fn parse(stream: &str) -> Vec<Event> {
    let mut events = Vec::new();
    for block in stream.replace("\r\n", "\n").split("\n\n") {
        let mut name = None;
        let mut data: Vec<&str> = Vec::new();
        for line in block.lines() {
            if let Some(value) = line.strip_prefix("event:") {
                name = Some(value.trim().to_string());
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push(value.strip_prefix(' ').unwrap_or(value));
            }
        }
        if name.is_some() || !data.is_empty() {
            events.push(Event {
                name,
                data: data.join("\n"),
            });
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_named_and_unnamed_events() {
        let stream = [
            event(Some("ping"), &json!({"type":"ping"})),
            event(None, &json!({"a":"line\nbreak"})),
            "data: [DONE]\n\n".to_string(),
        ]
        .concat();
        let events = parse(&stream);
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].name.as_deref(), Some("ping"));
        assert_eq!(events[0].json(), json!({"type":"ping"}));
        assert_eq!(events[1].name, None);
        assert_eq!(events[1].json()["a"], "line\nbreak");
        assert_eq!(events[2].data, "[DONE]");
        assert_eq!(events[2].json(), Value::Null);
    }

    #[test]
    fn parses_crlf_and_comments() {
        let events = parse(": keepalive\r\n\r\nevent: x\r\ndata: 1\r\ndata: 2\r\n\r\n");
        assert_eq!(
            events,
            vec![Event {
                name: Some("x".into()),
                data: "1\n2".into()
            }]
        );
    }
}
