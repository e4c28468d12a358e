//! Intents: an operation's name and the hash of its arguments, computed over their
//! canonical JSON ([`canonical_json`]; RFC 8785 for the current scheme).
//!
//! The hash and its construction live in `intent_hash`, a leaf (documented on
//! [`HashScheme`], where rustdoc shows it); here is what of the hash needs the crate's
//! `Error` or `Intent`: parsing its text form and [`IntentHash::matches`].

use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Error, Result};
use crate::intent_hash::digest;
// The modules that name the hash as `crate::intent::IntentHash` keep that path.
pub(crate) use crate::intent_hash::{HashScheme, IntentHash};
use crate::validate;

impl IntentHash {
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
        intent.hash_as(self.scheme()) == Some(*self)
    }
}

impl FromStr for IntentHash {
    type Err = Error;

    /// Parses `jcs-sha256:<64 hex digits>` or `sha256:<64 hex digits>`; 64 hex digits
    /// without a prefix are a [`HashScheme::LegacyV1`] hash, as that scheme was shown before
    /// schemes existed.
    fn from_str(s: &str) -> Result<Self> {
        IntentHash::from_text(s).ok_or_else(|| {
            Error::invalid(
                "intent hash",
                s,
                "expected `jcs-sha256:` or `sha256:` and 64 hex digits",
            )
        })
    }
}

impl<'de> Deserialize<'de> for IntentHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
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
        match hash.scheme() {
            HashScheme::JcsV2 => intent.jcs = Some(*hash.as_bytes()),
            HashScheme::LegacyV1 => intent.legacy = Some(*hash.as_bytes()),
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
