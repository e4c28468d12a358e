//! The editor's document: a scene of named objects with a revision number, saved to a
//! JSON file, with the history of applied edits (which is also how the editor tells,
//! after a crash, whether an edit landed).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::protocol::Edit;
use super::service::ServiceError;

/// The scene: named objects, a revision, and the history of applied edits (the editor's
/// undo history, which is also how it tells after a crash whether an edit landed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    /// Moves forward by one with every applied edit.
    pub revision: u64,
    /// Object name → the object it stands beside.
    pub objects: BTreeMap<String, Option<String>>,
    /// Every applied edit, oldest first.
    pub history: Vec<Applied>,
}

/// One applied edit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The operation id.
    pub op: String,
    /// The revision it produced.
    pub revision: u64,
    /// The edit.
    pub edit: Edit,
    /// What happened, in words.
    pub summary: String,
}

impl Document {
    /// A new scene with a door, a window and a table, at revision 0.
    pub fn starter() -> Document {
        let mut doc = Document::default();
        for name in ["door", "window", "table"] {
            doc.objects.insert(name.to_string(), None);
        }
        doc
    }

    /// Loads the document file, or starts a new scene if there is none.
    pub fn load_or_create(path: &Path) -> Result<Document, ServiceError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ServiceError::Document {
                path: path.to_path_buf(),
                detail: format!("it is not a scene document: {e}"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Document::starter()),
            Err(source) => Err(ServiceError::Io {
                what: format!("read the document `{}`", path.display()),
                source,
            }),
        }
    }

    /// Saves the document durably (write a temporary file, sync it, rename it over).
    pub fn save(&self, path: &Path) -> Result<(), ServiceError> {
        let io = |what: &str, source| ServiceError::Io {
            what: format!("{what} `{}`", path.display()),
            source,
        };
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| ServiceError::Document {
            path: path.to_path_buf(),
            detail: format!("it could not be serialized: {e}"),
        })?;
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
        f.write_all(&bytes).map_err(|e| io("write", e))?;
        f.sync_all().map_err(|e| io("sync", e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("replace", e))
    }

    /// Applies `edit` as operation `op`: the revision moves forward by one. Returns what
    /// happened in words, or why nothing could change.
    pub fn apply(&mut self, op: &str, edit: &Edit) -> Result<String, String> {
        let summary = match edit {
            Edit::Add { object, beside } => {
                if self.objects.contains_key(object) {
                    return Err(format!("there is already an object named \"{object}\""));
                }
                if !self.objects.contains_key(beside) {
                    return Err(format!("there is no object named \"{beside}\""));
                }
                self.objects.insert(object.clone(), Some(beside.clone()));
                format!("added \"{object}\" beside \"{beside}\"")
            }
            Edit::Rename { from, to } => {
                if self.objects.contains_key(to) {
                    return Err(format!("there is already an object named \"{to}\""));
                }
                let Some(place) = self.objects.remove(from) else {
                    return Err(format!("there is no object named \"{from}\""));
                };
                self.objects.insert(to.clone(), place);
                for beside in self.objects.values_mut().flatten() {
                    if beside == from {
                        *beside = to.clone();
                    }
                }
                format!("renamed \"{from}\" to \"{to}\"")
            }
            Edit::Delete { object } => {
                if self.objects.remove(object).is_none() {
                    return Err(format!("there is no object named \"{object}\""));
                }
                for beside in self.objects.values_mut() {
                    if beside.as_deref() == Some(object.as_str()) {
                        *beside = None;
                    }
                }
                format!("deleted \"{object}\"")
            }
        };
        self.revision += 1;
        self.history.push(Applied {
            op: op.to_string(),
            revision: self.revision,
            edit: edit.clone(),
            summary: summary.clone(),
        });
        Ok(summary)
    }

    /// The applied edit of operation `op`, if its effect is in the document.
    pub fn applied(&self, op: &str) -> Option<&Applied> {
        self.history.iter().find(|a| a.op == op)
    }

    /// How many times operation `op` with `edit` was applied to this document.
    pub fn effects(&self, op: &str, edit: &Edit) -> usize {
        self.history
            .iter()
            .filter(|a| a.op == op && &a.edit == edit)
            .count()
    }

    /// The objects in words: `door, light (beside door), table`.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .objects
            .iter()
            .map(|(name, beside)| match beside {
                Some(b) => format!("{name} (beside {b})"),
                None => name.clone(),
            })
            .collect();
        names.join(", ")
    }
}
