//! The connections `caw-box mcp --http` takes: what `axum::serve` accepts from. At most a
//! cap of them are open at once, and one that stalls is closed: a request's head must arrive
//! whole within [`Timeouts::head`] of the connection opening (or of its first byte after an
//! idle spell), and a connection with no request in progress is closed after
//! [`Timeouts::idle`]. A request in progress is never timed out here: a `wait` rightly holds
//! its connection for as long as an hour, and its body has a timeout of its own (http.rs).
//!
//! hyper has a header-read timeout, but `axum::serve` sets no timer for it and no idle one
//! exists for HTTP/1; so the deadlines live in the connection's reads, and the requests
//! (through [`ConnTrack`], axum's connect info) say when one is in progress.
//!
//! Not here: HTTP itself (hyper, through axum), authentication, the MCP service.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How long a connection may take over a request's head, and stay idle between requests.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub head: Duration,
    pub idle: Duration,
}

/// The most connections served at once: half this process's open-file limit (the other half
/// is for what the calls open: Docker API sockets, files, the drivers' pipes), at most 1024.
/// Above the 300 stalled connections plus a client's pool of 100 that the server is made to
/// take (tests/e2e/mcp_http.rs): at the cap, further connections wait in the kernel's
/// backlog rather than being refused, and a stalled one frees its slot within
/// [`Timeouts::head`].
pub fn connection_cap() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    usize::try_from(soft / 2)
        .unwrap_or(usize::MAX)
        .clamp(64, 1024)
}

/// Raises the soft open-file limit to the hard one, as Go's runtime does for every program:
/// the soft default (1024 on many systems) is far below what a server may rightly hold.
pub fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!("the open-file limit stays as it was: {e}");
        }
    }
}

/// A TCP listener with a cap on open connections; each connection keeps its slot until it
/// is dropped.
#[derive(Debug)]
pub struct Capped {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    timeouts: Timeouts,
}

impl Capped {
    pub fn new(inner: TcpListener, cap: usize, timeouts: Timeouts) -> Self {
        Capped {
            inner,
            slots: Arc::new(Semaphore::new(cap)),
            timeouts,
        }
    }
}

impl Listener for Capped {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        // A free slot first: at the cap, new connections wait in the kernel's backlog.
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .expect("the slots are never closed");
        // axum's accept: after an error such as EMFILE it sleeps a second, not spinning.
        let (stream, addr) = Listener::accept(&mut self.inner).await;
        (Conn::new(stream, slot, self.timeouts), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// What the connection and its requests share: whether a request is in progress.
#[derive(Debug, Default)]
struct Shared {
    in_progress: AtomicUsize,
    /// How many requests ended: a request that began and ended between two reads still
    /// starts a new idle spell.
    ended: AtomicU64,
    /// The connection's reader, parked while a request was in progress: woken at its end to
    /// start the idle deadline.
    reader: AtomicWaker,
}

/// Where the connection's deadline stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request's head to arrive whole.
    Head,
    /// No request in progress and none begun.
    Idle,
    /// A request in progress: no deadline.
    Busy,
}

/// One accepted connection: the socket, its slot under the cap and its deadline.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    shared: Arc<Shared>,
    timeouts: Timeouts,
    phase: Phase,
    ended_seen: u64,
    deadline: Pin<Box<Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl Conn {
    fn new(stream: TcpStream, slot: OwnedSemaphorePermit, timeouts: Timeouts) -> Self {
        Conn {
            stream,
            shared: Arc::default(),
            timeouts,
            phase: Phase::Head,
            ended_seen: 0,
            deadline: Box::pin(tokio::time::sleep(timeouts.head)),
            _slot: slot,
        }
    }

    /// Follows the requests: busy while one is in progress, idle from its end.
    fn follow_requests(&mut self) {
        let ended = self.shared.ended.load(Ordering::Acquire);
        if self.shared.in_progress.load(Ordering::Acquire) > 0 {
            self.phase = Phase::Busy;
        } else if self.phase == Phase::Busy || ended != self.ended_seen {
            self.phase = Phase::Idle;
            self.deadline
                .as_mut()
                .reset(Instant::now() + self.timeouts.idle);
        }
        self.ended_seen = ended;
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.follow_requests();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                // The first bytes after an idle spell: the head they begin has its own time.
                if this.phase == Phase::Idle && buf.filled().len() > before {
                    this.phase = Phase::Head;
                    let head_by = Instant::now() + this.timeouts.head;
                    if head_by < this.deadline.deadline() {
                        this.deadline.as_mut().reset(head_by);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.phase == Phase::Busy => {
                this.shared.reader.register(cx.waker());
                // Ended meanwhile: follow it now, or nothing would wake this read again.
                if this.shared.in_progress.load(Ordering::Acquire) == 0 {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    match this.phase {
                        Phase::Idle => "the connection was idle too long",
                        _ => "the request's head took too long",
                    },
                ))),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A connection as its requests see it (axum's connect info): [`ConnTrack::begin`] marks one
/// in progress.
#[derive(Debug, Clone)]
pub struct ConnTrack(Arc<Shared>);

impl Connected<IncomingStream<'_, Capped>> for ConnTrack {
    fn connect_info(stream: IncomingStream<'_, Capped>) -> Self {
        ConnTrack(Arc::clone(&stream.io().shared))
    }
}

impl ConnTrack {
    /// A request in progress on this connection until the guard is dropped (with the
    /// response's body, once it was sent).
    pub fn begin(&self) -> InProgress {
        self.0.in_progress.fetch_add(1, Ordering::AcqRel);
        InProgress(Arc::clone(&self.0))
    }
}

/// See [`ConnTrack::begin`].
#[derive(Debug)]
pub struct InProgress(Arc<Shared>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::AcqRel);
        self.0.in_progress.fetch_sub(1, Ordering::AcqRel);
        self.0.reader.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::IntoFuture;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const SHORT: Timeouts = Timeouts {
        head: Duration::from_millis(300),
        idle: Duration::from_millis(600),
    };

    /// A server on loopback whose one route answers after `hold`, each request marked in
    /// progress as http.rs marks them; its address.
    async fn server(cap: usize, hold: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route(
                "/",
                axum::routing::get(move || async move {
                    tokio::time::sleep(hold).await;
                    "done"
                }),
            )
            .layer(axum::middleware::from_fn(
                |axum::extract::ConnectInfo(conn): axum::extract::ConnectInfo<ConnTrack>,
                 req: axum::extract::Request,
                 next: axum::middleware::Next| async move {
                    let _busy = conn.begin();
                    next.run(req).await
                },
            ));
        let serve = axum::serve(
            Capped::new(listener, cap, SHORT),
            app.into_make_service_with_connect_info::<ConnTrack>(),
        );
        tokio::spawn(serve.into_future());
        addr
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";

    /// Reads until the server closes the connection; what it sent.
    async fn until_closed(c: &mut TcpStream) -> String {
        let mut all = Vec::new();
        let _ = c.read_to_end(&mut all).await;
        String::from_utf8_lossy(&all).into_owned()
    }

    #[tokio::test]
    async fn a_stalled_head_is_closed_at_its_deadline() {
        let addr = server(8, Duration::ZERO).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nhost").await.unwrap();
        let started = Instant::now();
        let sent = until_closed(&mut c).await;
        let took = started.elapsed();
        assert!(!sent.contains("done"), "{sent}");
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(3),
            "{took:?}"
        );
    }

    #[tokio::test]
    async fn a_request_in_progress_outlives_the_deadlines_and_idle_then_closes() {
        // The handler takes three times the idle timeout: the request is not cut.
        let addr = server(8, SHORT.idle * 3).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(GET).await.unwrap();
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("done") {
            let mut buf = [0u8; 512];
            let n = c.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed mid-request: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        // Then kept alive, idle, until the idle timeout closes it.
        let answered = Instant::now();
        assert_eq!(until_closed(&mut c).await, "");
        let idle = answered.elapsed();
        assert!(
            idle >= Duration::from_millis(500) && idle < Duration::from_secs(3),
            "{idle:?}"
        );
    }

    #[tokio::test]
    async fn at_the_cap_a_new_connection_waits_for_a_slot() {
        let addr = server(1, Duration::ZERO).await;
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled.write_all(b"GET").await.unwrap();
        // Connected (the kernel's backlog), served once the stalled one's head deadline
        // freed the only slot.
        let started = Instant::now();
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(GET).await.unwrap();
        let mut buf = [0u8; 512];
        let n = c.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("done"));
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{:?}",
            started.elapsed()
        );
    }
}
