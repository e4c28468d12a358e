//! Helpers shared by the integration tests: journals on real files with a manual clock,
//! and a fake editor that counts how often each effect is applied.
#![allow(dead_code)]

pub mod backends;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use opjournal::{
    Admission, Claim, Intent, Journal, JournalBuilder, ManualClock, Operation, Outcome, Result,
    Timestamp,
};

/// 2026-11-30T00:00:00Z.
pub const T0: Timestamp = Timestamp::from_millis(1_796_083_200_000);

pub struct Env {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub clock: ManualClock,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("journal.opj");
        Env {
            dir,
            path,
            clock: ManualClock::new(T0),
        }
    }

    /// The builder every test starts from: the manual clock, defaults otherwise.
    pub fn builder(&self) -> JournalBuilder {
        Journal::builder().clock(self.clock.clone())
    }

    pub fn open(&self) -> Journal {
        self.builder().open(&self.path).expect("the journal opens")
    }

    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    pub fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).expect("the journal file is readable")
    }
}

pub fn intent(name: &str, args: serde_json::Value) -> Intent {
    Intent::from_json(name, &args).expect("a valid intent")
}

pub fn add_light(near: &str) -> Intent {
    intent("scene.add_light", serde_json::json!({ "near": near }))
}

/// A document with a revision, and a count of applications per operation id.
#[derive(Debug, Default)]
pub struct FakeEditor {
    pub revision: u64,
    pub objects: Vec<String>,
    pub applied: BTreeMap<String, u32>,
}

impl FakeEditor {
    pub fn at(revision: u64) -> FakeEditor {
        FakeEditor {
            revision,
            ..FakeEditor::default()
        }
    }

    /// Applies the effect of `claim` (adding `object`) and returns the new revision.
    pub fn apply(&mut self, claim: &Claim, object: &str) -> u64 {
        *self
            .applied
            .entry(claim.operation_id().to_string())
            .or_default() += 1;
        self.objects.push(object.to_string());
        self.revision += 1;
        self.revision
    }

    pub fn applications(&self, id: &str) -> u32 {
        self.applied.get(id).copied().unwrap_or(0)
    }
}

/// Submits `op` and expects a fresh claim.
pub fn fresh(journal: &Journal, op: Operation) -> Claim {
    match journal.submit(op) {
        Ok(Admission::Fresh(claim)) => claim,
        other => panic!("expected a fresh claim, got {other:?}"),
    }
}

/// Submits, applies through the editor, completes: one whole successful operation.
pub fn run_op(
    journal: &Journal,
    editor: &mut FakeEditor,
    op: Operation,
    object: &str,
) -> Result<u64> {
    let claim = fresh(journal, op);
    let rev = editor.apply(&claim, object);
    journal.complete(&claim, Outcome::applied(rev, object.as_bytes().to_vec()))?;
    Ok(rev)
}

/// Everything observable about an operation: for "nothing was written" checks.
pub fn snapshot(journal: &Journal, id: &str) -> String {
    format!(
        "{:?} | {:?} | events={}",
        journal.lookup(id).expect("lookup"),
        journal.history(id).expect("history"),
        journal.event_count().expect("event count")
    )
}

pub fn file_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("readable")
}
