//! The only place that writes to the terminal: renders unified events in the three output
//! formats of SPEC.md, and progress and errors on stderr.
//!
//! stdout carries the product (the answer, tool calls, JSON); stderr carries everything
//! about it (progress, the resume line, errors), so `caw-box run ... > answer.txt` works.

use std::io::{self, Write};

use crate::cli::OutputFormat;
use crate::event::{Event, TurnResult};

/// Renders one turn's events.
#[derive(Debug)]
pub struct Printer {
    format: OutputFormat,
    quiet: bool,
    verbose: bool,
    /// Whether the last thing written to stdout in text mode ended a line.
    at_line_start: bool,
}

impl Printer {
    pub fn new(format: OutputFormat, quiet: bool, verbose: bool) -> Self {
        Printer {
            format,
            quiet,
            verbose,
            at_line_start: true,
        }
    }

    /// A progress line on stderr (text mode, not quiet).
    pub fn progress(&self, message: &str) {
        if !self.quiet && self.format == OutputFormat::Text {
            let _ = writeln!(io::stderr(), "{message}");
        }
    }

    pub fn event(&mut self, event: &Event) {
        let mut out = io::stdout().lock();
        let _ = match self.format {
            OutputFormat::StreamJson => write_json_line(&mut out, event),
            OutputFormat::Json => match event {
                Event::Result { result } => write_json_line(&mut out, result),
                _ => Ok(()),
            },
            OutputFormat::Text => self.text(&mut out, event),
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

/// Writes bytes as they are on stdout (a patch, a listing).
pub fn write_stdout(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

/// Prints a line on stderr.
pub fn eprintln(line: &str) {
    let _ = writeln!(io::stderr(), "{line}");
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
