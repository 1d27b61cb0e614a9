//! caw-box's own files in HOME: who owns them, and merging a JSON config file with what
//! the CLI keeps there.

/// The owner of files caw-box writes into HOME: the image's `agent` user.
pub const AGENT_UID: u64 = 1000;

/// Merges `overlay` into `base` (JSON objects, recursively); `overlay` wins on conflicts.
pub fn merge_json(base: &mut serde_json::Value, overlay: &serde_json::Value) {
    match (base, overlay) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                // `null` removes the key: a setting an earlier turn wrote is taken back.
                if v.is_null() {
                    b.remove(k);
                    continue;
                }
                merge_json(b.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_keeps_existing_keys() {
        let mut base = serde_json::json!({"a": 1, "security": {"x": true}});
        merge_json(
            &mut base,
            &serde_json::json!({"security": {"auth": {"selectedType": "k"}}}),
        );
        assert_eq!(
            base,
            serde_json::json!({"a": 1, "security": {"x": true, "auth": {"selectedType": "k"}}})
        );
    }
}
