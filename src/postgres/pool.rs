//! A fixed-size pool of blocking `postgres::Client`s, each with its session settings and
//! its prepared statements.
//!
//! Invariants: a connection in the idle list is outside any transaction (every lease ends
//! with COMMIT or ROLLBACK, or the connection is discarded); `live` counts the idle
//! connections plus the leased ones and never exceeds the pool's size; a connection that
//! lost its session (closed, an I/O error, a FATAL from the server) is dropped, never put
//! back. An idle connection may still have died since (the server restarted): the first
//! statement of a transaction on a reused connection that finds it dead is sent again on
//! another one ([`Pool::begin`]), which is safe because nothing ran yet.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::{NoTls, SimpleQueryMessage};

use super::deadline::{Disarm, Silence, Watched};
use super::errors::{classify, connection_lost, timed_out};
use super::sql::Prepared;
use crate::error::{Error, ErrorKind, Result};

/// One pooled connection.
pub(super) struct Conn {
    /// The session.
    pub(super) client: postgres::Client,
    /// Its prepared statements.
    pub(super) prepared: Prepared,
    /// Whether it served a lease before (then it may have died while idle).
    reused: bool,
    /// When its last statement ended.
    pub(super) last_used: Instant,
    /// Bounds how long its socket may stay silent during a call.
    silence: Silence,
    /// That bound.
    limit: Duration,
}

impl Conn {
    /// Bounds the silence of the connection during the call that follows, until the guard
    /// drops: past the limit the call fails with an I/O error (timed out) and the
    /// connection is lost. Every blocking call on a pooled connection runs armed.
    pub(super) fn arm(&self) -> Disarm {
        self.silence.arm(self.limit)
    }

    /// Whether the session is still open, as far as can be told without a round trip.
    /// The blocking client reads the socket only during a call, so this lets it read what
    /// the server sent meanwhile (the FATAL of a terminated session, its end of stream),
    /// waiting at most [`ALIVE_WAIT`]: about 1 ms on a healthy connection (a timer tick,
    /// which is what makes its runtime look at the socket at all), microseconds on one the
    /// server closed. A session that ends while a statement is in flight is not seen here.
    pub(super) fn alive(&mut self) -> bool {
        // We never LISTEN, so there is no notification to lose; an error here is the
        // session's end, which `is_closed` then reports.
        let _ = self.client.notifications().timeout_iter(ALIVE_WAIT).next();
        !self.client.is_closed()
    }
}

/// How long [`Conn::alive`] waits for what the server may have sent.
const ALIVE_WAIT: Duration = Duration::from_millis(1);

/// The pool's bookkeeping, under its mutex.
struct State {
    /// Connections outside any transaction, most recently used last.
    idle: Vec<Conn>,
    /// Idle plus leased connections (and ones being opened).
    live: usize,
}

/// The connections to one database.
pub(super) struct Pool {
    /// How to connect (timeouts, keepalives and application name set).
    config: postgres::Config,
    /// Whether connections are watched for silence ([`Watched::applies_to`]).
    watched: bool,
    /// The longest silence of the server while a call waits for it.
    limit: Duration,
    /// The `SET` statements every new session runs.
    settings: String,
    /// Most connections at once.
    size: usize,
    /// How long a caller waits for a connection when all are leased.
    wait: Duration,
    /// What the errors name: the journal and the database.
    place: String,
    state: Mutex<State>,
    /// Signalled when a connection is put back or discarded.
    freed: Condvar,
}

impl Pool {
    /// A pool that opens at most `size` (at least 1) connections with `config`, each
    /// running `settings` first; a caller waits at most `wait` for a free one. A call
    /// fails once the server stayed silent for `limit` while it waited for an answer
    /// (when the connection can be watched: [`Watched::applies_to`]).
    pub(super) fn new(
        mut config: postgres::Config,
        settings: String,
        size: usize,
        wait: Duration,
        limit: Duration,
        place: String,
    ) -> Pool {
        let watched = Watched::applies_to(&config);
        if watched {
            Watched::prepare(&mut config);
        }
        Pool {
            config,
            watched,
            limit,
            settings,
            size: size.max(1),
            wait,
            place,
            state: Mutex::new(State {
                idle: Vec::new(),
                live: 0,
            }),
            freed: Condvar::new(),
        }
    }

    /// What errors name: the journal and the database.
    pub(super) fn place(&self) -> &str {
        &self.place
    }

    /// The pool's bookkeeping, locked.
    fn state(&self) -> MutexGuard<'_, State> {
        // The state is two plain fields, consistent at every unlock: a panic elsewhere
        // while it was held leaves nothing half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection: an idle one, a new one while the pool has room, or the first one put
    /// back within the pool's wait.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when the database cannot be reached or every connection
    /// stayed leased for the whole wait; what [`classify`] makes of a refused connection.
    pub(super) fn take(&self) -> Result<Conn> {
        let deadline = Instant::now() + self.wait;
        let mut state = self.state();
        loop {
            // A connection that died while idle is found by `begin`, which sends its
            // statements again on another one: no check here, which would cost each
            // transaction a wait (see `Conn::alive`).
            while let Some(conn) = state.idle.pop() {
                if !conn.client.is_closed() {
                    return Ok(conn);
                }
                state.live = state.live.saturating_sub(1);
                self.freed.notify_one();
            }
            if state.live < self.size {
                state.live += 1;
                drop(state);
                return self.open().inspect_err(|_| self.release_slot());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(ErrorKind::Unavailable {
                    detail: format!(
                        "could not get a connection for {}: all {} connections of the pool \
                         stayed in use for {} ms (raise the pool size, or look for \
                         transactions left open)",
                        self.place,
                        self.size,
                        self.wait.as_millis()
                    ),
                    outcome_unknown: false,
                }));
            }
            state = self
                .freed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Opens a session and runs the settings.
    fn open(&self) -> Result<Conn> {
        let during = "connect to the database";
        let silence = Silence::default();
        // The TCP connect has its own timeout; the start-up exchange is a call.
        let armed = silence.arm(self.limit);
        let connected = if self.watched {
            self.config.connect(Watched(silence.clone()))
        } else {
            self.config.connect(NoTls)
        };
        let mut client = connected.map_err(|e| classify(e, during, &self.place))?;
        client
            .batch_execute(&self.settings)
            .map_err(|e| classify(e, "set up a new session", &self.place))?;
        drop(armed);
        Ok(Conn {
            client,
            prepared: Prepared::default(),
            reused: false,
            last_used: Instant::now(),
            silence,
            limit: self.limit,
        })
    }

    /// Gives up a slot whose connection is gone (or never opened).
    fn release_slot(&self) {
        let mut state = self.state();
        state.live = state.live.saturating_sub(1);
        drop(state);
        self.freed.notify_one();
    }

    /// Puts `conn` back; the caller ended its transaction. A closed one is dropped.
    pub(super) fn give(&self, mut conn: Conn) {
        if conn.client.is_closed() {
            self.discard(conn);
            return;
        }
        conn.reused = true;
        self.state().idle.push(conn);
        self.freed.notify_one();
    }

    /// Drops `conn` (its session is lost or in an unknown state) and frees its slot.
    pub(super) fn discard(&self, conn: Conn) {
        drop(conn);
        self.release_slot();
    }

    /// Ends `conn`'s transaction with ROLLBACK and puts it back, or drops it if that
    /// fails: a connection goes back only outside a transaction.
    pub(super) fn roll_back(&self, mut conn: Conn) {
        let armed = conn.arm();
        let done = conn.client.batch_execute("ROLLBACK");
        drop(armed);
        match done {
            Ok(()) => self.give(conn),
            Err(_) => self.discard(conn),
        }
    }

    /// Leases a connection and sends `sql` (a simple query that opens a transaction, such
    /// as `BEGIN ...; SELECT now()`) in one round trip; returns the connection, inside
    /// that transaction, and what the statements answered. A reused connection found dead
    /// is dropped and the statements are sent on another (nothing ran on the dead one).
    ///
    /// # Errors
    ///
    /// As [`Pool::take`]; what [`classify`] makes of the statements' error (the
    /// transaction is rolled back and the connection put back, or dropped if lost).
    pub(super) fn begin(
        &self,
        sql: &str,
        during: &'static str,
    ) -> Result<(Conn, Vec<SimpleQueryMessage>)> {
        // Each retry drops one dead idle connection; the pool holds at most `size`.
        for _ in 0..=self.size {
            let mut conn = self.take()?;
            let armed = conn.arm();
            let answered = conn.client.simple_query(sql);
            drop(armed);
            conn.last_used = Instant::now();
            match answered {
                Ok(answers) => return Ok((conn, answers)),
                Err(e) if connection_lost(&e) => {
                    // A connection that died while idle answers at once; one that timed
                    // out says that the server cannot be reached now, and another would
                    // wait as long again.
                    let retry = conn.reused && !timed_out(&e);
                    self.discard(conn);
                    if !retry {
                        return Err(classify(e, during, &self.place));
                    }
                }
                Err(e) => {
                    self.roll_back(conn);
                    return Err(classify(e, during, &self.place));
                }
            }
        }
        // Every idle connection was dead and then the pool refilled with more dead ones:
        // only a server that keeps dropping sessions does that.
        Err(Error::new(ErrorKind::Unavailable {
            detail: format!(
                "could not {during} for {}: every pooled connection was lost",
                self.place
            ),
            outcome_unknown: false,
        }))
    }
}
