//! The background compactor and a file's single writer: dropping the journal ends the
//! compactor quietly and leaves the file free to reopen at once. The clocks at their exact
//! edges, the compactor's passes and the lazy commits are conformance bodies run on every
//! backend (tests/conformance.rs).

mod common;

use std::time::Duration;

use common::Env;

#[test]
fn background_compactor_ends_quietly_when_the_journal_is_dropped() {
    let env = Env::new();
    let journal = env.open();
    let handle = journal.spawn_compactor(Duration::from_millis(1));
    drop(journal);
    // The journal can be reopened at once: the compactor does not keep it open.
    let reopened = env.builder().open(&env.path);
    assert!(reopened.is_ok(), "{reopened:?}");
    drop(handle);
}
