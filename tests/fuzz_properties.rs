//! The fuzz targets' claims on stable, on every `cargo test`: the same checks as
//! `fuzz/fuzz_targets/*` (both call the `opjournal-testkit` crate, `testkit/`), fed by
//! proptest instead of libFuzzer, plus a replay of every committed seed and regression
//! input. See docs/fuzzing.md.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use opjournal::codec::{self, RecordKind};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Number, Value};

use opjournal_testkit::alloc_meter;
use opjournal_testkit::decode_record;
use opjournal_testkit::intent_json;
use opjournal_testkit::open_file;
use opjournal_testkit::ops_vs_model;
use opjournal_testkit::panics;
use opjournal_testkit::seeds;

#[global_allocator]
static ALLOC: alloc_meter::Meter = alloc_meter::Meter;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The seed journals, built once per test binary.
fn seed_journals() -> &'static [(&'static str, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(&'static str, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| seeds::all().unwrap_or_else(|e| panic!("seed journals: {e:?}")))
}

/// Every CRC-valid framed record inside `bytes`, as `(kind byte, frame)`.
fn frames_in(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + codec::HEADER_LEN <= bytes.len() {
        if bytes[i..].starts_with(&codec::MAGIC) {
            let len = u32::from_le_bytes([bytes[i + 4], bytes[i + 5], bytes[i + 6], bytes[i + 7]]);
            let end = i + codec::HEADER_LEN + len as usize;
            if end <= bytes.len()
                && let Ok((kind, _)) = codec::unframe_any(&bytes[i..end])
            {
                out.push((kind, bytes[i..end].to_vec()));
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The framed records of the seed journals: every record kind the library writes.
fn real_records() -> &'static [(u8, Vec<u8>)] {
    static RECORDS: OnceLock<Vec<(u8, Vec<u8>)>> = OnceLock::new();
    RECORDS.get_or_init(|| {
        seed_journals()
            .iter()
            .flat_map(|(_, bytes)| frames_in(bytes))
            .collect()
    })
}

#[test]
fn seed_journals_hold_every_record_kind_the_decoders_read() {
    let kinds: std::collections::BTreeSet<u8> = real_records().iter().map(|(k, _)| *k).collect();
    for kind in [
        RecordKind::Meta,
        RecordKind::Event,
        RecordKind::Receipt,
        RecordKind::Scope,
        RecordKind::Result,
    ] {
        assert!(
            kinds.contains(&(kind as u8)),
            "no {kind:?} record in the seed journals (found kinds {kinds:?})"
        );
    }
    for (kind, frame) in real_records() {
        let accepted = opjournal::fuzzing::decode_every_record(frame)
            .unwrap_or_else(|e| panic!("a real record of kind {kind} breaks a round trip: {e}"));
        assert!(
            accepted >= 1,
            "a real record of kind {kind} is accepted by no decoder"
        );
    }
}

/// A byte-level change to a file or record, positioned relative to its length.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Truncate(Index),
    Zero(Index, u16),
    CopyWithin(Index, Index, u16),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::SetByte(i, b)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), 1u16..4096).prop_map(|(i, n)| Mutation::Zero(i, n)),
        1 => (any::<Index>(), any::<Index>(), 1u16..512)
            .prop_map(|(a, b, n)| Mutation::CopyWithin(a, b, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let len = bytes.len();
    match m {
        Mutation::FlipBit(i, b) => bytes[i.index(len)] ^= 1 << b,
        Mutation::SetByte(i, b) => bytes[i.index(len)] = *b,
        Mutation::Truncate(i) => bytes.truncate(i.index(len)),
        Mutation::Zero(i, n) => {
            let start = i.index(len);
            let end = (start + usize::from(*n)).min(len);
            bytes[start..end].fill(0);
        }
        Mutation::CopyWithin(a, b, n) => {
            let (src, dst) = (a.index(len), b.index(len));
            let n = usize::from(*n).min(len - src).min(len - dst);
            bytes.copy_within(src..src + n, dst);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn decoders_never_panic_and_round_trip_whatever_they_accept(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        kind in 1u8..=6,
    ) {
        decode_record::check(&bytes);
        // Framed with a valid header and CRC, so the payload decoders see the bytes.
        let kind = RecordKind::from_byte(kind).unwrap_or(RecordKind::Event);
        decode_record::check(&codec::frame(kind, &bytes));
    }

    #[test]
    fn mutated_real_records_decode_to_round_tripping_values_or_are_refused(
        pick in any::<Index>(),
        mutations in prop::collection::vec(mutation(), 1..4),
        reframe in any::<bool>(),
    ) {
        let (kind, frame) = pick.get(real_records());
        let mut bytes = frame.clone();
        if reframe {
            // Mutate the payload and give it a valid CRC again.
            let mut payload = bytes[codec::HEADER_LEN..].to_vec();
            for m in &mutations {
                apply(&mut payload, m);
            }
            let kind = RecordKind::from_byte(*kind).unwrap_or(RecordKind::Event);
            bytes = codec::frame(kind, &payload);
        } else {
            for m in &mutations {
                apply(&mut bytes, m);
            }
        }
        decode_record::check(&bytes);
    }
}

/// A JSON value: scalars of every kind, keys from a small alphabet (so prefixes and
/// collisions are common) and from all of Unicode, nested a few levels.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("JSON has no NaN or infinity", |f| {
            Number::from_f64(f).map(Value::Number)
        }),
        (-1000i32..1000).prop_map(|n| Value::from(f64::from(n) / 8.0)),
        "\\PC{0,12}".prop_map(Value::String),
        "[\"\\\\/\u{0}-\u{1f}a\u{e9}\u{1f600}]{0,6}".prop_map(Value::String),
    ];
    let key = prop_oneof!["[ab]{0,3}", "\\PC{0,6}"];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn intent_hash_ignores_key_order_whitespace_and_escapes(
        value in json(),
        layout in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        intent_json::check_value(&value, &layout);
    }

    #[test]
    fn distinct_canonical_values_hash_differently(a in json(), b in json()) {
        intent_json::check_pair(&a, &b);
    }

    #[test]
    fn intent_json_target_holds_on_arbitrary_bytes(
        data in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        intent_json::check(&data);
    }
}

proptest! {
    // Each case opens, inspects, verifies and repairs a real file: keep them few.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn damaged_journals_answer_typed_errors_and_repair_makes_them_whole(
        pick in any::<Index>(),
        mutations in prop::collection::vec(mutation(), 1..6),
        damage_log in any::<bool>(),
    ) {
        panics::install(false);
        let (_, seed) = pick.get(seed_journals());
        // The journal or, for a seed with its log, the log.
        let (db, log) = open_file::split(seed);
        let (mut db, mut log) = (db.to_vec(), log.map(<[u8]>::to_vec));
        let target = match &mut log {
            Some(log) if damage_log => log,
            _ => &mut db,
        };
        for m in &mutations {
            apply(target, m);
        }
        let bytes = match &log {
            Some(log) => open_file::join(&db, log),
            None => db,
        };
        open_file::check_every_claim(&bytes);
    }
}

#[test]
fn seed_journals_are_clean_and_pass_the_open_file_checks() {
    panics::install(false);
    for (name, bytes) in seed_journals() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join(name);
        write_input(&path, bytes);
        let insp = opjournal::Inspector::open(&path)
            .unwrap_or_else(|e| panic!("seed {name} does not open: {e:?}"));
        let report = opjournal::verify_inspected(&insp, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("seed {name} does not verify: {e:?}"));
        assert!(report.is_clean(), "seed {name} is not clean: {report:?}");
        drop(insp);
        open_file::check_every_claim(bytes);
    }
}

#[test]
fn open_file_samples_its_costly_checks_as_documented() {
    // One input in four gets the repair in place, one in eight the dry run, never both.
    let (mut repairs, mut dry_runs) = (0usize, 0usize);
    for i in 0u32..4096 {
        let plan = open_file::Plan::of(&i.to_le_bytes());
        assert!(!(plan.repair && plan.dry_run), "{i}: both");
        repairs += usize::from(plan.repair);
        dry_runs += usize::from(plan.dry_run);
    }
    assert!((900..1150).contains(&repairs), "{repairs} repairs in 4096");
    assert!(
        (420..610).contains(&dry_runs),
        "{dry_runs} dry runs in 4096"
    );
    // The fuzzer's entry point, sampled, on the seeds.
    panics::install(false);
    for (_, bytes) in seed_journals() {
        open_file::check(bytes);
    }
}

/// Every file under `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`.
fn committed_inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for base in ["corpus", "regressions"] {
        let dir = fuzz_dir().join(base).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() {
                let bytes =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.push((path, bytes));
            }
        }
    }
    out.sort();
    out
}

/// Inputs for `ops_vs_model` from a fixed generator (xorshift64), so the coverage
/// assertions below are stable.
fn session_inputs(count: usize, len: usize) -> Vec<Vec<u8>> {
    let mut x: u64 = 0x5EED_0F0F_0B5E_55ED;
    (0..count)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect()
        })
        .collect()
}

/// Runs the fixed sessions of [`session_inputs`] on `backend` (whatever their first byte
/// picks) and sums their figures.
fn model_sweep(backend: ops_vs_model::Backend) -> ops_vs_model::Figures {
    model_sweep_of(backend, 40)
}

/// [`model_sweep`] over `sessions` sessions.
fn model_sweep_of(backend: ops_vs_model::Backend, sessions: usize) -> ops_vs_model::Figures {
    panics::install(false);
    let mut total = ops_vs_model::Figures::default();
    for data in session_inputs(sessions, 768) {
        let mut input = ops_vs_model::Input::from_bytes(&data);
        input.backend = backend;
        let f = panics::dump_on_panic("ops_vs_model", &data, || {
            ops_vs_model::run(&input).unwrap_or_else(|e| panic!("ops_vs_model on {backend:?}: {e}"))
        });
        total.calls += f.calls;
        total.refusals += f.refusals;
        total.applications += f.applications;
        total.failures += f.failures;
        total.poisoned_refusals += f.poisoned_refusals;
        total.reopens += f.reopens;
        total.replays += f.replays;
        total.verified += f.verified;
        total.comparisons += f.comparisons;
    }
    eprintln!("ops_vs_model sweep on {backend:?}: {total:?}");
    total
}

#[test]
fn random_sessions_match_the_model_and_reach_every_kind_of_outcome() {
    let total = model_sweep(ops_vs_model::Backend::FaultDisk);
    // The sweep proves it reached each path it claims to check.
    assert!(total.calls > 500, "{total:?}");
    assert!(total.refusals > 0, "no predicted refusal: {total:?}");
    assert!(total.applications > 0, "no effect applied: {total:?}");
    assert!(total.replays > 0, "no replay: {total:?}");
    assert!(
        total.failures > 0,
        "no injected fault failed a call: {total:?}"
    );
    assert!(
        total.poisoned_refusals > 0,
        "no poisoned refusal: {total:?}"
    );
    assert!(total.reopens > 40, "too few reopens: {total:?}");
    // One input in four ends with a clean close and `verify` (and any crash in the middle
    // of a redb write is verified).
    assert!(total.verified > 0, "no image verified: {total:?}");
}

/// The same sessions on a journal in memory: every answer is the model's, and where an
/// input reopens, crashes or arms a fault the whole state is compared with the model
/// instead (nothing to lose, nothing to recover), as at the end of every session.
#[test]
fn model_sessions_hold_on_the_memory_backend() {
    let total = model_sweep(ops_vs_model::Backend::Memory);
    assert!(total.calls > 500, "{total:?}");
    assert!(total.refusals > 0, "no predicted refusal: {total:?}");
    assert!(total.applications > 0, "no effect applied: {total:?}");
    assert!(total.replays > 0, "no replay: {total:?}");
    // Each session's end, and each of its reopen, crash and fault steps.
    assert!(total.comparisons > 40 * 2, "too few comparisons: {total:?}");
    // No disk: no call fails, nothing is reopened or verified.
    assert_eq!(
        (
            total.failures,
            total.poisoned_refusals,
            total.reopens,
            total.verified
        ),
        (0, 0, 0, 0),
        "{total:?}"
    );
}

/// The same sessions on a journal in PostgreSQL (a private server): every answer is the
/// model's, a clean reopen opens the journal again from the database and compares, and a
/// crash or a fault step compares (the processes are killed in tests/postgres_processes.rs).
#[test]
fn model_sessions_hold_on_the_postgres_backend() {
    let Some(cluster) = opjournal_testkit::pg::PgCluster::start_or_skip() else {
        return;
    };
    // The sessions' backend names the URL for the whole test binary's life.
    let url: &'static str = Box::leak(cluster.url().into_boxed_str());
    let total = model_sweep_of(ops_vs_model::Backend::Postgres(url), 16);
    assert!(total.calls > 200, "{total:?}");
    assert!(total.refusals > 0, "no predicted refusal: {total:?}");
    assert!(total.applications > 0, "no effect applied: {total:?}");
    assert!(total.replays > 0, "no replay: {total:?}");
    assert!(total.reopens > 0, "no reopen from the database: {total:?}");
    assert!(total.comparisons > 16 * 2, "too few comparisons: {total:?}");
    assert_eq!(
        (total.failures, total.poisoned_refusals, total.verified),
        (0, 0, 0),
        "{total:?}"
    );
}

proptest! {
    // Each case opens and verifies journals: keep them few.
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_sessions_match_the_model(data in prop::collection::vec(any::<u8>(), 0..1024)) {
        panics::install(false);
        panics::dump_on_panic("ops_vs_model", &data, || ops_vs_model::check(&data));
    }
}

#[test]
fn committed_ops_vs_model_inputs_pass_the_target() {
    panics::install(false);
    let inputs = committed_inputs("ops_vs_model");
    assert!(!inputs.is_empty(), "no committed ops_vs_model inputs");
    for (_, bytes) in &inputs {
        ops_vs_model::check_every_claim(bytes);
    }
}

#[test]
fn committed_decode_record_inputs_pass_the_target() {
    let inputs = committed_inputs("decode_record");
    assert!(!inputs.is_empty(), "no committed decode_record inputs");
    for (_, bytes) in &inputs {
        // As the target does: the bytes as they are, and framed (the first byte picks the
        // kind) so the payload decoders see them.
        decode_record::check(bytes);
        if let Some((&kind, payload)) = bytes.split_first()
            && let Some(kind) = RecordKind::from_byte(kind % 6 + 1)
        {
            decode_record::check(&codec::frame(kind, payload));
        }
    }
}

#[test]
fn committed_intent_json_inputs_pass_the_target() {
    let inputs = committed_inputs("intent_json");
    assert!(!inputs.is_empty(), "no committed intent_json inputs");
    for (_, bytes) in &inputs {
        intent_json::check(bytes);
    }
}

#[test]
fn committed_open_file_inputs_pass_the_target() {
    panics::install(false);
    let inputs = committed_inputs("open_file");
    assert!(!inputs.is_empty(), "no committed open_file inputs");
    for (_, bytes) in &inputs {
        open_file::check_every_claim(bytes);
    }
}

/// The committed `open_file` and `decode_record` seed corpora are the files the library
/// writes today (so fuzzing starts from the current format). After a format change,
/// `OPJ_BLESS=1 cargo test --test fuzz_properties committed_seed_corpora` rewrites them.
#[test]
fn committed_seed_corpora_are_what_the_library_writes_today() {
    let mut expected: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    for (name, bytes) in seed_journals() {
        expected.push((
            fuzz_dir().join("corpus/open_file").join(name),
            bytes.clone(),
        ));
    }
    // The first two records of each kind that every build writes the same (each journal
    // has a random id, which its checkpoint record carries): those a second build of the
    // seed journals holds too.
    let again: std::collections::BTreeSet<Vec<u8>> = seeds::all()
        .unwrap_or_else(|e| panic!("seed journals: {e:?}"))
        .iter()
        .flat_map(|(_, bytes)| frames_in(bytes))
        .map(|(_, frame)| frame)
        .collect();
    let mut per_kind = std::collections::BTreeMap::<u8, usize>::new();
    for (kind, frame) in real_records() {
        let n = per_kind.entry(*kind).or_default();
        if *n < 2 && again.contains(frame) {
            let name = format!("kind{kind}-{n}");
            expected.push((
                fuzz_dir().join("corpus/decode_record").join(name),
                frame.clone(),
            ));
            *n += 1;
        }
    }
    let bless = std::env::var_os("OPJ_BLESS").is_some();
    for (path, bytes) in &expected {
        if bless {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            }
            std::fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            println!("{} ({} bytes)", path.display(), bytes.len());
        } else {
            let committed = std::fs::read(path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (OPJ_BLESS=1 writes the seed corpora)",
                    path.display()
                )
            });
            // Journals (alone or with their log) compare by content: the pages a commit
            // lands on may differ when a slow machine flushes a lazy acknowledgement on its
            // timer, and every journal has its own random id.
            let same = if path.extension().is_some_and(|e| e == "opj" || e == "pair") {
                journal_content(&committed) == journal_content(bytes)
            } else {
                committed == *bytes
            };
            assert!(
                same,
                "{} differs from what the library writes today; after a format change, \
                 rewrite the seeds with OPJ_BLESS=1",
                path.display()
            );
        }
    }
}

/// Writes an `open_file` input: the journal, and its log beside it if it holds one.
fn write_input(path: &Path, input: &[u8]) {
    let (db, log) = open_file::split(input);
    assert!(
        open_file::write(path, db, log),
        "write {} and its log",
        path.display()
    );
}

/// Every receipt and event of a journal image (with its log, if the input holds one), as
/// text.
fn journal_content(image: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let path = dir.path().join("seed.opj");
    write_input(&path, image);
    let insp = opjournal::Inspector::open(&path).unwrap_or_else(|e| panic!("open: {e}"));
    let mut out = String::new();
    insp.for_each_receipt(|r| {
        out.push_str(&format!("{r:?}\n"));
        Ok(true)
    })
    .unwrap_or_else(|e| panic!("receipts: {e}"));
    insp.for_each_event(0, |ev| {
        out.push_str(&format!("{ev:?}\n"));
        Ok(true)
    })
    .unwrap_or_else(|e| panic!("events: {e}"));
    out
}

/// Found by `open_file` in a one-hour run (2026-12-02): a journal file of 90 KB whose
/// damaged header claims 65,536 regions (256 TiB). The file is shorter than that, so
/// `repair` (and the fuzz target's checks) also tried to read it padded with zeros to the
/// claimed length, and the storage engine's allocator took a few bits per page of it:
/// over 4 GiB before libFuzzer stopped it. Padding is now tried only for claims of at most
/// 64 GiB or 16 times the file's length. What repair holds stays within its design bound:
/// the storage engine's writes to its in-memory scratch (at most 256 MiB) and its page
/// cache; this file takes about 100 MiB.
#[test]
fn repair_of_a_file_whose_header_claims_256_tib_stays_within_memory() {
    let bytes = std::fs::read(
        fuzz_dir().join("regressions/open_file/repair-oom-header-claims-256-tib-b6f8c87b"),
    )
    .expect("regression input");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.opj");
    std::fs::write(&path, &bytes).expect("write");
    let mut options = opjournal::RepairOptions::default();
    options.backup = false;
    let (outcome, usage) =
        alloc_meter::measure(|| opjournal::repair(&path, &options, &mut |_, _| {}));
    if let Err(e) = &outcome {
        assert!(open_file::damage_error(e.kind()), "{e:?}");
    }
    assert!(
        usage.peak_live < 320 << 20,
        "repair held {} MiB at its peak (largest allocation {} KiB)",
        usage.peak_live >> 20,
        usage.largest >> 10
    );
}

/// Found by a one-hour `open_file` run at `969dae0`: a journal whose tree of table
/// definitions (redb's user root) names a page of order 20. Listing the tables, in the
/// first read-only open, made redb allocate the page's 4 GiB before reading it (the run's
/// out-of-memory at 4,171 MiB). That tree's page numbers are now checked before every open
/// reads it, and the file is refused as damaged.
#[test]
fn inspecting_a_file_whose_table_tree_names_a_4_gib_page_stays_within_memory() {
    inspection_stays_within_memory_and_refuses(
        "regressions/open_file/inspect-oom-table-tree-4-gib-page-7e01a058",
        false,
    );
}

/// `open_file`, one-hour run of 2026-12-02: a journal with a log, not closed cleanly,
/// whose storage engine's system tree names a page of order 20 (4 GiB). Inspection
/// recovers such a file in memory as a writer would, and the engine loaded its recorded
/// allocator state from that page without checking it: it allocated the 4 GiB page before
/// the read, and libFuzzer stopped the process at 4 GiB. The system tree is now checked
/// before any database is opened as a writer would (in memory too), and the file is
/// refused as damaged. Every claim of the target is checked on it within a bound.
#[test]
fn inspecting_a_file_whose_system_tree_names_a_4_gib_page_stays_within_memory() {
    inspection_stays_within_memory_and_refuses(
        "regressions/open_file/inspect-oom-allocator-state-4-gib-page-e746df29",
        true,
    );
}

/// Every claim of the `open_file` target, checked on `bytes`, holds at most 320 MiB.
fn every_claim_stays_within_memory(what: &str, bytes: &[u8]) {
    let ((), usage) = alloc_meter::measure(|| open_file::check_every_claim(bytes));
    assert!(
        usage.peak_live < 320 << 20,
        "{what}: the checks held {} MiB at their peak (largest allocation {} KiB)",
        usage.peak_live >> 20,
        usage.largest >> 10
    );
}

/// Every claim of the `open_file` target checked on the regression input `name` stays
/// within a memory bound, and `Inspector::open` refuses the file as damaged without
/// changing it. `with_log`: whether the input holds a journal and its log.
fn inspection_stays_within_memory_and_refuses(name: &str, with_log: bool) {
    let bytes = std::fs::read(fuzz_dir().join(name)).expect("regression input");
    let (db, log) = open_file::split(&bytes);
    assert_eq!(log.is_some(), with_log, "whether the input holds a log");
    every_claim_stays_within_memory(name, &bytes);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.opj");
    assert!(open_file::write(&path, db, log), "the files are written");
    let err = opjournal::Inspector::open(&path).expect_err("the damaged file does not open");
    assert!(open_file::damage_error(err.kind()), "{err:?}");
    assert_eq!(
        std::fs::read(&path).ok().as_deref(),
        Some(db),
        "inspection changed the file"
    );
}

/// A journal whose branch page in one of its tables names, as its second child, a page of
/// order 20 (4 GiB): one byte changed in the `aged` seed. redb allocates a page's whole
/// size before reading it and checks only that the order is at most 20, so the first
/// read of that child (listing the table's entries, a lookup, a checkpoint's insert) took
/// 2 or 4 GiB. Every page number of the trees is now checked before anything reads the
/// file, by the inspector, by repair's source and by the writer's open.
#[test]
fn inspecting_a_file_whose_table_branch_names_a_4_gib_page_stays_within_memory() {
    inspection_stays_within_memory_and_refuses(
        "regressions/open_file/inspect-oom-table-branch-4-gib-page-48c5b200",
        false,
    );
}

/// redb's page number: index (20 bits), region (20 bits), order (5 bits, from bit 59).
fn page_number(region: u64, index: u64, order: u64) -> [u8; 8] {
    (index | region << 20 | order << 59).to_le_bytes()
}

/// The same damage, everywhere in every seed: each page of each seed journal in turn is
/// made a branch (key count 0, as redb reads any) whose one child is a page of order 20,
/// outside the file; and each child number of each branch page in turn is given order 20.
/// Every claim of `open_file` (the read-only paths, the writer's open on the disk in
/// memory, repair in place and dry) stays within 320 MiB on each, so no path follows a
/// page number the walk did not check.
#[test]
fn any_page_made_to_name_a_4_gib_page_is_refused_within_memory() {
    const PAGE: usize = 4096;
    let huge = page_number(0, 0, 20);
    let mut inputs = 0;
    for (name, input) in seed_journals() {
        let (db, log) = open_file::split(input);
        let rejoin = |db: &[u8]| match log {
            Some(log) => open_file::join(db, log),
            None => db.to_vec(),
        };
        let mut damaged: Vec<(String, Vec<u8>)> = Vec::new();
        for page in 1..db.len() / PAGE {
            let at = page * PAGE;
            // A branch: type 2, key count 0, then one checksum (16 bytes), one child.
            let mut made = db.to_vec();
            made[at] = 2;
            made[at + 2..at + 4].copy_from_slice(&0u16.to_le_bytes());
            made[at + 24..at + 32].copy_from_slice(&huge);
            damaged.push((format!("{name}: page {page} made a branch"), rejoin(&made)));
            if db[at] == 2 {
                let keys = usize::from(u16::from_le_bytes([db[at + 2], db[at + 3]]));
                let pages_at = at + 8 + 16 * (keys + 1);
                for child in 0..=keys {
                    let order_byte = pages_at + 8 * child + 7;
                    let mut made = db.to_vec();
                    made[order_byte] = (made[order_byte] & 0x07) | (20 << 3);
                    damaged.push((
                        format!("{name}: child {child} of branch page {page} given order 20"),
                        rejoin(&made),
                    ));
                }
            }
        }
        for (what, bytes) in damaged {
            every_claim_stays_within_memory(&what, &bytes);
            inputs += 1;
        }
    }
    assert!(inputs > 100, "only {inputs} damaged inputs were checked");
}

/// The writer refuses that file before the storage engine reads it, whatever its page
/// check size (every page, or the branch walk of a large file: the damaged number is a
/// branch's child), and says what to do; the file is left as it was, with no log beside
/// it, and after `repair` the journal opens for writing.
#[test]
fn a_writer_refuses_a_file_whose_table_branch_names_a_4_gib_page_at_any_page_check_size() {
    let input =
        fuzz_dir().join("regressions/open_file/inspect-oom-table-branch-4-gib-page-48c5b200");
    let bytes = std::fs::read(input).expect("regression input");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.opj");
    for size in [None, Some(0), Some(u64::MAX)] {
        std::fs::write(&path, &bytes).expect("write");
        let (opened, usage) = alloc_meter::measure(|| {
            let mut builder = opjournal::Journal::builder();
            if let Some(size) = size {
                builder = builder.page_check_size(size);
            }
            builder.open(&path)
        });
        let err = opened.expect_err("the damaged file does not open for writing");
        assert!(
            matches!(err.kind(), opjournal::ErrorKind::Corrupt { .. }),
            "{size:?}: {err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("outside the file") && message.contains("opjournal repair"),
            "{size:?}: {message}"
        );
        assert!(
            usage.peak_live < 64 << 20,
            "{size:?}: {} MiB",
            usage.peak_live >> 20
        );
        assert_eq!(
            std::fs::read(&path).expect("read"),
            bytes,
            "{size:?}: the file changed"
        );
        assert!(
            !opjournal::FileLog::path_for(&path).exists(),
            "{size:?}: a log was created"
        );
    }
    opjournal::repair(&path, &opjournal::RepairOptions::default(), &mut |_, _| {}).expect("repair");
    opjournal::Journal::open(&path)
        .expect("the repaired journal opens for writing")
        .close()
        .expect("close");
}
