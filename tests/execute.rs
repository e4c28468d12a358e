//! `Journal::execute`: every admission, each way the closure can end, and typed results.

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::{Env, add_light};
use opjournal::{
    Admission, ErrorKind, ExecuteError, Executed, ExecutionStatus, Failure, OpResult, Operation,
    Outcome,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Added {
    light: String,
}

fn op(id: &str) -> Operation {
    Operation::new(id, add_light("door")).scope("scene/main")
}

fn applied(revision: u64) -> Result<Outcome, Failure<String>> {
    Outcome::applied_json(
        revision,
        &Added {
            light: "light-1".into(),
        },
    )
    .map_err(Failure::failed)
}

#[test]
fn fresh_work_runs_once_and_its_retry_is_replayed_without_running()
-> Result<(), Box<dyn std::error::Error>> {
    let env = Env::new();
    let journal = env.open();
    let runs = Cell::new(0);
    let first = journal
        .execute(op("op_1"), |claim| {
            runs.set(runs.get() + 1);
            assert_eq!(claim.operation_id(), "op_1");
            applied(1)
        })
        .map_err(|e| e.to_string())?;
    let Executed::Fresh(receipt, result) = &first else {
        panic!("expected fresh work, got {first:?}");
    };
    assert_eq!(receipt.status, ExecutionStatus::Applied);
    assert_eq!(receipt.result_revision, Some(1));
    assert_eq!(result.json::<Added>()?.light, "light-1");
    assert!(!first.is_replay());

    let again = journal
        .execute(op("op_1"), |_| -> Result<Outcome, Failure<String>> {
            panic!("a recorded operation must not run again")
        })
        .map_err(|e| e.to_string())?;
    assert!(again.is_replay(), "{again:?}");
    assert_eq!(again.result(), first.result());
    assert_eq!(runs.get(), 1);
    Ok(())
}

#[test]
fn a_failure_after_the_effect_started_is_recorded_and_replayed()
-> Result<(), Box<dyn std::error::Error>> {
    let env = Env::new();
    let journal = env.open();
    let answer = journal
        .execute(op("op_1"), |_| -> Result<Outcome, Failure<String>> {
            Err(Failure::Failed("the disk filled up mid-write".into()))
        })
        .map_err(|e| e.to_string())?;
    let Executed::Fresh(receipt, _) = &answer else {
        panic!("a recorded failure is fresh work, got {answer:?}");
    };
    assert_eq!(receipt.status, ExecutionStatus::Failed);
    assert_eq!(
        receipt.failure.as_deref(),
        Some("the disk filled up mid-write")
    );
    let again = journal
        .execute(op("op_1"), |_| -> Result<Outcome, Failure<String>> {
            panic!("a recorded failure must not run again")
        })
        .map_err(|e| e.to_string())?;
    assert_eq!(again.receipt().status, ExecutionStatus::Failed);
    assert!(again.is_replay());
    Ok(())
}

#[test]
fn a_rejection_before_any_effect_releases_the_id_for_a_later_attempt() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let err = journal
        .execute(op("op_1"), |_| -> Result<Outcome, Failure<&str>> {
            Err(Failure::NotApplied("the door is gone"))
        })
        .expect_err("rejected");
    assert!(
        matches!(err, ExecuteError::NotApplied("the door is gone")),
        "{err:?}"
    );
    assert_eq!(journal.lookup("op_1")?, None, "the id is unknown again");
    // The scope lock was released with the claim, and the next attempt runs.
    let retry = journal
        .execute(op("op_1"), |_| applied(1))
        .expect("the retry runs");
    assert_eq!(retry.receipt().attempt, 2);
    Ok(())
}

#[test]
fn known_ids_in_progress_or_in_doubt_are_answered_without_running() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let Admission::Fresh(_claim) = journal.submit(op("op_1"))? else {
        panic!("fresh");
    };
    let never =
        |_: &opjournal::Claim| -> Result<Outcome, Failure<String>> { panic!("must not run") };
    let running = journal.execute(op("op_1"), never).expect("answered");
    assert!(
        matches!(&running, Executed::InProgress(r) if r.status == ExecutionStatus::Running),
        "{running:?}"
    );
    assert_eq!(running.result(), None);
    // The claim holder vanished: reopening makes the operation in doubt.
    drop(journal);
    let journal = env.open();
    let doubt = journal.execute(op("op_1"), never).expect("answered");
    assert!(matches!(doubt, Executed::InDoubt(_)), "{doubt:?}");
    Ok(())
}

#[test]
fn an_aged_out_result_is_answered_expired_without_running() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let first = journal
        .execute(op("op_1"), |_| applied(1))
        .expect("applied");
    assert!(matches!(first, Executed::Fresh(..)), "{first:?}");
    env.advance(Duration::from_secs(8 * 24 * 3600));
    let expired = journal
        .execute(op("op_1"), |_| -> Result<Outcome, Failure<String>> {
            panic!("must not run")
        })
        .expect("answered");
    assert!(
        matches!(&expired, Executed::Expired(r) if r.status == ExecutionStatus::Retired),
        "{expired:?}"
    );
    assert_eq!(expired.receipt().result_revision, Some(1));
    Ok(())
}

#[test]
fn a_refused_submit_does_not_run_the_closure() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let Admission::Fresh(_holder) = journal.submit(op("op_1"))? else {
        panic!("fresh");
    };
    let err = journal
        .execute(
            op("op_2"),
            |_| -> Result<Outcome, Failure<std::io::Error>> { panic!("must not run") },
        )
        .expect_err("the scope is busy");
    match &err {
        ExecuteError::Journal(e) => {
            assert!(matches!(e.kind(), ErrorKind::ScopeBusy { .. }), "{e:?}");
            assert!(e.is_retryable());
        }
        other => panic!("expected a journal refusal, got {other:?}"),
    }
    assert!(std::error::Error::source(&err).is_some());
    Ok(())
}

#[test]
fn an_outcome_the_journal_refuses_comes_back_with_its_claim_to_complete_again()
-> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    journal.advance_revision("scene/main", 5)?;
    let err = journal
        .execute(op("op_1").base_revision(5), |_| applied(3))
        .expect_err("revision 3 does not move the scope forward");
    let ExecuteError::Unrecorded(unrecorded) = err else {
        panic!("expected an unrecorded outcome, got {err:?}");
    };
    let opjournal::Unrecorded {
        claim,
        outcome,
        error,
        ..
    } = *unrecorded;
    assert!(
        matches!(error.kind(), ErrorKind::RevisionNotForward { .. }),
        "{error:?}"
    );
    assert_eq!(outcome.kind(), Outcome::applied(3, Vec::new()).kind());
    // The claim is still usable: record the corrected outcome.
    let receipt = journal.complete(&claim, Outcome::applied(6, b"fixed".to_vec()))?;
    assert_eq!(receipt.result_revision, Some(6));
    Ok(())
}

#[test]
fn a_panic_in_the_work_is_recorded_as_a_failure_and_re_raised() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        journal.execute(op("op_1"), |_| -> Result<Outcome, Failure<String>> {
            panic!("the renderer crashed")
        })
    }));
    let payload = caught.expect_err("the panic continues in the caller");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"the renderer crashed")
    );
    let receipt = journal.lookup("op_1")?.expect("recorded");
    assert_eq!(receipt.status, ExecutionStatus::Failed);
    assert_eq!(
        receipt.failure.as_deref(),
        Some("the operation panicked: the renderer crashed")
    );
    Ok(())
}

#[test]
fn typed_results_round_trip_and_a_wrong_type_is_a_typed_error() -> opjournal::Result<()> {
    let outcome = Outcome::applied_json(
        7,
        &Added {
            light: "light-7".into(),
        },
    )?;
    assert_eq!(
        outcome.kind(),
        Outcome::applied(7, Vec::new()).kind(),
        "applied at revision 7"
    );
    let result = OpResult {
        bytes: br#"{"light":"light-7"}"#.to_vec(),
        changed_assets: Vec::new(),
    };
    assert_eq!(
        result.json::<Added>()?,
        Added {
            light: "light-7".into()
        }
    );
    let err = result.json::<Vec<u32>>().expect_err("not a list");
    assert!(
        matches!(err.kind(), ErrorKind::InvalidInput { .. }),
        "{err:?}"
    );
    let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let err = Outcome::applied_json(7, &bad).expect_err("non-string keys are not JSON");
    assert!(
        matches!(err.kind(), ErrorKind::InvalidInput { .. }),
        "{err:?}"
    );
    Ok(())
}
