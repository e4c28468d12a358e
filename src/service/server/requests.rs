//! Requests: `hello`, `submit`, `ack` and `status`, each answered from the journal.

use super::*;

impl Shared {
    /// Answers one request. `Err` ends the connection (it could not be answered).
    pub(super) fn handle(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        request: Request,
    ) -> Result<(), ServiceError> {
        let session = lock(&conn.session).clone();
        let answer = match (request, session) {
            (Request::Hello { session }, _) => return self.hello(conn, session),
            (Request::Submit { id, .. } | Request::Ack { id } | Request::Status { id }, None) => {
                Reply::Error {
                    id: Some(id),
                    kind: "bad_request".into(),
                    message: "say `hello` with your session first".into(),
                }
            }
            (
                Request::Submit {
                    id,
                    base_revision,
                    edit,
                },
                Some(session),
            ) => match self.submit(conn, &session, &id, base_revision, edit) {
                Ok(Some(reply)) => reply,
                Ok(None) => return Ok(()),
                Err(e) => refusal(Some(id), &e),
            },
            (Request::Ack { id }, Some(session)) => self
                .ack(&id, &session)
                .unwrap_or_else(|e| refusal(Some(id), &e)),
            (Request::Status { id }, Some(_)) => {
                self.status(&id).unwrap_or_else(|e| refusal(Some(id), &e))
            }
        };
        conn.send(&answer).map_err(|source| ServiceError::Io {
            what: "send a reply".into(),
            source,
        })
    }

    /// `hello`: the connection becomes the session's, then whatever the session has not
    /// acknowledged is pushed again, as long as its retry budget lasts (the journal says
    /// when it is spent).
    pub(super) fn hello(&self, conn: &Arc<Conn>, session: String) -> Result<(), ServiceError> {
        if let Err(e) = validate_name("session", &session) {
            let reply = refusal(None, &journal_error("accept the session", e));
            return conn.send(&reply).map_err(|source| ServiceError::Io {
                what: "send a refusal".into(),
                source,
            });
        }
        {
            let mut live = lock(&self.live);
            live.sessions.insert(session.clone(), conn.id);
            *lock(&conn.session) = Some(session.clone());
        }
        let journal = self.journal()?;
        let waiting = journal
            .undelivered(&session)
            .doing(|| format!("list the results waiting for `{session}`"))?;
        // Record each delivery before sending it, and announce only what will be sent.
        let mut pushes = Vec::with_capacity(waiting.len());
        for r in waiting {
            let id = r.receipt.operation_id.clone();
            match journal.delivered(&id) {
                Ok(receipt) => pushes.push(Reply::Result(result_msg(&receipt, &r.result, true))),
                Err(e) if e.is_refusal() => {} // retired or expired since the listing
                Err(source) => {
                    return Err(ServiceError::Journal {
                        what: format!("record a delivery of `{id}`"),
                        source,
                    });
                }
            }
        }
        let welcome = Reply::Welcome {
            session,
            scope: SCOPE.into(),
            revision: self.revision()?,
            pushing: pushes.len(),
        };
        for reply in std::iter::once(&welcome).chain(&pushes) {
            conn.send(reply).map_err(|source| ServiceError::Io {
                what: "send the welcome and the pushed results".into(),
                source,
            })?;
        }
        Ok(())
    }

    /// `submit`: ask the journal first; only a fresh operation is executed. `Ok(None)`
    /// when the answer was already sent.
    pub(super) fn submit(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        session: &str,
        id: &str,
        base_revision: u64,
        edit: Edit,
    ) -> Result<Option<Reply>, ServiceError> {
        // Refused before anything is recorded: a name too long for the outcome's changed
        // asset would be applied and then fail to be recorded.
        edit.validate()
            .map_err(|e| journal_error(&format!("submit `{id}`"), e))?;
        let intent = edit.intent().doing(|| format!("describe `{id}`"))?;
        let op = Operation::new(id, intent)
            .scope(SCOPE)
            .base_revision(base_revision)
            .session(session);
        let journal = self.journal()?;
        // A second round only after settling an in-doubt operation or finding that an
        // attached operation ended meanwhile; the third answers whatever the journal says.
        for round in 0..3 {
            let admission = match self.ask_journal(conn, &journal, &op, base_revision, &edit)? {
                Step::Answered(reply) => return Ok(reply),
                Step::Known(admission) => *admission,
            };
            match admission {
                // New work, durably recorded as running: the editor thread applies it.
                Admission::Fresh(claim) => return self.accept(conn, session, claim, edit),
                // The same operation is executing: attach to it; its answer will follow.
                Admission::InProgress(r) => {
                    let mut live = lock(&self.live);
                    // The thread that was admitted records the execution right after the
                    // journal's answer: wait a moment for it (or for any change) before
                    // asking the journal again.
                    if !live.executing.contains_key(id) {
                        live = match self.changed.wait_timeout(live, ATTACH_WAIT) {
                            Ok((guard, _)) => guard,
                            Err(poisoned) => poisoned.into_inner().0,
                        };
                    }
                    if let Some(ex) = live.executing.get_mut(id) {
                        if !ex.attached.contains(&conn.id) {
                            ex.attached.push(conn.id);
                        }
                        return Ok(Some(Reply::Running {
                            id: id.to_string(),
                            since: r.submitted_at,
                        }));
                    }
                    // It ended between the two looks: ask the journal again.
                    if round == 2 {
                        return Ok(Some(Reply::Error {
                            id: Some(id.to_string()),
                            kind: "unavailable".into(),
                            message: format!(
                                "`{id}` is recorded as running but is not being applied here; ask with `status` after a backoff"
                            ),
                        }));
                    }
                }
                // Done before: answer with the recorded outcome. Never re-applied.
                Admission::Replay(replay) => {
                    let receipt = journal
                        .delivered(id)
                        .doing(|| format!("record a delivery of `{id}`"))?;
                    return Ok(Some(Reply::Result(result_msg(
                        &receipt,
                        &replay.result,
                        true,
                    ))));
                }
                // The result is gone: it aged out, or damage took it (a repair found it lost).
                // Say which; do not run it again.
                Admission::Expired(r) => {
                    let repaired_at = match r.retire_cause {
                        Some(RetireCause::Damage { repaired_at }) => Some(repaired_at),
                        _ => None,
                    };
                    return Ok(Some(Reply::Expired {
                        id: id.to_string(),
                        applied: r.applied == Some(true),
                        revision: r.result_revision,
                        completed_at: r.completed_at,
                        current_revision: self.revision()?,
                        reason: if repaired_at.is_some() {
                            "damage"
                        } else {
                            "retention"
                        }
                        .into(),
                        repaired_at,
                    }));
                }
                // Its execution ended without an outcome (a lease that ran out, a restart):
                // look at the document and record what happened, then answer from that.
                Admission::InDoubt(r) => {
                    let executing = lock(&self.live).executing.contains_key(id);
                    if executing || round == 2 {
                        return Ok(Some(Reply::InDoubt {
                            id: id.to_string(),
                            since: r.submitted_at,
                        }));
                    }
                    let applied = self.applied(id)?;
                    let settled = reconcile(&journal, applied.as_ref(), &r)?;
                    self.note(describe_reconciled(&settled));
                }
            }
        }
        Err(ServiceError::Unavailable)
    }

    /// Asks the journal about `op`: a plain `submit`, or with the document in a database,
    /// the whole edit in one transaction (a fresh operation is then answered already).
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    fn ask_journal(
        &self,
        conn: &Arc<Conn>,
        journal: &Journal,
        op: &Operation,
        base_revision: u64,
        edit: &Edit,
    ) -> Result<Step, ServiceError> {
        #[cfg(feature = "postgres")]
        if let Some(db) = &self.database {
            return self.execute_in_database(db, conn, journal, op, base_revision, edit);
        }
        journal
            .submit(op.clone())
            .map(|a| Step::Known(Box::new(a)))
            .doing(|| format!("submit `{}`", op.id))
    }

    /// A fresh operation: attach the submitting session, answer `accepted`, and hand it to
    /// the editor thread.
    pub(super) fn accept(
        &self,
        conn: &Arc<Conn>,
        session: &str,
        claim: Claim,
        edit: Edit,
    ) -> Result<Option<Reply>, ServiceError> {
        let id = claim.operation_id().to_string();
        lock(&self.live).executing.insert(
            id.clone(),
            Execution {
                owner: session.to_string(),
                // The submitting connection hears the answer even when its session has a
                // newer connection (which hears it too): `accepted` promises it.
                attached: vec![conn.id],
            },
        );
        self.changed.notify_all();
        let accepted = Reply::Accepted {
            id: id.clone(),
            attempt: claim.attempt(),
        };
        let _ = conn.send(&accepted);
        let sent = match lock(&self.edits).as_ref() {
            Some(tx) => tx.try_send(Job { claim, edit }).map_err(|e| match e {
                TrySendError::Full(job) | TrySendError::Disconnected(job) => job,
            }),
            None => Err(Job { claim, edit }),
        };
        if let Err(job) = sent {
            // The editor thread cannot take it: end it now, nothing was applied.
            let journal = self.journal()?;
            let released = journal.release(&job.claim);
            self.finish(
                &id,
                Answer::Released {
                    reason: "the editor is stopping or overloaded and did not apply the edit"
                        .into(),
                    retry: true,
                },
                &journal,
            );
            released.doing(|| format!("release `{id}`"))?;
        }
        Ok(None)
    }

    pub(super) fn ack(&self, id: &str, session: &str) -> Result<Reply, ServiceError> {
        validate_name("operation id", id).map_err(|e| journal_error("acknowledge", e))?;
        let journal = self.journal()?;
        let late = journal
            .lookup(id)
            .doing(|| format!("look up `{id}`"))?
            .is_some_and(|r| r.delivery == Some(crate::DeliveryState::AckExpired));
        // The journal refuses another session's result (`NotOwner`).
        journal
            .acknowledge(id, Some(session))
            .doing(|| format!("acknowledge `{id}`"))?;
        Ok(Reply::Acked {
            id: id.to_string(),
            late,
        })
    }

    pub(super) fn status(&self, id: &str) -> Result<Reply, ServiceError> {
        validate_name("operation id", id).map_err(|e| journal_error("look up", e))?;
        let journal = self.journal()?;
        // The events are kept after the receipt is gone (a released operation's): listed
        // either way.
        let history = journal
            .history(id)
            .doing(|| format!("read the history of `{id}`"))?
            .iter()
            .map(|ev| match &ev.kind {
                EventKind::LeaseExpired {
                    cause: InDoubtCause::Reopened,
                    ..
                } => "in_doubt:reopened".to_string(),
                EventKind::LeaseExpired { .. } => "in_doubt:lease_expired".to_string(),
                other => other.name().to_string(),
            })
            .collect();
        let Some(r) = journal.lookup(id).doing(|| format!("look up `{id}`"))? else {
            return Ok(Reply::Status(StatusMsg {
                id: id.to_string(),
                state: "unknown".into(),
                revision: None,
                delivery: None,
                deliveries: 0,
                ack_deadline: None,
                history,
            }));
        };
        Ok(Reply::Status(StatusMsg {
            id: id.to_string(),
            state: r.status.name().to_string(),
            revision: r.result_revision,
            delivery: r.delivery.map(|d| d.name().to_string()),
            deliveries: r.delivery_count,
            ack_deadline: r.ack_deadline,
            history,
        }))
    }
}
