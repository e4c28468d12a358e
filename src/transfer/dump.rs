//! The dump: a journal as JSON Lines (`opjournal export --dump`), and `import_dump`, which
//! builds a new journal from one.
//!
//! A dump holds what a journal needs and nothing derived: its meta (format, creation, the
//! clock high-water mark and the next sequence number), every event (the source of truth),
//! and every stored result payload. Indexes (receipts, scopes, timers, windows...) are
//! rebuilt on import by replaying the events with the writer's own code, as `repair` does.
//! Lines, each `{"type": ..., "data": {...}}` (docs/cli.md):
//!
//! 1. `dump`: `dump_version`, `format_version`, `created_at`, `created_by`, `upgraded`
//!    (`null` or `{"from", "at"}`), `clock_high_water`, `next_seq`;
//! 2. `event`, in seq order: as `export` writes them (`seq`, `at`, `operation_id`, `kind`,
//!    `detail`);
//! 3. `result`, in seq order: as `export --results` writes them, plus `seq` (the completing
//!    event's); `content` is the exact payload: its text (`utf8`, not escaped) or its bytes
//!    as lowercase hex digits (`hex`);
//! 4. `dump_end`: `events`, `results` (so a dump cut short is recognized).
//!
//! The `quarantine` table (records `repair` moved aside) is not part of a dump.

use std::io::{BufRead, Write};
use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::clock::Timestamp;
use crate::codec::FORMAT_VERSION;
use crate::error::{Error, ErrorKind, Result};
use crate::index::{self, Layered, View};
use crate::inspect::Inspector;
use crate::log;
use crate::machine;
use crate::record::{
    CheckpointRecord, Event, EventKind, ExecRecord, FormatRecord, ResolvedAs, StateRecord, Upgrade,
};
use crate::types::{self as api, OpResult};

use super::writer::{NewJournal, refuse_existing};

/// The version of the dump format this build writes and reads.
pub const DUMP_VERSION: u32 = 1;

/// What [`Inspector::export_dump`] wrote.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DumpReport {
    /// `event` lines.
    pub events: u64,
    /// `result` lines.
    pub results: u64,
}

/// What [`import_dump`] built.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ImportReport {
    /// Events replayed.
    pub events: u64,
    /// Result payloads stored.
    pub results: u64,
    /// Receipts the events rebuilt.
    pub receipts: u64,
    /// The new journal's size in bytes.
    pub file_bytes: u64,
}

fn write_line(out: &mut dyn Write, ty: &str, data: &Value) -> Result<()> {
    (|| -> std::io::Result<()> {
        write!(out, "{{\"type\":")?;
        serde_json::to_writer(&mut *out, ty)?;
        write!(out, ",\"data\":")?;
        serde_json::to_writer(&mut *out, data)?;
        out.write_all(b"}\n")
    })()
    .map_err(|e| Error::io_while("write the dump", "the journal is unchanged", e))
}

/// An event as `export` shows it: `kind` by name, its fields in `detail`, causes in
/// snake_case.
pub(crate) fn event_value(ev: &api::Event) -> Value {
    let mut detail = match serde_json::to_value(&ev.kind).unwrap_or(Value::Null) {
        Value::Object(map) => map.into_iter().next().map_or(json!({}), |(_, v)| v),
        _ => json!({}),
    };
    if let Value::Object(map) = &mut detail
        && let Some(Value::String(cause)) = map.get_mut("cause")
    {
        *cause = snake(cause);
    }
    json!({
        "seq": ev.seq,
        "at": ev.at,
        "operation_id": ev.operation_id,
        "kind": ev.kind.name(),
        "detail": detail,
    })
}

fn snake(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn pascal(s: &str) -> String {
    s.split('_')
        .map(|part| {
            let mut c = part.chars();
            c.next().map_or(String::new(), |first| {
                first.to_ascii_uppercase().to_string() + c.as_str()
            })
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.chunks(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

impl Inspector {
    /// Writes the inspected journal as a dump (JSON Lines, see the module documentation
    /// and docs/cli.md) to `out`, from one snapshot, streaming: a header with the meta,
    /// every event, every stored result, and an end line. [`import_dump`] builds a journal
    /// from it, and a dump of that journal is the same dump.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Io`] writing `out` (a closed pipe included) or reading the file;
    /// [`ErrorKind::Corrupt`] for a damaged record (run `verify`, then `repair`).
    pub fn export_dump(&self, out: &mut dyn Write) -> Result<DumpReport> {
        crate::preflight::guarded("dump", || {
            self.with_snapshot(|snap, _| write_dump(snap, out))
        })
    }
}

fn write_dump(snap: &index::Snapshot<'_>, out: &mut dyn Write) -> Result<DumpReport> {
    let format = snap
        .format()?
        .ok_or_else(|| Error::corrupt("meta", "format", "the format entry is missing"))?;
    let state = snap.state()?;
    write_line(
        out,
        "dump",
        &json!({
            "dump_version": DUMP_VERSION,
            "format_version": format.format_version,
            "created_at": format.created_at,
            "created_by": format.created_by,
            "upgraded": format.upgraded.map(|u| json!({"from": u.from, "at": u.at})),
            "clock_high_water": state.clock_high_water,
            "next_seq": state.next_seq,
        }),
    )?;
    let mut report = DumpReport::default();
    for entry in snap.all::<index::Events>()? {
        let (k, v) = entry?;
        let ev = index::decode_event(k, &v)?;
        write_line(out, "event", &event_value(&api::Event::from(&ev)))?;
        report.events += 1;
    }
    // Results in seq order, wherever they are stored: the seqs of those inline in their
    // receipts (format 3) are gathered first (a seq and an id per terminal receipt, not
    // their payloads), then merged with the `results` table.
    let mut inline: Vec<(u64, String)> = Vec::new();
    for entry in snap.all::<index::Receipts>()? {
        let (k, v) = entry?;
        if index::split_receipt_value(&v).1.is_none() {
            continue;
        }
        let rec = index::decode_receipt(&k, &v)?;
        if let ExecRecord::Done(d) = &rec.state
            && let Some(seq) = d.result_seq
        {
            inline.push((seq, k.to_string()));
        }
    }
    inline.sort_unstable();
    let mut inline = inline.into_iter().peekable();
    let mut stored = snap.all::<index::Results>()?.peekable();
    loop {
        let next_stored = match stored.peek() {
            Some(Ok((k, _))) => Some(*k),
            Some(Err(_)) => stored.next().transpose()?.map(|(k, _)| k),
            None => None,
        };
        let (k, header_id, changed_assets, bytes) = match (inline.peek(), next_stored) {
            (None, None) => break,
            (Some((seq, _)), s) if s.is_none_or(|s| *seq < s) => {
                let Some((seq, id)) = inline.next() else {
                    break;
                };
                let r = snap
                    .inline_result(&id, seq)?
                    .ok_or_else(|| Error::corrupt("receipts", &id, "its inline result vanished"))?;
                (seq, id, r.changed_assets, r.bytes)
            }
            _ => {
                let Some((k, v)) = stored.next().transpose()? else {
                    break;
                };
                let (header, bytes) = index::decode_result(k, &v)?;
                (k, header.operation_id, header.changed_assets, bytes)
            }
        };
        let (encoding, content) = match std::str::from_utf8(&bytes) {
            Ok(text) => ("utf8", text.to_string()),
            Err(_) => ("hex", hex(&bytes)),
        };
        write_line(
            out,
            "result",
            &json!({
                "seq": k,
                "operation_id": header_id,
                "len": bytes.len(),
                "changed_assets": changed_assets,
                "encoding": encoding,
                "content": content,
                "shown_bytes": bytes.len(),
                "truncated": false,
            }),
        )?;
        report.results += 1;
    }
    write_line(
        out,
        "dump_end",
        &json!({"events": report.events, "results": report.results}),
    )?;
    Ok(report)
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    ty: String,
    data: Value,
}

#[derive(Deserialize)]
struct Header {
    dump_version: u32,
    format_version: u32,
    created_at: Timestamp,
    created_by: String,
    upgraded: Option<UpgradeLine>,
    clock_high_water: Timestamp,
    next_seq: u64,
}

#[derive(Deserialize)]
struct UpgradeLine {
    from: u32,
    at: Timestamp,
}

#[derive(Deserialize)]
struct EventLine {
    seq: u64,
    at: Timestamp,
    operation_id: Option<String>,
    kind: String,
    detail: Value,
}

#[derive(Deserialize)]
struct ResultLine {
    seq: u64,
    operation_id: String,
    len: u64,
    changed_assets: Vec<String>,
    encoding: String,
    content: String,
}

#[derive(Deserialize)]
struct EndLine {
    events: u64,
    results: u64,
}

fn invalid(line: u64, detail: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidDump {
        line,
        detail: detail.into(),
    })
}

/// The event an `event` line describes.
fn parse_event(line: u64, data: Value) -> Result<Event> {
    let e: EventLine = serde_json::from_value(data)
        .map_err(|e| invalid(line, format!("not an event record: {e}")))?;
    let variant = pascal(&e.kind);
    let mut detail = e.detail;
    if let Value::Object(map) = &mut detail
        && let Some(Value::String(cause)) = map.get_mut("cause")
    {
        *cause = pascal(cause);
    }
    let unit = detail.as_object().is_some_and(|m| m.is_empty());
    let tagged = json!({ variant.clone(): detail });
    let kind: api::EventKind = match serde_json::from_value(tagged) {
        Ok(k) => k,
        Err(_) if unit => serde_json::from_value(Value::String(variant))
            .map_err(|err| invalid(line, format!("event kind `{}`: {err}", e.kind)))?,
        Err(err) => return Err(invalid(line, format!("event kind `{}`: {err}", e.kind))),
    };
    Ok(Event::from(&api::Event {
        seq: e.seq,
        at: e.at,
        operation_id: e.operation_id,
        kind,
        pending: false,
    }))
}

/// Where the reading is.
#[derive(PartialEq, Eq)]
enum Part {
    Events,
    Results,
    Ended,
}

/// Builds a new journal at `dest` from a dump (what [`Inspector::export_dump`] and
/// `opjournal export --dump` write): every event is replayed with the writer's own code,
/// which rebuilds every index; results are stored under their completing events; the
/// meta (creation, clock high-water mark, next sequence number) is the dump's. The journal
/// is built under a temporary name and linked into place only once the whole dump has been
/// read and checked: on any error nothing is left at `dest`.
///
/// # Errors
///
/// - [`ErrorKind::InvalidInput`] if `dest` exists;
/// - [`ErrorKind::InvalidDump`] naming the line: a line that is not a dump record, a dump
///   of a newer dump or format version (both versions named), an event out of order or
///   that does not fit the history before it, a result that does not match its event, a
///   dump without its end line (cut short);
/// - [`ErrorKind::Io`] reading the dump or writing the journal.
pub fn import_dump(reader: impl BufRead, dest: impl AsRef<Path>) -> Result<ImportReport> {
    let dest = dest.as_ref();
    refuse_existing(dest)?;
    crate::preflight::guarded("import", || import(reader, dest))
}

fn import(mut reader: impl BufRead, dest: &Path) -> Result<ImportReport> {
    let mut out: Option<NewJournal> = None;
    let mut header: Option<Header> = None;
    let mut report = ImportReport::default();
    let mut part = Part::Events;
    let mut last_seq = 0u64;
    let mut buf = String::new();
    let mut line = 0u64;
    loop {
        buf.clear();
        let n = reader
            .read_line(&mut buf)
            .map_err(|e| Error::io_while("read the dump", "nothing was imported", e))?;
        if n == 0 {
            break;
        }
        line += 1;
        let text = buf.trim_end_matches(['\n', '\r']);
        let env: Envelope = serde_json::from_str(text)
            .map_err(|e| invalid(line, format!("not a dump record: {e}")))?;
        let Some(h) = &header else {
            if env.ty != "dump" {
                return Err(invalid(
                    line,
                    format!(
                        "the first line is a `{}` record, not the `dump` header: this is not a \
                         dump (write one with `opjournal export --dump`)",
                        env.ty
                    ),
                ));
            }
            let h: Header = serde_json::from_value(env.data)
                .map_err(|e| invalid(line, format!("not a dump header: {e}")))?;
            if h.dump_version > DUMP_VERSION {
                return Err(invalid(
                    line,
                    format!(
                        "the dump is of dump version {}, newer than this build reads \
                         (version {DUMP_VERSION}): import it with a newer opjournal",
                        h.dump_version
                    ),
                ));
            }
            if h.format_version > u32::from(FORMAT_VERSION) {
                return Err(invalid(
                    line,
                    format!(
                        "the dump is of a journal of format version {}, newer than this build \
                         writes (version {FORMAT_VERSION}): import it with a newer opjournal",
                        h.format_version
                    ),
                ));
            }
            if h.next_seq == 0 {
                return Err(invalid(line, "next_seq is 0 (sequences start at 1)"));
            }
            out = Some(NewJournal::create(dest)?);
            header = Some(h);
            continue;
        };
        let Some(journal) = out.as_mut() else {
            return Err(invalid(line, "no journal is being built"));
        };
        match (env.ty.as_str(), &part) {
            ("event", Part::Events) => {
                let ev = parse_event(line, env.data)?;
                if ev.seq <= last_seq {
                    return Err(invalid(
                        line,
                        format!(
                            "event {} follows event {last_seq}: events must be in increasing \
                             seq order",
                            ev.seq
                        ),
                    ));
                }
                if ev.seq >= h.next_seq {
                    return Err(invalid(
                        line,
                        format!(
                            "event {} is not below the header's next_seq {}",
                            ev.seq, h.next_seq
                        ),
                    ));
                }
                if ev.at > h.clock_high_water {
                    return Err(invalid(
                        line,
                        format!(
                            "event {} is at {} ms, after the header's clock high-water mark {} ms",
                            ev.seq, ev.at.0, h.clock_high_water.0
                        ),
                    ));
                }
                journal
                    .batch(|t| {
                        t.put_event(&ev)?;
                        machine::apply(t, &ev)
                    })
                    .map_err(|e| match e.kind() {
                        ErrorKind::Corrupt { detail, .. } => invalid(
                            line,
                            format!("event {} does not fit the history: {detail}", ev.seq),
                        ),
                        _ => e,
                    })?;
                last_seq = ev.seq;
                report.events += 1;
            }
            ("result", Part::Events | Part::Results) => {
                part = Part::Results;
                import_result(journal, line, env.data)?;
                report.results += 1;
            }
            ("dump_end", Part::Events | Part::Results) => {
                let end: EndLine = serde_json::from_value(env.data)
                    .map_err(|e| invalid(line, format!("not a dump end record: {e}")))?;
                if (end.events, end.results) != (report.events, report.results) {
                    return Err(invalid(
                        line,
                        format!(
                            "the end line counts {} events and {} results, the dump holds {} \
                             and {}",
                            end.events, end.results, report.events, report.results
                        ),
                    ));
                }
                part = Part::Ended;
            }
            // The CLI's summary line, after the dump.
            ("summary", Part::Ended) => {}
            (ty, _) => {
                return Err(invalid(
                    line,
                    format!(
                        "a `{ty}` record is not expected here (a dump is the header, events, \
                         results, then `dump_end`)"
                    ),
                ));
            }
        }
    }
    let (Some(h), Some(mut journal)) = (header, out) else {
        return Err(invalid(line + 1, "the dump is empty"));
    };
    if part != Part::Ended {
        return Err(invalid(
            line + 1,
            "the dump ends before its `dump_end` line: it was cut short",
        ));
    }
    // Every result a receipt refers to must have come with the dump.
    let missing = journal.view(|snap| -> Result<Option<(String, u64)>> {
        for entry in snap.all::<index::Receipts>()? {
            let (k, v) = entry?;
            let rec = index::decode_receipt(&k, &v)?;
            if let ExecRecord::Done(d) = &rec.state
                && let Some(seq) = d.result_seq
                && !snap.result_stored(&k, seq)?
            {
                return Ok(Some((k.to_string(), seq)));
            }
        }
        Ok(None)
    })?;
    if let Some((op, seq)) = missing {
        return Err(invalid(
            line,
            format!("operation `{op}`'s result (event {seq}) is missing from the dump"),
        ));
    }
    report.receipts = journal.view(|snap| snap.count::<index::Receipts>())?;
    journal.batch(|t| {
        t.put_format(&FormatRecord {
            format_version: u32::from(FORMAT_VERSION),
            created_at: h.created_at,
            created_by: h.created_by,
            upgraded: h.upgraded.map(|u| Upgrade {
                from: u.from,
                at: u.at,
            }),
        })?;
        t.put_state(&StateRecord {
            clock_high_water: h.clock_high_water,
            next_seq: h.next_seq,
        })?;
        t.put_checkpoint(&CheckpointRecord {
            journal_id: log::new_journal_id(),
            generation: 1,
            next_lsn: 1,
        })
    })?;
    report.file_bytes = journal.install()?;
    Ok(report)
}

/// Stores a `result` line's payload, checked against its completing event and receipt.
fn import_result(journal: &mut NewJournal, line: u64, data: Value) -> Result<()> {
    let r: ResultLine = serde_json::from_value(data)
        .map_err(|e| invalid(line, format!("not a result record: {e}")))?;
    let bytes = match r.encoding.as_str() {
        "utf8" => r.content.into_bytes(),
        "hex" => unhex(&r.content)
            .ok_or_else(|| invalid(line, "the content is not lowercase hex digits"))?,
        other => {
            return Err(invalid(
                line,
                format!("encoding `{other}` is neither `utf8` nor `hex`"),
            ));
        }
    };
    if bytes.len() as u64 != r.len {
        return Err(invalid(
            line,
            format!(
                "the content holds {} bytes, `len` says {}",
                bytes.len(),
                r.len
            ),
        ));
    }
    let (seq, op) = (r.seq, r.operation_id);
    let problem = journal.view(|snap| -> Result<Option<String>> {
        let Some(ev) = snap.event(seq)? else {
            return Ok(Some(format!("no event {seq} completes it")));
        };
        let info = match &ev.kind {
            EventKind::Completed { result, .. }
            | EventKind::Resolved {
                resolution: ResolvedAs::Completed { result, .. },
            } if ev.operation_id.as_deref() == Some(op.as_str()) => *result,
            _ => {
                return Ok(Some(format!(
                    "event {seq} is not the completion of operation `{op}`"
                )));
            }
        };
        if info.len != bytes.len() as u64
            || info.crc32 != crc32fast::hash(&bytes)
            || u64::from(info.assets) != r.changed_assets.len() as u64
        {
            return Ok(Some(format!(
                "the payload does not match what event {seq} recorded (length {}, CRC-32 {:08x}, \
                 {} assets)",
                info.len, info.crc32, info.assets
            )));
        }
        let refers = snap.receipt(&op)?.is_some_and(
            |rec| matches!(&rec.state, ExecRecord::Done(d) if d.result_seq == Some(seq)),
        );
        if !refers {
            return Ok(Some(format!(
                "operation `{op}` no longer refers to the result of event {seq} (retired, or \
                 completed again)"
            )));
        }
        if snap.result_stored(&op, seq)? {
            return Ok(Some(format!("a result for event {seq} came before")));
        }
        Ok(None)
    })?;
    if let Some(p) = problem {
        return Err(invalid(line, p));
    }
    let result = OpResult {
        bytes,
        changed_assets: r.changed_assets,
    };
    journal.batch(|t| t.put_result(seq, &op, &result))?;
    Ok(())
}
