//! A connection whose writes may not stall: a client that stops reading its answers (while it pipelines more
//! requests, say) would otherwise hold its connection, and one of the server's connection slots, for ever. hyper
//! bounds the time to read a request head; this bounds the time a write waits for the client to make room.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `T` whose writes fail with `TimedOut` once one has waited `limit` without progress.
#[derive(Debug)]
pub struct Stall<T> {
    inner: T,
    limit: Duration,
    /// Armed when a write first returns Pending, disarmed by any write that completes.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<T> Stall<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        Stall {
            inner,
            limit,
            waiting: None,
        }
    }

    /// A write is pending: fail it if it has waited too long, else keep waiting (the timer wakes this task too).
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let limit = self.limit;
        let timer = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not read its answer in time",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn done<R>(&mut self, r: io::Result<R>) -> Poll<io::Result<R>> {
        self.waiting = None;
        Poll::Ready(r)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Stall<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Stall<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(r) => this.done(r),
            Poll::Pending => this.pending(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => this.done(r),
            Poll::Pending => this.pending(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(r) => this.done(r),
            Poll::Pending => this.pending(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Ready(r) => this.done(r),
            Poll::Pending => this.pending(cx),
        }
    }
}
