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
//!
//! This reads redb's file format (file format 3, redb 3 and 4) directly; the layout is
//! described in redb's `header.rs`, `layout.rs` and `btree_base.rs`. A file this code does
//! not understand (another page size, a slot version it does not know) is left to redb.

use std::collections::HashSet;

use crate::error::{Error, Result};

/// redb's commit slots: the first 320 bytes of the file.
const HEADER_LEN: usize = 320;
const GOD_BYTE: usize = 9;
const PRIMARY_BIT: u8 = 1;
const RECOVERY_REQUIRED: u8 = 2;
const TWO_PHASE_COMMIT: u8 = 4;
const PRIMARY_UNFLUSHED: u8 = 8;
const PAGE_SIZE_AT: usize = 12;
const REGION_HEADER_PAGES_AT: usize = 16;
const REGION_MAX_DATA_PAGES_AT: usize = 20;
const FULL_REGIONS_AT: usize = 24;
const TRAILING_REGION_PAGES_AT: usize = 28;
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

/// Checks every page number redb can follow in a file of `file_len` bytes
/// read through `read`, before any open reads it: the tree of table definitions (the
/// commit slot's user root), the system tree, and every table's tree, through every branch.
/// redb allocates a page's whole size, from the order its number claims, before it reads
/// the page (and checks only that the order is at most 20), so one damaged page number
/// anywhere (fuzzing found one claiming 4 GiB in the table definitions, and a single
/// flipped byte in a branch of any table does the same) would make the first read of it
/// take gigabytes. A page number whose range lies outside the file is refused. Unlike
/// [`check`] this applies to every open, read-only ones included, and checks no
/// checksums: a page that does not parse is left to redb, which answers it as damage.
///
/// Which slot: the one redb reads without verifying it. That is the primary of a clean
/// file or of a two-phase commit, and the secondary while the primary is marked unflushed
/// (readers serve the previous commit then). A file a crash left after a one-phase commit
/// is verified by redb, checksum by checksum, before it uses either slot, so its trees are
/// not walked; nor is any other secondary, whose pages may have been reused since.
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
    // Readers serve the previous commit while the primary is marked unflushed.
    if unflushed && slot_ok(1 - primary) {
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
                walk.tree(read, root.page, true)?;
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
    fn tree(&mut self, read: &mut ReadAt<'_>, root: PageNumber, definitions: bool) -> Result<()> {
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
            self.checked.numbers += 1;
            let (start, len) = self.layout.range(page).ok_or_else(|| outside(page))?;
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
            // are enough. A branch, and a leaf of table definitions, are read whole.
            let head = if definitions { len } else { len.min(HEAD) };
            self.read_page(read, start, head, len, &mut buf)?;
            match buf.first() {
                // Every child redb would follow, read as leniently as redb reads them (it
                // takes any key count, zero included, and parses no further to follow one).
                Some(&BRANCH) => stack.extend(children(&buf).map(|c| (c, depth + 1))),
                Some(&LEAF) if definitions => {
                    for (_, v) in leaf_pairs(&buf, Shape::TABLE_TREE).unwrap_or_default() {
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
            self.tree(read, root, false)?;
        }
        Ok(())
    }

    /// Reads `head` bytes of the page at `start` into `buf`, and all `len` of it if it is
    /// a branch.
    fn read_page(
        &mut self,
        read: &mut ReadAt<'_>,
        start: u64,
        head: usize,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        buf.resize(head, 0);
        read(start, buf).map_err(Error::io)?;
        if buf.first() == Some(&BRANCH) && head < len {
            buf.resize(len, 0);
            read(start + head as u64, &mut buf[head..]).map_err(Error::io)?;
        }
        self.checked.pages += 1;
        Ok(())
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
            self.read_page(read, start, len.min(HEAD), len, &mut buf)?;
            match buf.first() {
                Some(&BRANCH) => match children(&buf).next() {
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

/// The children of a branch page, as redb reads them: any key count (zero included),
/// child page numbers after the checksums, as many as the page holds.
fn children(page: &[u8]) -> impl Iterator<Item = PageNumber> + '_ {
    let keys = u16_at(page, 2).map_or(0, usize::from);
    let pages_at = 8 + 16 * (keys + 1);
    (0..=keys).map_while(move |i| {
        let raw = page.get(pages_at + 8 * i..pages_at + 8 * i + 8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(raw);
        Some(PageNumber::from_le(b))
    })
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
    // A cleanly closed file shorter than the layout its header records (a truncated copy)
    // is refused by redb, naming the truncation, before it reads any page.
    if header[GOD_BYTE] & RECOVERY_REQUIRED == 0
        && let (Some(full), Some(trailing)) = (
            u32_at(&header, FULL_REGIONS_AT),
            u32_at(&header, TRAILING_REGION_PAGES_AT),
        )
    {
        // Every factor is read from the file: a product that overflows claims more than
        // any file holds, so it counts as longer than this one.
        let pages = |n: u32| (u64::from(header_pages) + u64::from(n)).checked_mul(PAGE_SIZE);
        let tail = match trailing {
            0 => Some(0),
            t => pages(t),
        };
        let recorded_len = pages(max_pages)
            .and_then(|region| u64::from(full).checked_mul(region))
            .zip(tail)
            .and_then(|(regions, tail)| regions.checked_add(tail))
            .and_then(|len| len.checked_add(PAGE_SIZE));
        if recorded_len.is_none_or(|len| len > file_len) {
            return Ok(None);
        }
    }
    Ok(Layout::from_file_len(file_len, header_pages.into(), max_pages.into()).map(|l| (header, l)))
}

/// The primary commit slot's index.
fn primary_of(header: &[u8; HEADER_LEN]) -> usize {
    usize::from(header[GOD_BYTE] & PRIMARY_BIT != 0)
}

/// Commit slot `i` (0 or 1) of `header`.
fn slot(header: &[u8; HEADER_LEN], i: usize) -> &[u8] {
    &header[SLOT_AT[i]..SLOT_AT[i] + SLOT_LEN]
}

/// Whether a commit slot is of the version this code reads and passes its checksum (redb
/// uses neither a slot of another version nor one that fails).
fn slot_verifies(slot: &[u8]) -> bool {
    slot[0] == SLOT_VERSION
        && u128_at(slot, SLOT_CHECKSUM_AT) == Some(xxh3(&slot[..SLOT_CHECKSUM_AT]))
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

/// [`check_page_numbers`] on the redb file at `path`, read through a handle of its own, as
/// deep as `depth` says for the file's length.
/// The file may be live (a writer in another process checkpointing meanwhile): a refusal
/// is only returned when the commit slots read the same after the walk as before it, so
/// the walk saw one commit's pages; otherwise it walks again (at most three times).
///
/// # Errors
///
/// As [`check_page_numbers`].
pub(crate) fn check_page_numbers_file(
    path: &std::path::Path,
    depth: impl Fn(u64) -> Depth,
) -> Result<PagesChecked> {
    let mut tries = 0;
    loop {
        tries += 1;
        // One handle per try: the slots before the walk, the walk, and, only when it
        // refuses, the slots again.
        let (walked, slots_changed) = on_file(path, |len, read| {
            let before = header_of(len, read)?;
            let walked = check_page_numbers(len, read, depth(len));
            let changed = walked.is_err() && header_of(len, read)? != before;
            Ok((walked, changed))
        })?;
        if !(slots_changed && tries < 3) {
            return walked;
        }
    }
}

/// The commit slots as read now (empty for a file too short to hold them).
fn header_of(file_len: u64, read: &mut ReadAt<'_>) -> Result<Vec<u8>> {
    if file_len < HEADER_LEN as u64 {
        return Ok(Vec::new());
    }
    let mut header = vec![0u8; HEADER_LEN];
    read(0, &mut header).map_err(Error::io)?;
    Ok(header)
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

/// [`check`] and [`check_page_numbers`] (as deep as `depth` says for the storage's length)
/// on a storage backend, before redb takes it.
///
/// # Errors
///
/// As [`check`] and [`check_page_numbers`].
pub(crate) fn check_backend(
    backend: &dyn redb::StorageBackend,
    depth: impl Fn(u64) -> Depth,
) -> Result<Checked> {
    let len = backend.len().map_err(Error::io)?;
    let mut read = |at, buf: &mut [u8]| backend.read(at, buf);
    let checked = check(len, &mut read)?;
    check_page_numbers(len, &mut read, depth(len))?;
    Ok(checked)
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
        // Both counts are at most 2^20 (checked above), so no product below overflows.
        let region_bytes = (header_pages + max_pages).checked_mul(PAGE_SIZE)?;
        let rest = file_len.checked_sub(PAGE_SIZE)?;
        let full_regions = rest / region_bytes;
        let mut tail = rest.checked_sub(full_regions.checked_mul(region_bytes)?)?;
        let trailing_pages = if tail >= (header_pages + 1).checked_mul(PAGE_SIZE)? {
            tail = tail.checked_sub(header_pages.checked_mul(PAGE_SIZE)?)?;
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
        // The page number comes from the file: checked, although its fields are bounded
        // by their bit widths.
        let end_page = (page.index.checked_add(1)?).checked_shl(u32::from(page.order))?;
        if end_page > self.region_pages(page.region) {
            return None;
        }
        let region_bytes = (self.header_pages + self.full_region_pages).checked_mul(PAGE_SIZE)?;
        let len = PAGE_SIZE.checked_shl(u32::from(page.order))?;
        let start = page
            .region
            .checked_mul(region_bytes)?
            .checked_add(self.header_pages.checked_mul(PAGE_SIZE)?)?
            .checked_add(page.index.checked_mul(len)?)?
            .checked_add(PAGE_SIZE)?;
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

    /// The bytes of [`journal_file`].
    fn journal_bytes() -> Vec<u8> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::read(journal_file(dir.path())).expect("read")
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

    #[test]
    fn header_counts_whose_layout_overflows_are_left_to_the_engine_without_overflow() {
        let mut bytes = journal_bytes();
        bytes[GOD_BYTE] &= !RECOVERY_REQUIRED;
        for at in [
            REGION_HEADER_PAGES_AT,
            REGION_MAX_DATA_PAGES_AT,
            FULL_REGIONS_AT,
        ] {
            bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        }
        let len = bytes.len() as u64;
        assert!(
            header_and_layout(len, &mut reader(&bytes))
                .expect("no read fails")
                .is_none()
        );
        for depth in [Depth::Full, Depth::Branches] {
            let checked = check_page_numbers(len, &mut reader(&bytes), depth)
                .expect("an impossible layout is left to the engine");
            assert_eq!(checked, PagesChecked::default());
        }
    }

    #[test]
    fn a_file_too_short_for_a_header_is_left_to_the_engine() {
        let bytes = vec![0u8; 100];
        assert!(check(bytes.len() as u64, &mut reader(&bytes)).is_ok());
    }
}
