//! A client-side bound on how long a call waits for the server: the blocking
//! `postgres::Client` has none, and a connection that goes silent (a network partition, a
//! proxy that acknowledges packets but forwards nothing) would block a call until the
//! kernel gives up on the socket, which with TCP keepalives answered takes forever.
//!
//! [`Watched`] is the connector the pool connects with: a pass-through "TLS" (no
//! encryption; the server sees a plain session) whose stream wraps the socket. While a call
//! is [armed](Silence::arm), a read or write that stays pending longer than the limit
//! since the connection last made progress fails with [`io::ErrorKind::TimedOut`]: the
//! connection is then broken, the call returns an I/O error (classified
//! [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable)) and the pool drops the
//! connection. The limit is on silence, not on the call: a call of several statements
//! that each answer in time never trips it. The timer is tokio's, on the runtime the
//! `postgres` crate drives each connection with.
//!
//! To get the stream at all, the connection is made with `sslmode=require` and
//! `sslnegotiation=direct` (no SSLRequest is sent, the connector is handed the socket and
//! the startup message follows in the clear, as with `sslmode=disable`): see
//! [`Watched::applies_to`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use postgres::Socket;
use postgres::config::{Host, SslMode, SslNegotiation};
use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// What a call armed: the limit on silence, and which call (so that a timer left from an
/// earlier call is not reused).
#[derive(Default)]
struct Armed {
    limit: Option<Duration>,
    call: u64,
}

/// The switch shared by one connection's stream and its pool entry: armed for the
/// duration of each call.
#[derive(Clone, Default)]
pub(super) struct Silence(Arc<Mutex<Armed>>);

impl Silence {
    fn state(&self) -> MutexGuard<'_, Armed> {
        // Two plain fields, consistent at every unlock.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bounds the silence of the connection by `limit` until the guard drops.
    pub(super) fn arm(&self, limit: Duration) -> Disarm {
        let mut state = self.state();
        state.limit = Some(limit);
        state.call = state.call.wrapping_add(1);
        Disarm(self.clone())
    }

    /// The limit and the call, if armed.
    fn armed(&self) -> Option<(Duration, u64)> {
        let state = self.state();
        state.limit.map(|l| (l, state.call))
    }
}

/// Disarms its [`Silence`] when dropped.
pub(super) struct Disarm(Silence);

impl Drop for Disarm {
    fn drop(&mut self) {
        self.0.state().limit = None;
    }
}

/// The connector: hands each new connection's socket to a [`WatchedStream`] watched by
/// its [`Silence`].
#[derive(Clone)]
pub(super) struct Watched(pub(super) Silence);

impl Watched {
    /// Whether connections made with `config` can be watched: every host is a TCP host
    /// named by `host` (the connector is only handed the socket when there is a host name,
    /// and a Unix socket does not partition) and TLS was not asked for (not supported
    /// yet: such a connection fails as it did before, with `NoTls`).
    pub(super) fn applies_to(config: &postgres::Config) -> bool {
        let hosts = config.get_hosts();
        !hosts.is_empty()
            && hosts.iter().all(|h| matches!(h, Host::Tcp(_)))
            && config.get_ssl_mode() != SslMode::Require
    }

    /// Sets `config` up so that the connector gets the socket (see the module's notes).
    pub(super) fn prepare(config: &mut postgres::Config) {
        config
            .ssl_mode(SslMode::Require)
            .ssl_negotiation(SslNegotiation::Direct);
    }
}

impl MakeTlsConnect<Socket> for Watched {
    type Stream = WatchedStream;
    type TlsConnect = Watched;
    type Error = io::Error;

    fn make_tls_connect(&mut self, _domain: &str) -> io::Result<Watched> {
        Ok(self.clone())
    }
}

impl TlsConnect<Socket> for Watched {
    type Stream = WatchedStream;
    type Error = io::Error;
    type Future = std::future::Ready<io::Result<WatchedStream>>;

    fn connect(self, socket: Socket) -> Self::Future {
        std::future::ready(Ok(WatchedStream {
            inner: socket,
            silence: self.0,
            timer: None,
        }))
    }
}

/// The socket, unencrypted, with the [`Silence`] bound on its reads and writes.
pub(super) struct WatchedStream {
    inner: Socket,
    silence: Silence,
    /// The running timer and the call it belongs to; dropped whenever the socket makes
    /// progress.
    timer: Option<(Pin<Box<Sleep>>, u64)>,
}

impl WatchedStream {
    /// Passes on what the socket answered, except that a pending answer while armed
    /// starts (or checks) the timer, and fails once it ran out. Only a read that is
    /// answered (the server spoke) stops the timer: a write or flush that completes is
    /// not an answer, and the connection polls its writes right after a pending read
    /// (stopping the timer there would leave a silent server unwatched).
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        answer: Poll<io::Result<T>>,
        reading: bool,
    ) -> Poll<io::Result<T>> {
        if answer.is_ready() {
            if reading {
                self.timer = None;
            }
            return answer;
        }
        let Some((limit, call)) = self.silence.armed() else {
            self.timer = None;
            return Poll::Pending;
        };
        if self.timer.as_ref().is_none_or(|(_, c)| *c != call) {
            // The connection is polled inside the runtime the postgres crate drives it
            // with; outside one there is no timer to start.
            if tokio::runtime::Handle::try_current().is_err() {
                return Poll::Pending;
            }
            self.timer = Some((Box::pin(tokio::time::sleep(limit)), call));
        }
        let Some((timer, _)) = self.timer.as_mut() else {
            return Poll::Pending;
        };
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.timer = None;
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the server sent nothing for {} ms while an answer was awaited \
                         (the client's deadline)",
                        limit.as_millis()
                    ),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WatchedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let answer = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.watch(cx, answer, true)
    }
}

impl AsyncWrite for WatchedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let answer = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, answer, false)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let answer = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, answer, false)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let answer = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, answer, false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl TlsStream for WatchedStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
