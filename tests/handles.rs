//! Handles: clones share one open journal; the last one to close writes the log into the
//! redb file and removes it, and `close` reports what dropping cannot.

mod common;

use std::io;
use std::sync::Arc;

use common::{Env, FakeEditor, add_light, run_op};
use opjournal::{Admission, ErrorKind, FileLog, Journal, LogStorage, MemoryLog, Operation};

#[test]
fn clones_share_the_journal_and_the_last_close_leaves_one_file() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    let other = journal.clone();
    run_op(
        &other,
        &mut editor,
        Operation::new("a", add_light("a")),
        "a",
    )?;
    assert!(
        FileLog::path_for(&env.path).exists(),
        "an open journal has its log"
    );
    // Closing one of two handles refuses and leaves the journal open for the other.
    let err = journal.close().expect_err("another handle is open");
    assert!(
        matches!(err.kind(), ErrorKind::InvalidInput { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("1 other handle"), "{err}");
    run_op(
        &other,
        &mut editor,
        Operation::new("b", add_light("b")),
        "b",
    )?;
    other.close()?;
    assert!(
        !FileLog::path_for(&env.path).exists(),
        "closing the last handle removes the log"
    );
    let reopened = env.open();
    for id in ["a", "b"] {
        assert!(
            matches!(
                reopened.submit(Operation::new(id, add_light(id)))?,
                Admission::Replay(_)
            ),
            "{id} survives the close"
        );
    }
    Ok(())
}

#[test]
fn dropping_the_last_clone_closes_the_journal() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    let clones: Vec<Journal> = (0..3).map(|_| journal.clone()).collect();
    drop(journal);
    run_op(
        &clones[2],
        &mut editor,
        Operation::new("c", add_light("c")),
        "c",
    )?;
    drop(clones);
    assert!(!FileLog::path_for(&env.path).exists());
    let _reopened = env.open();
    Ok(())
}

/// A log that works until it is to be removed.
#[derive(Debug, Default)]
struct StickyLog(Arc<MemoryLog>);

impl LogStorage for StickyLog {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_at(offset, data)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn discard(&self) -> io::Result<()> {
        Err(io::Error::other("the disk refuses"))
    }
}

#[test]
fn close_reports_a_log_that_could_not_be_removed() -> opjournal::Result<()> {
    let journal = Journal::builder().open_backends(
        opjournal::redb::backends::InMemoryBackend::new(),
        StickyLog::default(),
        "sticky",
    )?;
    let err = journal.close().expect_err("removing the log fails");
    assert!(matches!(err.kind(), ErrorKind::Io), "{err:?}");
    assert!(
        err.to_string().contains("remove the journal's log"),
        "{err}"
    );
    Ok(())
}

/// One handle, one view: a delivery or an acknowledgement this handle recorded shows in
/// `history` as soon as `lookup` shows it, marked pending until it commits, and then
/// appears committed, once, with its position.
#[test]
fn history_shows_this_handles_pending_deliveries_and_acks_as_lookup_does() -> opjournal::Result<()>
{
    use opjournal::{DeliveryState, EventKind};
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(
        &journal,
        &mut editor,
        Operation::new("a", add_light("a")),
        "a",
    )?;
    let committed = journal.history("a")?;
    assert!(
        committed.iter().all(|e| !e.pending && e.seq > 0),
        "{committed:?}"
    );

    journal.delivered("a")?;
    let receipt = journal.lookup("a")?.expect("recorded");
    assert!(
        receipt.delivery == Some(DeliveryState::Delivered),
        "{receipt:?}"
    );
    let history = journal.history("a")?;
    assert_eq!(history.len(), committed.len() + 1, "{history:?}");
    let last = history.last().expect("an event");
    assert!(
        last.pending && last.seq == 0 && matches!(last.kind, EventKind::Delivered { .. }),
        "{last:?}"
    );

    journal.acknowledge("a", None)?;
    let history = journal.history("a")?;
    let pending: Vec<_> = history.iter().filter(|e| e.pending).collect();
    assert_eq!(pending.len(), 2, "{history:?}");
    assert!(
        matches!(pending[1].kind, EventKind::Acknowledged { .. }),
        "{history:?}"
    );

    // Committed: the same events, each once, now with positions.
    journal.flush()?;
    let flushed = journal.history("a")?;
    assert_eq!(flushed.len(), committed.len() + 2, "{flushed:?}");
    assert!(
        flushed.iter().all(|e| !e.pending && e.seq > 0),
        "{flushed:?}"
    );
    let kinds = |h: &[opjournal::Event]| h.iter().map(|e| e.kind.clone()).collect::<Vec<_>>();
    assert_eq!(kinds(&flushed), kinds(&history));
    Ok(())
}
