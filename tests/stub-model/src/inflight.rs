//! How many model requests the stub is answering right now, and the most it ever was (`GET
//! /_stub/inflight`): a test that runs several turns at once (a broker spreading them over
//! accounts, a pool of sessions) proves they overlapped, or that they did not.
//!
//! A model request counts from its arrival until its response body is sent, or until it is
//! dropped unsent (its client went away mid-hold or mid-stream): the [`Counted`] guard travels
//! with the handler's future and then with the [`CountedBody`].

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};
use serde_json::{json, Value};

/// The count of one server.
#[derive(Debug, Default)]
pub struct InFlight {
    counts: Mutex<Counts>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    now: usize,
    /// The highest `now` since the start or the last reset.
    max: usize,
}

impl InFlight {
    fn update<T>(&self, change: impl FnOnce(&mut Counts) -> T) -> T {
        change(&mut self.counts.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Counts one more request until the guard is dropped.
    pub fn enter(self: &Arc<Self>) -> Counted {
        let at_arrival = self.update(|c| {
            c.now += 1;
            c.max = c.max.max(c.now);
            c.now
        });
        Counted {
            flight: Arc::clone(self),
            at_arrival,
        }
    }

    /// The requests in flight now.
    pub fn now(&self) -> usize {
        self.update(|c| c.now)
    }

    /// `{"now": N, "max": M}`.
    pub fn status(&self) -> Value {
        let c = self.update(|c| *c);
        json!({"now": c.now, "max": c.max})
    }

    /// Starts a new maximum from the requests in flight now; the status after.
    pub fn reset(&self) -> Value {
        self.update(|c| c.max = c.now);
        self.status()
    }
}

/// One request counted in flight while this lives.
#[derive(Debug)]
pub struct Counted {
    flight: Arc<InFlight>,
    /// The requests in flight when it arrived, itself included.
    pub at_arrival: usize,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.flight.update(|c| c.now = c.now.saturating_sub(1));
    }
}

/// A response body that keeps its request counted until the body is sent (hyper drops a body
/// once its last frame is written, or when the connection ends first).
#[derive(Debug)]
pub struct CountedBody {
    inner: Full<Bytes>,
    counted: Option<Counted>,
}

impl CountedBody {
    pub fn new(inner: Full<Bytes>, counted: Option<Counted>) -> Self {
        CountedBody { inner, counted }
    }
}

impl Body for CountedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) {
            self.counted = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[test]
    fn counts_while_guards_live_and_keeps_the_highest() {
        let flight = Arc::new(InFlight::default());
        let a = flight.enter();
        let b = flight.enter();
        assert_eq!((a.at_arrival, b.at_arrival), (1, 2));
        drop(a);
        let c = flight.enter();
        assert_eq!(c.at_arrival, 2);
        assert_eq!(flight.status(), json!({"now": 2, "max": 2}));
        drop((b, c));
        assert_eq!(flight.status(), json!({"now": 0, "max": 2}));
        assert_eq!(flight.reset(), json!({"now": 0, "max": 0}));
    }

    #[tokio::test]
    async fn a_body_keeps_its_request_counted_until_sent_or_dropped() {
        let flight = Arc::new(InFlight::default());
        let body = CountedBody::new(Full::new(Bytes::from("data: x\n\n")), Some(flight.enter()));
        assert_eq!(flight.now(), 1);
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(sent, "data: x\n\n");
        assert_eq!(flight.now(), 0);
        let unsent = CountedBody::new(Full::new(Bytes::new()), Some(flight.enter()));
        assert_eq!(flight.now(), 1);
        drop(unsent);
        assert_eq!(flight.status(), json!({"now": 0, "max": 1}));
    }
}
