//! The `tracing` feature: a span for each public `Journal` call, with its operation id,
//! and an event for each compaction pass. The tests enable the feature (the crate's
//! dev-dependency on itself), so `cargo test` runs these too.
#![cfg(feature = "tracing")]

mod common;

use std::sync::{Arc, Mutex};

use common::{Env, add_light};
use opjournal::{Admission, Operation, Outcome};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Records span names with their `operation_id`, and event messages.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<String>>>,
    next: Arc<Mutex<u64>>,
}

#[derive(Default)]
struct Fields(Vec<String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={value:?}", field.name()));
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields::default();
        span.record(&mut fields);
        let mut seen = self.seen.lock().expect("lock");
        seen.push(format!(
            "span {} {}",
            span.metadata().name(),
            fields.0.join(" ")
        ));
        let mut next = self.next.lock().expect("lock");
        *next += 1;
        Id::from_u64(*next)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut seen = self.seen.lock().expect("lock");
        seen.push(format!("event {}", fields.0.join(" ")));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn journal_calls_open_spans_with_their_operation_id_and_compaction_reports_its_counts()
-> opjournal::Result<()> {
    let recorder = Recorder::default();
    let seen = recorder.seen.clone();
    tracing::subscriber::with_default(recorder, || -> opjournal::Result<()> {
        let env = Env::new();
        let journal = env.open();
        let Admission::Fresh(claim) =
            journal.submit(Operation::new("op_7f3", add_light("door")))?
        else {
            panic!("fresh");
        };
        journal.complete(&claim, Outcome::applied(1, Vec::new()))?;
        journal.acknowledge("op_7f3", None)?;
        journal.compact()?;
        Ok(())
    })?;
    let seen = seen.lock().expect("lock").clone();
    let has = |prefix: &str| seen.iter().any(|s| s.starts_with(prefix));
    assert!(has("span open path="), "{seen:#?}");
    assert!(has("span submit operation_id=op_7f3"), "{seen:#?}");
    assert!(has("span complete operation_id=op_7f3"), "{seen:#?}");
    assert!(has("span acknowledge operation_id=op_7f3"), "{seen:#?}");
    assert!(has("span compact"), "{seen:#?}");
    // Written on a thread of the journal's own (see `Inner::checkpoint`), still seen by
    // a subscriber set for this thread only.
    assert!(
        seen.iter()
            .any(|s| s.starts_with("event") && s.contains("message=checkpoint")),
        "{seen:#?}"
    );
    assert!(
        seen.iter().any(|s| s.starts_with("event")
            && s.contains("message=compaction pass")
            && s.contains("lease_expired=0")),
        "{seen:#?}"
    );
    Ok(())
}
