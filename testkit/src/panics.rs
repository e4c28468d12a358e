//! Telling the storage engine's panics from ours.
//!
//! redb trusts its pages and may panic on a damaged file (an `unreachable!`, a slice out
//! of range); the library catches those around its storage calls and answers
//! `ErrorKind::Corrupt`. libFuzzer, though, aborts on any panic, caught or not. This hook
//! lets the engine's panics through quietly (remembering the last one, and with
//! `OPJ_FUZZ_BACKTRACE=1` its backtrace) and treats every other panic as a finding:
//! printed, counted per thread, and, under the fuzzer, fatal. [`escaped`] runs a closure and turns a storage-engine panic that the
//! library did not catch into a finding that names it.

use std::cell::{Cell, RefCell};
use std::sync::Once;

thread_local! {
    static OURS: Cell<usize> = const { Cell::new(0) };
    static LAST_ENGINE_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Whether a panic raised at `file` comes from the storage engine's source.
pub fn in_storage_engine(file: &str) -> bool {
    file.contains("/redb-") || file.contains("\\redb-")
}

/// Installs the hook (once per process). With `abort`, a panic outside the storage engine
/// aborts the process, so the fuzzer records it even if something catches it.
pub fn install(abort: bool) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.location().is_some_and(|l| in_storage_engine(l.file())) {
                // A backtrace costs milliseconds, and damaged files make the engine panic
                // often (caught): taken only when asked for, to look into a finding.
                let trace = if std::env::var_os("OPJ_FUZZ_BACKTRACE").is_some() {
                    std::backtrace::Backtrace::force_capture().to_string()
                } else {
                    "(set OPJ_FUZZ_BACKTRACE=1 for the backtrace)".to_string()
                };
                let what = format!("{info}\n{trace}");
                LAST_ENGINE_PANIC.with(|p| *p.borrow_mut() = Some(what));
                return;
            }
            OURS.with(|n| n.set(n.get() + 1));
            default_hook(info);
            if abort {
                std::process::abort();
            }
        }));
    });
}

/// Panics outside the storage engine seen on this thread so far (with the hook installed).
pub fn ours() -> usize {
    OURS.with(Cell::get)
}

/// Runs `f`. A panic that escapes it is a finding; if it came from the storage engine
/// (which the library should have caught), the finding carries the engine's message and
/// backtrace (with `OPJ_FUZZ_BACKTRACE=1`), which the quiet hook did not print.
///
/// # Panics
///
/// When `f` panics, or when `f` caught a panic of ours (see [`ours`]).
pub fn escaped<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let before = ours();
    LAST_ENGINE_PANIC.with(|p| *p.borrow_mut() = None);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => {
            assert!(
                ours() == before,
                "{what}: a panic outside the storage engine was caught and hidden (see above)"
            );
            v
        }
        Err(payload) => {
            let engine = LAST_ENGINE_PANIC.with(|p| p.borrow_mut().take());
            match engine {
                Some(e) if ours() == before => {
                    panic!("{what}: a storage-engine panic escaped the library: {e}")
                }
                _ => std::panic::resume_unwind(payload),
            }
        }
    }
}

/// Runs `f`; if it panics and `OPJOURNAL_FUZZ_DUMP` names a directory, writes `input`
/// there first (as `<target>-<length>-<hash>`), so a failure found by the stable property
/// tests can be checked in under `fuzz/regressions/<target>/` and replayed by the fuzzer.
pub fn dump_on_panic<T>(target: &str, input: &[u8], f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            if let Some(dir) = std::env::var_os("OPJOURNAL_FUZZ_DUMP") {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                input.hash(&mut h);
                let name = format!("{target}-{}-{:016x}", input.len(), h.finish());
                let path = std::path::Path::new(&dir).join(name);
                if std::fs::write(&path, input).is_ok() {
                    eprintln!("failing input written to {}", path.display());
                }
            }
            std::panic::resume_unwind(payload)
        }
    }
}
