//! `opjournal demo`: the main job. (Being rewritten as a full socket session; this first
//! version runs the failure window in-process and prints what happened.)

use std::path::PathBuf;
use std::process::ExitCode;

use opjournal::{Admission, Intent, Journal, Operation, Outcome};

/// Arguments of `opjournal demo`.
#[derive(Debug, Clone)]
pub(crate) struct DemoArgs {
    pub journal: Option<PathBuf>,
    pub keep: bool,
}

pub(crate) fn run(args: &DemoArgs) -> ExitCode {
    match session(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn session(args: &DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = args
        .journal
        .clone()
        .unwrap_or_else(|| dir.path().join("demo.opj"));
    let journal = Journal::open(&path)?;
    let intent = Intent::from_json("scene.add_light", &serde_json::json!({"near": "door"}))?;
    let op = Operation::new("op_7f3", intent)
        .scope("scene/main")
        .base_revision(0);
    let Admission::Fresh(claim) = journal.submit(op.clone())? else {
        return Err("op_7f3 was not fresh".into());
    };
    journal.complete(&claim, Outcome::applied(1, b"light-1".to_vec()))?;
    println!("op_7f3 applied at revision 1 (new execution)");
    drop(journal);
    let journal = Journal::open(&path)?;
    if let Admission::Replay(r) = journal.submit(op)? {
        println!(
            "op_7f3 already completed at revision {} (replayed, delivery {})",
            r.receipt.result_revision.unwrap_or(0),
            r.receipt.delivery_count + 1
        );
    }
    if args.keep || args.journal.is_some() {
        let kept = dir.keep();
        println!("journal kept at {}", kept.join("demo.opj").display());
    }
    Ok(())
}
