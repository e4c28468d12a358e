//! A journal in PostgreSQL, in one process: the effect and the receipt in the embedder's
//! own transaction (`Journal::execute_in`), handles sharing one journal, the schema and
//! journal names. Every test starts its own server (`PgCluster`); without PostgreSQL
//! installed they skip, unless `OPJOURNAL_PG_REQUIRED=1` (CI) makes that a failure.
//! Several processes: tests/postgres_processes.rs.

use std::sync::atomic::{AtomicU32, Ordering};

use opjournal::postgres::{Client, NoTls};
use opjournal::{
    Admission, ErrorKind, ExecuteError, Executed, Failure, Intent, Journal, Operation, Outcome,
};
use opjournal_testkit::pg::PgCluster;

fn op(id: &str, n: i64) -> Operation {
    let intent =
        Intent::from_json("shop.add_item", &serde_json::json!({ "n": n })).expect("a valid intent");
    Operation::new(id, intent)
}

/// A journal name no other test uses.
fn name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn client(cluster: &PgCluster) -> Client {
    let mut c = Client::connect(&cluster.url(), NoTls).expect("a connection");
    c.batch_execute("CREATE TABLE IF NOT EXISTS items (id text primary key, n bigint not null)")
        .expect("the effect's table");
    c
}

fn items(c: &mut Client) -> i64 {
    c.query_one("SELECT count(*) FROM items", &[])
        .expect("a count")
        .get(0)
}

#[test]
fn execute_in_commits_the_effect_and_the_receipt_together() -> Result<(), Box<dyn std::error::Error>>
{
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let journal = Journal::builder().open_postgres(&cluster.url(), &name())?;
    let mut c = client(&cluster);
    let mut runs = 0;
    for _ in 0..2 {
        let mut txn = c.transaction()?;
        let done = journal.execute_in(&mut txn, op("op_1", 5), |txn, _claim| {
            runs += 1;
            txn.execute("INSERT INTO items VALUES ('a', 5)", &[])
                .map_err(Failure::failed)?;
            Ok::<_, Failure<std::io::Error>>(Outcome::applied(1, b"item a".to_vec()))
        })?;
        txn.commit()?;
        assert_eq!(
            done.result().map(|r| r.bytes.clone()),
            Some(b"item a".to_vec())
        );
    }
    assert_eq!(runs, 1, "the second call is a replay: the effect ran once");
    assert_eq!(items(&mut c), 1);
    let receipt = journal.lookup("op_1")?.expect("recorded");
    assert_eq!(receipt.status, opjournal::ExecutionStatus::Applied);
    assert_eq!(receipt.result_revision, Some(1));
    Ok(())
}

#[test]
fn a_rolled_back_transaction_leaves_neither_effect_nor_claim_and_the_retry_runs_fresh()
-> Result<(), Box<dyn std::error::Error>> {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let journal = Journal::builder().open_postgres(&cluster.url(), &name())?;
    let mut c = client(&cluster);
    {
        // The embedder fails after the effect and before its commit (or crashes: its
        // connection closing rolls back the same way).
        let mut txn = c.transaction()?;
        let done = journal.execute_in(&mut txn, op("op_2", 7), |txn, _| {
            txn.execute("INSERT INTO items VALUES ('b', 7)", &[])
                .map_err(Failure::failed)?;
            Ok::<_, Failure<std::io::Error>>(Outcome::applied(1, b"item b".to_vec()))
        })?;
        assert!(!done.is_replay());
        txn.rollback()?;
    }
    assert_eq!(items(&mut c), 0, "no effect");
    assert_eq!(
        journal.lookup("op_2")?,
        None,
        "no claim: nothing is in doubt"
    );
    let mut txn = c.transaction()?;
    let again = journal.execute_in(&mut txn, op("op_2", 7), |txn, _| {
        txn.execute("INSERT INTO items VALUES ('b', 7)", &[])
            .map_err(Failure::failed)?;
        Ok::<_, Failure<std::io::Error>>(Outcome::applied(1, b"item b".to_vec()))
    })?;
    txn.commit()?;
    assert!(
        matches!(again, Executed::Fresh(..)),
        "the retry runs as new work: {again:?}"
    );
    assert_eq!(items(&mut c), 1);
    Ok(())
}

#[test]
fn a_not_applied_effect_frees_the_id_inside_the_transaction()
-> Result<(), Box<dyn std::error::Error>> {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let journal = Journal::builder().open_postgres(&cluster.url(), &name())?;
    let mut c = client(&cluster);
    let mut txn = c.transaction()?;
    let refused = journal.execute_in(&mut txn, op("op_3", 1), |_, _| {
        Err::<Outcome, _>(Failure::NotApplied("out of stock"))
    });
    txn.commit()?;
    match refused {
        Err(ExecuteError::NotApplied(why)) => assert_eq!(why, "out of stock"),
        other => panic!("expected NotApplied, got {other:?}"),
    }
    assert_eq!(journal.lookup("op_3")?, None);
    Ok(())
}

#[test]
fn handles_on_one_journal_share_it_and_other_journals_stay_apart()
-> Result<(), Box<dyn std::error::Error>> {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let shared = name();
    let a = Journal::builder().open_postgres(&cluster.url(), &shared)?;
    let b = Journal::builder().open_postgres(&cluster.url(), &shared)?;
    let other = Journal::builder().open_postgres(&cluster.url(), &name())?;
    let Admission::Fresh(claim) = a.submit(op("op_4", 1))? else {
        panic!("fresh on the first handle");
    };
    match b.submit(op("op_4", 1))? {
        Admission::InProgress(r) => assert_eq!(r.epoch, claim.epoch()),
        other => panic!("expected InProgress on the second handle, got {other:?}"),
    }
    let err = b
        .submit(op("op_4", 2))
        .expect_err("another intent under the same id");
    assert!(
        matches!(err.kind(), ErrorKind::IntentMismatch { .. }),
        "{err}"
    );
    a.complete(&claim, Outcome::applied(3, b"done".to_vec()))?;
    match b.submit(op("op_4", 1))? {
        Admission::Replay(r) => assert_eq!(r.result.bytes, b"done"),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert!(
        matches!(other.submit(op("op_4", 2))?, Admission::Fresh(_)),
        "another journal in the same database does not know the id"
    );
    Ok(())
}

#[test]
fn a_journal_written_by_a_newer_schema_is_refused() -> Result<(), Box<dyn std::error::Error>> {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let journal = Journal::builder().open_postgres(&cluster.url(), &name())?;
    drop(journal);
    cluster.psql("UPDATE opjournal_schema SET version = version + 1")?;
    let err = Journal::builder()
        .open_postgres(&cluster.url(), &name())
        .expect_err("a newer schema");
    assert!(
        matches!(err.kind(), ErrorKind::UnsupportedFormat { .. }),
        "{err}"
    );
    Ok(())
}

#[test]
fn an_unreachable_server_is_a_typed_retryable_error() {
    // Nothing listens on port 9 of loopback.
    let err = Journal::builder()
        .open_postgres("postgresql://postgres@127.0.0.1:9/postgres", "j")
        .expect_err("no server");
    assert!(matches!(err.kind(), ErrorKind::Unavailable { .. }), "{err}");
    assert!(err.is_retryable(), "{err}");
}
