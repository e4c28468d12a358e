//! The access layer against a real server: the one named by `OPJOURNAL_PG_TEST_URL` (a
//! connection string such as `postgresql://postgres@127.0.0.1:55432/postgres`, trust
//! authentication, a role that may create schemas and terminate its own sessions), else a
//! private one the tests start themselves (`opjournal_testkit::pg::PgCluster`, shared by
//! the tests that run at the same time and stopped when the last of them ends). Without
//! PostgreSQL installed every test prints one line and passes, unless
//! `OPJOURNAL_PG_REQUIRED=1` (CI) makes that a failure.
//!
//! Each test works in a schema of its own (`search_path` set through the URL's `options`),
//! dropped at its end, so the tests run in parallel against one database and a test of
//! schema creation sees a database without the tables.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use opjournal_testkit::pg::PgCluster;
use postgres::NoTls;

use super::errors::classify;
use super::schema::SCHEMA_VERSION;
use super::*;
use crate::error::ErrorKind;
use crate::index::store::{Store, range};
use crate::index::{Events, Meta, Table};

/// The variable naming the test server.
const URL_ENV: &str = "OPJOURNAL_PG_TEST_URL";

/// The private server of the tests running now: started by the first, stopped when the
/// last one drops it (a server left running by a static would outlive the test process).
fn shared_cluster() -> Option<Arc<PgCluster>> {
    static SHARED: Mutex<Weak<PgCluster>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(cluster) = slot.upgrade() {
        return Some(cluster);
    }
    let cluster = Arc::new(PgCluster::start_or_skip()?);
    *slot = Arc::downgrade(&cluster);
    Some(cluster)
}

/// A schema of its own on the test server, dropped when the test ends.
struct Db {
    /// The server's URL, with `search_path` set to the schema.
    url: String,
    base: String,
    schema: String,
    /// The private server, when `OPJOURNAL_PG_TEST_URL` is not set (dropped after the
    /// schema).
    _cluster: Option<Arc<PgCluster>>,
}

impl Db {
    /// A fresh schema, or `None` (after a note) when there is no server.
    fn new(test: &str) -> Option<Db> {
        let (base, cluster) = match std::env::var(URL_ENV).ok().filter(|u| !u.trim().is_empty()) {
            Some(url) => (url, None),
            None => {
                let Some(cluster) = shared_cluster() else {
                    eprintln!(
                        "{test}: skipped: no PostgreSQL (set {URL_ENV} to a server's URL, or \
                         install one)"
                    );
                    return None;
                };
                (cluster.url(), Some(cluster))
            }
        };
        static N: AtomicU32 = AtomicU32::new(0);
        let schema = format!(
            "opj_test_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin =
            postgres::Client::connect(&base, NoTls).expect("connect to the test server");
        admin
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .expect("create the test's schema");
        let options = format!("options=-c%20search_path%3D{schema}");
        let url = if base.contains("://") {
            let sep = if base.contains('?') { '&' } else { '?' };
            format!("{base}{sep}{options}")
        } else {
            format!("{base} options='-c search_path={schema}'")
        };
        Some(Db {
            url,
            base,
            schema,
            _cluster: cluster,
        })
    }

    fn cfg(&self, journal: &str) -> PgConfig {
        PgConfig::new(&self.url, journal)
    }

    fn pg(&self, journal: &str) -> Pg {
        Pg::connect(self.cfg(journal)).expect("connect")
    }

    /// A plain client in the schema.
    fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, NoTls).expect("connect a plain client")
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(mut admin) = postgres::Client::connect(&self.base, NoTls) {
            let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        }
    }
}

macro_rules! db_or_skip {
    ($test:literal) => {
        match Db::new($test) {
            Some(db) => db,
            None => return,
        }
    };
}

/// A batch putting `n` events (keys `0..n` spread over the u64 range so that their bytes
/// hold 0x00 and 0xFF) and a few meta records.
fn events(keys: impl IntoIterator<Item = u64>) -> Memtable {
    let mut m = Memtable::default();
    for k in keys {
        m.set::<Events>(k, Some(format!("event {k}").into_bytes()));
    }
    m
}

/// The keys the scan tests use: their ordered bytes begin, hold and end with 0x00 and
/// 0xFF.
fn edge_keys() -> Vec<u64> {
    vec![
        0,
        1,
        0xFF,
        0x100,
        0x00FF_0000_0000_0000,
        0xFF00_0000_0000_0000,
        0xFF00_0000_0000_00FF,
        0xFFFF_FFFF_FFFF_FF00,
        u64::MAX - 1,
        u64::MAX,
    ]
}

/// The changes of `m` as a store keeps them: (table, ordered key) → value.
fn model(m: &Memtable) -> BTreeMap<(u8, Vec<u8>), Vec<u8>> {
    let mut out = BTreeMap::new();
    m.each_raw(|t, k, v| {
        if let Some(v) = v {
            out.insert((t, k), v.to_vec());
        }
    });
    out
}

fn is_unavailable(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Unavailable { .. })
}

#[test]
fn the_schema_is_created_once_whoever_comes_first_and_however_many_at_once() {
    let db = db_or_skip!("schema");
    db.pg("one");
    db.pg("one");
    db.pg("two");
    let mut c = db.client();
    let version: i32 = c
        .query_one("SELECT version FROM opjournal_schema", &[])
        .expect("the version row")
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    let journals: i64 = c
        .query_one("SELECT count(*) FROM opjournal_journals", &[])
        .expect("count")
        .get(0);
    assert_eq!(journals, 2);

    // Four processes' first opens at once, on a database without the tables.
    for round in 0..3 {
        let db = db_or_skip!("schema");
        let barrier = Arc::new(Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let cfg = db.cfg(&format!("j{}", i % 2));
                let barrier = Arc::clone(&barrier);
                thread::spawn(move || {
                    barrier.wait();
                    Pg::connect(cfg)
                })
            })
            .collect();
        for h in handles {
            let r = h.join().expect("the thread");
            assert!(r.is_ok(), "round {round}: {r:?}");
        }
        let mut c = db.client();
        let rows: i64 = c
            .query_one("SELECT count(*) FROM opjournal_schema", &[])
            .expect("count")
            .get(0);
        assert_eq!(rows, 1);
    }
}

#[test]
fn a_newer_schema_is_refused_and_an_older_one_without_a_path_too() {
    let db = db_or_skip!("newer schema");
    db.pg("j");
    let mut c = db.client();
    c.batch_execute("UPDATE opjournal_schema SET version = 2")
        .expect("pretend a newer build");
    let e = Pg::connect(db.cfg("j")).expect_err("a newer schema");
    assert_eq!(
        e.kind(),
        &ErrorKind::UnsupportedFormat {
            found: 2,
            supported: 1
        },
        "{e}"
    );
    assert!(!e.is_retryable());
    c.batch_execute("UPDATE opjournal_schema SET version = 0")
        .expect("pretend an older build");
    let e = Pg::connect(db.cfg("j")).expect_err("no migration from 0");
    assert!(
        matches!(e.kind(), ErrorKind::UnsupportedFormat { found: 0, .. }),
        "{e}"
    );
}

#[test]
fn bad_settings_are_refused_before_any_connection() {
    let e = Pg::connect(PgConfig::new("postgresql://u:secret@h:5432/db", "")).expect_err("empty");
    assert!(matches!(e.kind(), ErrorKind::InvalidInput { .. }), "{e}");
    let e = Pg::connect(PgConfig::new("postgresql://u:secret@h:notaport/db", "j"))
        .expect_err("a bad url");
    assert!(matches!(e.kind(), ErrorKind::InvalidInput { .. }), "{e}");
    assert!(!e.to_string().contains("secret"), "{e}");
    assert_eq!(
        redact("postgresql://u:secret@h/db?password=x&sslmode=disable"),
        "postgresql://u:***@h/db?password=x&sslmode=disable"
    );
    assert_eq!(
        redact("host=h password=secret user=u"),
        "host=h password=*** user=u"
    );
    assert_eq!(
        redact("postgresql://h/db?password=s&a=b"),
        "postgresql://h/db?password=***&a=b"
    );
    assert_eq!(literal("it's a \\ test"), "E'it''s a \\\\ test'");
}

#[test]
fn nothing_listens_so_the_database_is_unavailable() {
    // A port nothing listens on (the connection is refused at once).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("its address").port();
    drop(listener);
    let e = Pg::connect(PgConfig::new(
        &format!("postgresql://u@127.0.0.1:{port}/db"),
        "j",
    ))
    .expect_err("nothing listens");
    assert!(is_unavailable(&e), "{e:?}");
    assert!(e.is_retryable());
    assert!(!is_conflict(&e));
    let shown = e.to_string();
    assert!(
        shown.contains("journal `j`") && shown.contains(&port.to_string()),
        "{shown}"
    );
}

#[test]
fn initialize_writes_once_of_several_at_once() {
    let db = db_or_skip!("initialize");
    let mut initial = Memtable::default();
    initial.set::<Meta>("format".into(), Some(b"v1".to_vec()));
    initial.set::<Meta>("state".into(), Some(b"s".to_vec()));
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let pg = db.pg("j");
            let initial = initial.clone();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                pg.initialize(&initial)
            })
        })
        .collect();
    let wrote: Vec<bool> = handles
        .into_iter()
        .map(|h| h.join().expect("the thread").expect("initialize"))
        .collect();
    assert_eq!(wrote.iter().filter(|w| **w).count(), 1, "{wrote:?}");
    let pg = db.pg("j");
    assert!(!pg.initialize(&initial).expect("again"));
    let (r, _) = pg.read().expect("read");
    assert_eq!(r.count(Meta::ID).expect("count"), 2);
    let mut key = Vec::new();
    crate::index::TableKey::to_ordered(&smol_str::SmolStr::new("format"), &mut key);
    assert_eq!(r.get(Meta::ID, &key).expect("get"), Some(b"v1".to_vec()));
}

/// Checks every kind of bound and a few limits against the model.
fn check_scans(store: &dyn Store, model: &BTreeMap<(u8, Vec<u8>), Vec<u8>>) {
    let table = Events::ID;
    let keys: Vec<Vec<u8>> = model
        .keys()
        .filter(|(t, _)| *t == table)
        .map(|(_, k)| k.clone())
        .collect();
    // Probes: every key, and bytes between and beyond them.
    let mut probes = keys.clone();
    probes.extend([
        vec![],
        vec![0x00],
        vec![0xFF],
        vec![0xFF; 9],
        vec![0x00, 0xFF, 0x00],
    ]);
    for k in &keys {
        let mut longer = k.clone();
        longer.push(0x00);
        probes.push(longer);
    }
    let bounds = |p: &Vec<u8>| {
        [
            Bound::Included(p.clone()),
            Bound::Excluded(p.clone()),
            Bound::Unbounded,
        ]
    };
    for lo_key in &probes {
        for hi_key in &probes {
            for lo in bounds(lo_key) {
                for hi in bounds(hi_key) {
                    let in_range = |k: &Vec<u8>| {
                        (match &lo {
                            Bound::Included(b) => k >= b,
                            Bound::Excluded(b) => k > b,
                            Bound::Unbounded => true,
                        }) && (match &hi {
                            Bound::Included(b) => k <= b,
                            Bound::Excluded(b) => k < b,
                            Bound::Unbounded => true,
                        })
                    };
                    let want: Vec<(Vec<u8>, Vec<u8>)> = model
                        .iter()
                        .filter(|((t, k), _)| *t == table && in_range(k))
                        .map(|((_, k), v)| (k.clone(), v.clone()))
                        .collect();
                    for limit in [1, 3, 1000] {
                        let got = store
                            .scan(
                                table,
                                lo.as_ref().map(Vec::as_slice),
                                hi.as_ref().map(Vec::as_slice),
                                limit,
                            )
                            .expect("scan");
                        let want: Vec<_> = want.iter().take(limit).cloned().collect();
                        assert_eq!(got, want, "{lo:02x?} .. {hi:02x?} limit {limit}");
                    }
                }
            }
        }
    }
    assert_eq!(
        store
            .scan(table, Bound::Unbounded, Bound::Unbounded, 0)
            .expect("limit 0"),
        vec![]
    );
    for (k, v) in model.iter().filter(|((t, _), _)| *t == table) {
        assert_eq!(store.get(table, &k.1).expect("get").as_ref(), Some(v));
    }
    assert_eq!(store.get(table, &[0x00, 0xFF]).expect("get"), None);
    assert_eq!(store.count(table).expect("count"), keys.len() as u64);
}

#[test]
fn reads_and_writes_agree_with_a_model_at_every_bound() {
    let db = db_or_skip!("scan");
    let pg = db.pg("j");
    let mut batch = events(edge_keys());
    batch.set::<Meta>("a\0b".into(), Some(b"m".to_vec()));
    batch.set::<Meta>("\u{ff}".into(), Some(b"n".to_vec()));
    let model = model(&batch);

    let (w, _) = pg.write(true).expect("write").expect("the lock");
    w.apply(&batch).expect("apply");
    // The write transaction reads its own changes.
    check_scans(&w, &model);
    assert_eq!(w.count(Meta::ID).expect("count"), 2);
    w.commit().expect("commit");

    let (r, _) = pg.read().expect("read");
    check_scans(&r, &model);
    // The generic range read pages through the store in key order (more than a page).
    let (w, _) = pg.write(true).expect("write").expect("the lock");
    w.apply(&events(
        (0..300u64).map(|i| i.wrapping_mul(0x0123_4567_89AB_CDEF)),
    ))
    .expect("apply");
    w.commit().expect("commit");
    let (r, _) = pg.read().expect("read");
    let all: Vec<u64> = range::<Events>(&r, Bound::Unbounded, Bound::Unbounded)
        .map(|e| e.expect("an entry").0)
        .collect();
    let mut sorted = all.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(all, sorted);
    assert_eq!(all.len() as u64, r.count(Events::ID).expect("count"));
    let from: Vec<u64> = range::<Events>(&r, Bound::Excluded(&0xFF), Bound::Included(&u64::MAX))
        .map(|e| e.expect("an entry").0)
        .collect();
    assert_eq!(
        from,
        all.iter()
            .copied()
            .filter(|k| *k > 0xFF)
            .collect::<Vec<_>>()
    );
    r.finish();
}

#[test]
fn a_commit_is_seen_by_later_reads_and_a_dropped_write_by_none() {
    let db = db_or_skip!("commit");
    let pg = db.pg("j");
    let before = pg.read().expect("read").0;
    let (w, _) = pg.write(true).expect("write").expect("the lock");
    w.apply(&events([1, 2, 3])).expect("apply");
    drop(w);
    assert_eq!(
        pg.read().expect("read").0.count(Events::ID).expect("count"),
        0
    );

    let (w, _) = pg.write(true).expect("write").expect("the lock");
    w.apply(&events([1, 2, 3])).expect("apply");
    w.commit().expect("commit");
    // A snapshot taken before the commit does not see it; a new one does.
    assert_eq!(before.count(Events::ID).expect("count"), 0);
    let (after, _) = pg.read().expect("read");
    assert_eq!(after.count(Events::ID).expect("count"), 3);

    // Deletions, and a put over an existing key.
    let mut m = Memtable::default();
    m.set::<Events>(1, None);
    m.set::<Events>(2, Some(b"new".to_vec()));
    m.set::<Events>(9, None); // a key that was never there
    let (w, _) = pg.write(true).expect("write").expect("the lock");
    w.apply(&m).expect("apply");
    w.commit().expect("commit");
    let (r, _) = pg.read().expect("read");
    assert_eq!(r.count(Events::ID).expect("count"), 2);
    assert_eq!(r.get(Events::ID, &1u64.to_be_bytes()).expect("get"), None);
    assert_eq!(
        r.get(Events::ID, &2u64.to_be_bytes()).expect("get"),
        Some(b"new".to_vec())
    );
}

#[test]
fn a_batch_of_5000_changes_takes_one_statement_per_kind() {
    let db = db_or_skip!("5000");
    let pg = db.pg("j");
    let batch = events(0..5000);
    let (w, _) = pg.write(true).expect("write").expect("the lock");
    let started = Instant::now();
    w.apply(&batch).expect("apply");
    let applied = started.elapsed();
    w.commit().expect("commit");
    let committed = started.elapsed();
    let (r, _) = pg.read().expect("read");
    assert_eq!(r.count(Events::ID).expect("count"), 5000);
    drop(r);

    // Replacing and deleting 5,000 (2,500 each).
    let mut m = Memtable::default();
    for k in 0..5000u64 {
        m.set::<Events>(k, (k % 2 == 0).then(|| b"again".to_vec()));
    }
    let (w, _) = pg.write(true).expect("write").expect("the lock");
    let started = Instant::now();
    w.apply(&m).expect("apply");
    let mixed = started.elapsed();
    w.commit().expect("commit");
    let (r, _) = pg.read().expect("read");
    assert_eq!(r.count(Events::ID).expect("count"), 2500);

    // Round trips: time a get and a scan of one page on a warm connection.
    let key = 4u64.to_be_bytes();
    r.get(Events::ID, &key).expect("prepare");
    r.scan(Events::ID, Bound::Included(&key), Bound::Unbounded, 128)
        .expect("prepare");
    let n = 200u32;
    let started = Instant::now();
    for _ in 0..n {
        r.get(Events::ID, &key).expect("get");
    }
    let get = started.elapsed() / n;
    let started = Instant::now();
    for _ in 0..n {
        r.scan(Events::ID, Bound::Included(&key), Bound::Unbounded, 128)
            .expect("scan");
    }
    let scan = started.elapsed() / n;
    eprintln!(
        "5,000 upserts: apply {applied:?}, with commit {committed:?}; 2,500 upserts + 2,500 \
         deletes: apply {mixed:?}; get {get:?}; scan of 128 {scan:?}"
    );
}

#[test]
fn the_writer_lock_is_skipped_or_waited_for() {
    let db = db_or_skip!("lock");
    let pg = db.pg("j");
    let other = db.pg("j");
    let (held, t1) = pg.write(true).expect("write").expect("the lock");
    held.apply(&events([7])).expect("apply");
    assert!(
        other.write(false).expect("try").is_none(),
        "the lock is held"
    );
    // Another journal's lock is its own.
    assert!(db.pg("k").write(false).expect("try").is_some());

    let waiter = thread::spawn(move || {
        let started = Instant::now();
        let (w, t2) = other.write(true).expect("wait").expect("the lock");
        // Under the lock, the previous writer's commit is visible.
        let seen = w.get(Events::ID, &7u64.to_be_bytes()).expect("get");
        (started.elapsed(), t2, seen)
    });
    thread::sleep(Duration::from_millis(300));
    held.commit().expect("commit");
    let (waited, t2, seen) = waiter.join().expect("the waiter");
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(
        t2 >= t1 + 250,
        "the clock is read after the lock: {t1} then {t2}"
    );
    assert_eq!(seen, Some(b"event 7".to_vec()));
    assert!(
        pg.write(false).expect("try").is_some(),
        "the waiter rolled back"
    );
    let commits: i64 = db
        .client()
        .query_one(
            "SELECT commits FROM opjournal_journals WHERE name = 'j'",
            &[],
        )
        .expect("the row")
        .get(0);
    assert_eq!(commits, 1);
}

#[test]
fn a_lock_timeout_is_unavailable_and_no_conflict() {
    let db = db_or_skip!("lock timeout");
    let pg = db.pg("j");
    let mut cfg = db.cfg("j");
    cfg.lock_timeout = Duration::from_millis(200);
    let impatient = Pg::connect(cfg).expect("connect");
    let (_held, _) = pg.write(true).expect("write").expect("the lock");
    let e = impatient.write(true).expect_err("the wait times out");
    assert!(is_unavailable(&e), "{e:?}");
    assert!(e.to_string().contains("55P03"), "{e}");
    assert!(!is_conflict(&e));
    assert!(matches!(
        e.kind(),
        ErrorKind::Unavailable {
            outcome_unknown: false,
            ..
        }
    ));
    // The pool put its connection back, usable.
    assert!(impatient.read().is_ok());
}

#[test]
fn a_serialization_failure_is_a_conflict() {
    let db = db_or_skip!("serialization");
    db.pg("j");
    let mut a = db.client();
    let mut b = db.client();
    a.batch_execute("CREATE TABLE t (id int PRIMARY KEY, n int); INSERT INTO t VALUES (1, 0)")
        .expect("a table");
    let mut ta = a
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .start()
        .expect("begin");
    ta.query_one("SELECT n FROM t WHERE id = 1", &[])
        .expect("snapshot");
    b.batch_execute("UPDATE t SET n = 1 WHERE id = 1")
        .expect("a concurrent update");
    let pg_err = ta
        .execute("UPDATE t SET n = 2 WHERE id = 1", &[])
        .expect_err("40001");
    let e = classify(pg_err, "write the batch", "journal `j` in the test");
    assert!(is_unavailable(&e), "{e:?}");
    assert!(is_conflict(&e), "{e}");
    assert!(is_conflict(&e.copied()), "a copy keeps it");
    assert!(e.is_retryable());
    assert!(!e.is_refusal());
    assert!(e.to_string().contains("nothing was written"), "{e}");
}

#[test]
fn a_caller_transaction_whose_snapshot_predates_a_commit_cannot_take_the_lock() {
    let db = db_or_skip!("stale caller");
    let pg = db.pg("j");
    let mut c = db.client();
    let mut txn = c
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .start()
        .expect("begin");
    txn.query_one("SELECT 1", &[]).expect("take the snapshot");
    let (w, _) = pg.write(true).expect("write").expect("the lock");
    w.apply(&events([1])).expect("apply");
    w.commit().expect("commit");
    let e = PgWriteIn::lock_in(&mut txn, "j")
        .map(drop)
        .expect_err("a stale snapshot");
    assert!(is_conflict(&e), "{e:?}");
}

#[test]
fn a_write_in_the_callers_transaction_commits_with_it() {
    let db = db_or_skip!("write in");
    let pg = db.pg("it's \\ j");
    let mut c = db.client();
    c.batch_execute("CREATE TABLE effects (n int)")
        .expect("a table");

    for commit in [false, true] {
        let mut txn = c.transaction().expect("begin");
        txn.execute("INSERT INTO effects VALUES (1)", &[])
            .expect("the effect");
        let (w, now) = PgWriteIn::lock_in(&mut txn, "it's \\ j").expect("lock");
        assert!(now > 1_600_000_000_000, "{now}");
        assert!(
            pg.write(false).expect("try").is_none(),
            "the caller holds the lock"
        );
        w.apply(&events([1, 2])).expect("apply");
        assert_eq!(w.count(Events::ID).expect("count"), 2);
        assert_eq!(
            w.scan(
                Events::ID,
                Bound::Excluded(&1u64.to_be_bytes()[..]),
                Bound::Unbounded,
                10
            )
            .expect("scan")
            .len(),
            1
        );
        assert!(
            w.get(Events::ID, &2u64.to_be_bytes())
                .expect("get")
                .is_some()
        );
        drop(w);
        if commit {
            txn.commit().expect("commit");
        } else {
            txn.rollback().expect("rollback");
        }
        let (r, _) = pg.read().expect("read");
        let want = if commit { 2 } else { 0 };
        assert_eq!(r.count(Events::ID).expect("count"), want, "commit {commit}");
    }
    let effects: i64 = c
        .query_one("SELECT count(*) FROM effects", &[])
        .expect("count")
        .get(0);
    assert_eq!(effects, 1);

    let mut txn = c.transaction().expect("begin");
    let e = PgWriteIn::lock_in(&mut txn, "never registered")
        .map(drop)
        .expect_err("no row");
    assert!(matches!(e.kind(), ErrorKind::NotAJournal { .. }), "{e}");
}

#[test]
fn a_terminated_backend_is_unavailable_and_the_pool_recovers() {
    let db = db_or_skip!("terminate");
    let mut cfg = db.cfg("j");
    cfg.pool_size = 2;
    let pg = Pg::connect(cfg).expect("connect");
    let mut admin = db.client();
    let kill = |admin: &mut postgres::Client, pid: i32| {
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .expect("terminate");
        thread::sleep(Duration::from_millis(100));
    };

    // A read whose backend is terminated.
    let (r, _) = pg.read().expect("read");
    kill(&mut admin, r.backend_pid().expect("pid"));
    let e = r.get(Events::ID, &[1]).expect_err("terminated");
    assert!(is_unavailable(&e), "{e:?}");
    assert!(!is_conflict(&e));
    let e = r.count(Events::ID).expect_err("still ended");
    assert!(is_unavailable(&e), "{e:?}");
    drop(r);

    // A write whose backend is terminated before COMMIT: the session's end is noticed
    // before COMMIT is sent, so the outcome is known: nothing was written.
    let (w, _) = pg.write(true).expect("write").expect("the lock");
    w.apply(&events([1])).expect("apply");
    kill(&mut admin, w.backend_pid().expect("pid"));
    let e = w.commit().expect_err("terminated");
    assert!(
        matches!(
            e.kind(),
            ErrorKind::Unavailable {
                outcome_unknown: false,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        pg.read().expect("read").0.count(Events::ID).expect("count"),
        0
    );

    // Idle pooled connections whose backends died (a restarted server) are replaced on
    // the next transaction, which does not fail.
    let reads: Vec<_> = (0..2).map(|_| pg.read().expect("read").0).collect();
    let pids: Vec<i32> = reads
        .iter()
        .map(|r| r.backend_pid().expect("pid"))
        .collect();
    drop(reads);
    for pid in pids {
        kill(&mut admin, pid);
    }
    let (w, _) = pg
        .write(true)
        .expect("a dead idle connection is replaced")
        .expect("lock");
    w.apply(&events([5])).expect("apply");
    w.commit().expect("commit");
    assert_eq!(
        pg.read().expect("read").0.count(Events::ID).expect("count"),
        1
    );
}

#[test]
fn two_journals_in_one_database_see_only_their_own_entries() {
    let db = db_or_skip!("two journals");
    let a = db.pg("a");
    let b = db.pg("b");
    let (w, _) = a.write(true).expect("write").expect("the lock");
    w.apply(&events(edge_keys())).expect("apply");
    w.commit().expect("commit");
    let (w, _) = b.write(true).expect("write").expect("the lock");
    assert_eq!(w.count(Events::ID).expect("count"), 0);
    w.apply(&events([1])).expect("apply");
    w.commit().expect("commit");

    let (ra, _) = a.read().expect("read");
    let (rb, _) = b.read().expect("read");
    assert_eq!(
        ra.count(Events::ID).expect("count"),
        edge_keys().len() as u64
    );
    assert_eq!(rb.count(Events::ID).expect("count"), 1);
    assert_eq!(rb.get(Events::ID, &0u64.to_be_bytes()).expect("get"), None);
    assert_eq!(
        rb.scan(Events::ID, Bound::Unbounded, Bound::Unbounded, 100)
            .expect("scan")
            .len(),
        1
    );
    assert!(a.describe().contains("journal `a`"), "{}", a.describe());
    assert_eq!(b.journal(), "b");
}

#[test]
fn the_pool_bounds_its_connections_and_waits_for_one() {
    let db = db_or_skip!("pool");
    let mut cfg = db.cfg("j");
    cfg.pool_size = 1;
    cfg.statement_timeout = Duration::from_millis(300);
    cfg.lock_timeout = Duration::from_millis(300);
    cfg.connect_timeout = Duration::from_millis(200);
    let pg = Pg::connect(cfg).expect("connect");
    let (r, t1) = pg.read().expect("read");
    let started = Instant::now();
    let e = pg
        .read()
        .map(drop)
        .expect_err("the only connection is leased");
    assert!(is_unavailable(&e), "{e:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "{:?}",
        started.elapsed()
    );
    let pg2 = pg.clone();
    let waiter = thread::spawn(move || pg2.read().map(|(_, t)| t));
    thread::sleep(Duration::from_millis(100));
    drop(r);
    let t2 = waiter
        .join()
        .expect("the waiter")
        .expect("a connection came back");
    assert!(t2 >= t1);
}

#[test]
fn a_writer_idle_past_its_timeout_frees_the_lock_and_writes_nothing() {
    let db = db_or_skip!("idle timeout");
    let mut cfg = db.cfg("j");
    cfg.idle_in_transaction_timeout = Duration::from_millis(200);
    let pg = Pg::connect(cfg).expect("connect");
    let other = db.pg("j");
    let (w, _) = pg.write(true).expect("write").expect("the lock");
    w.apply(&events([1])).expect("apply");
    assert!(other.write(false).expect("try").is_none(), "held");
    thread::sleep(Duration::from_millis(600));
    // The server ended the stalled session, which freed the lock.
    assert!(other.write(false).expect("try").is_some(), "freed");
    let e = w.commit().expect_err("the session ended");
    assert!(
        matches!(
            e.kind(),
            ErrorKind::Unavailable {
                outcome_unknown: false,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        other
            .read()
            .expect("read")
            .0
            .count(Events::ID)
            .expect("count"),
        0
    );
    // The pool replaced the lost connection.
    assert!(pg.write(true).expect("write").is_some());
}

/// A batch's DELETE reads the rows it deletes, not the journal, however the table grew
/// after the connection first ran it: a prepared DELETE's generic plan, made while the
/// table was small, turned into a scan of every row of the journal (pg_bench found 3 ms
/// per batch at 5,000 rows, under the writer lock). The count is the transaction's own
/// (`pg_stat_xact_user_tables`), so it does not wait for the statistics to be flushed.
#[test]
fn a_batch_delete_reads_only_its_rows_however_the_table_grew() {
    let db = db_or_skip!("delete_plan");
    let pg = db.pg("j");
    let mut client = db.client();
    let mut prepared = sql::Prepared::default();
    let journal = "j".to_string();
    let table = i16::from(Events::ID);
    let delete = |client: &mut postgres::Client, prepared: &mut sql::Prepared, k: u64| {
        let (tables, keys) = (vec![table], vec![k.to_be_bytes().to_vec()]);
        prepared
            .run(client, sql::Sql::Delete, &[&journal, &tables, &keys])
            .expect("delete")
    };
    let write = |m: Memtable| {
        let (w, _) = pg.write(true).expect("write").expect("the lock");
        w.apply(&m).expect("apply");
        w.commit().expect("commit");
    };
    // Deletes on a near-empty table, more than the 5 after which a prepared statement
    // may switch to its generic plan.
    for k in 0..10u64 {
        write(events([k]));
        assert_eq!(delete(&mut client, &mut prepared, k), 1);
    }
    write(events(1_000..21_000));
    client.batch_execute("BEGIN").expect("begin");
    assert_eq!(delete(&mut client, &mut prepared, 1_500), 1);
    let row = client
        .query_one(
            "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) \
             FROM pg_stat_xact_user_tables \
             WHERE relname = 'opjournal_kv' AND schemaname = current_schema()",
            &[],
        )
        .expect("the transaction's counts");
    let read: i64 = row.get(0);
    client.batch_execute("ROLLBACK").expect("rollback");
    assert!(
        read <= 100,
        "deleting 1 row of a journal of 20,000 read {read} rows"
    );
}
