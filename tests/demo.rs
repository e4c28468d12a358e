//! `opjournal demo` runs its editor session over a real loopback socket: these tests run
//! the binary, read its JSON Lines transcript, and check the claims of its closing table
//! against the transcript itself and against the journal file it leaves behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use opjournal::{
    Clock, DeliveryState, EventKind, ExecutionStatus, InDoubtCause, Journal, SystemClock,
};
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One demo run in JSON mode, with its messages by type.
struct Run {
    _dir: tempfile::TempDir,
    journal: PathBuf,
    messages: Vec<Value>,
    elapsed: Duration,
}

impl Run {
    fn of_type(&self, kind: &str) -> Vec<&Value> {
        self.messages
            .iter()
            .filter(|m| m["type"] == kind)
            .map(|m| &m["data"])
            .collect()
    }

    fn summary(&self) -> &Value {
        self.messages
            .iter()
            .rev()
            .find(|m| m["type"] == "summary")
            .map_or(&Value::Null, |m| &m["data"])
    }

    /// Every result message the client received, in order.
    fn results(&self) -> Vec<&Value> {
        self.of_type("answer")
            .into_iter()
            .map(|a| &a["reply"])
            .filter(|r| r["type"] == "result")
            .collect()
    }
}

fn demo(journal: &Path, json: bool) -> std::io::Result<Output> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_opjournal"));
    if json {
        cmd.arg("--json");
    }
    cmd.arg("demo").arg("--journal").arg(journal);
    cmd.output()
}

fn run_json() -> Result<Run, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("demo.opj");
    let started = Instant::now();
    let out = demo(&journal, true)?;
    let elapsed = started.elapsed();
    let stdout = String::from_utf8(out.stdout)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "demo failed\nstderr:\n{stderr}\nstdout:\n{stdout}"
    );
    let messages = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()?;
    Ok(Run {
        _dir: dir,
        journal,
        messages,
        elapsed,
    })
}

#[test]
fn demo_applies_every_edit_exactly_once_at_every_boundary() -> TestResult {
    let run = run_json()?;
    let rows = run.of_type("row");
    let keys: Vec<&str> = rows.iter().filter_map(|r| r["key"].as_str()).collect();
    assert_eq!(
        keys,
        ["1", "2", "3", "4", "5", "6", "+", "+", "+"],
        "one row per boundary of DESIGN.md §5, then the mismatch, crash and expiry cases"
    );
    for row in &rows {
        assert_eq!(row["applied"], row["expected"], "{row}");
    }
    let expected: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["op"].as_str().unwrap_or("?"),
                r["expected"].as_u64().unwrap_or(9),
            )
        })
        .collect();
    assert_eq!(
        expected,
        [
            ("op_1", 1),
            ("op_2", 1),
            ("op_3", 1),
            ("op_4", 1),
            ("op_5", 1),
            ("op_7", 1),
            ("op_2", 0),
            ("op_8", 1),
            ("op_1", 1),
        ],
        "the reused id's other edit must land zero times, every other edit once"
    );
    let summary = run.summary();
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["problems"], Value::Array(Vec::new()));
    // The fields every command's summary starts with (docs/cli.md).
    assert_eq!(summary["command"], "demo", "{summary}");
    assert_eq!(summary["file"].as_str(), run.journal.to_str(), "{summary}");
    assert!(summary["elapsed_ms"].is_u64(), "{summary}");
    Ok(())
}

#[test]
fn demo_final_document_holds_each_edit_once() -> TestResult {
    let run = run_json()?;
    let doc = &run.summary()["document"];
    assert_eq!(doc["revision"], 8, "eight edits, one revision each: {doc}");
    let objects: BTreeMap<String, Value> = serde_json::from_value(doc["objects"].clone())?;
    let expected: BTreeMap<String, Value> = serde_json::from_value(serde_json::json!({
        "armchair": "table",
        "door": null,
        "lamp": "armchair",
        "reading light": "door",
        "rug": "table",
        "table": null,
        "window": null,
    }))?;
    assert_eq!(objects, expected);
    Ok(())
}

#[test]
fn demo_marks_every_repeated_result_as_a_replay() -> TestResult {
    let run = run_json()?;
    let mut by_op: BTreeMap<String, Vec<(bool, u64)>> = BTreeMap::new();
    for r in run.results() {
        let id = r["id"].as_str().unwrap_or("?").to_string();
        let replayed = r["replayed"].as_bool().ok_or("result without `replayed`")?;
        let delivery = r["delivery"].as_u64().ok_or("result without `delivery`")?;
        by_op.entry(id).or_default().push((replayed, delivery));
    }
    for (op, results) in &by_op {
        // Only the first sending of a new execution may go unmarked.
        let unmarked: Vec<usize> = (0..results.len()).filter(|&i| !results[i].0).collect();
        assert!(
            unmarked.is_empty() || (unmarked == [0] && results[0].1 == 1),
            "{op}: a repeated result was not marked as a replay: {results:?}"
        );
        for (i, &(_, delivery)) in results.iter().enumerate() {
            assert_eq!(
                delivery,
                results[0].1 + i as u64,
                "{op}: delivery numbers count up: {results:?}"
            );
        }
    }
    // The boundaries' own answers: op_3's first sight is a replay pushed on reconnect;
    // op_4's reload and retry are deliveries 2 and 3; op_8 is replayed after the crash.
    assert_eq!(by_op["op_3"], [(true, 1)]);
    assert_eq!(by_op["op_4"], [(false, 1), (true, 2), (true, 3)]);
    assert_eq!(by_op["op_2"], [(false, 1)]);
    assert_eq!(by_op["op_8"], [(true, 1)]);
    let texts: Vec<&str> = run
        .of_type("answer")
        .iter()
        .filter_map(|a| a["text"].as_str())
        .collect();
    assert!(
        texts.contains(
            &"op_4 already completed at revision 4 (replayed, delivery 2): added \"chair\" beside \"table\" - a duplicate of a result already shown, recognized by its id: ignored"
        ),
        "{texts:#?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("op_2 is already running") && t.contains("not applied again")),
        "{texts:#?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("op_1 finished at revision 1")
                && t.contains("refresh the document (now at revision 8) rather than retry")),
        "{texts:#?}"
    );
    Ok(())
}

#[test]
fn demo_reconnect_storm_stays_bounded() -> TestResult {
    let run = run_json()?;
    let storm = &run.summary()["storm"];
    let n = |k: &str| storm[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(n("connections"), 1, "old connections are let go: {storm}");
    assert_eq!(n("waiting"), 1, "only op_7 waits: {storm}");
    assert_eq!(
        n("pushes"),
        n("budget") - 1,
        "pushes stop once the retry budget is spent: {storm}"
    );
    assert!(n("pushes") < n("reloads"), "{storm}");
    assert_eq!(
        n("events_after") - n("events_before"),
        n("pushes"),
        "one delivery event per push, none per reconnect: {storm}"
    );
    Ok(())
}

#[test]
fn demo_leaves_a_journal_that_records_the_recovery() -> TestResult {
    let run = run_json()?;
    assert!(run.journal.exists());
    let journal = Journal::open(&run.journal)?;
    // The demo's clock started 8 days back and ended just before now: every result has
    // retired since, every audit record is kept, and no timestamp lies in the future.
    assert!(
        journal.stats()?.clock_high_water <= SystemClock.now(),
        "the demo left a clock high-water mark in the future"
    );
    for op in [
        "op_1", "op_2", "op_3", "op_4", "op_5", "op_6", "op_7", "op_8",
    ] {
        let receipt = journal.lookup(op)?.ok_or(format!("{op} is missing"))?;
        assert_eq!(receipt.status, ExecutionStatus::Retired, "{receipt:?}");
        assert_eq!(receipt.applied, Some(true), "{receipt:?}");
    }
    let op8 = journal.history("op_8")?;
    assert!(
        op8.iter().any(|e| matches!(
            e.kind,
            EventKind::LeaseExpired {
                cause: InDoubtCause::Reopened,
                ..
            }
        )),
        "op_8 was in doubt after the restart: {op8:?}"
    );
    assert!(
        op8.iter()
            .any(|e| matches!(e.kind, EventKind::Resolved { .. })),
        "op_8 was resolved by the editor: {op8:?}"
    );
    assert!(
        !op8.iter()
            .any(|e| matches!(e.kind, EventKind::Completed { .. })),
        "op_8 was never completed by a claim (the process died first): {op8:?}"
    );
    let op5 = journal.history("op_5")?;
    assert!(
        op5.iter().any(|e| matches!(e.kind, EventKind::AckExpired)),
        "op_5's acknowledgement expired: {op5:?}"
    );
    assert_eq!(
        journal.lookup("op_5")?.and_then(|r| r.delivery),
        Some(DeliveryState::AckExpired)
    );
    assert_eq!(journal.scope_revision("scene/main")?, 8);
    let op3 = journal.lookup("op_3")?.ok_or("op_3 is missing")?;
    assert_eq!(op3.attempt, 1, "op_3 ran once: {op3:?}");
    Ok(())
}

#[test]
fn demo_finishes_in_seconds() -> TestResult {
    let run = run_json()?;
    assert!(
        run.elapsed < Duration::from_secs(30),
        "the demo took {:?}",
        run.elapsed
    );
    Ok(())
}

#[test]
fn demo_text_tells_new_executions_from_replays_and_names_the_inspect_commands() -> TestResult {
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("demo.opj");
    let out = demo(&journal, false)?;
    let text = String::from_utf8(out.stdout)?;
    assert_eq!(out.status.code(), Some(0), "{text}");
    for needle in [
        "op_1 applied at revision 1 (new execution, delivery 1): added \"light\" beside \"door\"",
        "op_3 already completed at revision 3 (replayed, delivery 1): renamed \"light\" to \"reading light\"",
        "op_4 already completed at revision 4 (replayed, delivery 3)",
        "op_8 was in doubt (it was running when the service stopped); the document has its edit at revision 8: recorded as applied, not run again",
        "every edit landed exactly once",
        "final document, revision 8:",
        "opjournal ls ",
        "opjournal show ",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(journal.exists(), "the journal is left for inspection");
    assert!(
        !journal.with_extension("scene.json").exists(),
        "without --keep only the journal is left"
    );
    Ok(())
}

#[test]
fn demo_refuses_an_existing_journal_without_touching_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("demo.opj");
    std::fs::write(&journal, b"not mine")?;
    let out = demo(&journal, false)?;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr)?;
    assert!(stderr.contains("already exists"), "{stderr}");
    assert_eq!(std::fs::read(&journal)?, b"not mine");
    Ok(())
}
