//! A check of the storage engine's own bookkeeping before this process writes to a file.
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
//!
//! This reads redb's file format (file format 3, redb 3 and 4) directly; the layout is
//! described in redb's `header.rs`, `layout.rs` and `btree_base.rs`. A file this code does
//! not understand (another page size, a slot version it does not know) is left to redb.

use std::collections::HashSet;

use crate::error::{Error, Result};

/// The storage engine's commit slots: the first 320 bytes of the file.
const HEADER_LEN: usize = 320;
const GOD_BYTE: usize = 9;
const PRIMARY_BIT: u8 = 1;
const TWO_PHASE_COMMIT: u8 = 4;
const PAGE_SIZE_AT: usize = 12;
const REGION_HEADER_PAGES_AT: usize = 16;
const REGION_MAX_DATA_PAGES_AT: usize = 20;
const SLOT_AT: [usize; 2] = [64, 192];
const SLOT_LEN: usize = 128;
const SLOT_VERSION: u8 = 3;
/// Within a slot: the tables' tree root and the system tree's root (page number,
/// checksum, length) and their flags.
const USER_ROOT_NON_NULL_AT: usize = 1;
const USER_ROOT_AT: usize = 8;
const SYSTEM_ROOT_NON_NULL_AT: usize = 2;
const SYSTEM_ROOT_AT: usize = 40;
const SLOT_CHECKSUM_AT: usize = SLOT_LEN - 16;

const LEAF: u8 = 1;
const BRANCH: u8 = 2;
/// The page size this build of the journal creates and redb 4 requires.
const PAGE_SIZE: u64 = 4096;
const MAX_PAGE_INDEX: u64 = 0x000F_FFFF;
const MAX_REGIONS: u64 = 0x0010_0000;
const MAX_ORDER: u8 = 20;
/// No real tree is this deep; a deeper one is a cycle or a crafted chain.
const MAX_DEPTH: usize = 128;

/// The system tables whose values list pages that the next commit frees.
const PAGE_LIST_TABLES: [&str; 3] = [
    "data_pages_unreachable",
    "system_pages_unreachable",
    "data_pages_allocated",
];

/// Reads `buf.len()` bytes at `offset` of the redb file.
pub(crate) type ReadAt<'a> = dyn FnMut(u64, &mut [u8]) -> std::io::Result<()> + 'a;

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
    let primary = usize::from(header[GOD_BYTE] & PRIMARY_BIT != 0);
    let slot = &header[SLOT_AT[primary]..SLOT_AT[primary] + SLOT_LEN];
    if slot[0] != SLOT_VERSION {
        return skipped;
    }
    // redb refuses a two-phase primary whose checksum fails: nothing to add.
    let stored = u128_at(slot, SLOT_CHECKSUM_AT).unwrap_or(0);
    if xxh3(&slot[..SLOT_CHECKSUM_AT]) != stored {
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

/// Checks the page numbers of the tree of table definitions that redb reads first (the
/// primary commit slot's user root), before any open reads it: redb allocates a page's
/// whole size, from the order its number claims, before reading it, so a damaged page
/// number there (fuzzing found one claiming 4 GiB) must be refused, as must a table root
/// outside the file. Unlike [`check`] this applies to every open, read-only ones
/// included, and checks no checksums: a page that does not parse is left to redb.
///
/// # Errors
///
/// `Corrupt { table: "(redb)", .. }` naming the page; `Io` when a read fails.
pub(crate) fn check_table_tree(file_len: u64, read: &mut ReadAt<'_>) -> Result<()> {
    let Some((header, layout)) = header_and_layout(file_len, read)? else {
        return Ok(());
    };
    let primary = usize::from(header[GOD_BYTE] & PRIMARY_BIT != 0);
    let slot = &header[SLOT_AT[primary]..SLOT_AT[primary] + SLOT_LEN];
    if slot[0] != SLOT_VERSION || slot[USER_ROOT_NON_NULL_AT] == 0 {
        return Ok(());
    }
    let Some(root) = page_ref(slot, USER_ROOT_AT) else {
        return Ok(());
    };
    let outside = |what: &str, page: PageNumber| {
        damaged(format!(
            "the tree of table definitions points at {page}, outside the file ({what})"
        ))
    };
    let mut stack = vec![(root.page, 0usize)];
    let mut seen = HashSet::new();
    while let Some((page, depth)) = stack.pop() {
        if depth >= MAX_DEPTH || !seen.insert(page) {
            break;
        }
        let (start, len) = layout.range(page).ok_or_else(|| outside("a page", page))?;
        let len = usize::try_from(len).map_err(|_| outside("a page", page))?;
        let mut buf = vec![0u8; len];
        read(start, &mut buf).map_err(Error::io)?;
        match buf.first() {
            // Every child redb would follow, read as leniently as redb reads them (it
            // takes any key count, zero included).
            Some(&BRANCH) => {
                let keys = u16_at(&buf, 2).map_or(0, usize::from);
                let pages_at = 8 + 16 * (keys + 1);
                for i in 0..=keys {
                    let Some(raw) = buf.get(pages_at + 8 * i..pages_at + 8 * i + 8) else {
                        break;
                    };
                    let mut b = [0u8; 8];
                    b.copy_from_slice(raw);
                    stack.push((PageNumber::from_le(b), depth + 1));
                }
            }
            Some(&LEAF) => {
                for (_, v) in leaf_pairs(&buf, Shape::TABLE_TREE).unwrap_or_default() {
                    if let Some(def) = Definition::parse(&buf[v.0..v.1])
                        && let Some(r) = def.root
                        && layout.range(r.page).is_none()
                    {
                        return Err(outside("a table's root", r.page));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The commit slots' header and the file's layout, or `None` for a file these checks leave
/// to redb (too short, another page size, a length that maps onto no layout: redb refuses
/// those itself).
fn header_and_layout(
    file_len: u64,
    read: &mut ReadAt<'_>,
) -> Result<Option<([u8; HEADER_LEN], Layout)>> {
    if file_len < 2 * PAGE_SIZE {
        return Ok(None);
    }
    let mut header = [0u8; HEADER_LEN];
    read(0, &mut header).map_err(Error::io)?;
    if u32_at(&header, PAGE_SIZE_AT) != Some(PAGE_SIZE as u32) {
        return Ok(None);
    }
    let (Some(header_pages), Some(max_pages)) = (
        u32_at(&header, REGION_HEADER_PAGES_AT),
        u32_at(&header, REGION_MAX_DATA_PAGES_AT),
    ) else {
        return Ok(None);
    };
    Ok(Layout::from_file_len(file_len, header_pages.into(), max_pages.into()).map(|l| (header, l)))
}

/// Runs a check on the redb file at `path`, read through a handle of its own.
fn on_file<R>(
    path: &std::path::Path,
    check: impl FnOnce(u64, &mut ReadAt<'_>) -> Result<R>,
) -> Result<R> {
    let file = std::fs::File::open(path).map_err(Error::io)?;
    let len = file.metadata().map_err(Error::io)?.len();
    check(len, &mut |at, buf| {
        super::reading::read_exact_at(&file, buf, at)
    })
}

/// [`check_table_tree`] on the redb file at `path`.
///
/// # Errors
///
/// As [`check_table_tree`].
pub(crate) fn check_table_tree_file(path: &std::path::Path) -> Result<()> {
    on_file(path, check_table_tree)
}

/// What [`check`] read: pages of the system tree, and page numbers listed to be freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    pub(crate) pages: usize,
    pub(crate) listed: usize,
}

/// [`check`] on the redb file at `path`, read through a handle of its own (the caller
/// holds redb's lock on it, so no other writer changes it meanwhile).
///
/// # Errors
///
/// As [`check`].
pub(crate) fn check_file(path: &std::path::Path) -> Result<Checked> {
    on_file(path, check)
}

/// [`check`] on a storage backend, before the storage engine takes it.
///
/// # Errors
///
/// As [`check`].
pub(crate) fn check_backend(backend: &dyn redb::StorageBackend) -> Result<Checked> {
    let len = backend.len().map_err(Error::io)?;
    check(len, &mut |at, buf| backend.read(at, buf))
}

/// Where the regions of a redb file are (as redb computes it from the file's length).
#[derive(Clone, Copy)]
struct Layout {
    header_pages: u64,
    full_regions: u64,
    full_region_pages: u64,
    trailing_pages: u64,
}

impl Layout {
    fn from_file_len(file_len: u64, header_pages: u64, max_pages: u64) -> Option<Layout> {
        if max_pages == 0 || max_pages > MAX_PAGE_INDEX + 1 || header_pages > MAX_PAGE_INDEX + 1 {
            return None;
        }
        let region_bytes = (header_pages + max_pages) * PAGE_SIZE;
        let rest = file_len.checked_sub(PAGE_SIZE)?;
        let full_regions = rest / region_bytes;
        let mut tail = rest - full_regions * region_bytes;
        let trailing_pages = if tail >= (header_pages + 1) * PAGE_SIZE {
            tail -= header_pages * PAGE_SIZE;
            tail / PAGE_SIZE
        } else {
            0
        };
        let regions = full_regions + u64::from(trailing_pages > 0);
        if regions == 0 || regions > MAX_REGIONS {
            return None;
        }
        Some(Layout {
            header_pages,
            full_regions,
            full_region_pages: max_pages,
            trailing_pages,
        })
    }

    fn regions(&self) -> u64 {
        self.full_regions + u64::from(self.trailing_pages > 0)
    }

    fn region_pages(&self, region: u64) -> u64 {
        if region < self.full_regions {
            self.full_region_pages
        } else {
            self.trailing_pages
        }
    }

    /// The byte range of `page`, if it lies inside its region (the check redb makes
    /// while rebuilding its allocator state, and skips when it loads a recorded one).
    fn range(&self, page: PageNumber) -> Option<(u64, u64)> {
        if page.order > MAX_ORDER || page.region >= self.regions() {
            return None;
        }
        let end_page = (page.index + 1) << page.order;
        if end_page > self.region_pages(page.region) {
            return None;
        }
        let region_bytes = (self.header_pages + self.full_region_pages) * PAGE_SIZE;
        let len = PAGE_SIZE << page.order;
        let start = PAGE_SIZE
            + page.region * region_bytes
            + self.header_pages * PAGE_SIZE
            + page.index * len;
        Some((start, len))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PageNumber {
    region: u64,
    index: u64,
    order: u8,
}

impl PageNumber {
    fn from_le(bytes: [u8; 8]) -> PageNumber {
        let raw = u64::from_le_bytes(bytes);
        let order = (raw >> 59) as u8;
        PageNumber {
            region: (raw >> 20) & 0x000F_FFFF,
            index: raw & (0x000F_FFFF >> order.min(20)),
            order,
        }
    }
}

impl std::fmt::Display for PageNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "page {} of region {} (order {})",
            self.index, self.region, self.order
        )
    }
}

/// A tree's root or a branch's child: the page and the checksum its parent records.
#[derive(Clone, Copy)]
struct PageRef {
    page: PageNumber,
    checksum: u128,
}

/// Key and value widths of a tree (`None`: variable, with end offsets in the page).
#[derive(Clone, Copy)]
struct Shape {
    key: Option<usize>,
    value: Option<usize>,
}

impl Shape {
    /// The system tree itself: table names to table definitions.
    const TABLE_TREE: Shape = Shape {
        key: None,
        value: None,
    };
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

/// The parts of redb's table definition this check needs.
struct Definition {
    root: Option<PageRef>,
    shape: Shape,
}

impl Definition {
    /// type (1), length (8), root flag (1) and root (32), key width flag (1) and width (4),
    /// value width flag (1) and width (4), then alignments and type names.
    fn parse(bytes: &[u8]) -> Option<Definition> {
        let root = match *bytes.get(9)? {
            0 => None,
            _ => Some(page_ref(bytes, 10)?),
        };
        let width = |at: usize| -> Option<Option<usize>> {
            match *bytes.get(at)? {
                0 => Some(None),
                _ => Some(Some(usize::try_from(u32_at(bytes, at + 1)?).ok()?)),
            }
        };
        Some(Definition {
            root,
            shape: Shape {
                key: width(42)?,
                value: width(47)?,
            },
        })
    }
}

/// The end of a leaf's pairs (what its checksum covers).
fn leaf_end(page: &[u8], shape: Shape) -> Option<usize> {
    let pairs = leaf_pairs(page, shape)?;
    let last = pairs.last()?;
    Some(last.1.1)
}

type Span = (usize, usize);

/// The key and value byte ranges of every pair of a leaf, all inside the page:
/// type (1), reserved (1), pair count (2), key ends (4 each, variable keys), value ends (4
/// each, variable values), keys, values.
fn leaf_pairs(page: &[u8], shape: Shape) -> Option<Vec<(Span, Span)>> {
    let n = usize::from(u16::from_le_bytes([*page.get(2)?, *page.get(3)?]));
    if n == 0 {
        return None;
    }
    let mut at = 4;
    let key_ends_at = at;
    if shape.key.is_none() {
        at += 4 * n;
    }
    let value_ends_at = at;
    if shape.value.is_none() {
        at += 4 * n;
    }
    let keys_start = at;
    let end_at = |base: usize, i: usize| -> Option<usize> {
        usize::try_from(u32_at(page, base + 4 * i)?).ok()
    };
    let key_end = |i: usize| -> Option<usize> {
        match shape.key {
            Some(w) => keys_start.checked_add(w.checked_mul(i + 1)?),
            None => end_at(key_ends_at, i),
        }
    };
    let keys_end = key_end(n - 1)?;
    let value_end = |i: usize| -> Option<usize> {
        match shape.value {
            Some(w) => keys_end.checked_add(w.checked_mul(i + 1)?),
            None => end_at(value_ends_at, i),
        }
    };
    let mut out = Vec::with_capacity(n);
    let (mut key_start, mut value_start) = (keys_start, keys_end);
    for i in 0..n {
        let (ke, ve) = (key_end(i)?, value_end(i)?);
        if ke < key_start || ve < value_start || ke > keys_end || ve > page.len() {
            return None;
        }
        out.push(((key_start, ke), (value_start, ve)));
        key_start = ke;
        value_start = ve;
    }
    Some(out)
}

/// The end of a branch's bytes (what its checksum covers) and its children: type (1),
/// reserved (1), key count (2), padding (4), child checksums (16 each), child pages (8
/// each), key ends (4 each, variable keys), keys.
fn branch(page: &[u8], key_width: Option<usize>) -> Option<(usize, Vec<PageRef>)> {
    let keys = usize::from(u16::from_le_bytes([*page.get(2)?, *page.get(3)?]));
    if keys == 0 {
        return None;
    }
    let children = keys + 1;
    let pages_at = 8 + 16 * children;
    let key_ends_at = pages_at + 8 * children;
    let end = match key_width {
        Some(w) => key_ends_at.checked_add(w.checked_mul(keys)?)?,
        None => usize::try_from(u32_at(page, key_ends_at + 4 * (keys - 1))?).ok()?,
    };
    if end > page.len() || end < key_ends_at {
        return None;
    }
    let mut out = Vec::with_capacity(children);
    for i in 0..children {
        let checksum = u128_at(page, 8 + 16 * i)?;
        let mut raw = [0u8; 8];
        raw.copy_from_slice(page.get(pages_at + 8 * i..pages_at + 8 * i + 8)?);
        out.push(PageRef {
            page: PageNumber::from_le(raw),
            checksum,
        });
    }
    Some((end, out))
}

/// A root as redb stores it: page number (8), checksum (16), then the tree's length (8).
fn page_ref(bytes: &[u8], at: usize) -> Option<PageRef> {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(bytes.get(at..at + 8)?);
    Some(PageRef {
        page: PageNumber::from_le(raw),
        checksum: u128_at(bytes, at + 8)?,
    })
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(bytes.get(at..at + 4)?);
    Some(u32::from_le_bytes(raw))
}

fn u128_at(bytes: &[u8], at: usize) -> Option<u128> {
    let mut raw = [0u8; 16];
    raw.copy_from_slice(bytes.get(at..at + 16)?);
    Some(u128::from_le_bytes(raw))
}

/// redb's page checksum: XXH3-128 with seed 0.
fn xxh3(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes)
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

    fn reader(bytes: &[u8]) -> impl FnMut(u64, &mut [u8]) -> std::io::Result<()> + '_ {
        move |at, buf| {
            let at = usize::try_from(at).map_err(std::io::Error::other)?;
            let src = bytes
                .get(at..at + buf.len())
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }

    #[test]
    fn page_numbers_decode_as_redb_encodes_them() {
        // region 3, index 5, order 1: index | region << 20 | order << 59
        let raw: u64 = 5 | (3 << 20) | (1 << 59);
        let p = PageNumber::from_le(raw.to_le_bytes());
        assert_eq!((p.region, p.index, p.order), (3, 5, 1));
    }

    #[test]
    fn a_page_past_its_region_has_no_range() {
        let layout = Layout::from_file_len(PAGE_SIZE + 64 * PAGE_SIZE, 0, 4096).expect("layout");
        let inside = PageNumber {
            region: 0,
            index: 63,
            order: 0,
        };
        let past = PageNumber {
            region: 0,
            index: 64,
            order: 0,
        };
        let other_region = PageNumber {
            region: 1,
            index: 0,
            order: 0,
        };
        assert_eq!(
            layout.range(inside),
            Some((PAGE_SIZE + 63 * PAGE_SIZE, PAGE_SIZE))
        );
        assert_eq!(layout.range(past), None);
        assert_eq!(layout.range(other_region), None);
    }

    /// A journal that checkpointed many times, closed cleanly: its file holds a recorded
    /// allocator state and lists of freed pages, as every long-lived journal does.
    fn journal_file(dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("j.opj");
        let journal = crate::Journal::builder()
            .checkpoint_size(64 * 1024)
            .open(&path)
            .expect("open");
        for i in 0..400 {
            let intent =
                crate::Intent::from_json("t.op", &serde_json::json!({ "i": i })).expect("intent");
            let op = crate::Operation::new(format!("op_{i}"), intent).scope(format!("s/{}", i % 7));
            match journal.submit(op).expect("submit") {
                crate::Admission::Fresh(claim) => {
                    journal
                        .complete(&claim, crate::Outcome::applied(i + 1, vec![7u8; 900]))
                        .expect("complete");
                }
                other => panic!("fresh id answered {other:?}"),
            }
        }
        journal.close().expect("close");
        path
    }

    #[test]
    fn an_intact_journal_passes_and_its_whole_system_tree_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = journal_file(dir.path());
        let checked = check_file(&path).expect("an intact journal passes");
        // A journal that checkpointed holds pages waiting to be freed: the lists are read.
        assert!(checked.pages >= 2 && checked.listed > 0, "{checked:?}");
        // Reopening (which checks again) and closing still leaves a passing file.
        crate::Journal::open(&path)
            .expect("reopen")
            .close()
            .expect("close");
        assert!(check_file(&path).expect("passes again").pages >= 2);
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
