//! The last phase: the repaired file put in place of the journal. It is built beside the
//! journal (`.<name>.repair-<pid>`, or in the system's temporary directory for a dry run
//! that cannot write there), synced, then the journal is kept under the backup's name (a
//! hard link, so its name never goes missing), the new file renamed over it, the log moved
//! with the backup and the directory synced.

use std::fs::File;
use std::path::{Path, PathBuf};

use redb::Database;

use crate::error::{Error, Result};
use crate::log::FileLog;

use super::{RepairOptions, RepairReport};

/// redb's cache for the new file.
const NEW_FILE_CACHE: usize = 32 << 20;

/// The new file, beside the journal, removed unless installed.
pub(super) struct Target {
    path: PathBuf,
    /// For a dry run outside the journal's directory (not writable): the file in the
    /// system's temporary directory, removed when dropped.
    _scratch: Option<crate::fsutil::TempFile>,
    keep: bool,
}

impl Target {
    pub(super) fn create(journal: &Path, dry_run: bool) -> Result<Target> {
        let dir = crate::fsutil::parent_dir(journal);
        let name = journal
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "journal".into());
        let path = dir.join(format!(".{name}.repair-{}", std::process::id()));
        let create = |p: &Path| {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(p)
                .map(drop)
        };
        match create(&path) {
            Ok(()) => Ok(Target {
                path,
                _scratch: None,
                keep: false,
            }),
            Err(e) if dry_run => {
                // A dry run in a directory it cannot write to builds its copy elsewhere.
                let tmp =
                    crate::fsutil::TempFile::create(&std::env::temp_dir(), "opjournal-repair")
                        .map_err(|_| {
                            Error::io_while(
                                "create the repaired journal beside the file",
                                "nothing was changed",
                                e,
                            )
                        })?;
                Ok(Target {
                    path: tmp.path.clone(),
                    _scratch: Some(tmp),
                    keep: false,
                })
            }
            Err(e) => Err(Error::io_while(
                "create the repaired journal beside the file",
                "the repair stopped and nothing was changed",
                e,
            )),
        }
    }

    /// A new, empty database at the target (again empty on every call).
    pub(super) fn database(&self) -> Result<Database> {
        let _ = std::fs::remove_file(&self.path);
        redb::Builder::new()
            .set_cache_size(NEW_FILE_CACHE)
            .create(&self.path)
            .map_err(|e| {
                Error::from(e).while_doing(
                    "create the repaired journal beside the file",
                    "the repair stopped and nothing was changed",
                )
            })
    }

    /// Puts the repaired journal in place of the file (not for a dry run): the file is kept
    /// under the backup name first (a hard link, so the journal's name never goes missing),
    /// then the new file is renamed over it and the directory synced. The log moves with the
    /// backup (its records are in the new file).
    pub(super) fn install(
        mut self,
        journal: &Path,
        options: &RepairOptions,
        report: &mut RepairReport,
    ) -> Result<()> {
        if options.dry_run {
            return Ok(());
        }
        let failed = |what: &'static str| {
            move |e: std::io::Error| {
                Error::io_while(
                    what,
                    "the repair stopped and the journal is unchanged (the repaired copy was removed)",
                    e,
                )
            }
        };
        if let Ok(meta) = std::fs::metadata(journal) {
            std::fs::set_permissions(&self.path, meta.permissions())
                .map_err(failed("give the repaired journal the file's permissions"))?;
        }
        File::open(&self.path)
            .and_then(|f| f.sync_all())
            .map_err(failed("sync the repaired journal"))?;
        let logs = FileLog::paths_for(journal);
        if options.backup {
            let backup = backup_path(journal);
            match std::fs::hard_link(journal, &backup) {
                Ok(()) => {}
                Err(_) => {
                    std::fs::copy(journal, &backup)
                        .map_err(failed("write the backup of the journal"))?;
                }
            }
            for (log, copy) in logs.iter().zip(FileLog::paths_for(&backup)) {
                if log.exists() {
                    std::fs::copy(log, copy)
                        .map_err(failed("write the backup of the journal's log"))?;
                }
            }
            report.backup = Some(backup);
        }
        std::fs::rename(&self.path, journal)
            .map_err(failed("rename the repaired journal over the file"))?;
        self.keep = true;
        // The repaired journal holds everything the logs held: a log left now would be of an
        // older cycle (ignored), but both go.
        for log in logs.iter().filter(|l| l.exists()) {
            std::fs::remove_file(log).map_err(|e| {
                Error::io_while(
                    "remove the journal's old log",
                    "the journal was repaired; the old log beside it is of an earlier cycle and is ignored",
                    e,
                )
            })?;
        }
        crate::fsutil::sync_parent(journal).map_err(|e| {
            Error::io_while(
                "sync the journal's directory",
                "the journal was repaired, but a power loss now could bring back the file as it was",
                e,
            )
        })?;
        Ok(())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

pub(super) fn backup_path(path: &Path) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut n = 0u32;
    loop {
        let mut name = path.as_os_str().to_os_string();
        if n == 0 {
            name.push(format!(".{stamp}.bak"));
        } else {
            name.push(format!(".{stamp}-{n}.bak"));
        }
        let candidate = PathBuf::from(name);
        if !candidate.exists() {
            return candidate;
        }
        n += 1;
    }
}
