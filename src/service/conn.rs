//! One client connection: a socket read line by line into a bounded buffer, under an idle
//! deadline, and written one whole reply at a time.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::protocol::Reply;
use super::{MAX_LINE, lock};

/// A client connection. One descriptor: reads and writes share the socket.
pub(crate) struct Conn {
    pub(crate) id: u64,
    stream: TcpStream,
    /// Held while a reply is written, so replies never interleave.
    writing: Mutex<()>,
    /// The session named by the latest `hello` on this connection.
    pub(crate) session: Mutex<Option<String>>,
    /// Replies handed to threads of their own and not yet written ([`Conn::send_detached`]).
    backlog: AtomicUsize,
    /// How long one reply may take to write, from when it is ready: the socket's write
    /// timeout when the connection was admitted. The socket's own timeout bounds each
    /// `write` call, and a client that reads a little now and then would reset it.
    reply_timeout: Option<Duration>,
}

/// The most replies a connection may have waiting for their own threads to write them: a
/// client that far behind has stopped reading, and is dropped rather than given more
/// threads (it hears its results again on its next `hello`).
const MAX_BACKLOG: usize = 4;

impl Conn {
    pub(crate) fn new(id: u64, stream: TcpStream) -> Conn {
        Conn {
            id,
            reply_timeout: stream.write_timeout().ok().flatten(),
            stream,
            writing: Mutex::new(()),
            session: Mutex::new(None),
            backlog: AtomicUsize::new(0),
        }
    }

    /// Sends `reply` on a thread of its own, so that the caller never waits for a client
    /// that stopped reading (a write blocks until the write timeout closes it). With
    /// [`MAX_BACKLOG`] replies already waiting, the connection is closed instead.
    ///
    /// # Errors
    ///
    /// The thread could not be started (the reply is not sent).
    pub(crate) fn send_detached(self: &Arc<Self>, reply: Reply) -> std::io::Result<()> {
        if self.backlog.fetch_add(1, Ordering::SeqCst) >= MAX_BACKLOG {
            self.backlog.fetch_sub(1, Ordering::SeqCst);
            self.close();
            return Ok(());
        }
        let conn = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("opjournal-deliver".into())
            .spawn(move || {
                let _ = conn.send(&reply);
                conn.backlog.fetch_sub(1, Ordering::SeqCst);
            });
        spawned.map(drop).inspect_err(|_| {
            self.backlog.fetch_sub(1, Ordering::SeqCst);
        })
    }

    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Sends one reply as one line. A failed write, or one not done within the reply
    /// timeout of this call (waiting behind earlier replies included), closes the
    /// connection: a client that stops reading is dropped rather than let hold the service.
    pub(crate) fn send(&self, reply: &Reply) -> std::io::Result<()> {
        let deadline = self.reply_timeout.map(|t| Instant::now() + t);
        let mut line = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let _writing = lock(&self.writing);
        let r = self.write_by(&line, deadline);
        if r.is_err() {
            self.close();
        }
        r
    }

    /// `write_all` that gives up at `deadline`, however the writes in between progress.
    fn write_by(&self, mut buf: &[u8], deadline: Option<Instant>) -> std::io::Result<()> {
        while !buf.is_empty() {
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ErrorKind::TimedOut.into());
                }
                self.stream.set_write_timeout(Some(left))?;
            }
            match (&self.stream).write(buf) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => buf = buf.get(n..).unwrap_or_default(),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Closes the socket at once; the reading thread sees the end and cleans up.
    pub(crate) fn close(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// What reading the next request line gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// A whole line (without its newline).
    Request(Vec<u8>),
    /// The client closed the connection between requests.
    End,
    /// The client closed the connection in the middle of a line: a torn request, dropped
    /// unread.
    Torn,
    /// The line is longer than [`MAX_LINE`].
    TooLong,
    /// No whole request within the idle timeout.
    Idle,
    /// The socket failed (reset, or closed by the service).
    Failed,
}

/// Reads request lines into a buffer of at most [`MAX_LINE`] bytes plus one read.
pub(crate) struct LineReader {
    buf: Vec<u8>,
    /// Bytes of `buf` already searched for a newline.
    scanned: usize,
}

const READ_CHUNK: usize = 8 * 1024;

impl LineReader {
    pub(crate) fn new() -> LineReader {
        LineReader {
            buf: Vec::new(),
            scanned: 0,
        }
    }

    /// The next request line. The whole line must arrive within `idle` from now (a client
    /// sending a byte at a time does not keep a connection open forever).
    pub(crate) fn next(&mut self, stream: &TcpStream, idle: Duration) -> Line {
        let deadline = Instant::now() + idle;
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            if let Some(pos) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
                let end = self.scanned + pos;
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                self.scanned = 0;
                if line.len() > MAX_LINE {
                    return Line::TooLong;
                }
                // Keep a small buffer between requests, not the largest one ever seen.
                if self.buf.capacity() > 2 * READ_CHUNK && self.buf.len() <= READ_CHUNK {
                    self.buf.shrink_to(READ_CHUNK);
                }
                return Line::Request(line);
            }
            self.scanned = self.buf.len();
            if self.buf.len() > MAX_LINE {
                return Line::TooLong;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Line::Idle;
            }
            if stream.set_read_timeout(Some(left)).is_err() {
                return Line::Failed;
            }
            match (&*stream).read(&mut chunk) {
                Ok(0) if self.buf.is_empty() => return Line::End,
                Ok(0) => return Line::Torn,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Line::Failed,
            }
        }
    }
}

/// Answers a connection the service will not serve with one `error` line, then closes it.
/// Reads what the client already sent first, so closing does not reset the connection
/// before the client has read the error.
pub(crate) fn refuse(stream: TcpStream, kind: &str, message: String) {
    let drain = |s: &TcpStream| {
        let mut sink = [0u8; 4096];
        if s.set_nonblocking(true).is_ok() {
            for _ in 0..16 {
                match (&*s).read(&mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            let _ = s.set_nonblocking(false);
        }
    };
    drain(&stream);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let reply = Reply::Error {
        id: None,
        kind: kind.into(),
        message,
    };
    if let Ok(mut line) = serde_json::to_vec(&reply) {
        line.push(b'\n');
        let _ = (&stream).write_all(&line);
    }
    let _ = stream.shutdown(Shutdown::Write);
    drain(&stream);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn pair() -> std::io::Result<(TcpStream, TcpStream)> {
        let l = TcpListener::bind(("127.0.0.1", 0))?;
        let client = TcpStream::connect(l.local_addr()?)?;
        let (server, _) = l.accept()?;
        Ok((client, server))
    }

    #[test]
    fn a_client_with_too_many_answers_unwritten_is_closed_instead_of_given_more_threads()
    -> TestResult {
        let (client, server) = pair()?;
        server.set_write_timeout(Some(Duration::from_secs(20)))?;
        let conn = Arc::new(Conn::new(1, server));
        // Each answer is larger than the sockets' buffers: the client never reads, so the
        // first write blocks and the next ones wait behind it.
        let big = || Reply::Error {
            id: None,
            kind: "internal".into(),
            message: "x".repeat(8 << 20),
        };
        for _ in 0..MAX_BACKLOG {
            conn.send_detached(big())?;
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            conn.backlog.load(Ordering::SeqCst),
            MAX_BACKLOG,
            "all waiting"
        );
        // One more: the connection is closed (every waiting write then fails at once).
        let started = Instant::now();
        conn.send_detached(big())?;
        while conn.backlog.load(Ordering::SeqCst) > 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the writes ended"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(client);
        Ok(())
    }

    #[test]
    fn a_reply_read_too_slowly_is_cut_off_at_its_timeout_though_each_write_progresses() -> TestResult
    {
        let (mut client, server) = pair()?;
        server.set_write_timeout(Some(Duration::from_millis(500)))?;
        let conn = Conn::new(1, server);
        // The client reads a little at a time, so no single `write` waits the whole
        // timeout; it gives up after 4 s, far later than the reply's timeout.
        let reader = std::thread::spawn(move || {
            let started = Instant::now();
            let mut chunk = vec![0u8; 64 << 10];
            while started.elapsed() < Duration::from_secs(4) {
                match client.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        let huge = Reply::Error {
            id: None,
            kind: "internal".into(),
            message: "x".repeat(64 << 20),
        };
        let started = Instant::now();
        let sent = conn.send(&huge);
        let took = started.elapsed();
        let _ = reader.join();
        assert!(sent.is_err(), "the reply was not written in full");
        assert!(
            took < Duration::from_secs(2),
            "cut off at the reply's 500 ms timeout, not when the client gave up: {took:?}"
        );
        Ok(())
    }

    #[test]
    fn lines_split_across_reads_and_joined_in_one_read_are_each_returned() -> TestResult {
        let (mut client, server) = pair()?;
        let mut r = LineReader::new();
        client.write_all(b"{\"a\":1}\n{\"b\"")?;
        assert_eq!(
            r.next(&server, Duration::from_secs(5)),
            Line::Request(b"{\"a\":1}".to_vec())
        );
        client.write_all(b":2}\n")?;
        assert_eq!(
            r.next(&server, Duration::from_secs(5)),
            Line::Request(b"{\"b\":2}".to_vec())
        );
        client.write_all(b"half")?;
        client.shutdown(Shutdown::Write)?;
        assert_eq!(r.next(&server, Duration::from_secs(5)), Line::Torn);
        Ok(())
    }

    #[test]
    fn a_line_trickled_slower_than_the_idle_timeout_is_cut_off() -> TestResult {
        let (mut client, server) = pair()?;
        let mut r = LineReader::new();
        let started = Instant::now();
        let writer = std::thread::spawn(move || {
            for _ in 0..10 {
                if client.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(60));
            }
        });
        assert_eq!(r.next(&server, Duration::from_millis(250)), Line::Idle);
        assert!(started.elapsed() < Duration::from_millis(500));
        let _ = writer.join();
        Ok(())
    }

    #[test]
    fn a_line_longer_than_the_limit_is_refused_without_buffering_it_all() -> TestResult {
        let (mut client, server) = pair()?;
        let writer = std::thread::spawn(move || {
            let big = vec![b'x'; 4 * MAX_LINE];
            let _ = client.write_all(&big);
        });
        let mut r = LineReader::new();
        assert_eq!(r.next(&server, Duration::from_secs(5)), Line::TooLong);
        assert!(r.buf.len() <= MAX_LINE + READ_CHUNK + 1);
        drop(server);
        let _ = writer.join();
        Ok(())
    }
}
