//! The only place that writes to the terminal: renders unified events in the three output
//! formats of SPEC.md, and progress and errors on stderr.
//!
//! stdout carries the product (the answer, tool calls, JSON); stderr carries everything
//! about it (progress, the resume line, errors), so `caw-box run ... > answer.txt` works.

use std::io::{self, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::event::{Event, TurnResult};

/// How a turn's events are written (SPEC.md "Output formats").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// The answer and tool calls, readable, streaming.
    #[default]
    Text,
    /// One JSON object when the turn ends.
    Json,
    /// One unified event per line.
    StreamJson,
}

/// Renders one turn's events.
#[derive(Debug)]
pub struct Printer {
    format: Format,
    quiet: bool,
    verbose: bool,
    /// Whether the last thing written to stdout in text mode ended a line.
    at_line_start: bool,
}

impl Printer {
    pub fn new(format: impl Into<Format>, quiet: bool, verbose: bool) -> Self {
        Printer {
            format: format.into(),
            quiet,
            verbose,
            at_line_start: true,
        }
    }

    /// A progress line on stderr (text mode, not quiet).
    pub fn progress(&self, message: &str) {
        if !self.quiet && self.format == Format::Text {
            let _ = writeln!(io::stderr(), "{message}");
        }
    }

    pub fn event(&mut self, event: &Event) {
        if let Event::Result { result } = event {
            // Always said, quiet or not, whatever the format: the workspace changed.
            if let Some(q) = &result.quarantined {
                let _ = writeln!(io::stderr(), "{}", q.warning());
            }
        }
        let mut out = io::stdout().lock();
        let _ = match self.format {
            Format::StreamJson => write_json_line(&mut out, event),
            Format::Json => match event {
                Event::Result { result } => write_json_line(&mut out, result),
                _ => Ok(()),
            },
            Format::Text => self.text(&mut out, event),
        };
        let _ = out.flush();
    }

    fn text(&mut self, out: &mut impl Write, event: &Event) -> io::Result<()> {
        match event {
            Event::Text { text } => {
                if !text.is_empty() {
                    out.write_all(text.as_bytes())?;
                    self.at_line_start = text.ends_with('\n');
                }
            }
            Event::Thinking { text } => {
                if self.verbose {
                    let _ = writeln!(io::stderr(), "(thinking) {}", text.trim());
                }
            }
            Event::ToolCall { name, input, .. } => {
                self.line_start(out)?;
                writeln!(out, "● {name}({})", summarize_input(input))?;
            }
            Event::ToolResult {
                output, is_error, ..
            } => {
                self.line_start(out)?;
                let mut lines = output.lines().filter(|l| !l.trim().is_empty());
                let first = lines.next().unwrap_or("(no output)");
                let more = lines.count();
                let prefix = if *is_error { "error: " } else { "" };
                write!(out, "  ⎿ {prefix}{}", truncate(first, 160))?;
                if more > 0 {
                    write!(out, " (+{more} lines)")?;
                }
                writeln!(out)?;
            }
            Event::Error { message } => {
                if !self.quiet {
                    let _ = writeln!(io::stderr(), "agent error: {}", message.trim());
                }
            }
            Event::EgressRefused { host, port, policy } => {
                if !self.quiet {
                    let _ = writeln!(
                        io::stderr(),
                        "egress refused: {host}:{port} (--egress {policy}; --allow-host {host}:{port} would allow it)"
                    );
                }
            }
            Event::Usage { .. } | Event::Session { .. } => {}
            Event::Result { result } => {
                self.line_start(out)?;
                self.resume_line(result);
            }
        }
        Ok(())
    }

    fn line_start(&mut self, out: &mut impl Write) -> io::Result<()> {
        if !self.at_line_start {
            writeln!(out)?;
            self.at_line_start = true;
        }
        Ok(())
    }

    fn resume_line(&self, result: &TurnResult) {
        if !self.quiet {
            let _ = writeln!(
                io::stderr(),
                "resume with: caw-box resume {}",
                result.session_id
            );
        }
    }
}

fn write_json_line(out: &mut impl Write, value: &impl serde::Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")
}

/// The most telling part of a tool's input: a command, a path, else compact JSON.
fn summarize_input(input: &serde_json::Value) -> String {
    for key in ["command", "cmd", "file_path", "path", "pattern", "url"] {
        match input.get(key) {
            Some(serde_json::Value::String(s)) => return truncate(s, 120),
            Some(serde_json::Value::Array(parts)) => {
                let words: Vec<&str> = parts.iter().filter_map(|p| p.as_str()).collect();
                return truncate(&words.join(" "), 120);
            }
            _ => {}
        }
    }
    truncate(&input.to_string(), 120)
}

fn truncate(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

/// Prints a plain line on stdout (command results such as a handle or a table).
pub fn println(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
}

/// Prints a line on stderr.
pub fn eprintln(line: &str) {
    let _ = writeln!(io::stderr(), "{line}");
}

/// Writes bytes to stdout as they are (a stored transcript, a diff).
pub fn write_stdout(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

/// Writes text to stderr as it is (a build's log under `-v`).
pub fn write_stderr(text: &str) {
    let _ = io::stderr().write_all(text.as_bytes());
}

/// Runs `write` with stdout (for generators that take a writer, such as completions).
pub fn with_stdout(write: impl FnOnce(&mut dyn Write)) {
    let mut out = io::stdout().lock();
    write(&mut out);
    let _ = out.flush();
}

/// Prints rows as aligned columns on stdout.
pub fn print_table<const N: usize>(rows: &[[String; N]]) {
    for line in table_lines(rows) {
        println(&line);
    }
}

fn table_lines<const N: usize>(rows: &[[String; N]]) -> Vec<String> {
    let mut widths = [0usize; N];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
                .collect();
            cells.join("   ").trim_end().to_string()
        })
        .collect()
}

/// A spinner on stderr for long work: `{spinner} PREFIX MESSAGE ELAPSED`, cleared when
/// finished. Hidden when `shown` is false (quiet, verbose, or not wanted).
#[derive(Debug)]
pub struct Spinner(ProgressBar);

impl Spinner {
    pub fn new(prefix: String, shown: bool) -> Self {
        if !shown {
            return Spinner(ProgressBar::hidden());
        }
        let pb = ProgressBar::new_spinner();
        pb.set_style(
            ProgressStyle::with_template("{spinner} {prefix} {wide_msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_prefix(prefix);
        pb.enable_steady_tick(Duration::from_millis(120));
        Spinner(pb)
    }

    pub fn set_message(&self, message: String) {
        self.0.set_message(message);
    }

    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}

/// Prints one JSON object on one line of stdout.
pub fn print_json_line(value: &impl serde::Serialize) {
    let mut out = io::stdout().lock();
    let _ = write_json_line(&mut out, value);
}

/// Prints JSON on stdout, pretty.
pub fn print_json(value: &impl serde::Serialize) {
    let mut out = io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, value);
    let _ = writeln!(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_columns_are_aligned_and_lines_trimmed() {
        let rows = [
            ["ID".to_string(), "NAME".to_string(), "X".to_string()],
            ["abc".to_string(), "".to_string(), "1".to_string()],
            ["a".to_string(), "longer".to_string(), "".to_string()],
        ];
        assert_eq!(
            table_lines(&rows),
            ["ID    NAME     X", "abc            1", "a     longer"]
        );
    }

    #[test]
    fn tool_input_summary_prefers_the_command() {
        assert_eq!(
            summarize_input(&serde_json::json!({"command": "ls -la", "description": "x"})),
            "ls -la"
        );
        assert_eq!(
            summarize_input(&serde_json::json!({"command": ["bash", "-lc", "echo hi"]})),
            "bash -lc echo hi"
        );
        assert_eq!(summarize_input(&serde_json::json!({"q": 1})), r#"{"q":1}"#);
    }
}
