//! Files made beside another and then put in its place: a temporary file under a fresh
//! name that removes itself unless it was linked or renamed away, and the directory sync
//! that makes a name created, linked, renamed or removed there survive a power loss.
//!
//! A leaf: it knows `std` only, so every layer that writes files (the log, the journal's
//! creation, backup and import, repair) uses the same two pieces without importing each
//! other.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The directory holding `path`: its parent, or `.` for a bare file name.
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Syncs the directory `dir`, so that a name created, linked, renamed or removed in it
/// stays so after a power loss. (Elsewhere than on Unix a directory cannot be opened to
/// sync it, and this does nothing.)
///
/// # Errors
///
/// The I/O error of opening or syncing the directory.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Syncs the directory holding `path` (see [`sync_dir`]).
///
/// # Errors
///
/// As [`sync_dir`].
pub(crate) fn sync_parent(path: &Path) -> io::Result<()> {
    sync_dir(parent_dir(path))
}

/// A new, empty file with a unique name in a directory, removed when dropped. Once it has
/// been hard-linked to its real name, dropping it removes only the temporary name; once it
/// has been renamed away, dropping it finds nothing to remove.
pub(crate) struct TempFile {
    pub(crate) path: PathBuf,
}

impl TempFile {
    /// Creates `.<name>.creating-<pid>-<counter>-<nanos>` in `dir`. The name is new (the file
    /// is created with `create_new`), retried with the next counter if it is taken.
    ///
    /// # Errors
    ///
    /// The I/O error of creating the file, or `AlreadyExists` after 100 names were taken.
    pub(crate) fn create(dir: &Path, name: &str) -> io::Result<TempFile> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut last = None;
        for _ in 0..100 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(
                ".{name}.creating-{}-{n}-{nanos}",
                std::process::id()
            ));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(_) => return Ok(TempFile { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no unused temporary name beside the journal")))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_file_is_new_each_time_and_gone_when_dropped() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let a = TempFile::create(dir.path(), "j.opj")?;
        let b = TempFile::create(dir.path(), "j.opj")?;
        assert_ne!(a.path, b.path);
        assert!(a.path.exists() && b.path.exists());
        let path = a.path.clone();
        drop(a);
        assert!(!path.exists(), "{}", path.display());
        sync_parent(&b.path)?;
        Ok(())
    }

    #[test]
    fn a_bare_file_name_lives_in_the_current_directory() {
        assert_eq!(parent_dir(Path::new("j.opj")), Path::new("."));
        assert_eq!(parent_dir(Path::new("/tmp/j.opj")), Path::new("/tmp"));
    }
}
