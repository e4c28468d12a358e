//! How values read: timestamps (UTC and "3 min ago"), sizes, result previews, event
//! details, and the JSON shapes of receipts and events.

use std::fmt::Write as _;
use std::time::Duration;

use opjournal::{
    DeliveryState, Event, EventKind, ExecutionStatus, InDoubtCause, OutcomeKind, Receipt,
    ResolvedAs, RetireCause, RevisionCause, Timestamp,
};
use serde_json::{Value, json};

// ---- time ----

/// Whether times are printed in the local time zone (`--local`) instead of UTC. Set once,
/// at start-up.
static LOCAL_TIME: std::sync::OnceLock<jiff::tz::TimeZone> = std::sync::OnceLock::new();

/// Prints times in the system's time zone from now on (`--local`).
pub(crate) fn use_local_time() {
    let _ = LOCAL_TIME.set(jiff::tz::TimeZone::system());
}

/// `t` in the `--local` time zone, as `strftime` with `fmt`; `None` without `--local` (or
/// for a time jiff cannot hold).
fn local(t: Timestamp, fmt: &str) -> Option<String> {
    let tz = LOCAL_TIME.get()?;
    let ms = i64::try_from(t.as_millis()).ok()?;
    let at = jiff::Timestamp::from_millisecond(ms).ok()?;
    Some(at.to_zoned_datetime(tz.clone()).strftime(fmt).to_string())
}

/// `2026-11-30 14:10:23 UTC` (or `2026-11-30 16:10:23 +02:00` with `--local`).
pub(crate) fn utc(t: Timestamp) -> String {
    if let Some(s) = local(t, "%Y-%m-%d %H:%M:%S %:z") {
        return s;
    }
    // Display is RFC 3339 with milliseconds (`2026-11-30T14:10:23.000Z`), or raw
    // milliseconds past year 9999.
    let s = t.to_string();
    match (s.get(0..10), s.get(11..19)) {
        (Some(date), Some(time)) if s.ends_with('Z') => format!("{date} {time} UTC"),
        _ => s,
    }
}

/// `2026-11-30 14:10:23.123` (for the event log, where order within a second matters), in
/// UTC, or in the local time zone with `--local`.
pub(crate) fn utc_millis(t: Timestamp) -> String {
    if let Some(s) = local(t, "%Y-%m-%d %H:%M:%S%.3f") {
        return s;
    }
    let s = t.to_string();
    match s.strip_suffix('Z') {
        Some(body) if body.len() == 23 => body.replacen('T', " ", 1),
        _ => s,
    }
}

/// `3 min ago`, `in 2 h`, `just now`.
pub(crate) fn relative(t: Timestamp, now: Timestamp) -> String {
    let (d, future) = if t > now {
        (t.saturating_since(now), true)
    } else {
        (now.saturating_since(t), false)
    };
    let span = span(d);
    match (span, future) {
        (None, _) => "just now".into(),
        (Some(s), true) => format!("in {s}"),
        (Some(s), false) => format!("{s} ago"),
    }
}

fn span(d: Duration) -> Option<String> {
    let s = d.as_secs();
    Some(match s {
        0 => return None,
        1..=59 => format!("{s} s"),
        60..=3_599 => format!("{} min", s / 60),
        3_600..=172_799 => format!("{} h", s / 3_600),
        172_800..=63_071_999 => format!("{} days", s / 86_400),
        _ => format!("{} years", s / 31_536_000),
    })
}

/// `2026-11-30 14:10:23 UTC (3 min ago)`.
pub(crate) fn when(t: Timestamp, now: Timestamp) -> String {
    format!("{} ({})", utc(t), relative(t, now))
}

/// A point in time given on the command line: RFC 3339 with `Z` or an offset
/// (`2026-11-30T14:00:00Z`, `2026-11-30T16:00:00+02:00`), a date and time without an offset
/// (UTC), a date (`2026-11-30`, midnight UTC), or a duration before now (`90s`, `15min`,
/// `2h`, `3days`, `1h30m`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TimeArg {
    At(Timestamp),
    Ago(Duration),
}

impl std::str::FromStr for TimeArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some(d) = parse_ago(s) {
            return Ok(TimeArg::Ago(d));
        }
        let neither = || {
            format!(
                "`{s}` is neither a time (`2026-11-30T14:00:00Z`, `2026-11-30T16:00:00+02:00`, \
                 `2026-11-30`) nor a duration before now (`15min`, `2h`, `3days`)"
            )
        };
        // Civil fields and an offset, converted here rather than through `jiff::Timestamp`,
        // whose range ends a day before the year 10000 ends: every RFC 3339 time is taken.
        let pieces = jiff::fmt::temporal::Pieces::parse(s).map_err(|_| neither())?;
        if pieces.offset().is_none() && pieces.time_zone_annotation().is_some() {
            return Err(format!(
                "`{s}` names a time zone but no offset: give one (`Z`, `+02:00`)"
            ));
        }
        let date = pieces.date();
        let time = pieces.time().unwrap_or(jiff::civil::Time::midnight());
        let offset = pieces.to_numeric_offset().unwrap_or(jiff::tz::Offset::UTC);
        let local = date.to_datetime(time).duration_since(
            jiff::civil::date(1970, 1, 1).to_datetime(jiff::civil::Time::midnight()),
        );
        let utc = local.checked_sub(offset.duration_since(jiff::tz::Offset::UTC));
        let ms = utc
            .and_then(|d| u64::try_from(d.as_millis()).ok())
            .ok_or_else(|| format!("`{s}` is before 1970"))?;
        Ok(TimeArg::At(Timestamp(ms)))
    }
}

/// A duration argument such as `30s`, `5min` or `1h 30m` (days are 24 hours).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_ago(s).ok_or_else(|| format!("`{s}` is not a duration such as `30s`, `5min` or `1h`"))
}

/// A non-negative duration such as `90s`, `15min`, `2h`, `3days` or `1h 30m` (days are 24
/// hours).
fn parse_ago(s: &str) -> Option<Duration> {
    let span: jiff::Span = s.parse().ok()?;
    let d = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .ok()?;
    Duration::try_from(d).ok()
}

impl TimeArg {
    pub(crate) fn resolve(&self, now: Timestamp) -> Timestamp {
        match self {
            TimeArg::At(t) => *t,
            TimeArg::Ago(d) => Timestamp(
                now.as_millis()
                    .saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            ),
        }
    }
}

// ---- sizes ----

/// `24.0 KiB (24576 bytes)`, or `512 bytes`.
pub(crate) fn size(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {} ({n} bytes)", UNITS[unit])
}

/// `156.0 KiB`, or `512 bytes`.
pub(crate) fn short_size(n: u64) -> String {
    match size(n).split_once(" (") {
        Some((short, _)) => short.to_string(),
        None => size(n),
    }
}

/// `1 event`, `2 events`.
pub(crate) fn count(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

// ---- text from the file ----

/// Makes text read from the file safe to print on a terminal: control characters (which
/// could move the cursor or recolor the screen) are shown escaped.
pub(crate) fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Shortens `s` to `max` characters for a table cell, marking the cut.
pub(crate) fn cut(s: &str, max: usize) -> String {
    let s = clean(s);
    if s.chars().count() <= max {
        s
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// How a result payload is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Preview {
    /// `utf8` (the text itself) or `hex` (a hex dump).
    pub encoding: &'static str,
    /// The lines shown (terminal-safe).
    pub lines: Vec<String>,
    /// The payload bytes the lines cover.
    pub shown: usize,
    /// The payload's size.
    pub total: usize,
}

/// The default preview: at most this many bytes and lines of a result.
pub(crate) const PREVIEW_BYTES: usize = 1024;
pub(crate) const PREVIEW_LINES: usize = 20;
const HEX_PREVIEW_BYTES: usize = 256;

/// A preview of `bytes`: text if it is UTF-8, a hex dump otherwise; everything when `full`.
pub(crate) fn preview(bytes: &[u8], full: bool) -> Preview {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            let mut lines = Vec::new();
            let mut shown = 0;
            for line in text.split_inclusive('\n') {
                if !full && (lines.len() >= PREVIEW_LINES || shown >= PREVIEW_BYTES) {
                    break;
                }
                let mut take = line;
                if !full && shown + line.len() > PREVIEW_BYTES {
                    let mut end = PREVIEW_BYTES - shown;
                    while !line.is_char_boundary(end) {
                        end -= 1;
                    }
                    take = &line[..end];
                }
                shown += take.len();
                let body = take.strip_suffix('\n').unwrap_or(take);
                lines.push(clean(body.strip_suffix('\r').unwrap_or(body)));
            }
            Preview {
                encoding: "utf8",
                lines,
                shown,
                total: bytes.len(),
            }
        }
        Err(_) => {
            let shown = if full {
                bytes.len()
            } else {
                bytes.len().min(HEX_PREVIEW_BYTES)
            };
            let lines = bytes[..shown]
                .chunks(16)
                .enumerate()
                .map(|(i, chunk)| {
                    let mut line = format!("{:08x} ", i * 16);
                    for b in chunk {
                        let _ = write!(line, " {b:02x}");
                    }
                    line.push_str(&"   ".repeat(16 - chunk.len()));
                    line.push_str("  |");
                    line.extend(chunk.iter().map(|&b| {
                        if b.is_ascii_graphic() || b == b' ' {
                            b as char
                        } else {
                            '.'
                        }
                    }));
                    line.push('|');
                    line
                })
                .collect();
            Preview {
                encoding: "hex",
                lines,
                shown,
                total: bytes.len(),
            }
        }
    }
}

impl Preview {
    /// The shown part as one string (text, or contiguous hex digits), for JSON.
    pub(crate) fn content(&self, bytes: &[u8]) -> String {
        match self.encoding {
            "utf8" => String::from_utf8_lossy(&bytes[..self.shown]).into_owned(),
            _ => hex(&bytes[..self.shown]),
        }
    }

    pub(crate) fn truncated(&self) -> bool {
        self.shown < self.total
    }
}

// ---- states ----

pub(crate) fn cause(c: InDoubtCause) -> &'static str {
    match c {
        InDoubtCause::LeaseTimeout => "lease_timeout",
        InDoubtCause::Reopened => "reopened",
        InDoubtCause::EventsLost => "events_lost",
    }
}

fn cause_sentence(c: InDoubtCause) -> &'static str {
    match c {
        InDoubtCause::LeaseTimeout => "its lease expired before the claim holder finished",
        InDoubtCause::Reopened => {
            "the journal was reopened while it was running (the process that ran it is gone)"
        }
        InDoubtCause::EventsLost => "repair found some of its events damaged",
    }
}

/// The status cell of a receipt: `applied`, `failed`, `in_doubt`, ...
pub(crate) fn status(r: &Receipt) -> &'static str {
    match r.retire_cause {
        // Not "retired" alone: that reads as aged out.
        Some(RetireCause::Damage { .. }) => "retired (lost to damage)",
        _ => r.status.name(),
    }
}

/// Why a retired receipt has no result, as a clause: `the result payload aged out` or
/// `the result payload was lost to damage (repair on <time>)`.
pub(crate) fn retired_clause(r: &Receipt, now: Timestamp) -> String {
    match r.retire_cause {
        Some(RetireCause::Damage { repaired_at }) => format!(
            "the result payload was lost to damage (repair on {}), not to retention",
            when(repaired_at, now)
        ),
        _ => "the result payload aged out".into(),
    }
}

/// The delivery cell: `delivered×2`, `pending`, `-`.
pub(crate) fn delivery(r: &Receipt) -> String {
    match r.delivery {
        None => "-".into(),
        Some(DeliveryState::Delivered) => format!("delivered×{}", r.delivery_count),
        Some(d) => d.name().into(),
    }
}

/// The revisions cell: `183→184`, `183→?`, `→184`, `-`.
pub(crate) fn revisions(r: &Receipt) -> String {
    let base = r.base_revision.map(|b| b.to_string());
    let result = r.result_revision.map(|b| b.to_string());
    match (base, result, r.status) {
        (None, None, _) => "-".into(),
        (Some(b), None, ExecutionStatus::Running | ExecutionStatus::InDoubt) => format!("{b}→?"),
        (Some(b), None, _) => b,
        (b, Some(res), _) => format!("{}→{res}", b.unwrap_or_default()),
    }
}

/// A sentence for a receipt's execution status (for `show`).
pub(crate) fn status_sentence(r: &Receipt, now: Timestamp) -> String {
    match r.status {
        ExecutionStatus::Running => match r.lease_until {
            Some(t) => format!("running (lease until {})", when(t, now)),
            None => "running".into(),
        },
        ExecutionStatus::InDoubt => format!(
            "in doubt: {}; resolve it once you know how it ended",
            r.in_doubt_cause
                .map_or("its outcome is unknown", cause_sentence)
        ),
        ExecutionStatus::Applied => match r.result_revision {
            Some(rev) => format!("applied at revision {rev}"),
            None => "applied".into(),
        },
        ExecutionStatus::Failed => format!(
            "failed: {}",
            clean(r.failure.as_deref().unwrap_or("(no message)"))
        ),
        ExecutionStatus::Retired => {
            let outcome = match (r.applied, r.result_revision, &r.failure) {
                (Some(true), Some(rev), _) => format!("applied at revision {rev}"),
                (Some(false), _, Some(msg)) => format!("failed: {}", clean(msg)),
                _ => "outcome recorded".into(),
            };
            format!(
                "retired ({outcome}; {}, the audit record is kept)",
                retired_clause(r, now)
            )
        }
        _ => r.status.name().into(),
    }
}

/// A sentence for a receipt's delivery state (for `show`).
pub(crate) fn delivery_sentence(r: &Receipt, now: Timestamp) -> Option<String> {
    let d = r.delivery?;
    let mut s = match d {
        DeliveryState::Pending => "pending: not delivered yet".to_string(),
        DeliveryState::Delivered => format!(
            "delivered {}, not acknowledged",
            count(u64::from(r.delivery_count), "time", "times")
        ),
        DeliveryState::Acknowledged => match r.acknowledged_at {
            Some(t) => format!("acknowledged {}", when(t, now)),
            None => "acknowledged".into(),
        },
        DeliveryState::Exhausted => format!(
            "exhausted: the retry budget is spent after {}; the result stays retrievable",
            count(u64::from(r.delivery_count), "delivery", "deliveries")
        ),
        DeliveryState::AckExpired => format!(
            "ack expired: the acknowledgement timeout passed after {}",
            count(u64::from(r.delivery_count), "delivery", "deliveries")
        ),
        _ => d.name().to_string(),
    };
    if let Some(t) = r.next_delivery_at {
        let _ = write!(s, "; next push due {}", when(t, now));
    }
    Some(s)
}

// ---- events ----

fn outcome(o: &OutcomeKind) -> String {
    match o {
        OutcomeKind::Applied { result_revision } => {
            format!("applied at revision {result_revision}")
        }
        OutcomeKind::Failed { message } => format!("failed: {}", cut(message, 80)),
    }
}

/// The subject of an event: its operation, or the scope of a scope event.
pub(crate) fn event_subject(ev: &Event) -> String {
    match (&ev.operation_id, &ev.kind) {
        (Some(op), _) => clean(op),
        (None, EventKind::RevisionAdvanced { scope, .. }) => format!("scope {}", clean(scope)),
        (None, _) => "-".into(),
    }
}

/// One line saying what an event recorded.
pub(crate) fn event_detail(ev: &Event) -> String {
    match &ev.kind {
        EventKind::Submitted {
            attempt,
            intent_name,
            scope,
            session,
            base_revision,
            lease_until,
            ..
        } => {
            let mut s = format!("attempt {attempt}, {}", cut(intent_name, 60));
            if let Some(scope) = scope {
                let _ = write!(s, ", scope {}", cut(scope, 60));
            }
            if let Some(b) = base_revision {
                let _ = write!(s, ", base {b}");
            }
            if let Some(session) = session {
                let _ = write!(s, ", session {}", cut(session, 60));
            }
            let _ = write!(s, ", lease until {}", utc(*lease_until));
            s
        }
        EventKind::LeaseExtended { epoch, lease_until } => {
            format!("epoch {epoch}, lease until {}", utc(*lease_until))
        }
        EventKind::Completed {
            outcome: o, result, ..
        } => format!(
            "{}; result {}, {}",
            outcome(o),
            count(result.len, "byte", "bytes"),
            count(u64::from(result.assets), "asset", "assets")
        ),
        EventKind::Released { epoch, .. } => {
            format!("epoch {epoch} given back before any effect; the id is free again")
        }
        EventKind::LeaseExpired { epoch, cause: c } => {
            format!("epoch {epoch} now in doubt ({})", cause(*c))
        }
        EventKind::Resolved { resolution } => match resolution {
            ResolvedAs::NotApplied { .. } => {
                "resolved as not applied; the id is free again".to_string()
            }
            ResolvedAs::Completed {
                outcome: o, result, ..
            } => format!(
                "resolved: {}; result {}",
                outcome(o),
                count(result.len, "byte", "bytes")
            ),
        },
        EventKind::Delivered {
            count: n,
            next_due,
            final_attempt,
        } => {
            if *final_attempt {
                format!(
                    "delivery {n} (the last of the budget; exhausted after {})",
                    utc(*next_due)
                )
            } else {
                format!("delivery {n}, next push {}", utc(*next_due))
            }
        }
        EventKind::Acknowledged { late } => {
            if *late {
                "acknowledged (late: after the acknowledgement had expired)".into()
            } else {
                "acknowledged".into()
            }
        }
        EventKind::AckExpired => "acknowledgement timeout passed".into(),
        EventKind::Exhausted => "retry budget spent".into(),
        EventKind::Retired => "result payload dropped; audit record kept".into(),
        EventKind::ResultLost => {
            "result payload lost to damage (found by repair, before its retention passed); \
             outcome and audit record kept"
                .into()
        }
        EventKind::Salvaged {
            intent_name,
            lost_events,
            ..
        } => format!(
            "rebuilt by repair from damaged history ({} lost), {}; in doubt",
            count(u64::from(*lost_events), "event", "events"),
            cut(intent_name, 60)
        ),
        EventKind::RevisionAdvanced {
            scope,
            revision,
            cause: c,
            ..
        } => format!(
            "scope {} at revision {revision} ({})",
            cut(scope, 60),
            match c {
                RevisionCause::External => "changed outside the journal",
                RevisionCause::Checkpoint => "checkpoint kept by compaction",
            }
        ),
        other => other.name().into(),
    }
}

// ---- JSON shapes ----

/// Replaces PascalCase cause names with snake_case, anywhere in `v`. (Intent hashes
/// serialize as their text, `sha256:<hex>` or `jcs-sha256:<hex>`.)
fn tidy(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, val) in map.iter_mut() {
                if (k == "cause" || k == "in_doubt_cause")
                    && let Value::String(s) = val
                {
                    *s = snake(s);
                } else {
                    tidy(val);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

/// Lowercase hex digits of `bytes`.
fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
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

/// A receipt as JSON: the library's fields, timestamps in milliseconds since the epoch.
pub(crate) fn receipt_json(r: &Receipt) -> Value {
    let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
    tidy(&mut v);
    v
}

/// An event as JSON: `seq`, `at`, `operation_id`, `kind` (the lowercase name) and
/// `detail` (the kind's fields as the library serializes them).
pub(crate) fn event_json(ev: &Event) -> Value {
    let detail = match serde_json::to_value(&ev.kind).unwrap_or(Value::Null) {
        // Externally tagged: `{"Submitted": {...}}`, or a bare string for unit variants.
        Value::Object(map) => map.into_iter().next().map_or(json!({}), |(_, v)| v),
        _ => json!({}),
    };
    let mut v = json!({
        "seq": ev.seq,
        "at": ev.at,
        "operation_id": ev.operation_id,
        "kind": ev.kind.name(),
        "detail": detail,
    });
    tidy(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Timestamp = Timestamp(4_102_444_800_000); // 2100-01-01T00:00:00Z

    #[test]
    fn relative_times_read_as_people_say_them() {
        let at = |s: u64| Timestamp(T0.0 + s * 1000);
        assert_eq!(relative(T0, T0), "just now");
        assert_eq!(relative(T0, at(42)), "42 s ago");
        assert_eq!(relative(T0, at(180)), "3 min ago");
        assert_eq!(relative(T0, at(7_200)), "2 h ago");
        assert_eq!(relative(T0, at(3 * 86_400)), "3 days ago");
        assert_eq!(relative(at(600), T0), "in 10 min");
    }

    #[test]
    fn utc_drops_the_t_and_the_milliseconds() {
        assert_eq!(utc(T0), "2100-01-01 00:00:00 UTC");
        assert_eq!(utc_millis(Timestamp(T0.0 + 5)), "2100-01-01 00:00:00.005");
        assert_eq!(when(T0, T0), "2100-01-01 00:00:00 UTC (just now)");
    }

    #[test]
    fn time_arguments_accept_times_dates_and_durations() -> Result<(), String> {
        assert_eq!(
            "2h".parse::<TimeArg>()?,
            TimeArg::Ago(Duration::from_secs(7200))
        );
        assert_eq!("2100-01-01".parse::<TimeArg>()?, TimeArg::At(T0));
        assert_eq!("2100-01-01T00:00:00Z".parse::<TimeArg>()?, TimeArg::At(T0));
        assert!("yesterday-ish".parse::<TimeArg>().is_err());
        // Offsets are honored, not refused.
        assert_eq!(
            "2100-01-01T02:00:00+02:00".parse::<TimeArg>()?,
            TimeArg::At(T0)
        );
        assert_eq!(
            "2099-12-31T19:00:00-05:00".parse::<TimeArg>()?,
            TimeArg::At(T0)
        );
        assert_eq!("2100-01-01T00:00:00".parse::<TimeArg>()?, TimeArg::At(T0));
        assert_eq!(
            "2100-01-01T00:00:00.250Z".parse::<TimeArg>()?,
            TimeArg::At(Timestamp(T0.0 + 250))
        );
        for (text, secs) in [
            ("90s", 90),
            ("15min", 900),
            ("3days", 259_200),
            ("1h30m", 5_400),
        ] {
            assert_eq!(
                text.parse::<TimeArg>()?,
                TimeArg::Ago(Duration::from_secs(secs)),
                "{text}"
            );
        }
        assert!("1969-12-31".parse::<TimeArg>().is_err());
        // Every RFC 3339 time, the last second of year 9999 included (past the range of
        // the time library's own timestamps).
        assert_eq!(
            "9999-12-31T23:59:59Z".parse::<TimeArg>()?,
            TimeArg::At(Timestamp(253_402_300_799_000))
        );
        assert_eq!(
            "9999-12-31T23:59:59-01:00".parse::<TimeArg>()?,
            TimeArg::At(Timestamp(253_402_304_399_000))
        );
        assert_eq!(
            "1970-01-01T00:00:00Z".parse::<TimeArg>()?,
            TimeArg::At(Timestamp(0))
        );
        assert_eq!(
            TimeArg::Ago(Duration::from_secs(1)).resolve(T0),
            Timestamp(T0.0 - 1000)
        );
        Ok(())
    }

    #[test]
    fn preview_truncates_long_text_and_dumps_binary_as_hex() {
        let long = "x".repeat(PREVIEW_BYTES * 3);
        let p = preview(long.as_bytes(), false);
        assert_eq!(
            (p.encoding, p.shown, p.total),
            ("utf8", PREVIEW_BYTES, PREVIEW_BYTES * 3)
        );
        assert!(p.truncated());
        assert_eq!(preview(long.as_bytes(), true).shown, PREVIEW_BYTES * 3);
        let bin = preview(&[0xff, 0x00, b'a'], false);
        assert_eq!(bin.encoding, "hex");
        assert_eq!(
            bin.lines,
            vec![format!("00000000  ff 00 61{}  |..a|", "   ".repeat(13))]
        );
        assert_eq!(bin.content(&[0xff, 0x00, b'a']), "ff0061");
    }

    #[test]
    fn text_from_the_file_cannot_drive_the_terminal() {
        assert_eq!(clean("ok\u{1b}[2Jgone"), "ok\\u{1b}[2Jgone");
        assert_eq!(cut("abcdef", 4), "abc…");
    }
}
