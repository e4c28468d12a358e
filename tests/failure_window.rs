//! The failure window (DESIGN.md §5) where it depends on the process dying: a crash while
//! the operation runs, after which reopening the file marks it in doubt. The boundaries
//! that do not (a disconnect at every boundary, the journal opened again where it implies a
//! restart) are conformance bodies run on every backend (tests/conformance.rs).

mod common;

use common::{Env, FakeEditor, add_light, fresh};
use opjournal::{
    Admission, ErrorKind, ExecutionStatus, InDoubtCause, Operation, Outcome, Resolution,
};

fn op(id: &str) -> Operation {
    Operation::new(id, add_light("door"))
        .scope("scene/main")
        .base_revision(183)
        .session("tab-1")
}

#[test]
fn crash_while_running_is_in_doubt_on_reopen_and_never_rerun() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    let claim = {
        let journal = env.open();
        let claim = fresh(&journal, op("op_7f3"));
        // The effect lands in the project, then the service dies before completing.
        editor.apply(&claim, "light");
        claim
    };
    let journal = env.open();
    match journal.submit(op("op_7f3"))? {
        Admission::InDoubt(receipt) => {
            assert_eq!(receipt.status, ExecutionStatus::InDoubt);
            assert_eq!(receipt.in_doubt_cause, Some(InDoubtCause::Reopened));
        }
        other => panic!("expected InDoubt, got {other:?}"),
    }
    assert_eq!(journal.in_doubt()?.len(), 1);
    // The embedder looks at the project, sees the light, and resolves.
    let receipt = journal
        .resolve("op_7f3", Resolution::applied(184, b"light-1".to_vec()))?
        .expect("resolved as applied");
    assert_eq!(receipt.status, ExecutionStatus::Applied);
    let Admission::Replay(replay) = journal.submit(op("op_7f3"))? else {
        panic!("expected a replay after resolution");
    };
    assert_eq!(replay.receipt.result_revision, Some(184));
    // The old claim's holder is gone; its claim no longer counts.
    let err = journal
        .complete(&claim, Outcome::applied(185, Vec::new()))
        .expect_err("stale claim");
    assert!(
        matches!(err.kind(), ErrorKind::StaleClaim { .. }),
        "{err:?}"
    );
    assert_eq!(editor.applications("op_7f3"), 1);
    Ok(())
}
