//! The resume handle: the one string that resumes a session from any process that reaches
//! its backend (the Docker daemon, or the cluster and namespace it names).
//!
//! It is JSON (compatible with caw's handle, extended with the volume name). It carries no
//! secret, but it grants access to the conversation. Parsing validates the shape only;
//! checking the handle against the backend (volume present, labels agree) is the session
//! layer's.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::provider::ProviderKind;

/// The version this build writes for a Docker session (and the oldest it accepts).
pub const HANDLE_VERSION: u32 = 1;

/// The version of a handle that names its backend and namespace (a Kubernetes session's);
/// a version-1 handle is a Docker session's.
pub const SCOPED_HANDLE_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeHandle {
    pub version: u32,
    pub provider: ProviderKind,
    pub session_id: Uuid,
    /// The vendor's own resume id (Claude's session id, Codex's thread id, ...).
    pub resume_key: String,
    /// The state volume: `caw-box-<session_id>`.
    pub volume: String,
    /// Version 2: the backend (`docker` or `kubernetes`) the session lives on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Version 2, Kubernetes: the namespace of the session's objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Version 2, Kubernetes: the kubeconfig context the session was made through, when
    /// one was named (`--context`); else the kubeconfig's current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// A fork's lineage (`caw-box fork`): the session and turn it was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<crate::session::store::record::ForkedFrom>,
}

impl ResumeHandle {
    /// A handle of a session on the backend `scope` (a connected backend's,
    /// [`crate::backend::Capabilities::scope`]): Docker's keep version 1 (what every earlier
    /// caw-box reads); others name their backend and namespace (version 2).
    pub fn in_scope(
        provider: ProviderKind,
        session_id: Uuid,
        resume_key: impl Into<String>,
        scope: &crate::backend::Scope,
    ) -> Self {
        let docker = scope.kind == crate::backend::BackendKind::Docker;
        ResumeHandle {
            version: if docker {
                HANDLE_VERSION
            } else {
                SCOPED_HANDLE_VERSION
            },
            provider,
            session_id,
            resume_key: resume_key.into(),
            volume: crate::session::store::names::state_volume(session_id),
            backend: (!docker).then(|| scope.kind.as_str().to_string()),
            namespace: if docker {
                None
            } else {
                scope.namespace.clone()
            },
            context: if docker { None } else { scope.context.clone() },
            forked_from: None,
        }
    }

    /// The handle with a fork's lineage.
    pub fn forked(mut self, from: Option<crate::session::store::record::ForkedFrom>) -> Self {
        self.forked_from = from;
        self
    }

    /// The handle in `target` (a command's TARGET argument) if it is one that parses.
    pub fn in_target(target: &str) -> Option<Self> {
        Self::looks_like_handle(target)
            .then(|| Self::parse(target).ok())
            .flatten()
    }

    /// The backend this handle's session lives on (`docker` for a version-1 handle).
    pub fn backend_name(&self) -> &str {
        self.backend.as_deref().unwrap_or("docker")
    }

    /// Refuses (exit 2) a handle of a session that lives on another backend or namespace
    /// than `scope`, saying which it needs.
    pub fn check_scope(&self, scope: &crate::backend::Scope) -> Result<()> {
        let backend = self.backend_name();
        if backend != scope.kind.as_str() {
            return Err(Error::usage(format!(
                "this handle is of a session on the {backend} backend, not {}",
                scope.kind.as_str()
            ))
            .with_hint(format!("pass --backend {backend}")));
        }
        if let (Some(theirs), Some(ours)) = (&self.namespace, &scope.namespace) {
            if theirs != ours {
                return Err(Error::usage(format!(
                    "this handle is of a session in namespace '{theirs}', not '{ours}'"
                ))
                .with_hint(format!("pass --namespace {theirs}")));
            }
        }
        Ok(())
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
            backend: Option<String>,
            namespace: Option<String>,
            context: Option<String>,
            forked_from: Option<crate::session::store::record::ForkedFrom>,
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
        if version != HANDLE_VERSION && version != SCOPED_HANDLE_VERSION {
            return Err(bad(&format!(
                "version {version} is not supported (this caw-box reads version {HANDLE_VERSION}, and {SCOPED_HANDLE_VERSION} for a session on Kubernetes)"
            )));
        }
        let backend = match (version, raw.backend) {
            (HANDLE_VERSION, _) => None,
            (_, Some(b)) if b == "docker" || b == "kubernetes" => Some(b),
            (_, Some(_)) => return Err(bad("\"backend\" is not docker or kubernetes")),
            (_, None) => return Err(bad("no \"backend\"")),
        };
        let (namespace, context) = if version == HANDLE_VERSION {
            (None, None)
        } else {
            (raw.namespace, raw.context.filter(|c| !c.is_empty()))
        };
        if context
            .as_deref()
            .is_some_and(|c| c.len() > 253 || c.chars().any(|c| c.is_control()))
        {
            return Err(bad("\"context\" is not a kubeconfig context name"));
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
        if volume != crate::session::store::names::state_volume(session_id) {
            return Err(bad(&format!(
                "\"volume\" is '{volume}' but a session {session_id} lives in '{}'",
                crate::session::store::names::state_volume(session_id)
            )));
        }
        Ok(ResumeHandle {
            version,
            provider,
            session_id,
            resume_key,
            volume,
            backend,
            namespace,
            context,
            forked_from: raw.forked_from,
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
        ResumeHandle::in_scope(
            ProviderKind::Codex,
            Uuid::parse_str("5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b").unwrap(),
            "019a-thread",
            &crate::backend::Scope::default(),
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
    fn a_kubernetes_handle_names_its_backend_and_namespace_and_the_other_backend_refuses_it() {
        use crate::backend::{BackendKind, Scope};
        let kube = Scope {
            kind: BackendKind::Kubernetes,
            namespace: Some("agents".into()),
            context: None,
        };
        let id = Uuid::parse_str("5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b").unwrap();
        let h = ResumeHandle::in_scope(ProviderKind::Codex, id, "k", &kube);
        let json = h.to_json();
        assert!(json.contains(r#""version":2"#), "{json}");
        assert!(
            json.contains(r#""backend":"kubernetes","namespace":"agents""#),
            "{json}"
        );
        let parsed = ResumeHandle::parse(&json).unwrap();
        assert_eq!(parsed, h);
        assert!(parsed.check_scope(&kube).is_ok());
        let e = parsed.check_scope(&Scope::default()).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("kubernetes backend"), "{e}");
        let other_ns = Scope {
            namespace: Some("other".into()),
            ..kube.clone()
        };
        assert_eq!(parsed.check_scope(&other_ns).unwrap_err().exit_code(), 2);
        // An old handle is a Docker session's.
        let old = ResumeHandle::parse(&sample().to_json()).unwrap();
        assert!(old.check_scope(&Scope::default()).is_ok());
        assert_eq!(old.check_scope(&kube).unwrap_err().exit_code(), 2);
        assert_eq!(old.backend_name(), "docker");
        // A named kube context goes into the handle and back out; none, none.
        assert!(!json.contains("context"), "{json}");
        let named = Scope {
            context: Some("prod-eu".into()),
            ..kube.clone()
        };
        let h = ResumeHandle::in_scope(ProviderKind::Codex, id, "k", &named);
        let parsed = ResumeHandle::in_target(&h.to_json()).unwrap();
        assert_eq!(parsed.context.as_deref(), Some("prod-eu"));
        assert!(ResumeHandle::in_target("fixer").is_none());
    }

    #[test]
    fn malformed_handles_are_usage_errors_that_say_why() {
        let cases = [
            ("{", "not valid JSON"),
            (
                r#"{"version":3,"provider":"codex","session_id":"5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b","resume_key":"k","volume":"caw-box-5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b"}"#,
                "version 3",
            ),
            // Version 2 names its backend.
            (
                r#"{"version":2,"provider":"codex","session_id":"5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b","resume_key":"k","volume":"caw-box-5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b"}"#,
                "no \"backend\"",
            ),
            (
                r#"{"version":2,"provider":"codex","session_id":"5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b","resume_key":"k","volume":"caw-box-5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b","backend":"nomad"}"#,
                "not docker or kubernetes",
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
