//! What the demo prints: a narrated session for people, or JSON Lines for scripts.
//!
//! JSON Lines messages have the envelope `{"type": ..., "data": ...}`: `heading`, `line`,
//! `answer` (with the raw protocol reply), `row` (one per boundary), and a final `summary`.
//! Types may be added later.

use std::io::Write;

use serde::Serialize;

use opjournal::service::Reply;

/// Who a line is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Who {
    /// What the client does.
    Client,
    /// What the client heard back, in words.
    Answer,
    /// What happened inside the editor service.
    Editor,
    /// The demo's clock moving.
    Clock,
}

impl Who {
    fn label(self) -> &'static str {
        match self {
            Who::Client => "client",
            Who::Answer => "answer",
            Who::Editor => "editor",
            Who::Clock => "clock",
        }
    }
}

/// One row of the closing table: a boundary, what happened there, and how many times
/// the operation's edit landed in the document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Row {
    /// `1` to `6` for the six boundaries of the failure window, `+` for the other cases.
    pub key: String,
    pub boundary: String,
    pub op: String,
    pub edit: String,
    pub client_did: String,
    pub service_answered: String,
    /// How many times the edit is in the document's history.
    pub applied: usize,
    pub expected: usize,
}

pub(crate) struct Transcript {
    json: bool,
    section: String,
    out: std::io::Stdout,
}

impl Transcript {
    pub(crate) fn new(json: bool) -> Transcript {
        Transcript {
            json,
            section: String::new(),
            out: std::io::stdout(),
        }
    }

    pub(crate) fn json(&self) -> bool {
        self.json
    }

    fn emit(&mut self, kind: &str, data: serde_json::Value) {
        let msg = serde_json::json!({"type": kind, "data": data});
        let mut out = self.out.lock();
        // A closed stdout (a pipe into `head`) must not stop the session half-way.
        let _ = writeln!(out, "{msg}");
    }

    /// Prints a line of text (human output only).
    pub(crate) fn text(&mut self, text: &str) {
        if !self.json {
            let mut out = self.out.lock();
            let _ = writeln!(out, "{text}");
        }
    }

    pub(crate) fn heading(&mut self, key: &str, title: &str) {
        self.section = key.to_string();
        if self.json {
            self.emit(
                "heading",
                serde_json::json!({"section": key, "title": title}),
            );
        } else {
            let label = if key == "+" || key.is_empty() {
                title.to_string()
            } else {
                format!("{key}. {title}")
            };
            self.text(&format!("\n{label}"));
        }
    }

    pub(crate) fn line(&mut self, who: Who, text: &str) {
        if self.json {
            let section = self.section.clone();
            self.emit(
                "line",
                serde_json::json!({"section": section, "who": who, "text": text}),
            );
        } else {
            self.text(&format!("  {:<7} {text}", who.label()));
        }
    }

    /// An answer from the service: its words for people, the raw reply for scripts.
    /// `quiet` answers are only in the JSON output (the text output summarizes them).
    pub(crate) fn answer(&mut self, text: &str, reply: &Reply, quiet: bool) {
        if self.json {
            let section = self.section.clone();
            self.emit(
                "answer",
                serde_json::json!({"section": section, "text": text, "reply": reply}),
            );
        } else if !quiet {
            self.line(Who::Answer, text);
        }
    }

    pub(crate) fn rows(&mut self, rows: &[Row]) {
        if self.json {
            for row in rows {
                let data = serde_json::to_value(row).unwrap_or_default();
                self.emit("row", data);
            }
            return;
        }
        let header = [
            "#",
            "boundary",
            "op",
            "client did",
            "service answered",
            "edit applied",
        ];
        let cells: Vec<[String; 6]> = rows
            .iter()
            .map(|r| {
                let verdict = if r.applied == r.expected {
                    format!("{} (expected {})", r.applied, r.expected)
                } else {
                    format!("{} (EXPECTED {})", r.applied, r.expected)
                };
                [
                    r.key.clone(),
                    r.boundary.clone(),
                    r.op.clone(),
                    r.client_did.clone(),
                    r.service_answered.clone(),
                    verdict,
                ]
            })
            .collect();
        let mut widths = header.map(|h| h.chars().count());
        for row in &cells {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let render = |cols: [&str; 6]| {
            let mut line = String::from(" ");
            for (i, (c, w)) in cols.iter().zip(widths).enumerate() {
                if i + 1 == cols.len() {
                    line.push_str(&format!(" {c}"));
                } else {
                    line.push_str(&format!(" {c:<w$} "));
                }
            }
            line.trim_end().to_string()
        };
        self.text(&render(header));
        for row in &cells {
            self.text(&render(row.each_ref().map(String::as_str)));
        }
    }

    pub(crate) fn summary(&mut self, data: serde_json::Value) {
        if self.json {
            self.emit("summary", data);
        }
    }
}
