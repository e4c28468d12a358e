//! The repaired journal being built: [`Build`] holds the new file, the report and what is
//! known of each damaged operation while the phases run (`events`, `results`, `compare`),
//! then writes the meta records and commits durably ([`Build::finish`]).

use std::collections::BTreeMap;

use redb::Database;
use smol_str::SmolStr;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::codec::{self, FORMAT_VERSION, RecordKind};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::index::{self, Layered, Table, TableKey, View, WriteTables};
use crate::machine::Ctx;
use crate::record::{CheckpointRecord, EventKind, FormatRecord, ReceiptRecord, StateRecord};

use super::RepairReport;
use super::candidates::{Candidates, TableGaps};
use crate::check::source::{Gap, Source};
use crate::check::verify::{Finding, corrupt_detail};
use crate::transfer::writer::{BatchWriter, Step};

/// How a build ended.
pub(super) enum Finished {
    /// The repaired journal, committed.
    Done(Database),
    /// Records to look for in the raw bytes before building again.
    Again(TableGaps),
}

/// What is known of an operation's damage while rebuilding.
#[derive(Default, Debug)]
pub(super) struct OpDamage {
    /// Its events that were quarantined (damaged, out of order, not fitting).
    pub(super) quarantined: u32,
    /// Some of its events were salvaged without the evidence of its index.
    pub(super) uncertain: bool,
}

/// The repaired journal being built.
pub(super) struct Build<'s> {
    /// The new file, written in batches of a few MiB (the writer backup and import use).
    pub(super) out: BatchWriter,
    pub(super) src: &'s mut Source,
    pub(super) report: &'s mut RepairReport,
    pub(super) candidates: Option<&'s Candidates>,
    pub(super) damaged: BTreeMap<String, OpDamage>,
    pub(super) quarantine_next: u64,
    pub(super) state: StateRecord,
    pub(super) now: Timestamp,
    pub(super) max_seq: u64,
    pub(super) max_at: Timestamp,
    /// Event keys whose record is intact but carries another seq (the key was damaged).
    pub(super) misfiled: bool,
    /// What to look for in the raw bytes if this build is not given candidates.
    pub(super) wanted: TableGaps,
    /// The ranges of the file's `op_events` index that could not be read (known when raw
    /// candidates are weighed: an entry there is not evidence either way).
    pub(super) op_event_gaps: Vec<Gap<(SmolStr, u64)>>,
    pub(super) cfg: Config,
}

pub(super) fn write_err(e: Error) -> Error {
    e.while_doing(
        "write the repaired journal",
        "the repair stopped and the journal is unchanged (the partial copy was removed)",
    )
}

/// How the new file's errors read: writing it, or committing a batch to it.
fn writer_err(e: Error, step: Step) -> Error {
    match step {
        Step::Write => write_err(e),
        Step::Commit => e.while_doing(
            "sync the repaired journal",
            "the repair stopped and the journal is unchanged (the partial copy was removed)",
        ),
    }
}

impl<'s> Build<'s> {
    pub(super) fn new(
        db: Database,
        src: &'s mut Source,
        report: &'s mut RepairReport,
        candidates: Option<&'s Candidates>,
    ) -> Result<Build<'s>> {
        report.quarantined.retain(|f| f.table == "log");
        report.lost.clear();
        report.unreadable.retain(|f| f.table == "log");
        report.scopes.clear();
        report.index_changes.clear();
        report.events_replayed = 0;
        report.orphan_results_removed = 0;
        report.salvaged = !src.readable();
        let out = BatchWriter::new(db, writer_err)?;
        let old_state = src
            .view(|v| v.state())
            .ok()
            .or_else(|| candidates.and_then(|c| c.state.clone()));
        let now = SystemClock.now().max(
            old_state
                .as_ref()
                .map_or(Timestamp(0), |s| s.clock_high_water),
        );
        Ok(Build {
            out,
            src,
            report,
            candidates,
            damaged: BTreeMap::new(),
            quarantine_next: 1,
            state: old_state.unwrap_or(StateRecord {
                clock_high_water: Timestamp(0),
                next_seq: 1,
            }),
            now,
            max_seq: 0,
            max_at: Timestamp(0),
            misfiled: false,
            wanted: TableGaps::default(),
            op_event_gaps: Vec::new(),
            cfg: Config::default(),
        })
    }

    /// Runs `f` on a batch over the new file's changes so far; its changes are kept if it
    /// returns `Ok`.
    pub(super) fn batch<R>(
        &mut self,
        f: impl FnOnce(&mut WriteTables<'_>) -> Result<R>,
    ) -> Result<R> {
        self.out.batch(f)
    }

    pub(super) fn quarantine(&mut self, table: &str, key: String, problem: String, raw: &[u8]) {
        // A quarantined value: a framed record whose payload is (table, key, problem) in
        // the codec's encoding, followed by the raw bytes as they were found (like a result payload, so
        // the decode limit does not apply to them).
        let mut payload = codec::encode_payload(&(table, key.as_str(), problem.as_str()));
        payload.extend_from_slice(raw);
        let n = self.quarantine_next;
        self.quarantine_next += 1;
        self.out
            .set::<index::Quarantine>(n, codec::frame(RecordKind::Quarantine, &payload));
        self.report
            .quarantined
            .push(Finding::new(table, key, problem));
    }

    pub(super) fn damage(&mut self, op: &str) -> &mut OpDamage {
        self.damaged.entry(op.to_string()).or_default()
    }

    pub(super) fn unreadable<K: TableKey>(&mut self, table: &str, gaps: &[Gap<K>]) {
        for g in gaps {
            self.report.unreadable.push(Finding::new(
                table,
                g.describe(),
                format!("the storage engine could not read these entries: {}", g.why),
            ));
        }
    }

    /// The new file's receipt of `op`.
    pub(super) fn new_receipt(&self, op: &str) -> Result<Option<ReceiptRecord>> {
        self.out.view(|snap| snap.receipt(op))
    }

    /// Phases 3 and 4, then the meta records and a durable commit.
    pub(super) fn finish(mut self, dropped_ops: &super::Dropped) -> Result<Finished> {
        self.results()?;
        // The other tables are rebuilt from the events; their damaged values are
        // quarantined and their unreadable ranges reported.
        self.check_other_tables()?;
        let actions = self.compare_operations(dropped_ops)?;
        if self.candidates.is_none() && !self.wanted.is_empty() {
            return Ok(Finished::Again(std::mem::take(&mut self.wanted)));
        }
        let scope_actions = self.compare_scopes()?;
        self.apply_actions(actions, scope_actions)?;
        self.write_meta()?;
        self.out.flush(true)?;
        self.compare_indexes()?;
        self.report.receipts_rebuilt = self.count_new::<index::Receipts>()?;
        self.report.scopes_rebuilt = self.count_new::<index::Scopes>()?;
        // Everything was written durably above: nothing more is committed.
        Ok(Finished::Done(self.out.finish()?))
    }

    pub(super) fn count_new<T: Table>(&self) -> Result<u64> {
        self.out.view(|snap| snap.count::<T>())
    }

    /// Damaged values and unreadable ranges of the index tables (rebuilt from the events).
    pub(super) fn check_other_tables(&mut self) -> Result<()> {
        let receipts = self.check_values::<index::Receipts>("receipts", |k, v| {
            index::decode_receipt(k, v).map(|_| ())
        })?;
        // Intact copies of the receipts there are looked for in the raw bytes: the evidence
        // of an operation whose events were lost too.
        self.wanted.receipts.extend(receipts);
        self.check_values::<index::Scopes>("scopes", |k, v| index::decode_scope(k, v).map(|_| ()))?;
        self.check_values::<index::Meta>("meta", |k, v| match k {
            "format" => index::decode_format(v).map(|_| ()),
            "state" => index::decode_meta::<StateRecord>("state", v).map(|_| ()),
            "checkpoint" => index::decode_meta::<CheckpointRecord>("checkpoint", v).map(|_| ()),
            // Applied as the events and results are read; the new file has none pending.
            index::purged::KEY => index::purged::Purged::decode(v).map(|_| ()),
            _ => Err(Error::corrupt("meta", k, "not an entry of the meta table")),
        })?;
        let g = self.src.read_table::<index::OpEvents>(|_, ()| Ok(()))?;
        self.unreadable("op_events", &g);
        Ok(())
    }

    /// Quarantines the values of a table keyed by name that `check` refuses, and reports
    /// its unreadable ranges (which it returns).
    pub(super) fn check_values<T: Table<K = SmolStr, V = Vec<u8>>>(
        &mut self,
        table: &str,
        check: impl Fn(&str, &[u8]) -> Result<()>,
    ) -> Result<Vec<Gap<SmolStr>>> {
        let mut bad: Vec<(String, String, Vec<u8>)> = Vec::new();
        let gaps = self.src.read_table::<T>(|k, v| {
            if let Err(e) = check(&k, &v) {
                bad.push((k.to_string(), corrupt_detail(&e), v));
            }
            Ok(())
        })?;
        for (k, d, v) in bad {
            self.quarantine(table, k, d, &v);
        }
        self.unreadable(table, &gaps);
        Ok(gaps)
    }

    /// The meta records: the format (upgraded to this one), the state, and a checkpoint
    /// that keeps the journal id and starts a new log cycle (a log left from the old one is
    /// then recognized as stale).
    pub(super) fn write_meta(&mut self) -> Result<()> {
        let old_format = self.src.view(|v| v.format()).ok().flatten();
        let old_cp = self
            .src
            .view(|v| v.checkpoint())
            .ok()
            .flatten()
            .or_else(|| self.candidates.and_then(|c| c.checkpoint.clone()));
        let now = self.now;
        let format = match old_format {
            Some(f) if f.format_version == u32::from(FORMAT_VERSION) => f,
            Some(old) => {
                let mut state = self.state.clone();
                let cfg = self.cfg.clone();
                self.batch(|t| {
                    let mut ctx = Ctx {
                        t,
                        now,
                        cfg: &cfg,
                        state: &mut state,
                        fired: Default::default(),
                    };
                    ctx.append(
                        None,
                        EventKind::FormatUpgraded {
                            from: old.format_version,
                            to: u32::from(FORMAT_VERSION),
                        },
                    )
                    .map(drop)
                })?;
                self.state = state;
                FormatRecord {
                    format_version: u32::from(FORMAT_VERSION),
                    upgraded: Some(crate::record::Upgrade {
                        from: old.format_version,
                        at: now,
                    }),
                    ..old
                }
            }
            None => FormatRecord {
                format_version: u32::from(FORMAT_VERSION),
                created_at: Timestamp(0),
                created_by: format!("opjournal {} repair", env!("CARGO_PKG_VERSION")),
                upgraded: None,
            },
        };
        let cp = match old_cp {
            Some(cp) => CheckpointRecord {
                journal_id: cp.journal_id,
                generation: cp.generation + 1,
                next_lsn: cp.next_lsn
                    + self.report.log_records
                    + self.report.log_records_dropped
                    + 1,
            },
            None => CheckpointRecord {
                journal_id: crate::log::new_journal_id(),
                generation: 1,
                next_lsn: 1,
            },
        };
        let state = self.state.clone();
        self.batch(|t| {
            t.put_format(&format)?;
            t.put_state(&state)?;
            t.put_checkpoint(&cp)
        })
    }
}
