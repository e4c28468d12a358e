//! Phase 1: every event, in seq order, the tree's merged with raw candidates (the tree's
//! copy wins), each checked (CRC, decode, its own seq, times that never go backwards) and
//! applied with the writer's own code (`machine::apply`). An event that does not fit its
//! operation's history, or does not decode, is quarantined; a raw candidate is taken only
//! with evidence that it is live.

use std::collections::BTreeSet;

use smol_str::SmolStr;

use crate::clock::Timestamp;
use crate::codec::{self, RecordKind};
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Layered, View};
use crate::machine;
use crate::record::{Event, EventKind};

use super::rebuild::{Build, write_err};
use crate::check::source::Gap;
use crate::check::verify::corrupt_detail;

/// Events are checked for time order in windows of this many (twice this many are held).
const TIME_WINDOW: usize = 16_384;

impl<'s> Build<'s> {
    /// Phase 1: every event, in seq order. What could not be read is noted in `wanted`.
    pub(super) fn events(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let total = self
            .src
            .view(|v| v.count::<index::Events>())
            .unwrap_or_default();
        // The old quarantine first: its entries keep their order.
        let mut old_q: Vec<(u64, Vec<u8>)> = Vec::new();
        let q_gaps = self.src.read_table::<index::Quarantine>(|k, v| {
            old_q.push((k, v));
            Ok(())
        })?;
        self.unreadable("quarantine", &q_gaps);
        for (_, v) in old_q {
            let n = self.quarantine_next;
            self.quarantine_next += 1;
            self.out.set::<index::Quarantine>(n, v);
        }
        let cands: Vec<Event> = self
            .candidates
            .map(|c| c.events.values().cloned().collect())
            .unwrap_or_default();
        if !cands.is_empty() && self.src.readable() {
            self.op_event_gaps = self.src.read_table::<index::OpEvents>(|_, ()| Ok(()))?;
        }
        let mut cands = cands.into_iter().peekable();
        let mut window: Vec<Pending> = Vec::new();
        let mut floor = Timestamp(0);
        let mut seen = 0u64;
        let mut gaps: Vec<Gap<u64>> = Vec::new();
        let mut after: Option<u64> = None;
        let mut buffer: Vec<(u64, Vec<u8>)> = Vec::new();
        // The tree's events and the raw candidates merge in seq order; the tree's copy wins.
        loop {
            let chunk = self
                .src
                .read_range::<index::Events>(after.as_ref(), 4096, &mut buffer)?;
            let mut items = Vec::with_capacity(buffer.len());
            for (seq, raw) in buffer.drain(..) {
                seen += 1;
                if seen.is_multiple_of(4096) {
                    progress(seen, total);
                }
                while cands.peek().is_some_and(|c| c.seq < seq) {
                    if let Some(ev) = cands.next()
                        && let Some(item) = self.candidate(ev)?
                    {
                        items.push(item);
                    }
                }
                if cands.peek().is_some_and(|c| c.seq == seq) {
                    cands.next();
                }
                if let Some(item) = self.tree_event(seq, raw) {
                    items.push(item);
                }
            }
            for item in items {
                window.push(item);
                if window.len() >= 2 * TIME_WINDOW {
                    self.decide(&mut window, TIME_WINDOW, &mut floor)?;
                }
            }
            gaps.extend(chunk.gaps);
            match chunk.resume {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        for ev in cands {
            if let Some(item) = self.candidate(ev)? {
                window.push(item);
            }
        }
        let n = window.len();
        self.decide(&mut window, n, &mut floor)?;
        progress(seen, total);
        if self.misfiled {
            self.wanted.events.push(Gap {
                after: None,
                before: None,
                why: String::new(),
            });
        }
        self.wanted.events.extend(gaps.iter().cloned());
        self.wanted.meta = self.src.view(|v| v.state()).is_err();
        self.unreadable("events", &gaps);
        Ok(())
    }

    /// An event read from the tree, checked; `None` when it was quarantined.
    pub(super) fn tree_event(&mut self, seq: u64, raw: Vec<u8>) -> Option<Pending> {
        match index::decode_event(seq, &raw) {
            Ok(ev) => Some(Pending { ev, raw }),
            Err(e)
                if self.candidates.is_some_and(|c| c.events.contains_key(&seq))
                    && index::decode_event_frame(&raw).is_err() =>
            {
                // The stored value is damaged, but an intact copy of the event is elsewhere
                // in the file, and the key proves it live: the copy is used.
                let ev = self.candidates.and_then(|c| c.events.get(&seq).cloned())?;
                self.quarantine(
                    "events",
                    seq.to_string(),
                    format!(
                        "{}; an intact copy of the event was found in the file and used",
                        corrupt_detail(&e)
                    ),
                    &raw,
                );
                self.report.salvaged = true;
                let raw = codec::encode(RecordKind::Event, &ev);
                Some(Pending { ev, raw })
            }
            Err(e) => {
                if index::decode_event_frame(&raw).is_err() {
                    self.wanted.event_keys.insert(seq);
                }
                let intact = index::decode_event_frame(&raw).ok();
                if let Some(ev) = &intact
                    && ev.seq != seq
                {
                    // An intact record under a damaged key: it goes back under its own seq
                    // (a raw candidate), unless the table has it there.
                    self.misfiled = true;
                    if let Some(c) = self.candidates
                        && c.events.contains_key(&ev.seq)
                    {
                        return None;
                    }
                }
                let owner = intact.and_then(|ev| ev.operation_id).or_else(|| {
                    self.src
                        .view(|v| {
                            let mut owner = None;
                            for entry in v.all::<index::OpEvents>()? {
                                let ((op, s), ()) = entry?;
                                if s == seq {
                                    owner = Some(op.to_string());
                                    break;
                                }
                            }
                            Ok(owner)
                        })
                        .ok()
                        .flatten()
                });
                let problem = match &owner {
                    Some(op) => format!("{} (an event of `{op}`)", corrupt_detail(&e)),
                    None => corrupt_detail(&e),
                };
                self.quarantine("events", seq.to_string(), problem, &raw);
                if let Some(op) = owner {
                    self.damage(&op).quarantined += 1;
                }
                None
            }
        }
    }

    /// A raw candidate event, taken only with evidence that it is live.
    pub(super) fn candidate(&mut self, ev: Event) -> Result<Option<Pending>> {
        let evidence: std::result::Result<bool, ()> = match (&ev.operation_id, &ev.kind) {
            (Some(op), _) => {
                let key = (SmolStr::new(op), ev.seq);
                match self.src.view(|v| v.get::<index::OpEvents>(&key)) {
                    Ok(Some(())) => Ok(true),
                    // Absent where the index could not be read proves nothing.
                    Ok(None) if self.op_event_gaps.iter().any(|g| g.contains(&key)) => Err(()),
                    Ok(None) => Ok(false),
                    Err(_) => Err(()),
                }
            }
            (
                None,
                EventKind::RevisionAdvanced {
                    scope, purge_at, ..
                },
            ) => self
                .src
                .view(|v| {
                    Ok(v.get::<index::ScopeTimers>(&(purge_at.0, ev.seq))?
                        .is_some()
                        || v.scope(scope)?.is_some_and(|s| s.anchor_seq == ev.seq))
                })
                .map_err(|_| ()),
            (None, _) => Ok(true),
        };
        match evidence {
            Ok(false) => Ok(None),
            live => {
                self.report.salvaged = true;
                if live.is_err()
                    && let Some(op) = &ev.operation_id
                {
                    self.damage(op).uncertain = true;
                }
                let raw = codec::encode(RecordKind::Event, &ev);
                Ok(Some(Pending { ev, raw }))
            }
        }
    }

    /// Decides the first `n` events of `window`: those in the longest run whose times never
    /// go backwards (from `floor` on) are applied, the others quarantined.
    pub(super) fn decide(
        &mut self,
        window: &mut Vec<Pending>,
        n: usize,
        floor: &mut Timestamp,
    ) -> Result<()> {
        let times: Vec<(usize, Timestamp)> = window
            .iter()
            .enumerate()
            .filter(|(_, p)| p.ev.at >= *floor)
            .map(|(i, p)| (i, p.ev.at))
            .collect();
        let keep = time_ordered(&times);
        let n = n.min(window.len());
        for (i, p) in window.drain(..n).enumerate() {
            if keep.contains(&i) {
                *floor = p.ev.at;
                self.apply(p)?;
            } else {
                let problem = format!(
                    "recorded at {} out of time order with the events around it",
                    p.ev.at
                );
                if let Some(op) = &p.ev.operation_id {
                    self.damage(op).quarantined += 1;
                }
                self.quarantine("events", p.ev.seq.to_string(), problem, &p.raw);
            }
        }
        Ok(())
    }

    /// Applies one event with the writer's own code; one that does not fit its operation's
    /// history is quarantined, and none of its changes kept.
    pub(super) fn apply(&mut self, p: Pending) -> Result<()> {
        /// Which step of applying an event failed.
        enum Failed {
            Store(Error),
            Fold(Error),
        }
        let ev = p.ev;
        let r = self.out.batch(|t| {
            t.put_event(&ev).map_err(Failed::Store)?;
            machine::apply(t, &ev).map_err(Failed::Fold)
        });
        match r {
            Ok(()) => {
                self.report.events_replayed += 1;
                self.max_seq = self.max_seq.max(ev.seq);
                self.max_at = self.max_at.max(ev.at);
                self.out.maybe_flush()
            }
            Err(Failed::Store(e)) => Err(e),
            Err(Failed::Fold(e)) if matches!(e.kind(), ErrorKind::Corrupt { .. }) => {
                if let Some(op) = &ev.operation_id {
                    self.damage(op).quarantined += 1;
                }
                self.quarantine("events", ev.seq.to_string(), corrupt_detail(&e), &p.raw);
                Ok(())
            }
            Err(Failed::Fold(e)) => Err(write_err(e)),
        }
    }
}

/// An event waiting for its time-order decision, with the bytes it was found as.
pub(super) struct Pending {
    ev: Event,
    raw: Vec<u8>,
}

/// The indexes of the longest run of `events` (in order) whose times never decrease
/// (patience sorting, `O(n log n)`).
pub(super) fn time_ordered(events: &[(usize, Timestamp)]) -> BTreeSet<usize> {
    // tails[k]: the event ending the best run of length k + 1 found so far.
    let mut tails: Vec<usize> = Vec::new();
    let mut prev: Vec<Option<usize>> = vec![None; events.len()];
    for (i, &(_, at)) in events.iter().enumerate() {
        let k = tails.partition_point(|&j| events[j].1 <= at);
        if k > 0 {
            prev[i] = Some(tails[k - 1]);
        }
        if k == tails.len() {
            tails.push(i);
        } else {
            tails[k] = i;
        }
    }
    let mut keep = BTreeSet::new();
    let mut cur = tails.last().copied();
    while let Some(i) = cur {
        keep.insert(events[i].0);
        cur = prev[i];
    }
    keep
}
