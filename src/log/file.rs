//! The log as a file beside the redb file.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use super::LogStorage;

/// A journal's log file: `<journal>-log`, beside the journal (`project.opj-log`).
#[derive(Debug)]
pub struct FileLog {
    file: File,
    path: PathBuf,
}

impl FileLog {
    /// The log path of the journal at `journal`: the same name with `-log` appended.
    pub fn path_for(journal: &Path) -> PathBuf {
        let mut name = journal.as_os_str().to_os_string();
        name.push("-log");
        PathBuf::from(name)
    }

    /// Opens the log at `path` for reading and writing, creating it if missing (and then
    /// making its name durable, so that a synced record cannot vanish with its file).
    ///
    /// # Errors
    ///
    /// The I/O error of opening or creating it.
    pub fn open(path: &Path) -> io::Result<FileLog> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if !existed {
            crate::fsutil::sync_parent(path)?;
        }
        Ok(FileLog {
            file,
            path: path.to_path_buf(),
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
        self.file.sync_data()
    }

    fn discard(&self) -> io::Result<()> {
        std::fs::remove_file(&self.path)
    }
}
