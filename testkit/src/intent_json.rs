//! `intent_json`: arbitrary JSON values through canonical hashing.
//!
//! Claims (numbers compare as IEEE-754 doubles, as RFC 8785 canonical JSON treats them:
//! `1` and `1.0` are one number):
//! - the canonical text parses back to the same value, and canonicalizing that again gives
//!   the same bytes;
//! - the intent hash does not depend on key order, whitespace or how strings are escaped:
//!   the value written out with shuffled keys, random whitespace and random `\u` escapes,
//!   then parsed, hashes the same;
//! - distinct canonical values hash differently, and equal hashes mean equal values;
//! - `Intent::from_json` and `Intent::from_bytes` over the canonical text hash the same.

use arbitrary::{Arbitrary, Unstructured};
use opjournal::{Intent, canonical_json};
use serde_json::{Map, Number, Value};

/// Deeper values than this are cut (serde_json's own parser stops at 128 levels).
pub const MAX_DEPTH: usize = 32;

/// A JSON value as the fuzzer builds it.
#[derive(Arbitrary, Debug, Clone)]
pub enum ArbJson {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A negative or small integer.
    Int(i64),
    /// A large unsigned integer.
    UInt(u64),
    /// A float (NaN and infinities become `null`, as JSON cannot hold them).
    Float(f64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<ArbJson>),
    /// An object; repeated keys keep the last value.
    Object(Vec<(String, ArbJson)>),
}

impl ArbJson {
    /// The `serde_json` value, cut at [`MAX_DEPTH`].
    pub fn to_value(&self) -> Value {
        self.to_value_at(0)
    }

    fn to_value_at(&self, depth: usize) -> Value {
        if depth >= MAX_DEPTH {
            return Value::Null;
        }
        match self {
            ArbJson::Null => Value::Null,
            ArbJson::Bool(b) => Value::Bool(*b),
            ArbJson::Int(i) => Value::from(*i),
            ArbJson::UInt(u) => Value::from(*u),
            ArbJson::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            ArbJson::Str(s) => Value::String(s.clone()),
            ArbJson::Array(items) => {
                Value::Array(items.iter().map(|v| v.to_value_at(depth + 1)).collect())
            }
            ArbJson::Object(entries) => {
                let mut map = Map::new();
                for (k, v) in entries {
                    map.insert(k.clone(), v.to_value_at(depth + 1));
                }
                Value::Object(map)
            }
        }
    }
}

/// One fuzz input: two values, and the choices used to lay the first one out as text.
#[derive(Arbitrary, Debug)]
pub struct Input {
    /// The value whose hash is checked for invariance.
    pub value: ArbJson,
    /// A second value, compared with the first.
    pub other: ArbJson,
    /// Choices for key order, whitespace and escapes.
    pub layout: Vec<u8>,
    /// Raw text that is canonicalized too if it parses as JSON.
    pub text: String,
}

/// A stream of layout choices (zeros once exhausted).
pub struct Layout<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Layout<'a> {
    /// Choices from `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Layout { bytes, at: 0 }
    }

    fn next(&mut self) -> u8 {
        if self.bytes.is_empty() {
            return 0;
        }
        let b = self.bytes[self.at % self.bytes.len()];
        // Walk the bytes with a stride so a short layout still varies.
        self.at = self.at.wrapping_add(1);
        b.wrapping_add((self.at / self.bytes.len()) as u8)
    }

    fn whitespace(&mut self, out: &mut String) {
        let n = self.next() % 4;
        for _ in 0..n {
            out.push(match self.next() % 4 {
                0 => ' ',
                1 => '\n',
                2 => '\t',
                _ => '\r',
            });
        }
    }
}

/// Writes `value` as JSON text with keys in an order and whitespace chosen by `layout`,
/// and each string character escaped as `\uXXXX` or written plainly as `layout` chooses.
pub fn write_scrambled(value: &Value, layout: &mut Layout<'_>, out: &mut String) {
    layout.whitespace(out);
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            // A Fisher-Yates shuffle driven by the layout.
            for i in (1..entries.len()).rev() {
                let j = usize::from(layout.next()) % (i + 1);
                entries.swap(i, j);
            }
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, layout, out);
                layout.whitespace(out);
                out.push(':');
                write_scrambled(v, layout, out);
            }
            layout.whitespace(out);
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_scrambled(v, layout, out);
            }
            layout.whitespace(out);
            out.push(']');
        }
        Value::String(s) => write_string(s, layout, out),
        scalar => out.push_str(&scalar.to_string()),
    }
    layout.whitespace(out);
}

fn write_string(s: &str, layout: &mut Layout<'_>, out: &mut String) {
    layout.whitespace(out);
    out.push('"');
    for c in s.chars() {
        let must_escape = c == '"' || c == '\\' || c < ' ';
        if must_escape || layout.next().is_multiple_of(8) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
}

/// JSON equality with numbers compared as the doubles they round to (RFC 8785 numbers).
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        (x, y) => x == y,
    }
}

fn hash(value: &Value) -> opjournal::IntentHash {
    match Intent::from_json("fuzz.intent", value) {
        Ok(i) => i.hash(),
        Err(e) => panic!("a valid name was refused: {e:?}"),
    }
}

/// Checks the invariance claims for `value` laid out by `layout`.
///
/// # Panics
///
/// When a claim does not hold (that is the finding).
pub fn check_value(value: &Value, layout: &[u8]) {
    let canonical = canonical_json(value);
    let parsed: Value = serde_json::from_slice(&canonical).unwrap_or_else(|e| {
        panic!(
            "canonical text does not parse ({e}): {}",
            String::from_utf8_lossy(&canonical)
        )
    });
    assert!(
        same(&parsed, value),
        "canonical text parses to another value: {}",
        String::from_utf8_lossy(&canonical)
    );
    assert!(
        canonical_json(&parsed) == canonical,
        "canonicalizing is not idempotent: {}",
        String::from_utf8_lossy(&canonical)
    );
    let mut text = String::new();
    write_scrambled(value, &mut Layout::new(layout), &mut text);
    let reparsed: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("scrambled text does not parse ({e}): {text}"));
    assert!(
        canonical_json(&reparsed) == canonical,
        "key order, whitespace or escapes changed the canonical text: {text}"
    );
    assert!(
        hash(&reparsed) == hash(value),
        "key order, whitespace or escapes changed the hash: {text}"
    );
    let from_bytes = Intent::from_bytes("fuzz.intent", &canonical)
        .unwrap_or_else(|e| panic!("a valid name was refused: {e:?}"));
    assert!(
        from_bytes.hash() == hash(value),
        "from_json and from_bytes over the canonical text disagree"
    );
}

/// Checks that `a` and `b` hash alike exactly when their canonical texts are equal, and
/// that equal canonical texts mean equal values.
///
/// # Panics
///
/// When a claim does not hold (that is the finding).
pub fn check_pair(a: &Value, b: &Value) {
    let (ca, cb) = (canonical_json(a), canonical_json(b));
    assert!(
        (hash(a) == hash(b)) == (ca == cb),
        "hash equality disagrees with canonical equality: {} vs {}",
        String::from_utf8_lossy(&ca),
        String::from_utf8_lossy(&cb)
    );
    if ca == cb {
        assert!(
            same(a, b),
            "two different values share a canonical text: {}",
            String::from_utf8_lossy(&ca)
        );
    }
}

/// Checks every claim of this module on one fuzz input.
///
/// # Panics
///
/// When a claim does not hold (that is the finding).
pub fn check(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let value = input.value.to_value();
    let other = input.other.to_value();
    check_value(&value, &input.layout);
    check_value(&other, &input.layout);
    check_pair(&value, &other);
    if let Ok(v) = serde_json::from_str::<Value>(&input.text) {
        check_value(&v, &input.layout);
        check_pair(&v, &value);
    }
}
