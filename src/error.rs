//! The one error type of caw-box and its mapping to SPEC.md's exit codes.
//!
//! Every failure a user can see is an [`Error`] with a kind (which decides the exit code), a
//! message saying what failed, and where it helps, a hint saying what to do. `main` prints
//! it once, as one line.

use std::fmt;
use std::sync::Arc;

use crate::provider_kind::ProviderKind;

/// Which class of failure, and so which exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The agent's turn failed (exit 1).
    Turn,
    /// Bad flag, bad handle, a setting out of range (exit 2).
    Usage,
    /// No session (or other object) of that name, id or handle where it was looked for: none
    /// at all, or one outside what the caller may see (an MCP server's scope) (exit 2).
    NotFound,
    /// The session is running or has queued a turn; a second one is refused (exit 2).
    Busy,
    /// What was asked no longer fits what is there: a patch that does not apply (exit 2).
    Conflict,
    /// A setting wider than the caller may grant: an MCP tool call asking past the server's
    /// ceilings (another host, runtime, directory, bind mode) (exit 2).
    Forbidden,
    /// Docker unreachable, image or volume missing, build failed (exit 3).
    Environment,
    /// Credentials missing or expired (exit 4).
    Credentials,
    /// Vendor usage or rate limit (exit 5).
    UsageLimit,
    /// The session's spend limit (`--max-cost`) is reached (exit 6).
    Budget,
    /// The turn ran out of time (exit 124).
    Timeout,
    /// Ctrl-C or SIGTERM (exit 130).
    Interrupted,
}

impl ErrorKind {
    /// SPEC.md's exit codes: the one table (turn statuses map onto these kinds).
    /// Reading an exit code back finds the first kind of that code: `usage` for 2, whose
    /// finer kinds (`not_found`, `busy`, `conflict`, `forbidden`) keep SPEC.md's exit code.
    const EXIT_CODES: [(ErrorKind, i32); 12] = [
        (ErrorKind::Turn, 1),
        (ErrorKind::Usage, 2),
        (ErrorKind::NotFound, 2),
        (ErrorKind::Busy, 2),
        (ErrorKind::Conflict, 2),
        (ErrorKind::Forbidden, 2),
        (ErrorKind::Environment, 3),
        (ErrorKind::Credentials, 4),
        (ErrorKind::UsageLimit, 5),
        (ErrorKind::Budget, 6),
        (ErrorKind::Timeout, 124),
        (ErrorKind::Interrupted, 130),
    ];

    pub fn exit_code(self) -> i32 {
        Self::EXIT_CODES
            .iter()
            .find(|(k, _)| *k == self)
            .map_or(1, |(_, c)| *c)
    }

    /// The kind's name in the `-o json` error object (`"error":{"kind":...}`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Turn => "turn",
            ErrorKind::Usage => "usage",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Busy => "busy",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Environment => "environment",
            ErrorKind::Credentials => "credentials",
            ErrorKind::UsageLimit => "usage_limit",
            ErrorKind::Budget => "budget",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Interrupted => "interrupted",
        }
    }

    /// The kind named `name` in a `-o json` error object.
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        Self::EXIT_CODES
            .iter()
            .map(|(k, _)| *k)
            .find(|k| k.as_str() == name)
    }

    /// The kind a (non-zero) exit code stands for, read back from another caw-box process.
    pub fn from_exit_code(code: i32) -> Option<ErrorKind> {
        Self::EXIT_CODES
            .iter()
            .find(|(_, c)| *c == code)
            .map(|(k, _)| *k)
    }
}

/// A user-facing failure: what failed, and what to do about it; the lower-level error that
/// caused it, when there is one, is its [`std::error::Error::source`] (for logs and library
/// users; the one line `main` prints is the message and the hint).
#[derive(Debug, Clone)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub hint: Option<String>,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
    /// The outcome is on stdout already (a failed turn's result object), so `-o json` must
    /// not print a second object for it.
    result_printed: bool,
}

/// A failure as `-o json` prints it, in this field order:
/// `{"status":"error","error":{"kind","message","hint"},"exit_code"}`.
#[derive(Debug, serde::Serialize)]
pub struct ErrorReport {
    pub status: &'static str,
    pub error: ErrorDetail,
    pub exit_code: i32,
}

#[derive(Debug, serde::Serialize)]
pub struct ErrorDetail {
    pub kind: &'static str,
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
            source: None,
            result_printed: false,
        }
    }

    /// A command-line parse error (bad flag value, unknown flag): clap's first line is the
    /// message, its other lines (possible values, where to look) the hint.
    pub fn from_clap(e: &clap::Error) -> Self {
        let rendered = e.render().to_string();
        let mut lines = rendered.lines().map(str::trim).filter(|l| !l.is_empty());
        let first = lines.next().unwrap_or("bad command line");
        let message = first.strip_prefix("error: ").unwrap_or(first);
        let rest: Vec<&str> = lines
            .filter(|l| !l.starts_with("Usage:"))
            .map(|l| l.strip_prefix("tip: ").unwrap_or(l))
            .collect();
        let error = Error::usage(message);
        if rest.is_empty() {
            error
        } else {
            error.with_hint(rest.join("; "))
        }
    }

    /// An image that a session needs is not on the Docker host: the one way caw-box says so.
    pub fn missing_image(image: &str, provider: ProviderKind) -> Self {
        Error::environment(format!("image '{image}' is not present")).with_hint(
            if image == provider.default_image() {
                format!("build it with `caw-box image build --provider {provider}`")
            } else {
                "build or pull it, or pass another --image".to_string()
            },
        )
    }

    /// Keeps `source` as the cause of this error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Marks the failure as one whose result object is on stdout already.
    pub fn with_result_printed(mut self) -> Self {
        self.result_printed = true;
        self
    }

    pub fn result_printed(&self) -> bool {
        self.result_printed
    }

    /// The object `-o json` prints for a failure that has no turn result.
    pub fn report(&self) -> ErrorReport {
        ErrorReport {
            status: "error",
            error: ErrorDetail {
                kind: self.kind.as_str(),
                message: one_line(&self.message),
                hint: self.hint.as_deref().map(one_line),
            },
            exit_code: self.exit_code(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Usage, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn busy(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Busy, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, message)
    }

    /// The error a `-o json` error object describes (read back from another caw-box
    /// process); `None` for anything else.
    pub fn from_report(value: &serde_json::Value) -> Option<Self> {
        if value["status"] != "error" {
            return None;
        }
        let detail = &value["error"];
        let kind = ErrorKind::from_name(detail["kind"].as_str()?)?;
        let error = Error::new(kind, detail["message"].as_str()?);
        Some(match detail["hint"].as_str() {
            Some(hint) => error.with_hint(hint),
            None => error,
        })
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
        write!(f, "{}", one_line(&self.message))?;
        if let Some(hint) = &self.hint {
            write!(f, "; {}", one_line(hint))?;
        }
        Ok(())
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<crate::provider_kind::UnknownProvider> for Error {
    fn from(e: crate::provider_kind::UnknownProvider) -> Self {
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

    #[test]
    fn the_cause_is_kept_as_the_source_but_not_printed() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "socket gone");
        let e = Error::environment("cannot reach the Docker daemon").with_source(io);
        assert_eq!(e.to_string(), "cannot reach the Docker daemon");
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), "socket gone");
    }

    #[test]
    fn the_json_object_carries_kind_message_hint_and_exit_code() {
        let e = Error::credentials("no credentials for codex\n found")
            .with_hint("run `caw-box auth collect`");
        assert_eq!(
            serde_json::to_string(&e.report()).unwrap(),
            r#"{"status":"error","error":{"kind":"credentials","message":"no credentials for codex found","hint":"run `caw-box auth collect`"},"exit_code":4}"#
        );
        let no_hint = serde_json::to_string(&Error::usage("x").report()).unwrap();
        assert!(no_hint.contains(r#""hint":null"#), "{no_hint}");
    }

    #[test]
    fn a_clap_error_becomes_a_usage_error_with_its_tips_as_hint() {
        use clap::Parser;
        #[derive(Debug, clap::Parser)]
        struct Args {
            #[arg(long, value_parser = ["a", "b"])]
            pick: String,
        }
        let e = Args::try_parse_from(["x", "--pick", "c"]).unwrap_err();
        let e = Error::from_clap(&e);
        assert_eq!(e.kind, ErrorKind::Usage);
        assert!(e.message.starts_with("invalid value 'c'"), "{}", e.message);
        assert!(e.hint.unwrap().contains("possible values: a, b"));
    }

    #[test]
    fn exit_codes_read_back_to_their_kinds() {
        for code in [1, 2, 3, 4, 5, 124, 130] {
            let kind = ErrorKind::from_exit_code(code).unwrap();
            assert_eq!(kind.exit_code(), code);
        }
        assert_eq!(ErrorKind::from_exit_code(2), Some(ErrorKind::Usage));
        assert_eq!(ErrorKind::from_exit_code(0), None);
        assert_eq!(ErrorKind::from_exit_code(101), None);
    }

    #[test]
    fn the_finer_kinds_of_a_refusal_keep_exit_2_and_read_back_by_name() {
        for (e, name) in [
            (Error::not_found("no session matches 'x'"), "not_found"),
            (Error::busy("session x is busy"), "busy"),
            (Error::conflict("the patch does not apply"), "conflict"),
            (
                Error::forbidden("allow_host is wider")
                    .with_hint("start the server with --allow-host"),
                "forbidden",
            ),
        ] {
            assert_eq!(e.exit_code(), 2);
            let report = serde_json::to_value(e.report()).unwrap();
            assert_eq!(report["error"]["kind"], name);
            let back = Error::from_report(&report).unwrap();
            assert_eq!(
                (back.kind, back.message, back.hint),
                (e.kind, e.message, e.hint)
            );
        }
        assert!(Error::from_report(&serde_json::json!({"status": "success"})).is_none());
    }
}
