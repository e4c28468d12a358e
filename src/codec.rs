//! The record envelope and the payload codec. bincode is used only here, so it can be
//! swapped without touching the rest (it is unmaintained upstream; 2.0.1 is pinned).
//!
//! Every stored value is framed (all integers little-endian):
//!
//! ```text
//! offset  size  field
//! 0       2     magic  "OJ" (0x4f 0x4a)
//! 2       1     format version (1 to 3: the format that wrote it)
//! 3       1     record kind (see RecordKind)
//! 4       4     payload length, u32
//! 8       4     CRC-32 (IEEE, crc32fast) over bytes 0..8 followed by the payload
//! 12      len   payload: bincode 2, fixed-width little-endian integers
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The two magic bytes that start every stored value.
pub const MAGIC: [u8; 2] = *b"OJ";
/// The record (and file) format version this build reads and writes.
pub const FORMAT_VERSION: u8 = 3;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 12;
/// The largest payload bincode may decode (or allocate for) in one record, except result
/// payload bytes, which are not decoded by bincode.
pub const DECODE_LIMIT: usize = 1 << 20;

/// What a framed value holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// A `meta` table entry.
    Meta = 1,
    /// An event of the journal.
    Event = 2,
    /// A receipt row.
    Receipt = 3,
    /// A scope row.
    Scope = 4,
    /// A result payload.
    Result = 5,
    /// A record `repair` moved aside.
    Quarantine = 6,
}

impl RecordKind {
    /// The kind for a byte, if any.
    pub fn from_byte(b: u8) -> Option<RecordKind> {
        Some(match b {
            1 => RecordKind::Meta,
            2 => RecordKind::Event,
            3 => RecordKind::Receipt,
            4 => RecordKind::Scope,
            5 => RecordKind::Result,
            6 => RecordKind::Quarantine,
            _ => return None,
        })
    }
}

/// Why a stored value was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than a header.
    Short(usize),
    /// The magic is not `OJ`.
    BadMagic([u8; 2]),
    /// A format version newer than this build's.
    NewerVersion(u8),
    /// A different record kind than the table holds.
    WrongKind {
        /// The kind byte stored.
        found: u8,
        /// The kind the table holds.
        expected: RecordKind,
    },
    /// The length field disagrees with the stored size.
    BadLength {
        /// The length field.
        declared: u32,
        /// The payload bytes present.
        actual: usize,
    },
    /// The CRC does not match.
    BadCrc {
        /// The CRC field.
        stored: u32,
        /// The CRC of the bytes present.
        computed: u32,
    },
    /// The payload does not decode.
    Decode(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Short(n) => write!(
                f,
                "value of {n} bytes is shorter than the {HEADER_LEN}-byte header"
            ),
            FrameError::BadMagic(m) => {
                write!(f, "bad magic {:02x}{:02x} (expected 4f4a)", m[0], m[1])
            }
            FrameError::NewerVersion(v) => write!(
                f,
                "record format version {v} is newer than {FORMAT_VERSION}"
            ),
            FrameError::WrongKind { found, expected } => {
                write!(
                    f,
                    "record kind {found} where kind {} ({expected:?}) belongs",
                    *expected as u8
                )
            }
            FrameError::BadLength { declared, actual } => {
                write!(
                    f,
                    "declared payload length {declared} but {actual} bytes are stored"
                )
            }
            FrameError::BadCrc { stored, computed } => {
                write!(
                    f,
                    "CRC mismatch (stored {stored:08x}, computed {computed:08x})"
                )
            }
            FrameError::Decode(e) => write!(f, "payload does not decode: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Format 1's payload encoding: fixed-width integers (a length is 8 bytes).
fn config_v1() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<DECODE_LIMIT>()
}

/// This format's payload encoding: variable-width integers (a value below 251 is one
/// byte), which makes records about a third smaller than format 1's.
fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<DECODE_LIMIT>()
}

fn crc_of(header8: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header8);
    h.update(payload);
    h.finalize()
}

/// Frames `payload` as a record of `kind`.
pub fn frame(kind: RecordKind, payload: &[u8]) -> Vec<u8> {
    let mut out = header(kind, payload.len());
    out.extend_from_slice(payload);
    seal(out)
}

/// A record of `kind` with room for a payload of `capacity` bytes: its header, with the
/// length and CRC left for [`seal`] once the payload follows it.
fn header(kind: RecordKind, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + capacity);
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT_VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&[0; 8]);
    out
}

/// Writes the length and CRC of the payload after the header into the header.
fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let payload_len = out.len().saturating_sub(HEADER_LEN);
    // Payloads are bounded far below 4 GiB by the result limit (64 MiB ceiling).
    let len = u32::try_from(payload_len).unwrap_or(u32::MAX);
    out[4..8].copy_from_slice(&len.to_le_bytes());
    let crc = crc_of(&out[0..8], &out[HEADER_LEN..]);
    out[8..12].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Checks the envelope of `bytes` and returns its kind byte and payload. The kind is not
/// checked here (see [`unframe`]).
///
/// # Errors
///
/// A [`FrameError`] naming what is wrong: too short, bad magic, length mismatch, CRC
/// mismatch, or a newer version.
pub fn unframe_any(bytes: &[u8]) -> Result<(u8, &[u8]), FrameError> {
    if bytes.len() < HEADER_LEN {
        return Err(FrameError::Short(bytes.len()));
    }
    let magic = [bytes[0], bytes[1]];
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    let declared = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let payload = &bytes[HEADER_LEN..];
    if declared as usize != payload.len() {
        return Err(FrameError::BadLength {
            declared,
            actual: payload.len(),
        });
    }
    let stored = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let computed = crc_of(&bytes[0..8], payload);
    if stored != computed {
        return Err(FrameError::BadCrc { stored, computed });
    }
    // The version is checked after the CRC, so a flipped version byte reads as corruption.
    if bytes[2] > FORMAT_VERSION {
        return Err(FrameError::NewerVersion(bytes[2]));
    }
    Ok((bytes[3], payload))
}

/// Checks the envelope of `bytes`, that it holds a record of `kind`, and returns the format
/// version it was written with and the payload.
///
/// # Errors
///
/// As [`unframe`].
pub fn unframe_versioned(kind: RecordKind, bytes: &[u8]) -> Result<(u8, &[u8]), FrameError> {
    let payload = unframe(kind, bytes)?;
    Ok((bytes[2], payload))
}

/// Checks the envelope of `bytes`, that it holds a record of `kind`, and returns the payload.
///
/// # Errors
///
/// As [`unframe_any`], and [`FrameError::WrongKind`] for another record kind.
pub fn unframe(kind: RecordKind, bytes: &[u8]) -> Result<&[u8], FrameError> {
    let (found, payload) = unframe_any(bytes)?;
    if found != kind as u8 {
        return Err(FrameError::WrongKind {
            found,
            expected: kind,
        });
    }
    Ok(payload)
}

/// Encodes `value` as a framed record of `kind`.
pub fn encode<T: Serialize>(kind: RecordKind, value: &T) -> Vec<u8> {
    encode_with_tail(kind, value, &[], 0)
}

/// Encodes `value` followed by the bytes `tail` as the payload of one framed record of
/// `kind`, in a vector with room for `spare` more bytes. The payload is encoded in place
/// after the header, into a vector sized once: growing it as bincode writes, then copying
/// it into a frame, was about a tenth of a lifecycle's instructions in allocations.
pub fn encode_with_tail<T: Serialize>(
    kind: RecordKind,
    value: &T,
    tail: &[u8],
    spare: usize,
) -> Vec<u8> {
    let mut out = header(kind, payload_size(value) + tail.len() + spare);
    append_payload(value, &mut out);
    out.extend_from_slice(tail);
    seal(out)
}

/// Encodes `value` with bincode, without a frame.
pub fn encode_payload<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload_size(value));
    append_payload(value, &mut out);
    out
}

/// Appends `value`'s bincode encoding to `out`.
fn append_payload<T: Serialize>(value: &T, out: &mut Vec<u8>) {
    if let Err(e) = bincode::serde::encode_into_writer(value, Append(out), config()) {
        // Our record types contain only strings, integers, vectors and enums, which
        // always encode; the limit only applies to decoding.
        debug_assert!(false, "bincode encode failed: {e}");
    }
}

/// The length of `value`'s bincode encoding (0 if it does not encode; see
/// [`append_payload`]).
fn payload_size<T: Serialize>(value: &T) -> usize {
    let mut size = bincode::enc::write::SizeWriter::default();
    match bincode::serde::encode_into_writer(value, &mut size, config()) {
        Ok(()) => size.bytes_written,
        Err(_) => 0,
    }
}

/// A bincode writer appending to a vector.
struct Append<'a>(&'a mut Vec<u8>);

impl bincode::enc::write::Writer for Append<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// Decodes a bincode payload written with format `version`'s encoding, which must be
/// consumed entirely.
///
/// # Errors
///
/// [`FrameError::Decode`] when the payload does not decode, exceeds the decode limit, or
/// has trailing bytes.
pub fn decode_payload<T: DeserializeOwned>(version: u8, payload: &[u8]) -> Result<T, FrameError> {
    let (value, used) = decode_prefix(version, payload)?;
    if used != payload.len() {
        return Err(FrameError::Decode(format!(
            "{} trailing bytes after the record",
            payload.len() - used
        )));
    }
    Ok(value)
}

/// Decodes a bincode value (format `version`'s encoding) at the start of `payload`,
/// returning it and the bytes used.
///
/// # Errors
///
/// [`FrameError::Decode`] when the value does not decode or exceeds the decode limit.
pub fn decode_prefix<T: DeserializeOwned>(
    version: u8,
    payload: &[u8],
) -> Result<(T, usize), FrameError> {
    let decoded = if version == 1 {
        bincode::serde::decode_from_slice(payload, config_v1())
    } else {
        bincode::serde::decode_from_slice(payload, config())
    };
    decoded.map_err(|e| FrameError::Decode(e.to_string()))
}

/// Decodes a framed record of `kind`.
///
/// # Errors
///
/// Any [`FrameError`] of [`unframe`] or [`decode_payload`].
pub fn decode<T: DeserializeOwned>(kind: RecordKind, bytes: &[u8]) -> Result<T, FrameError> {
    let (version, payload) = unframe_versioned(kind, bytes)?;
    decode_payload(version, payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_encoded_in_place_has_the_bytes_of_its_payload_framed() {
        // The reference: bincode's own encoding of the payload, framed by `frame`.
        let value = ("op-1".to_string(), 300u64, vec![7u32, 70_000], Some(-1i64));
        let Ok(payload) = bincode::serde::encode_to_vec(&value, config()) else {
            panic!("the value encodes");
        };
        assert_eq!(encode_payload(&value), payload);
        assert_eq!(
            encode(RecordKind::Receipt, &value),
            frame(RecordKind::Receipt, &payload)
        );
        let tail = [9u8; 1500];
        let with_tail = [payload.as_slice(), &tail].concat();
        let framed = encode_with_tail(RecordKind::Result, &value, &tail, 100);
        assert_eq!(framed, frame(RecordKind::Result, &with_tail));
        assert!(
            framed.capacity() >= framed.len() + 100,
            "room for the spare bytes"
        );
        assert_eq!(
            unframe(RecordKind::Result, &framed),
            Ok(with_tail.as_slice())
        );
    }
}
