//! Where redb's pages are: the file's regions as redb computes them from the file's length
//! and the header's counts ([`Layout`]), and page numbers as redb encodes them
//! ([`PageNumber`]).
//!
//! [`Layout::range`] is the one place a page number read from the file becomes a byte
//! range, and it refuses any page that does not lie inside its region. Every count here
//! comes from the file, so the arithmetic is checked: a layout that overflows is `None`,
//! and the checks leave such a file to redb (which refuses it itself). This follows
//! redb's `page_store/layout.rs` and `page_store/base.rs`, where its `PageNumber` is
//! (file format 3, redb 3 and 4).

/// The page size this build of the journal creates and redb 4 requires.
pub(super) const PAGE_SIZE: u64 = 4096;
pub(super) const MAX_PAGE_INDEX: u64 = 0x000F_FFFF;
pub(super) const MAX_REGIONS: u64 = 0x0010_0000;
pub(super) const MAX_ORDER: u8 = 20;

/// Where the regions of a redb file are (as redb computes it from the file's length).
#[derive(Clone, Copy)]
pub(super) struct Layout {
    header_pages: u64,
    full_regions: u64,
    full_region_pages: u64,
    trailing_pages: u64,
}

impl Layout {
    pub(super) fn from_file_len(
        file_len: u64,
        header_pages: u64,
        max_pages: u64,
    ) -> Option<Layout> {
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
    pub(super) fn range(&self, page: PageNumber) -> Option<(u64, u64)> {
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
pub(super) struct PageNumber {
    pub(super) region: u64,
    pub(super) index: u64,
    pub(super) order: u8,
}

impl PageNumber {
    pub(super) fn from_le(bytes: [u8; 8]) -> PageNumber {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
