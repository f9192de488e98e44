//! Every reasoning parser against a hand-written table of model outputs:
//! parsed whole, then streamed at every split point and one character at a
//! time, which must give the same reasoning and content (split invariance),
//! with nothing left held back after `finish`.

use smg_parsers::reasoning::{
    self, PARSER_NAMES, ReasoningDelta, ReasoningOptions, ReasoningParser, UnknownParser,
};

const DS_CALLS_BEGIN: &str = "<\u{ff5c}tool\u{2581}calls\u{2581}begin\u{ff5c}>";
const DS_CALL_BEGIN: &str = "<\u{ff5c}tool\u{2581}call\u{2581}begin\u{ff5c}>";
const DS_SEP: &str = "<\u{ff5c}tool\u{2581}sep\u{ff5c}>";
const DS_CALL_END: &str = "<\u{ff5c}tool\u{2581}call\u{2581}end\u{ff5c}>";
const DS_CALLS_END: &str = "<\u{ff5c}tool\u{2581}calls\u{2581}end\u{ff5c}>";

/// Marker text that must never reach reasoning or content in a well-formed
/// case (tool markers may reach content: the tool parser needs them).
const THINK_MARKERS: &[&str] = &[
    "<think>",
    "</think>",
    "\u{25c1}think\u{25b7}",
    "\u{25c1}/think\u{25b7}",
];

struct Case {
    parser: &'static str,
    /// `ReasoningOptions::starts_in_reasoning`.
    started: bool,
    /// `ReasoningOptions::tool_call_ends_reasoning`.
    tool_cut: bool,
    text: String,
    reasoning: String,
    content: String,
    /// The output writes marker text as text (after the answer began, or a
    /// marker that never completed): the no-marker check does not apply.
    literal_markers: bool,
}

fn case(parser: &'static str, text: &str, reasoning: &str, content: &str) -> Case {
    Case {
        parser,
        started: false,
        tool_cut: true,
        text: text.to_owned(),
        reasoning: reasoning.to_owned(),
        content: content.to_owned(),
        literal_markers: false,
    }
}

impl Case {
    fn started(mut self) -> Self {
        self.started = true;
        self
    }
    fn without_tool_cut(mut self) -> Self {
        self.tool_cut = false;
        self
    }
    fn with_literal_markers(mut self) -> Self {
        self.literal_markers = true;
        self
    }
    fn parser(&self) -> Box<dyn ReasoningParser> {
        let options = ReasoningOptions {
            starts_in_reasoning: self.started,
            tool_call_ends_reasoning: self.tool_cut,
        };
        match reasoning::create(self.parser, options) {
            Ok(parser) => parser,
            Err(err) => panic!("{err}"),
        }
    }
    fn label(&self) -> String {
        format!(
            "{} (started {}, tool cut {}) on {:?}",
            self.parser, self.started, self.tool_cut, self.text
        )
    }
}

fn deepseek_call() -> String {
    format!(
        "{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}get_weather\n```json\n{{\"city\": \"Paris\"}}\n```{DS_CALL_END}{DS_CALLS_END}"
    )
}

const KIMI_CALL: &str = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0\
    <|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>";
const HERMES_CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const GLM_CALL: &str =
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>";

fn cases() -> Vec<Case> {
    let ds_call = deepseek_call();
    vec![
        // qwen3: the model writes <think> itself.
        case(
            "qwen3",
            "<think>\nThe user wants 2+2.\n</think>\n\nThe answer is 4.",
            "\nThe user wants 2+2.\n",
            "The answer is 4.",
        ),
        case("qwen3", "The answer is 4.", "", "The answer is 4."),
        case("qwen3", "<think>cut off mid-thou", "cut off mid-thou", ""),
        case("qwen3", "\n<think>a</think>b", "a", "\nb"),
        case("qwen3", "<think></think>answer", "", "answer"),
        case("qwen3", "<think>\n\n</think>\n\n", "\n\n", ""),
        // Only the whitespace right after the end marker goes.
        case(
            "qwen3",
            "<think>r</think>\n \n\tA\n\nB \n",
            "r",
            "A\n\nB \n",
        ),
        case(
            "qwen3",
            &format!("<think>plan: call the tool</think>\n\n{HERMES_CALL}"),
            "plan: call the tool",
            HERMES_CALL,
        ),
        case(
            "qwen3",
            &format!("<think>I need the weather. {HERMES_CALL}"),
            "I need the weather. ",
            HERMES_CALL,
        ),
        case(
            "qwen3",
            "<think>I need <tool_call>x</tool_call> here</think>done",
            "I need <tool_call>x</tool_call> here",
            "done",
        )
        .without_tool_cut(),
        case(
            "qwen3",
            "answer first <think>x</think>",
            "",
            "answer first <think>x</think>",
        )
        .with_literal_markers(),
        case("qwen3", "<thin", "", "<thin").with_literal_markers(),
        case("qwen3", "<think>abc</thi", "abc</thi", "").with_literal_markers(),
        case(
            "qwen3",
            "<think>a < b and c <= d</think>so",
            "a < b and c <= d",
            "so",
        ),
        case(
            "qwen3",
            "<think>思考：二加二。</think>答案是 4。",
            "思考：二加二。",
            "答案是 4。",
        ),
        case("qwen3", "reasoning</think>answer", "reasoning", "answer").started(),
        case(
            "qwen3",
            "<think>\nreasoning</think>answer",
            "\nreasoning",
            "answer",
        )
        .started(),
        case("qwen3", " \n<think>r</think>a", " \nr", "a").started(),
        case("qwen3", "x <think> y</think>z", "x <think> y", "z")
            .started()
            .with_literal_markers(),
        case("qwen3", "", "", ""),
        case("qwen3", "", "", "").started(),
        // qwen3_thinking: the prompt ends in <think>; always in reasoning.
        case(
            "qwen3_thinking",
            "Let me see.\n</think>\n\nParis.",
            "Let me see.\n",
            "Paris.",
        ),
        case(
            "qwen3_thinking",
            "<think>Let me see.</think>Paris.",
            "Let me see.",
            "Paris.",
        ),
        case(
            "qwen3_thinking",
            "Still thinking when cut",
            "Still thinking when cut",
            "",
        ),
        case(
            "qwen3_thinking",
            &format!("Need a tool.</think>\n\n{HERMES_CALL}"),
            "Need a tool.",
            HERMES_CALL,
        ),
        // deepseek_r1: always in reasoning; DeepSeek tool markers cut it.
        case(
            "deepseek_r1",
            "<think>\nOkay, 2+2.\n</think>\n\n**4**",
            "\nOkay, 2+2.\n",
            "**4**",
        ),
        case("deepseek_r1", "Okay.\n</think>\n\n4", "Okay.\n", "4"),
        case(
            "deepseek_r1",
            &format!("I should look it up.{ds_call}"),
            "I should look it up.",
            &ds_call,
        ),
        case(
            "deepseek_r1",
            &format!("I should look it up.</think>\n\n{ds_call}"),
            "I should look it up.",
            &ds_call,
        ),
        // deepseek_v31: thinking off by default; on, the prompt opened it.
        case("deepseek_v31", "Plain answer.", "", "Plain answer."),
        case("deepseek_v31", "Hmm.</think>Answer.", "Hmm.", "Answer.").started(),
        case("deepseek_v31", &format!("Hmm.{ds_call}"), "Hmm.", &ds_call).started(),
        // glm45: the model writes <think>.
        case(
            "glm45",
            &format!("<think>Weather needs a tool.</think>\n{GLM_CALL}"),
            "Weather needs a tool.",
            GLM_CALL,
        ),
        // The newline before <think> is the answer's; the one after </think> goes.
        case("glm45", "\n<think></think>\nHello.", "", "\nHello."),
        case(
            "glm45",
            &format!("<think>Weather needs a tool.{GLM_CALL}"),
            "Weather needs a tool.",
            GLM_CALL,
        ),
        // kimi: ◁think▷ … ◁/think▷.
        case(
            "kimi",
            "\u{25c1}think\u{25b7}嗯，让我想想。\u{25c1}/think\u{25b7}答案是4",
            "嗯，让我想想。",
            "答案是4",
        ),
        case(
            "kimi",
            "\u{25c1}think\u{25b7}a \u{25c1} b\u{25c1}/think\u{25b7}c",
            "a \u{25c1} b",
            "c",
        ),
        case(
            "kimi",
            "<think>not kimi's</think>",
            "",
            "<think>not kimi's</think>",
        )
        .with_literal_markers(),
        // kimi_thinking: always in reasoning; the section marker cuts it.
        case(
            "kimi_thinking",
            &format!("Check the weather.{KIMI_CALL}"),
            "Check the weather.",
            KIMI_CALL,
        ),
        case(
            "kimi_thinking",
            &format!("<think>Check.</think>{KIMI_CALL}"),
            "Check.",
            KIMI_CALL,
        ),
        case(
            "kimi_thinking",
            "Check.<|tool_call_section_begin|>x",
            "Check.",
            "<|tool_call_section_begin|>x",
        ),
        case(
            "kimi_thinking",
            &format!("Check.{KIMI_CALL}</think>"),
            &format!("Check.{KIMI_CALL}"),
            "",
        )
        .without_tool_cut()
        .with_literal_markers(),
        // kimi_k25: the switch decides; the model writes <think>.
        case("kimi_k25", "<think>x</think>y", "x", "y"),
        // passthrough: no reasoning.
        case("passthrough", "<think>x</think>y", "", "<think>x</think>y").with_literal_markers(),
        case("passthrough", "<think>x</think>y", "", "<think>x</think>y")
            .started()
            .with_literal_markers(),
    ]
}

/// Feeds `chunks` and returns the concatenated output, checking that a
/// second `finish` has nothing left.
fn run(case: &Case, chunks: &[&str]) -> ReasoningDelta {
    let mut parser = case.parser();
    let mut total = ReasoningDelta::default();
    for chunk in chunks {
        total.append(parser.push(chunk));
    }
    total.append(parser.finish());
    assert!(
        parser.finish().is_empty(),
        "{}: something was still held back after finish",
        case.label()
    );
    total
}

fn char_boundaries(text: &str) -> Vec<usize> {
    (0..=text.len())
        .filter(|&at| text.is_char_boundary(at))
        .collect()
}

#[test]
fn every_case_parsed_whole_gives_the_expected_reasoning_and_content() {
    for case in cases() {
        let whole = run(&case, &[&case.text]);
        assert_eq!(
            whole.reasoning,
            case.reasoning,
            "reasoning of {}",
            case.label()
        );
        assert_eq!(whole.content, case.content, "content of {}", case.label());
        let via_helper = reasoning::parse_complete(case.parser().as_mut(), &case.text);
        assert_eq!(via_helper, whole, "{}", case.label());
    }
}

#[test]
fn the_table_itself_has_no_think_markers_in_well_formed_outputs() {
    for case in cases().iter().filter(|case| !case.literal_markers) {
        for marker in THINK_MARKERS {
            assert!(
                !case.reasoning.contains(marker) && !case.content.contains(marker),
                "{}",
                case.label()
            );
        }
    }
}

#[test]
fn every_split_point_gives_the_same_result_as_the_whole() {
    for case in cases() {
        for at in char_boundaries(&case.text) {
            let (head, tail) = case.text.split_at(at);
            let split = run(&case, &[head, tail]);
            assert_eq!(
                split.reasoning,
                case.reasoning,
                "split at {at}: {}",
                case.label()
            );
            assert_eq!(
                split.content,
                case.content,
                "split at {at}: {}",
                case.label()
            );
        }
    }
}

#[test]
fn every_pair_of_split_points_gives_the_same_result_as_the_whole() {
    for case in cases()
        .iter()
        .filter(|case| case.text.chars().count() <= 120)
    {
        let boundaries = char_boundaries(&case.text);
        for (i, &first) in boundaries.iter().enumerate() {
            for &second in &boundaries[i..] {
                let chunks = [
                    &case.text[..first],
                    &case.text[first..second],
                    &case.text[second..],
                ];
                let split = run(case, &chunks);
                assert_eq!(
                    (split.reasoning.as_str(), split.content.as_str()),
                    (case.reasoning.as_str(), case.content.as_str()),
                    "splits at {first} and {second}: {}",
                    case.label()
                );
            }
        }
    }
}

#[test]
fn one_character_at_a_time_gives_the_same_result_as_the_whole() {
    for case in cases() {
        let mut chars = [0u8; 4];
        let chunks: Vec<String> = case
            .text
            .chars()
            .map(|c| c.encode_utf8(&mut chars).to_owned())
            .collect();
        let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
        let streamed = run(&case, &chunks);
        assert_eq!(streamed.reasoning, case.reasoning, "{}", case.label());
        assert_eq!(streamed.content, case.content, "{}", case.label());
    }
}

#[test]
fn no_single_delta_carries_a_think_marker_at_any_split() {
    for case in cases().iter().filter(|case| !case.literal_markers) {
        for at in char_boundaries(&case.text) {
            let mut parser = case.parser();
            let (head, tail) = case.text.split_at(at);
            let deltas = [parser.push(head), parser.push(tail), parser.finish()];
            for delta in deltas {
                for marker in THINK_MARKERS {
                    assert!(
                        !delta.reasoning.contains(marker) && !delta.content.contains(marker),
                        "split at {at}: {}",
                        case.label()
                    );
                }
            }
        }
    }
}

#[test]
fn only_a_possible_partial_marker_is_held_back() {
    let mut parser = match reasoning::create("qwen3", ReasoningOptions::default()) {
        Ok(parser) => parser,
        Err(err) => panic!("{err}"),
    };
    let opened = parser.push("<think>abc");
    assert_eq!(opened.reasoning, "abc");
    // `</thi` might be the end marker: held. `x</thi` sends `x`.
    assert_eq!(parser.push("x</thi").reasoning, "x");
    // Not the end marker after all: everything goes out.
    assert_eq!(parser.push("ng> a < b").reasoning, "</thing> a < b");
    assert_eq!(parser.push("<").reasoning, "");
    assert_eq!(parser.push("/think>\n").content, "");
    assert_eq!(parser.push("\nDone").content, "Done");
    assert!(parser.finish().is_empty());
}

#[test]
fn a_held_back_kimi_marker_splits_no_character() {
    let mut parser = match reasoning::create("kimi", ReasoningOptions::default()) {
        Ok(parser) => parser,
        Err(err) => panic!("{err}"),
    };
    assert_eq!(parser.push("\u{25c1}thi").reasoning, "");
    assert_eq!(parser.push("nk\u{25b7}é\u{25c1}/").reasoning, "é");
    let end = parser.push("think\u{25b7}ok");
    assert_eq!(
        end,
        ReasoningDelta {
            reasoning: String::new(),
            content: "ok".into()
        }
    );
}

#[test]
fn a_tool_marker_held_in_part_then_completed_opens_the_content() {
    let mut parser = match reasoning::create("kimi_thinking", ReasoningOptions::default()) {
        Ok(parser) => parser,
        Err(err) => panic!("{err}"),
    };
    assert_eq!(parser.push("plan<|tool_calls_sec").reasoning, "plan");
    let cut = parser.push("tion_begin|><|tool_call_begin|>");
    assert_eq!(cut.reasoning, "");
    assert_eq!(
        cut.content,
        "<|tool_calls_section_begin|><|tool_call_begin|>"
    );
}

#[test]
fn every_name_creates_a_parser_and_an_unknown_name_is_an_error() {
    for name in PARSER_NAMES {
        assert!(
            reasoning::create(name, ReasoningOptions::default()).is_ok(),
            "{name}"
        );
    }
    let err = reasoning::create("qwen4", ReasoningOptions::default()).map(|_| ());
    assert_eq!(
        err,
        Err(UnknownParser {
            name: "qwen4".into()
        })
    );
    let message = UnknownParser {
        name: "qwen4".into(),
    }
    .to_string();
    assert!(
        message.contains("qwen4") && message.contains("deepseek_r1"),
        "{message}"
    );
}

#[test]
fn tool_markers_are_listed_per_parser() {
    assert_eq!(reasoning::tool_markers("qwen3"), &["<tool_call>"]);
    assert_eq!(reasoning::tool_markers("deepseek_r1"), &[DS_CALLS_BEGIN]);
    assert!(reasoning::tool_markers("kimi_thinking").contains(&"<|tool_calls_section_begin|>"));
    assert!(reasoning::tool_markers("passthrough").is_empty());
    assert!(reasoning::tool_markers("nope").is_empty());
    assert!(reasoning::tool_call_ends_reasoning("kimi_thinking"));
    assert!(!reasoning::tool_call_ends_reasoning("qwen3"));
    assert!(!reasoning::tool_call_ends_reasoning("nope"));
}
