//! Intents and their hashes.
//!
//! An intent is what an operation asks for: a name and its arguments. The intent hash is
//! SHA-256 over a domain tag, the name and the canonical argument bytes:
//!
//! ```text
//! sha256( "opjournal.intent.v1\0" || u64_le(len(name)) || name || args )
//! ```
//!
//! For JSON arguments, `args` is the canonical JSON text: object keys sorted by their UTF-8
//! bytes, no insignificant whitespace, strings escaped as `serde_json` escapes them, and
//! numbers as `serde_json` prints them (so `1` and `1.0` are different intents).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::validate;

const DOMAIN: &[u8] = b"opjournal.intent.v1\0";

/// A SHA-256 intent hash, shown as `sha256:<64 hex digits>`.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct IntentHash(pub [u8; 32]);

impl IntentHash {
    /// The 32 digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for IntentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for IntentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for IntentHash {
    type Err = Error;

    /// Parses `sha256:<64 hex digits>` (the prefix is optional).
    fn from_str(s: &str) -> Result<Self> {
        let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|e| {
            Error::invalid(
                "intent hash",
                s,
                format!("expected `sha256:` and 64 hex digits ({e})"),
            )
        })?;
        Ok(IntentHash(out))
    }
}

/// What an operation asks for: a name (such as `scene.add_light`) and the hash of its
/// arguments.
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
/// # Ok::<(), opjournal::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    name: String,
    hash: IntentHash,
}

impl Intent {
    /// An intent whose arguments are a JSON value, hashed in canonical form.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) if the name is empty,
    /// longer than 256 bytes or contains control characters.
    pub fn from_json(name: &str, args: &serde_json::Value) -> Result<Intent> {
        let canonical = canonical_json(args);
        Intent::from_bytes(name, &canonical)
    }

    /// An intent whose arguments are already bytes (hashed as given).
    ///
    /// `Intent::from_bytes(name, &canonical_json(v))` equals `Intent::from_json(name, v)`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name, as in
    /// [`Intent::from_json`].
    pub fn from_bytes(name: &str, args: &[u8]) -> Result<Intent> {
        validate::name("intent name", name)?;
        let mut h = Sha256::new();
        h.update(DOMAIN);
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(args);
        Ok(Intent {
            name: name.to_string(),
            hash: IntentHash(h.finalize().into()),
        })
    }

    /// An intent whose hash the caller computed (for example, carried by the client).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name.
    pub fn from_digest(name: &str, hash: IntentHash) -> Result<Intent> {
        validate::name("intent name", name)?;
        Ok(Intent {
            name: name.to_string(),
            hash,
        })
    }

    /// The intent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The intent hash.
    pub fn hash(&self) -> IntentHash {
        self.hash
    }
}

/// The canonical JSON text of `value`: keys sorted by UTF-8 bytes, no insignificant
/// whitespace. Independent of `serde_json`'s `preserve_order` feature.
pub fn canonical_json(value: &serde_json::Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
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
                write_scalar(&Value::String(k.clone()), out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &serde_json::Value, out: &mut Vec<u8>) {
    // Serializing a scalar (null, bool, number, string) into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, value).is_err() {
        debug_assert!(false, "serializing a JSON scalar failed");
    }
}
