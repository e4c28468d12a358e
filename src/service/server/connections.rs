//! Connections: accepting them within the limits, reading requests, closing idle ones.

use super::*;

impl Shared {
    pub(super) fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let mut last_note: Option<Instant> = None;
        loop {
            let accepted = listener.accept();
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, say: wait instead of spinning, note it at most
                    // once a second.
                    if last_note.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        self.note(format!("could not accept a connection: {e}"));
                        last_note = Some(Instant::now());
                    }
                    std::thread::sleep(ACCEPT_BACKOFF);
                    continue;
                }
            };
            // A reply is one small write: without this, Nagle's algorithm holds a reply
            // back until the previous one is acknowledged (a delayed ACK, up to 40 ms).
            let _ = stream.set_nodelay(true);
            let _ = stream.set_write_timeout(Some(self.cfg.write_timeout));
            self.admit(stream);
        }
    }

    pub(super) fn admit(self: &Arc<Self>, stream: TcpStream) {
        let conn = {
            let mut live = lock(&self.live);
            if live.conns.len() >= self.cfg.max_connections {
                live.refused += 1;
                drop(live);
                refuse(
                    stream,
                    "too_many_connections",
                    format!(
                        "the service already serves {} connections, its limit; close an idle connection or retry after a backoff",
                        self.cfg.max_connections
                    ),
                );
                return;
            }
            live.next_conn += 1;
            let conn = Arc::new(Conn::new(live.next_conn, stream));
            live.conns.insert(conn.id, conn.clone());
            live.readers += 1;
            conn
        };
        let shared = self.clone();
        let serving = conn.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("editor-conn-{}", conn.id))
            .stack_size(CONN_STACK)
            .spawn(move || shared.serve(serving));
        if let Err(e) = spawned {
            let mut live = lock(&self.live);
            live.conns.remove(&conn.id);
            live.readers = live.readers.saturating_sub(1);
            drop(live);
            let _ = conn.send(&Reply::Error {
                id: None,
                kind: "unavailable".into(),
                message: format!("the service could not start serving this connection ({e}); retry after a backoff"),
            });
            conn.close();
        }
    }

    /// One connection: read requests line by line until the client goes away or idles.
    pub(super) fn serve(self: Arc<Self>, conn: Arc<Conn>) {
        let _counted = ReaderGuard { shared: &self };
        let mut reader = LineReader::new();
        loop {
            let bytes = match reader.next(conn.stream(), self.cfg.idle_timeout) {
                Line::Request(bytes) => bytes,
                // A line cut off by the connection closing is a torn request: dropped
                // unread, so nothing of it was accepted.
                Line::End | Line::Torn | Line::Failed => break,
                Line::TooLong => {
                    let _ = conn.send(&Reply::Error {
                        id: None,
                        kind: "bad_request".into(),
                        message: format!("request lines are limited to {MAX_LINE} bytes"),
                    });
                    break;
                }
                Line::Idle => {
                    lock(&self.live).idle_closed += 1;
                    let _ = conn.send(&Reply::Error {
                        id: None,
                        kind: "idle_timeout".into(),
                        message: format!(
                            "no request for {}; closing the connection: reconnect and say `hello` to go on",
                            human_duration(self.cfg.idle_timeout)
                        ),
                    });
                    break;
                }
            };
            let request = match serde_json::from_slice::<Request>(&bytes) {
                Ok(r) => r,
                Err(e) => {
                    let reply = Reply::Error {
                        id: None,
                        kind: "bad_request".into(),
                        message: format!("not a request: {e}"),
                    };
                    if conn.send(&reply).is_err() {
                        break;
                    }
                    continue;
                }
            };
            if let Err(e) = self.handle(&conn, request) {
                self.note(chain(&e));
                break;
            }
        }
        conn.close();
        let mut live = lock(&self.live);
        live.conns.remove(&conn.id);
        if let Some(session) = lock(&conn.session).take()
            && live.sessions.get(&session) == Some(&conn.id)
        {
            live.sessions.remove(&session);
        }
        self.changed.notify_all();
    }

    pub(super) fn session_conn(&self, live: &Live, session: &str) -> Option<Arc<Conn>> {
        live.sessions
            .get(session)
            .and_then(|c| live.conns.get(c))
            .cloned()
    }
}
