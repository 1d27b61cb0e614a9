//! The secret newtype: credential bytes that never print. Debug and Display show `****`,
//! so a secret cannot reach a log line, an error message or an event by accident.

use std::fmt;

/// Credential material: an API key, a token, a credentials file's contents.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Secret(bytes.into())
    }

    /// The secret itself, for the one place that must hand it on (a 0600 file, the keyring).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The secret as text, if it is UTF-8.
    pub fn expose_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(****)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        // Best effort: do not leave the bytes behind in freed memory.
        for b in self.0.iter_mut() {
            *b = 0;
        }
        std::hint::black_box(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("sk-live-123456");
        assert_eq!(format!("{s}"), "****");
        assert_eq!(format!("{s:?}"), "Secret(****)");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(Secret(****))");
        assert_eq!(s.expose_str(), Some("sk-live-123456"));
    }
}
