//! redb's file header: the god byte, the region counts and the two commit slots (the first
//! 320 bytes of the file), and the file's layout derived from them.
//!
//! [`header_and_layout`] reads the header and decides whether the checks apply at all: a
//! file too short for a header, of another page size, whose counts map onto no layout, or a
//! cleanly closed file shorter than the layout its header records is `None`, left to redb,
//! which refuses each of these itself with its own message. [`slot_verifies`] is the test
//! redb applies before it uses a slot; a slot that fails it is never walked. Offsets and
//! flags follow redb's `header.rs` (file format 3, redb 3 and 4); all integers are
//! little-endian.

use super::ReadAt;
use super::layout::{Layout, PAGE_SIZE};
use super::page::{u32_at, u128_at, xxh3};
use crate::error::{Error, Result};

/// redb's commit slots: the first 320 bytes of the file.
pub(super) const HEADER_LEN: usize = 320;
/// The god byte: which slot is primary and how the last commit was made.
pub(super) const GOD_BYTE: usize = 9;
pub(super) const PRIMARY_BIT: u8 = 1;
pub(super) const RECOVERY_REQUIRED: u8 = 2;
pub(super) const TWO_PHASE_COMMIT: u8 = 4;
pub(super) const PRIMARY_UNFLUSHED: u8 = 8;
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
pub(super) const USER_ROOT_NON_NULL_AT: usize = 1;
pub(super) const USER_ROOT_AT: usize = 8;
pub(super) const SYSTEM_ROOT_NON_NULL_AT: usize = 2;
pub(super) const SYSTEM_ROOT_AT: usize = 40;
const SLOT_CHECKSUM_AT: usize = SLOT_LEN - 16;

/// The commit slots' header and the file's layout, or `None` for a file these checks leave
/// to redb (too short, another page size, a length that maps onto no layout: redb refuses
/// those itself).
pub(super) fn header_and_layout(
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
pub(super) fn primary_of(header: &[u8; HEADER_LEN]) -> usize {
    usize::from(header[GOD_BYTE] & PRIMARY_BIT != 0)
}

/// Commit slot `i` (0 or 1) of `header`.
pub(super) fn slot(header: &[u8; HEADER_LEN], i: usize) -> &[u8] {
    &header[SLOT_AT[i]..SLOT_AT[i] + SLOT_LEN]
}

/// Whether a commit slot is of the version this code reads and passes its checksum (redb
/// uses neither a slot of another version nor one that fails).
pub(super) fn slot_verifies(slot: &[u8]) -> bool {
    slot[0] == SLOT_VERSION
        && u128_at(slot, SLOT_CHECKSUM_AT) == Some(xxh3(&slot[..SLOT_CHECKSUM_AT]))
}

/// The commit slots as read now (empty for a file too short to hold them).
pub(super) fn header_of(file_len: u64, read: &mut ReadAt<'_>) -> Result<Vec<u8>> {
    if file_len < HEADER_LEN as u64 {
        return Ok(Vec::new());
    }
    let mut header = vec![0u8; HEADER_LEN];
    read(0, &mut header).map_err(Error::io)?;
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::page_numbers::{Depth, PagesChecked, check_page_numbers};
    use crate::preflight::test_files::{journal_bytes, reader};

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
}
