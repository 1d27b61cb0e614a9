//! Model endpoints and other http(s) URLs given on the command line, in config files or
//! in an MCP server's definition: checked once, the same way everywhere.

use crate::error::{Error, Result};

/// `host:port` of an http(s) URL.
pub fn endpoint_host(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit('@').next()?;
    Some(if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:{}", if scheme == "https" { 443 } else { 80 })
    })
}

/// Checks an http(s) URL (`what` names it in the error) and returns it without a trailing
/// `/`. One with a user or password in it is refused, its user and password left out of the
/// message: a URL is remembered in a session's labels, which anyone who may list the
/// engine's volumes reads.
pub fn validate_endpoint(url: &str, what: &str) -> Result<String> {
    if userinfo_end(url).is_some() {
        return Err(Error::usage(format!(
            "{what} '{}' has a user or password in it: caw-box keeps the URL in the session's labels, in the clear",
            redact_userinfo(url)
        ))
        .with_hint(
            "drop them from the URL; give the credential as the provider's API key (`caw-box auth collect`, or --env)",
        ));
    }
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() > "https://".len()
        && !url.contains(char::is_whitespace);
    if ok {
        Ok(url.trim_end_matches('/').to_string())
    } else {
        Err(
            Error::usage(format!("{what} '{url}' is not an http(s) URL"))
                .with_hint("use e.g. http://model-gateway:8080"),
        )
    }
}

/// Where the user information (`user:password@`) of `url`'s authority ends: the index of
/// its `@`; `None` when it has none.
fn userinfo_end(url: &str) -> Option<usize> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let authority = &url[start..];
    let authority = &authority[..authority.find(['/', '?', '#']).unwrap_or(authority.len())];
    authority.rfind('@').map(|i| start + i)
}

/// `url` with its user and password (if any) shown as `***`, for messages.
pub fn redact_userinfo(url: &str) -> String {
    match userinfo_end(url) {
        Some(at) => {
            let start = url.find("://").map_or(0, |i| i + 3);
            format!("{}***{}", &url[..start], &url[at..])
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_with_a_user_or_password_is_refused_without_them() {
        for url in [
            "http://user:s3cret@gateway:8080",
            "https://s3cret@gateway/v1",
            "http://:s3cret@gateway",
            "user:s3cret@gateway:8080",
            "ftp://u:s3cret@host",
        ] {
            let e = validate_endpoint(url, "--endpoint").unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Usage, "{url}");
            let text = e.to_string();
            assert!(!text.contains("s3cret"), "{text}");
            assert!(text.contains("has a user or password"), "{text}");
        }
        assert_eq!(
            redact_userinfo("http://u:p@gateway:8080/v1"),
            "http://***@gateway:8080/v1"
        );
        // An `@` past the authority is no user: a path, a query.
        assert_eq!(
            validate_endpoint("http://gateway/team@corp?to=a@b", "--endpoint").unwrap(),
            "http://gateway/team@corp?to=a@b"
        );
        assert_eq!(redact_userinfo("http://gateway/a@b"), "http://gateway/a@b");
    }
}
