//! A check of redb's own bookkeeping before this process writes to a file.
//!
//! redb keeps its allocator state and its lists of pages waiting to be freed in a *system
//! tree* beside the tables. On open it loads the allocator state it recorded at the last
//! commit, and the first write commit frees the listed pages, without checking either
//! against the file: a damaged list (a page number past the end of its region) makes the
//! allocator panic inside that commit, and the panic unwinds through a destructor that
//! panics again, which aborts the process. No `catch_unwind` can stop an abort, so such a
//! file would take the embedding editor down on its first checkpoint, every time it starts.
//!
//! So before a writer's first commit, [`check`] reads the system tree the way redb will
//! use it (the primary commit slot of the header) and checks every page of it against the
//! checksum its parent records (xxh3-128, as redb computes it), every page number against
//! the file's layout, and every page listed as waiting to be freed against the layout too.
//! Anything else answers `Corrupt`, naming what was damaged, with `repair` as the next step
//! (repair rebuilds into a new file and never commits to the damaged one). The system tree
//! is small (a few pages, whatever the journal's size), so this costs well under a
//! millisecond.

use std::collections::HashSet;

use super::ReadAt;
use super::header::{
    GOD_BYTE, SYSTEM_ROOT_AT, SYSTEM_ROOT_NON_NULL_AT, TWO_PHASE_COMMIT, header_and_layout,
    primary_of, slot, slot_verifies,
};
use super::layout::{Layout, PageNumber};
use super::page::{
    BRANCH, Definition, LEAF, MAX_DEPTH, PageRef, Shape, branch, leaf_end, leaf_pairs, page_ref,
    xxh3,
};
use crate::error::{Error, Result};

/// The page-number walk under the path `src/check/source.rs` names it by (a read-only open
/// of a backend); the rest of the crate goes through [`crate::preflight`]'s entry points.
pub(crate) use super::page_numbers::{Depth, check_page_numbers};

/// The system tables whose values list pages that the next commit frees.
const PAGE_LIST_TABLES: [&str; 3] = [
    "data_pages_unreachable",
    "system_pages_unreachable",
    "data_pages_allocated",
];

/// Checks redb's system tree in a file of `file_len` bytes read through `read`. `Ok` when
/// the tree is intact or when redb will not trust it anyway (it rebuilds and checks its
/// allocator state itself when the last commit did not record one).
///
/// # Errors
///
/// `Corrupt { table: "(redb)", key: "system tree", .. }` naming the damage; `Io` when a
/// read fails.
pub(crate) fn check(file_len: u64, read: &mut ReadAt<'_>) -> Result<Checked> {
    let skipped = Ok(Checked::default());
    let Some((header, layout)) = header_and_layout(file_len, read)? else {
        return skipped;
    };
    // Only a primary written by a two-phase commit carries a recorded allocator state that
    // redb loads without checking; otherwise its open rebuilds the state from the trees,
    // checking every page number, and fails cleanly.
    if header[GOD_BYTE] & TWO_PHASE_COMMIT == 0 {
        return skipped;
    }
    let slot = slot(&header, primary_of(&header));
    // redb refuses a two-phase primary whose checksum fails: nothing to add.
    if !slot_verifies(slot) {
        return skipped;
    }
    if slot[SYSTEM_ROOT_NON_NULL_AT] == 0 {
        return skipped;
    }
    let root = page_ref(slot, SYSTEM_ROOT_AT)
        .ok_or_else(|| damaged("the commit slot's system root is unreadable"))?;
    let mut walk = Walk {
        layout,
        read,
        visited: HashSet::new(),
        listed: 0,
    };
    walk.tree(root, Shape::TABLE_TREE, &mut |walk, key, value| {
        walk.table(key, value)
    })?;
    Ok(Checked {
        pages: walk.visited.len(),
        listed: walk.listed,
    })
}

/// What [`check`] read: pages of the system tree, and page numbers listed to be freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    pub(crate) pages: usize,
    pub(crate) listed: usize,
}

struct Walk<'r, 'a> {
    layout: Layout,
    read: &'r mut ReadAt<'a>,
    visited: HashSet<PageNumber>,
    listed: usize,
}

type Visit<'v, 'r, 'a> = dyn FnMut(&mut Walk<'r, 'a>, &[u8], &[u8]) -> Result<()> + 'v;

impl<'r, 'a> Walk<'r, 'a> {
    /// Visits every pair of the tree at `root`, checking every page's checksum first.
    fn tree(&mut self, root: PageRef, shape: Shape, visit: &mut Visit<'_, 'r, 'a>) -> Result<()> {
        let mut stack = vec![(root, 0usize)];
        while let Some((at, depth)) = stack.pop() {
            if depth >= MAX_DEPTH {
                return Err(damaged(
                    "a tree of the system tree is deeper than any real one",
                ));
            }
            if !self.visited.insert(at.page) {
                return Err(damaged(format!("{} is reached twice", at.page)));
            }
            let page = self.page(at.page)?;
            match page.first() {
                Some(&LEAF) => {
                    let end = leaf_end(&page, shape)
                        .ok_or_else(|| damaged(format!("{} is not a valid leaf", at.page)))?;
                    if xxh3(&page[..end]) != at.checksum {
                        return Err(damaged(format!("{} fails its checksum", at.page)));
                    }
                    let pairs = leaf_pairs(&page, shape)
                        .ok_or_else(|| damaged(format!("{} is not a valid leaf", at.page)))?;
                    for (k, v) in pairs {
                        visit(self, &page[k.0..k.1], &page[v.0..v.1])?;
                    }
                }
                Some(&BRANCH) => {
                    let (end, children) = branch(&page, shape.key)
                        .ok_or_else(|| damaged(format!("{} is not a valid branch", at.page)))?;
                    if xxh3(&page[..end]) != at.checksum {
                        return Err(damaged(format!("{} fails its checksum", at.page)));
                    }
                    // Children in reverse, so pairs are visited in key order.
                    stack.extend(children.into_iter().rev().map(|c| (c, depth + 1)));
                }
                _ => {
                    return Err(damaged(format!(
                        "{} is neither a leaf nor a branch",
                        at.page
                    )));
                }
            }
        }
        Ok(())
    }

    /// One table definition of the system tree: its own tree is checked, and where its
    /// values list pages to free, every listed page must lie inside the file.
    fn table(&mut self, name: &[u8], definition: &[u8]) -> Result<()> {
        let name = String::from_utf8_lossy(name).into_owned();
        let Some(def) = Definition::parse(definition) else {
            return Err(damaged(format!(
                "the definition of system table `{name}` is unreadable"
            )));
        };
        let Some(root) = def.root else {
            return Ok(());
        };
        let lists_pages = PAGE_LIST_TABLES.contains(&name.as_str());
        let mut bad: Option<String> = None;
        self.tree(root, def.shape, &mut |walk, _key, value| {
            if lists_pages && bad.is_none() {
                bad = walk.page_list(&name, value);
            }
            Ok(())
        })?;
        match bad {
            Some(problem) => Err(damaged(problem)),
            None => Ok(()),
        }
    }

    /// The first problem of a list of pages to free: `u16` count, then page numbers.
    fn page_list(&mut self, table: &str, value: &[u8]) -> Option<String> {
        let Some(count) = value
            .get(..2)
            .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])))
        else {
            return Some(format!("a page list of `{table}` is truncated"));
        };
        let Some(entries) = value.get(2..2 + 8 * count) else {
            return Some(format!(
                "a page list of `{table}` is shorter than its count"
            ));
        };
        for chunk in entries.chunks_exact(8) {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(chunk);
            let page = PageNumber::from_le(raw);
            self.listed += 1;
            if self.layout.range(page).is_none() {
                return Some(format!(
                    "`{table}` lists {page} to free, which lies outside the file"
                ));
            }
        }
        None
    }

    fn page(&mut self, page: PageNumber) -> Result<Vec<u8>> {
        let (start, len) = self
            .layout
            .range(page)
            .ok_or_else(|| damaged(format!("the tree points at {page}, outside the file")))?;
        let len = usize::try_from(len).map_err(|_| damaged(format!("{page} is too large")))?;
        let mut buf = vec![0u8; len];
        (self.read)(start, &mut buf).map_err(Error::io)?;
        Ok(buf)
    }
}

fn damaged(detail: impl Into<String>) -> Error {
    let detail = detail.into();
    Error::corrupt(
        "(redb)",
        "system tree",
        format!(
            "the storage engine's own bookkeeping is damaged ({detail}); a write would stop \
             the process, so the journal is not opened for writing"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::layout::PAGE_SIZE;
    use crate::preflight::test_files::{journal_file, reader};

    #[test]
    fn an_intact_journal_passes_and_its_whole_system_tree_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = journal_file(dir.path());
        let checked =
            crate::preflight::check_before_first_commit(&path).expect("an intact journal passes");
        // A journal that checkpointed holds pages waiting to be freed: the lists are read.
        assert!(checked.pages >= 2 && checked.listed > 0, "{checked:?}");
        // Reopening (which checks again) and closing still leaves a passing file.
        crate::Journal::open(&path)
            .expect("reopen")
            .close()
            .expect("close");
        assert!(
            crate::preflight::check_before_first_commit(&path)
                .expect("passes again")
                .pages
                >= 2
        );
    }

    #[test]
    fn a_flipped_byte_in_any_system_tree_page_is_refused_and_nothing_else_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = journal_file(dir.path());
        let bytes = std::fs::read(&path).expect("read");
        // Every page the walk reads, by offset: flip one byte in each, one at a time.
        let mut offsets = Vec::new();
        {
            let mut record = |at: u64, buf: &mut [u8]| {
                offsets.push((at, buf.len()));
                reader(&bytes)(at, buf)
            };
            check(bytes.len() as u64, &mut record).expect("intact");
        }
        let pages: Vec<(u64, usize)> = offsets.into_iter().filter(|(at, _)| *at > 0).collect();
        assert!(!pages.is_empty());
        for &(at, len) in &pages {
            let mut damaged = bytes.clone();
            // A byte inside what the page's checksum covers: its header.
            let i = usize::try_from(at).expect("offset") + 1;
            assert!(len > 1);
            damaged[i] ^= 0x40;
            let err = check(damaged.len() as u64, &mut reader(&damaged))
                .expect_err("a damaged system tree page passed");
            assert!(
                matches!(err.kind(), crate::ErrorKind::Corrupt { key, .. } if key == "system tree"),
                "{err:?}"
            );
        }
        // The journal's own pages are not the system tree: damage there is left to the
        // record checks (every value's CRC), and the writer may open the file.
        let user_page = (1..bytes.len() as u64 / PAGE_SIZE)
            .map(|p| p * PAGE_SIZE)
            .find(|at| {
                !pages
                    .iter()
                    .any(|(start, len)| (*start..*start + *len as u64).contains(at))
            })
            .expect("a page outside the system tree");
        let mut damaged = bytes.clone();
        damaged[usize::try_from(user_page).expect("offset") + 1] ^= 0x40;
        assert!(check(damaged.len() as u64, &mut reader(&damaged)).is_ok());
    }

    #[test]
    fn a_file_too_short_for_a_header_is_left_to_the_engine() {
        let bytes = vec![0u8; 100];
        assert!(check(bytes.len() as u64, &mut reader(&bytes)).is_ok());
    }
}
