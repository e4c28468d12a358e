//! Intent hashes: [`HashScheme`], how a hash is computed (documented there, with test
//! vectors), and [`IntentHash`], a digest with its scheme and its text form.
//!
//! A leaf: it depends on no other module of the crate, so the error type can hold an
//! `IntentHash` (`ErrorKind::IntentMismatch`) while the code that builds intents builds
//! errors too. What needs the crate's `Error` or `Intent` lives in `intent.rs`: parsing
//! the text form (`FromStr`, `Deserialize`) and [`IntentHash::matches`].

use std::fmt;

use serde::{Serialize, Serializer};
use sha2::{Digest, Sha256};

const DOMAIN_V1: &[u8] = b"opjournal.intent.v1\0";
const DOMAIN_V2: &[u8] = b"opjournal.intent.v2\0";

/// How an intent hash was computed. Hashes of different schemes never match.
///
/// # The construction
///
/// An intent hash is SHA-256 over a domain tag, the length-prefixed intent name and the
/// canonical argument bytes:
///
/// ```text
/// sha256( domain || u64_le(len(name)) || name || args )
/// ```
///
/// `name` is the intent name's UTF-8 bytes and `u64_le(len(name))` its length in bytes as
/// 8 little-endian bytes. `domain` is an ASCII tag followed by one zero byte:
///
/// | scheme | `domain` | `args` for JSON arguments | shown as |
/// |---|---|---|---|
/// | [`JcsV2`](HashScheme::JcsV2) (current) | `opjournal.intent.v2\0` | RFC 8785 (JCS) canonical JSON | `jcs-sha256:<hex>` |
/// | [`LegacyV1`](HashScheme::LegacyV1) | `opjournal.intent.v1\0` | keys sorted by UTF-8 bytes, numbers as `serde_json` prints them | `sha256:<hex>` |
///
/// For arguments given as bytes ([`Intent::from_bytes`](crate::Intent::from_bytes)) `args`
/// is those bytes under
/// either scheme.
///
/// JCS makes the hash computable by any language with a JCS library (`canonicalize` for
/// JavaScript, `rfc8785` for Python): object keys sorted by their UTF-16 code units, no
/// whitespace, strings escaped minimally (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other
/// control characters as `\u00xx`, everything else as UTF-8), numbers as ECMAScript's
/// `Number.prototype.toString` prints the IEEE-754 double (`1.0` is `1`, `1e21` is
/// `1e+21`, `-0` is `0`).
///
/// # Test vectors
///
/// Under [`JcsV2`](HashScheme::JcsV2) (computed independently with Node.js's
/// `JSON.stringify` over key-sorted objects and its `crypto` module):
///
/// | name | arguments | canonical JSON | hash |
/// |---|---|---|---|
/// | `scene.add_light` | `{"near": "door", "kind": "spot"}` | `{"kind":"spot","near":"door"}` | `jcs-sha256:23010e7617bf777752858d55203ced7aa49146945a3f975f686c6f18e37e84fa` |
/// | `doc.set` | `{"b": [1.0, 1e21, 0.000001], "a": "é\n"}` | `{"a":"é\n","b":[1,1e+21,0.000001]}` | `jcs-sha256:ba5c31b6d28146ea481cf0328b8c6fa9fc6f26e952ba34ffcce2ea52a082e4cc` |
/// | `x` | `null` | `null` | `jcs-sha256:4f6d6b198cb31ac5d0a042c8e9b0e5456ea70e8bd9a62e71cf31e094e9b6212d` |
///
/// In JavaScript:
///
/// ```text
/// const canonical = Buffer.from(canonicalize(args), "utf8");       // RFC 8785
/// const name = Buffer.from("scene.add_light", "utf8");
/// const len = Buffer.alloc(8); len.writeBigUInt64LE(BigInt(name.length));
/// const hash = createHash("sha256")
///   .update(Buffer.from("opjournal.intent.v2\0", "latin1"))
///   .update(len).update(name).update(canonical)
///   .digest("hex");                                                // "jcs-sha256:" + hash
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum HashScheme {
    /// The first scheme: domain `opjournal.intent.v1`, JSON arguments with keys sorted by
    /// their UTF-8 bytes and numbers as `serde_json` prints them. Shown as `sha256:<hex>`.
    /// Journal files of format 1 record this scheme.
    LegacyV1,
    /// The current scheme: domain `opjournal.intent.v2` and RFC 8785 (JCS) canonical
    /// JSON, so clients in other languages compute the same hash. Shown as
    /// `jcs-sha256:<hex>`.
    JcsV2,
}

impl HashScheme {
    /// The prefix of the scheme's text form (`sha256` or `jcs-sha256`).
    pub fn prefix(self) -> &'static str {
        match self {
            HashScheme::LegacyV1 => "sha256",
            HashScheme::JcsV2 => "jcs-sha256",
        }
    }

    fn domain(self) -> &'static [u8] {
        match self {
            HashScheme::LegacyV1 => DOMAIN_V1,
            HashScheme::JcsV2 => DOMAIN_V2,
        }
    }
}

/// A SHA-256 intent hash and the scheme it was computed under.
///
/// Shown (and parsed) as `sha256:<64 hex digits>` for [`HashScheme::LegacyV1`] and
/// `jcs-sha256:<64 hex digits>` for [`HashScheme::JcsV2`]; serialized as that string.
/// Compare a recorded hash with a submitted intent through [`IntentHash::matches`], which
/// hashes the intent under the recorded hash's scheme.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IntentHash {
    scheme: HashScheme,
    digest: [u8; 32],
}

impl IntentHash {
    /// A hash of `scheme` with the given digest bytes.
    pub const fn new(scheme: HashScheme, digest: [u8; 32]) -> IntentHash {
        IntentHash { scheme, digest }
    }

    /// The scheme it was computed under.
    pub fn scheme(&self) -> HashScheme {
        self.scheme
    }

    /// The 32 digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.digest
    }

    /// Reads the text form: `jcs-sha256:<64 hex digits>` or `sha256:<64 hex digits>`; 64 hex
    /// digits without a prefix are a [`HashScheme::LegacyV1`] hash, as that scheme was shown
    /// before schemes existed. `None` for anything else (`FromStr` names the problem).
    pub(crate) fn from_text(s: &str) -> Option<IntentHash> {
        let (scheme, hex) = if let Some(rest) = s.strip_prefix("jcs-sha256:") {
            (HashScheme::JcsV2, rest)
        } else if let Some(rest) = s.strip_prefix("sha256:") {
            (HashScheme::LegacyV1, rest)
        } else {
            (HashScheme::LegacyV1, s)
        };
        Some(IntentHash::new(scheme, decode_hex(hex)?))
    }
}

impl fmt::Display for IntentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scheme.prefix())?;
        f.write_str(":")?;
        for b in self.digest {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for IntentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for IntentHash {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

fn decode_hex(s: &str) -> Option<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// The construction [`HashScheme`] documents: SHA-256 over the scheme's domain tag, the
/// length-prefixed intent name and the canonical argument bytes.
pub(crate) fn digest(scheme: HashScheme, name: &str, args: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(scheme.domain());
    h.update((name.len() as u64).to_le_bytes());
    h.update(name.as_bytes());
    h.update(args);
    h.finalize().into()
}
