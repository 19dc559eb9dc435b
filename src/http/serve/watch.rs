//! What watches each connection and request of the listener (`serve`): a connection's task
//! ([`Served`]: idle, cut and stop), the count of its requests in flight ([`Activity`]), a
//! request in flight until its response body is dropped ([`InFlight`], [`InFlightBody`]), and
//! a request body's deadline ([`Deadline`], [`BodyTimeout`]).

use super::*;

/// A connection's requests in flight, counted from the head's arrival to the end (or drop) of
/// the response body, with every start and end noted, so that idleness can be seen. One word:
/// the low half counts requests in flight, the high half (wrapping) counts starts and ends, so
/// each is one atomic step.
#[derive(Default)]
pub(super) struct Activity(pub(super) AtomicU64);

/// A request starts: one more in flight, one more change.
const START: u64 = (1 << 32) + 1;
/// A request ends: one more change, one fewer in flight (adding all ones to the low half takes
/// one from it and carries one into the high half).
const END: u64 = (1 << 32) - 1;

pin_project! {
    /// One connection's task: the connection served until it ends, has had no request in
    /// flight and none start or end for its idle timeout (closed at most twice that after it
    /// went quiet), or is cut; asked to finish when the listener stops. A future of its own,
    /// not an `async` block around `select!`: such a block keeps the connection twice in its
    /// state (the moved-in value and the `select!`'s copy).
    pub(super) struct Served<C> {
        #[pin]
        connection: C,
        context: Arc<ConnectionContext>,
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        // The activity word when the idle timer was last set.
        seen: u64,
        #[pin]
        cut: WaitForCancellationFutureOwned,
        #[pin]
        stop: WaitForCancellationFutureOwned,
        // The listener stops: the connection was asked to finish.
        stopping: bool,
        // The connection's slot under `max_connections`, and its address's share.
        _slot: (OwnedSemaphorePermit, Option<Held>),
    }
}

impl<C> Served<C> {
    pub(super) fn new(
        connection: C,
        context: Arc<ConnectionContext>,
        idle_timeout: Duration,
        slot: (OwnedSemaphorePermit, Option<Held>),
        stop: WaitForCancellationFutureOwned,
    ) -> Served<C> {
        Served {
            connection,
            stop,
            stopping: false,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            seen: context.activity.0.load(Ordering::Acquire),
            cut: context.cut.fired_owned(),
            context,
            _slot: slot,
        }
    }
}

impl<C: Finish> Future for Served<C> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if !*this.stopping && this.stop.poll(cx).is_ready() {
            *this.stopping = true;
            this.connection.as_mut().finish();
        }
        if let Poll::Ready(served) = this.connection.poll(cx) {
            if let Err(e) = served {
                tracing::debug!("connection: {e}");
            }
            return Poll::Ready(());
        }
        while this.idle.as_mut().poll(cx).is_ready() {
            let now = this.context.activity.0.load(Ordering::Acquire);
            if now == *this.seen && now as u32 == 0 {
                tracing::debug!(
                    "closing a connection with no request for {} s",
                    this.idle_timeout.as_secs()
                );
                return Poll::Ready(());
            }
            *this.seen = now;
            let next = Instant::now() + *this.idle_timeout;
            this.idle.as_mut().reset(next);
        }
        if this.cut.poll(cx).is_ready() {
            tracing::debug!("closing a connection whose client does not read");
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// One request in flight on its connection, until dropped.
pub(super) struct Open(Arc<ConnectionContext>);

impl Open {
    pub(super) fn new(context: Arc<ConnectionContext>) -> Open {
        context.activity.0.fetch_add(START, Ordering::AcqRel);
        Open(context)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.activity.0.fetch_add(END, Ordering::AcqRel);
    }
}

pin_project! {
    /// The router's future; its response's body carries the request's [`Open`] on.
    pub(super) struct InFlight<F> {
        #[pin]
        pub(super) inner: F,
        pub(super) open: Option<Open>,
    }
}

impl<F: Future<Output = Result<Response, Infallible>>> Future for InFlight<F> {
    type Output = Result<Response<InFlightBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let open = this.open.take();
        Poll::Ready(Ok(response.map(|body| InFlightBody { body, _open: open })))
    }
}

/// A response body, its request in flight until it is dropped.
pub struct InFlightBody {
    body: Body,
    _open: Option<Open>,
}

impl hyper::body::Body for InFlightBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs())]
pub struct BodyTimeout(pub Duration);

impl BodyTimeout {
    /// The timeout among an error's causes, if that is what it was.
    pub fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
        let mut cause = Some(e);
        while let Some(c) = cause {
            if let Some(t) = c.downcast_ref::<BodyTimeout>() {
                return Some(t);
            }
            cause = c.source();
        }
        None
    }
}

pin_project! {
    /// A request body that must end by a deadline. The timer starts only when a read has to
    /// wait: a body that came with its head costs none.
    pub struct Deadline<B> {
        #[pin]
        body: B,
        timeout: Duration,
        at: Instant,
        #[pin]
        timer: Option<Sleep>,
    }
}

impl<B> Deadline<B> {
    pub(super) fn new(body: B, timeout: Duration) -> Deadline<B> {
        Deadline {
            body,
            timeout,
            at: Instant::now() + timeout,
            timer: None,
        }
    }
}

impl<B> hyper::body::Body for Deadline<B>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let mut this = self.project();
        if let Poll::Ready(frame) = this.body.poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.timer.is_none() {
            this.timer.set(Some(tokio::time::sleep_until(*this.at)));
        }
        match this.timer.as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Some(Err(BodyTimeout(*this.timeout).into()))),
            _ => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn activity_counts_requests_in_flight_and_changes_in_one_word() {
        let a = Activity::default();
        a.0.fetch_add(START, Ordering::AcqRel);
        a.0.fetch_add(START, Ordering::AcqRel);
        a.0.fetch_add(END, Ordering::AcqRel);
        let now = a.0.load(Ordering::Acquire);
        assert_eq!((now as u32, now >> 32), (1, 3));
        a.0.fetch_add(END, Ordering::AcqRel);
        let now = a.0.load(Ordering::Acquire);
        assert_eq!((now as u32, now >> 32), (0, 4));
        // The change count wraps without touching the count in flight.
        let wrapped = AtomicU64::new(u64::MAX << 32);
        wrapped.fetch_add(START, Ordering::AcqRel);
        assert_eq!(wrapped.load(Ordering::Acquire), 1);
    }
}
