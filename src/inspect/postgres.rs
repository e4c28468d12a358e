//! An [`Inspector`] over a journal in PostgreSQL (feature `postgres`): what the read-only
//! commands of the `opjournal` CLI read with `--postgres URL NAME`.
//!
//! Nothing is created or written: the pool's sessions run with
//! `default_transaction_read_only` on, the schema and the journal must exist (a missing
//! one is [`ErrorKind::NotAJournal`], naming the journals present), and the writer lock is
//! never taken, so inspecting works beside writers in other processes. Each read is one
//! `REPEATABLE READ, READ ONLY` snapshot, and its "now" (the time the clocks are applied
//! at) is the database server's time at the snapshot's start, never below the journal's
//! high-water mark.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Access, Inspector, Source};
use crate::clock::{SystemClock, Timestamp};
use crate::codec::FORMAT_VERSION;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Base, Layers, View};
use crate::postgres::{Pg, PgConfig};
use crate::preflight::reading::Extent;

/// Connections an inspector opens at most: one read, and one more for a read made while
/// another is open (`export --results` reads a result inside the walk of the receipts).
const POOL_SIZE: usize = 2;

impl Inspector {
    /// Opens the journal `name` in the PostgreSQL database at `url` (a URL such as
    /// `postgresql://user@host:5432/db`, or libpq's `key=value` pairs) for inspection,
    /// read-only: nothing is created or written, and writers in other processes are
    /// neither waited for nor excluded ([`Access::Database`]). Each later call reads one
    /// snapshot of the database.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::InvalidInput`] for a connection string that does not parse or a name
    ///   no journal can have;
    /// - [`ErrorKind::NotAJournal`] (its `path` the journal's name) when the database holds
    ///   no opjournal schema, no journal of that name (the message lists the names
    ///   present), or a journal without its format record;
    /// - [`ErrorKind::UnsupportedFormat`] when the database's schema or the journal's format
    ///   is of another version than this build reads (written by a newer opjournal);
    /// - [`ErrorKind::Unavailable`] when the server cannot be reached, and
    ///   [`ErrorKind::Storage`] for what it refused otherwise (authentication, a missing
    ///   database, permissions), with the server's error as the source.
    pub fn open_postgres(url: &str, name: &str) -> Result<Inspector> {
        let mut cfg = PgConfig::new(url, name);
        cfg.pool_size = POOL_SIZE;
        let pg = Pg::connect_read_only(cfg)?;
        let path = PathBuf::from(format!("postgres:{}", pg.describe()));
        let place = pg.describe();
        let insp = Inspector {
            source: Source::Postgres(pg),
            path,
            access: Access::Database,
            extent: Extent {
                file_len: 0,
                stored_len: None,
                unclean: false,
            },
            clock: Box::new(SystemClock),
        };
        let format = crate::preflight::guarded("open", || insp.with_snapshot(|t, _| t.format()))?;
        match format {
            Some(f) if (1..=u32::from(FORMAT_VERSION)).contains(&f.format_version) => Ok(insp),
            Some(f) => Err(Error::new(ErrorKind::UnsupportedFormat {
                found: f.format_version,
                supported: u32::from(FORMAT_VERSION),
            })),
            None => Err(Error::new(ErrorKind::NotAJournal {
                path: name.into(),
                detail: format!(
                    "{place} is registered but holds no format record (a journal whose \
                     creation never committed); open it with the library \
                     (`JournalBuilder::open_postgres`) to create it"
                ),
            })),
        }
    }
}

/// Runs `f` on one snapshot of the journal in `pg`, with the server's time at its start
/// (never below the journal's high-water mark), then ends the snapshot.
pub(super) fn with_snapshot<R>(
    pg: &Pg,
    f: impl FnOnce(&index::Snapshot<'_>, Timestamp) -> Result<R>,
) -> Result<R> {
    let (read, server_ms) = pg.read()?;
    let read = Arc::new(read);
    let base = Base::store(read.clone());
    let out = {
        let snap = index::Snapshot {
            base: Some(&base),
            layers: Layers::default(),
        };
        snap.state()
            .and_then(|state| f(&snap, Timestamp(server_ms).max(state.clock_high_water)))
    };
    drop(base);
    if let Ok(read) = Arc::try_unwrap(read) {
        read.finish();
    }
    out
}
