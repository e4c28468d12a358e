//! The agent client of `opjournal demo`: it talks to the editor over a real socket and puts
//! every answer in words a user understands, telling a new execution from a replay.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opjournal::service::{Edit, Reply, Request, ResultMsg, StatusMsg};

/// The backoff of docs/protocol.md's retry rule: a delay drawn uniformly from `[0, cap]`
/// ("full jitter"); the cap starts at 10 ms, doubles after each `scope_busy` up to 1 s, and
/// halves after each applied operation (it is kept across operations, so a client that
/// contends for a busy document keeps its distance).
pub(crate) struct Backoff {
    cap: Duration,
    state: u64,
}

impl Backoff {
    pub(crate) const FIRST: Duration = Duration::from_millis(10);
    pub(crate) const MAX: Duration = Duration::from_secs(1);

    pub(crate) fn new(salt: &str) -> Backoff {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut state = nanos | 1;
        for b in salt.bytes() {
            state = (state ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Backoff {
            cap: Self::FIRST,
            state: state | 1,
        }
    }

    /// After an applied operation: the cap halves (down to the first one).
    pub(crate) fn succeeded(&mut self) {
        self.cap = (self.cap / 2).max(Self::FIRST);
    }

    /// The next delay; the cap doubles after each.
    pub(crate) fn next_delay(&mut self) -> Duration {
        // xorshift64*
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let r = self.state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let cap_us = self.cap.as_micros() as u64;
        let delay = Duration::from_micros(r % (cap_us + 1));
        self.cap = (self.cap * 2).min(Self::MAX);
        delay
    }
}

/// Why the client could not talk to the service.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ClientError {
    /// A socket operation failed.
    #[error("could not {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The service closed the connection.
    #[error("the service closed the connection")]
    Closed,
    /// The service did not answer in time.
    #[error("no answer from the service within {0:?}")]
    Timeout(Duration),
    /// The service sent something that is not a reply.
    #[error("the service sent something that is not a reply: {0}")]
    Protocol(String),
    /// A request was made while disconnected.
    #[error("not connected to the service")]
    NotConnected,
}

struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

/// One client session over successive connections.
pub(crate) struct Client {
    addr: SocketAddr,
    session: String,
    timeout: Duration,
    conn: Option<Conn>,
    /// The document revision last seen: the base of the next edit.
    pub revision: u64,
    /// Ids whose result was already shown: a repeat is recognized as a duplicate.
    shown: HashSet<String>,
}

impl Client {
    pub(crate) fn new(addr: SocketAddr, session: &str, timeout: Duration) -> Client {
        Client {
            addr,
            session: session.to_string(),
            timeout,
            conn: None,
            revision: 0,
            shown: HashSet::new(),
        }
    }

    /// Connects and says hello; returns the `welcome` (the pushed results follow it).
    pub(crate) fn connect(&mut self) -> Result<Reply, ClientError> {
        self.close();
        let io = |what: &str, source| ClientError::Io {
            what: what.to_string(),
            source,
        };
        let stream = TcpStream::connect_timeout(&self.addr, self.timeout)
            .map_err(|e| io("connect to the service", e))?;
        stream
            .set_read_timeout(Some(self.timeout))
            .map_err(|e| io("set the socket's read timeout", e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| io("set the socket's no-delay option", e))?;
        let reader = BufReader::new(stream.try_clone().map_err(|e| io("clone the socket", e))?);
        self.conn = Some(Conn { stream, reader });
        self.send(&Request::Hello {
            session: self.session.clone(),
        })?;
        let welcome = self.recv()?;
        match welcome {
            Reply::Welcome { .. } => Ok(welcome),
            other => Err(ClientError::Protocol(format!(
                "expected a welcome, got {other:?}"
            ))),
        }
    }

    /// Submits `edit` as operation `id`, based on the last revision seen.
    pub(crate) fn submit(&mut self, id: &str, edit: &Edit) -> Result<(), ClientError> {
        self.send(&submit_request(id, self.revision, edit))
    }

    pub(crate) fn send(&mut self, request: &Request) -> Result<(), ClientError> {
        let mut line = serde_json::to_vec(request)
            .map_err(|e| ClientError::Protocol(format!("could not encode a request: {e}")))?;
        line.push(b'\n');
        self.write(&line)
    }

    /// Sends the first half of a request line, then closes the connection: the request
    /// is torn, and the service never sees a whole line.
    pub(crate) fn send_torn(&mut self, request: &Request) -> Result<(), ClientError> {
        let line = serde_json::to_vec(request)
            .map_err(|e| ClientError::Protocol(format!("could not encode a request: {e}")))?;
        self.write(&line[..line.len() / 2])?;
        self.close();
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        let conn = self.conn.as_mut().ok_or(ClientError::NotConnected)?;
        conn.stream
            .write_all(bytes)
            .and_then(|()| conn.stream.flush())
            .map_err(|source| ClientError::Io {
                what: "send a request".into(),
                source,
            })
    }

    /// The next message from the service.
    pub(crate) fn recv(&mut self) -> Result<Reply, ClientError> {
        let conn = self.conn.as_mut().ok_or(ClientError::NotConnected)?;
        let mut line = String::new();
        match conn.reader.read_line(&mut line) {
            Ok(0) => {
                self.conn = None;
                return Err(ClientError::Closed);
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ClientError::Timeout(self.timeout));
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                self.conn = None;
                return Err(ClientError::Closed);
            }
            Err(source) => {
                return Err(ClientError::Io {
                    what: "read from the service".into(),
                    source,
                });
            }
        }
        let reply: Reply = serde_json::from_str(line.trim_end())
            .map_err(|e| ClientError::Protocol(format!("{e}: {}", line.trim_end())))?;
        match &reply {
            Reply::Welcome { revision, .. } => self.revision = self.revision.max(*revision),
            Reply::Result(r) => self.revision = self.revision.max(r.revision.unwrap_or(0)),
            Reply::Expired {
                current_revision, ..
            } => self.revision = self.revision.max(*current_revision),
            _ => {}
        }
        Ok(reply)
    }

    /// Closes the socket at once (the service is not told why).
    pub(crate) fn close(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
    }

    /// The reply in words; remembers which results were shown, to recognize repeats.
    pub(crate) fn words(&mut self, reply: &Reply) -> String {
        match reply {
            Reply::Welcome {
                session,
                scope,
                revision,
                pushing,
            } => {
                let waiting = match pushing {
                    0 => "nothing waiting".to_string(),
                    1 => "1 unacknowledged result follows".to_string(),
                    n => format!("{n} unacknowledged results follow"),
                };
                format!("connected as {session}: {scope} is at revision {revision}; {waiting}")
            }
            Reply::Accepted { id, attempt } => {
                let attempt = if *attempt > 1 {
                    format!(" (attempt {attempt})")
                } else {
                    String::new()
                };
                format!("{id} accepted{attempt}: recorded as running, its result will follow")
            }
            Reply::Result(r) => self.result_words(r),
            Reply::Running { id, since } => format!(
                "{id} is already running (accepted at {since}): attached to it, not applied again; its result will follow"
            ),
            Reply::Expired {
                id,
                applied,
                revision,
                completed_at,
                current_revision,
                repaired_at,
                ..
            } => {
                let how = match (applied, revision) {
                    (true, Some(rev)) => format!("finished at revision {rev}"),
                    (true, None) => "was applied".to_string(),
                    (false, _) => "failed".to_string(),
                };
                let when = completed_at.map_or_else(String::new, |t| format!(" on {t}"));
                let gone = match repaired_at {
                    Some(t) => format!("its result was lost to damage (repair on {t})"),
                    None => "its result is no longer kept".to_string(),
                };
                format!(
                    "{id} {how}{when}, but {gone}: it was not run again; refresh the document (now at revision {current_revision}) rather than retry"
                )
            }
            Reply::InDoubt { id, .. } => format!(
                "{id} may or may not have been applied: the service stopped while running it and must check the document first; ask again shortly"
            ),
            Reply::Rejected { id, reason } => {
                format!("{id} was rejected before any change: {reason}; nothing changed")
            }
            Reply::Released {
                id,
                reason,
                retry: true,
            } => format!(
                "{id} was not applied: {reason}; the id is free again, retry it after a backoff"
            ),
            Reply::Released {
                id,
                reason,
                retry: false,
            } => format!("{id} was not applied: {reason}; retrying the same edit will not help"),
            Reply::Acked { id, late: false } => format!("{id} acknowledged"),
            Reply::Acked { id, late: true } => {
                format!("{id} acknowledged late (after its acknowledgement had expired); recorded")
            }
            Reply::Status(s) => status_words(s),
            Reply::Error {
                id: Some(id), kind, ..
            } if kind == "intent_mismatch" => format!(
                "{id} already names a different operation: refused, nothing applied; the client must use a new id for new work"
            ),
            Reply::Error { id, kind, message } => {
                let about = id.as_deref().map_or_else(String::new, |i| format!("{i}: "));
                format!("{about}refused ({kind}): {message}")
            }
            other => format!("a message this client does not know, ignored: {other:?}"),
        }
    }

    fn result_words(&mut self, r: &ResultMsg) -> String {
        let repeat = !self.shown.insert(r.id.clone());
        let id = &r.id;
        let (delivery, summary) = (r.delivery, &r.summary);
        let what = match (r.outcome.as_str(), r.revision) {
            ("applied", Some(rev)) => format!("at revision {rev}"),
            _ => String::new(),
        };
        let mut out = match (r.replayed, r.outcome.as_str()) {
            (false, "applied") => {
                format!("{id} applied {what} (new execution, delivery {delivery}): {summary}")
            }
            (false, _) => format!("{id} failed (new execution, delivery {delivery}): {summary}"),
            (true, "applied") => {
                format!("{id} already completed {what} (replayed, delivery {delivery}): {summary}")
            }
            (true, _) => format!("{id} already failed (replayed, delivery {delivery}): {summary}"),
        };
        if repeat {
            out.push_str(" - a duplicate of a result already shown, recognized by its id: ignored");
        }
        out
    }
}

/// A `submit` request.
pub(crate) fn submit_request(id: &str, base_revision: u64, edit: &Edit) -> Request {
    Request::Submit {
        id: id.to_string(),
        base_revision,
        edit: edit.clone(),
    }
}

fn times(n: u32) -> String {
    match n {
        1 => "once".into(),
        2 => "twice".into(),
        n => format!("{n} times"),
    }
}

fn status_words(s: &StatusMsg) -> String {
    let id = &s.id;
    let history = history_words(&s.history);
    let until = s
        .ack_deadline
        .map_or_else(String::new, |t| format!(" until {t}"));
    let delivered = times(s.deliveries);
    let delivery = match s.delivery.as_deref() {
        Some("pending") => "not delivered yet".to_string(),
        Some("delivered") => {
            format!("delivered {delivered}, waiting for its acknowledgement{until}")
        }
        Some("acknowledged") => format!("delivered {delivered} and acknowledged"),
        Some("exhausted") => format!(
            "delivered {delivered}: its retry budget is spent, so it is no longer pushed, but it can still be fetched and acknowledged{until}"
        ),
        Some("ack_expired") => format!(
            "delivered {delivered}, never acknowledged: the acknowledgement expired, so it is no longer pushed and holds no window slot"
        ),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let done = |verb: &str| match s.revision {
        Some(rev) => format!("{id} {verb} at revision {rev}"),
        None => format!("{id} {verb}"),
    };
    let head = match s.state.as_str() {
        "unknown" => {
            return format!(
                "{id} is unknown to the service: it never accepted it, so a retry starts new work"
            );
        }
        "running" => format!("{id} is running"),
        "in_doubt" => format!("{id} is in doubt: the service must check the document"),
        "applied" => format!("{}; {delivery}", done("applied")),
        "failed" => format!("{}; {delivery}", done("failed")),
        "retired" => format!(
            "{}; its result {}, the audit record is kept",
            done("finished"),
            if s.history.iter().any(|h| h == "result_lost") {
                "was lost to damage (a repair found it)"
            } else {
                "aged out"
            }
        ),
        other => format!("{id} is {other}"),
    };
    format!("{head}; history: {history}")
}

/// `submitted, delivered, delivered` → `submitted → delivered ×2`.
fn history_words(history: &[String]) -> String {
    let mut parts: Vec<(String, usize)> = Vec::new();
    for h in history {
        let word = match h.as_str() {
            "in_doubt:reopened" => "in doubt (service restarted)",
            "in_doubt:lease_expired" => "in doubt (lease expired)",
            "ack_expired" => "ack expired",
            other => other,
        };
        match parts.last_mut() {
            Some((last, n)) if last == word => *n += 1,
            _ => parts.push((word.to_string(), 1)),
        }
    }
    let words: Vec<String> = parts
        .into_iter()
        .map(|(w, n)| if n > 1 { format!("{w} x{n}") } else { w })
        .collect();
    words.join(" -> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_delays_stay_under_a_cap_that_doubles_to_a_second_and_halves_after_success() {
        let mut b = Backoff::new("op_1");
        let mut cap = Backoff::FIRST;
        for _ in 0..12 {
            let d = b.next_delay();
            assert!(d <= cap, "{d:?} above the cap {cap:?}");
            cap = (cap * 2).min(Backoff::MAX);
        }
        assert_eq!(b.cap, Backoff::MAX);
        b.succeeded();
        assert_eq!(b.cap, Backoff::MAX / 2);
        for _ in 0..20 {
            b.succeeded();
        }
        assert_eq!(b.cap, Backoff::FIRST);
        // Full jitter: the delays are spread over the whole cap, not all at its end.
        let mut b = Backoff::new("op_2");
        b.cap = Backoff::MAX;
        let delays: Vec<Duration> = (0..64)
            .map(|_| {
                b.cap = Backoff::MAX;
                b.next_delay()
            })
            .collect();
        assert!(delays.iter().any(|d| *d < Backoff::MAX / 4), "{delays:?}");
        assert!(
            delays.iter().any(|d| *d > Backoff::MAX * 3 / 4),
            "{delays:?}"
        );
    }
}
