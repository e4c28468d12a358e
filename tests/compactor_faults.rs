//! The background compactor when the disk fails: it stops cleanly, reports why, and the
//! journal refuses further writes until reopened.

mod common;
use opjournal_testkit::fault_backend;

use std::time::Duration;

use common::{T0, add_light};
use fault_backend::{DiskFile, EIO, FaultAction, FaultDisk, IoKind, Trigger};
use opjournal::{Admission, ErrorKind, Journal, ManualClock, Operation, Outcome};

#[test]
fn background_compactor_stops_with_the_error_when_a_sync_fails() -> opjournal::Result<()> {
    let disk = FaultDisk::new();
    let clock = ManualClock::new(T0);
    let journal = Journal::builder().clock(clock.clone()).open_backends(
        disk.backend(),
        disk.log(),
        "fault-disk",
    )?;
    let Admission::Fresh(claim) = journal.submit(Operation::new("a", add_light("door")))? else {
        panic!("fresh expected");
    };
    journal.complete(&claim, Outcome::applied(1, Vec::new()))?;
    let handle = journal.spawn_compactor(Duration::from_millis(1));
    // The next sync of the log fails, and every sync after it: the compactor's batch is the
    // next commit.
    disk.arm(Trigger::on(
        DiskFile::Log,
        IoKind::Sync,
        1,
        FaultAction::Fail {
            errno: EIO,
            persistent: true,
        },
    ));
    clock.advance(Duration::from_secs(16 * 60));
    let mut waited = 0;
    while !journal.is_poisoned() && waited < 2000 {
        std::thread::sleep(Duration::from_millis(5));
        waited += 5;
    }
    assert!(
        journal.is_poisoned(),
        "the failed commit did not poison the journal"
    );
    // The compactor ended by itself and says why, on the handle and when stopped; stopping
    // it does not panic.
    let mut waited = 0;
    while handle.is_running() && waited < 2000 {
        std::thread::sleep(Duration::from_millis(5));
        waited += 5;
    }
    assert!(
        !handle.is_running(),
        "a poisoned journal ends the compactor"
    );
    assert!(handle.errors() >= 1, "the failed pass is counted");
    let last = handle.last_error().expect("the failed pass is kept");
    assert!(matches!(last.kind(), ErrorKind::Poisoned), "{last:?}");
    let err = handle
        .stop()
        .expect("the compactor reports the error that ended it");
    assert!(matches!(err.kind(), ErrorKind::Poisoned), "{err:?}");
    // The journal refuses writes, reads still answer.
    let refused = journal
        .submit(Operation::new("b", add_light("x")))
        .expect_err("poisoned");
    assert!(matches!(refused.kind(), ErrorKind::Poisoned), "{refused:?}");
    assert!(refused.to_string().contains("open it again"), "{refused}");
    assert!(journal.lookup("a")?.is_some());
    drop(journal);
    assert_eq!(
        disk.stats().syncs_after_fault,
        0,
        "the log's failed sync was never retried, not even by closing the journal"
    );
    Ok(())
}

#[test]
fn a_healthy_background_compactor_runs_and_reports_no_errors() -> opjournal::Result<()> {
    let clock = ManualClock::new(T0);
    let dir = tempfile::tempdir().map_err(opjournal::Error::from)?;
    let journal = Journal::builder()
        .clock(clock.clone())
        .open(dir.path().join("journal.opj"))?;
    let Admission::Fresh(claim) = journal.submit(Operation::new("a", add_light("door")))? else {
        panic!("fresh expected");
    };
    journal.complete(&claim, Outcome::applied(1, Vec::new()))?;
    let events = journal.event_count()?;
    let handle = journal.spawn_compactor(Duration::from_millis(1));
    clock.advance(Duration::from_secs(16 * 60));
    // A pass records the acknowledgement timeout as an event.
    let mut waited = 0;
    while journal.event_count()? == events && waited < 2000 {
        std::thread::sleep(Duration::from_millis(5));
        waited += 5;
    }
    assert!(journal.event_count()? > events, "the compactor ran a pass");
    assert!(handle.is_running());
    assert_eq!(handle.errors(), 0);
    assert!(handle.last_error().is_none());
    assert!(handle.stop().is_none());
    Ok(())
}
