//! Where a log's bytes live: the [`LogStorage`] contract, and a log in memory.

use std::fmt;
use std::io;
use std::sync::Mutex;

/// Where a journal's log lives: a file beside the redb file ([`FileLog`](super::FileLog)), or, for tests,
/// an in-memory or fault-injecting disk passed to
/// [`JournalBuilder::open_backends`](crate::JournalBuilder::open_backends).
///
/// The contract is that of a file: reads and writes at an offset, a length that grows
/// with [`LogStorage::set_len`] (new bytes read as zero), and a sync after which every
/// completed write survives a power cut.
pub trait LogStorage: Send + Sync + fmt::Debug + 'static {
    /// The current length in bytes.
    ///
    /// # Errors
    ///
    /// The underlying I/O error.
    fn len(&self) -> io::Result<u64>;

    /// Whether the storage holds no bytes.
    ///
    /// # Errors
    ///
    /// The underlying I/O error.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Fills `buf` from `offset`; reading past the end is an error.
    ///
    /// # Errors
    ///
    /// The underlying I/O error, or `UnexpectedEof`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Writes all of `data` at `offset`, growing the storage if needed.
    ///
    /// # Errors
    ///
    /// The underlying I/O error.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Sets the length; new bytes read as zero.
    ///
    /// # Errors
    ///
    /// The underlying I/O error.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Makes every completed write durable.
    ///
    /// # Errors
    ///
    /// The underlying I/O error. After a failed sync, the journal refuses further writes
    /// until it is reopened (the data may never have reached the disk).
    fn sync_data(&self) -> io::Result<()>;

    /// Removes the log after a clean close, when everything in it is in the redb file
    /// (a file backend deletes its file; the default empties the storage).
    ///
    /// # Errors
    ///
    /// The underlying I/O error (the journal is still closed cleanly: a leftover log of
    /// an earlier cycle is ignored by the next open).
    fn discard(&self) -> io::Result<()> {
        self.set_len(0)?;
        self.sync_data()
    }
}

/// A log kept in memory, for tests and for journals on
/// [`redb::backends::InMemoryBackend`]. Nothing survives the process.
#[derive(Debug, Default)]
pub struct MemoryLog {
    bytes: Mutex<Vec<u8>>,
}

impl MemoryLog {
    /// An empty log.
    pub fn new() -> MemoryLog {
        MemoryLog::default()
    }

    fn bytes(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl LogStorage for MemoryLog {
    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes().len() as u64)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let bytes = self.bytes();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| bytes.get(start..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut bytes = self.bytes();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(data);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.bytes().resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads the whole of `storage`.
#[cfg(test)]
pub(crate) fn read_all(storage: &dyn LogStorage) -> io::Result<Vec<u8>> {
    let len = storage.len()?;
    let len = usize::try_from(len).map_err(|_| io::Error::other("the log is too large"))?;
    let mut buf = vec![0u8; len];
    storage.read_at(0, &mut buf)?;
    Ok(buf)
}
