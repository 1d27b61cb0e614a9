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

pub fn validate_endpoint(url: &str, what: &str) -> Result<String> {
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
