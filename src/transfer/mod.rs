//! Copies of a journal into a new file: `backup` (every table, from one snapshot), the
//! dump (`export --dump`, JSON Lines of the events and results) and `import_dump` (a new
//! journal rebuilt from a dump by replaying its events). Each builds its file under a
//! temporary name beside the destination and links it into place only when it is
//! complete and synced, through the batched writer that `repair` also writes with.
//!
//! Below the handle: `Journal::backup` calls [`backup_snapshot`] on its own snapshot, and
//! nothing here imports `journal` or `check`.

mod backup;
mod dump;
pub(crate) mod writer;

pub(crate) use backup::backup_snapshot;
pub use backup::{BackupReport, backup};
pub use dump::{DUMP_VERSION, DumpReport, ImportReport, import_dump};
