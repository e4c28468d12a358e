//! `backup`: a consistent copy of a journal into a new, closed journal file, also while a
//! writer in another process has the journal open.
//!
//! # How
//!
//! The source is read through an [`Inspector`]: one redb read transaction with the log's
//! records of the same cycle laid over it (what its writer committed a moment ago is
//! there), so every table is read from the same instant. Every table's entries are copied,
//! in key order and in batches of a few MiB, into a new redb file created under a
//! temporary name beside the destination; the `meta/checkpoint` record is replaced with one
//! for a journal without a log (a new journal id, generation 1). The copy is committed
//! durably, closed, then linked into place (refused if the destination exists by then) and
//! the directory synced. On any error the temporary file is removed: nothing is left at
//! the destination.

use std::path::{Path, PathBuf};

use crate::codec::{self, RecordKind};
use crate::error::Result;
use crate::index::{self, Layered, View};
use crate::inspect::{Access, Inspector};
use crate::log;
use crate::record::CheckpointRecord;

use super::writer::{NewJournal, refuse_existing};

/// What [`backup`] copied.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackupReport {
    /// The copy.
    pub dest: PathBuf,
    /// How the source was reached ([`Access::Live`]: a writer had it open; the copy is its
    /// latest commit when the copy began).
    pub access: Access,
    /// Events copied.
    pub events: u64,
    /// Receipts copied.
    pub receipts: u64,
    /// Result payloads copied.
    pub results: u64,
    /// Entries copied, every table together.
    pub entries: u64,
    /// Records of the source's log that were laid over its file (committed, not yet
    /// checkpointed): the copy holds them. 0 from [`Journal::backup`](crate::Journal::backup),
    /// which copies its own memtable instead.
    pub log_records: u64,
    /// The copy's size in bytes.
    pub file_bytes: u64,
}

/// Copies the journal at `src` into a new journal file at `dest`: a consistent snapshot
/// (the source's latest commit, including what its log holds), also while an editor has
/// the source open (with `Sharing::LiveReaders`). The copy is one closed file, without a
/// log, that `Journal::open` and `verify` accept; the source is never written.
///
/// # Errors
///
/// - [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) if `dest` exists (nothing
///   is written: choose another path or remove it);
/// - the errors of [`Inspector::open`] for the source ([`ErrorKind::Locked`](crate::ErrorKind::Locked)
///   when a writer holds it with `Sharing::Exclusive`);
/// - [`ErrorKind::Corrupt`](crate::ErrorKind::Corrupt) if the source's log holds a record
///   whose changes do not decode, or an event, receipt, result or scope fails its CRC or
///   does not decode (a copy is always one `verify` passes: run `opjournal repair` first);
/// - [`ErrorKind::Io`](crate::ErrorKind::Io), [`ErrorKind::Storage`](crate::ErrorKind::Storage)
///   writing the copy. Whatever the error, nothing is left at `dest`.
pub fn backup(src: impl AsRef<Path>, dest: impl AsRef<Path>) -> Result<BackupReport> {
    let dest = dest.as_ref();
    refuse_existing(dest)?;
    Inspector::open(src)?.backup(dest)
}

impl Inspector {
    /// Copies the inspected journal into a new journal file at `dest`, as [`backup`] does.
    ///
    /// # Errors
    ///
    /// As [`backup`]; [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a
    /// journal in a database ([`Access::Database`]): move it into a file through
    /// [`Inspector::export_dump`] and [`import_dump`](crate::import_dump).
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<BackupReport> {
        let dest = dest.as_ref();
        if self.access() == Access::Database {
            return Err(crate::error::Error::invalid(
                "journal",
                &self.path().display().to_string(),
                "backup copies a journal file; a journal in a database moves into a file \
                 through `Inspector::export_dump` and `import_dump` (`opjournal export \
                 --postgres URL NAME --dump | opjournal import - FILE`)",
            ));
        }
        crate::preflight::guarded("backup", || {
            let mut log_records = 0;
            let mut report = self.with_snapshot_and_log(true, |snap, _, read| {
                if let crate::inspect::LogRead::Read { records, .. } = read {
                    log_records = *records;
                }
                backup_snapshot(snap, dest)
            })?;
            report.access = self.access();
            report.log_records = log_records;
            Ok(report)
        })
    }
}

/// Copies `snap` into a new journal file at `dest` (see [`backup`]).
pub(crate) fn backup_snapshot(snap: &index::Snapshot<'_>, dest: &Path) -> Result<BackupReport> {
    let mut out = NewJournal::create(dest)?;
    let mut report = copy_tables(snap, &mut out)?;
    report.file_bytes = out.install()?;
    Ok(report)
}

fn copy_tables(snap: &index::Snapshot<'_>, out: &mut NewJournal) -> Result<BackupReport> {
    let mut report = BackupReport {
        dest: out.dest.clone(),
        access: Access::Idle,
        events: 0,
        receipts: 0,
        results: 0,
        entries: 0,
        log_records: 0,
        file_bytes: 0,
    };
    // The copy has no log: its checkpoint starts a new one, under a new journal id (a
    // stray log beside it is not its log).
    let has_checkpoint = snap.checkpoint()?.is_some();
    for entry in snap.all::<index::Meta>()? {
        let (k, v) = entry?;
        if k != "checkpoint" {
            out.put::<index::Meta>(k, v)?;
            report.entries += 1;
        }
    }
    if has_checkpoint {
        let cp = CheckpointRecord {
            journal_id: log::new_journal_id(),
            generation: 1,
            next_lsn: 1,
        };
        out.put::<index::Meta>("checkpoint".into(), codec::encode(RecordKind::Meta, &cp))?;
        report.entries += 1;
    }
    report.events =
        copy_checked::<index::Events>(snap, out, |seq, v| index::decode_event(*seq, v).map(drop))?;
    report.receipts = copy_checked::<index::Receipts>(snap, out, |id, v| {
        let rec = index::decode_receipt(id, v)?;
        // A result inline in the receipt (format 3) has its own CRC.
        if let (Some(tail), crate::record::ExecRecord::Done(d)) =
            (index::split_receipt_value(v).1, &rec.state)
            && let Some(seq) = d.result_seq
        {
            index::decode_inline_result(id, seq, tail)?;
        }
        Ok(())
    })?;
    let in_table = copy_checked::<index::Results>(snap, out, |seq, v| {
        index::decode_result(*seq, v).map(drop)
    })?;
    report.entries += report.events + report.receipts + in_table;
    // Results inline in their receipts (format 3) were copied with them.
    let mut inline = 0;
    for entry in snap.all::<index::Receipts>()? {
        if index::split_receipt_value(&entry?.1).1.is_some() {
            inline += 1;
        }
    }
    report.results = in_table + inline;
    report.entries +=
        copy_checked::<index::Scopes>(snap, out, |name, v| index::decode_scope(name, v).map(drop))?;
    macro_rules! rest {
        ($($t:ident),*) => { $( report.entries += out.copy::<index::$t>(snap)?; )* };
    }
    rest!(
        OpEvents,
        Timers,
        ScopeTimers,
        Windows,
        Holds,
        InDoubt,
        Quarantine
    );
    Ok(report)
}

/// Copies table `T` as [`NewJournal::copy`] does, checking each value first with `check`
/// (its CRC and decoding): a damaged record stops the backup, and nothing is left at the
/// destination, so that a copy is always one `verify` passes.
fn copy_checked<T: index::Table<V = Vec<u8>>>(
    snap: &index::Snapshot<'_>,
    out: &mut NewJournal,
    check: impl Fn(&T::K, &[u8]) -> Result<()>,
) -> Result<u64> {
    let mut n = 0;
    for entry in snap.all::<T>()? {
        let (k, v) = entry?;
        if let Err(e) = check(&k, &v) {
            return Err(crate::Error::corrupt(
                T::NAME,
                index::TableKey::show(&k),
                format!(
                    "{}; the backup stops and writes nothing: run `opjournal repair` on the \
                     journal first (it sets damaged records aside and says what was lost), \
                     then back it up",
                    match e.kind() {
                        crate::ErrorKind::Corrupt { detail, .. } => detail.clone(),
                        _ => e.to_string(),
                    }
                ),
            ));
        }
        out.put::<T>(k, v)?;
        n += 1;
    }
    Ok(n)
}
