//! Intent hashes: RFC 8785 (JCS) canonical JSON checked against the RFC's examples, hash
//! test vectors computed independently (Node.js), the scheme tag in text form, and
//! matching across schemes so an operation recorded under the legacy scheme still matches
//! its retry.

mod common;

use opjournal::{
    Admission, ErrorKind, HashScheme, Intent, IntentHash, Journal, Operation, canonical_json,
};
use serde_json::{Value, json};

fn canon(text: &str) -> String {
    let value: Value = serde_json::from_str(text).expect("valid JSON");
    String::from_utf8(canonical_json(&value)).expect("canonical JSON is UTF-8")
}

fn number(bits: u64) -> String {
    let value = Value::from(f64::from_bits(bits));
    String::from_utf8(canonical_json(&value)).expect("UTF-8")
}

#[test]
fn canonical_json_matches_the_rfc_8785_main_example() {
    let input = r#"{
      "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }"#;
    assert_eq!(
        canon(input),
        r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
    );
}

#[test]
fn canonical_json_sorts_keys_by_utf16_code_units_as_the_rfc_example() {
    // RFC 8785 section 3.2.3: the emoji (a surrogate pair starting 0xD83D) sorts before
    // U+FB33, although its UTF-8 bytes sort after.
    let input = r#"{
      "\u20ac": "Euro Sign",
      "\r": "Carriage Return",
      "\ufb33": "Hebrew Letter Dalet With Dagesh",
      "1": "One",
      "\ud83d\ude00": "Emoji: Grinning Face",
      "\u0080": "Control",
      "\u00f6": "Latin Small Letter O With Diaeresis"
    }"#;
    assert_eq!(
        canon(input),
        "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
         \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
         \"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
    );
}

#[test]
fn canonical_json_prints_numbers_as_ecmascript_the_rfc_appendix_b_values() {
    let cases: [(u64, &str); 22] = [
        (0x0000000000000000, "0"),
        (0x8000000000000000, "0"),
        (0x0000000000000001, "5e-324"),
        (0x8000000000000001, "-5e-324"),
        (0x7fefffffffffffff, "1.7976931348623157e+308"),
        (0xffefffffffffffff, "-1.7976931348623157e+308"),
        (0x4340000000000000, "9007199254740992"),
        (0xc340000000000000, "-9007199254740992"),
        (0x4430000000000000, "295147905179352830000"),
        (0x44b52d02c7e14af5, "9.999999999999997e+22"),
        (0x44b52d02c7e14af6, "1e+23"),
        (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
        (0x444b1ae4d6e2ef4e, "999999999999999700000"),
        (0x444b1ae4d6e2ef4f, "999999999999999900000"),
        (0x444b1ae4d6e2ef50, "1e+21"),
        (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
        (0x3eb0c6f7a0b5ed8d, "0.000001"),
        (0x41b3de4355555553, "333333333.3333332"),
        (0x41b3de4355555554, "333333333.33333325"),
        (0x41b3de4355555555, "333333333.3333333"),
        (0xbecbf647612f3696, "-0.0000033333333333333333"),
        (0x43143ff3c1cb0959, "1424953923781206.2"),
    ];
    for (bits, want) in cases {
        assert_eq!(number(bits), want, "{bits:#018x}");
    }
}

#[test]
fn canonical_json_rounds_integers_to_doubles_as_javascript_does() {
    assert_eq!(canon("[1, 1.0, -0.0, 100]"), "[1,1,0,100]");
    // 2^60 prints as JavaScript prints it, and parsing that text back gives the same text.
    assert_eq!(canon("1152921504606846976"), "1152921504606847000");
    assert_eq!(canon("1152921504606847000"), "1152921504606847000");
    // Beyond 2^53 two integers can share a double: pass exact big integers as strings.
    assert_eq!(canon("9007199254740993"), "9007199254740992");
    assert_eq!(canon("18446744073709551615"), "18446744073709552000");
    assert_eq!(canon("-9223372036854775808"), "-9223372036854776000");
}

#[test]
fn canonical_json_escapes_only_quotes_backslashes_and_control_characters() {
    let value = json!("\u{0}\u{8}\u{9}\u{a}\u{c}\u{d}\u{1f}\u{7f}/\u{2028}é😀\"\\");
    assert_eq!(
        String::from_utf8(canonical_json(&value)).expect("UTF-8"),
        "\"\\u0000\\b\\t\\n\\f\\r\\u001f\u{7f}/\u{2028}é😀\\\"\\\\\""
    );
}

#[test]
fn intent_hashes_match_the_documented_test_vectors() -> opjournal::Result<()> {
    let cases = [
        (
            "scene.add_light",
            json!({"near": "door", "kind": "spot"}),
            "jcs-sha256:23010e7617bf777752858d55203ced7aa49146945a3f975f686c6f18e37e84fa",
        ),
        (
            "doc.set",
            serde_json::from_str(r#"{"b": [1.0, 1e21, 0.000001], "a": "é\n"}"#)
                .expect("valid JSON"),
            "jcs-sha256:ba5c31b6d28146ea481cf0328b8c6fa9fc6f26e952ba34ffcce2ea52a082e4cc",
        ),
        (
            "x",
            Value::Null,
            "jcs-sha256:4f6d6b198cb31ac5d0a042c8e9b0e5456ea70e8bd9a62e71cf31e094e9b6212d",
        ),
    ];
    for (name, args, want) in cases {
        assert_eq!(
            Intent::from_json(name, &args)?.hash().to_string(),
            want,
            "{name}"
        );
    }
    Ok(())
}

#[test]
fn legacy_hashes_keep_their_construction() -> opjournal::Result<()> {
    // Computed with Node.js over the legacy canonical text (`{"near":"door"}`,
    // `{"v":1.0}`) and the domain `opjournal.intent.v1\0`.
    let a = Intent::from_json("scene.add_light", &json!({"near": "door"}))?;
    assert_eq!(
        a.hash_as(HashScheme::LegacyV1).map(|h| h.to_string()),
        Some("sha256:989d9932e9a922aaae75837a5e22f4014292f2efd021852ca922e587dce19633".into())
    );
    assert_eq!(
        a.hash().to_string(),
        "jcs-sha256:97f043e9562c21515be0825448c05795426d4d7b401482a2402b084854c97762"
    );
    let b = Intent::from_json("doc.set", &json!({"v": 1.0}))?;
    assert_eq!(
        b.hash_as(HashScheme::LegacyV1).map(|h| h.to_string()),
        Some("sha256:45cadc2c7141d20212651cc9e609e4705fe7a4ecd4b765212120946da17100c0".into())
    );
    assert_eq!(
        b.hash().to_string(),
        "jcs-sha256:7e0d8cd6e1dc9f4636239e969c97d1cb4bcc5af03e5c7c5a3dbf23ccaff2fba0"
    );
    Ok(())
}

#[test]
fn hashes_print_and_parse_with_their_scheme() -> opjournal::Result<()> {
    let intent = Intent::from_json("scene.add_light", &json!({"near": "door"}))?;
    for hash in [
        intent.hash(),
        intent.hash_as(HashScheme::LegacyV1).expect("from JSON"),
    ] {
        let text = hash.to_string();
        let parsed: IntentHash = text.parse()?;
        assert_eq!(parsed, hash, "{text}");
        assert_eq!(parsed.scheme(), hash.scheme());
        // Serialized as the same text.
        assert_eq!(
            serde_json::to_value(hash).expect("serializes"),
            Value::String(text.clone())
        );
    }
    // 64 hex digits without a prefix are the legacy scheme, as shown before schemes.
    let bare: IntentHash =
        "989d9932e9a922aaae75837a5e22f4014292f2efd021852ca922e587dce19633".parse()?;
    assert_eq!(bare.scheme(), HashScheme::LegacyV1);
    let err = "jcs-sha256:12"
        .parse::<IntentHash>()
        .expect_err("too short");
    assert!(
        matches!(err.kind(), ErrorKind::InvalidInput { .. }),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn a_recorded_hash_matches_its_intent_under_the_recorded_scheme_only() -> opjournal::Result<()> {
    let intent = Intent::from_json("scene.add_light", &json!({"near": "door"}))?;
    let other = Intent::from_json("scene.add_light", &json!({"near": "window"}))?;
    for scheme in [HashScheme::LegacyV1, HashScheme::JcsV2] {
        let recorded = intent.hash_as(scheme).expect("from JSON");
        assert!(recorded.matches(&intent), "{scheme:?}");
        assert!(!recorded.matches(&other), "{scheme:?}");
    }
    // An intent built from a digest knows that scheme only.
    let from_digest = Intent::from_digest("scene.add_light", intent.hash())?;
    assert!(intent.hash().matches(&from_digest));
    assert!(
        !intent
            .hash_as(HashScheme::LegacyV1)
            .expect("from JSON")
            .matches(&from_digest)
    );
    Ok(())
}

#[test]
fn typed_and_byte_intents_hash_as_their_json() -> opjournal::Result<()> {
    #[derive(serde::Serialize)]
    struct AddLight {
        near: &'static str,
        intensity: f64,
    }
    let typed = Intent::from_serialize(
        "scene.add_light",
        &AddLight {
            near: "door",
            intensity: 2.0,
        },
    )?;
    let json = Intent::from_json("scene.add_light", &json!({"intensity": 2, "near": "door"}))?;
    assert_eq!(typed.hash(), json.hash());
    let bytes = Intent::from_bytes(
        "scene.add_light",
        &canonical_json(&json!({"near": "door", "intensity": 2})),
    )?;
    assert_eq!(bytes.hash(), json.hash());
    // A map with non-string keys does not serialize to JSON.
    let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let err = Intent::from_serialize("scene.add_light", &bad).expect_err("not JSON");
    assert!(
        matches!(err.kind(), ErrorKind::InvalidInput { .. }),
        "{err:?}"
    );
    Ok(())
}

/// A copy of the frozen format 1 fixture (`tests/format.rs` built it): every operation in
/// it was recorded with a legacy hash, since format 1 stored no scheme.
fn format_1_journal() -> common::Env {
    let env = common::Env::new();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1.opj");
    std::fs::copy(fixture, &env.path).expect("copy the format 1 fixture");
    env
}

#[test]
fn an_operation_recorded_under_the_legacy_scheme_replays_to_its_retry() -> opjournal::Result<()> {
    // The retry, whose `hash()` is a JCS hash, matches through the recorded scheme, also
    // after the first writer upgraded the file to format 2.
    let env = format_1_journal();
    let journal = env.open();
    let op = Operation::new("acked", common::add_light("acked"))
        .scope("scene/main")
        .session("tab-1");
    let recorded = journal.lookup("acked")?.expect("recorded").intent_hash;
    assert_eq!(recorded.scheme(), HashScheme::LegacyV1);
    assert_eq!(op.intent().hash().scheme(), HashScheme::JcsV2);
    assert!(recorded.matches(op.intent()));
    match journal.submit(op.clone())? {
        Admission::Replay(replay) => assert!(replay.replayed),
        other => panic!("expected a replay, got {other:?}"),
    }
    drop(journal);
    let journal = env.open();
    match journal.submit(op)? {
        Admission::Replay(replay) => assert!(replay.replayed),
        other => panic!("expected a replay after reopening, got {other:?}"),
    }
    // Another intent under the same id is still refused, naming both legacy hashes.
    let other = Operation::new("acked", common::add_light("window"))
        .scope("scene/main")
        .session("tab-1");
    let err = journal.submit(other).expect_err("another intent");
    match err.kind() {
        ErrorKind::IntentMismatch {
            recorded,
            submitted,
            ..
        } => {
            assert_eq!(recorded.scheme(), HashScheme::LegacyV1);
            assert_eq!(submitted.scheme(), HashScheme::LegacyV1);
            assert_ne!(recorded, submitted);
        }
        other => panic!("expected IntentMismatch, got {other:?}"),
    }
    // New operations are recorded under JCS.
    let fresh = Operation::new("op_new", common::add_light("door"));
    let Admission::Fresh(_) = journal.submit(fresh)? else {
        panic!("a new id is fresh work");
    };
    let new_hash = journal.lookup("op_new")?.expect("recorded").intent_hash;
    assert_eq!(new_hash.scheme(), HashScheme::JcsV2);
    Ok(())
}

#[test]
fn a_digest_only_retry_of_a_legacy_operation_is_refused_and_writes_nothing() -> opjournal::Result<()>
{
    // A client that sends only a JCS digest cannot be compared with a legacy record: the
    // retry is refused, never taken as a match or as new work.
    let env = format_1_journal();
    let journal: Journal = env.open();
    let jcs = common::add_light("acked").hash();
    let op = Operation::new("acked", Intent::from_digest("scene.add_light", jcs)?)
        .scope("scene/main")
        .session("tab-1");
    let before = journal.history("acked")?;
    let err = journal
        .submit(op)
        .expect_err("a JCS digest cannot match a legacy hash");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::IntentMismatch { .. } | ErrorKind::InvalidInput { .. }
        ),
        "{err:?}"
    );
    assert_eq!(journal.history("acked")?, before, "nothing was written");
    // The legacy digest of the same intent matches.
    let legacy = common::add_light("acked")
        .hash_as(HashScheme::LegacyV1)
        .expect("built from JSON");
    let op = Operation::new("acked", Intent::from_digest("scene.add_light", legacy)?)
        .scope("scene/main")
        .session("tab-1");
    let answer = journal.submit(op)?;
    assert!(matches!(answer, Admission::Replay(_)), "{answer:?}");
    Ok(())
}
