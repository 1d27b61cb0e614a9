//! An attachment's (or exec's) output pipes that end when its connection does. Not the
//! reading itself (`exec.rs`'s `chunks`, `read_to_end`), nor when an attachment is let go.
//!
//! kube 5 hands out an attachment's stdout and stderr as halves of in-memory pipes its
//! message loop writes to, and ends them (EOF) only when that loop leaves cleanly. When the
//! connection ends in an error it returns without ending them, and a reader waits forever.
//! The lab's 1.24 API server ends it so when the container ends: the TUI whose CLI quit, a
//! turn whose pod was evicted or deleted. So each pipe is read through [`UntilEnded`],
//! which, once the loop has ended, gives what is still buffered and then EOF: nothing more
//! can come. The loop's end is its status future's (`take_status`: resolved by the status,
//! just before the loop leaves, or by the loop's end), told by [`Ended::finish`]; not
//! `join`'s, which first ends stdin, and with it an attachment that has none of ours.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, ReadBuf};

/// That an attachment's message loop has ended, and who waits to hear it.
#[derive(Debug, Default)]
pub(super) struct Ended {
    done: AtomicBool,
    waiting: Mutex<Vec<Waker>>,
}

impl Ended {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The loop has ended (`join` returned): its pipes get no more bytes.
    pub(super) fn finish(&self) {
        self.done.store(true, Ordering::Release);
        let waiting = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        for w in waiting {
            w.wake();
        }
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    fn wait(&self, waker: &Waker) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if !waiting.iter().any(|w| w.will_wake(waker)) {
            waiting.push(waker.clone());
        }
    }
}

/// A pipe of an attachment read to its end, or to the end of the attachment's loop.
#[derive(Debug)]
pub(super) struct UntilEnded<R> {
    inner: R,
    ended: Arc<Ended>,
}

impl<R> UntilEnded<R> {
    pub(super) fn new(inner: R, ended: &Arc<Ended>) -> Self {
        Self {
            inner,
            ended: ended.clone(),
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for UntilEnded<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Read before the pipe is polled: ended then, an empty pipe stays empty.
        let ended = self.ended.is_done();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending if ended => Poll::Ready(Ok(())),
            Poll::Pending => {
                self.ended.wait(cx.waker());
                if self.ended.is_done() {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_pipe_left_open_ends_once_its_loop_ended_after_what_it_still_held() {
        let (reader, mut writer) = tokio::io::simplex(64);
        let ended = Ended::new();
        let mut pipe = UntilEnded::new(reader, &ended);
        writer.write_all(b"last words").await.unwrap();
        // The loop ends in an error: its writer is dropped, not shut down.
        let waiting = tokio::spawn(async move {
            let mut all = Vec::new();
            pipe.read_to_end(&mut all).await.map(|_| all)
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "no end before the loop's");
        drop(writer);
        ended.finish();
        let all = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the pipe ended")
            .unwrap()
            .unwrap();
        assert_eq!(all, b"last words");
    }

    #[tokio::test]
    async fn a_pipe_its_loop_shut_ends_as_before() {
        let (reader, mut writer) = tokio::io::simplex(64);
        let ended = Ended::new();
        let mut pipe = UntilEnded::new(reader, &ended);
        writer.write_all(b"all").await.unwrap();
        writer.shutdown().await.unwrap();
        let mut all = Vec::new();
        pipe.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"all");
    }
}
