//! Pre-flight: the checks of a redb file before redb reads it.
//!
//! redb trusts its file: it reads page numbers, lengths and its own allocator state without
//! checking them against the file, allocates a page's whole size before reading it, and
//! panics (or aborts, inside a destructor) on pages that do not parse. A journal file is
//! input, so before any open this layer recognizes the file ([`file`], [`reading`]),
//! checks the header, the layout and every page number the trees reach
//! ([`system_tree`]), and runs every call into redb on such a file under the panic
//! guard ([`guard`]), which answers `Corrupt` instead of unwinding into the caller.
//!
//! It knows redb's file format (file format 3, redb 3 and 4), not the journal's tables:
//! the index (`crate::index`) is what reads those, after pre-flight passed.

pub(crate) mod file;
pub(crate) mod guard;
pub(crate) mod reading;
pub(crate) mod system_tree;

pub(crate) use guard::{close_unwritten, guarded};
