//! A probe of redb alone for the replay lookup's storage layout (not a benchmark against a
//! competitor): what a replay of a random id costs, and what the file takes on disk, with
//! the result stored as opjournal stores it today (the receipt under its operation id, the
//! result under its sequence number in another table: two B-tree descents per replay) and
//! with the result inlined in the receipt's value (one descent).
//!
//! ```text
//! cargo run --release -p opjournal-tools --bin replay_layout -- [N]      (default 100000)
//! ```
//!
//! Values have the sizes the benchmark's journal stores per operation (receipt 217 B,
//! result 1,061 B with its header); they are written in transactions of 1,500 operations
//! (about one checkpoint of a 4 MiB log), then every receipt is rewritten once
//! (the acknowledgement), as checkpoints do. Ids are either sequential (`op-0000001`, as
//! the benchmark's) or random (32 hex digits, as UUIDs). Lookups copy the answer out, as
//! a replay does; they run after a warm-up pass over the same ids, with a 1 GiB cache.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const RECEIPTS: TableDefinition<&str, &[u8]> = TableDefinition::new("receipts");
const RESULTS: TableDefinition<u64, &[u8]> = TableDefinition::new("results");
const RECEIPT_BYTES: usize = 217;
const RESULT_BYTES: usize = 1061;
const PER_TXN: u64 = 1500;
const LOOKUPS: usize = 400_000;

/// splitmix64's finalizer: a fixed permutation, so runs are repeatable.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn op_id(i: u64, random: bool) -> String {
    if random {
        format!("{:016x}{:016x}", mix(i), mix(i ^ 0x9e37_79b9_7f4a_7c15))
    } else {
        format!("op-{i:07}")
    }
}

fn allocated(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)?.blocks() * 512)
}

struct Row {
    len: f64,
    disk: f64,
    lookup_us: f64,
}

fn probe(dir: &Path, n: u64, random: bool, inline: bool) -> Result<Row> {
    let path = dir.join(format!("probe-{random}-{inline}.redb"));
    let _ = std::fs::remove_file(&path);
    let db = Database::builder().set_cache_size(1 << 30).create(&path)?;
    let receipt = vec![7u8; RECEIPT_BYTES];
    let result = vec![9u8; RESULT_BYTES];
    let mut inlined = receipt.clone();
    inlined.extend_from_slice(&result);
    let mut first = 0;
    while first < n {
        let txn = db.begin_write()?;
        {
            let mut receipts = txn.open_table(RECEIPTS)?;
            let mut results = txn.open_table(RESULTS)?;
            for i in first..(first + PER_TXN).min(n) {
                let id = op_id(i, random);
                if inline {
                    receipts.insert(id.as_str(), inlined.as_slice())?;
                } else {
                    receipts.insert(id.as_str(), receipt.as_slice())?;
                    results.insert(i, result.as_slice())?;
                }
            }
        }
        txn.commit()?;
        first += PER_TXN;
    }
    // The acknowledgement rewrites every receipt once, in completion order.
    let mut first = 0;
    while first < n {
        let txn = db.begin_write()?;
        {
            let mut receipts = txn.open_table(RECEIPTS)?;
            for i in first..(first + PER_TXN).min(n) {
                let id = op_id(i, random);
                let mut value = receipts
                    .get(id.as_str())?
                    .ok_or("a receipt written above is missing")?
                    .value()
                    .to_vec();
                value[0] = 8;
                receipts.insert(id.as_str(), value.as_slice())?;
            }
        }
        txn.commit()?;
        first += PER_TXN;
    }
    let len = std::fs::metadata(&path)?.len();
    let disk = allocated(&path)?;
    let txn = db.begin_read()?;
    let receipts = txn.open_table(RECEIPTS)?;
    let results = txn.open_table(RESULTS)?;
    let mut state = 1u64;
    let picks: Vec<(String, u64)> = (0..LOOKUPS)
        .map(|_| {
            state = mix(state);
            let i = state % n;
            (op_id(i, random), i)
        })
        .collect();
    let mut lookup_us = 0.0;
    for pass in 0..2 {
        let start = Instant::now();
        let mut bytes = 0usize;
        for (id, seq) in &picks {
            let mut answer = receipts
                .get(id.as_str())?
                .ok_or("a receipt is missing")?
                .value()
                .to_vec();
            if !inline {
                answer.extend_from_slice(results.get(*seq)?.ok_or("a result is missing")?.value());
            }
            bytes += answer.len();
        }
        if bytes != picks.len() * (RECEIPT_BYTES + RESULT_BYTES) {
            return Err("an answer has the wrong length".into());
        }
        if pass == 1 {
            lookup_us = start.elapsed().as_secs_f64() * 1e6 / picks.len() as f64;
        }
    }
    drop((receipts, results, txn, db));
    std::fs::remove_file(&path)?;
    Ok(Row {
        len: len as f64 / n as f64,
        disk: disk as f64 / n as f64,
        lookup_us,
    })
}

fn main() -> Result<()> {
    let n: u64 = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 100_000,
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/replay-layout");
    std::fs::create_dir_all(&dir)?;
    println!("redb alone, {n} operations, receipt {RECEIPT_BYTES} B + result {RESULT_BYTES} B");
    println!(
        "{:<12} {:<34} {:>14} {:>16} {:>12}",
        "ids", "layout", "file B/op", "on disk B/op", "lookup µs"
    );
    for random in [false, true] {
        let mut rows = Vec::new();
        for inline in [false, true] {
            rows.push(probe(&dir, n, random, inline)?);
        }
        for (inline, row) in [false, true].iter().zip(&rows) {
            println!(
                "{:<12} {:<34} {:>14.0} {:>16.0} {:>12.2}",
                if random { "random" } else { "sequential" },
                if *inline {
                    "result inlined in the receipt"
                } else {
                    "receipt + result by seq (today)"
                },
                row.len,
                row.disk,
                row.lookup_us
            );
        }
        println!(
            "{:<12} inlined / today: lookup time {:.2}×, on disk {:.2}×",
            "",
            rows[1].lookup_us / rows[0].lookup_us,
            rows[1].disk / rows[0].disk
        );
    }
    Ok(())
}
