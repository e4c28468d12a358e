use super::*;

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
    let w = Writer::resume(Box::new(Shared(storage.clone())), cursor(1, 1), &scan)?;
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
    // A checkpoint: the next cycle starts over at the same offset.
    w.restart(2);
    w.append(KIND_BATCH, &[9u8; 64])?;
    let bytes = read_all(&*storage)?;
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
    let mut w = Writer::resume(Box::new(Shared(storage.clone())), cursor(1, 1), &scan)?;
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
    let mut w2 = Writer::resume(Box::new(Shared(storage.clone())), other, &scan)?;
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
        assert_eq!(got.len(), hit, "a flip at offset {at} (record {hit})");
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
    storage.write_at(end - 2, &[0xff])?;
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
    assert_eq!(scan.end, end - (RECORD_HEADER_LEN + 3) as u64);
    Ok(())
}
