//! Which reasoning parser a model id gets: a hand-typed table of real ids
//! (longest pattern wins, case-insensitive).

use smg_parsers::reasoning::detect;

#[test]
fn model_ids_map_to_their_family() {
    let table: &[(&str, Option<&str>)] = &[
        ("deepseek-ai/DeepSeek-R1", Some("deepseek_r1")),
        ("deepseek-ai/DeepSeek-R1-0528", Some("deepseek_r1")),
        (
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            Some("deepseek_r1"),
        ),
        ("deepseek-ai/DeepSeek-V3.1", Some("deepseek_v31")),
        ("deepseek-ai/DeepSeek-V3.1-Terminus", Some("deepseek_v31")),
        ("deepseek-v3-1-base", Some("deepseek_v31")),
        ("deepseek-ai/DeepSeek-V3", None),
        ("Qwen/Qwen3-8B", Some("qwen3")),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", Some("qwen3")),
        ("Qwen/Qwen3-30B-A3B-Thinking-2507", Some("qwen3_thinking")),
        (
            "Qwen/Qwen3-235B-A22B-Thinking-2507-FP8",
            Some("qwen3_thinking"),
        ),
        ("Qwen/Qwen3-4B-Instruct-2507", Some("qwen3")),
        ("qwen3-thinking", Some("qwen3_thinking")),
        ("Qwen/Qwen2.5-7B-Instruct", None),
        ("zai-org/GLM-4.5", Some("glm45")),
        ("zai-org/GLM-4.5-Air", Some("glm45")),
        ("zai-org/GLM-4.6", Some("glm45")),
        ("zai-org/GLM-4.7-FP8", Some("glm45")),
        ("zai-org/glm-5", Some("glm45")),
        ("glm45-test", Some("glm45")),
        ("THUDM/glm-4-9b-chat", None),
        ("moonshotai/Kimi-K2-Instruct", Some("kimi")),
        ("moonshotai/Kimi-K2-Thinking", Some("kimi_thinking")),
        ("moonshotai/Kimi-K2.5", Some("kimi_k25")),
        ("moonshotai/Kimi-VL-A3B-Thinking", Some("kimi")),
        ("meta-llama/Llama-3.1-8B-Instruct", None),
        ("", None),
    ];
    for (id, parser) in table {
        assert_eq!(detect(id), *parser, "{id}");
    }
}
