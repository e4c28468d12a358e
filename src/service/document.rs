//! The editor's document: a scene of named objects with a revision number, and the index
//! of which operations were applied at which revision (how the editor tells, after a
//! crash, whether an operation's edit landed).
//!
//! # On disk
//!
//! Two files beside each other, so that the cost of an edit does not grow with the
//! document's history:
//!
//! - `PATH` (the snapshot, JSON): the revision, the objects, and the applied-operation
//!   index as of that revision. Rewritten (temporary file `PATH` with the extension `tmp`,
//!   synced, renamed over) every [`DocumentStore::snapshot_every`] edits and at a clean
//!   stop.
//! - `PATH` with the extension `log` (JSON Lines): one line per edit applied since the
//!   snapshot, appended and synced before the edit counts as applied. This is the edit's
//!   durable effect: one short line and one sync, whatever the history.
//!
//! Loading reads the snapshot and replays the log on top of it. A last line cut off by a
//! crash (no newline, or not JSON) never counted as applied: it is cut off the file.
//!
//! The applied-operation index keeps each operation id with its revision, edit and time for
//! [`DocumentStore::retention`] (by default the journal's audit retention, 90 days): long
//! enough to settle any operation the journal can still report in doubt. Older entries are
//! dropped at the next snapshot.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ServiceError;
use super::protocol::Edit;
use crate::Timestamp;

/// The format of the snapshot file this build writes.
const SNAPSHOT_FORMAT: u32 = 2;

/// The scene: named objects, a revision, and the operations applied within the retention.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Document {
    revision: u64,
    objects: BTreeMap<String, Option<String>>,
    applied: HashMap<String, AppliedEdit>,
}

/// One operation whose edit is in the document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedEdit {
    /// The operation id.
    pub op: String,
    /// The revision its edit produced.
    pub revision: u64,
    /// When it was applied (journal time), for the retention.
    pub at: Timestamp,
    /// The edit.
    pub edit: Edit,
    /// What happened, in words.
    pub summary: String,
    /// How many times an edit of this operation id was applied: 1 in a correct service. The
    /// demo counts effects with it.
    #[serde(default = "one")]
    pub times: u32,
}

fn one() -> u32 {
    1
}

impl Document {
    /// A new scene with a door, a window and a table, at revision 0.
    pub fn starter() -> Document {
        let mut doc = Document::default();
        for name in ["door", "window", "table"] {
            doc.objects.insert(name.to_string(), None);
        }
        doc
    }

    /// The revision: moves forward by one with every applied edit.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Object name → the object it stands beside.
    pub fn objects(&self) -> &BTreeMap<String, Option<String>> {
        &self.objects
    }

    /// The applied edit of operation `op`, if its effect is in the document (and within the
    /// retention).
    pub fn applied(&self, op: &str) -> Option<&AppliedEdit> {
        self.applied.get(op)
    }

    /// How many times operation `op` with `edit` was applied to this document.
    pub fn effects(&self, op: &str, edit: &Edit) -> usize {
        self.applied
            .get(op)
            .filter(|a| &a.edit == edit)
            .map_or(0, |a| a.times as usize)
    }

    /// How many edits the applied-operation index holds (each counted as many times as it
    /// was applied).
    pub fn edits_applied(&self) -> usize {
        self.applied.values().map(|a| a.times as usize).sum()
    }

    /// How many times operation `op` was applied, whatever its edit.
    pub fn times_applied(&self, op: &str) -> usize {
        self.applied.get(op).map_or(0, |a| a.times as usize)
    }

    /// The objects in words: `door, light (beside door), table`.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .objects
            .iter()
            .map(|(name, beside)| match beside {
                Some(b) => format!("{name} (beside {b})"),
                None => name.clone(),
            })
            .collect();
        names.join(", ")
    }

    /// Checks `edit` against the document without changing it: what it would do in words,
    /// or why it cannot be applied.
    ///
    /// # Errors
    ///
    /// Why nothing could change (no such object, the name is taken), in words.
    pub fn check(&self, edit: &Edit) -> Result<String, String> {
        let exists = |name: &str| self.objects.contains_key(name);
        match edit {
            Edit::Add { object, beside } => {
                if exists(object) {
                    return Err(format!("there is already an object named \"{object}\""));
                }
                if !exists(beside) {
                    return Err(format!("there is no object named \"{beside}\""));
                }
                Ok(format!("added \"{object}\" beside \"{beside}\""))
            }
            Edit::Rename { from, to } => {
                if exists(to) {
                    return Err(format!("there is already an object named \"{to}\""));
                }
                if !exists(from) {
                    return Err(format!("there is no object named \"{from}\""));
                }
                Ok(format!("renamed \"{from}\" to \"{to}\""))
            }
            Edit::Delete { object } => {
                if !exists(object) {
                    return Err(format!("there is no object named \"{object}\""));
                }
                Ok(format!("deleted \"{object}\""))
            }
        }
    }

    /// Applies a checked edit as operation `op`: the revision moves forward by one.
    fn apply(&mut self, line: &LogLine) {
        match &line.edit {
            Edit::Add { object, beside } => {
                self.objects.insert(object.clone(), Some(beside.clone()));
            }
            Edit::Rename { from, to } => {
                let place = self.objects.remove(from).flatten();
                self.objects.insert(to.clone(), place);
                for beside in self.objects.values_mut() {
                    if beside.as_deref() == Some(from.as_str()) {
                        *beside = Some(to.clone());
                    }
                }
            }
            Edit::Delete { object } => {
                self.objects.remove(object);
                for beside in self.objects.values_mut() {
                    if beside.as_deref() == Some(object.as_str()) {
                        *beside = None;
                    }
                }
            }
        }
        self.revision = line.revision;
        let times = self.applied.get(&line.op).map_or(0, |a| a.times);
        self.applied.insert(
            line.op.clone(),
            AppliedEdit {
                op: line.op.clone(),
                revision: line.revision,
                at: line.at,
                edit: line.edit.clone(),
                summary: line.summary.clone(),
                times: times.saturating_add(1),
            },
        );
    }

    /// A document as stored elsewhere (the PostgreSQL document's rows): its revision, its
    /// objects, and its applied-operation index.
    #[cfg(feature = "postgres")]
    pub(crate) fn from_parts(
        revision: u64,
        objects: BTreeMap<String, Option<String>>,
        applied: Vec<AppliedEdit>,
    ) -> Document {
        Document {
            revision,
            objects,
            applied: applied.into_iter().map(|a| (a.op.clone(), a)).collect(),
        }
    }

    /// Applies a checked edit as operation `op`, producing `revision`: what a log line does
    /// on loading (for a document kept elsewhere than in files).
    #[cfg(feature = "postgres")]
    pub(crate) fn apply_edit(
        &mut self,
        op: &str,
        revision: u64,
        at: Timestamp,
        edit: &Edit,
        summary: &str,
    ) {
        self.apply(&LogLine {
            op: op.to_string(),
            revision,
            at,
            edit: edit.clone(),
            summary: summary.to_string(),
        });
    }

    /// Drops applied-operation entries older than `cutoff`.
    fn prune(&mut self, cutoff: Timestamp) {
        self.applied.retain(|_, a| a.at >= cutoff);
    }
}

/// One line of the edit log: an applied edit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct LogLine {
    op: String,
    revision: u64,
    at: Timestamp,
    edit: Edit,
    summary: String,
}

/// The snapshot file. Format 1 (older builds) wrote the whole edit history instead of the
/// applied-operation index, and no log; it is read and rewritten as format 2.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    #[serde(default = "one")]
    format: u32,
    revision: u64,
    objects: BTreeMap<String, Option<String>>,
    #[serde(default)]
    applied: Vec<AppliedEdit>,
    #[serde(default, skip_serializing)]
    history: Vec<LegacyApplied>,
}

#[derive(Deserialize)]
struct LegacyApplied {
    op: String,
    revision: u64,
    edit: Edit,
    summary: String,
}

/// Why an edit could not be applied.
#[derive(Debug)]
pub(crate) enum ApplyError {
    /// The edit does not fit the document; nothing changed.
    Refused(String),
    /// The edit code panicked; nothing changed.
    Panicked(String),
    /// The edit could not be saved, and nothing of it reached the file.
    NotSaved(ServiceError),
    /// Saving failed part-way (a failed sync, or a partial write that could not be cut
    /// off): the edit may or may not be in the file.
    Uncertain(ServiceError),
}

/// The document and its files.
#[derive(Debug)]
pub struct DocumentStore {
    snapshot: PathBuf,
    log: PathBuf,
    doc: Document,
    /// Lines in the log since the snapshot.
    logged: usize,
    /// Edits to wait past `snapshot_every` after a failed snapshot.
    snapshot_delay: usize,
    /// How long an applied operation stays in the index.
    pub retention: Duration,
    /// Edits between snapshots.
    pub snapshot_every: usize,
}

fn io_err(what: &str, path: &Path, source: std::io::Error) -> ServiceError {
    ServiceError::Io {
        what: format!("{what} `{}`", path.display()),
        source,
    }
}

impl DocumentStore {
    /// Loads the document at `path` (the snapshot, then the log replayed on top of it), or
    /// starts a new scene if there is none. A torn last log line is cut off the file.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Io`] when a file cannot be read or the log cut;
    /// [`ServiceError::Document`] when a file is not a scene document or a log line does
    /// not follow from the one before.
    pub fn open(path: &Path, retention: Duration, now: Timestamp) -> Result<Self, ServiceError> {
        let log = path.with_extension("log");
        let mut doc = match std::fs::read(path) {
            Ok(bytes) => from_snapshot(path, &bytes, now)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Document::starter(),
            Err(source) => return Err(io_err("read the document", path, source)),
        };
        let mut logged = 0;
        match File::open(&log) {
            Ok(mut f) => {
                let mut bytes = Vec::new();
                f.read_to_end(&mut bytes)
                    .map_err(|e| io_err("read the document log", &log, e))?;
                let (lines, good) = replay(&log, &bytes, &mut doc)?;
                logged = lines;
                if good < bytes.len() {
                    // A torn last line: never applied. Cut it, so the next line starts clean.
                    let f = OpenOptions::new()
                        .write(true)
                        .open(&log)
                        .map_err(|e| io_err("open the document log", &log, e))?;
                    f.set_len(good as u64)
                        .and_then(|()| f.sync_all())
                        .map_err(|e| io_err("cut the torn end of the document log", &log, e))?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(io_err("open the document log", &log, source)),
        }
        doc.prune(cutoff(now, retention));
        Ok(DocumentStore {
            snapshot: path.to_path_buf(),
            log,
            doc,
            logged,
            snapshot_delay: 0,
            retention,
            snapshot_every: 1000,
        })
    }

    /// The document as it stands.
    pub fn document(&self) -> &Document {
        &self.doc
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Applies `edit` as operation `op` at journal time `at`: checks it (catching a panic of
    /// the edit code), appends and syncs its log line, then changes the document. Returns
    /// the new revision and the summary.
    pub(crate) fn apply(
        &mut self,
        op: &str,
        edit: &Edit,
        at: Timestamp,
        fault: impl FnOnce(),
    ) -> Result<(u64, String), ApplyError> {
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fault();
            self.doc.check(edit)
        }));
        let summary = match checked {
            Ok(Ok(summary)) => summary,
            Ok(Err(reason)) => return Err(ApplyError::Refused(reason)),
            Err(panic) => {
                let message = crate::panics::message(panic.as_ref());
                let message = message.unwrap_or("a panic without a message").to_string();
                return Err(ApplyError::Panicked(message));
            }
        };
        let line = LogLine {
            op: op.to_string(),
            revision: self.doc.revision.saturating_add(1),
            at,
            edit: edit.clone(),
            summary: summary.clone(),
        };
        self.append(&line)?;
        self.doc.apply(&line);
        self.logged += 1;
        Ok((line.revision, summary))
    }

    /// Appends one line to the log and syncs it.
    fn append(&self, line: &LogLine) -> Result<(), ApplyError> {
        let mut bytes = serde_json::to_vec(line).map_err(|e| {
            ApplyError::NotSaved(ServiceError::Document {
                path: self.log.clone(),
                detail: format!("the edit could not be serialized: {e}"),
            })
        })?;
        bytes.push(b'\n');
        // Opened for each edit: one descriptor less per service, and a log replaced under
        // the service (or made unwritable) fails the next edit cleanly.
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| ApplyError::NotSaved(io_err("open the document log", &self.log, e)))?;
        let len = f
            .metadata()
            .map_err(|e| ApplyError::NotSaved(io_err("read the document log", &self.log, e)))?
            .len();
        if let Err(e) = f.write_all(&bytes) {
            // Cut what may have been written: then nothing of the edit is in the file.
            let cut = f.set_len(len).and_then(|()| f.sync_all());
            let err = io_err("write the document log", &self.log, e);
            return Err(match cut {
                Ok(()) => ApplyError::NotSaved(err),
                Err(_) => ApplyError::Uncertain(err),
            });
        }
        // A failed sync leaves the file's contents unknown (it must not be retried).
        f.sync_data()
            .map_err(|e| ApplyError::Uncertain(io_err("sync the document log", &self.log, e)))
    }

    /// Edits logged since the last snapshot.
    pub fn logged(&self) -> usize {
        self.logged
    }

    /// Whether enough edits were logged for a snapshot.
    pub fn snapshot_due(&self) -> bool {
        self.logged
            >= self
                .snapshot_every
                .max(1)
                .saturating_add(self.snapshot_delay)
    }

    /// Writes the snapshot (dropping applied entries past the retention) and empties the
    /// log. A failure leaves the previous snapshot and the log as they were: nothing is lost,
    /// and the next snapshot tries again.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Io`] naming the step that failed.
    pub fn write_snapshot(&mut self, now: Timestamp) -> Result<(), ServiceError> {
        let written = self.try_snapshot(now);
        // After a failure, the next attempt comes a tenth of the interval later, not at
        // every edit.
        self.snapshot_delay = match written {
            Ok(()) => 0,
            Err(_) => self
                .logged
                .saturating_sub(self.snapshot_every)
                .saturating_add((self.snapshot_every / 10).max(1)),
        };
        written
    }

    fn try_snapshot(&mut self, now: Timestamp) -> Result<(), ServiceError> {
        let tmp = self.snapshot.with_extension("tmp");
        let io = |what: &str, p: &Path| {
            let p = p.to_path_buf();
            let what = what.to_string();
            move |e| io_err(&what, &p, e)
        };
        // The temporary file first: a snapshot that cannot be written costs no
        // serialization.
        let mut f = File::create(&tmp).map_err(io("create", &tmp))?;
        self.doc.prune(cutoff(now, self.retention));
        let mut applied: Vec<AppliedEdit> = self.doc.applied.values().cloned().collect();
        applied.sort_by(|a, b| (a.revision, &a.op).cmp(&(b.revision, &b.op)));
        let file = SnapshotFile {
            format: SNAPSHOT_FORMAT,
            revision: self.doc.revision,
            objects: self.doc.objects.clone(),
            applied,
            history: Vec::new(),
        };
        let bytes = serde_json::to_vec(&file).map_err(|e| ServiceError::Document {
            path: self.snapshot.clone(),
            detail: format!("it could not be serialized: {e}"),
        })?;
        f.write_all(&bytes).map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("sync", &tmp))?;
        drop(f);
        std::fs::rename(&tmp, &self.snapshot).map_err(io("replace", &self.snapshot))?;
        if let Some(dir) = self.snapshot.parent()
            && let Ok(d) = File::open(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            })
        {
            // Make the rename durable before the log is emptied.
            d.sync_all()
                .map_err(io("sync the directory of", &self.snapshot))?;
        }
        // The snapshot holds every logged edit now; lines left by a crash before the log
        // is emptied are skipped when loading (their revision is not ahead).
        match OpenOptions::new().write(true).open(&self.log) {
            Ok(f) => f
                .set_len(0)
                .and_then(|()| f.sync_all())
                .map_err(io("empty", &self.log))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("open", &self.log, e)),
        }
        self.logged = 0;
        Ok(())
    }
}

pub(super) fn cutoff(now: Timestamp, retention: Duration) -> Timestamp {
    let back = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    Timestamp::from_millis(now.as_millis().saturating_sub(back))
}

fn from_snapshot(path: &Path, bytes: &[u8], now: Timestamp) -> Result<Document, ServiceError> {
    let file: SnapshotFile = serde_json::from_slice(bytes).map_err(|e| ServiceError::Document {
        path: path.to_path_buf(),
        detail: format!("it is not a scene document: {e}"),
    })?;
    if file.format > SNAPSHOT_FORMAT {
        return Err(ServiceError::Document {
            path: path.to_path_buf(),
            detail: format!(
                "it is format {}, newer than this build's {SNAPSHOT_FORMAT}; use a newer opjournal",
                file.format
            ),
        });
    }
    let mut doc = Document {
        revision: file.revision,
        objects: file.objects,
        applied: HashMap::new(),
    };
    for a in file.applied {
        doc.applied.insert(a.op.clone(), a);
    }
    // Format 1 kept the whole history, without times: keep each operation for a full
    // retention from now.
    for h in file.history {
        let times = doc.applied.get(&h.op).map_or(0, |a| a.times);
        doc.applied.insert(
            h.op.clone(),
            AppliedEdit {
                op: h.op,
                revision: h.revision,
                at: now,
                edit: h.edit,
                summary: h.summary,
                times: times.saturating_add(1),
            },
        );
    }
    Ok(doc)
}

/// Replays log lines on `doc`; returns how many were applied and the length of the intact
/// prefix (a torn last line is not part of it).
fn replay(path: &Path, bytes: &[u8], doc: &mut Document) -> Result<(usize, usize), ServiceError> {
    let bad = |detail: String| ServiceError::Document {
        path: path.to_path_buf(),
        detail,
    };
    let mut applied = 0;
    let mut offset = 0;
    while offset < bytes.len() {
        let rest = &bytes[offset..];
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            break; // torn: no newline
        };
        let line: LogLine = match serde_json::from_slice(&rest[..end]) {
            Ok(l) => l,
            Err(_) if offset + end + 1 == bytes.len() => break, // torn last line
            Err(e) => {
                return Err(bad(format!(
                    "the log line at byte {offset} is not an applied edit: {e}"
                )));
            }
        };
        if line.revision > doc.revision {
            if line.revision != doc.revision + 1 {
                return Err(bad(format!(
                    "the log jumps from revision {} to {} at byte {offset}",
                    doc.revision, line.revision
                )));
            }
            if let Err(reason) = doc.check(&line.edit) {
                return Err(bad(format!(
                    "the edit of `{}` logged at byte {offset} does not apply: {reason}",
                    line.op
                )));
            }
            doc.apply(&line);
            applied += 1;
        }
        offset += end + 1;
    }
    Ok((applied, offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn add(object: &str, beside: &str) -> Edit {
        Edit::Add {
            object: object.into(),
            beside: beside.into(),
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn an_edit_appends_one_line_whatever_the_history() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("x.scene.json");
        let mut store = DocumentStore::open(&path, DAY, Timestamp::from_millis(1))?;
        store.snapshot_every = usize::MAX;
        let mut sizes = Vec::new();
        for i in 0..500u64 {
            let before = std::fs::metadata(store.log_path()).map_or(0, |m| m.len());
            store
                .apply(
                    &format!("op_{i:05}"),
                    &add(&format!("o{i:05}"), "door"),
                    Timestamp::from_millis(i),
                    || {},
                )
                .map_err(|e| format!("{e:?}"))?;
            let after = std::fs::metadata(store.log_path())?.len();
            sizes.push(after - before);
        }
        // The 500th edit writes as many bytes as the 1st, but for the digits of its
        // revision and time: the cost of an edit does not grow with the history.
        let (first, last) = (sizes[0], sizes[sizes.len() - 1]);
        assert!(
            first < 200 && last <= first + 6,
            "{first} then {last} bytes"
        );
        assert!(!path.exists(), "no snapshot yet: edits only append");
        Ok(())
    }

    #[test]
    fn a_reload_replays_the_log_over_the_snapshot_and_cuts_a_torn_line() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("x.scene.json");
        let t = Timestamp::from_millis(10);
        let mut store = DocumentStore::open(&path, DAY, t)?;
        store.snapshot_every = 2;
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            store
                .apply(&format!("op_{i}"), &add(name, "door"), t, || {})
                .map_err(|e| format!("{e:?}"))?;
            if store.snapshot_due() {
                store.write_snapshot(t)?;
            }
        }
        let expected = store.document().clone();
        let log = store.log_path().to_path_buf();
        // A crash in the middle of appending a fourth line.
        let mut f = OpenOptions::new().append(true).open(&log)?;
        f.write_all(b"{\"op\":\"op_3\",\"revis")?;
        drop(f);
        let reloaded = DocumentStore::open(&path, DAY, t)?;
        assert_eq!(reloaded.document(), &expected);
        assert_eq!(reloaded.document().revision(), 3);
        assert_eq!(
            reloaded.document().applied("op_2").map(|a| a.revision),
            Some(3)
        );
        assert!(
            std::fs::read(&log)?.ends_with(b"\n"),
            "the torn line was cut off"
        );
        Ok(())
    }

    #[test]
    fn a_snapshot_drops_applied_operations_past_the_retention() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("x.scene.json");
        let mut store = DocumentStore::open(&path, DAY, Timestamp::from_millis(0))?;
        store
            .apply("old", &add("a", "door"), Timestamp::from_millis(0), || {})
            .map_err(|e| format!("{e:?}"))?;
        let later = Timestamp::from_millis(2 * 86_400_000);
        store
            .apply("new", &add("b", "door"), later, || {})
            .map_err(|e| format!("{e:?}"))?;
        store.write_snapshot(later)?;
        assert!(store.document().applied("old").is_none());
        assert!(store.document().applied("new").is_some());
        let reloaded = DocumentStore::open(&path, DAY, later)?;
        assert_eq!(reloaded.document(), store.document());
        assert_eq!(reloaded.document().objects().len(), 5, "the objects stay");
        Ok(())
    }

    #[test]
    fn a_snapshot_that_cannot_be_written_loses_nothing_and_edits_go_on() -> TestResult {
        // The issue's reproduction: the temporary file is a directory.
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("x.scene.json");
        let t = Timestamp::from_millis(1);
        let mut store = DocumentStore::open(&path, DAY, t)?;
        store.snapshot_every = 100;
        std::fs::create_dir(path.with_extension("tmp"))?;
        let mut attempts = 0;
        for i in 0..300u64 {
            store
                .apply(&format!("op_{i}"), &add(&format!("o{i}"), "door"), t, || {})
                .map_err(|e| format!("{e:?}"))?;
            if store.snapshot_due() {
                attempts += 1;
                assert!(store.write_snapshot(t).is_err());
            }
        }
        // At edit 100, then every 10 edits (a tenth of the interval), not at every edit.
        assert_eq!(attempts, 21);
        let reloaded = DocumentStore::open(&path, DAY, t)?;
        assert_eq!(reloaded.document(), store.document());
        assert_eq!(reloaded.document().revision(), 300);
        // Once the file can be written, the snapshot goes through and empties the log.
        std::fs::remove_dir(path.with_extension("tmp"))?;
        store.write_snapshot(t)?;
        assert_eq!(std::fs::metadata(store.log_path())?.len(), 0);
        assert_eq!(
            DocumentStore::open(&path, DAY, t)?.document(),
            store.document()
        );
        Ok(())
    }

    #[test]
    fn a_refused_or_panicking_edit_changes_nothing() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("x.scene.json");
        let t = Timestamp::from_millis(1);
        let mut store = DocumentStore::open(&path, DAY, t)?;
        let before = store.document().clone();
        let refused = store.apply("op_1", &add("x", "nothing"), t, || {});
        assert!(
            matches!(refused, Err(ApplyError::Refused(_))),
            "{refused:?}"
        );
        let panicked = store.apply("op_2", &add("x", "door"), t, || panic!("edit bug"));
        match panicked {
            Err(ApplyError::Panicked(m)) => assert_eq!(m, "edit bug"),
            other => panic!("expected a caught panic, got {other:?}"),
        }
        assert_eq!(store.document(), &before);
        assert!(!store.log_path().exists(), "nothing was logged");
        Ok(())
    }

    #[test]
    fn an_edit_whose_log_cannot_be_opened_is_not_saved_and_changes_nothing() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("x.scene.json");
        let t = Timestamp::from_millis(1);
        let mut store = DocumentStore::open(&path, DAY, t)?;
        std::fs::create_dir(store.log_path())?;
        let before = store.document().clone();
        let r = store.apply("op_1", &add("x", "door"), t, || {});
        assert!(matches!(r, Err(ApplyError::NotSaved(_))), "{r:?}");
        assert_eq!(store.document(), &before);
        Ok(())
    }

    #[test]
    fn a_format_1_document_loads_with_its_history_as_the_applied_index() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("x.scene.json");
        std::fs::write(
            &path,
            br#"{"revision":1,"objects":{"door":null,"light":"door"},"history":[{"op":"op_1","revision":1,"edit":{"kind":"add","object":"light","beside":"door"},"summary":"added"}]}"#,
        )?;
        let store = DocumentStore::open(&path, DAY, Timestamp::from_millis(0))?;
        assert_eq!(store.document().revision(), 1);
        assert_eq!(
            store.document().applied("op_1").map(|a| a.revision),
            Some(1)
        );
        assert_eq!(store.document().effects("op_1", &add("light", "door")), 1);
        Ok(())
    }
}
