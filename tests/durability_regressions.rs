//! Regression tests for durability bugs found by the seeded crash runs (`tests/crash.rs`),
//! each named after the claim it protects. Those that reopen the journal do it three ways:
//! a file closed cleanly (a checkpoint, the log removed), and the two-file fault disk
//! after the process died (the log replayed) or the power failed (only what was synced).

use opjournal_testkit::fault_backend;

use std::time::Duration;

use fault_backend::{CutPolicy, FaultDisk};
use opjournal::{Journal, ManualClock, Timestamp};

// ---------------------------------------------------------------------------------------
// Regressions: bugs the seeded runs found, each pinned by the claim it broke.
// ---------------------------------------------------------------------------------------

const T0: u64 = 1_767_225_600_000;
const ACK_TIMEOUT: Duration = Duration::from_secs(5);
const RESULT_RETENTION: Duration = Duration::from_secs(10);

fn builder(clock: &ManualClock) -> opjournal::JournalBuilder {
    Journal::builder()
        .ack_timeout(ACK_TIMEOUT)
        .result_retention(RESULT_RETENTION)
        .audit_retention(Duration::from_secs(20))
        .clock(clock.clone())
}

fn file_journal(dir: &std::path::Path, clock: &ManualClock) -> opjournal::Result<Journal> {
    builder(clock).open(dir.join("journal.opj"))
}

/// How a regression's journal ends before it is opened again.
#[derive(Clone, Copy, Debug)]
enum Reopen {
    /// A file, closed cleanly.
    CleanClose,
    /// The fault disk, the process killed: every write kept, the log replayed.
    ProcessCrash,
    /// The fault disk, the power cut: only what was synced kept.
    PowerCut,
}

const REOPENS: [Reopen; 3] = [Reopen::CleanClose, Reopen::ProcessCrash, Reopen::PowerCut];

/// Where a regression's journal lives: a file in `dir`, or the fault disk.
struct Store {
    dir: tempfile::TempDir,
    disk: FaultDisk,
    how: Reopen,
}

impl Store {
    fn new(how: Reopen) -> opjournal::Result<Store> {
        Ok(Store {
            dir: tempfile::tempdir()?,
            disk: FaultDisk::new(),
            how,
        })
    }

    fn open(&self, clock: &ManualClock) -> opjournal::Result<Journal> {
        match self.how {
            Reopen::CleanClose => file_journal(self.dir.path(), clock),
            _ => builder(clock).open_backends(self.disk.backend(), self.disk.log(), "fault-disk"),
        }
    }

    /// Ends `j` as this store's way says, and opens the journal again.
    fn reopen(&mut self, j: Journal, clock: &ManualClock) -> opjournal::Result<Journal> {
        match self.how {
            Reopen::CleanClose => drop(j),
            Reopen::ProcessCrash => {
                let image = self.disk.live_image();
                self.disk.cut();
                drop(j);
                self.disk = FaultDisk::from_image(image);
            }
            Reopen::PowerCut => {
                self.disk.cut();
                drop(j);
                let image = self.disk.power_cut_image(CutPolicy::DropAll, &mut || 0);
                self.disk = FaultDisk::from_image(image);
            }
        }
        self.open(clock)
    }
}

fn finished(j: &Journal, id: &str) -> opjournal::Result<()> {
    use opjournal::{Admission, Intent, Operation, Outcome};
    let op = Operation::new(id, Intent::from_json("scene.edit", &serde_json::json!({}))?)
        .scope("scene/a")
        .session("tab-1");
    let Admission::Fresh(claim) = j.submit(op)? else {
        panic!("expected fresh work for `{id}`")
    };
    j.complete(&claim, Outcome::applied(1, b"result".to_vec()))?;
    Ok(())
}

/// Found by seed 0xa11ce5eed00008b: an acknowledgement made before its deadline was
/// committed (with the next batch) as of that batch's time, after the deadline — the
/// receipt changed its `acknowledged_at` from what `acknowledge` had answered.
#[test]
fn lazy_acknowledgement_is_committed_with_the_time_it_was_made() -> opjournal::Result<()> {
    for how in REOPENS {
        lazy_acknowledgement_committed_as_made(how)?;
    }
    Ok(())
}

fn lazy_acknowledgement_committed_as_made(how: Reopen) -> opjournal::Result<()> {
    use opjournal::{DeliveryState, EventKind};
    let mut store = Store::new(how)?;
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let j = store.open(&clock)?;
    finished(&j, "op-1")?;
    clock.advance(Duration::from_secs(1));
    let acked = j.acknowledge("op-1", Some("tab-1"))?;
    let t1 = Timestamp::from_millis(T0 + 1_000);
    assert_eq!(acked.acknowledged_at, Some(t1));
    // Past the ack deadline, a write commits the pending acknowledgement.
    clock.advance(ACK_TIMEOUT + Duration::from_secs(1));
    j.advance_revision("scene/b", 1)?;
    let r = j.lookup("op-1")?.expect("recorded");
    assert_eq!(r.delivery, Some(DeliveryState::Acknowledged));
    assert_eq!(r.acknowledged_at, Some(t1), "committed as answered");
    let ack = j
        .history("op-1")?
        .into_iter()
        .find(|e| matches!(e.kind, EventKind::Acknowledged { .. }))
        .expect("the acknowledgement is in the history");
    assert_eq!(ack.at, t1);
    assert!(
        matches!(ack.kind, EventKind::Acknowledged { late: false }),
        "made before the deadline, so not late: {ack:?}"
    );
    let j = store.reopen(j, &clock)?;
    let r = j.lookup("op-1")?.expect("recorded");
    assert_eq!(
        r.acknowledged_at,
        Some(t1),
        "and so it stays after a reopen ({how:?})"
    );
    Ok(())
}

/// Found with the same runs: a delivery recorded while the result was retrievable was
/// dropped when the batch that committed it ran after the result retention, so an `Ok`
/// `delivered` vanished without any crash.
#[test]
fn lazy_delivery_made_before_retirement_is_kept_when_committed_after() -> opjournal::Result<()> {
    for how in REOPENS {
        lazy_delivery_kept_after_retirement(how)?;
    }
    Ok(())
}

fn lazy_delivery_kept_after_retirement(how: Reopen) -> opjournal::Result<()> {
    use opjournal::ExecutionStatus;
    let mut store = Store::new(how)?;
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let j = store.open(&clock)?;
    finished(&j, "op-1")?;
    let shown = j.delivered("op-1")?;
    assert_eq!(shown.delivery_count, 1);
    clock.advance(RESULT_RETENTION + Duration::from_secs(1));
    j.advance_revision("scene/b", 1)?;
    let r = j.lookup("op-1")?.expect("the audit record stays");
    assert_eq!(r.status, ExecutionStatus::Retired);
    assert_eq!(r.delivery_count, 1, "the delivery answered Ok is recorded");
    let j = store.reopen(j, &clock)?;
    assert_eq!(
        j.lookup("op-1")?.map(|r| r.delivery_count),
        Some(1),
        "{how:?}"
    );
    Ok(())
}

/// Found by seed 0xa11ce5eed0000c5: a delivery pending in the lazy buffer moves the
/// operation's next push, but `due_redeliveries` read only the committed timer index, so a
/// result whose next push was due was left out (and others listed out of order) until the
/// next commit.
#[test]
fn due_redeliveries_follow_a_delivery_not_yet_committed() -> opjournal::Result<()> {
    use opjournal::{Admission, Intent, Operation, Outcome, RetryPolicy};
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let initial = Duration::from_secs(1);
    let j = Journal::builder()
        .retry_policy(RetryPolicy {
            attempts: 3,
            initial_backoff: initial,
            max_backoff: Duration::from_secs(4),
        })
        .clock(clock.clone())
        .open(dir.path().join("journal.opj"))?;
    // The first push is due `initial` after the outcome; a delivery made at once schedules
    // the next one after a jitter in [0, initial]. Pick an operation whose jitter is short.
    let mut found = None;
    for i in 0..16 {
        let id = format!("op-{i}");
        let op = Operation::new(id.as_str(), Intent::from_json("x", &serde_json::json!({}))?);
        let Admission::Fresh(claim) = j.submit(op)? else {
            panic!("expected fresh work")
        };
        j.complete(&claim, Outcome::applied(1, b"r".to_vec()))?;
        let r = j.delivered(&id)?;
        let next = r.next_delivery_at.expect("a next push is scheduled");
        if next < j.now().saturating_add(initial) {
            found = Some((id, next));
            break;
        }
    }
    let (id, next) = found.expect("some jitter is shorter than the full backoff");
    clock.set(next);
    let due: Vec<String> = j
        .due_redeliveries(16)?
        .into_iter()
        .map(|r| r.receipt.operation_id)
        .collect();
    assert!(
        due.contains(&id),
        "`{id}` is due at {next} after its pending delivery: {due:?}"
    );
    Ok(())
}

/// Found by the kill -9 harness (`tools/src/bin/killer.rs`, seed 0xc0ffee000000023): a
/// process killed while `Journal::open` was creating a new file left a file without the
/// storage engine's signature (it writes the signature last), which every later
/// `Journal::open` refused: the journal could never be opened again without deleting it.
///
/// The kill must land *while a journal is being created*, or the test proves nothing (a
/// single creation per child, killed at a guessed moment, mostly landed before it started
/// or after it ended). So the child creates journals one after another (`journal-0.opj`,
/// `journal-1.opj`, ...; creating is most of what it does) and is killed once it is under
/// way: once a creation has started (its temporary file, `.journal-N.opj.creating-*`, is
/// there; a creation builds the file under it and links it into place). A temporary file
/// left behind proves the kill landed inside a creation; the test asserts that this
/// happened in at least three runs. After every kill,
/// every journal present opens, and each interrupted one can be created (or opened) again.
#[test]
fn a_crash_while_creating_a_journal_never_leaves_a_file_that_cannot_be_opened()
-> opjournal::Result<()> {
    const CHILD: &str = "OPJ_CREATE_CHILD";
    const WANTED: usize = 3;
    if let Ok(dir) = std::env::var(CHILD) {
        // The child: create journals, one after another, until it is killed.
        let dir = std::path::PathBuf::from(dir);
        for n in 0..100_000u64 {
            drop(Journal::open(dir.join(format!("journal-{n}.opj")))?);
        }
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let (mut runs, mut interrupted, mut complete) = (0u64, 0usize, 0usize);
    while interrupted < WANTED && runs < 40 {
        runs += 1;
        let dir = tempfile::tempdir()?;
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "a_crash_while_creating_a_journal_never_leaves_a_file_that_cannot_be_opened",
                "--nocapture",
            ])
            .env(CHILD, dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        // Under way: a second journal exists, and a creation has started (its temporary
        // file is there). Then the kill, a moment later, varied per run to spread the kills
        // over the creation's writes and syncs.
        let started = std::time::Instant::now();
        let creating = |dir: &std::path::Path| -> std::io::Result<bool> {
            for entry in std::fs::read_dir(dir)? {
                if entry?.file_name().to_string_lossy().contains(".creating-") {
                    return Ok(true);
                }
            }
            Ok(false)
        };
        while !dir.path().join("journal-1.opj").exists() {
            if let Some(status) = child.try_wait()? {
                panic!("the child stopped before creating two journals: {status}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the child created no journals"
            );
        }
        // (At most a few milliseconds: a build that created the file in place, without
        // a temporary name, is killed anyway, and must then leave a file that opens.)
        let under_way = std::time::Instant::now();
        while !creating(dir.path())? && under_way.elapsed() < Duration::from_millis(5) {}
        std::thread::sleep(Duration::from_micros(50 * (runs % 3)));
        child.kill()?;
        child.wait()?;
        let mut names: Vec<String> = std::fs::read_dir(dir.path())?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        names.sort();
        for name in &names {
            if name.starts_with("journal-") && name.ends_with(".opj") {
                let j = Journal::open(dir.path().join(name)).unwrap_or_else(|e| {
                    panic!("`{name}`, present after a kill during creation, must open: {e}")
                });
                assert_eq!(j.event_count()?, 0, "{name}");
                complete += 1;
            }
        }
        let temporaries: Vec<&String> = names.iter().filter(|n| n.contains(".creating-")).collect();
        if !temporaries.is_empty() {
            interrupted += 1;
        }
        for tmp in temporaries {
            // `.journal-N.opj.creating-...`: the creation of `journal-N.opj` was cut.
            let name = tmp
                .strip_prefix('.')
                .and_then(|t| t.split(".creating-").next())
                .unwrap_or_else(|| panic!("a temporary file named `{tmp}`"));
            let j = Journal::open(dir.path().join(name)).unwrap_or_else(|e| {
                panic!("`{name}`, whose creation a kill cut, must be creatable again: {e}")
            });
            assert_eq!(j.event_count()?, 0, "{name}");
        }
    }
    assert!(
        interrupted >= WANTED,
        "only {interrupted} of {runs} kills landed while a journal was being created \
         (a temporary file left behind); the claim was not exercised"
    );
    eprintln!("{runs} kills, {interrupted} during a creation; {complete} journals present opened");
    Ok(())
}

/// Found by the strace harness (`killer --strace --seed 0xc0ffee000000063`): a delivery
/// recorded while the last one of the retry budget was still pending (not committed) did
/// not see that the budget had been spent meanwhile: it scheduled yet another push, and
/// the receipt it answered (`Delivered`, with a next push) disagreed with every read
/// before it and with what was committed (`Exhausted`).
#[test]
fn a_delivery_after_the_budget_is_spent_keeps_it_spent_while_the_last_is_pending()
-> opjournal::Result<()> {
    use opjournal::{Admission, DeliveryState, Intent, Operation, Outcome, RetryPolicy};
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let j = Journal::builder()
        .retry_policy(RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(400),
        })
        .clock(clock.clone())
        .open(dir.path().join("journal.opj"))?;
    let op = Operation::new("op-1", Intent::from_json("x", &serde_json::json!({}))?);
    let Admission::Fresh(claim) = j.submit(op)? else {
        panic!("expected fresh work")
    };
    j.complete(&claim, Outcome::applied(1, b"r".to_vec()))?;
    for _ in 0..3 {
        j.delivered("op-1")?;
    }
    // The third delivery spent the budget: it is exhausted from then on.
    clock.advance(Duration::from_secs(1));
    let seen = j.lookup("op-1")?.expect("recorded");
    assert_eq!(seen.delivery, Some(DeliveryState::Exhausted));
    let fourth = j.delivered("op-1")?;
    assert_eq!(
        fourth.delivery,
        Some(DeliveryState::Exhausted),
        "{fourth:?}"
    );
    assert_eq!(fourth.delivery_count, 4);
    assert_eq!(
        fourth.next_delivery_at, None,
        "no further push is scheduled"
    );
    j.flush()?;
    assert_eq!(j.lookup("op-1")?, Some(fourth), "committed as answered");
    Ok(())
}
