//! Salvage: records found by scanning the raw bytes of a file, for the parts of a journal
//! that redb cannot read (a damaged page, a truncated file, a damaged header).
//!
//! Every stored value is framed with a magic, a version, a kind, a length and a CRC, so an
//! intact record is recognized wherever it lies. A frame found this way may be the live
//! record or a stale copy on a page a later commit freed: `repair` takes one only where the
//! engine could not read the table, and only with evidence that it is live (see
//! `check::repair`).

use std::fs::File;

use crate::codec::{self, FORMAT_VERSION, RecordKind};
use crate::error::{Error, Result};
use crate::record::{CheckpointRecord, StateRecord};

/// A meta record found in the raw bytes. A meta record does not name its key: it is a
/// checkpoint or a state record if it decodes as exactly one of them (each decode consumes
/// every byte, so their field counts tell them apart).
pub(crate) enum MetaFound {
    Checkpoint(CheckpointRecord),
    State(StateRecord),
}

impl MetaFound {
    /// The meta record `frame` (of kind [`RecordKind::Meta`]) holds, if it is one of the two.
    pub(crate) fn of(frame: &[u8]) -> Option<MetaFound> {
        let (version, payload) = codec::unframe_versioned(RecordKind::Meta, frame).ok()?;
        let cp = codec::decode_payload::<CheckpointRecord>(version, payload).ok();
        let st = codec::decode_payload::<StateRecord>(version, payload).ok();
        match (cp, st) {
            (Some(cp), None) => Some(MetaFound::Checkpoint(cp)),
            (None, Some(st)) => Some(MetaFound::State(st)),
            _ => None,
        }
    }
}

/// Scans raw bytes for framed records whose CRC holds.
pub(crate) fn scan_frames(bytes: &[u8]) -> Vec<(RecordKind, &[u8])> {
    let mut out = Vec::new();
    let mut i = 0usize;
    while i + codec::HEADER_LEN <= bytes.len() {
        if let Some((kind, len)) = frame_at(&bytes[i..i + codec::HEADER_LEN]) {
            let end = i + codec::HEADER_LEN + len;
            if end <= bytes.len() && codec::unframe(kind, &bytes[i..end]).is_ok() {
                out.push((kind, &bytes[i..end]));
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The kind and payload length a frame header at the start of `head` declares, if it looks
/// like one (magic, a version this build or an older one wrote, a known kind). Frames of a
/// newer version are recognized by [`newer_frame_at`].
fn frame_at(head: &[u8]) -> Option<(RecordKind, usize)> {
    if head[0] != codec::MAGIC[0] || head[1] != codec::MAGIC[1] {
        return None;
    }
    if head[2] < 1 || head[2] > FORMAT_VERSION {
        return None;
    }
    let kind = RecordKind::from_byte(head[3])?;
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    Some((kind, len))
}

/// The largest frame the scan reads: a result payload is at most 64 MiB, plus its header.
const MAX_FRAME: usize = (64 << 20) + (1 << 20);
/// Bytes read at a time.
const WINDOW: usize = 1 << 20;

/// What a scan of a file's bytes found besides the frames it reported.
#[derive(Debug, Default)]
pub(crate) struct ScanSummary {
    /// Intact frames found.
    pub frames: u64,
    /// Intact event frames found.
    pub events: u64,
    /// The highest format version of an intact frame newer than this build's, if any.
    pub newer: Option<u8>,
}

/// Calls `each(offset, kind, frame)` for every intact frame in the first `len` bytes of
/// `file`, in file order, reading a window at a time (memory holds a window and at most one
/// frame, whatever the file's size). `each` returning an error ends the scan with it.
///
/// # Errors
///
/// An I/O error reading the file (named as such); `each`'s error.
pub(crate) fn scan_file(
    file: &File,
    len: u64,
    mut each: impl FnMut(u64, RecordKind, &[u8]) -> Result<()>,
) -> Result<ScanSummary> {
    let mut summary = ScanSummary::default();
    let mut buf = vec![0u8; WINDOW + codec::HEADER_LEN];
    let mut frame = Vec::new();
    // `base` is the file offset of buf[0]; `filled` how many bytes of buf hold data.
    let mut base = 0u64;
    let mut filled;
    let read_err = |e| {
        Error::io_while(
            "read the journal file",
            "the repair stopped and nothing was changed: check the disk and try again",
            e,
        )
    };
    'windows: while base < len {
        let want = usize::try_from((len - base).min(buf.len() as u64)).unwrap_or(buf.len());
        read_at(file, &mut buf[..want], base).map_err(read_err)?;
        filled = want;
        let mut i = 0usize;
        // Positions up to WINDOW are handled in this window; the header overlap lets a frame
        // header that starts near the end be read whole.
        while i < filled.min(WINDOW) && i + codec::HEADER_LEN <= filled {
            let head = &buf[i..i + codec::HEADER_LEN];
            let at = base + i as u64;
            if head[0] == codec::MAGIC[0] && head[1] == codec::MAGIC[1] {
                let len_field = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
                let total = codec::HEADER_LEN + len_field;
                if total <= MAX_FRAME && at + total as u64 <= len {
                    let newer = head[2] > FORMAT_VERSION;
                    let kind = frame_at(head).map(|(k, _)| k);
                    if kind.is_some() || newer {
                        let bytes: &[u8] = if i + total <= filled {
                            &buf[i..i + total]
                        } else {
                            frame.resize(total, 0);
                            read_at(file, &mut frame, at).map_err(read_err)?;
                            &frame
                        };
                        if newer {
                            if matches!(
                                codec::unframe_any(bytes),
                                Err(codec::FrameError::NewerVersion(_))
                            ) {
                                summary.newer = summary.newer.max(Some(head[2]));
                            }
                        } else if let Some(kind) = kind
                            && codec::unframe(kind, bytes).is_ok()
                        {
                            summary.frames += 1;
                            if kind == RecordKind::Event {
                                summary.events += 1;
                            }
                            each(at, kind, bytes)?;
                            let next = at + total as u64;
                            if next >= base + WINDOW as u64 {
                                base = next;
                                continue 'windows;
                            }
                            i += total;
                            continue;
                        }
                    }
                }
            }
            i += 1;
        }
        base += WINDOW as u64;
    }
    Ok(summary)
}

/// Intact journal records found in a file's raw bytes: what `repair` can salvage when the
/// redb refuses the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IntactRecords {
    /// Intact records of every kind (stale copies on freed pages included).
    pub records: u64,
    /// Intact event records among them.
    pub events: u64,
    /// Records of the journal's log that a repair lays over what it salvages: those of the
    /// cycle named by the latest checkpoint record found in the file, up to the first it
    /// could not take (a journal that crashed before its first checkpoint has every event
    /// there).
    pub log_records: u64,
    /// Events among the log's changes (an event in each submission, completion and so on).
    pub log_events: u64,
}

/// How much of a file that does not start with redb's signature is read to
/// decide whether it is a journal whose first page was damaged. A journal's records lie on
/// every page after the header, so one with a damaged header shows intact events within
/// its first mebibytes; a file with none there is not a journal, and is answered so at
/// once instead of being read to its end (a 64 GiB sparse file of zeros took minutes).
pub(crate) const PROBE_LEN: u64 = 64 << 20;

/// Whether a file without redb's signature holds an intact journal event in
/// its first [`PROBE_LEN`] bytes (of `len`): the evidence that it is a damaged journal
/// worth scanning whole, rather than some other file.
///
/// # Errors
///
/// An I/O error reading the file.
pub(crate) fn probe_for_events(file: &File, len: u64) -> Result<bool> {
    Ok(scan_file(file, len.min(PROBE_LEN), |_, _, _| Ok(()))?.events > 0)
}

/// Scans the journal file at `path` for intact records, reading it a window at a time (up
/// to the end of the journal's data: bytes appended after it are not scanned).
///
/// A file that does not start with redb's signature is scanned whole only if
/// its first 64 MiB hold an intact event (a journal whose header page was damaged);
/// otherwise it is not a journal and the answer is zero records, without reading further.
///
/// # Errors
///
/// [`crate::ErrorKind::NotAJournal`] for what is not a regular file (a FIFO, a device, a
/// directory), [`crate::ErrorKind::Io`] when it cannot be read.
pub fn intact_records(path: impl AsRef<std::path::Path>) -> Result<IntactRecords> {
    let path = path.as_ref();
    let meta = crate::preflight::reading::existing_journal_file(path)?;
    let file = File::open(path)
        .map_err(|e| Error::io_while("open the journal file", "nothing was read or changed", e))?;
    let extent = crate::preflight::reading::Extent::of(&file, meta.len())
        .map_err(|e| Error::io_while("read the journal file", "nothing was changed", e))?;
    if crate::preflight::file::check_redb_magic(path).is_err()
        && !probe_for_events(&file, extent.journal_len())?
    {
        return Ok(IntactRecords::default());
    }
    // The latest checkpoint found names the log cycle a repair lays over the salvage.
    let mut latest: Option<CheckpointRecord> = None;
    let summary = scan_file(&file, extent.journal_len(), |_, kind, frame| {
        if kind == RecordKind::Meta
            && let Some(MetaFound::Checkpoint(cp)) = MetaFound::of(frame)
            && latest
                .as_ref()
                .is_none_or(|old| old.generation < cp.generation)
        {
            latest = Some(cp);
        }
        Ok(())
    })?;
    let (log_records, log_events) = match latest {
        Some(cp) => super::repair::log_over(path, &cp)?,
        None => (0, 0),
    };
    Ok(IntactRecords {
        records: summary.frames,
        events: summary.events,
        log_records,
        log_events,
    })
}

fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            let n = std::os::windows::fs::FileExt::seek_read(
                file,
                &mut buf[done..],
                offset + done as u64,
            )?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_scan_finds_the_frames_a_bytes_scan_finds_across_windows() -> Result<()> {
        let mut bytes = Vec::new();
        let mut expected = Vec::new();
        let mut n = 0u32;
        // Frames of many sizes, some straddling the window boundaries, with noise between.
        while bytes.len() < 3 * WINDOW + 5000 {
            bytes.extend(std::iter::repeat_n(0x4f, (n % 7) as usize));
            let payload = vec![n as u8; (n as usize * 977) % 70_000];
            let f = codec::frame(RecordKind::Result, &payload);
            expected.push((bytes.len() as u64, f.clone()));
            bytes.extend_from_slice(&f);
            n += 1;
        }
        let dir = tempfile::tempdir().map_err(Error::io)?;
        let path = dir.path().join("raw");
        std::fs::write(&path, &bytes).map_err(Error::io)?;
        let file = File::open(&path).map_err(Error::io)?;
        let mut found = Vec::new();
        let summary = scan_file(&file, bytes.len() as u64, |at, _, f| {
            found.push((at, f.to_vec()));
            Ok(())
        })?;
        assert_eq!(found, expected);
        assert_eq!(summary.frames, expected.len() as u64);
        let in_memory: Vec<Vec<u8>> = scan_frames(&bytes)
            .into_iter()
            .map(|(_, f)| f.to_vec())
            .collect();
        assert_eq!(
            in_memory,
            expected.into_iter().map(|(_, f)| f).collect::<Vec<_>>()
        );
        Ok(())
    }

    #[test]
    fn a_newer_frame_is_noticed_and_not_reported() -> Result<()> {
        let mut f = codec::frame(RecordKind::Meta, b"from the future");
        f[2] = FORMAT_VERSION + 1;
        // Fix the CRC over the new version byte.
        let mut h = crc32fast::Hasher::new();
        h.update(&f[0..8]);
        h.update(&f[12..]);
        let crc = h.finalize();
        f[8..12].copy_from_slice(&crc.to_le_bytes());
        let dir = tempfile::tempdir().map_err(Error::io)?;
        let path = dir.path().join("raw");
        std::fs::write(&path, &f).map_err(Error::io)?;
        let file = File::open(&path).map_err(Error::io)?;
        let summary = scan_file(&file, f.len() as u64, |_, _, _| Ok(()))?;
        assert_eq!(
            (summary.frames, summary.newer),
            (0, Some(FORMAT_VERSION + 1))
        );
        Ok(())
    }
}
