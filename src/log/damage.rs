//! What recovery drops although no crash can have left it so: damage, for `verify` and
//! `repair`.

use std::io;

use super::format::*;
use super::reader::{Reader, Record, Slot, Window};
use super::storage::LogStorage;

/// What recovery drops although no crash can have left it so, for `verify` and `repair`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// The header is damaged (or missing) while records of the current cycle follow it: a
    /// writer's open starts the log over and discards them.
    pub header_damaged: bool,
    /// The record that ends the valid prefix, when it is damaged rather than torn: its lsn
    /// and what is wrong with it.
    pub damaged: Option<(u64, String)>,
    /// The records after the damaged one whose own CRCs hold, chained from it.
    pub records: u64,
    /// The log's length is not one its writer gives it: what that means.
    pub length: Option<String>,
}

/// What one record slot of a log holds, for [`dropped`].
enum Probe {
    /// The next record, whole.
    Valid { end: u64, crc: u32 },
    /// What a crash can leave where the records end: zeros, a torn record, a record of an
    /// earlier cycle (or nothing to read).
    End,
    /// The next record, written whole and damaged since: what is wrong, where it ends
    /// and the CRCs the record after it may chain from (when its length is known), its
    /// kind and payload as found.
    Damaged {
        why: String,
        end: Option<u64>,
        chain: [u32; 2],
        kind: u8,
        payload: Vec<u8>,
    },
}

/// At most this many places are tried as the end of a record whose length field may be
/// damaged (each try reads the record's CRC): a log full of end markers stays cheap.
const MAX_END_CANDIDATES: usize = 64;

/// Reads the record slot at `at` (the valid records of the cycle end before it) and tells
/// a crash's leftovers from damage. A power cut during an append leaves the record's
/// unwritten sectors as they were, which is zero (the writer's invariant); a kill or a
/// short write leaves a prefix, without the trailer. So a record whose header is the
/// expected one and whose CRC fails is *damaged* when its trailer is in place and none of
/// its sectors is blank, or when the CRC holds once one field of its header is taken as the
/// expected value (its magic, version, generation, lsn, or a length that finds the
/// trailer): a torn write leaves neither.
fn probe(
    storage: &dyn LogStorage,
    len: u64,
    at: u64,
    cursor: Cursor,
    next_lsn: u64,
    prev: u32,
) -> io::Result<Probe> {
    if at + RECORD_HEADER_LEN as u64 > len {
        return Ok(Probe::End);
    }
    let mut rh = [0u8; RECORD_HEADER_LEN];
    storage.read_at(at, &mut rh)?;
    if rh.iter().all(|b| *b == 0) {
        return Ok(Probe::End);
    }
    let problem = head_problem(&rh, cursor, next_lsn);
    // The header as it must read, but for its kind, length and CRC.
    let mut head = rh;
    head[0..2].copy_from_slice(&RECORD_MAGIC);
    head[2] = LOG_VERSION;
    head[8..16].copy_from_slice(&cursor.generation.to_le_bytes());
    head[16..24].copy_from_slice(&next_lsn.to_le_bytes());
    let stored = u32_at(&head, 24);
    let kind = head[3];
    let plen = u64::from(u32_at(&head, 4));
    let end = record_end(at, plen);
    let read_payload = |plen: u64| -> io::Result<Vec<u8>> {
        let mut payload = vec![0u8; usize::try_from(plen).map_err(io::Error::other)?];
        storage.read_at(at + RECORD_HEADER_LEN as u64, &mut payload)?;
        Ok(payload)
    };
    if plen <= MAX_PAYLOAD && end <= len {
        let payload = read_payload(plen)?;
        let crc = record_crc(prev, &head[0..24], &payload);
        match (crc == stored, problem.as_deref()) {
            (true, None) => return Ok(Probe::Valid { end, crc }),
            // A torn append whose header straddles a sector boundary: the sector holding
            // the header's first bytes did not land (they read zero, as the writer left
            // the tail) while the next one did. Mended, they are the expected ones, so
            // the CRC holds; the record was never synced, so it is no damage.
            (true, Some(_)) if torn_header_start(&rh, &head, at) => return Ok(Probe::End),
            (true, Some(p)) => {
                return Ok(Probe::Damaged {
                    why: format!("its header is damaged ({p}), while its CRC holds"),
                    end: Some(end),
                    chain: [stored, stored],
                    kind,
                    payload,
                });
            }
            // Not this cycle's next record, even with its header mended: zeros, a record
            // of an earlier cycle, or a torn header.
            (false, Some(_)) => return Ok(Probe::End),
            (false, None) => {}
        }
        let mut trailer = [0u8; RECORD_TRAILER_LEN];
        storage.read_at(end - RECORD_TRAILER_LEN as u64, &mut trailer)?;
        if trailer == RECORD_TRAILER && !has_blank_sector(storage, len, at, end)? {
            return Ok(Probe::Damaged {
                why: "its CRC does not match, although it was written whole (its end marker \
                      is in place and none of its sectors is blank, as a torn write would \
                      leave one)"
                    .into(),
                end: Some(end),
                chain: [stored, crc],
                kind,
                payload,
            });
        }
    } else if problem.is_some() {
        return Ok(Probe::End);
    } else if end > len && !is_capacity(len) {
        // The header is the expected one and its sector was written whole (the length
        // lies between the fields that match), so the record was there: the file was cut.
        return Ok(Probe::Damaged {
            why: format!(
                "it declares {plen} bytes, which run past the end of the file: the log was cut"
            ),
            end: None,
            chain: [stored, stored],
            kind,
            payload: Vec::new(),
        });
    }
    if problem.is_some() {
        return Ok(Probe::End);
    }
    // The trailer is not where the length says: a torn write, or a damaged length. Look
    // for a trailer after which the record's CRC holds.
    let from = at + RECORD_HEADER_LEN as u64;
    let until = len.min(from + MAX_PAYLOAD + RECORD_TRAILER_LEN as u64);
    let mut candidates = 0;
    let mut window = Window::default();
    let mut pos = from;
    while pos + RECORD_TRAILER_LEN as u64 <= until && candidates < MAX_END_CANDIDATES {
        let n = (until - pos).min(Window::CHUNK as u64) as usize;
        let chunk = window.get(storage, pos, n, len)?.to_vec();
        for (i, w) in chunk.windows(RECORD_TRAILER_LEN).enumerate() {
            if w != RECORD_TRAILER {
                continue;
            }
            candidates += 1;
            let p = pos + i as u64 - from;
            if p != plen {
                let mut h = head;
                h[4..8].copy_from_slice(&u32::try_from(p).unwrap_or(u32::MAX).to_le_bytes());
                let payload = read_payload(p)?;
                if record_crc(prev, &h[0..24], &payload) == stored {
                    return Ok(Probe::Damaged {
                        why: format!(
                            "its length field is damaged (it says {plen} bytes; the record \
                             holds {p})"
                        ),
                        end: Some(record_end(at, p)),
                        chain: [stored, stored],
                        kind,
                        payload,
                    });
                }
            }
            if candidates >= MAX_END_CANDIDATES {
                break;
            }
        }
        if n <= RECORD_TRAILER_LEN {
            break;
        }
        // Overlap by the trailer's length less one, so a trailer across chunks is seen.
        pos += (n - (RECORD_TRAILER_LEN - 1)) as u64;
    }
    Ok(Probe::End)
}

/// Whether `found`, a record header at `at` that reads as `expected` once its fixed fields
/// are mended, differs from it only in bytes that a torn write leaves blank: it straddles
/// a sector boundary, its bytes before the boundary are all zero and the rest match.
fn torn_header_start(found: &[u8], expected: &[u8], at: u64) -> bool {
    let in_first = usize::try_from(SECTOR - at % SECTOR).unwrap_or(usize::MAX);
    in_first < found.len()
        && found[..in_first].iter().all(|b| *b == 0)
        && found[in_first..] == expected[in_first..]
}

/// Whether a [`SECTOR`]-aligned sector overlapping `at..end` (read whole, up to `len`) is
/// all zero: what a power cut leaves of a sector of a record that did not land.
fn has_blank_sector(storage: &dyn LogStorage, len: u64, at: u64, end: u64) -> io::Result<bool> {
    let from = at / SECTOR * SECTOR;
    let to = end.div_ceil(SECTOR).saturating_mul(SECTOR).min(len);
    let mut buf = vec![0u8; usize::try_from(to - from).map_err(io::Error::other)?];
    storage.read_at(from, &mut buf)?;
    Ok(buf
        .chunks(SECTOR as usize)
        .any(|sector| sector.iter().all(|b| *b == 0)))
}

/// Reads `storage` record by record (never the whole log at once) for what recovery drops
/// although no crash can have left it so:
/// - a damaged record where the valid records end (see [`probe`]: a torn or never-synced
///   record is not damage, a record written whole and changed since is), and the records
///   after it that continue the chain from it (a record whose CRC fails with valid records
///   after it is always damage: a record is written only after the one before was synced);
/// - a damaged header with records of the current cycle after it;
/// - a length the writer never gives the file (it was cut or extended).
///
/// Calls `each` with every dropped record whose payload is known: those after the damage,
/// then the damaged record itself as found, so that the operations they touched can be
/// named.
///
/// # Errors
///
/// The storage's I/O error; `each`'s error.
pub(crate) fn dropped<E: From<io::Error>>(
    storage: &dyn LogStorage,
    cursor: Cursor,
    mut each: impl FnMut(Record<'_>) -> Result<(), E>,
) -> Result<Dropped, E> {
    let len = storage.len()?;
    let mut out = Dropped::default();
    let mut head = [0u8; HEADER_LEN];
    let header = if len >= HEADER_LEN as u64 {
        storage.read_at(0, &mut head)?;
        Header::decode(&head).ok()
    } else {
        None
    };
    if header
        .is_some_and(|h| h.journal_id != cursor.journal_id || h.version != u32::from(LOG_VERSION))
    {
        // Another journal's log, or another format's: none of its records are this cycle's.
        return Ok(out);
    }
    if len > 0 && !is_capacity(len) {
        out.length = Some(format!(
            "the log is {len} bytes, a length its writer never gives it (a power of two of at \
             least {INITIAL_CAPACITY}): it was cut or extended, and records past its end, if \
             there were any, are lost"
        ));
    }
    if header.is_none() {
        // Without a header a writer starts the log over: the records of the current cycle
        // after it (from the first on, chained from the cycle's seed) are dropped.
        out.records = valid_run(
            storage,
            len,
            START,
            cursor,
            cursor.first_lsn,
            &[seed(cursor.journal_id, cursor.generation)],
            &mut each,
        )?;
        out.header_damaged = out.records > 0;
        return Ok(out);
    }
    // The valid prefix, as recovery reads it.
    let mut at = START;
    let mut next_lsn = cursor.first_lsn;
    let mut prev = seed(cursor.journal_id, cursor.generation);
    loop {
        // The record that ends the valid prefix, if it is damaged: what is wrong, where it
        // ends, the CRCs the next record may chain from, its kind and payload, and whether
        // that takes valid records after it.
        let (why, end, chain, kind, payload, needs_followers) =
            match probe(storage, len, at, cursor, next_lsn, prev)? {
                Probe::Valid { end, crc } => {
                    let Some(next) = next_lsn.checked_add(1) else {
                        break;
                    };
                    at = end;
                    prev = crc;
                    next_lsn = next;
                    continue;
                }
                Probe::End => {
                    // A record whose CRC fails with valid records after it is damage,
                    // whatever its sectors look like.
                    let Some((end, chain, kind, payload)) =
                        failing_record(storage, len, at, cursor, next_lsn, prev)?
                    else {
                        break;
                    };
                    let why = "its CRC does not match".to_string();
                    (why, Some(end), chain, kind, payload, true)
                }
                Probe::Damaged {
                    why,
                    end,
                    chain,
                    kind,
                    payload,
                } => (why, end, chain, kind, payload, false),
            };
        let followers = match end {
            Some(end) => valid_run(
                storage,
                len,
                end,
                cursor,
                next_lsn.saturating_add(1),
                &chain,
                &mut each,
            )?,
            None => 0,
        };
        if followers > 0 || !needs_followers {
            out.damaged = Some((next_lsn, why));
            out.records = followers;
            if !payload.is_empty() {
                each(Record {
                    lsn: next_lsn,
                    kind,
                    payload: &payload,
                })?;
            }
        }
        break;
    }
    Ok(out)
}

/// The record at `at` when its header is the expected one and its payload lies in the
/// file but its CRC fails: where it ends, the CRCs a next record may chain from (the
/// stored one, the computed one), its kind and payload.
#[allow(clippy::type_complexity)]
fn failing_record(
    storage: &dyn LogStorage,
    len: u64,
    at: u64,
    cursor: Cursor,
    next_lsn: u64,
    prev: u32,
) -> io::Result<Option<(u64, [u32; 2], u8, Vec<u8>)>> {
    let mut reader = Reader::new(storage, len);
    Ok(match reader.slot(at, cursor, next_lsn, prev)? {
        Slot::Framed(f) => Some((f.end, [f.stored, f.computed], f.kind(), f.payload.to_vec())),
        _ => None,
    })
}

/// Counts the valid records from `at` (lsn `lsn` on), the first chained from one of
/// `chain`, and passes each to `each`.
fn valid_run<E: From<io::Error>>(
    storage: &dyn LogStorage,
    len: u64,
    mut at: u64,
    cursor: Cursor,
    mut lsn: u64,
    chain: &[u32],
    each: &mut impl FnMut(Record<'_>) -> Result<(), E>,
) -> Result<u64, E> {
    let mut n = 0;
    let mut reader = Reader::new(storage, len);
    // The first record may chain from any of `chain`; each later one from the one before.
    let mut chain = chain.to_vec();
    while let Some(&prev) = chain.first()
        && let Slot::Framed(f) = reader.slot(at, cursor, lsn, prev)?
        && chain.iter().any(|p| f.holds_after(*p))
    {
        each(Record {
            lsn,
            kind: f.kind(),
            payload: f.payload,
        })?;
        n += 1;
        chain = vec![f.stored];
        let Some(next) = lsn.checked_add(1) else {
            break;
        };
        lsn = next;
        at = f.end;
    }
    Ok(n)
}
