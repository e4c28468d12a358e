//! `decode_record`: arbitrary bytes into every record decoder.
//!
//! Claims: no decoder panics; whatever decodes re-encodes and decodes to the same value
//! (checked by [`opjournal::fuzzing::decode_every_record`], which also runs the raw frame
//! scanner that `repair` uses); and no input makes the decoders allocate beyond the
//! configured decode limit (measured by [`crate::alloc_meter`] when it is installed).

use opjournal::codec::DECODE_LIMIT;

use crate::alloc_meter;

/// The most one call may allocate at once for an input of `len` bytes: the decode limit,
/// plus copies of the input (result payloads are copied and re-framed, not decoded).
pub fn allocation_bound(len: usize) -> usize {
    DECODE_LIMIT + 4 * len + 4096
}

/// The most bytes one call may hold live at its peak for an input of `len` bytes: each of
/// the six decoders may claim up to the limit, and its re-encoding as much again.
pub fn live_bound(len: usize) -> usize {
    12 * DECODE_LIMIT + 16 * len + 65536
}

/// Checks the claims of this module on `bytes`.
///
/// # Panics
///
/// When a claim does not hold (that is the finding).
pub fn check(bytes: &[u8]) {
    let (result, usage) = alloc_meter::measure(|| opjournal::fuzzing::decode_every_record(bytes));
    if let Err(e) = result {
        panic!("decode round trip broken: {e}");
    }
    assert!(
        usage.largest <= allocation_bound(bytes.len()),
        "one allocation of {} bytes for a {}-byte input (limit {})",
        usage.largest,
        bytes.len(),
        allocation_bound(bytes.len())
    );
    assert!(
        usage.peak_live <= live_bound(bytes.len()),
        "{} live bytes at the peak for a {}-byte input (limit {})",
        usage.peak_live,
        bytes.len(),
        live_bound(bytes.len())
    );
}
