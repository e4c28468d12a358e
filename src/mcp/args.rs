//! [`OpArgs`]: a tool's arguments with the operation id the agent chooses.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// What the input schema tells the model about `operation_id`.
pub const OPERATION_ID_DESCRIPTION: &str = "An id you choose for this change (for example a \
UUID), at most 256 bytes. Reuse the SAME id when you call this tool again for the same change \
(after a timeout, an error or a reconnect): the server then answers with the recorded result \
(marked as a replay) instead of making the change twice. Use a NEW id for every new change.";

/// The arguments of a journaled tool: the tool's own arguments `T` and the `operation_id`
/// the agent chooses and reuses on every retry of the same call.
///
/// Use it as the handler's `Parameters<OpArgs<T>>`: the input schema is `T`'s, with a
/// required string property `operation_id` added (its description tells the model to reuse
/// the id when it retries, [`OPERATION_ID_DESCRIPTION`]). On the wire the id sits beside
/// `T`'s fields (`{"operation_id": "op_1", "object": "lamp"}`); it may instead come in the
/// request's `_meta` under [`META_OPERATION_ID`](super::META_OPERATION_ID), so
/// deserializing accepts its absence and [`Journaled::run`](super::Journaled::run) answers a
/// call without any id with a tool error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpArgs<T> {
    /// The operation id, as the agent sent it in the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// The tool's own arguments: with the tool's name, the operation's intent.
    #[serde(flatten)]
    pub args: T,
}

impl<T: JsonSchema> JsonSchema for OpArgs<T> {
    fn schema_name() -> Cow<'static, str> {
        Cow::Owned(format!("OpArgs_{}", T::schema_name()))
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut schema = T::json_schema(generator);
        let object = schema.ensure_object();
        object.insert("type".into(), "object".into());
        let properties = object
            .entry("properties")
            .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
        if let Some(properties) = properties.as_object_mut() {
            properties.insert(
                "operation_id".into(),
                serde_json::json!({
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 256,
                    "description": OPERATION_ID_DESCRIPTION,
                }),
            );
        }
        let required = object
            .entry("required")
            .or_insert_with(|| serde_json::Value::Array(Vec::new()));
        if let Some(required) = required.as_array_mut()
            && !required.iter().any(|r| r == "operation_id")
        {
            required.insert(0, "operation_id".into());
        }
        schema
    }
}
