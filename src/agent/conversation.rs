//! The conversation sent with every request: alternating user and assistant messages whose
//! content blocks are kept as JSON, exactly as they came or will go on the wire.

use serde_json::{Value, json};

/// A tool call from an assistant message.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ToolUse {
    pub id: String,
    pub name: String,
    pub input: Value,
}

/// The tool_use blocks of a message's content, in order.
pub(super) fn tool_uses(content: &[Value]) -> Vec<ToolUse> {
    content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
        .map(|b| ToolUse {
            id: str_field(b, "id"),
            name: str_field(b, "name"),
            input: b.get("input").cloned().unwrap_or_else(|| json!({})),
        })
        .collect()
}

fn str_field(block: &Value, name: &str) -> String {
    block
        .get(name)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// A tool_result content block.
pub(super) fn tool_result(tool_use_id: &str, content: &str, is_error: bool) -> Value {
    json!({
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": content,
        "is_error": is_error,
    })
}

/// A text content block.
pub(super) fn text(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Conversation {
    messages: Vec<Value>,
}

impl Conversation {
    pub(super) fn messages(&self) -> &[Value] {
        &self.messages
    }

    /// Adds user content. Consecutive user content joins one message, so tool results and a
    /// follow-up instruction reach the model as one turn with the results first, as the API
    /// requires.
    pub(super) fn push_user(&mut self, blocks: Vec<Value>) {
        if blocks.is_empty() {
            return;
        }
        if let Some(last) = self.messages.last_mut().filter(|m| m["role"] == "user")
            && let Some(Value::Array(content)) = last.get_mut("content")
        {
            content.extend(blocks);
            return;
        }
        self.messages
            .push(json!({"role": "user", "content": blocks}));
    }

    /// Adds an assistant message; an empty one is not sent (the API refuses it).
    pub(super) fn push_assistant(&mut self, content: Vec<Value>) {
        if !content.is_empty() {
            self.messages
                .push(json!({"role": "assistant", "content": content}));
        }
    }

    /// True when the last message is the user's, i.e. the model has something to answer.
    pub(super) fn awaits_reply(&self) -> bool {
        self.messages.last().is_some_and(|m| m["role"] == "user")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_content_merges_and_empty_assistant_messages_are_skipped() {
        let mut c = Conversation::default();
        assert!(!c.awaits_reply());
        c.push_user(vec![text("task")]);
        assert!(c.awaits_reply());
        c.push_assistant(Vec::new());
        c.push_assistant(vec![
            json!({"type": "tool_use", "id": "a", "name": "n", "input": {}}),
        ]);
        assert!(!c.awaits_reply());
        c.push_user(vec![tool_result("a", "ok", false)]);
        c.push_user(vec![text("and then")]);
        c.push_user(Vec::new());
        assert_eq!(c.messages().len(), 3);
        assert_eq!(c.messages()[2]["content"].as_array().map(Vec::len), Some(2));
        assert_eq!(c.messages()[2]["content"][0]["type"], "tool_result");
    }

    #[test]
    fn tool_uses_are_extracted_in_order() {
        let content = vec![
            text("x"),
            json!({"type": "tool_use", "id": "1", "name": "a", "input": {"k": 1}}),
            json!({"type": "tool_use", "id": "2", "name": "b"}),
        ];
        let uses = tool_uses(&content);
        assert_eq!(uses.len(), 2);
        assert_eq!(uses[0].input, json!({"k": 1}));
        assert_eq!(
            (uses[1].id.as_str(), uses[1].input.clone()),
            ("2", json!({}))
        );
    }
}
