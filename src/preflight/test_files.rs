//! Files for the pre-flight checks' unit tests: a journal with a recorded allocator state
//! and lists of freed pages, and a reader over bytes in memory.

/// Reads from `bytes` as the checks read a file.
pub(super) fn reader(bytes: &[u8]) -> impl FnMut(u64, &mut [u8]) -> std::io::Result<()> + '_ {
    move |at, buf| {
        let at = usize::try_from(at).map_err(std::io::Error::other)?;
        let src = bytes
            .get(at..at + buf.len())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// A journal that checkpointed many times, closed cleanly: its file holds a recorded
/// allocator state and lists of freed pages, as every long-lived journal does.
pub(super) fn journal_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("j.opj");
    let journal = crate::Journal::builder()
        .checkpoint_size(64 * 1024)
        .open(&path)
        .expect("open");
    for i in 0..400 {
        let intent =
            crate::Intent::from_json("t.op", &serde_json::json!({ "i": i })).expect("intent");
        let op = crate::Operation::new(format!("op_{i}"), intent).scope(format!("s/{}", i % 7));
        match journal.submit(op).expect("submit") {
            crate::Admission::Fresh(claim) => {
                journal
                    .complete(&claim, crate::Outcome::applied(i + 1, vec![7u8; 900]))
                    .expect("complete");
            }
            other => panic!("fresh id answered {other:?}"),
        }
    }
    journal.close().expect("close");
    path
}

/// The bytes of [`journal_file`].
pub(super) fn journal_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::read(journal_file(dir.path())).expect("read")
}
