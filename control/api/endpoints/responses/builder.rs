//! A response's output items, built from parsed output as it arrives, and
//! the stream events that tell a client about them.
//!
//! Why it exists: streamed and whole responses must end with the same
//! items, so both are built by this one state machine; a whole response
//! just drops the events. Items open lazily when their first piece arrives
//! and close when another kind starts: reasoning becomes a `reasoning`
//! item (`response.reasoning_text.delta`), text a `message` with one
//! `output_text` part, each tool call a `function_call` (arguments streamed
//! as `response.function_call_arguments.delta`) or, for a tool of an MCP
//! server, an `mcp_call` the gateway runs itself. Whitespace between items
//! is held back and dropped, as no client wants an empty message around a
//! call. The builder lives as long as the response: an MCP loop's later
//! generations add to the same output.

use std::collections::HashMap;

use crate::api::types::responses::{
    ContentPart, Item, ItemStatus, McpToolInfo, ReasoningPart, StreamEvent, ids,
};
use crate::pipeline::parsing::ParsedText;

/// The item text is going into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning(usize),
    Message(usize),
    Call(usize),
}

/// An MCP call the model asked for, to be run by the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PendingMcpCall {
    pub output_index: usize,
    pub server_label: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Default)]
pub(super) struct OutputBuilder {
    items: Vec<Item>,
    open: Option<Open>,
    held_whitespace: String,
    events: Vec<StreamEvent>,
    /// MCP tool name → its server's label.
    mcp_tools: HashMap<String, String>,
    /// The current generation's call index → output index.
    calls: HashMap<usize, usize>,
    /// The first output index of the current generation.
    generation_start: usize,
    pending_mcp: Vec<PendingMcpCall>,
    /// Whether the current generation called a function tool (the client
    /// must run it, so an MCP loop stops there).
    called_function: bool,
    pub reasoning_tokens: u32,
}

impl OutputBuilder {
    /// Which tool names are MCP tools, and of which server.
    pub(super) fn set_mcp_tools(&mut self, mcp_tools: HashMap<String, String>) {
        self.mcp_tools = mcp_tools;
    }

    /// The items so far.
    #[cfg(test)]
    pub(crate) fn items(&self) -> &[Item] {
        &self.items
    }

    pub(super) fn into_items(self) -> Vec<Item> {
        self.items
    }

    /// The events since the last call.
    pub(super) fn take_events(&mut self) -> Vec<StreamEvent> {
        std::mem::take(&mut self.events)
    }

    /// A new generation of the same response starts (MCP loop).
    pub(super) fn begin_generation(&mut self) {
        self.calls.clear();
        self.generation_start = self.items.len();
        self.called_function = false;
    }

    /// The items the current generation made.
    pub(super) fn generation_items(&self) -> &[Item] {
        &self.items[self.generation_start..]
    }

    pub(super) fn called_function(&self) -> bool {
        self.called_function
    }

    /// New output: `tokens` is how many tokens it came from.
    pub(super) fn delta(&mut self, parsed: ParsedText, tokens: usize) {
        if !parsed.reasoning.is_empty() {
            if parsed.content.is_empty() && parsed.calls.is_empty() {
                self.reasoning_tokens = self
                    .reasoning_tokens
                    .saturating_add(u32::try_from(tokens).unwrap_or(u32::MAX));
            }
            self.reasoning(parsed.reasoning);
        }
        self.text(parsed.content);
        for call in parsed.calls {
            let output_index = match (call.name, self.calls.get(&call.index)) {
                (None, Some(&index)) => index,
                (name, _) => {
                    self.held_whitespace.clear();
                    self.open_call(call.index, call.id, name.unwrap_or_default())
                }
            };
            self.arguments(output_index, call.arguments);
        }
    }

    fn reasoning(&mut self, text: String) {
        let index = match self.open {
            Some(Open::Reasoning(index)) => index,
            _ => {
                self.close(ItemStatus::Completed);
                let index = self.push_open(Item::Reasoning {
                    id: ids::mint(ids::REASONING),
                    summary: Vec::new(),
                    content: Vec::new(),
                    encrypted_content: None,
                    status: ItemStatus::InProgress,
                });
                self.open = Some(Open::Reasoning(index));
                index
            }
        };
        let Item::Reasoning { id, content, .. } = &mut self.items[index] else {
            return;
        };
        match content.first_mut() {
            Some(ReasoningPart::ReasoningText { text: all }) => all.push_str(&text),
            None => content.push(ReasoningPart::ReasoningText { text: text.clone() }),
        }
        self.events.push(StreamEvent::ReasoningTextDelta {
            item_id: id.clone(),
            output_index: index,
            content_index: 0,
            delta: text,
        });
    }

    fn text(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        // Trailing whitespace waits for text that is not whitespace:
        // whitespace before a call or the end is no part of the answer.
        let body = text.trim_end();
        if body.is_empty() {
            self.held_whitespace.push_str(&text);
            return;
        }
        let trailing = text[body.len()..].to_owned();
        let index = match self.open {
            Some(Open::Message(index)) => index,
            _ => self.open_message(),
        };
        let text = std::mem::take(&mut self.held_whitespace) + body;
        self.held_whitespace = trailing;
        let Item::Message { id, content, .. } = &mut self.items[index] else {
            return;
        };
        if let Some(ContentPart::OutputText { text: all, .. }) = content.first_mut() {
            all.push_str(&text);
        }
        self.events.push(StreamEvent::OutputTextDelta {
            item_id: id.clone(),
            output_index: index,
            content_index: 0,
            delta: text,
            logprobs: Vec::new(),
        });
    }

    fn open_message(&mut self) -> usize {
        self.close(ItemStatus::Completed);
        let id = ids::mint(ids::MESSAGE);
        let index = self.push_open(Item::Message {
            id: id.clone(),
            role: "assistant".into(),
            status: ItemStatus::InProgress,
            content: Vec::new(),
        });
        let part = ContentPart::output_text(String::new());
        if let Item::Message { content, .. } = &mut self.items[index] {
            content.push(part.clone());
        }
        self.events.push(StreamEvent::ContentPartAdded {
            item_id: id,
            output_index: index,
            content_index: 0,
            part,
        });
        self.open = Some(Open::Message(index));
        index
    }

    fn open_call(&mut self, call_index: usize, call_id: Option<String>, name: String) -> usize {
        self.close(ItemStatus::Completed);
        let item = match self.mcp_tools.get(&name) {
            Some(server_label) => Item::McpCall {
                id: ids::mint(ids::MCP_CALL),
                server_label: server_label.clone(),
                name,
                arguments: String::new(),
                output: None,
                error: None,
                status: ItemStatus::InProgress,
            },
            None => {
                self.called_function = true;
                Item::FunctionCall {
                    id: ids::mint(ids::FUNCTION_CALL),
                    call_id: call_id.unwrap_or_else(|| ids::mint(ids::CALL)),
                    name,
                    arguments: String::new(),
                    status: ItemStatus::InProgress,
                }
            }
        };
        let index = self.push_open(item);
        self.calls.insert(call_index, index);
        self.open = Some(Open::Call(index));
        index
    }

    fn arguments(&mut self, output_index: usize, delta: String) {
        if delta.is_empty() {
            return;
        }
        match &mut self.items[output_index] {
            Item::FunctionCall { id, arguments, .. } => {
                arguments.push_str(&delta);
                self.events.push(StreamEvent::FunctionCallArgumentsDelta {
                    item_id: id.clone(),
                    output_index,
                    delta,
                });
            }
            Item::McpCall { id, arguments, .. } => {
                arguments.push_str(&delta);
                self.events.push(StreamEvent::McpCallArgumentsDelta {
                    item_id: id.clone(),
                    output_index,
                    delta,
                });
            }
            _ => {}
        }
    }

    /// Adds `item` as open and says so.
    fn push_open(&mut self, item: Item) -> usize {
        let index = self.items.len();
        self.events.push(StreamEvent::OutputItemAdded {
            output_index: index,
            item: item.clone(),
        });
        self.items.push(item);
        index
    }

    fn item_done(&mut self, index: usize) {
        self.events.push(StreamEvent::OutputItemDone {
            output_index: index,
            item: self.items[index].clone(),
        });
    }

    /// Closes the open item with `status` (`incomplete` when the output
    /// was cut short).
    pub(super) fn close(&mut self, status: ItemStatus) {
        let Some(open) = self.open.take() else {
            return;
        };
        match open {
            Open::Reasoning(index) => {
                if let Item::Reasoning {
                    id,
                    content,
                    status: item_status,
                    ..
                } = &mut self.items[index]
                {
                    *item_status = status;
                    let text = content
                        .first()
                        .map(|ReasoningPart::ReasoningText { text }| text.clone())
                        .unwrap_or_default();
                    self.events.push(StreamEvent::ReasoningTextDone {
                        item_id: id.clone(),
                        output_index: index,
                        content_index: 0,
                        text,
                    });
                }
                self.item_done(index);
            }
            Open::Message(index) => {
                if let Item::Message {
                    id,
                    content,
                    status: item_status,
                    ..
                } = &mut self.items[index]
                {
                    *item_status = status;
                    let part = content
                        .first()
                        .cloned()
                        .unwrap_or_else(|| ContentPart::output_text(String::new()));
                    let text = match &part {
                        ContentPart::OutputText { text, .. } => text.clone(),
                        _ => String::new(),
                    };
                    self.events.push(StreamEvent::OutputTextDone {
                        item_id: id.clone(),
                        output_index: index,
                        content_index: 0,
                        text,
                        logprobs: Vec::new(),
                    });
                    self.events.push(StreamEvent::ContentPartDone {
                        item_id: id.clone(),
                        output_index: index,
                        content_index: 0,
                        part,
                    });
                }
                self.item_done(index);
            }
            Open::Call(index) => match &mut self.items[index] {
                Item::FunctionCall {
                    id,
                    name,
                    arguments,
                    status: item_status,
                    ..
                } => {
                    *item_status = status;
                    self.events.push(StreamEvent::FunctionCallArgumentsDone {
                        item_id: id.clone(),
                        output_index: index,
                        name: name.clone(),
                        arguments: arguments.clone(),
                    });
                    self.item_done(index);
                }
                Item::McpCall {
                    id,
                    server_label,
                    name,
                    arguments,
                    ..
                } => {
                    self.events.push(StreamEvent::McpCallArgumentsDone {
                        item_id: id.clone(),
                        output_index: index,
                        arguments: arguments.clone(),
                    });
                    // Done once the gateway has run it.
                    self.pending_mcp.push(PendingMcpCall {
                        output_index: index,
                        server_label: server_label.clone(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                    });
                }
                _ => {}
            },
        }
    }

    /// The generation ended: closes what is open. Whitespace is an answer
    /// when nothing else came.
    pub(super) fn end_generation(&mut self, status: ItemStatus) {
        if self.items.len() == self.generation_start && !self.held_whitespace.is_empty() {
            let text = std::mem::take(&mut self.held_whitespace);
            let index = self.open_message();
            if let Item::Message { id, content, .. } = &mut self.items[index] {
                if let Some(ContentPart::OutputText { text: all, .. }) = content.first_mut() {
                    all.push_str(&text);
                }
                self.events.push(StreamEvent::OutputTextDelta {
                    item_id: id.clone(),
                    output_index: index,
                    content_index: 0,
                    delta: text,
                    logprobs: Vec::new(),
                });
            }
        }
        self.held_whitespace.clear();
        self.close(status);
    }

    /// The MCP calls the generation asked for, not yet run.
    pub(super) fn take_pending_mcp(&mut self) -> Vec<PendingMcpCall> {
        std::mem::take(&mut self.pending_mcp)
    }

    /// An MCP call starts running.
    pub(super) fn mcp_call_started(&mut self, output_index: usize) {
        if let Item::McpCall { id, .. } = &self.items[output_index] {
            self.events.push(StreamEvent::McpCallInProgress {
                item_id: id.clone(),
                output_index,
            });
        }
    }

    /// An MCP call ended with its output, or an error.
    pub(super) fn mcp_call_finished(
        &mut self,
        output_index: usize,
        result: Result<String, String>,
    ) {
        let Item::McpCall {
            id,
            output,
            error,
            status,
            ..
        } = &mut self.items[output_index]
        else {
            return;
        };
        let id = id.clone();
        let event = match result {
            Ok(text) => {
                *output = Some(text);
                *status = ItemStatus::Completed;
                StreamEvent::McpCallCompleted {
                    item_id: id,
                    output_index,
                }
            }
            Err(message) => {
                *error = Some(message);
                *status = ItemStatus::Failed;
                StreamEvent::McpCallFailed {
                    item_id: id,
                    output_index,
                }
            }
        };
        self.events.push(event);
        self.item_done(output_index);
    }

    /// An MCP server's tools were listed (or could not be: `error`).
    pub(super) fn mcp_list_tools(
        &mut self,
        server_label: String,
        tools: Vec<McpToolInfo>,
        error: Option<String>,
    ) {
        self.close(ItemStatus::Completed);
        let id = ids::mint(ids::MCP_LIST_TOOLS);
        let failed = error.is_some();
        let index = self.push_open(Item::McpListTools {
            id: id.clone(),
            server_label,
            tools: Vec::new(),
            error: None,
        });
        self.events.push(StreamEvent::McpListToolsInProgress {
            item_id: id.clone(),
            output_index: index,
        });
        if let Item::McpListTools {
            tools: listed,
            error: item_error,
            ..
        } = &mut self.items[index]
        {
            *listed = tools;
            *item_error = error;
        }
        self.events.push(if failed {
            StreamEvent::McpListToolsFailed {
                item_id: id,
                output_index: index,
            }
        } else {
            StreamEvent::McpListToolsCompleted {
                item_id: id,
                output_index: index,
            }
        });
        self.item_done(index);
        self.generation_start = self.items.len();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pipeline::parsing::ToolCallDelta;

    fn parsed(reasoning: &str, content: &str, calls: Vec<ToolCallDelta>) -> ParsedText {
        ParsedText {
            reasoning: reasoning.into(),
            content: content.into(),
            calls,
        }
    }

    fn call(index: usize, name: Option<&str>, arguments: &str) -> ToolCallDelta {
        ToolCallDelta {
            index,
            id: name.map(|_| format!("call_{index}")),
            name: name.map(str::to_owned),
            arguments: arguments.into(),
        }
    }

    fn names(events: &[StreamEvent]) -> Vec<&'static str> {
        events.iter().map(StreamEvent::name).collect()
    }

    #[test]
    fn reasoning_then_text_then_a_call_stream_as_three_items() {
        let mut builder = OutputBuilder::default();
        builder.begin_generation();
        builder.delta(parsed("let me", "", vec![]), 2);
        builder.delta(parsed(" think", "", vec![]), 1);
        builder.delta(parsed("", "\n\n", vec![]), 1);
        builder.delta(parsed("", "Sure.", vec![]), 1);
        builder.delta(parsed("", "\n", vec![call(0, Some("get"), "{\"a\":")]), 3);
        builder.delta(parsed("", "", vec![call(0, None, "1}")]), 2);
        builder.end_generation(ItemStatus::Completed);
        let events = builder.take_events();
        assert_eq!(
            names(&events),
            [
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let items = builder.items();
        assert_eq!(items.len(), 3);
        let Item::Message { content, .. } = &items[1] else {
            panic!("{items:?}")
        };
        // The whitespace between reasoning and text is held, then dropped
        // before the call.
        assert_eq!(content[0], ContentPart::output_text("\n\nSure.".into()));
        let Item::FunctionCall {
            call_id,
            name,
            arguments,
            status,
            ..
        } = &items[2]
        else {
            panic!("{items:?}")
        };
        assert_eq!((call_id.as_str(), name.as_str()), ("call_0", "get"));
        assert_eq!(arguments, "{\"a\":1}");
        assert_eq!(*status, ItemStatus::Completed);
        assert_eq!(builder.reasoning_tokens, 3);
        assert!(builder.called_function());
    }

    #[test]
    fn whitespace_alone_is_an_answer_and_a_cut_message_is_incomplete() {
        let mut builder = OutputBuilder::default();
        builder.begin_generation();
        builder.delta(parsed("", " ", vec![]), 1);
        builder.end_generation(ItemStatus::Incomplete);
        let Item::Message {
            content, status, ..
        } = &builder.items()[0]
        else {
            panic!()
        };
        assert_eq!(content[0], ContentPart::output_text(" ".into()));
        assert_eq!(*status, ItemStatus::Incomplete);
    }

    #[test]
    fn mcp_calls_wait_for_the_gateway_to_run_them() {
        let tools = HashMap::from([("add".to_owned(), "calc".to_owned())]);
        let mut builder = OutputBuilder::default();
        builder.set_mcp_tools(tools);
        builder.mcp_list_tools("calc".into(), Vec::new(), None);
        builder.begin_generation();
        builder.delta(parsed("", "", vec![call(0, Some("add"), "{\"a\":1}")]), 3);
        builder.end_generation(ItemStatus::Completed);
        let pending = builder.take_pending_mcp();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].output_index, 1);
        assert_eq!(pending[0].server_label, "calc");
        assert!(!builder.called_function());
        builder.mcp_call_started(1);
        builder.mcp_call_finished(1, Ok("2".into()));
        assert_eq!(
            names(&builder.take_events()),
            [
                "response.output_item.added",
                "response.mcp_list_tools.in_progress",
                "response.mcp_list_tools.completed",
                "response.output_item.done",
                "response.output_item.added",
                "response.mcp_call_arguments.delta",
                "response.mcp_call_arguments.done",
                "response.mcp_call.in_progress",
                "response.mcp_call.completed",
                "response.output_item.done",
            ]
        );
        let Item::McpCall { output, status, .. } = &builder.items()[1] else {
            panic!()
        };
        assert_eq!(output.as_deref(), Some("2"));
        assert_eq!(*status, ItemStatus::Completed);
        assert_eq!(builder.generation_items().len(), 1);
    }
}
