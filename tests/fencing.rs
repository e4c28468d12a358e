//! Fencing: a claim's lease epoch must be current for complete, release and extend.

mod common;

use std::time::Duration;

use common::{Env, add_light, fresh};
use opjournal::{Admission, ErrorKind, ExecutionStatus, Operation, Outcome, Resolution};

fn op(id: &str) -> Operation {
    Operation::new(id, add_light("door")).scope("scene")
}

fn assert_stale(err: &opjournal::Error) {
    assert!(
        matches!(err.kind(), ErrorKind::StaleClaim { .. }),
        "{err:?}"
    );
}

#[test]
fn claim_of_a_released_attempt_cannot_complete_release_or_extend_the_next_one()
-> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let old = fresh(&journal, op("a"));
    journal.release(&old)?;
    let new = fresh(&journal, op("a"));
    assert_ne!(old.epoch(), new.epoch());
    let before = common::snapshot(&journal, "a");
    let bytes = env.bytes();
    assert_stale(
        &journal
            .complete(&old, Outcome::applied(1, Vec::new()))
            .expect_err("stale"),
    );
    assert_stale(&journal.release(&old).expect_err("stale"));
    assert_stale(&journal.extend_lease(&old).expect_err("stale"));
    assert_eq!(common::snapshot(&journal, "a"), before);
    assert!(env.bytes() == bytes);
    // The current claim still works.
    journal.complete(&new, Outcome::applied(1, Vec::new()))?;
    Ok(())
}

#[test]
fn claim_whose_lease_expired_may_still_complete_while_nothing_resolved_it() -> opjournal::Result<()>
{
    let env = Env::new();
    let journal = env.open();
    let claim = fresh(&journal, op("a"));
    env.advance(Duration::from_secs(10 * 60));
    assert_eq!(
        journal.lookup("a")?.map(|r| r.status),
        Some(ExecutionStatus::InDoubt)
    );
    // Compaction records the expiry; the epoch is unchanged, so the holder may finish.
    assert_eq!(journal.compact()?.lease_expired, 1);
    let receipt = journal.complete(&claim, Outcome::applied(1, b"late".to_vec()))?;
    assert_eq!(receipt.status, ExecutionStatus::Applied);
    Ok(())
}

#[test]
fn claim_cannot_complete_after_the_embedder_resolved_the_operation() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let claim = fresh(&journal, op("a"));
    env.advance(Duration::from_secs(10 * 60));
    journal.resolve("a", Resolution::failed("checked: nothing happened"))?;
    let err = journal
        .complete(&claim, Outcome::applied(1, Vec::new()))
        .expect_err("resolved");
    assert_stale(&err);
    assert!(err.to_string().contains("resolved"), "{err}");
    assert_eq!(
        journal.lookup("a")?.map(|r| r.status),
        Some(ExecutionStatus::Failed)
    );
    Ok(())
}

#[test]
fn claim_cannot_complete_twice() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let claim = fresh(&journal, op("a"));
    journal.complete(&claim, Outcome::applied(1, b"first".to_vec()))?;
    let err = journal
        .complete(&claim, Outcome::applied(2, b"second".to_vec()))
        .expect_err("already completed");
    assert_stale(&err);
    let Admission::Replay(r) = journal.submit(op("a"))? else {
        panic!("expected replay");
    };
    assert_eq!(r.result.bytes, b"first");
    Ok(())
}

#[test]
fn lease_extension_moves_expiry_and_is_refused_once_expired() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let claim = fresh(&journal, op("a"));
    env.advance(Duration::from_secs(4 * 60));
    let extended = journal.extend_lease(&claim)?;
    assert_eq!(
        extended.lease_until(),
        common::T0.saturating_add(Duration::from_secs(9 * 60))
    );
    // Past the original lease but within the extension: still running.
    env.advance(Duration::from_secs(2 * 60));
    assert_eq!(
        journal.lookup("a")?.map(|r| r.status),
        Some(ExecutionStatus::Running)
    );
    env.advance(Duration::from_secs(3 * 60));
    let err = journal.extend_lease(&extended).expect_err("expired");
    assert!(
        matches!(err.kind(), ErrorKind::LeaseExpired { expired_at, .. } if *expired_at == extended.lease_until()),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn released_claim_cannot_complete() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let claim = fresh(&journal, op("a"));
    journal.release(&claim)?;
    assert_stale(
        &journal
            .complete(&claim, Outcome::applied(1, Vec::new()))
            .expect_err("released"),
    );
    assert_eq!(journal.lookup("a")?, None);
    Ok(())
}

#[test]
fn claim_from_before_a_not_applied_resolution_is_stale_for_the_next_attempt()
-> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let old = fresh(&journal, op("a"));
    env.advance(Duration::from_secs(6 * 60));
    assert_eq!(journal.resolve("a", Resolution::not_applied())?, None);
    let new = fresh(&journal, op("a"));
    assert_eq!(new.attempt(), 2);
    assert_stale(
        &journal
            .complete(&old, Outcome::applied(1, Vec::new()))
            .expect_err("stale"),
    );
    journal.complete(&new, Outcome::applied(1, Vec::new()))?;
    Ok(())
}
