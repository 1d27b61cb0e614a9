//! The user's terminal during an interactive session: raw mode (restored when dropped, also
//! on a panic), its size, and a stoppable reader of what is typed.
//!
//! Keystrokes are read by a thread that polls stdin, so that it can be stopped: a blocking
//! read could not be cancelled and would swallow the first key typed after the session.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::termios::{self, OptionalActions, Termios};
use tokio::sync::mpsc;

/// Whether stdin and stdout are both terminals, so that a TUI can be attached to them.
pub fn is_interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// The terminal's size as (columns, rows), if stdout is a terminal that knows it.
pub fn size() -> Option<(u16, u16)> {
    let ws = termios::tcgetwinsize(std::io::stdout()).ok()?;
    (ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}

/// The terminal's `TERM`, for the program that draws on it.
pub fn term() -> String {
    std::env::var("TERM")
        .ok()
        .filter(|t| !t.is_empty() && t != "dumb")
        .unwrap_or_else(|| "xterm-256color".to_string())
}

/// Raw mode on stdin's terminal for as long as this lives: every key (Ctrl-C too) goes to
/// the program in the container, whose own terminal does the line discipline.
#[derive(Debug)]
pub struct RawMode {
    original: Termios,
}

impl RawMode {
    pub fn enter() -> std::io::Result<RawMode> {
        let stdin = std::io::stdin();
        let original = termios::tcgetattr(&stdin)?;
        let mut raw = original.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(RawMode { original })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.original);
    }
}

/// Undoes what a full-screen program may have left switched on when it was killed rather
/// than quitting: the alternate screen, a hidden cursor, mouse reporting, bracketed paste.
pub fn reset_after_kill() {
    let mut out = std::io::stdout();
    let _ = out.write_all(
        b"\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l\x1b[?1004l\x1b[?1049l\x1b[?25h\x1b[0m\r\n",
    );
    let _ = out.flush();
}

/// Where a full-screen program in the container draws: the user's terminal, byte for byte.
#[derive(Debug)]
pub struct Screen(std::io::Stdout);

impl Screen {
    pub fn stdout() -> Self {
        Screen(std::io::stdout())
    }

    /// Shows what the program wrote, at once.
    pub fn show(&mut self, bytes: &[u8]) {
        let _ = self.0.write_all(bytes);
        let _ = self.0.flush();
    }
}

/// What is typed on stdin, in chunks as they arrive; `None` once stdin ends.
#[derive(Debug)]
pub struct Keys {
    rx: mpsc::Receiver<Vec<u8>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often the reader looks whether it should stop.
const POLL_EVERY: Duration = Duration::from_millis(50);

impl Keys {
    pub fn read() -> Keys {
        let (tx, rx) = mpsc::channel(64);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("caw-box-keys".into())
            .spawn(move || read_loop(&tx, &stopped))
            .ok();
        Keys { rx, stop, thread }
    }

    pub async fn recv(&mut self) -> Option<Vec<u8>> {
        self.rx.recv().await
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.rx.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_loop(tx: &mpsc::Sender<Vec<u8>>, stop: &AtomicBool) {
    let stdin = std::io::stdin();
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: POLL_EVERY.as_nanos() as _,
    };
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(&stdin, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        let revents = fds[0].revents();
        if !revents.contains(PollFlags::IN) {
            if revents.intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL) {
                return;
            }
            continue;
        }
        match rustix::io::read(&stdin, &mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if tx.blocking_send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
            Err(Errno::INTR) | Err(Errno::AGAIN) => continue,
            Err(_) => return,
        }
    }
}
