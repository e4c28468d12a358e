//! The panic guard: redb trusts its pages and may panic on a damaged file; every call
//! into it on a file that is input runs under [`guarded`], which answers `Corrupt`.

use std::panic::AssertUnwindSafe;

use crate::error::{Error, Result};

pub(crate) fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs `f`, turning a panic inside the storage engine (which may trust a damaged file)
/// into a `Corrupt` error.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(Error::corrupt(
            "(redb)",
            what,
            format!(
                "the storage engine failed on damaged data: {}",
                panic_message(p)
            ),
        )),
    }
}
