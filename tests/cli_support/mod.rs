//! Journals for the CLI tests, built through the library on a manual clock, and helpers to
//! run the `opjournal` binary.
//!
//! The clock starts at 2100-01-01T00:00:00Z, ahead of any real clock, so the journal's
//! high-water mark is "now" for the inspector (`max(system clock, high-water mark)`): every
//! "3 min ago" and every expiry in the output is the same on every run.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use opjournal::{
    Admission, Intent, Journal, ManualClock, Operation, Outcome, Resolution, Timestamp,
};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// 2100-01-01T00:00:00Z.
pub const T0: Timestamp = Timestamp::from_millis(4_102_444_800_000);

pub struct Sample {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub clock: ManualClock,
}

impl Sample {
    pub fn empty_dir() -> Sample {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("project.opj");
        Sample {
            dir,
            path,
            clock: ManualClock::new(T0),
        }
    }

    pub fn open(&self) -> Journal {
        Journal::builder()
            .clock(self.clock.clone())
            .open(&self.path)
            .expect("the journal opens")
    }

    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    pub fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).expect("the journal file is readable")
    }
}

fn intent(name: &str, args: serde_json::Value) -> Intent {
    Intent::from_json(name, &args).expect("a valid intent")
}

fn fresh(journal: &Journal, op: Operation) -> opjournal::Claim {
    match journal.submit(op).expect("submit") {
        Admission::Fresh(claim) => claim,
        other => panic!("expected fresh work, got {other:?}"),
    }
}

const MIN: Duration = Duration::from_secs(60);

/// The long result of `op_long`: 60 numbered lines, 3,000+ bytes.
pub fn long_result() -> String {
    (1..=60)
        .map(|i| format!("line {i:02}: the quick brown fox jumps over the lazy dog\n"))
        .collect()
}

/// A journal with one operation in each interesting state, closed:
///
/// | id | state |
/// |---|---|
/// | `op_doubt` | in doubt (the journal was reopened while it ran) |
/// | `op_7f3` | applied 183→184, delivered once, result with a changed asset |
/// | `op_ack` | applied 184→185, acknowledged |
/// | `op_fail` | failed |
/// | `op_long` | applied 1→2 with a 60-line result |
/// | `op_released` | released (not listed; counted as a released id) |
/// | `op_run` | running |
///
/// and a revision reported outside the journal for `doc/readme`. "Now" is T0 + 10 min.
pub fn sample() -> Sample {
    let s = Sample::empty_dir();
    {
        let j = s.open();
        let _ = fresh(
            &j,
            Operation::new(
                "op_doubt",
                intent("scene.move", serde_json::json!({"by": 3})),
            )
            .scope("scene/alt")
            .session("tab-2"),
        );
    }
    s.advance(Duration::from_secs(1));
    let j = s.open();
    s.advance(MIN);
    let c = fresh(
        &j,
        Operation::new(
            "op_7f3",
            intent("scene.add_light", serde_json::json!({"near": "door"})),
        )
        .scope("scene/main")
        .base_revision(183)
        .session("tab-1"),
    );
    j.complete(
        &c,
        Outcome::applied(184, br#"{"light":"light-1"}"#.to_vec())
            .changed_assets(["scene/main/light-1"]),
    )
    .expect("complete op_7f3");
    j.delivered("op_7f3").expect("delivered op_7f3");
    // Deliveries and acknowledgements may be committed lazily: commit them now, so their
    // events carry this moment.
    j.flush().expect("flush");
    s.advance(MIN);
    let c = fresh(
        &j,
        Operation::new(
            "op_ack",
            intent("scene.rename", serde_json::json!({"to": "Hall"})),
        )
        .scope("scene/main")
        .base_revision(184)
        .session("tab-1"),
    );
    j.complete(&c, Outcome::applied(185, b"renamed".to_vec()))
        .expect("complete op_ack");
    j.delivered("op_ack").expect("delivered op_ack");
    j.acknowledge("op_ack", Some("tab-1"))
        .expect("acknowledge op_ack");
    j.flush().expect("flush");
    s.advance(MIN);
    let c = fresh(
        &j,
        Operation::new(
            "op_fail",
            intent("export.render", serde_json::json!({"q": "high"})),
        )
        .scope("render/q")
        .session("tab-2"),
    );
    j.complete(&c, Outcome::failed("the door no longer exists"))
        .expect("complete op_fail");
    s.advance(MIN);
    let c = fresh(
        &j,
        Operation::new(
            "op_long",
            intent("doc.rewrite", serde_json::json!({"style": "terse"})),
        )
        .scope("doc/readme")
        .base_revision(1),
    );
    j.complete(&c, Outcome::applied(2, long_result().into_bytes()))
        .expect("complete op_long");
    s.advance(MIN);
    let c = fresh(
        &j,
        Operation::new("op_released", intent("scene.noop", serde_json::json!({}))),
    );
    j.release(&c).expect("release");
    s.advance(MIN);
    let _running = fresh(
        &j,
        Operation::new("op_run", intent("scene.move", serde_json::json!({"by": 1})))
            .scope("scene/alt"),
    );
    s.advance(4 * MIN);
    j.advance_revision("doc/readme", 5)
        .expect("advance revision");
    drop(j);
    s
}

/// What the corruption suite writes: `n` applied operations, each with a distinct result,
/// some delivered and acknowledged.
#[derive(Clone, Debug)]
pub struct Written {
    pub id: String,
    pub revision: u64,
    pub result: Vec<u8>,
}

pub fn many(n: usize) -> (Sample, Vec<Written>) {
    let s = Sample::empty_dir();
    let mut written = Vec::new();
    {
        let j = s.open();
        for i in 0..n {
            s.advance(Duration::from_secs(1));
            let id = format!("op_{i:03}");
            let revision = i as u64 + 1;
            let result = format!("result of {id}: {}", "r".repeat(100 + i % 50)).into_bytes();
            let c = fresh(
                &j,
                Operation::new(id.clone(), intent("doc.edit", serde_json::json!({"n": i})))
                    .scope("doc/main")
                    .base_revision(revision - 1)
                    .session(format!("tab-{}", i % 3)),
            );
            j.complete(&c, Outcome::applied(revision, result.clone()))
                .expect("complete");
            if i % 2 == 0 {
                j.delivered(&id).expect("delivered");
            }
            if i % 4 == 0 {
                j.acknowledge(&id, Some(&format!("tab-{}", i % 3)))
                    .expect("acknowledge");
            }
            j.flush().expect("flush");
            written.push(Written {
                id,
                revision,
                result,
            });
        }
        j.flush().expect("flush");
    }
    (s, written)
}

/// Resolves `id` through the library (for tests that set up an in-doubt operation).
pub fn resolve(s: &Sample, id: &str, r: Resolution) {
    s.open().resolve(id, r).expect("resolve");
}

/// The `opjournal` binary with `args`.
pub fn opjournal(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_opjournal"));
    cmd.args(args);
    cmd
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

/// Runs `opjournal args...` and returns its output.
pub fn run(args: &[&str]) -> Output {
    opjournal(args).output().expect("opjournal runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The exit code, with the output in the panic message if there is none.
pub fn code(o: &Output) -> i32 {
    o.status
        .code()
        .unwrap_or_else(|| panic!("killed by a signal: {}{}", stdout(o), stderr(o)))
}

/// Every stdout line parsed as JSON, asserting the envelope `{"type": string, "data": _}`
/// and that the last line is the summary.
pub fn json_lines(o: &Output) -> Vec<(String, serde_json::Value)> {
    let text = stdout(o);
    let mut out = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let obj = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {line}"));
        assert_eq!(
            obj.len(),
            2,
            "the envelope has exactly `type` and `data`: {line}"
        );
        let ty = obj
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or_else(|| panic!("no string `type`: {line}"))
            .to_string();
        let data = obj
            .get("data")
            .unwrap_or_else(|| panic!("no `data`: {line}"))
            .clone();
        out.push((ty, data));
    }
    assert_eq!(
        out.last().map(|(t, _)| t.as_str()),
        Some("summary"),
        "the last line is the summary:\n{text}"
    );
    out
}
