//! `open_file`: arbitrary and mutated journal files, and logs beside them, through every
//! read-only path the CLI uses (`stats`, `ls`, `show`, `log`, `export`, `verify`), through
//! the writer's open, and through `repair`.
//!
//! An input is a journal file alone, or a journal file and its log ([`split`]: the
//! [`PAIR_MAGIC`], the journal's length, the journal, then the log, which is padded with
//! zeros to 1 MiB when shorter, as the writer preallocates it). The read-only paths
//! and repair take paths (as the CLI does): both files are written to a directory in
//! memory (`/dev/shm` where there is one), so no byte of them touches a disk. The writer's
//! open of the damaged files runs on the in-memory fault disk
//! (`testkit/src/fault_backend.rs`); after a repair the writer opens the repaired file by
//! its path, as an editor does.
//!
//! Claims checked, besides "never panics" (the fuzzer) and "never hangs" (its timeout):
//! - no panic outside the storage engine happens, even one that is caught (redb's own
//!   panics on damaged pages are caught by the library and answered `Corrupt`; see
//!   [`crate::panics`]);
//! - every call answers `Ok` or a typed error of a kind that file damage can cause;
//! - the read-only paths and a dry-run repair leave both files' bytes unchanged, and
//!   create no log where there was none;
//! - after a repair that succeeded, the journal opens, a writer can open it and submit,
//!   and `verify` is clean after that writer closes.
//!
//! The expensive checks run where they can find something, and the costliest on a
//! deterministic fraction of the inputs, chosen by a hash of the input's bytes
//! ([`Plan::of`]):
//! - every input: the read-only paths and `verify` (redb's page check included) on the
//!   input, the bytes-unchanged check, and the writer's open on the disk in memory;
//! - one input in four: the repair in place and everything after it (the repaired journal
//!   opened by the inspector and, by its path, by a writer; `verify` after the writer
//!   closed). A repair rebuilds the journal into a new file, with salvage scans of the raw
//!   bytes where the engine cannot read; with the checks after it, it took about 70% of
//!   an input, so sampling it is most of the speed-up, and repairs per second stay about
//!   what they were when every input had one;
//! - one input in eight, never the same as a repair: the dry-run repair (a full repair of
//!   a copy: its claim is only that the files are left alone).
//!
//! The read-only paths visit at most [`MAX_ITEMS`] receipts and events, and read
//! `lookup`, `result` and `history` of at most [`MAX_LOOKUPS`] of the ids they met (spread
//! over them): each such read lays the log over the file again, so a journal with a log
//! and hundreds of ids cost tens of milliseconds. The stable tests run the seeds, the
//! committed inputs and their mutations with every check ([`check_every_claim`]).

use std::path::Path;

use opjournal::{RepairOptions, repair};

use crate::fault_backend::{DiskImage, FaultDisk, Image};
use opjournal::{
    Admission, ErrorKind, FileLog, Inspector, Intent, Journal, ManualClock, Operation,
};

/// Receipts and events visited per file, so one input cannot take long.
pub const MAX_ITEMS: usize = 256;
/// Ids whose `lookup`, `result` and `history` are read, spread over the ids met.
pub const MAX_LOOKUPS: usize = 16;

/// The first bytes of an input that holds a journal and its log.
pub const PAIR_MAGIC: &[u8; 8] = b"opj+log\x00";

/// The journal and, if the input holds one, its log.
pub fn split(bytes: &[u8]) -> (&[u8], Option<&[u8]>) {
    let Some(rest) = bytes.strip_prefix(PAIR_MAGIC.as_slice()) else {
        return (bytes, None);
    };
    let Some((len, rest)) = rest.split_first_chunk::<4>() else {
        return (bytes, None);
    };
    let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
    let (db, log) = rest.split_at(len);
    (db, Some(log))
}

/// An input holding `db` and its `log`.
pub fn join(db: &[u8], log: &[u8]) -> Vec<u8> {
    let mut out = PAIR_MAGIC.to_vec();
    out.extend_from_slice(&u32::try_from(db.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(db);
    out.extend_from_slice(log);
    out
}

/// A temporary directory in memory where there is one.
pub fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new().prefix("opj-fuzz-").tempdir_in(shm)
    {
        return Ok(dir);
    }
    tempfile::tempdir()
}

/// Whether `kind` is an error that a damaged or foreign file may cause. Refusals
/// (`InvalidInput`, `StaleClaim`, ...) and `Locked` (no other handle exists here) are not.
pub fn damage_error(kind: &ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Corrupt { .. }
            | ErrorKind::NotAJournal { .. }
            | ErrorKind::UnsupportedFormat { .. }
            | ErrorKind::Io
            | ErrorKind::Storage
            | ErrorKind::Poisoned
    )
}

fn expect_typed<T>(what: &str, r: opjournal::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(
                damage_error(e.kind()),
                "{what}: an error a damaged file cannot explain: {e:?}"
            );
            None
        }
    }
}

/// Every read-only path of the CLI, on `path`; `verify` too when asked. Returns whether
/// the file opened.
pub fn inspect_everything(path: &Path, verify: bool) -> bool {
    let Some(insp) = expect_typed("Inspector::open", Inspector::open(path)) else {
        return false;
    };
    let _ = expect_typed("stats", insp.stats());
    let _ = expect_typed("now", insp.now());
    let _ = expect_typed("sizes", insp.sizes());
    let mut ids = Vec::new();
    let _ = expect_typed(
        "for_each_receipt",
        insp.for_each_receipt(|r| {
            ids.push(r.operation_id);
            Ok(ids.len() < MAX_ITEMS)
        }),
    );
    let mut events = 0usize;
    let _ = expect_typed(
        "for_each_event",
        insp.for_each_event(0, |ev| {
            if let Some(op) = ev.operation_id
                && ids.len() < 2 * MAX_ITEMS
            {
                ids.push(op);
            }
            events += 1;
            Ok(events < MAX_ITEMS)
        }),
    );
    ids.sort();
    ids.dedup();
    let step = ids.len().div_ceil(MAX_LOOKUPS).max(1);
    for id in ids.iter().step_by(step) {
        let _ = expect_typed("lookup", insp.lookup(id));
        let _ = expect_typed("result", insp.result(id));
        let _ = expect_typed("history", insp.history(id));
    }
    if verify {
        let _ = expect_typed("verify", opjournal::verify_inspected(&insp, &mut |_, _| {}));
    }
    true
}

/// The journal's and its log's bytes (`None`: absent).
fn read(path: &Path) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    (
        std::fs::read(path).ok(),
        std::fs::read(FileLog::path_for(path)).ok(),
    )
}

/// The length a log shorter than this is given when written out: the writer preallocates
/// it so, and the seeds keep only the part with records (the rest is zero).
const LOG_PADDED_TO: u64 = 1 << 20;

/// Writes the journal and, if given, its log (padded with zeros to [`LOG_PADDED_TO`] when
/// shorter, as the writer preallocates it).
pub fn write(path: &Path, db: &[u8], log: Option<&[u8]>) -> bool {
    std::fs::write(path, db).is_ok()
        && log.is_none_or(|log| {
            let p = FileLog::path_for(path);
            std::fs::write(&p, log).is_ok()
                && (log.len() as u64 >= LOG_PADDED_TO
                    || std::fs::OpenOptions::new()
                        .write(true)
                        .open(&p)
                        .and_then(|f| f.set_len(LOG_PADDED_TO))
                        .is_ok())
        })
}

/// Checks the claims of this module on an input holding `bytes`.
///
/// # Panics
///
/// When a claim does not hold (that is the finding).
pub fn check(bytes: &[u8]) {
    check_with(bytes, Plan::of(bytes));
}

/// As [`check`], with every check on every input (for the stable tests).
///
/// # Panics
///
/// When a claim does not hold.
pub fn check_every_claim(bytes: &[u8]) {
    check_with(
        bytes,
        Plan {
            dry_run: true,
            repair: true,
        },
    );
}

fn check_with(bytes: &[u8], plan: Plan) {
    crate::panics::dump_on_panic("open_file", bytes, || {
        crate::panics::escaped("open_file", || check_file(bytes, plan));
    });
}

/// Which of the costly checks an input gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// A dry-run repair (a full repair of a copy: its claim is only that the files are
    /// left alone).
    pub dry_run: bool,
    /// The repair in place and the checks after it.
    pub repair: bool,
}

impl Plan {
    /// By a hash of the input's bytes (FNV-1a, the same in every build, so a finding
    /// replays the same way): the repair for one input in four, the dry run for one in
    /// eight, never both.
    pub fn of(bytes: &[u8]) -> Plan {
        let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        // The high bits: FNV-1a's low bits mix poorly.
        let pick = h >> 61;
        Plan {
            dry_run: pick == 0,
            repair: pick % 4 == 1,
        }
    }
}

fn check_file(bytes: &[u8], plan: Plan) {
    let (db, log) = split(bytes);
    let Ok(dir) = scratch_dir() else {
        return;
    };
    let path = dir.path().join("journal.opj");
    if !write(&path, db, log) {
        return;
    }
    let original = read(&path);

    // Read-only paths: bytes unchanged, and no log created.
    inspect_everything(&path, true);
    assert!(
        read(&path) == original,
        "a read-only path modified the journal or its log"
    );
    if plan.dry_run {
        let mut dry = RepairOptions::default();
        dry.dry_run = true;
        let _ = expect_typed("repair (dry run)", repair(&path, &dry, &mut |_, _| {}));
        assert!(
            read(&path) == original,
            "a dry-run repair modified the journal or its log"
        );
    }

    // The writer's open on a copy of the damaged files, on a disk in memory (the repaired
    // journal below is opened by path, as editors do).
    let copy = FaultDisk::from_image(DiskImage {
        db: Image::from_bytes(db),
        log: Image::from_bytes(log.unwrap_or_default()),
        log2: Image::default(),
    });
    let clock = ManualClock::new(crate::seeds::T0);
    if let Some(j) = expect_typed(
        "JournalBuilder::open_backends",
        Journal::builder()
            .clock(clock)
            .open_backends(copy.backend(), copy.log(), "damaged copy"),
    ) {
        exercise_writer(&j);
    }

    // Repair in place; when it succeeds the journal is whole again.
    if !plan.repair {
        return;
    }
    let mut options = RepairOptions::default();
    options.backup = false;
    if expect_typed("repair", repair(&path, &options, &mut |_, _| {})).is_some() {
        drop(
            Inspector::open(&path)
                .unwrap_or_else(|e| panic!("a repaired journal does not open: {e:?}")),
        );
        let clock = ManualClock::new(crate::seeds::T0);
        let j = Journal::builder()
            .clock(clock)
            .open(&path)
            .unwrap_or_else(|e| panic!("a repaired journal does not open for writing: {e:?}"));
        exercise_writer(&j);
        drop(j);
        // One verify covers both claims: a problem repair left is still there after a
        // writer's use (which only adds records).
        let insp = Inspector::open(&path)
            .unwrap_or_else(|e| panic!("a repaired, reopened journal does not open: {e:?}"));
        let report = opjournal::verify_inspected(&insp, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("verify fails on a repaired, reopened journal: {e:?}"));
        assert!(
            report.findings.is_empty(),
            "verify finds problems after repair and a writer's use: {:?}",
            report.findings
        );
    }
}

/// A writer's reads and one write on a possibly damaged journal: typed answers only.
fn exercise_writer(j: &Journal) {
    let _ = expect_typed("stats", j.stats());
    let _ = expect_typed("in_doubt", j.in_doubt());
    let _ = expect_typed("due_redeliveries", j.due_redeliveries(16));
    let _ = expect_typed("undelivered", j.undelivered("tab-1"));
    for id in [
        "op_0",
        "op_1",
        "op_2",
        "op_running",
        "op_lease",
        "aged_1",
        "op_logged_0",
    ] {
        let _ = expect_typed("lookup", j.lookup(id));
        let _ = expect_typed("result", j.result(id));
        let _ = expect_typed("history", j.history(id));
    }
    let Ok(intent) = Intent::from_json("fuzz.probe", &serde_json::json!({})) else {
        return;
    };
    let op = Operation::new("fuzz_probe", intent).scope("fuzz/probe");
    match j.submit(op) {
        Ok(Admission::Fresh(claim)) => {
            let _ = j.complete(&claim, opjournal::Outcome::failed("probe"));
        }
        Ok(_) => {}
        Err(e) => assert!(
            damage_error(e.kind()) || e.is_refusal(),
            "submit: an error a damaged file cannot explain: {e:?}"
        ),
    }
    let _ = expect_typed("compact", j.compact());
}
