//! The one error type of caw-box and its mapping to SPEC.md's exit codes.
//!
//! Every failure a user can see is an [`Error`] with a kind (which decides the exit code), a
//! message saying what failed, and where it helps, a hint saying what to do. `main` prints
//! it once, as one line.

use std::fmt;

/// Which class of failure, and so which exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The agent's turn failed (exit 1).
    Turn,
    /// Bad flag, bad or unknown handle, busy session (exit 2).
    Usage,
    /// Docker unreachable, image or volume missing, build failed (exit 3).
    Environment,
    /// Credentials missing or expired (exit 4).
    Credentials,
    /// Vendor usage or rate limit (exit 5).
    UsageLimit,
    /// The turn ran out of time (exit 124).
    Timeout,
    /// Ctrl-C or SIGTERM (exit 130).
    Interrupted,
}

impl ErrorKind {
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::Turn => 1,
            ErrorKind::Usage => 2,
            ErrorKind::Environment => 3,
            ErrorKind::Credentials => 4,
            ErrorKind::UsageLimit => 5,
            ErrorKind::Timeout => 124,
            ErrorKind::Interrupted => 130,
        }
    }
}

/// A user-facing failure: what failed, and what to do about it.
#[derive(Debug, Clone)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub hint: Option<String>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            hint: None,
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Usage, message)
    }

    pub fn environment(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Environment, message)
    }

    pub fn credentials(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Credentials, message)
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn exit_code(&self) -> i32 {
        self.kind.exit_code()
    }
}

impl fmt::Display for Error {
    /// One line: the message, then the hint after a semicolon.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one_line = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        write!(f, "{}", one_line(&self.message))?;
        if let Some(hint) = &self.hint {
            write!(f, "; {}", one_line(hint))?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

impl From<crate::provider::UnknownProvider> for Error {
    fn from(e: crate::provider::UnknownProvider) -> Self {
        Error::usage(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_one_line_with_hint() {
        let e = Error::environment("failed to reach Docker:\n connection refused")
            .with_hint("is the Docker daemon running?");
        assert_eq!(
            e.to_string(),
            "failed to reach Docker: connection refused; is the Docker daemon running?"
        );
        assert_eq!(e.exit_code(), 3);
    }
}
