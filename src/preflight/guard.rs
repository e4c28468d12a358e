//! The panic guard: redb trusts its pages and may panic on a damaged file; every call
//! into it on a file that is input runs under [`guarded`], which answers `Corrupt`.

use std::panic::AssertUnwindSafe;

use crate::error::{Error, Result};

/// A panic of redb, as the cause of a `Corrupt` error: its text is the
/// engine's own (`entered unreachable code`, a `Utf8Error`), which says nothing to a user,
/// so it stays in the cause chain and the message says what it means.
#[derive(Debug)]
pub(crate) struct EnginePanic(pub(crate) String);

impl std::fmt::Display for EnginePanic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the storage engine stopped on damaged data: {}", self.0)
    }
}

impl std::error::Error for EnginePanic {}

/// Runs `f`, turning a panic inside redb (which may trust a damaged file)
/// into a `Corrupt` error whose cause is the panic.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(engine_panic(
            what,
            crate::panics::message(p.as_ref())
                .unwrap_or("unknown panic")
                .to_string(),
        )),
    }
}

/// The `Corrupt` error for a redb panic with message `message` during `what`.
fn engine_panic(what: &str, message: String) -> Error {
    Error::with_source(
        crate::error::ErrorKind::Corrupt {
            table: "(redb)".into(),
            key: crate::error::shorten(what, 120),
            detail: "the storage engine failed on damaged data".into(),
        },
        EnginePanic(message),
    )
}

/// Closes a database that only served reads of an input file (one opened on a scratch
/// backend, so redb could recover the file in memory) without the commit
/// the engine makes when it closes. That commit records its allocator state after freeing
/// the pages its lists name; on a damaged file a bad list makes it panic while a
/// destructor of the engine is live, which panics again and aborts the process (fuzzing
/// found such files). Nothing of a scratch is ever kept, so the commit is useless anyway.
///
/// redb treats a close during a panic as a crash (no closing commit; the next open would
/// recover), so the database is dropped inside an unwind started by `resume_unwind` (which
/// runs no panic hook) and caught at once. A build with `panic = "abort"` cannot unwind:
/// there the database is dropped as usual (and redb's panics on damaged
/// files abort anyway: no guard catches them).
pub(crate) fn close_unwritten(db: redb::Database) {
    #[cfg(panic = "unwind")]
    {
        struct DropWhileUnwinding(Option<redb::Database>);
        impl Drop for DropWhileUnwinding {
            fn drop(&mut self) {
                drop(self.0.take());
            }
        }
        let _ = std::panic::catch_unwind(AssertUnwindSafe(move || {
            let _closing = DropWhileUnwinding(Some(db));
            std::panic::resume_unwind(Box::new(CloseUnwritten));
        }));
    }
    #[cfg(not(panic = "unwind"))]
    drop(db);
}

/// The payload of the unwind [`close_unwritten`] starts (never seen outside it).
#[cfg(panic = "unwind")]
struct CloseUnwritten;
