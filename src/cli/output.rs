//! Where results go: stdout, as aligned tables or as JSON Lines (`--json`).
//!
//! Every write goes through [`Out`], which turns a closed pipe into a quiet exit instead of a
//! panic (`println!` would panic on `opjournal log FILE | head`).

use std::io::{BufWriter, StdoutLock, Write};

use serde_json::Value;

use super::failure::{Failure, output_failed};

/// stdout, buffered, in human or JSON Lines mode.
pub(crate) struct Out {
    w: BufWriter<StdoutLock<'static>>,
    json: bool,
}

impl Out {
    pub(crate) fn stdout(json: bool) -> Out {
        Out {
            w: BufWriter::new(std::io::stdout().lock()),
            json,
        }
    }

    /// Whether `--json` was given.
    pub(crate) fn json(&self) -> bool {
        self.json
    }

    /// Switches to JSON Lines (for `export`, which writes nothing else).
    pub(crate) fn set_json(&mut self) {
        self.json = true;
    }

    /// Writes one line of human output.
    pub(crate) fn line(&mut self, text: impl AsRef<str>) -> Result<(), Failure> {
        let w = &mut self.w;
        w.write_all(text.as_ref().as_bytes())
            .and_then(|()| w.write_all(b"\n"))
            .map_err(output_failed)
    }

    /// Writes one JSON Lines envelope: `{"type": ty, "data": data}`.
    pub(crate) fn record(&mut self, ty: &str, data: &Value) -> Result<(), Failure> {
        let w = &mut self.w;
        (|| -> std::io::Result<()> {
            write!(w, "{{\"type\":")?;
            serde_json::to_writer(&mut *w, ty)?;
            write!(w, ",\"data\":")?;
            serde_json::to_writer(&mut *w, data)?;
            w.write_all(b"}\n")
        })()
        .map_err(output_failed)
    }

    /// The buffered stdout itself, for output the library writes (`export --dump`).
    pub(crate) fn writer(&mut self) -> &mut dyn Write {
        &mut self.w
    }

    /// Pushes buffered output out (at the end, and after each `log --follow` poll).
    pub(crate) fn flush(&mut self) -> Result<(), Failure> {
        self.w.flush().map_err(output_failed)
    }

    /// Writes an aligned table.
    pub(crate) fn table(&mut self, table: &Table) -> Result<(), Failure> {
        for line in table.render() {
            self.line(line)?;
        }
        Ok(())
    }

    /// Writes `key  value` lines with the values aligned. A key may start with spaces (a
    /// nested row); a row with an empty key and value is a blank line.
    pub(crate) fn pairs(&mut self, rows: &[(&str, String)]) -> Result<(), Failure> {
        let w = rows.iter().map(|(k, _)| width(k)).max().unwrap_or(0);
        for (k, v) in rows {
            let pad = " ".repeat(w - width(k));
            let line = format!("{k}{pad}  {v}");
            self.line(line.trim_end())?;
        }
        Ok(())
    }
}

/// Display width of `s`: its number of characters (opjournal's values are mostly ASCII;
/// wide characters only misalign the line they are on).
pub(crate) fn width(s: &str) -> usize {
    s.chars().count()
}

/// Column alignment.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// A table whose columns are padded to their widest cell. The last column is not padded, so
/// no line ends in spaces.
pub(crate) struct Table {
    headers: Vec<&'static str>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
    indent: usize,
}

impl Table {
    pub(crate) fn new(columns: &[(&'static str, Align)]) -> Table {
        Table {
            headers: columns.iter().map(|c| c.0).collect(),
            align: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
            indent: 0,
        }
    }

    pub(crate) fn indent(mut self, n: usize) -> Table {
        self.indent = n;
        self
    }

    pub(crate) fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    fn render(&self) -> Vec<String> {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(n) {
                widths[i] = widths[i].max(width(cell));
            }
        }
        let line = |cells: Vec<&str>| {
            let mut s = " ".repeat(self.indent);
            for (i, cell) in cells.iter().enumerate() {
                let pad = widths[i].saturating_sub(width(cell));
                let last = i + 1 == cells.len();
                match self.align[i] {
                    Align::Right => {
                        s.push_str(&" ".repeat(pad));
                        s.push_str(cell);
                    }
                    Align::Left => {
                        s.push_str(cell);
                        if !last {
                            s.push_str(&" ".repeat(pad));
                        }
                    }
                }
                if !last {
                    s.push_str("  ");
                }
            }
            s.truncate(s.trim_end().len());
            s
        };
        let mut out = vec![line(self.headers.clone())];
        for row in &self.rows {
            out.push(line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pads_columns_to_the_widest_cell_without_trailing_spaces() {
        let mut t = Table::new(&[
            ("ID", Align::Left),
            ("N", Align::Right),
            ("WHAT", Align::Left),
        ]);
        t.push(vec!["op_1".into(), "7".into(), "short".into()]);
        t.push(vec!["op_long_id".into(), "1234".into(), "".into()]);
        assert_eq!(
            t.render(),
            vec![
                "ID             N  WHAT",
                "op_1           7  short",
                "op_long_id  1234",
            ]
        );
    }
}
