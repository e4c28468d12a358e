//! Phase 2: the result payloads. One is copied only if the rebuilt receipt refers to it;
//! one salvaged from the raw bytes only if the file's own receipt (not a stale copy)
//! refers to it and its retention has not passed. A payload that retention dropped is
//! never revived.

use std::collections::BTreeMap;

use smol_str::SmolStr;

use crate::error::Result;
use crate::index::{self, Layered, View};
use crate::record::{ExecRecord, ReceiptRecord};

use super::candidates::decode_result_frame;
use super::rebuild::Build;
use crate::check::verify::corrupt_detail;

impl<'s> Build<'s> {
    /// Phase 2: the result payloads that a rebuilt receipt refers to.
    pub(super) fn results(&mut self) -> Result<()> {
        let mut found: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut after = None;
        let mut gaps = Vec::new();
        let mut damaged: Vec<(u64, Vec<u8>)> = Vec::new();
        loop {
            let chunk = self
                .src
                .read_range::<index::Results>(after.as_ref(), 64, &mut found)?;
            for (seq, raw) in std::mem::take(&mut found) {
                match decode_result_frame(&raw) {
                    Ok((h, _)) if h.completed_seq == seq => {
                        self.take_result(seq, &raw, Provenance::Tree)?;
                    }
                    _ => damaged.push((seq, raw)),
                }
            }
            gaps.extend(chunk.gaps);
            match chunk.resume {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        // Results stored inline in the source's receipts (format 3). A damaged receipt's
        // result is looked for in the raw bytes, as any damaged value's is.
        let mut after_id: Option<SmolStr> = None;
        let mut receipts: Vec<(SmolStr, Vec<u8>)> = Vec::new();
        loop {
            let chunk =
                self.src
                    .read_range::<index::Receipts>(after_id.as_ref(), 64, &mut receipts)?;
            for (_, value) in std::mem::take(&mut receipts) {
                if let Some(tail) = index::split_receipt_value(&value).1
                    && let Ok((h, _)) = decode_result_frame(tail)
                {
                    self.take_result(h.completed_seq, tail, Provenance::Tree)?;
                }
            }
            match chunk.resume {
                Some(k) => after_id = Some(k),
                None => break,
            }
        }
        // Intact copies elsewhere in the file: of a damaged value (its key proves it live),
        // of the unreadable ranges, and of payloads a rebuilt receipt refers to that are not
        // in the table (looked for when the build is given candidates).
        self.wanted.results.extend(gaps.iter().cloned());
        self.wanted
            .result_keys
            .extend(damaged.iter().map(|(k, _)| *k));
        let mut cands: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        if let Some(c) = self.candidates {
            cands.extend(c.results.iter().map(|(k, v)| (*k, v.clone())));
        }
        for (seq, raw) in damaged {
            let detail = match index::decode_result(seq, &raw) {
                Err(e) => corrupt_detail(&e),
                Ok(_) => "unreadable".into(),
            };
            match cands.remove(&seq) {
                Some(copy) => {
                    self.quarantine(
                        "results",
                        seq.to_string(),
                        format!(
                            "{detail}; an intact copy of the payload was found in the file and used"
                        ),
                        &raw,
                    );
                    self.take_result(seq, &copy, Provenance::KeyCopy)?;
                }
                None => self.quarantine("results", seq.to_string(), detail, &raw),
            }
        }
        for (seq, raw) in cands {
            let present = self.out.view(|snap| -> Result<bool> {
                Ok(match decode_result_frame(&raw) {
                    Ok((h, _)) => snap.result_stored(&h.operation_id, seq)?,
                    Err(_) => snap.get::<index::Results>(&seq)?.is_some(),
                })
            })?;
            if !present {
                self.take_result(seq, &raw, Provenance::Raw)?;
            }
        }
        self.unreadable("results", &gaps);
        Ok(())
    }

    pub(super) fn take_result(&mut self, seq: u64, raw: &[u8], from: Provenance) -> Result<()> {
        let Ok((header, bytes)) = decode_result_frame(raw) else {
            return Ok(());
        };
        if header.completed_seq != seq {
            return Ok(());
        }
        let op = header.operation_id.clone();
        let matches = |rec: &ReceiptRecord| match &rec.state {
            ExecRecord::Done(d) => {
                d.result_seq == Some(seq)
                    && d.retired_at.is_none()
                    && bytes.len() as u64 == d.result.len
                    && crc32fast::hash(&bytes) == d.result.crc32
                    && header.changed_assets.len() as u32 == d.result.assets
            }
            _ => false,
        };
        let rebuilt = self.new_receipt(&op)?;
        let referenced = rebuilt.as_ref().is_some_and(matches);
        // A payload found only in the raw bytes may be a stale copy of one that retention
        // dropped: it is taken only while its retention has not passed (retention is the only
        // thing that drops a live operation's payload), and only if the file's own receipt,
        // where it can be read, does not say otherwise.
        let evidence = from != Provenance::Raw || {
            let retained = rebuilt.as_ref().is_some_and(|r| match &r.state {
                ExecRecord::Done(d) => d.deadlines.retain > self.now,
                _ => false,
            });
            let contradicted = match self.src.view(|v| v.receipt(&op)) {
                Ok(Some(stored)) => !matches(&stored),
                Ok(None) => true,
                Err(_) => false,
            };
            retained && !contradicted
        };
        if referenced && evidence {
            if from != Provenance::Tree {
                self.report.salvaged = true;
            }
            let result = crate::types::OpResult {
                bytes,
                changed_assets: header.changed_assets,
            };
            self.batch(|t| t.put_result(seq, &op, &result))?;
            self.out.maybe_flush()?;
        } else if from == Provenance::Tree {
            let live_but_different = rebuilt.as_ref().is_some_and(|r| {
                matches!(&r.state, ExecRecord::Done(d) if d.result_seq == Some(seq) && d.retired_at.is_none())
            });
            if live_but_different {
                self.quarantine(
                    "results",
                    seq.to_string(),
                    format!("payload of `{op}` does not match its completion event"),
                    raw,
                );
            } else {
                self.report.orphan_results_removed += 1;
            }
        }
        Ok(())
    }
}

/// Where a result payload was found.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Provenance {
    /// In the results table.
    Tree,
    /// An intact copy in the raw bytes, of a key whose stored value is damaged.
    KeyCopy,
    /// In the raw bytes, in a range of the table that could not be read.
    Raw,
}
