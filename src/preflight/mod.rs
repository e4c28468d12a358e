//! Pre-flight: the checks of a redb file before redb reads it.
//!
//! redb trusts its file: it reads page numbers, lengths and its own allocator state without
//! checking them against the file, allocates a page's whole size before reading it, and
//! panics (or aborts, inside a destructor) on pages that do not parse. A journal file is
//! input, so before any open this layer recognizes the file ([`file`], [`reading`]),
//! checks the header, the layout and every page number the trees reach, checks the system
//! tree before a writer's first commit, and runs every call into redb on such a file under
//! the panic guard ([`guard`]), which answers `Corrupt` instead of unwinding into the
//! caller.
//!
//! The checks have one entry point per kind of access:
//!
//! - [`check_file`]: a file read by path, before any open (a writer's or a reader's): every
//!   page number, through a handle of its own, walked again if a live writer committed
//!   meanwhile;
//! - [`check_before_first_commit`]: a file a writer has opened (redb holds its lock), before
//!   anything commits to it: redb's system tree;
//! - [`check_backend`]: a storage backend, before redb takes it as a writer: both.
//!
//! Laid out as redb lays out its `page_store`: the header and its commit slots
//! ([`header`]), where the pages are ([`layout`]), what a page holds ([`page`]), and the two
//! walks over them ([`system_tree`], [`page_numbers`]), with the reads ahead of a walk
//! over a file the page cache does not hold ([`warm`]). It knows redb's file format (file
//! format 3, redb 3 and 4, as described in redb's `header.rs`, `layout.rs` and
//! `btree_base.rs`), not the journal's tables: the index (`crate::index`) is what reads
//! those, after pre-flight passed. A file these checks do not understand (another page
//! size, a slot version they do not know) is left to redb.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

pub(crate) mod file;
pub(crate) mod guard;
mod header;
mod layout;
mod page;
mod page_numbers;
pub(crate) mod reading;
pub(crate) mod system_tree;
#[cfg(test)]
mod test_files;
mod warm;

pub(crate) use guard::{close_unwritten, guarded};
pub(crate) use page_numbers::{Depth, PagesChecked};
pub(crate) use system_tree::Checked;

/// Reads `buf.len()` bytes at `offset` of the redb file.
pub(crate) type ReadAt<'a> = dyn FnMut(u64, &mut [u8]) -> std::io::Result<()> + 'a;

/// Checks every page number redb can follow in the file at `path`, before any open reads
/// it, as deep as `depth` says for the file's length (see
/// [`page_numbers::check_page_numbers`]). The file is read through a handle of its own.
///
/// The file may be live (a writer in another process checkpointing meanwhile): a refusal
/// is only returned when the commit slots read the same after the walk as before it, so
/// the walk saw one commit's pages; otherwise it walks again (at most three times).
///
/// # Errors
///
/// `Corrupt { table: "(redb)", key: "page numbers", .. }` naming the page; `Io` when the
/// file cannot be opened or read.
pub(crate) fn check_file(path: &Path, depth: impl Fn(u64) -> Depth) -> Result<PagesChecked> {
    let mut tries = 0;
    loop {
        tries += 1;
        // One handle per try: the slots before the walk, the walk, and, only when it
        // refuses, the slots again.
        let (walked, slots_changed) = on_file(path, |file, len, read| {
            // After a reboot the walk would wait for the device page by page (see `warm`).
            let cold = tries == 1 && warm::is_cold(len, read);
            walk_file(file, len, read, depth(len), cold, warm::READ_AHEAD_MAX)
        })?;
        if !(slots_changed && tries < 3) {
            return walked;
        }
    }
}

/// One try of [`check_file`] on `file`: the walk's answer, and whether the commit slots
/// changed during a walk that refused (a live writer committed meanwhile). A `cold` file is
/// read ahead of the walk as its depth suits (see `warm`): in order when every page is
/// read and the file is at most `read_ahead_max` bytes, else by the prefetch threads.
fn walk_file(
    file: &File,
    len: u64,
    read: &mut ReadAt<'_>,
    depth: Depth,
    cold: bool,
    read_ahead_max: u64,
) -> Result<(Result<PagesChecked>, bool)> {
    let in_order = cold && depth == Depth::Full && len <= read_ahead_max;
    if in_order {
        warm::read_ahead(len, read);
    }
    let before = header::header_of(len, read)?;
    let walked = if cold && !in_order {
        warm::prefetching(file, |prefetch| {
            page_numbers::check_page_numbers_prefetching(len, read, depth, prefetch)
        })
    } else {
        page_numbers::check_page_numbers(len, read, depth)
    };
    let slots_changed = walked.is_err() && header::header_of(len, read)? != before;
    Ok((walked, slots_changed))
}

/// Checks redb's system tree in the file at `path` (see [`system_tree::check`]), read
/// through a handle of its own, after a writer opened it and before anything commits to
/// it. The caller holds redb's lock on the file, so no other writer changes it meanwhile.
///
/// # Errors
///
/// `Corrupt { table: "(redb)", key: "system tree", .. }` naming the damage; `Io` when the
/// file cannot be opened or read.
pub(crate) fn check_before_first_commit(path: &Path) -> Result<Checked> {
    on_file(path, |_, len, read| system_tree::check(len, read))
}

/// Checks a storage backend before redb takes it as a writer: its system tree (see
/// [`system_tree::check`]) and every page number (see
/// [`page_numbers::check_page_numbers`]), as deep as `depth` says for the storage's
/// length.
///
/// # Errors
///
/// As [`check_before_first_commit`] and [`check_file`].
pub(crate) fn check_backend(
    backend: &dyn redb::StorageBackend,
    depth: impl Fn(u64) -> Depth,
) -> Result<Checked> {
    let len = backend.len().map_err(Error::io)?;
    let mut read = |at, buf: &mut [u8]| backend.read(at, buf);
    let checked = system_tree::check(len, &mut read)?;
    page_numbers::check_page_numbers(len, &mut read, depth(len))?;
    Ok(checked)
}

/// Runs a check on the redb file at `path`, read through a handle of its own (given too,
/// for reads on other threads).
fn on_file<R>(
    path: &Path,
    check: impl FnOnce(&File, u64, &mut ReadAt<'_>) -> Result<R>,
) -> Result<R> {
    let file = File::open(path).map_err(Error::io)?;
    let len = file.metadata().map_err(Error::io)?.len();
    check(&file, len, &mut |at, buf| {
        reading::read_exact_at(&file, buf, at)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::test_files::journal_file;

    /// The walk of `path` at `depth` as a cold file is walked, read ahead in order and by
    /// the prefetch threads, and as a warm one is.
    fn three_ways(path: &Path, depth: Depth) -> [Result<PagesChecked>; 3] {
        [(true, u64::MAX), (true, 0), (false, u64::MAX)].map(|(cold, read_ahead_max)| {
            on_file(path, |file, len, read| {
                walk_file(file, len, read, depth, cold, read_ahead_max)
            })
            .expect("read")
            .0
        })
    }

    #[test]
    fn a_cold_file_is_checked_as_a_warm_one_at_either_depth() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = journal_file(dir.path());
        for depth in [Depth::Full, Depth::Branches] {
            let [in_order, threads, warm] = three_ways(&path, depth).map(|w| w.expect("intact"));
            assert_eq!(in_order, warm, "{depth:?}");
            assert_eq!(threads, warm, "{depth:?}");
            assert!(warm.pages > 0, "{depth:?} {warm:?}");
        }
    }

    #[test]
    fn a_cold_file_with_a_child_outside_it_is_refused_as_a_warm_one_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = journal_file(dir.path());
        let mut bytes = std::fs::read(&path).expect("read");
        // Every page that starts as a branch gets a last child past the file's pages (as
        // in `page_numbers`' tests), the reachable ones among them.
        let page = layout::PAGE_SIZE as usize;
        let mut damaged = 0;
        for at in (page..bytes.len()).step_by(page) {
            if bytes[at] != page::BRANCH {
                continue;
            }
            let keys = usize::from(page::u16_at(&bytes, at + 2).expect("key count"));
            let child = at + 8 + 16 * (keys + 1) + 8 * keys;
            if child + 8 <= at + page {
                bytes[child..child + 8].copy_from_slice(&0x000F_FFFFu64.to_le_bytes());
                damaged += 1;
            }
        }
        assert!(damaged > 0);
        std::fs::write(&path, &bytes).expect("write");
        for depth in [Depth::Full, Depth::Branches] {
            let [in_order, threads, warm] =
                three_ways(&path, depth).map(|w| w.expect_err("damaged").to_string());
            assert_eq!(in_order, warm, "{depth:?}");
            assert_eq!(threads, warm, "{depth:?}");
            assert!(warm.contains("outside the file"), "{warm}");
        }
    }
}
