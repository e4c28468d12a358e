//! redb's B-tree pages, parsed as redb parses them: a branch's children and the checksums
//! its parent records ([`branch`], [`children`]), a leaf's key and value offsets
//! ([`leaf_pairs`]), a tree's root as a commit slot or a table definition stores it
//! ([`page_ref`], [`Definition`]), and redb's checksum ([`xxh3`]).
//!
//! Every function here takes bytes read from the file and answers `None` for what does not
//! parse: no index is trusted, every offset is checked against the page before it is read.
//! The walks decide what a page that does not parse means. This follows redb's
//! `btree_base.rs` and `table_tree_base.rs` (file format 3, redb 3 and 4).

use super::layout::PageNumber;

/// The first byte of a leaf page.
pub(super) const LEAF: u8 = 1;
/// The first byte of a branch page.
pub(super) const BRANCH: u8 = 2;
/// No real tree is this deep; a deeper one is a cycle or a crafted chain.
pub(super) const MAX_DEPTH: usize = 128;

/// A tree's root or a branch's child: the page and the checksum its parent records.
#[derive(Clone, Copy)]
pub(super) struct PageRef {
    pub(super) page: PageNumber,
    pub(super) checksum: u128,
}

/// Key and value widths of a tree (`None`: variable, with end offsets in the page).
#[derive(Clone, Copy)]
pub(super) struct Shape {
    pub(super) key: Option<usize>,
    pub(super) value: Option<usize>,
}

impl Shape {
    /// The system tree itself: table names to table definitions.
    pub(super) const TABLE_TREE: Shape = Shape {
        key: None,
        value: None,
    };
}

/// The parts of redb's table definition this check needs.
pub(super) struct Definition {
    pub(super) root: Option<PageRef>,
    pub(super) shape: Shape,
}

impl Definition {
    /// type (1), length (8), root flag (1) and root (32), key width flag (1) and width (4),
    /// value width flag (1) and width (4), then alignments and type names.
    pub(super) fn parse(bytes: &[u8]) -> Option<Definition> {
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
pub(super) fn leaf_end(page: &[u8], shape: Shape) -> Option<usize> {
    let pairs = leaf_pairs(page, shape)?;
    let last = pairs.last()?;
    Some(last.1.1)
}

/// A byte range within a page: its start and end offsets.
pub(super) type Span = (usize, usize);

/// The key and value byte ranges of every pair of a leaf, all inside the page:
/// type (1), reserved (1), pair count (2), key ends (4 each, variable keys), value ends (4
/// each, variable values), keys, values.
pub(super) fn leaf_pairs(page: &[u8], shape: Shape) -> Option<Vec<(Span, Span)>> {
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
pub(super) fn branch(page: &[u8], key_width: Option<usize>) -> Option<(usize, Vec<PageRef>)> {
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
pub(super) fn page_ref(bytes: &[u8], at: usize) -> Option<PageRef> {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(bytes.get(at..at + 8)?);
    Some(PageRef {
        page: PageNumber::from_le(raw),
        checksum: u128_at(bytes, at + 8)?,
    })
}

pub(super) fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(bytes.get(at..at + 4)?);
    Some(u32::from_le_bytes(raw))
}

pub(super) fn u128_at(bytes: &[u8], at: usize) -> Option<u128> {
    let mut raw = [0u8; 16];
    raw.copy_from_slice(bytes.get(at..at + 16)?);
    Some(u128::from_le_bytes(raw))
}

/// redb's page checksum: XXH3-128 with seed 0.
pub(super) fn xxh3(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes)
}

/// The children of a branch page, as redb reads them: any key count (zero included),
/// child page numbers after the checksums, as many as the page holds.
pub(super) fn children(page: &[u8]) -> impl Iterator<Item = PageNumber> + '_ {
    let keys = u16_at(page, 2).map_or(0, usize::from);
    let pages_at = 8 + 16 * (keys + 1);
    (0..=keys).map_while(move |i| {
        let raw = page.get(pages_at + 8 * i..pages_at + 8 * i + 8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(raw);
        Some(PageNumber::from_le(b))
    })
}
