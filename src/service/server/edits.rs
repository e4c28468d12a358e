//! The editor thread: applies fresh operations one at a time, saves the effect, records the
//! outcome, and answers everyone waiting for it.

use super::*;

impl Shared {
    /// The editor thread: applies fresh operations one at a time, in the order accepted.
    pub(super) fn edit_loop(self: Arc<Self>, jobs: Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            lock(&self.live).editing = true;
            if let Err(e) = self.execute(&job) {
                self.note(chain(&e));
            }
            let mut live = lock(&self.live);
            live.editing = false;
            self.changed.notify_all();
        }
    }

    /// A fresh operation: apply, record, answer. Every path ends the operation in the
    /// journal (complete or release) before answering, except a journal that cannot be
    /// written at all (then the next start settles it from the document).
    pub(super) fn execute(&self, job: &Job) -> Result<(), ServiceError> {
        let claim = &job.claim;
        let id = claim.operation_id();
        let verdict = self.pauses.reach(Stage::Accepted, id);
        if verdict == Verdict::Crash {
            return Ok(());
        }
        let journal = self.journal()?;
        // 1. The effect: apply the edit and save it in the document.
        let applied = {
            let mut doc = lock(&self.document);
            let Some(store) = doc.as_mut() else {
                return Err(ServiceError::Unavailable);
            };
            store.apply(id, &job.edit, journal.now(), || {
                if verdict == Verdict::Panic {
                    panic!("injected fault: the edit of `{id}` panicked");
                }
            })
        };
        let (revision, summary) = match applied {
            Ok(done) => done,
            Err(failure) => return self.unapplied(&journal, claim, &job.edit, failure),
        };
        if self.pauses.reach(Stage::Mutated, id) == Verdict::Crash {
            return Ok(());
        }
        // 2. The outcome, durable before `complete` returns: from now on the id is
        //    answered with this result, never executed again.
        let result = OpResult {
            bytes: payload(&summary),
            changed_assets: job.edit.changed_assets(),
        };
        let outcome = Outcome::applied(revision, result.bytes.clone())
            .changed_assets(result.changed_assets.clone());
        let completed = journal.complete(claim, outcome);
        if let Err(e) = completed {
            self.finish(id, Answer::Unrecorded(e.to_string()), &journal);
            return Err(journal_error(&format!("record the outcome of `{id}`"), e));
        }
        if self.pauses.reach(Stage::Committed, id) == Verdict::Crash {
            return Ok(());
        }
        // 3. Answer the owner's current connection and every attached one. Without any,
        //    the result waits for the session's next `hello`.
        self.finish(id, Answer::Result(result), &journal);
        self.snapshot_if_due(&journal);
        Ok(())
    }

    /// The edit did not change the document as asked: end the operation at once.
    pub(super) fn unapplied(
        &self,
        journal: &Journal,
        claim: &Claim,
        edit: &Edit,
        failure: ApplyError,
    ) -> Result<(), ServiceError> {
        let id = claim.operation_id();
        let (answer, ended) = match failure {
            // Refused before any change: give the id back, so a corrected retry runs.
            ApplyError::Refused(reason) => (
                Answer::Rejected(format!("cannot {}: {reason}", edit.describe())),
                journal.release(claim).map(drop),
            ),
            ApplyError::Panicked(message) => (
                Answer::Released {
                    reason: format!(
                        "the editor failed while applying {} ({message}); nothing changed",
                        edit.describe()
                    ),
                    retry: false,
                },
                journal.release(claim).map(drop),
            ),
            ApplyError::NotSaved(e) => {
                self.note(format!("`{id}` not applied: {}", chain(&e)));
                (
                    Answer::Released {
                        reason: format!(
                            "the document could not be saved ({}); nothing changed",
                            chain(&e)
                        ),
                        retry: true,
                    },
                    journal.release(claim).map(drop),
                )
            }
            // The edit may be in the file: that is an outcome, recorded as a failure and
            // replayed like one. The document is reloaded from its files, to be what a
            // restart would see.
            ApplyError::Uncertain(e) => {
                self.note(format!("`{id}` may or may not be saved: {}", chain(&e)));
                let message = format!(
                    "the document may or may not have saved {} ({}); refresh before going on",
                    edit.describe(),
                    chain(&e)
                );
                self.reload_document(journal);
                match journal.complete(claim, Outcome::failed(message)) {
                    Ok(_) => {
                        let result = OpResult::default();
                        self.finish(id, Answer::Result(result), journal);
                        return Ok(());
                    }
                    Err(e) => (Answer::Unrecorded(e.to_string()), Err(e)),
                }
            }
        };
        match ended {
            Ok(()) => {
                self.finish(id, answer, journal);
                Ok(())
            }
            Err(e) => {
                self.finish(id, Answer::Unrecorded(e.to_string()), journal);
                Err(journal_error(&format!("end `{id}`"), e))
            }
        }
    }

    /// After a save that may have half-happened: the document becomes what its files say.
    pub(super) fn reload_document(&self, journal: &Journal) {
        let mut doc = lock(&self.document);
        match DocumentStore::open(
            &self.cfg.document,
            self.cfg.applied_retention,
            journal.now(),
        ) {
            Ok(mut store) => {
                store.snapshot_every = self.cfg.snapshot_every;
                let revision = store.document().revision();
                if let Err(e) = journal.advance_revision(SCOPE, revision) {
                    self.note(format!("could not report revision {revision}: {e}"));
                }
                *doc = Some(store);
            }
            Err(e) => self.note(format!(
                "could not reload the document, keeping it as it was in memory: {}",
                chain(&e)
            )),
        }
    }

    pub(super) fn snapshot_if_due(&self, journal: &Journal) {
        let mut doc = lock(&self.document);
        if let Some(store) = doc.as_mut()
            && store.snapshot_due()
            && let Err(e) = store.write_snapshot(journal.now())
        {
            self.note(format!(
                "could not write a snapshot of the document (the log keeps every edit; retried after the next edit): {}",
                chain(&e)
            ));
        }
    }

    /// Ends `id`'s execution: sends its answer to the owner's current connection and to
    /// every connection attached to it. A result is recorded as one delivery per copy; the
    /// first copy is the new execution's, every other one is marked as a replay.
    pub(super) fn finish(&self, id: &str, answer: Answer, journal: &Journal) {
        let recipients: Vec<Arc<Conn>> = {
            let mut live = lock(&self.live);
            let Some(ex) = live.executing.remove(id) else {
                return;
            };
            let mut out: Vec<Arc<Conn>> = Vec::new();
            let owner = self.session_conn(&live, &ex.owner);
            for c in owner.into_iter().chain(
                ex.attached
                    .iter()
                    .filter_map(|c| live.conns.get(c).cloned()),
            ) {
                if !out.iter().any(|o| o.id == c.id) {
                    out.push(c);
                }
            }
            self.changed.notify_all();
            out
        };
        let reply = |first: bool| -> Option<Reply> {
            Some(match &answer {
                Answer::Result(result) => {
                    let receipt = match journal.delivered(id) {
                        Ok(r) => r,
                        Err(e) => {
                            self.note(format!("could not record a delivery of `{id}`: {e}"));
                            return None;
                        }
                    };
                    Reply::Result(result_msg(&receipt, result, !first))
                }
                Answer::Rejected(reason) => Reply::Rejected {
                    id: id.to_string(),
                    reason: reason.clone(),
                },
                Answer::Released { reason, retry } => Reply::Released {
                    id: id.to_string(),
                    reason: reason.clone(),
                    retry: *retry,
                },
                Answer::Unrecorded(message) => Reply::Error {
                    id: Some(id.to_string()),
                    kind: "unavailable".into(),
                    message: format!(
                        "the outcome of `{id}` could not be recorded ({message}); ask with `status` after the service restarts"
                    ),
                },
            })
        };
        let sends: Vec<(Arc<Conn>, Reply)> = recipients
            .into_iter()
            .enumerate()
            .filter_map(|(i, conn)| reply(i == 0).map(|r| (conn, r)))
            .collect();
        if sends.is_empty() {
            return;
        }
        // Each copy is written by a thread of its own: a client that stops reading blocks a
        // write for up to `write_timeout` (and then loses its connection), and neither the
        // editor thread (every client's edits wait behind it) nor the other recipients may
        // wait for it. The deliveries are recorded above, before any copy is sent.
        for (conn, r) in sends {
            if let Err(e) = conn.send_detached(r) {
                self.note(format!(
                    "could not start a thread to send the answer of `{id}` (the client gets it by `status` or on its next `hello`): {e}"
                ));
            }
        }
    }
}
