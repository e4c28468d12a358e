//! The log: the journal's commit point, a file of CRC-framed batches beside the redb file.
//!
//! A group commit appends one record and syncs once; checkpoints apply the logged batches
//! to redb (the index) in large transactions and then start the log over. The file is
//! preallocated and overwritten in place, so a sync writes data pages only and never
//! updates the file's size, as SQLite's WAL does when it is reused.
//!
//! # Layout (all integers little-endian; docs/format.md has the byte-by-byte tables)
//!
//! ```text
//! 0     64     header: magic "opj-log\x1a", format version u32, reserved u32,
//!                      journal id u64, CRC-32 of bytes 0..24
//! 64    4032   zero
//! 4096  ...    records, back to back, then whatever an earlier cycle left
//! ```
//!
//! A record:
//!
//! ```text
//! 0   2   magic "OL"
//! 2   1   format version
//! 3   1   kind (1: a batch of index changes)
//! 4   4   payload length
//! 8   8   generation: which checkpoint cycle wrote it
//! 16  8   lsn: the record's number, one more than the record before it
//! 24  4   CRC-32 over bytes 0..24 and the payload, chained: the CRC computation starts
//!         from the CRC of the record before (the first record of a generation starts
//!         from a seed made of the journal id and the generation)
//! 28  len payload
//! +0  4   trailer "LOG\x1a" (outside the CRC: there only if the write reached the end)
//! ```
//!
//! The file's length is a power of two of at least 1 MiB, and past the current cycle's
//! records it is zero on disk before a record is written there (see [`Writer`]): that is
//! how `verify` tells a torn record from a damaged one (see [`dropped`]).
//!
//! # Recovery
//!
//! The redb file names the generation its last checkpoint started and the lsn that
//! comes next. Reading the log keeps records from the first one on as long as each has
//! the right magic, version, generation and lsn and its chained CRC holds; the first
//! record that does not ends the log. That is how a torn or unsynced tail is cut, and how
//! records of an earlier cycle (a stale generation, or the same bytes in another order)
//! are never taken for new ones: the CRC chain of a record written now cannot continue
//! into bytes left from before. Starting a new cycle needs no write at all: the next
//! record simply carries the next generation.
//!
//! # What the log assumes of the storage
//!
//! A completed `sync_data` makes every earlier write durable. A write that a power cut
//! interrupts may leave any mix of old and new sectors (the CRC finds it), but writing a
//! sector never changes a *different* sector's bytes ("power-safe overwrite", as SQLite
//! assumes by default): records share sectors with the record before them. Telling damage
//! from a torn write (`verify`, `repair`) also assumes that a 512-byte sector lands whole
//! or not at all; a device that tears inside a sector can make `verify` call a torn last
//! record damaged (never the reverse), which recovery is not affected by.

mod damage;
mod file;
mod format;
mod reader;
mod storage;
mod writer;

pub(crate) use damage::dropped;
pub use file::FileLog;
pub(crate) use format::*;
pub(crate) use reader::{Cycle, own_cursor, scan_cycles, scan_storage};
pub use storage::{LogStorage, MemoryLog};
pub(crate) use writer::{Spare, Writer};

#[cfg(test)]
mod tests;
