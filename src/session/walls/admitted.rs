//! What each egress policy admits (`--egress`, `--allow-host`): the model's hosts, the
//! person's, the `balanced` list's; and whether one host rule is within another. Pure: the
//! proxy that holds the agent to them is [`super::egress`]'s.

use crate::endpoint::endpoint_host;
use crate::provider::ProviderKind;
use crate::session::store::record::{EgressPolicy, SessionSettings};

/// The `balanced` policy's hosts beyond the model's, with where each comes from.
const BALANCED: &str = include_str!("../../../images/base/egress-balanced.txt");

/// The `balanced` policy's hosts (`egress-balanced.txt`), each on ports 80 and 443.
pub fn balanced_hosts() -> Vec<String> {
    BALANCED
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .flat_map(|h| [format!("{h}:80"), format!("{h}:443")])
        .collect()
}

/// The hosts of `--allow-host` with `@provider` spelled out.
pub fn expand_allow_hosts(provider: ProviderKind, settings: &SessionSettings) -> Vec<String> {
    let mut out = Vec::new();
    for h in &settings.allow_hosts {
        if h == "@provider" {
            out.extend(model_hosts(provider, settings));
        } else {
            out.push(h.to_lowercase());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The hosts of the session's model: the `--endpoint` host, else the vendor's API hosts.
fn model_hosts(provider: ProviderKind, settings: &SessionSettings) -> Vec<String> {
    match settings.endpoint.as_deref().and_then(endpoint_host) {
        Some(e) => vec![e],
        None => provider.api_hosts().iter().map(|s| s.to_string()).collect(),
    }
}

/// `HOST[:PORT]` as the egress proxy reads it: lower case, the port when given.
fn split_host(entry: &str) -> (String, Option<&str>) {
    match entry.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            (h.to_ascii_lowercase(), Some(p))
        }
        _ => (entry.to_ascii_lowercase(), None),
    }
}

/// Whether every host `asked` admits is admitted by `allowed` (the proxy's rules: a name
/// matches itself, `*.d` matches every name under `d`, and no port means any port).
pub fn host_covered(asked: &str, allowed: &str) -> bool {
    if asked == "@provider" || allowed == "@provider" {
        return asked == allowed;
    }
    let ((a_host, a_port), (b_host, b_port)) = (split_host(asked), split_host(allowed));
    let host_ok = match b_host.strip_prefix("*.") {
        Some(domain) => {
            let under = format!(".{domain}");
            a_host.ends_with(&under) || a_host.strip_prefix("*.").is_some_and(|d| d == domain)
        }
        None => a_host == b_host,
    };
    host_ok && (b_port.is_none() || a_port == b_port)
}

/// What a turn's proxy admits under the session's policy: under `locked` the model's hosts
/// (where the agent reaches its model itself, `model_direct`: not through a broker) and
/// `--allow-host`'s, under `balanced` the package and source hosts too; under `open` every
/// host (none need be named).
pub fn admitted(
    provider: ProviderKind,
    settings: &SessionSettings,
    model_direct: bool,
) -> Vec<String> {
    let policy = settings.egress();
    if policy == EgressPolicy::Open {
        return Vec::new();
    }
    let mut hosts = expand_allow_hosts(provider, settings);
    if model_direct {
        hosts.extend(model_hosts(provider, settings));
    }
    if policy == EgressPolicy::Balanced {
        hosts.extend(balanced_hosts());
    }
    hosts.sort();
    hosts.dedup();
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// balanced holds the package hosts on ports 80 and 443; locked only the model's (the
    /// endpoint's host where there is one) and the person's; open names none.
    #[test]
    fn what_each_policy_admits() {
        let mut s = SessionSettings {
            egress_policy: Some(EgressPolicy::Balanced),
            allow_hosts: vec!["docs.example.com".into()],
            ..Default::default()
        };
        let balanced = admitted(ProviderKind::Codex, &s, true);
        for h in [
            "pypi.org:443",
            "pypi.org:80",
            "registry.npmjs.org:443",
            "api.openai.com:443",
            "docs.example.com",
        ] {
            assert!(balanced.iter().any(|a| a == h), "{h} in {balanced:?}");
        }
        s.egress_policy = Some(EgressPolicy::Locked);
        s.endpoint = Some("http://stub:8080/v1".into());
        let locked = admitted(ProviderKind::Codex, &s, true);
        assert!(locked.contains(&"stub:8080".to_string()), "{locked:?}");
        // Through a broker, the model's host is the broker's way out, not the agent's.
        let brokered = admitted(ProviderKind::Codex, &s, false);
        assert!(!brokered.contains(&"stub:8080".to_string()), "{brokered:?}");
        assert!(
            brokered.contains(&"docs.example.com".to_string()),
            "{brokered:?}"
        );
        assert!(
            !locked.iter().any(|h| h.starts_with("pypi.org")),
            "{locked:?}"
        );
        assert!(
            !locked.iter().any(|h| h.starts_with("api.openai.com")),
            "{locked:?}"
        );
        s.egress_policy = Some(EgressPolicy::Open);
        assert!(admitted(ProviderKind::Codex, &s, true).is_empty());
        // Every line of the list is a host or a `*.` domain.
        for h in balanced_hosts() {
            let (host, _) = split_host(&h);
            assert!(
                !host.is_empty() && !host.contains(' ') && !host.contains('/'),
                "{h}"
            );
        }
    }
}
