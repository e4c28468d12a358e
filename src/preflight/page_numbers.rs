//! The page-number walk: every page number redb can follow, checked against the file's
//! layout before any open reads the file.
//!
//! redb allocates a page's whole size (up to 4 GiB, from the order its number claims)
//! before it reads the page, so one damaged number would make a read take gigabytes.
//! [`check_page_numbers`] walks the trees of the commit slot redb will read unverified and
//! refuses a number whose range lies outside the file. It reads each page at most once per
//! order (a bit per page of the file remembers which), so a cycle or a shared child ends
//! the walk instead of looping; [`Depth`] says whether the tables' leaves are read too.
//! Checksums are not its business: a page that does not parse is left to redb, which
//! answers it as damage.

use std::collections::HashSet;

use super::ReadAt;
use super::header::{
    GOD_BYTE, PRIMARY_UNFLUSHED, RECOVERY_REQUIRED, SYSTEM_ROOT_AT, SYSTEM_ROOT_NON_NULL_AT,
    TWO_PHASE_COMMIT, USER_ROOT_AT, USER_ROOT_NON_NULL_AT, header_and_layout, primary_of, slot,
    slot_verifies,
};
use super::layout::{Layout, PAGE_SIZE, PageNumber};
use super::page::{BRANCH, Definition, LEAF, MAX_DEPTH, Shape, children, leaf_pairs, page_ref};
use crate::error::{Error, Result};

/// Checks every page number redb can follow in a file of `file_len` bytes
/// read through `read`, before any open reads it: the tree of table definitions (the
/// commit slot's user root), the system tree, and every table's tree, through every branch.
/// redb allocates a page's whole size, from the order its number claims, before it reads
/// the page (and checks only that the order is at most 20), so one damaged page number
/// anywhere (fuzzing found one claiming 4 GiB in the table definitions, and a single
/// flipped byte in a branch of any table does the same) would make the first read of it
/// take gigabytes. A page number whose range lies outside the file is refused. Unlike
/// [`check`](super::system_tree::check) this applies to every open, read-only ones included, and checks no
/// checksums: a page that does not parse is left to redb, which answers it as damage.
///
/// Which slot: the one redb reads without verifying it. That is the primary of a clean
/// file or of a two-phase commit. A file a crash left after a one-phase commit is verified
/// by redb, checksum by checksum, before it uses either slot, so its trees are not walked.
///
/// The secondary is walked only where a reader would serve it unverified: a header that
/// marks its primary unflushed (readers beside a writer serve the previous commit until
/// the writer's flush clears the mark) without the recovery flag. A writer keeps that flag
/// set while it runs, so on a file a writer left (running, or killed) the mark is not
/// enough: a killed writer's next open flushes and keeps the primary, and the secondary's
/// pages may already hold the next transaction's writes. A power cut leaves exactly that:
/// the write that clears the mark is not synced yet when the next transaction writes over
/// the secondary's pages (free once the primary's flush made it durable), and those writes
/// can reach the disk without it.
///
/// It reads every page the trees reach, once (about the file's size; see
/// [`PagesChecked`]), with memory of one page plus a bit per page of the file.
///
/// # Errors
///
/// `Corrupt { table: "(redb)", key: "page numbers", .. }` naming the page; `Io` when a
/// read fails.
pub(crate) fn check_page_numbers(
    file_len: u64,
    read: &mut ReadAt<'_>,
    depth: Depth,
) -> Result<PagesChecked> {
    check_page_numbers_prefetching(file_len, read, depth, &mut |_, _| {})
}

/// [`check_page_numbers`], telling `prefetch` the byte range (start, length) of every page
/// it will read before it reads it, as soon as the branch naming it is read: a caller
/// whose file is cold reads them ahead on other threads (see `warm`).
pub(crate) fn check_page_numbers_prefetching(
    file_len: u64,
    read: &mut ReadAt<'_>,
    depth: Depth,
    prefetch: &mut dyn FnMut(u64, u64),
) -> Result<PagesChecked> {
    let Some((header, layout)) = header_and_layout(file_len, read)? else {
        return Ok(PagesChecked::default());
    };
    let primary = primary_of(&header);
    let slot_ok = |i: usize| slot_verifies(slot(&header, i));
    let god = header[GOD_BYTE];
    let two_phase = god & TWO_PHASE_COMMIT != 0;
    let unflushed = god & PRIMARY_UNFLUSHED != 0;
    let recovery = god & RECOVERY_REQUIRED != 0;
    let mut slots = Vec::new();
    // redb trusts a primary written by a two-phase commit (durable before the header named
    // it) and a clean file's primary, and reads them unverified. Otherwise a writer's open
    // verifies a slot's trees by their checksums before it uses them, following only
    // numbers of pages that verified, and falls back to the other slot: nothing to check.
    if slot_ok(primary) && (two_phase || !(recovery || unflushed)) {
        slots.push(primary);
    }
    // Readers serve the previous commit while the primary is marked unflushed; with the
    // recovery flag set, only a live writer's readers do, within its flush, and after a
    // crash nothing reads it (see above).
    if unflushed && !recovery && slot_ok(1 - primary) {
        slots.push(1 - primary);
    }
    let mut walk = PageWalk {
        layout,
        depth,
        seen: vec![0u64; usize::try_from(file_len / PAGE_SIZE / 64 + 1).unwrap_or(0)],
        larger: HashSet::new(),
        checked: PagesChecked::default(),
    };
    for i in slots {
        let slot = slot(&header, i);
        for (non_null, at) in [
            (USER_ROOT_NON_NULL_AT, USER_ROOT_AT),
            (SYSTEM_ROOT_NON_NULL_AT, SYSTEM_ROOT_AT),
        ] {
            if slot[non_null] == 0 {
                continue;
            }
            if let Some(root) = page_ref(slot, at) {
                walk.tree(read, prefetch, root.page, true)?;
            }
        }
    }
    Ok(walk.checked)
}

/// How much of a page [`check_page_numbers`] reads first: enough to tell a leaf.
const HEAD: usize = 16;

/// What [`check_page_numbers`] read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PagesChecked {
    /// Pages read (each once).
    pub(crate) pages: u64,
    /// Page numbers checked against the layout (roots and branch children).
    pub(crate) numbers: u64,
}

/// How much of the trees [`check_page_numbers`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Depth {
    /// Every page the trees reach: every page number redb can follow is checked.
    Full,
    /// The tables' branch pages, not their leaves (about one page in a hundred): every
    /// child number of every branch is checked, but a leaf damaged into looking like a
    /// branch is not seen.
    Branches,
}

impl Depth {
    /// A writer's walk of a file of `len` bytes: every page up to `limit` bytes.
    pub(crate) fn for_writer(len: u64, limit: u64) -> Depth {
        if len <= limit {
            Depth::Full
        } else {
            Depth::Branches
        }
    }
}

struct PageWalk {
    layout: Layout,
    depth: Depth,
    /// A bit per page of the file: pages of order 0 already read.
    seen: Vec<u64>,
    /// Pages of a higher order already read (few: only values over a page use them).
    larger: HashSet<(u64, u8)>,
    checked: PagesChecked,
}

impl PageWalk {
    /// Walks the tree at `root`; `definitions` when its leaves are table definitions (the
    /// user root's and the system root's trees), whose tables' trees are walked too.
    fn tree(
        &mut self,
        read: &mut ReadAt<'_>,
        prefetch: &mut dyn FnMut(u64, u64),
        root: PageNumber,
        definitions: bool,
    ) -> Result<()> {
        // In [`Depth::Branches`], a table's pages at the depth of its leftmost leaf are
        // leaves (redb's trees are balanced): their numbers are checked, they are not read.
        let leaf_depth = match self.depth {
            Depth::Branches if !definitions => self.leftmost_leaf_depth(read, root)?,
            _ => None,
        };
        let mut stack = vec![(root, 0usize)];
        let mut buf = Vec::new();
        let mut roots = Vec::new();
        while let Some((page, depth)) = stack.pop() {
            let (start, len) = self.check(page)?;
            if leaf_depth.is_some_and(|d| depth >= d) {
                continue;
            }
            // A page read before (with at least this order: a larger one may hold more
            // children) was checked; a cycle or a shared child ends here, so every page is
            // read at most once per order and the walk ends.
            if !self.first_visit(start, page.order) {
                continue;
            }
            let len = usize::try_from(len).map_err(|_| outside(page))?;
            // A data leaf holds no page numbers: its first bytes (which say it is a leaf)
            // are enough. A branch, and a leaf of table definitions, are read whole. Above
            // the known leaf depth every page should be a branch: read whole at once (one
            // read per page instead of two).
            let head = if definitions || leaf_depth.is_some() {
                len
            } else {
                len.min(HEAD)
            };
            let buf = self.read_page(read, start, head, len, &mut buf)?;
            match buf.first() {
                // Every child redb would follow, read as leniently as redb reads them (it
                // takes any key count, zero included, and parses no further to follow one).
                // Children at the known leaf depth (most of the page numbers the walk
                // meets) are only checked, here: pushing each onto the stack to pop it for
                // the same check took about half the walk's instructions.
                Some(&BRANCH) if leaf_depth.is_some_and(|d| depth + 1 >= d) => {
                    for child in children(buf) {
                        self.check(child)?;
                    }
                }
                Some(&BRANCH) => {
                    for child in children(buf) {
                        // Read next, unless it lies outside the file, which the pop
                        // refuses.
                        if let Some((start, len)) = self.layout.range(child) {
                            prefetch(start, len);
                        }
                        stack.push((child, depth + 1));
                    }
                }
                Some(&LEAF) if definitions => {
                    for (_, v) in leaf_pairs(buf, Shape::TABLE_TREE).unwrap_or_default() {
                        if let Some(def) = Definition::parse(&buf[v.0..v.1])
                            && let Some(r) = def.root
                        {
                            roots.push(r.page);
                        }
                    }
                }
                _ => {}
            }
        }
        for root in roots {
            self.tree(read, prefetch, root, false)?;
        }
        Ok(())
    }

    /// Checks one page number against the layout (and counts it): its byte range.
    fn check(&mut self, page: PageNumber) -> Result<(u64, u64)> {
        self.checked.numbers += 1;
        self.layout.range(page).ok_or_else(|| outside(page))
    }

    /// Reads `head` bytes of the page at `start`, and all `len` of it if it is a branch,
    /// into `scratch`; answers the bytes read. `scratch` only grows, and is overwritten
    /// rather than zeroed for each page (zeroing every branch page cost a third of the
    /// walk).
    fn read_page<'b>(
        &mut self,
        read: &mut ReadAt<'_>,
        start: u64,
        head: usize,
        len: usize,
        scratch: &'b mut Vec<u8>,
    ) -> Result<&'b [u8]> {
        if scratch.len() < head {
            scratch.resize(head, 0);
        }
        read(start, &mut scratch[..head]).map_err(Error::io)?;
        let mut read_len = head;
        if scratch.first() == Some(&BRANCH) && head < len {
            if scratch.len() < len {
                scratch.resize(len, 0);
            }
            read(start + head as u64, &mut scratch[head..len]).map_err(Error::io)?;
            read_len = len;
        }
        self.checked.pages += 1;
        Ok(&scratch[..read_len])
    }

    /// The depth of the first leaf down the tree's first children (`None` when the
    /// descent meets a page outside the file, or no leaf within [`MAX_DEPTH`]: the walk
    /// then reads every page and refuses what it must).
    fn leftmost_leaf_depth(
        &mut self,
        read: &mut ReadAt<'_>,
        root: PageNumber,
    ) -> Result<Option<usize>> {
        let mut page = root;
        let mut buf = Vec::new();
        for depth in 0..MAX_DEPTH {
            let Some((start, len)) = self.layout.range(page) else {
                return Ok(None);
            };
            let Ok(len) = usize::try_from(len) else {
                return Ok(None);
            };
            let buf = self.read_page(read, start, len.min(HEAD), len, &mut buf)?;
            match buf.first() {
                Some(&BRANCH) => match children(buf).next() {
                    Some(first) => page = first,
                    None => return Ok(None),
                },
                Some(&LEAF) => return Ok(Some(depth)),
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// Whether the page at byte `start` is read for the first time with `order` or more.
    fn first_visit(&mut self, start: u64, order: u8) -> bool {
        if order > 0 {
            return self.larger.insert((start, order));
        }
        let bit = start / PAGE_SIZE;
        let (Ok(word), mask) = (usize::try_from(bit / 64), 1u64 << (bit % 64)) else {
            return false;
        };
        match self.seen.get_mut(word) {
            Some(w) if *w & mask == 0 => {
                *w |= mask;
                true
            }
            _ => false,
        }
    }
}

fn outside(page: PageNumber) -> Error {
    Error::corrupt(
        "(redb)",
        "page numbers",
        format!(
            "the storage engine's trees point at {page}, outside the file (reading it would \
             allocate {} bytes); nothing was read or changed: run `opjournal repair` on the \
             file, which rebuilds what it can read into a new file",
            PAGE_SIZE
                .checked_shl(u32::from(page.order.min(63)))
                .unwrap_or(u64::MAX)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::header::PRIMARY_BIT;
    use crate::preflight::page::u16_at;
    use crate::preflight::test_files::{journal_bytes, reader};

    /// The offsets and first bytes of the pages a walk of `bytes` at `depth` reads.
    fn pages_read(bytes: &[u8], depth: Depth) -> (PagesChecked, Vec<(usize, u8)>) {
        let mut pages = Vec::new();
        let checked = check_page_numbers(
            bytes.len() as u64,
            &mut |at, buf| {
                reader(bytes)(at, buf)?;
                let at = usize::try_from(at).map_err(std::io::Error::other)?;
                if at > 0 && at % PAGE_SIZE as usize == 0 {
                    pages.push((at, buf[0]));
                }
                Ok(())
            },
            depth,
        )
        .expect("an intact journal passes");
        (checked, pages)
    }

    /// The offsets of the pages read whose first byte is `kind`.
    fn offsets_of(pages: &[(usize, u8)], kind: u8) -> Vec<usize> {
        pages
            .iter()
            .filter(|(_, t)| *t == kind)
            .map(|(at, _)| *at)
            .collect()
    }

    fn refused_as_outside(bytes: &[u8], depth: Depth) -> bool {
        match check_page_numbers(bytes.len() as u64, &mut reader(bytes), depth) {
            Err(e) => {
                assert!(
                    matches!(e.kind(), crate::ErrorKind::Corrupt { key, .. } if key == "page numbers"),
                    "{e:?}"
                );
                assert!(e.to_string().contains("outside the file"), "{e}");
                true
            }
            Ok(_) => false,
        }
    }

    #[test]
    fn the_branch_walk_checks_every_number_the_full_walk_does_reading_only_branches() {
        let bytes = journal_bytes();
        let (full, full_pages) = pages_read(&bytes, Depth::Full);
        let (branches, branch_pages) = pages_read(&bytes, Depth::Branches);
        assert_eq!(full.numbers, branches.numbers, "{full:?} {branches:?}");
        assert!(
            full.pages as usize >= bytes.len() / PAGE_SIZE as usize / 2,
            "{full:?}"
        );
        assert!(branches.pages * 4 < full.pages, "{full:?} {branches:?}");
        // Beside branches, the branch walk reads the table definitions and one leaf per
        // table (the descent that finds the leaves' depth).
        let branch_count = offsets_of(&full_pages, BRANCH).len();
        assert!(branch_count > 0, "the journal has branch pages");
        assert!(
            offsets_of(&branch_pages, BRANCH).len() >= branch_count,
            "every branch is read"
        );
    }

    #[test]
    fn the_walk_names_each_child_it_will_read_before_reading_it() {
        let bytes = journal_bytes();
        // In order: (true, start) for a page named ahead, (false, start) for a page read.
        let events = std::cell::RefCell::new(Vec::new());
        let checked = check_page_numbers_prefetching(
            bytes.len() as u64,
            &mut |at, buf| {
                reader(&bytes)(at, buf)?;
                if at > 0 && at % PAGE_SIZE == 0 {
                    events.borrow_mut().push((false, at));
                }
                Ok(())
            },
            Depth::Full,
            &mut |start, len| {
                assert!(len >= HEAD as u64, "{start} {len}");
                events.borrow_mut().push((true, start));
            },
        )
        .expect("an intact journal passes");
        let (plain, _) = pages_read(&bytes, Depth::Full);
        assert_eq!(
            checked, plain,
            "naming pages ahead changes nothing the walk checks"
        );
        let events = events.into_inner();
        let read: Vec<u64> = events.iter().filter(|e| !e.0).map(|e| e.1).collect();
        let named_first = read
            .iter()
            .filter(|&&at| {
                let named = events.iter().position(|&e| e == (true, at));
                let first_read = events.iter().position(|&e| e == (false, at));
                named.is_some() && named < first_read
            })
            .count();
        // Only the trees' roots (the definitions', the system tree's, each table's) are
        // read without a branch naming them first.
        assert!(
            named_first * 10 >= read.len() * 9,
            "{named_first} of {} pages read were named first",
            read.len()
        );
    }

    #[test]
    fn a_branch_child_outside_the_file_is_refused_by_both_walks() {
        let bytes = journal_bytes();
        let (_, pages) = pages_read(&bytes, Depth::Full);
        let branches = offsets_of(&pages, BRANCH);
        assert!(!branches.is_empty());
        for at in branches {
            let keys = usize::from(u16_at(&bytes, at + 2).expect("key count"));
            // The last child: order 20 (4 GiB), or an index past the file's pages.
            let child = at + 8 + 16 * (keys + 1) + 8 * keys;
            for raw in [(20u64 << 59) | 1, 0x000F_FFFF] {
                let mut damaged = bytes.clone();
                damaged[child..child + 8].copy_from_slice(&raw.to_le_bytes());
                assert!(refused_as_outside(&damaged, Depth::Full), "page at {at}");
                assert!(
                    refused_as_outside(&damaged, Depth::Branches),
                    "page at {at}"
                );
            }
        }
    }

    #[test]
    fn a_leaf_made_a_branch_naming_a_page_outside_is_refused_by_the_full_walk_only() {
        let bytes = journal_bytes();
        let (_, pages) = pages_read(&bytes, Depth::Full);
        let (_, branch_walk) = pages_read(&bytes, Depth::Branches);
        let leaves = offsets_of(&pages, LEAF);
        assert!(leaves.len() > 4);
        let mut unread_by_branch_walk = 0;
        for at in leaves {
            let mut damaged = bytes.clone();
            damaged[at] = BRANCH;
            damaged[at + 2..at + 4].copy_from_slice(&0u16.to_le_bytes());
            damaged[at + 24..at + 32].copy_from_slice(&((20u64 << 59) | 1).to_le_bytes());
            assert!(refused_as_outside(&damaged, Depth::Full), "leaf at {at}");
            // The limit the branch walk documents: a leaf it does not read.
            if !branch_walk.iter().any(|(p, _)| *p == at) {
                assert!(
                    !refused_as_outside(&damaged, Depth::Branches),
                    "leaf at {at}"
                );
                unread_by_branch_walk += 1;
            }
        }
        assert!(unread_by_branch_walk > 0);
    }

    /// `bytes` with the god byte's flags replaced by `flags` (which slot is primary kept).
    fn with_flags(bytes: &[u8], flags: u8) -> Vec<u8> {
        let mut out = bytes.to_vec();
        out[GOD_BYTE] = (out[GOD_BYTE] & PRIMARY_BIT) | flags;
        out
    }

    /// `bytes` with the page at `at` made a branch whose one child claims 4 GiB.
    fn branch_naming_4_gib(bytes: &[u8], at: usize) -> Vec<u8> {
        let mut out = bytes.to_vec();
        out[at] = BRANCH;
        out[at + 2..at + 4].copy_from_slice(&0u16.to_le_bytes());
        out[at + 24..at + 32].copy_from_slice(&((20u64 << 59) | 1).to_le_bytes());
        out
    }

    /// A power cut between a commit's flip (the primary marked unflushed, synced) and the
    /// write that clears the mark, after the next transaction wrote over the secondary's
    /// pages: the state the power-cut harness found refused as damaged. The writer's next
    /// open flushes and keeps the primary; nothing reads the secondary.
    #[test]
    fn a_killed_writers_unflushed_mark_leaves_the_reused_secondary_unread_and_the_file_opens() {
        let bytes = journal_bytes();
        let primary_pages: HashSet<usize> = pages_read(&bytes, Depth::Full)
            .1
            .into_iter()
            .map(|(at, _)| at)
            .collect();
        // The secondary's pages: walk the file with the other slot made primary.
        let mut swapped = bytes.clone();
        swapped[GOD_BYTE] ^= PRIMARY_BIT;
        let secondary_only: Vec<usize> = pages_read(&swapped, Depth::Full)
            .1
            .into_iter()
            .map(|(at, _)| at)
            .filter(|at| !primary_pages.contains(at))
            .collect();
        assert!(
            !secondary_only.is_empty(),
            "the commit before last has pages of its own"
        );
        // Reused and torn: any bytes, here a branch naming a page of 4 GiB.
        let reused = branch_naming_4_gib(&bytes, secondary_only[0]);
        let killed = with_flags(
            &reused,
            TWO_PHASE_COMMIT | RECOVERY_REQUIRED | PRIMARY_UNFLUSHED,
        );
        for depth in [Depth::Full, Depth::Branches] {
            assert!(!refused_as_outside(&killed, depth), "{depth:?}");
        }
        // Without the recovery flag no writer left the mark: a reader serves the secondary,
        // so it is walked and refused. With the mark cleared it is not read at all.
        let marked = with_flags(&reused, TWO_PHASE_COMMIT | PRIMARY_UNFLUSHED);
        assert!(refused_as_outside(&marked, Depth::Full));
        let flushed = with_flags(&reused, TWO_PHASE_COMMIT | RECOVERY_REQUIRED);
        assert!(!refused_as_outside(&flushed, Depth::Full));

        // The killed writer's file, end to end: verified clean as it is, then reopened by
        // a writer with every receipt.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("killed.opj");
        std::fs::write(&path, &killed).expect("write");
        let report = crate::verify(&path).expect("verify opens it");
        assert!(report.is_clean(), "{report:?}");
        let journal = crate::Journal::open(&path).expect("a writer opens it");
        for i in [0, 199, 399] {
            let r = journal
                .lookup(&format!("op_{i}"))
                .expect("lookup")
                .expect("every receipt");
            assert_eq!(r.status, crate::ExecutionStatus::Applied, "op_{i}");
        }
        journal.close().expect("close");
        let report = crate::verify(&path).expect("verify");
        assert!(report.is_clean(), "{report:?}");
    }

    #[test]
    fn a_clean_file_shorter_than_its_recorded_layout_is_left_to_the_engine_which_names_it() {
        let bytes = journal_bytes();
        let cut = &bytes[..bytes.len() / 2 / PAGE_SIZE as usize * PAGE_SIZE as usize];
        for depth in [Depth::Full, Depth::Branches] {
            let checked = check_page_numbers(cut.len() as u64, &mut reader(cut), depth)
                .expect("a truncated file is left to the engine");
            assert_eq!(checked, PagesChecked::default());
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cut.opj");
        std::fs::write(&path, cut).expect("write");
        let err = crate::Inspector::open(&path).expect_err("a truncated file is refused");
        let cause = std::error::Error::source(&err).map(ToString::to_string);
        assert!(
            cause.as_deref().is_some_and(|c| c.contains("truncated")),
            "{err}: {cause:?}"
        );
    }
}
