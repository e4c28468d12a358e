//! Arbitrary bytes into every record decoder: as they are, and framed with a valid header
//! and CRC so the payload decoders see them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opjournal::codec::{self, RecordKind};
use opjournal_fuzz::alloc_meter::Meter;
use opjournal_fuzz::decode_record::check;

#[global_allocator]
static ALLOC: Meter = Meter;

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some((&kind, payload)) = data.split_first()
        && let Some(kind) = RecordKind::from_byte(kind % 6 + 1)
    {
        check(&codec::frame(kind, payload));
    }
});
