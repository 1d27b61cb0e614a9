//! A turn pod's end, as its agent container says it (the acknowledgement line of
//! [`super::spec::MARKED_ENTRY`] on its stdout, once the entrypoint ended: after the record
//! hand-off, its exit code), read from this process's attachments: the driver learns it
//! without waiting for the pod's status, which says so only after the kubelet noticed the
//! container's end (its next relist, up to a second later).

use std::collections::HashMap;
use std::sync::Mutex;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::backend::{OutputChunk, OutputStream};

/// What the wrapper prints last: this, the exit code, a newline.
pub(super) const ENDED: &[u8] = b"\x1ecaw-box-ended ";

/// The exit codes the agents of this process's attachments announced, by pod name.
#[derive(Default)]
pub(super) struct Ends {
    codes: Mutex<HashMap<String, i64>>,
    told: tokio::sync::Notify,
}

impl Ends {
    /// Pod `name`'s announced exit code, taken (a pod's end is waited for once).
    pub(super) fn take(&self, name: &str) -> Option<i64> {
        self.codes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name)
    }

    /// Forgets what an earlier pod of this name said.
    pub(super) fn forget(&self, name: &str) {
        self.take(name);
    }

    /// Resolves at the next announcement (of any pod): enable it before checking [`Ends::take`].
    pub(super) fn told(&self) -> tokio::sync::futures::Notified<'_> {
        self.told.notified()
    }

    fn note(&self, name: &str, code: i64) {
        self.codes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), code);
        self.told.notify_waiters();
    }
}

/// `stdout` of pod `name`'s agent, read on by a task of its own (so the announcement is
/// seen while nobody reads the output: after the CLI's end, the driver only waits), with
/// the announcement taken out and noted in `ends`. An announced 0 is answered with a line
/// on `stdin` (the same attachment's): the wrapper, which stays up to a second for its
/// line to be relayed, then leaves at once, so its container has ended before the driver
/// deletes the pod (a pod force-deleted while its container still ran was still the
/// kubelet's when the session's next pod of the same name came: an attachment to that one
/// went to the old one's and failed, `500 Internal Server Error`).
pub(super) fn watched(
    name: &str,
    stdout: OutputStream,
    ends: std::sync::Arc<Ends>,
    stdin: Shared,
) -> OutputStream {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let name = name.to_string();
    tokio::spawn(async move {
        let mut stdout = stdout;
        // The end of what came before (a line split between two reads).
        let mut tail: Vec<u8> = Vec::new();
        while let Some(chunk) = stdout.next().await {
            let chunk = match chunk {
                Ok(OutputChunk::Stdout(bytes)) => {
                    let (kept, code) = take_ended(&tail, bytes);
                    let from = kept.len().saturating_sub(ENDED.len() + 24);
                    tail = kept[from..].to_vec();
                    if let Some(code) = code {
                        if code == 0 {
                            let ack = async {
                                let mut w = KeepOpen(stdin.clone());
                                w.write_all(b"\n").await?;
                                w.flush().await
                            };
                            let acked = tokio::time::timeout(ACK_WITHIN, ack).await;
                            if !matches!(acked, Ok(Ok(()))) {
                                tracing::debug!("pod '{name}': its end not acknowledged");
                            }
                        }
                        ends.note(&name, code);
                    }
                    if kept.is_empty() {
                        continue;
                    }
                    Ok(OutputChunk::Stdout(kept))
                }
                other => other,
            };
            // (Read on when nobody reads: the announcement still counts.)
            let _ = tx.send(chunk);
        }
    });
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (c, rx))
    }))
}

/// `bytes` without a whole announcement line in it, and its exit code; `tail` is what came
/// just before (an announcement begun there is found, not taken out).
fn take_ended(tail: &[u8], bytes: Vec<u8>) -> (Vec<u8>, Option<i64>) {
    let code_after = |text: &[u8], at: usize| -> Option<(i64, usize)> {
        let rest = &text[at + ENDED.len()..];
        let nl = rest.iter().position(|b| *b == b'\n')?;
        let code = std::str::from_utf8(&rest[..nl]).ok()?.trim().parse().ok()?;
        Some((code, at + ENDED.len() + nl + 1))
    };
    let find = |text: &[u8]| text.windows(ENDED.len()).position(|w| w == ENDED);
    if let Some(at) = find(&bytes) {
        if let Some((code, end)) = code_after(&bytes, at) {
            let mut kept = bytes[..at].to_vec();
            kept.extend_from_slice(&bytes[end..]);
            return (kept, Some(code));
        }
    }
    let mut joined = tail.to_vec();
    joined.extend_from_slice(&bytes);
    let code = find(&joined).and_then(|at| code_after(&joined, at).map(|(c, _)| c));
    (bytes, code)
}

/// How long the acknowledgement of an announced end may take to write.
const ACK_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

/// An attachment's stdin, shared by its writer ([`KeepOpen`]) and its output's watcher
/// (the acknowledgement): each poll locks it for that poll only.
pub(super) type Shared =
    std::sync::Arc<Mutex<std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>>>;

/// An attachment's stdin whose shutdown only flushes: the attach protocol has no half-close
/// (the container's stdin stays open across attachments anyway), and kube ends the whole
/// attachment when its stdin ends, which would lose the end announced after the record
/// hand-off (whose writer shuts stdin down).
pub(super) struct KeepOpen(pub(super) Shared);

impl KeepOpen {
    fn with<T>(
        &self,
        f: impl FnOnce(std::pin::Pin<&mut (dyn tokio::io::AsyncWrite + Send)>) -> T,
    ) -> T {
        let mut w = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(w.as_mut())
    }
}

impl tokio::io::AsyncWrite for KeepOpen {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.with(|w| w.poll_write(cx, buf))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.with(|w| w.poll_flush(cx))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.with(|w| w.poll_flush(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_announcement_is_taken_out_and_read_also_when_split() {
        let (kept, code) = take_ended(b"", b"last line\n\x1ecaw-box-ended 75\n".to_vec());
        assert_eq!((kept.as_slice(), code), (&b"last line\n"[..], Some(75)));
        let (kept, code) = take_ended(b"x\n\x1ecaw-box-en", b"ded 0\n".to_vec());
        assert_eq!((kept.as_slice(), code), (&b"ded 0\n"[..], Some(0)));
        let (_, code) = take_ended(b"", b"\x1ecaw-box-ended 0".to_vec());
        assert_eq!(code, None, "not yet a whole line");
        let (kept, code) = take_ended(b"", b"{\"type\":\"x\"}\n".to_vec());
        assert_eq!((kept.as_slice(), code), (&b"{\"type\":\"x\"}\n"[..], None));
    }
}
