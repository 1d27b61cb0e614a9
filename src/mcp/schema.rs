//! The `start` and `reply` schemas narrowed to what this server allows, so the schema an
//! orchestrating agent reads tells it the ceilings before it asks: the one runtime a server
//! with `--runtime` takes, no `bind` without `--allow-bind`, the spend limit's maximum, and
//! the hosts, time and warmth it may have in the descriptions.

use serde_json::{json, Map, Value};

use super::policy::Policy;

/// Narrows a tool's input schema (its `properties`) to `policy`'s ceilings.
pub fn narrow(schema: &mut Map<String, Value>, policy: &Policy) {
    let Some(Value::Object(props)) = schema.get_mut("properties") else {
        return;
    };
    let server = &policy.ceilings.server;
    let mut set = |name: &str, key: &str, value: Value| {
        if let Some(Value::Object(p)) = props.get_mut(name) {
            p.insert(key.to_string(), value);
        }
    };
    if let Some(runtime) = &server.runtime {
        set("runtime", "enum", json!([runtime]));
    }
    if !policy.allows_bind() {
        set("workspace_mode", "enum", json!(["copy", "none"]));
    }
    if let Some(max) = server.max_cost_usd {
        set("max_cost_usd", "maximum", json!(max));
    }
    if let Some(max) = server.cpus {
        set("cpus", "maximum", json!(max));
    }
    let mut says = Vec::new();
    let egress = server.egress();
    let closer: Vec<&str> = crate::session::record::EgressPolicy::ALL
        .iter()
        .filter(|p| **p >= egress)
        .map(|p| p.as_str())
        .collect();
    set("egress", "enum", json!(closer));
    if egress != crate::session::record::EgressPolicy::Open {
        says.push((
            "allow_host",
            match server.allow_hosts.is_empty() {
                true => format!("This server's sessions are under --egress {egress}: only hosts they reach already."),
                false => format!(
                    "This server's sessions are under --egress {egress} with {}: only hosts they reach already.",
                    server.allow_hosts.join(", ")
                ),
            },
        ));
    }
    says.push((
        "egress",
        format!("At most as open as this server's: {egress}."),
    ));
    let secs = |s: u64| humantime::format_duration(std::time::Duration::from_secs(s)).to_string();
    if let Some(t) = server.timeout_secs {
        says.push(("timeout", format!("At most {} here.", secs(t))));
    }
    says.push((
        "keep_warm",
        match server.keep_warm_secs.filter(|s| *s > 0) {
            Some(k) => format!("At most {} here.", secs(k)),
            None => "This server keeps nothing warm.".to_string(),
        },
    ));
    if let Some(m) = server.memory {
        says.push(("memory", format!("At most {}m here.", m >> 20)));
    }
    let roots: Vec<String> = policy
        .roots()
        .iter()
        .map(|r| r.display().to_string())
        .collect();
    says.push(("workspace", format!("Roots here: {}.", roots.join(", "))));
    for (name, text) in says {
        if let Some(Value::Object(p)) = props.get_mut(name) {
            let before = p.get("description").and_then(Value::as_str).unwrap_or("");
            let joined = format!("{before} {text}").trim().to_string();
            p.insert("description".into(), Value::String(joined));
        }
    }
}
