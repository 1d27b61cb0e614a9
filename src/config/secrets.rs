//! Refuses secret values in config files: config files are committed, shared and printed
//! (`config show`), so they hold names of host variables (`env_pass`), never keys.
//!
//! A heuristic, tuned to catch what people paste by mistake (vendor key prefixes, long
//! random tokens, credentials in URLs, anything under a key named like a secret) and to let
//! every real setting through (models, images with digests, URLs, hosts, durations).

/// Vendor key prefixes: Anthropic and OpenAI (`sk-`, `sk-ant-`, `sk-proj-`), Google
/// (`AIza`), GitHub, GitLab, Slack, AWS access key ids, Hugging Face.
const KEY_PREFIXES: [&str; 10] = [
    "sk-",
    "AIza",
    "ghp_",
    "gho_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "AKIA",
    "hf_",
];

/// Words that make a key's value a secret, whatever it looks like.
const SECRET_KEY_WORDS: [&str; 6] = ["key", "token", "secret", "password", "passwd", "credential"];

/// Why `value` (under `key`) looks like a secret, or `None`.
pub fn why_secret(key: &str, value: &str) -> Option<&'static str> {
    let lower = key.to_ascii_lowercase();
    if !value.is_empty() && SECRET_KEY_WORDS.iter().any(|w| lower.contains(w)) {
        return Some("its key is named like a secret");
    }
    if has_url_credentials(value) {
        return Some("the URL carries a password");
    }
    for piece in value.split(|c: char| !is_token_char(c)) {
        if KEY_PREFIXES
            .iter()
            .any(|p| piece.starts_with(p) && piece.len() >= p.len() + 16)
        {
            return Some("it looks like an API key");
        }
        if looks_random(piece) {
            return Some("it looks like a token (long and random)");
        }
    }
    None
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+' | '.' | '~')
}

/// `scheme://user:password@host...`
fn has_url_credentials(value: &str) -> bool {
    let Some((_, rest)) = value.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

/// At least 32 characters mixing upper case, lower case and digits, with the entropy of a
/// random string (hex digests, one case only, stay allowed).
fn looks_random(piece: &str) -> bool {
    if piece.len() < 32 {
        return false;
    }
    let upper = piece.chars().any(|c| c.is_ascii_uppercase());
    let lower = piece.chars().any(|c| c.is_ascii_lowercase());
    let digit = piece.chars().any(|c| c.is_ascii_digit());
    upper && lower && digit && entropy(piece) >= 4.0
}

/// Shannon entropy in bits per character.
fn entropy(s: &str) -> f64 {
    let mut counts = [0u32; 256];
    for b in s.bytes() {
        counts[b as usize] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_tokens_are_refused() {
        for (key, value) in [
            ("model", "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv"),
            ("endpoint", "sk-proj-abcdefghijklmnop1234"),
            ("model", "AIzaSyA1b2C3d4E5f6G7h8I9j0KLMNOP"),
            ("image", "ghp_0123456789abcdefABCDEF0123456789"),
            (
                "endpoint",
                "https://gw.example.com/v1?key=AIzaSyA1b2C3d4E5f6G7h8I9j0KL",
            ),
            ("endpoint", "https://user:hunter2@gw.example.com"),
            ("model", "q8Xz2LmN4vB7kR1tY6wP3sD9fG5hJ0aQeC"),
            ("openai_api_key", "anything"),
            ("team_token", "x"),
        ] {
            assert!(why_secret(key, value).is_some(), "{key} = {value}");
        }
    }

    #[test]
    fn real_settings_pass() {
        for (key, value) in [
            ("model", "claude-sonnet-4-5-20250929"),
            ("model", "gpt-5.5"),
            ("image", "registry.example.com/caw-box/codex@sha256:0f4e5c3b2a1908f7e6d5c4b3a2918f7e6d5c4b3a2918f7e6d5c4b3a2918f7e6d"),
            ("endpoint", "http://model-gateway:8080/v1"),
            ("endpoint", "https://user@gw.example.com"),
            ("allow_host", "*.skeleton-key.example.com:443"),
            ("env_pass", "OPENAI_API_KEY"),
            ("timeout", "30m"),
            ("network", "sk-net"),
            ("labels", "team-ci-0123456789-abcdefghijklmnop"),
        ] {
            assert_eq!(why_secret(key, value), None, "{key} = {value}");
        }
    }
}
