//! Recognizing a journal file before redb sees it.

use std::io::Read;
use std::path::Path;

use crate::codec::FORMAT_VERSION;
use crate::error::{Error, ErrorKind, Result};
use crate::record::FormatRecord;

/// The first nine bytes of every redb file.
pub(crate) const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

pub(crate) fn open_error(path: &Path, err: redb::DatabaseError) -> Error {
    match err {
        redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch => {
            Error::new(ErrorKind::Locked {
                path: path.to_path_buf(),
            })
        }
        redb::DatabaseError::UpgradeRequired(v) => Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: format!(
                "it is a redb file of an older file format ({v}) that this build does not read"
            ),
        }),
        other => Error::from(other),
    }
}

/// Refuses a file that exists, is not empty and is not a redb file, before redb sees it.
pub(crate) fn check_redb_magic(path: &Path) -> Result<()> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(e)),
    };
    let mut head = [0u8; 9];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(e)),
        }
    }
    if n == 0 {
        return Ok(());
    }
    if n < head.len() || head != REDB_MAGIC {
        return Err(Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: "it does not start with the redb file signature".into(),
        }));
    }
    Ok(())
}

/// Checks the format record of a journal: `Some` for a journal this build reads (its own
/// format, or format 1, which it reads as it is and upgrades when it opens it for
/// writing), `None` for an empty redb file (a new journal).
///
/// # Errors
///
/// [`ErrorKind::UnsupportedFormat`] for a newer format, naming both versions;
/// [`ErrorKind::NotAJournal`] for a redb file with other tables and no journal format.
pub(crate) fn check_format(
    path: &Path,
    format: Option<FormatRecord>,
    has_other_tables: bool,
) -> Result<Option<FormatRecord>> {
    match format {
        Some(f) if (1..=u32::from(FORMAT_VERSION)).contains(&f.format_version) => Ok(Some(f)),
        Some(f) => Err(Error::new(ErrorKind::UnsupportedFormat {
            found: f.format_version,
            supported: u32::from(FORMAT_VERSION),
        })),
        None if has_other_tables => Err(Error::new(ErrorKind::NotAJournal {
            path: path.to_path_buf(),
            detail: "it is a redb database without the journal's `meta` table".into(),
        })),
        None => Ok(None),
    }
}
