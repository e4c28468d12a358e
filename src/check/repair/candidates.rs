//! Salvage candidates: records found in the raw bytes for the key ranges of the tables redb
//! could not read (and for damaged values whose key proves them live). They wait here to be
//! taken with evidence (see `events` and `results`); a copy of a receipt is never taken
//! as it is, only as the evidence that its operation existed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;

use smol_str::SmolStr;

use crate::codec::{self, RecordKind};
use crate::error::Result;
use crate::index;
use crate::record::{CheckpointRecord, Event, ExecRecord, ReceiptRecord, StateRecord};

use crate::check::salvage::{MetaFound, scan_file};
use crate::check::source::{Gap, Source};

/// Records found in the raw bytes where redb could not read the events,
/// results, receipts or meta tables, waiting to be taken with evidence.
#[derive(Default)]
pub(super) struct Candidates {
    pub(super) events: BTreeMap<u64, Event>,
    pub(super) results: BTreeMap<u64, Vec<u8>>,
    /// Receipts in the receipts table's unreadable ranges, the latest found of each
    /// operation ([`later_receipt`]). Never taken as they are (a copy may predate the
    /// operation's last changes): they are the evidence that an operation existed when
    /// its events were lost with its receipt, so that it is named and held in doubt rather
    /// than forgotten (a resubmission would run it again).
    pub(super) receipts: BTreeMap<String, ReceiptRecord>,
    /// The latest checkpoint and state records found (largest generation, largest
    /// sequence), for a meta table that cannot be read.
    pub(super) checkpoint: Option<CheckpointRecord>,
    pub(super) state: Option<StateRecord>,
}

impl Candidates {
    /// Scans the file for the records of the tables' unreadable ranges.
    pub(super) fn scan(file: &File, src: &Source, gaps: &TableGaps) -> Result<Candidates> {
        let mut c = Candidates::default();
        scan_file(file, src.extent.journal_len(), |_, kind, frame| {
            match kind {
                RecordKind::Event => {
                    if let Ok(ev) = index::decode_event_frame(frame)
                        && (gaps.events.iter().any(|g| g.contains(&ev.seq))
                            || gaps.event_keys.contains(&ev.seq))
                    {
                        c.events.entry(ev.seq).or_insert(ev);
                    }
                }
                RecordKind::Receipt => {
                    if let Ok(rec) = index::decode_receipt_frame(frame)
                        && gaps
                            .receipts
                            .iter()
                            .any(|g| g.contains(&SmolStr::new(&rec.operation_id)))
                    {
                        match c.receipts.get_mut(&rec.operation_id) {
                            Some(old) if later_receipt(&rec, old) => *old = rec,
                            Some(_) => {}
                            None => {
                                c.receipts.insert(rec.operation_id.clone(), rec);
                            }
                        }
                    }
                }
                RecordKind::Result => {
                    if let Ok((h, _)) = decode_result_frame(frame)
                        && (gaps.results.iter().any(|g| g.contains(&h.completed_seq))
                            || gaps.result_keys.contains(&h.completed_seq))
                    {
                        c.results
                            .entry(h.completed_seq)
                            .or_insert_with(|| frame.to_vec());
                    }
                }
                RecordKind::Meta if gaps.meta => match MetaFound::of(frame) {
                    Some(MetaFound::Checkpoint(cp))
                        if c.checkpoint
                            .as_ref()
                            .is_none_or(|old| old.generation < cp.generation) =>
                    {
                        c.checkpoint = Some(cp);
                    }
                    Some(MetaFound::State(s))
                        if c.state.as_ref().is_none_or(|old| old.next_seq < s.next_seq) =>
                    {
                        c.state = Some(s);
                    }
                    _ => {}
                },
                _ => {}
            }
            Ok(())
        })?;
        Ok(c)
    }
}

/// Whether receipt `a` records a later state of its operation than `b` (copies of one
/// operation's receipt found in the raw bytes): a later attempt, then a later state
/// (running, in doubt, then terminal or released), then retired, then more deliveries.
pub(super) fn later_receipt(a: &ReceiptRecord, b: &ReceiptRecord) -> bool {
    let key = |r: &ReceiptRecord| {
        let (rank, retired, deliveries) = match &r.state {
            ExecRecord::Running { .. } => (0, false, 0),
            ExecRecord::InDoubt { .. } => (1, false, 0),
            ExecRecord::Vacant { .. } => (2, false, 0),
            ExecRecord::Done(d) => (2, d.retired_at.is_some(), d.delivery.count),
        };
        (r.epoch, rank, retired, deliveries)
    };
    key(a) > key(b)
}

/// One gap covering every key.
pub(super) fn every_key<K>() -> Vec<Gap<K>> {
    vec![Gap {
        after: None,
        before: None,
        why: String::new(),
    }]
}

/// The unreadable ranges of the tables whose records a raw scan may find.
#[derive(Default, Clone)]
pub(super) struct TableGaps {
    pub(super) events: Vec<Gap<u64>>,
    /// Events whose key is in the table but whose stored value is damaged: an intact copy
    /// elsewhere in the file (the key proves it live) replaces it.
    pub(super) event_keys: BTreeSet<u64>,
    pub(super) results: Vec<Gap<u64>>,
    pub(super) result_keys: BTreeSet<u64>,
    /// The receipts table's unreadable ranges.
    pub(super) receipts: Vec<Gap<SmolStr>>,
    pub(super) meta: bool,
}

impl TableGaps {
    /// Every table unreadable (the engine refuses the file).
    pub(super) fn all() -> TableGaps {
        TableGaps {
            events: every_key(),
            event_keys: BTreeSet::new(),
            results: every_key(),
            result_keys: BTreeSet::new(),
            receipts: every_key(),
            meta: true,
        }
    }
}

impl TableGaps {
    pub(super) fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.event_keys.is_empty()
            && self.results.is_empty()
            && self.result_keys.is_empty()
            && self.receipts.is_empty()
            && !self.meta
    }
}

/// A result record's header and payload, wherever it was found (its key unchecked).
pub(super) fn decode_result_frame(
    bytes: &[u8],
) -> std::result::Result<(crate::record::ResultHeader, Vec<u8>), codec::FrameError> {
    let (version, payload) = codec::unframe_versioned(RecordKind::Result, bytes)?;
    let (header, used): (crate::record::ResultHeader, usize) =
        codec::decode_prefix(version, payload)?;
    Ok((header, payload[used..].to_vec()))
}
