use std::io;

use super::damage::*;
use super::format::*;
use super::reader::*;
use super::storage::*;
use super::writer::*;

const ID: u64 = 0x5eed_1234_abcd_0042;

fn cursor(generation: u64, first_lsn: u64) -> Cursor {
    Cursor {
        journal_id: ID,
        generation,
        first_lsn,
    }
}

/// A writer on a fresh in-memory log, in generation 1.
fn fresh() -> io::Result<(Writer, std::sync::Arc<MemoryLog>)> {
    let storage = std::sync::Arc::new(MemoryLog::new());
    let scan = scan(&[], cursor(1, 1), |_| Ok(()))?;
    let w = Writer::resume(
        std::sync::Arc::new(Shared(storage.clone())),
        cursor(1, 1),
        &scan,
    )?;
    Ok((w, storage))
}

/// Lets a test keep reading the storage a writer owns.
#[derive(Debug)]
struct Shared(std::sync::Arc<MemoryLog>);

impl LogStorage for Shared {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_at(offset, data)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

fn payloads(bytes: &[u8], c: Cursor) -> (Vec<(u64, Vec<u8>)>, Scan) {
    let mut out = Vec::new();
    let scan = scan(bytes, c, |r| {
        out.push((r.lsn, r.payload.to_vec()));
        Ok(())
    })
    .unwrap_or_else(|e| panic!("a log in memory reads: {e}"));
    (out, scan)
}

#[test]
fn appended_records_read_back_in_order_and_end_cleanly() -> io::Result<()> {
    let (mut w, storage) = fresh()?;
    for i in 0..5u8 {
        w.append(KIND_BATCH, &vec![i; 100 * usize::from(i)])?;
    }
    let bytes = read_all(&*storage)?;
    let (got, scan) = payloads(&bytes, cursor(1, 1));
    assert_eq!(got.len(), 5);
    for (i, (lsn, p)) in got.iter().enumerate() {
        assert_eq!(*lsn, i as u64 + 1);
        assert_eq!(p, &vec![i as u8; 100 * i]);
    }
    assert_eq!(scan.stopped, End::Clean);
    assert_eq!(scan.end, START + w.used());
    assert_eq!(scan.next_lsn, 6);
    Ok(())
}

#[test]
fn a_torn_last_record_is_cut_and_the_records_before_it_are_kept() -> io::Result<()> {
    let (mut w, storage) = fresh()?;
    w.append(KIND_BATCH, b"first")?;
    w.append(KIND_BATCH, b"second")?;
    let end_of_second = START + w.used();
    w.append(KIND_BATCH, &[7u8; 600])?;
    let mut bytes = read_all(&*storage)?;
    // The third record's last sector did not reach the disk.
    let torn = end_of_second as usize + RECORD_HEADER_LEN + 300;
    bytes[torn..torn + 300].fill(0);
    let (got, scan) = payloads(&bytes, cursor(1, 1));
    assert_eq!(got.len(), 2);
    assert_eq!(scan.end, end_of_second);
    assert!(matches!(scan.stopped, End::Stale(_)), "{:?}", scan.stopped);
    Ok(())
}

#[test]
fn records_of_an_earlier_cycle_are_never_read_as_new_ones() -> io::Result<()> {
    let (mut w, storage) = fresh()?;
    for i in 0..4u8 {
        w.append(KIND_BATCH, &[i; 64])?;
    }
    let old_cycle = read_all(&*storage)?;
    // A checkpoint: the next cycle starts over at the same offset.
    w.restart(2);
    w.append(KIND_BATCH, &[9u8; 64])?;
    // The writer zeroes the old cycle first; as if those zeros had not landed, put the new
    // record over the old cycle's bytes.
    let mut bytes = old_cycle;
    let new = read_all(&*storage)?;
    let n = (START + w.used()) as usize;
    bytes[START as usize..n].copy_from_slice(&new[START as usize..n]);
    // Generation 2 sees its one record, then stops at generation 1's second record.
    let (got, scan) = payloads(&bytes, cursor(2, 5));
    assert_eq!(got, vec![(5, vec![9u8; 64])]);
    assert!(matches!(scan.stopped, End::Stale(_)));
    // Generation 1 (what a reader with an old snapshot asks for) finds no first record.
    let (old, _) = payloads(&bytes, cursor(1, 1));
    assert!(old.is_empty(), "{old:?}");
    Ok(())
}

#[test]
fn a_same_length_record_does_not_chain_into_leftovers_of_a_crashed_tail() -> io::Result<()> {
    // Records 1..3 were written; 2 and 3 never synced and 2 was lost, but 3's bytes
    // reached the disk. After recovery keeps record 1, a new record 2 of exactly the old
    // length is written: the old record 3 that follows must not be taken as its successor.
    let (mut w, storage) = fresh()?;
    w.append(KIND_BATCH, b"one")?;
    let after_one = START + w.used();
    w.append(KIND_BATCH, b"two")?;
    w.append(KIND_BATCH, b"three")?;
    let mut bytes = read_all(&*storage)?;
    let two_len = RECORD_HEADER_LEN + 3;
    bytes[after_one as usize..after_one as usize + two_len].fill(0);
    storage.write_at(0, &bytes)?;
    let (got, scan) = payloads(&bytes, cursor(1, 1));
    assert_eq!(got.len(), 1);
    let mut w = Writer::resume(
        std::sync::Arc::new(Shared(storage.clone())),
        cursor(1, 1),
        &scan,
    )?;
    w.append(KIND_BATCH, b"TWO")?;
    let bytes = read_all(&*storage)?;
    let (got, _) = payloads(&bytes, cursor(1, 1));
    assert_eq!(
        got,
        vec![(1, b"one".to_vec()), (2, b"TWO".to_vec())],
        "the old third record must end the log"
    );
    Ok(())
}

#[test]
fn a_log_of_another_journal_has_no_records_for_this_one() -> io::Result<()> {
    let (mut w, storage) = fresh()?;
    w.append(KIND_BATCH, b"theirs")?;
    let bytes = read_all(&*storage)?;
    let other = Cursor {
        journal_id: ID ^ 1,
        generation: 1,
        first_lsn: 1,
    };
    let (got, scan) = payloads(&bytes, other);
    assert!(got.is_empty());
    assert!(
        scan.header_problem
            .as_deref()
            .is_some_and(|p| p.contains("another journal")),
        "{:?}",
        scan.header_problem
    );
    // A writer for this journal starts the file over rather than continuing it.
    let mut w2 = Writer::resume(std::sync::Arc::new(Shared(storage.clone())), other, &scan)?;
    w2.append(KIND_BATCH, b"ours")?;
    let (got, _) = payloads(&read_all(&*storage)?, other);
    assert_eq!(got, vec![(1, b"ours".to_vec())]);
    Ok(())
}

#[test]
fn a_record_larger_than_the_file_grows_it_and_reads_back() -> io::Result<()> {
    let (mut w, storage) = fresh()?;
    let big = vec![0x5a; INITIAL_CAPACITY as usize + 10];
    w.append(KIND_BATCH, &big)?;
    w.append(KIND_BATCH, b"after")?;
    assert!(w.capacity() >= START + w.used());
    assert_eq!(storage.len()?, w.capacity());
    let (got, _) = payloads(&read_all(&*storage)?, cursor(1, 1));
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1, big);
    Ok(())
}

#[test]
fn every_single_byte_flip_ends_the_log_at_or_before_the_flipped_record() -> io::Result<()> {
    let (mut w, storage) = fresh()?;
    let mut ends = vec![START];
    for i in 0..3u8 {
        w.append(KIND_BATCH, &[i; 40])?;
        ends.push(START + w.used());
    }
    let clean = read_all(&*storage)?;
    for at in START as usize..ends[3] as usize {
        let mut bytes = clean.clone();
        bytes[at] ^= 0x01;
        let (got, _) = payloads(&bytes, cursor(1, 1));
        let hit = ends.iter().rposition(|e| *e as usize <= at).unwrap_or(0);
        // The trailer is outside the CRC: a flip there changes nothing.
        let in_trailer = at + RECORD_TRAILER_LEN >= ends[hit + 1] as usize;
        let want = if in_trailer { 3 } else { hit };
        assert_eq!(got.len(), want, "a flip at offset {at} (record {hit})");
    }
    Ok(())
}

#[test]
fn reading_in_chunks_finds_every_record_across_chunk_boundaries() -> io::Result<()> {
    // Records that straddle the read-ahead window's chunks, one larger than a chunk, then a
    // torn record: every whole record is read, in order, and the torn one ends the log.
    let (mut w, storage) = fresh()?;
    let sizes = [70_000usize, 100_000, 90_000, 600_000, 10, 250_000, 3];
    for (i, n) in sizes.iter().enumerate() {
        w.append(KIND_BATCH, &vec![i as u8; *n])?;
    }
    let end = START + w.used();
    // Tear the last record's payload.
    storage.write_at(end - RECORD_TRAILER_LEN as u64 - 2, &[0xff])?;
    let mut got = Vec::new();
    let scan = scan_storage::<io::Error>(&*storage, cursor(1, 1), |r| {
        got.push((r.lsn, r.payload.to_vec()));
        Ok(())
    })?;
    let want: Vec<(u64, Vec<u8>)> = sizes[..sizes.len() - 1]
        .iter()
        .enumerate()
        .map(|(i, n)| (i as u64 + 1, vec![i as u8; *n]))
        .collect();
    assert_eq!(got, want);
    assert_eq!(scan.next_lsn, sizes.len() as u64);
    assert!(
        matches!(scan.stopped, End::Stale(_)),
        "the torn record ends the log: {:?}",
        scan.stopped
    );
    assert_eq!(
        scan.end,
        end - (RECORD_HEADER_LEN + 3 + RECORD_TRAILER_LEN) as u64
    );
    Ok(())
}

/// Payload bytes with no zero byte (a record with a blank sector of its own would read as
/// torn), varied so that no two records look alike.
fn busy(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) | 1)
        .collect()
}

/// A log of four records of 40, 1,500, 700 and 2,000 bytes (the later ones spanning
/// several sectors), and where each record starts and ends.
fn four_records() -> io::Result<(Vec<u8>, Vec<u64>)> {
    let (mut w, storage) = fresh()?;
    let mut ends = vec![START];
    for (i, n) in [40usize, 1500, 700, 2000].into_iter().enumerate() {
        w.append(KIND_BATCH, &busy(n, i as u8))?;
        ends.push(START + w.used());
    }
    Ok((read_all(&*storage)?, ends))
}

fn dropped_of(bytes: &[u8]) -> (Dropped, Vec<u64>) {
    let log = MemoryLog::new();
    log.write_at(0, bytes)
        .unwrap_or_else(|e| panic!("a log in memory takes bytes: {e}"));
    let mut lsns = Vec::new();
    let d = dropped::<io::Error>(&log, cursor(1, 1), |r| {
        lsns.push(r.lsn);
        Ok(())
    })
    .unwrap_or_else(|e| panic!("a log in memory reads: {e}"));
    (d, lsns)
}

#[test]
fn an_intact_log_drops_nothing() -> io::Result<()> {
    let (bytes, _) = four_records()?;
    assert_eq!(dropped_of(&bytes).0, Dropped::default());
    Ok(())
}

#[test]
fn every_flipped_byte_of_a_record_is_damage_even_in_the_last_record() -> io::Result<()> {
    // A torn write leaves a blank sector or no trailer; a record written whole and changed
    // since has both: the flip is reported, with the records after it, whichever record
    // it hits (the last one included), and for every byte of its header too.
    let (clean, ends) = four_records()?;
    for at in START..ends[4] {
        let hit = ends.iter().rposition(|e| *e <= at).unwrap_or(0);
        let in_trailer = at + RECORD_TRAILER_LEN as u64 >= ends[hit + 1];
        for x in [0x01u8, 0x80, 0xff] {
            let mut bytes = clean.clone();
            bytes[at as usize] ^= x;
            let (d, lsns) = dropped_of(&bytes);
            if in_trailer {
                assert_eq!(d, Dropped::default(), "a flip {x:#x} at {at}, in a trailer");
                continue;
            }
            let lsn = hit as u64 + 1;
            assert_eq!(
                d.damaged.as_ref().map(|(l, _)| *l),
                Some(lsn),
                "a flip {x:#x} at offset {at} (record {lsn}): {d:?}"
            );
            assert_eq!(d.records, 4 - lsn, "records after {lsn}: {d:?}");
            assert!(
                lsns.contains(&lsn),
                "the damaged record goes to `each`, so its operations are named"
            );
        }
    }
    Ok(())
}

#[test]
fn a_power_cut_tearing_the_last_record_is_never_damage() -> io::Result<()> {
    // The last record's sectors land or not, in every combination (the sector that
    // holds the record before it always lands: it was synced), over a zeroed tail.
    let (clean, ends) = four_records()?;
    let (from, to) = (ends[3], ends[4]);
    let first = from / SECTOR;
    let last = (to - 1) / SECTOR;
    let sectors = (last - first + 1) as u32;
    assert!(sectors >= 4, "the last record spans several sectors");
    for mask in 0..(1u32 << sectors) - 1 {
        let mut bytes = clean.clone();
        for k in 0..sectors {
            if mask & (1 << k) == 0 {
                let s = (first + u64::from(k)) * SECTOR;
                let lo = s.max(from) as usize;
                let hi = (s + SECTOR).min(to) as usize;
                bytes[lo..hi].fill(0);
            }
        }
        let (d, _) = dropped_of(&bytes);
        assert_eq!(d, Dropped::default(), "sectors landed {mask:#b}");
    }
    // A short write (a prefix of any length, as a killed process leaves).
    for cut in from..to - 1 {
        let mut bytes = clean.clone();
        bytes[cut as usize..to as usize].fill(0);
        let (d, _) = dropped_of(&bytes);
        assert_eq!(d, Dropped::default(), "a prefix of {} bytes", cut - from);
    }
    Ok(())
}

#[test]
fn a_torn_last_record_whose_header_straddles_a_sector_is_never_damage() -> io::Result<()> {
    // The last record starts at every offset from 40 bytes before a sector boundary to 8
    // after it (found by a cutfs power cut: a header whose first byte sat in a sector that
    // did not land, so that the mended header's CRC held), and its sectors land or not in
    // every combination.
    let mut straddled = 0;
    for first_len in 440usize..=488 {
        let (mut w, storage) = fresh()?;
        w.append(KIND_BATCH, &busy(first_len, 3))?;
        let from = START + w.used();
        w.append(KIND_BATCH, &busy(700, 9))?;
        let to = START + w.used();
        let clean = read_all(&*storage)?;
        let first = from / SECTOR;
        let sectors = ((to - 1) / SECTOR - first + 1) as u32;
        if (from % SECTOR) as usize + RECORD_HEADER_LEN > SECTOR as usize {
            straddled += 1;
        }
        for mask in 0..(1u32 << sectors) - 1 {
            let mut bytes = clean.clone();
            for k in 0..sectors {
                if mask & (1 << k) == 0 {
                    let s = (first + u64::from(k)) * SECTOR;
                    bytes[s.max(from) as usize..(s + SECTOR).min(to) as usize].fill(0);
                }
            }
            let (d, _) = dropped_of(&bytes);
            assert_eq!(
                d,
                Dropped::default(),
                "record at {from}, sectors landed {mask:#b}"
            );
            let (got, _) = payloads(&bytes, cursor(1, 1));
            assert_eq!(got.len(), 1, "record at {from}, sectors landed {mask:#b}");
        }
        // The same header with a wrong first byte where a torn write leaves zero is damage.
        let mut bytes = clean.clone();
        bytes[from as usize] ^= 0x40;
        let (d, _) = dropped_of(&bytes);
        assert_eq!(d.damaged.map(|(lsn, _)| lsn), Some(2), "record at {from}");
    }
    assert!(
        straddled >= RECORD_HEADER_LEN - 1,
        "{straddled} headers straddled a boundary"
    );
    Ok(())
}

#[test]
fn a_log_cut_anywhere_in_its_records_is_damage() -> io::Result<()> {
    let (clean, ends) = four_records()?;
    // (A log cut to nothing reads as no log: an empty log is what a clean close of a log
    // that cannot be removed leaves.)
    for len in (1..ends[4] as usize).step_by(7).chain([ends[4] as usize]) {
        let (d, _) = dropped_of(&clean[..len]);
        assert!(
            d.length.is_some() || d.damaged.is_some() || d.header_damaged,
            "cut to {len}: {d:?}"
        );
    }
    // Cut inside the last record: reported as that record, too.
    let (d, _) = dropped_of(&clean[..ends[4] as usize - 100]);
    assert_eq!(d.damaged.as_ref().map(|(l, _)| *l), Some(4), "{d:?}");
    Ok(())
}

#[test]
fn a_new_cycle_zeroes_the_old_one_before_its_first_record() -> io::Result<()> {
    let (mut w, storage) = fresh()?;
    for i in 0..4u8 {
        w.append(KIND_BATCH, &busy(900, i))?;
    }
    let old_end = START + w.used();
    w.restart(2);
    // Nothing is written until the next record.
    assert_ne!(read_all(&*storage)?[old_end as usize - 1], 0);
    w.append(KIND_BATCH, b"new")?;
    let bytes = read_all(&*storage)?;
    let new_end = (START + w.used()) as usize;
    assert!(
        bytes[new_end..].iter().all(|b| *b == 0),
        "past the new cycle's records the log is zero"
    );
    let (got, _) = payloads(&bytes, cursor(2, 5));
    assert_eq!(got, vec![(5, b"new".to_vec())]);
    Ok(())
}

#[test]
fn a_writer_resuming_after_a_torn_record_zeroes_it_before_writing() -> io::Result<()> {
    let (mut w, storage) = fresh()?;
    w.append(KIND_BATCH, &busy(100, 1))?;
    let kept = START + w.used();
    w.append(KIND_BATCH, &busy(3000, 2))?;
    // A power cut tore the second record: its first sectors landed, its trailer did not.
    let end = START + w.used();
    storage.write_at(end - 600, &[0u8; 600])?;
    let bytes = read_all(&*storage)?;
    let (got, scan) = payloads(&bytes, cursor(1, 1));
    assert_eq!(got.len(), 1);
    let mut w = Writer::resume(
        std::sync::Arc::new(Shared(storage.clone())),
        cursor(1, 1),
        &scan,
    )?;
    w.append(KIND_BATCH, b"short")?;
    let bytes = read_all(&*storage)?;
    let new_end = (START + w.used()) as usize;
    assert!(new_end < end as usize && kept < new_end as u64);
    assert!(
        bytes[new_end..].iter().all(|b| *b == 0),
        "the torn record's leftovers are zero"
    );
    Ok(())
}

/// A log in memory that also keeps what a power cut would leave (the bytes as of the last
/// sync), and notes every record written over bytes that were not zero on disk: the
/// writer's invariant, which `verify` relies on to tell a torn write from damage.
#[derive(Debug, Default)]
struct Checked {
    now: MemoryLog,
    state: std::sync::Mutex<CheckedState>,
}

#[derive(Debug, Default)]
struct CheckedState {
    durable: Vec<u8>,
    unsynced: Vec<(u64, usize)>,
    violations: Vec<String>,
}

impl Checked {
    fn state(&self) -> std::sync::MutexGuard<'_, CheckedState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }
    /// What a power cut now leaves.
    fn durable(&self) -> Vec<u8> {
        self.state().durable.clone()
    }
}

#[derive(Debug)]
struct CheckedShare(std::sync::Arc<Checked>);

impl LogStorage for CheckedShare {
    fn len(&self) -> io::Result<u64> {
        self.0.now.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.now.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut st = self.0.state();
        if data.iter().any(|b| *b != 0) {
            let from = (offset as usize).min(st.durable.len());
            let to = (offset as usize + data.len()).min(st.durable.len());
            if st.durable[from..to].iter().any(|b| *b != 0) {
                let v = format!("a record written at {offset} over bytes not zero on disk");
                st.violations.push(v);
            }
        }
        st.unsynced.push((offset, data.len()));
        drop(st);
        self.0.now.write_at(offset, data)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.now.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        let now = read_all(&self.0.now)?;
        let mut st = self.0.state();
        st.durable.resize(now.len(), 0);
        for (offset, len) in std::mem::take(&mut st.unsynced) {
            let (from, to) = (offset as usize, offset as usize + len);
            st.durable[from..to].copy_from_slice(&now[from..to]);
        }
        Ok(())
    }
}

#[test]
fn no_record_is_ever_written_over_bytes_that_are_not_zero_on_disk() -> io::Result<()> {
    let storage = std::sync::Arc::new(Checked::default());
    let mut c = cursor(1, 1);
    let scan0 = scan(&[], c, |_| Ok(()))?;
    let mut w = Writer::resume(
        std::sync::Arc::new(CheckedShare(storage.clone())),
        c,
        &scan0,
    )?;
    // Cycles of different lengths, records from a few bytes to 500 KB (past the 1 MiB
    // file's doubling), restarts after each cycle, and a resume after a crash in some.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut generation = 1;
    for round in 0..24u64 {
        let appends = 1 + next(120);
        for i in 0..appends {
            let len = match next(10) {
                0 => 300_000 + next(200_000) as usize,
                1..=3 => 20_000 + next(30_000) as usize,
                _ => 10 + next(3_000) as usize,
            };
            w.append(KIND_BATCH, &busy(len, (round + i) as u8))?;
        }
        if round % 3 == 2 {
            // A crash: a new writer over what the disk holds, as an open resumes it.
            let durable = storage.durable();
            let (got, scan) = payloads(&durable, c);
            assert_eq!(
                got.len() as u64,
                w.next_lsn() - c.first_lsn,
                "round {round}"
            );
            storage.now.set_len(durable.len() as u64)?;
            storage.now.write_at(0, &durable)?;
            w = Writer::resume(std::sync::Arc::new(CheckedShare(storage.clone())), c, &scan)?;
        }
        generation += 1;
        c = cursor(generation, w.next_lsn());
        w.restart(generation);
    }
    assert_eq!(storage.violations(), Vec::<String>::new());
    Ok(())
}

#[test]
fn the_log_grows_to_powers_of_two_only() -> io::Result<()> {
    let (mut w, storage) = fresh()?;
    assert_eq!(storage.len()?, INITIAL_CAPACITY);
    w.append(KIND_BATCH, &vec![7u8; INITIAL_CAPACITY as usize + 1])?;
    assert_eq!(storage.len()?, 2 * INITIAL_CAPACITY);
    assert!(is_capacity(storage.len()?));
    Ok(())
}

/// A log whose reads fail while `failing` is set (before writing any byte of the buffer).
#[derive(Debug, Default)]
struct FailingReads {
    log: MemoryLog,
    failing: std::sync::atomic::AtomicBool,
}

impl LogStorage for FailingReads {
    fn len(&self) -> io::Result<u64> {
        self.log.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(io::Error::other("injected read failure"));
        }
        self.log.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.log.write_at(offset, data)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.log.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.log.sync_data()
    }
}

#[test]
fn a_failed_read_leaves_no_stale_bytes_in_the_read_ahead_window() -> io::Result<()> {
    use std::sync::atomic::Ordering;
    let storage = FailingReads::default();
    let pattern: Vec<u8> = (0..3 * Window::CHUNK).map(|i| (i % 251) as u8).collect();
    storage.write_at(0, &pattern)?;
    let len = storage.len()?;
    let mut window = Window::default();
    assert_eq!(window.get(&storage, 8, 4, len)?, &pattern[8..12]);
    // A read past the window fails: the window must not keep what it held before as if
    // it were the bytes of the failed range, nor serve a half-made buffer afterwards.
    storage.failing.store(true, Ordering::SeqCst);
    let far = 2 * Window::CHUNK as u64 + 16;
    assert!(window.get(&storage, far, 4, len).is_err());
    storage.failing.store(false, Ordering::SeqCst);
    assert_eq!(window.get(&storage, 100, 4, len)?, &pattern[100..104]);
    assert_eq!(
        window.get(&storage, far, 4, len)?,
        &pattern[far as usize..far as usize + 4]
    );
    Ok(())
}

/// A writer with a second log file, both in memory, prepared and ready.
fn with_spare() -> io::Result<(Writer, std::sync::Arc<MemoryLog>, std::sync::Arc<MemoryLog>)> {
    let (mut w, first) = fresh()?;
    let second = std::sync::Arc::new(MemoryLog::new());
    w.set_spare(Spare::found(
        std::sync::Arc::new(Shared(second.clone())),
        false,
    )?);
    w.set_spare_marked(true);
    let job = w
        .spare_to_prepare()
        .unwrap_or_else(|| panic!("a new second file needs preparing"));
    job.prepare()?;
    assert!(w.can_switch());
    Ok((w, first, second))
}

/// Every record `scan_cycles` reads from `files`, from `c` on, with the cycles.
fn read_cycles(files: &[&dyn LogStorage], c: Cursor) -> (Vec<(u64, Vec<u8>)>, Vec<Cycle>) {
    let mut out = Vec::new();
    let cycles = scan_cycles(files, c, |r| -> io::Result<()> {
        out.push((r.lsn, r.payload.to_vec()));
        Ok(())
    })
    .unwrap_or_else(|e| panic!("logs in memory read: {e}"));
    (out, cycles)
}

#[test]
fn recovery_follows_the_next_cycle_into_the_other_file_until_the_ended_one_is_zeroed()
-> io::Result<()> {
    let (mut w, first, second) = with_spare()?;
    for i in 0..3u8 {
        w.append(KIND_BATCH, &[i; 40])?;
    }
    // The next cycle starts in the second file; the first keeps its records until redb
    // holds them.
    let ended = w.switch(2)?;
    assert!(!w.can_switch(), "the ended cycle's file is not zeroed yet");
    for i in 3..5u8 {
        w.append(KIND_BATCH, &[i; 40])?;
    }
    let files: [&dyn LogStorage; 2] = [&*first, &*second];
    let (records, cycles) = read_cycles(&files, cursor(1, 1));
    let want: Vec<(u64, Vec<u8>)> = (0..5u8).map(|i| (u64::from(i) + 1, vec![i; 40])).collect();
    assert_eq!(records, want, "both cycles, in order");
    assert_eq!(
        cycles
            .iter()
            .map(|c| (c.file, c.cursor))
            .collect::<Vec<_>>(),
        vec![(0, cursor(1, 1)), (1, cursor(2, 4))]
    );
    // The files given the other way round (the cycle in the second): the same records.
    let swapped: [&dyn LogStorage; 2] = [&*second, &*first];
    assert_eq!(read_cycles(&swapped, cursor(1, 1)).0, want);
    // Once redb holds cycle 1 (it names cycle 2), the first file is zeroed: cycle 2 alone.
    ended.prepare()?;
    assert!(w.can_switch());
    assert!(read_all(&*first)?[START as usize..].iter().all(|b| *b == 0));
    let (records, cycles) = read_cycles(&files, cursor(2, 4));
    assert_eq!(records, want[3..].to_vec());
    assert_eq!(cycles.len(), 1);
    assert_eq!(cycles[0].file, 1);
    // Read from cycle 1 now (a reader whose snapshot is older): its records are gone, and
    // cycle 2 is not taken without them (its first lsn does not follow).
    let (records, _) = read_cycles(&files, cursor(1, 1));
    assert_eq!(records, Vec::new());
    // The third cycle goes back into the first file.
    w.switch(3)?;
    w.append(KIND_BATCH, &[9; 40])?;
    let (records, cycles) = read_cycles(&files, cursor(2, 4));
    assert_eq!(records.last(), Some(&(6, vec![9; 40])));
    assert_eq!(cycles.len(), 2);
    assert_eq!(cycles[1].file, 0);
    Ok(())
}

#[test]
fn a_stale_cycle_in_the_other_file_is_not_followed() -> io::Result<()> {
    let (mut w, first, second) = with_spare()?;
    w.append(KIND_BATCH, &[1; 40])?;
    let ended = w.switch(2)?;
    w.append(KIND_BATCH, &[2; 40])?;
    ended.prepare()?;
    // Cycle 3 back in the first file, with the second still holding cycle 2 (a crash
    // before the thread zeroed it).
    w.switch(3)?;
    w.append(KIND_BATCH, &[3; 40])?;
    let files: [&dyn LogStorage; 2] = [&*first, &*second];
    let (records, cycles) = read_cycles(&files, cursor(3, 3));
    assert_eq!(records, vec![(3, vec![3; 40])]);
    assert_eq!(cycles.len(), 1, "cycle 2 is not cycle 4: {cycles:?}");
    Ok(())
}
