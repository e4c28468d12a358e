//! Intents and their hashes. The hash construction is documented on [`HashScheme`], where
//! rustdoc shows it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::validate;

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
/// For arguments given as bytes ([`Intent::from_bytes`]) `args` is those bytes under
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

    /// Whether `intent` hashes to this hash under this hash's scheme: how a recorded hash is
    /// compared with a resubmitted intent, so an operation recorded under an older scheme
    /// still matches its retry.
    ///
    /// An intent built from a digest ([`Intent::from_digest`]) knows only that digest's
    /// scheme, and matches only hashes of that scheme.
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::{HashScheme, Intent};
    /// use serde_json::json;
    ///
    /// let intent = Intent::from_json("scene.add_light", &json!({"near": "door"}))?;
    /// let recorded = intent.hash_as(HashScheme::LegacyV1).expect("built from JSON");
    /// assert_ne!(recorded, intent.hash()); // another scheme, another digest
    /// assert!(recorded.matches(&intent));
    /// # Ok::<(), opjournal::Error>(())
    /// ```
    pub fn matches(&self, intent: &Intent) -> bool {
        intent.hash_as(self.scheme) == Some(*self)
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

impl FromStr for IntentHash {
    type Err = Error;

    /// Parses `jcs-sha256:<64 hex digits>` or `sha256:<64 hex digits>`; 64 hex digits
    /// without a prefix are a [`HashScheme::LegacyV1`] hash, as that scheme was shown before
    /// schemes existed.
    fn from_str(s: &str) -> Result<Self> {
        let (scheme, hex) = if let Some(rest) = s.strip_prefix("jcs-sha256:") {
            (HashScheme::JcsV2, rest)
        } else if let Some(rest) = s.strip_prefix("sha256:") {
            (HashScheme::LegacyV1, rest)
        } else {
            (HashScheme::LegacyV1, s)
        };
        let digest = decode_hex(hex).ok_or_else(|| {
            Error::invalid(
                "intent hash",
                s,
                "expected `jcs-sha256:` or `sha256:` and 64 hex digits",
            )
        })?;
        Ok(IntentHash::new(scheme, digest))
    }
}

impl Serialize for IntentHash {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IntentHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
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

/// What an operation asks for: a name (such as `scene.add_light`) and the hash of its
/// arguments.
///
/// An intent built from its arguments knows its hash under every [`HashScheme`]
/// ([`Intent::hash_as`]); [`Intent::hash`] is the current scheme's. [`HashScheme`]
/// documents the construction, with test vectors.
///
/// # Example
///
/// ```
/// use opjournal::Intent;
/// use serde_json::json;
///
/// let a = Intent::from_json("scene.add_light", &json!({"near": "door", "kind": "spot"}))?;
/// let b = Intent::from_json("scene.add_light", &json!({"kind": "spot", "near": "door"}))?;
/// assert_eq!(a.hash(), b.hash()); // key order does not matter
/// assert!(a.hash().to_string().starts_with("jcs-sha256:"));
/// # Ok::<(), opjournal::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    name: String,
    /// Under [`HashScheme::JcsV2`], if known.
    jcs: Option<[u8; 32]>,
    /// Under [`HashScheme::LegacyV1`], if known.
    legacy: Option<[u8; 32]>,
}

fn digest(scheme: HashScheme, name: &str, args: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(scheme.domain());
    h.update((name.len() as u64).to_le_bytes());
    h.update(name.as_bytes());
    h.update(args);
    h.finalize().into()
}

impl Intent {
    /// An intent whose arguments are a JSON value, hashed in canonical form (RFC 8785 for
    /// the current scheme).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) if the name is empty,
    /// longer than 256 bytes or contains control characters.
    pub fn from_json(name: &str, args: &serde_json::Value) -> Result<Intent> {
        validate::name("intent name", name)?;
        let jcs = canonical_json(args);
        let legacy = legacy_canonical_json(args);
        Ok(Intent {
            name: name.to_string(),
            jcs: Some(digest(HashScheme::JcsV2, name, &jcs)),
            legacy: Some(digest(HashScheme::LegacyV1, name, &legacy)),
        })
    }

    /// An intent whose arguments are any serializable value, hashed as the JSON value
    /// `serde_json` makes of it (see [`Intent::from_json`]).
    ///
    /// # Errors
    ///
    /// As [`Intent::from_json`], and
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) if the value does not
    /// serialize to JSON (a map with non-string keys, a failing `Serialize` impl).
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::Intent;
    /// use serde::Serialize;
    /// use serde_json::json;
    ///
    /// #[derive(Serialize)]
    /// struct AddLight { near: String, kind: String }
    ///
    /// let typed = Intent::from_serialize(
    ///     "scene.add_light",
    ///     &AddLight { near: "door".into(), kind: "spot".into() },
    /// )?;
    /// let json = Intent::from_json("scene.add_light", &json!({"kind": "spot", "near": "door"}))?;
    /// assert_eq!(typed.hash(), json.hash());
    /// # Ok::<(), opjournal::Error>(())
    /// ```
    pub fn from_serialize<T: Serialize + ?Sized>(name: &str, args: &T) -> Result<Intent> {
        let value = serde_json::to_value(args).map_err(|e| {
            Error::invalid(
                "intent arguments",
                name,
                format!("they do not serialize to JSON: {e}"),
            )
        })?;
        Intent::from_json(name, &value)
    }

    /// An intent whose arguments are already bytes, hashed as given under every scheme.
    ///
    /// `Intent::from_bytes(name, &canonical_json(v)).hash()` equals
    /// `Intent::from_json(name, v)?.hash()`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name, as in
    /// [`Intent::from_json`].
    pub fn from_bytes(name: &str, args: &[u8]) -> Result<Intent> {
        validate::name("intent name", name)?;
        Ok(Intent {
            name: name.to_string(),
            jcs: Some(digest(HashScheme::JcsV2, name, args)),
            legacy: Some(digest(HashScheme::LegacyV1, name, args)),
        })
    }

    /// An intent whose hash the caller computed (for example, carried by the client). It
    /// knows only that hash's scheme.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name.
    pub fn from_digest(name: &str, hash: IntentHash) -> Result<Intent> {
        validate::name("intent name", name)?;
        let mut intent = Intent {
            name: name.to_string(),
            jcs: None,
            legacy: None,
        };
        match hash.scheme {
            HashScheme::JcsV2 => intent.jcs = Some(hash.digest),
            HashScheme::LegacyV1 => intent.legacy = Some(hash.digest),
        }
        Ok(intent)
    }

    /// The intent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The intent hash under the current scheme ([`HashScheme::JcsV2`]), or, for an
    /// intent built from a digest of another scheme, that digest.
    pub fn hash(&self) -> IntentHash {
        match (self.jcs, self.legacy) {
            (Some(d), _) => IntentHash::new(HashScheme::JcsV2, d),
            (None, Some(d)) => IntentHash::new(HashScheme::LegacyV1, d),
            // Every constructor sets at least one digest.
            (None, None) => IntentHash::new(HashScheme::JcsV2, [0; 32]),
        }
    }

    /// The intent hash under `scheme`, or `None` for an intent built from a digest of
    /// another scheme.
    pub fn hash_as(&self, scheme: HashScheme) -> Option<IntentHash> {
        let d = match scheme {
            HashScheme::JcsV2 => self.jcs,
            HashScheme::LegacyV1 => self.legacy,
        };
        d.map(|d| IntentHash::new(scheme, d))
    }
}

/// The RFC 8785 (JCS) canonical JSON text of `value`: object keys sorted by their UTF-16
/// code units, no insignificant whitespace, minimal string escapes, and numbers as
/// ECMAScript prints the IEEE-754 double. Independent of `serde_json`'s `preserve_order`
/// feature.
///
/// Numbers are doubles, as in JavaScript: `1` and `1.0` are the same number, and an
/// integer beyond ±2^53 is rounded to the nearest double (as `JSON.parse` does), so two
/// such integers can share a text. Pass exact large integers (64-bit ids) as strings.
///
/// # Example
///
/// ```
/// use serde_json::json;
///
/// let text = opjournal::canonical_json(&json!({"b": [1.0, 1e21, "é\n"], "a": null}));
/// assert_eq!(String::from_utf8(text)?, r#"{"a":null,"b":[1,1e+21,"é\n"]}"#);
/// # Ok::<(), std::string::FromUtf8Error>(())
/// ```
pub fn canonical_json(value: &serde_json::Value) -> Vec<u8> {
    let mut out = Vec::new();
    let mut numbers = ryu_js::Buffer::new();
    write_jcs(value, &mut out, &mut numbers);
    out
}

fn write_jcs(value: &serde_json::Value, out: &mut Vec<u8>, numbers: &mut ryu_js::Buffer) {
    use serde_json::Value;
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // Integers round to the nearest double (ties to even), as JavaScript parses them.
        // `serde_json` holds no NaN or infinity; `format` would print them as JavaScript
        // does, which JSON has no text for.
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            out.extend_from_slice(numbers.format(f).as_bytes());
        }
        Value::String(s) => write_jcs_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_jcs(v, out, numbers);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_jcs_string(k, out);
                out.push(b':');
                write_jcs(v, out, numbers);
            }
            out.push(b'}');
        }
    }
}

fn write_jcs_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x00..=0x1f => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// The canonical JSON text of the legacy scheme: keys sorted by UTF-8 bytes, no
/// insignificant whitespace, strings and numbers as `serde_json` prints them.
fn legacy_canonical_json(value: &serde_json::Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_legacy(value, &mut out);
    out
}

fn write_legacy(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_legacy_scalar(&Value::String(k.clone()), out);
                out.push(b':');
                write_legacy(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_legacy(v, out);
            }
            out.push(b']');
        }
        scalar => write_legacy_scalar(scalar, out),
    }
}

fn write_legacy_scalar(value: &serde_json::Value, out: &mut Vec<u8>) {
    // Serializing a scalar (null, bool, number, string) into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, value).is_err() {
        debug_assert!(false, "serializing a JSON scalar failed");
    }
}
