//! The log as a file beside the redb file.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::LogStorage;

/// A journal's log file: `<journal>-log`, beside the journal (`project.opj-log`).
#[derive(Debug)]
pub struct FileLog {
    file: File,
    path: PathBuf,
    /// Created without syncing its directory: its first sync does (see
    /// [`FileLog::open_lazily`]).
    name_unsynced: AtomicBool,
}

impl FileLog {
    /// The log path of the journal at `journal`: the same name with `-log` appended.
    pub fn path_for(journal: &Path) -> PathBuf {
        let mut name = journal.as_os_str().to_os_string();
        name.push("-log");
        PathBuf::from(name)
    }

    /// The path of the journal's second log file: `<journal>-log2`. A writer keeps two
    /// log files and starts each cycle in the one the cycle before did not use, so that a
    /// checkpoint's commit into redb runs beside the next cycle's records instead of
    /// before them; recovery follows the records from one file into the other. A clean
    /// close removes both.
    pub fn spare_path_for(journal: &Path) -> PathBuf {
        let mut name = journal.as_os_str().to_os_string();
        name.push("-log2");
        PathBuf::from(name)
    }

    /// Both log paths of the journal at `journal`: [`FileLog::path_for`] and
    /// [`FileLog::spare_path_for`]. Copying a journal that may hold records in its logs
    /// (a crashed one) means copying these too.
    pub fn paths_for(journal: &Path) -> [PathBuf; 2] {
        [Self::path_for(journal), Self::spare_path_for(journal)]
    }

    /// Opens the log at `path` for reading and writing, creating it if missing (and then
    /// making its name durable, so that a synced record cannot vanish with its file).
    ///
    /// # Errors
    ///
    /// The I/O error of opening or creating it.
    pub fn open(path: &Path) -> io::Result<FileLog> {
        let log = FileLog::open_lazily(path)?;
        if log.name_unsynced.load(Ordering::SeqCst) {
            crate::fsutil::sync_parent(path)?;
            log.name_unsynced.store(false, Ordering::SeqCst);
        }
        Ok(log)
    }

    /// As [`FileLog::open`], but a file it creates has its name made durable by its first
    /// [`LogStorage::sync_data`] instead of now (so that opening a journal does not wait
    /// for a directory sync for a file nothing is written to yet).
    ///
    /// # Errors
    ///
    /// The I/O error of opening or creating it.
    pub(crate) fn open_lazily(path: &Path) -> io::Result<FileLog> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(FileLog {
            file,
            path: path.to_path_buf(),
            name_unsynced: AtomicBool::new(!existed),
        })
    }

    /// Opens the log at `path` read-only, or `None` if there is none.
    ///
    /// # Errors
    ///
    /// An I/O error other than the file not existing.
    pub fn open_read_only(path: &Path) -> io::Result<Option<FileLog>> {
        match File::open(path) {
            Ok(file) => Ok(Some(FileLog {
                file,
                path: path.to_path_buf(),
                name_unsynced: AtomicBool::new(false),
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl LogStorage for FileLog {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        #[cfg(unix)]
        {
            std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
        }
        #[cfg(windows)]
        {
            let mut done = 0;
            while done < buf.len() {
                let n = std::os::windows::fs::FileExt::seek_read(
                    &self.file,
                    &mut buf[done..],
                    offset + done as u64,
                )?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                done += n;
            }
            Ok(())
        }
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        #[cfg(unix)]
        {
            std::os::unix::fs::FileExt::write_all_at(&self.file, data, offset)
        }
        #[cfg(windows)]
        {
            let mut done = 0;
            while done < data.len() {
                let n = std::os::windows::fs::FileExt::seek_write(
                    &self.file,
                    &data[done..],
                    offset + done as u64,
                )?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                done += n;
            }
            Ok(())
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()?;
        if self.name_unsynced.load(Ordering::SeqCst) {
            crate::fsutil::sync_parent(&self.path)?;
            self.name_unsynced.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    fn discard(&self) -> io::Result<()> {
        std::fs::remove_file(&self.path)
    }
}
