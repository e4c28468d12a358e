//! The conformance suite's fixture (tests/conformance.rs): one journal per test, kept by
//! one storage backend (a file, memory, PostgreSQL), on a manual clock. [`Fixture::open`]
//! gives "the same journal again": a file is reopened from its path, a journal in memory
//! is a clone of the one handle the fixture keeps, and a journal in PostgreSQL is a new
//! handle to the same database and journal name.
//!
//! A body written against the fixture holds on every backend only if it does not depend
//! on what an open does beyond "the same journal": reopening a file marks its running
//! operations in doubt (the process that held them is gone), a clone of a handle in memory
//! and a new handle in PostgreSQL do not (another process may be running them). A body
//! reaches in-doubt by lease expiry instead, which every backend applies on every read.
//! A file admits one writer: drop the journal before opening it again.

use std::cell::{Cell, OnceCell, RefCell};
use std::path::{Path, PathBuf};
use std::time::Duration;

use opjournal::{FileLog, Journal, JournalBuilder, ManualClock, Result, Timestamp};

use super::T0;

/// Where a journal keeps its tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A redb file and its log (`JournalBuilder::open`).
    File,
    /// Memory only (`JournalBuilder::open_in_memory`): nothing durable.
    Memory,
    /// A journal in a PostgreSQL database (`JournalBuilder::open_postgres`, feature
    /// `postgres`), on a private server started once per test binary.
    Postgres,
}

impl Backend {
    /// Whether the journal keeps recent terminal answers in a replay cache. A journal in
    /// PostgreSQL keeps none: another process may change any receipt.
    pub fn caches_replays(self) -> bool {
        self != Backend::Postgres
    }
}

/// Settings applied to the builder of every open.
type Settings = Box<dyn Fn(JournalBuilder) -> JournalBuilder>;

/// One test's journal on one backend.
pub struct Fixture {
    backend: Backend,
    /// The journal's clock: every open of this fixture uses it.
    pub clock: ManualClock,
    /// The test's name, for the journal's name in PostgreSQL.
    test: String,
    /// File: the directory of the journal file.
    dir: Option<tempfile::TempDir>,
    settings: RefCell<Option<Settings>>,
    opened: Cell<bool>,
    /// Memory: the one journal, kept open for the whole test.
    memory: OnceCell<Journal>,
    /// PostgreSQL: the server, and this fixture's journal name.
    #[cfg(feature = "postgres")]
    pg: Option<(&'static pg::Server, String)>,
}

impl Fixture {
    /// A new, empty journal on `backend` for the test `name`, or `None` when the backend is
    /// not available here (PostgreSQL not installed and not required: the test is
    /// skipped, with a line on stderr).
    pub fn new(backend: Backend, name: &str) -> Option<Fixture> {
        #[cfg(feature = "postgres")]
        let pg = match backend {
            Backend::Postgres => Some((pg::server(name)?, pg::journal_name(name))),
            _ => None,
        };
        #[cfg(not(feature = "postgres"))]
        if backend == Backend::Postgres {
            skipped(name, "built without the `postgres` feature");
            return None;
        }
        let dir =
            (backend == Backend::File).then(|| tempfile::tempdir().expect("a temporary directory"));
        Some(Fixture {
            backend,
            clock: ManualClock::new(T0),
            test: name.to_string(),
            dir,
            settings: RefCell::new(None),
            opened: Cell::new(false),
            memory: OnceCell::new(),
            #[cfg(feature = "postgres")]
            pg,
        })
    }

    /// Another new, empty journal on the same backend, with its own clock at T0.
    pub fn sibling(&self) -> Fixture {
        Fixture::new(self.backend, &self.test).expect("the backend was available for this fixture")
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Settings for every open of this journal (a journal in memory is created once, with
    /// them): set before the first open.
    ///
    /// # Panics
    ///
    /// After the first open.
    pub fn configure(&self, settings: impl Fn(JournalBuilder) -> JournalBuilder + 'static) {
        assert!(
            !self.opened.get(),
            "configure the journal before its first open"
        );
        *self.settings.borrow_mut() = Some(Box::new(settings));
    }

    /// The builder of every open: the fixture's clock, then the settings.
    pub fn builder(&self) -> JournalBuilder {
        let builder = Journal::builder().clock(self.clock.clone());
        match &*self.settings.borrow() {
            Some(settings) => settings(builder),
            None => builder,
        }
    }

    /// The same journal again (created by the first call).
    pub fn try_open(&self) -> Result<Journal> {
        self.opened.set(true);
        match self.backend {
            Backend::File => self.builder().open(self.path().expect("a file journal")),
            Backend::Memory => {
                if let Some(journal) = self.memory.get() {
                    return Ok(journal.clone());
                }
                let journal = self.builder().open_in_memory()?;
                Ok(self.memory.get_or_init(|| journal).clone())
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                let (server, journal) = self.pg.as_ref().expect("a PostgreSQL fixture");
                self.builder().open_postgres(&server.url, journal)
            }
            #[cfg(not(feature = "postgres"))]
            Backend::Postgres => unreachable!("no PostgreSQL fixture without the feature"),
        }
    }

    /// As [`Fixture::try_open`].
    ///
    /// # Panics
    ///
    /// When the journal does not open.
    pub fn open(&self) -> Journal {
        self.try_open()
            .unwrap_or_else(|e| panic!("the {:?} journal opens: {e}", self.backend))
    }

    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    /// Sets the clock to `deadline + offset_ms` (the offset may be negative).
    pub fn at(&self, deadline: Timestamp, offset_ms: i64) {
        let ms = deadline
            .as_millis()
            .checked_add_signed(offset_ms)
            .expect("a time after the epoch");
        self.clock.set(Timestamp::from_millis(ms));
    }

    /// The journal file (file backend only).
    pub fn path(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.path().join("journal.opj"))
    }

    /// The bytes of the journal file and of its log (file backend only): every commit
    /// appends to the log, the file changes at a checkpoint. An open journal has its log: a
    /// missing one fails here rather than comparing two absent files.
    pub fn stored_bytes(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        let path = self.path()?;
        let read = |p: &Path| {
            std::fs::read(p).unwrap_or_else(|e| panic!("the open journal's {}: {e}", p.display()))
        };
        Some((read(&path), read(&FileLog::path_for(&path))))
    }
}

fn skipped(test: &str, why: &str) {
    use std::io::Write;
    // Straight to the process's stderr: the test harness captures `eprintln!`.
    let _ = writeln!(std::io::stderr(), "skipped postgres::{test}: {why}");
}

#[cfg(feature = "postgres")]
mod pg {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    use opjournal_testkit::pg::PgCluster;

    /// A private server for the test binary, with the database the journals live in.
    pub struct Server {
        _cluster: PgCluster,
        pub url: String,
    }

    /// A journal name of its own for each fixture of `test` in this process.
    pub fn journal_name(test: &str) -> String {
        static FIXTURES: AtomicU64 = AtomicU64::new(0);
        format!("{test}_{}", FIXTURES.fetch_add(1, Ordering::Relaxed))
    }

    /// The server, started by the first test that asks (`None`: PostgreSQL is not
    /// installed here and not required, and the test is skipped).
    pub fn server(test: &str) -> Option<&'static Server> {
        static SERVER: OnceLock<Option<Server>> = OnceLock::new();
        let server = SERVER
            .get_or_init(|| {
                let cluster = PgCluster::start_or_skip()?;
                cluster
                    .create_database("conformance")
                    .unwrap_or_else(|e| panic!("create the conformance database: {e}"));
                let url = cluster.url_for("conformance");
                Some(Server {
                    _cluster: cluster,
                    url,
                })
            })
            .as_ref();
        if server.is_none() {
            super::skipped(test, "PostgreSQL is not installed");
        }
        server
    }
}
