//! The resume handle: the one string that resumes a session anywhere the Docker daemon is.
//!
//! It is JSON (compatible with caw's handle, extended with the volume name). It carries no
//! secret, but it grants access to the conversation. Parsing validates the shape only;
//! checking the handle against Docker (volume present, labels agree) is the session layer's.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::provider::ProviderKind;

/// The version this build writes and accepts.
pub const HANDLE_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeHandle {
    pub version: u32,
    pub provider: ProviderKind,
    pub session_id: Uuid,
    /// The vendor's own resume id (Claude's session id, Codex's thread id, ...).
    pub resume_key: String,
    /// The state volume: `caw-box-<session_id>`.
    pub volume: String,
}

impl ResumeHandle {
    pub fn new(provider: ProviderKind, session_id: Uuid, resume_key: impl Into<String>) -> Self {
        ResumeHandle {
            version: HANDLE_VERSION,
            provider,
            session_id,
            resume_key: resume_key.into(),
            volume: crate::session::names::state_volume(session_id),
        }
    }

    /// Whether `s` looks like a handle rather than an id, prefix or name.
    pub fn looks_like_handle(s: &str) -> bool {
        s.trim_start().starts_with('{')
    }

    /// Parses and validates a handle string. Every failure is a usage error (exit 2) whose
    /// message says what is wrong with it, never echoing the whole string back.
    pub fn parse(s: &str) -> Result<Self> {
        #[derive(Deserialize)]
        struct Raw {
            version: Option<u32>,
            provider: Option<String>,
            session_id: Option<String>,
            resume_key: Option<String>,
            volume: Option<String>,
        }
        let bad = |why: &str| {
            Error::usage(format!("malformed resume handle: {why}")).with_hint(
                "pass the handle printed by `caw-box handle TARGET`, quoted as one argument",
            )
        };
        // serde's type errors quote the offending value, which may be the whole string.
        let raw: Raw = serde_json::from_str(s.trim()).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => bad(&format!(
                "not a JSON object of the handle's fields (a value of the wrong type at column {})",
                e.column()
            )),
            _ => bad(&format!("not valid JSON ({e})")),
        })?;
        let version = raw.version.ok_or_else(|| bad("no \"version\""))?;
        if version != HANDLE_VERSION {
            return Err(bad(&format!(
                "version {version} is not supported (this caw-box reads version {HANDLE_VERSION})"
            )));
        }
        let provider: ProviderKind = raw
            .provider
            .ok_or_else(|| bad("no \"provider\""))?
            .parse()
            .map_err(|e: crate::provider::UnknownProvider| bad(&e.to_string()))?;
        let session_id = raw.session_id.ok_or_else(|| bad("no \"session_id\""))?;
        let session_id =
            Uuid::parse_str(&session_id).map_err(|_| bad("\"session_id\" is not a UUID"))?;
        let resume_key = raw.resume_key.unwrap_or_default();
        if resume_key.is_empty() {
            return Err(bad("empty \"resume_key\""));
        }
        if resume_key.len() > 512 || resume_key.chars().any(|c| c.is_control()) {
            return Err(bad("\"resume_key\" is not a vendor session id"));
        }
        let volume = raw.volume.ok_or_else(|| bad("no \"volume\""))?;
        if volume != crate::session::names::state_volume(session_id) {
            return Err(bad(&format!(
                "\"volume\" is '{volume}' but a session {session_id} lives in '{}'",
                crate::session::names::state_volume(session_id)
            )));
        }
        Ok(ResumeHandle {
            version,
            provider,
            session_id,
            resume_key,
            volume,
        })
    }

    /// The compact JSON form users copy around.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a handle always serializes")
    }
}

impl std::fmt::Display for ResumeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ResumeHandle {
        ResumeHandle::new(
            ProviderKind::Codex,
            Uuid::parse_str("5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b").unwrap(),
            "019a-thread",
        )
    }

    #[test]
    fn round_trips_in_spec_shape() {
        let h = sample();
        let json = h.to_json();
        assert_eq!(
            json,
            r#"{"version":1,"provider":"codex","session_id":"5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b","resume_key":"019a-thread","volume":"caw-box-5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b"}"#
        );
        assert_eq!(ResumeHandle::parse(&json).unwrap(), h);
    }

    #[test]
    fn malformed_handles_are_usage_errors_that_say_why() {
        let cases = [
            ("{", "not valid JSON"),
            (
                r#"{"version":2,"provider":"codex","session_id":"5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b","resume_key":"k","volume":"caw-box-5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b"}"#,
                "version 2",
            ),
            (
                r#"{"version":1,"provider":"gpt","session_id":"5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b","resume_key":"k","volume":"caw-box-5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b"}"#,
                "unknown provider",
            ),
            (
                r#"{"version":1,"provider":"codex","session_id":"nope","resume_key":"k","volume":"caw-box-nope"}"#,
                "not a UUID",
            ),
            (
                r#"{"version":1,"provider":"codex","session_id":"5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b","resume_key":"","volume":"caw-box-5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b"}"#,
                "empty",
            ),
            (
                r#"{"version":1,"provider":"codex","session_id":"5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b","resume_key":"k","volume":"other"}"#,
                "\"volume\" is 'other'",
            ),
        ];
        for (input, why) in cases {
            let err = ResumeHandle::parse(input).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{input}");
            assert!(err.to_string().contains(why), "{input}: {err}");
            assert!(!err.to_string().contains('\n'));
        }
    }
}
