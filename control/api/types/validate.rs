//! The parameter rules every endpoint shares.
//!
//! The same knob arrives under different names: `max_tokens` (OpenAI,
//! Anthropic), `max_completion_tokens` (newer OpenAI clients),
//! `sampling_params.max_new_tokens` (SGLang); `stop` or `stop_sequences`.
//! The rule must be the same everywhere, and the error must name the
//! parameter as this client spelled it. So each request type describes its
//! knobs in a [`SamplingFields`], and [`SamplingFields::check`] applies every
//! rule and returns the engine's [`Sampling`]; the smaller checks below are
//! the same functions the request types use for their own fields.
//!
//! Every failure is [`Error::invalid_parameter`] (`invalid_parameter`, 400).
//! Shapes (wrong types, unknown roles, missing fields) are the parser's job
//! and fail earlier as `invalid_request`.

use std::collections::BTreeMap;
use std::fmt;

use crate::engine::{Constraint, Sampling};
use crate::error::{Error, Result, excerpt};

use super::forms::InputItem;

/// The most sequences one request may ask for.
pub const MAX_N: u32 = 128;
/// The most stop strings one request may carry.
pub const MAX_STOP_STRINGS: usize = 16;
/// The most alternatives per position a request may ask logprobs for.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// What the gateway knows about the served model when it validates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// The most output tokens a request may ask for (e.g. the model's context
    /// length); `None` sets no cap.
    pub max_output_tokens: Option<u32>,
}

/// An interval of allowed float values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloatRange {
    pub min: f32,
    pub min_inclusive: bool,
    pub max: f32,
}

impl FloatRange {
    /// `[min, max]`.
    pub const fn closed(min: f32, max: f32) -> Self {
        Self {
            min,
            min_inclusive: true,
            max,
        }
    }

    /// `(min, max]`.
    pub const fn open_closed(min: f32, max: f32) -> Self {
        Self {
            min,
            min_inclusive: false,
            max,
        }
    }

    /// Whether `value` is finite and inside the range.
    pub fn contains(self, value: f32) -> bool {
        let above_min = if self.min_inclusive {
            value >= self.min
        } else {
            value > self.min
        };
        value.is_finite() && above_min && value <= self.max
    }
}

impl fmt::Display for FloatRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let open = if self.min_inclusive { '[' } else { '(' };
        write!(f, "{open}{}, {}]", self.min, self.max)
    }
}

pub const TEMPERATURE: FloatRange = FloatRange::closed(0.0, 2.0);
pub const TOP_P: FloatRange = FloatRange::open_closed(0.0, 1.0);
pub const MIN_P: FloatRange = FloatRange::closed(0.0, 1.0);
/// Presence and frequency penalties.
pub const PENALTY: FloatRange = FloatRange::closed(-2.0, 2.0);
pub const REPETITION_PENALTY: FloatRange = FloatRange::open_closed(0.0, 2.0);
pub const LOGIT_BIAS: FloatRange = FloatRange::closed(-100.0, 100.0);

/// Checks an optional float against `range`; NaN and infinities never pass.
pub fn check_float(param: &str, value: Option<f32>, range: FloatRange) -> Result<()> {
    match value {
        Some(value) if !value.is_finite() => {
            Err(Error::invalid_parameter(param, "must be a finite number"))
        }
        Some(value) if !range.contains(value) => Err(Error::invalid_parameter(
            param,
            format!("must be within {range}, got {value}"),
        )),
        _ => Ok(()),
    }
}

/// `top_k`: -1 (disabled) or at least 1.
pub fn check_top_k(param: &str, value: Option<i32>) -> Result<()> {
    match value {
        Some(k) if k != -1 && k < 1 => Err(Error::invalid_parameter(
            param,
            format!("must be -1 (disabled) or at least 1, got {k}"),
        )),
        _ => Ok(()),
    }
}

/// An integer that must lie in `min..=max`.
pub fn check_count(param: &str, value: u32, min: u32, max: u32) -> Result<()> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid_parameter(
            param,
            format!("must be between {min} and {max}, got {value}"),
        ))
    }
}

/// The output-token limit: at least 1 and within the model's cap.
pub fn check_max_tokens(param: &str, value: u32, limits: &Limits) -> Result<()> {
    if value < 1 {
        return Err(Error::invalid_parameter(param, "must be at least 1"));
    }
    match limits.max_output_tokens {
        Some(cap) if value > cap => Err(Error::invalid_parameter(
            param,
            format!("must be at most {cap} for this model, got {value}"),
        )),
        _ => Ok(()),
    }
}

/// A count of logprob alternatives (`top_logprobs`, completions'
/// `logprobs`, `top_logprobs_num`). `switch_off` names the switch that must
/// enable it (`logprobs`, `return_logprob`) when that switch is off.
pub fn check_top_logprobs(param: &str, value: Option<u32>, switch_off: Option<&str>) -> Result<()> {
    let Some(value) = value else {
        return Ok(());
    };
    if let Some(switch) = switch_off {
        return Err(Error::invalid_parameter(
            param,
            format!("requires {switch} to be true"),
        ));
    }
    check_count(param, value, 0, MAX_TOP_LOGPROBS)
}

/// Stop strings: at most [`MAX_STOP_STRINGS`], none empty.
pub fn check_stop_strings(param: &str, stops: &[String]) -> Result<()> {
    if stops.len() > MAX_STOP_STRINGS {
        return Err(Error::invalid_parameter(
            param,
            format!(
                "may hold at most {MAX_STOP_STRINGS} stop strings, got {}",
                stops.len()
            ),
        ));
    }
    if let Some(index) = stops.iter().position(String::is_empty) {
        return Err(Error::invalid_parameter(
            param,
            format!("stop string {index} is empty"),
        ));
    }
    Ok(())
}

/// `logit_bias`: token-id keys, biases within [-100, 100].
pub fn check_logit_bias(param: &str, bias: &BTreeMap<String, f32>) -> Result<Vec<(String, f32)>> {
    bias.iter()
        .map(|(token, &value)| {
            if token.parse::<u32>().is_err() {
                return Err(Error::invalid_parameter(
                    param,
                    format!("keys must be token ids, got {:?}", excerpt(token)),
                ));
            }
            if !LOGIT_BIAS.contains(value) {
                return Err(Error::invalid_parameter(
                    param,
                    format!("bias for token {token} must be a finite number within {LOGIT_BIAS}"),
                ));
            }
            Ok((token.clone(), value))
        })
        .collect()
}

/// Prompts: at least one, none empty.
pub fn check_inputs(param: &str, items: &[InputItem]) -> Result<()> {
    if items.is_empty() {
        return Err(Error::invalid_parameter(param, "must not be empty"));
    }
    if let Some(index) = items.iter().position(InputItem::is_empty) {
        return Err(Error::invalid_parameter(
            param,
            format!("input {index} is empty"),
        ));
    }
    Ok(())
}

/// At most one structured-output constraint: `(parameter, constraint)` for
/// each one the request sets.
pub fn single_constraint(
    candidates: impl IntoIterator<Item = (&'static str, Option<Constraint>)>,
) -> Result<Option<Constraint>> {
    let mut chosen: Option<(&str, Constraint)> = None;
    for (param, constraint) in candidates {
        let Some(constraint) = constraint else {
            continue;
        };
        if let Some((first, _)) = &chosen {
            return Err(Error::invalid_parameter(
                param,
                format!("cannot be combined with {first}: set one structured-output constraint"),
            ));
        }
        chosen = Some((param, constraint));
    }
    Ok(chosen.map(|(_, constraint)| constraint))
}

/// The sampling knobs of one generation request as the client sent them,
/// with the names it used for the ones whose names differ by dialect.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingFields<'a> {
    /// Put before every parameter name in errors (`"sampling_params."` for
    /// SGLang, `""` otherwise).
    pub param_prefix: &'static str,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// The output-token limit and the parameter that set it.
    pub max_tokens: Option<(&'static str, u32)>,
    /// The minimum output length and the parameter that set it.
    pub min_tokens: Option<(&'static str, u32)>,
    pub n: Option<u32>,
    /// The stop strings and the parameter that carried them.
    pub stop: Option<(&'static str, &'a [String])>,
    pub stop_token_ids: &'a [u32],
    pub logit_bias: Option<&'a BTreeMap<String, f32>>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
    pub no_stop_trim: bool,
    pub constraint: Option<Constraint>,
}

/// Validated sampling: what the engine gets, and the string stops the
/// gateway trims itself (engines run without a tokenizer).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedSampling {
    pub sampling: Sampling,
    pub stop_strings: Vec<String>,
}

impl SamplingFields<'_> {
    /// Applies every rule, in the order a client reads its request, and
    /// builds the engine's sampling.
    pub fn check(self, limits: &Limits) -> Result<CheckedSampling> {
        let name = |param: &str| format!("{}{param}", self.param_prefix);
        check_float(&name("temperature"), self.temperature, TEMPERATURE)?;
        check_float(&name("top_p"), self.top_p, TOP_P)?;
        check_top_k(&name("top_k"), self.top_k)?;
        check_float(&name("min_p"), self.min_p, MIN_P)?;
        check_float(&name("presence_penalty"), self.presence_penalty, PENALTY)?;
        check_float(&name("frequency_penalty"), self.frequency_penalty, PENALTY)?;
        check_float(
            &name("repetition_penalty"),
            self.repetition_penalty,
            REPETITION_PENALTY,
        )?;
        if let Some((param, max_tokens)) = self.max_tokens {
            check_max_tokens(&name(param), max_tokens, limits)?;
        }
        if let Some((param, min_tokens)) = self.min_tokens
            && let Some((max_param, max_tokens)) = self.max_tokens
            && min_tokens > max_tokens
        {
            return Err(Error::invalid_parameter(
                &name(param),
                format!(
                    "must not exceed {}{max_param} ({max_tokens})",
                    self.param_prefix
                ),
            ));
        }
        let n = self.n.unwrap_or(1);
        check_count(&name("n"), n, 1, MAX_N)?;
        let stop_strings = match self.stop {
            Some((param, stops)) => {
                check_stop_strings(&name(param), stops)?;
                stops.to_vec()
            }
            None => Vec::new(),
        };
        let logit_bias = match self.logit_bias {
            Some(bias) => check_logit_bias(&name("logit_bias"), bias)?,
            None => Vec::new(),
        };
        Ok(CheckedSampling {
            sampling: Sampling {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                min_p: self.min_p,
                frequency_penalty: self.frequency_penalty,
                presence_penalty: self.presence_penalty,
                repetition_penalty: self.repetition_penalty,
                max_new_tokens: self.max_tokens.map(|(_, value)| value),
                min_new_tokens: self.min_tokens.map_or(0, |(_, value)| value),
                stop_token_ids: self.stop_token_ids.to_vec(),
                ignore_eos: self.ignore_eos,
                skip_special_tokens: self.skip_special_tokens,
                spaces_between_special_tokens: self.spaces_between_special_tokens,
                no_stop_trim: self.no_stop_trim,
                n,
                logit_bias,
                constraint: self.constraint,
            },
            stop_strings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    /// Fields with nothing set, as a request that sends only its prompt.
    fn unset() -> SamplingFields<'static> {
        SamplingFields {
            param_prefix: "",
            temperature: None,
            top_p: None,
            top_k: None,
            min_p: None,
            frequency_penalty: None,
            presence_penalty: None,
            repetition_penalty: None,
            max_tokens: None,
            min_tokens: None,
            n: None,
            stop: None,
            stop_token_ids: &[],
            logit_bias: None,
            ignore_eos: false,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            no_stop_trim: false,
            constraint: None,
        }
    }

    fn assert_invalid(result: Result<CheckedSampling>, param: &str, case: &str) {
        let err = result.expect_err(case);
        assert_eq!(err.code, ErrorCode::InvalidParameter, "{case}: {err}");
        assert_eq!(err.param.as_deref(), Some(param), "{case}: {err}");
    }

    #[test]
    fn float_ranges_accept_their_bounds_and_reject_outside_and_non_finite() {
        type Setter = fn(&mut SamplingFields<'static>, f32);
        // (parameter, setter, accepted values, rejected values)
        let table: [(&str, Setter, &[f32], &[f32]); 6] = [
            (
                "temperature",
                |f, v| f.temperature = Some(v),
                &[0.0, 0.7, 2.0],
                &[-0.01, 2.01],
            ),
            (
                "top_p",
                |f, v| f.top_p = Some(v),
                &[0.01, 1.0],
                &[0.0, 1.01],
            ),
            ("min_p", |f, v| f.min_p = Some(v), &[0.0, 1.0], &[-0.1, 1.1]),
            (
                "presence_penalty",
                |f, v| f.presence_penalty = Some(v),
                &[-2.0, 0.0, 2.0],
                &[-2.1, 2.1],
            ),
            (
                "frequency_penalty",
                |f, v| f.frequency_penalty = Some(v),
                &[-2.0, 2.0],
                &[-3.0, 3.0],
            ),
            (
                "repetition_penalty",
                |f, v| f.repetition_penalty = Some(v),
                &[0.01, 1.0, 2.0],
                &[0.0, 2.5],
            ),
        ];
        let non_finite = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        for (param, set, accepted, rejected) in table {
            for &value in accepted {
                let mut fields = unset();
                set(&mut fields, value);
                if let Err(err) = fields.check(&Limits::default()) {
                    panic!("{param}={value} should pass: {err}");
                }
            }
            for &value in rejected.iter().chain(&non_finite) {
                let mut fields = unset();
                set(&mut fields, value);
                assert_invalid(
                    fields.check(&Limits::default()),
                    param,
                    &format!("{param}={value}"),
                );
            }
        }
    }

    #[test]
    fn nan_is_reported_as_not_finite() {
        let mut fields = unset();
        fields.temperature = Some(f32::NAN);
        let err = fields.check(&Limits::default()).expect_err("NaN");
        assert_eq!(err.message, "must be a finite number");
    }

    #[test]
    fn integer_rules() {
        type Setter = fn(&mut SamplingFields<'static>);
        let rejected: [(&str, Setter); 6] = [
            ("top_k", |f| f.top_k = Some(0)),
            ("top_k", |f| f.top_k = Some(-2)),
            ("n", |f| f.n = Some(0)),
            ("n", |f| f.n = Some(MAX_N + 1)),
            ("max_tokens", |f| f.max_tokens = Some(("max_tokens", 0))),
            ("min_tokens", |f| {
                f.max_tokens = Some(("max_tokens", 4));
                f.min_tokens = Some(("min_tokens", 5));
            }),
        ];
        for (param, set) in rejected {
            let mut fields = unset();
            set(&mut fields);
            assert_invalid(fields.check(&Limits::default()), param, param);
        }
        let accepted: [Setter; 5] = [
            |f| f.top_k = Some(-1),
            |f| f.top_k = Some(1),
            |f| f.n = Some(MAX_N),
            |f| f.max_tokens = Some(("max_tokens", 1)),
            |f| {
                f.max_tokens = Some(("max_tokens", 4));
                f.min_tokens = Some(("min_tokens", 4));
            },
        ];
        for set in accepted {
            let mut fields = unset();
            set(&mut fields);
            fields.check(&Limits::default()).expect("within range");
        }
    }

    #[test]
    fn max_tokens_is_capped_by_the_limit_under_the_name_the_client_used() {
        let limits = Limits {
            max_output_tokens: Some(100),
        };
        let mut fields = unset();
        fields.max_tokens = Some(("max_completion_tokens", 101));
        assert_invalid(
            fields.clone().check(&limits),
            "max_completion_tokens",
            "101",
        );
        fields.max_tokens = Some(("max_completion_tokens", 100));
        let checked = fields.check(&limits).expect("at the cap");
        assert_eq!(checked.sampling.max_new_tokens, Some(100));
    }

    #[test]
    fn stop_rules() {
        let seventeen: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
        let sixteen = &seventeen[..16];
        let with_empty = vec!["a".to_string(), String::new()];
        let mut fields = unset();
        fields.stop = Some(("stop", seventeen.as_slice()));
        assert_invalid(fields.check(&Limits::default()), "stop", "17 stops");
        let mut fields = unset();
        fields.stop = Some(("stop_sequences", with_empty.as_slice()));
        assert_invalid(fields.check(&Limits::default()), "stop_sequences", "empty");
        let mut fields = unset();
        fields.stop = Some(("stop", sixteen));
        let checked = fields.check(&Limits::default()).expect("16 stops");
        assert_eq!(checked.stop_strings, sixteen);
    }

    #[test]
    fn logit_bias_rules() {
        let cases: [(&[(&str, f32)], bool); 5] = [
            (&[("42", 5.0), ("7", -100.0)], true),
            (&[("42", 100.0)], true),
            (&[("42", 100.5)], false),
            (&[("hello", 1.0)], false),
            (&[("42", f32::NAN)], false),
        ];
        for (entries, valid) in cases {
            let bias: BTreeMap<String, f32> = entries
                .iter()
                .map(|(token, value)| (token.to_string(), *value))
                .collect();
            let mut fields = unset();
            fields.logit_bias = Some(&bias);
            let result = fields.check(&Limits::default());
            if valid {
                let checked = result.expect("valid bias");
                let expected: Vec<(String, f32)> = bias.into_iter().collect();
                assert_eq!(checked.sampling.logit_bias, expected);
            } else {
                assert_invalid(result, "logit_bias", &format!("{entries:?}"));
            }
        }
    }

    #[test]
    fn prefix_names_nested_parameters() {
        let mut fields = unset();
        fields.param_prefix = "sampling_params.";
        fields.top_p = Some(0.0);
        assert_invalid(
            fields.check(&Limits::default()),
            "sampling_params.top_p",
            "prefixed",
        );
    }

    #[test]
    fn checked_sampling_carries_every_field() {
        let stops = vec!["END".to_string()];
        let fields = SamplingFields {
            param_prefix: "",
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(40),
            min_p: Some(0.05),
            frequency_penalty: Some(0.1),
            presence_penalty: Some(-0.1),
            repetition_penalty: Some(1.1),
            max_tokens: Some(("max_tokens", 64)),
            min_tokens: Some(("min_tokens", 2)),
            n: Some(3),
            stop: Some(("stop", stops.as_slice())),
            stop_token_ids: &[7, 8],
            logit_bias: None,
            ignore_eos: true,
            skip_special_tokens: false,
            spaces_between_special_tokens: false,
            no_stop_trim: true,
            constraint: Some(Constraint::Regex("a+".into())),
        };
        let checked = fields.check(&Limits::default()).expect("valid");
        let expected = Sampling {
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(40),
            min_p: Some(0.05),
            frequency_penalty: Some(0.1),
            presence_penalty: Some(-0.1),
            repetition_penalty: Some(1.1),
            max_new_tokens: Some(64),
            min_new_tokens: 2,
            stop_token_ids: vec![7, 8],
            ignore_eos: true,
            skip_special_tokens: false,
            spaces_between_special_tokens: false,
            no_stop_trim: true,
            n: 3,
            logit_bias: Vec::new(),
            constraint: Some(Constraint::Regex("a+".into())),
        };
        assert_eq!(checked.sampling, expected);
        assert_eq!(checked.stop_strings, stops);
    }

    #[test]
    fn unset_fields_leave_engine_defaults_and_one_sequence() {
        let checked = unset().check(&Limits::default()).expect("valid");
        assert_eq!(checked.sampling.n, 1);
        assert_eq!(checked.sampling.temperature, None);
        assert_eq!(checked.sampling.max_new_tokens, None);
        assert!(checked.stop_strings.is_empty());
    }

    #[test]
    fn top_logprobs_needs_its_switch_and_a_bounded_count() {
        check_top_logprobs("top_logprobs", Some(20), None).expect("20 is allowed");
        check_top_logprobs("top_logprobs", None, Some("logprobs")).expect("unset");
        let err = check_top_logprobs("top_logprobs", Some(21), None).expect_err("21");
        assert_eq!(err.param.as_deref(), Some("top_logprobs"));
        let err =
            check_top_logprobs("top_logprobs", Some(2), Some("logprobs")).expect_err("switch off");
        assert_eq!(err.message, "requires logprobs to be true");
    }

    #[test]
    fn only_one_constraint_may_be_set() {
        let one = single_constraint([
            ("response_format", None),
            ("regex", Some(Constraint::Regex("x".into()))),
            ("ebnf", None),
        ])
        .expect("one constraint");
        assert_eq!(one, Some(Constraint::Regex("x".into())));
        let err = single_constraint([
            ("regex", Some(Constraint::Regex("x".into()))),
            (
                "ebnf",
                Some(Constraint::EbnfGrammar("root ::= \"a\"".into())),
            ),
        ])
        .expect_err("two constraints");
        assert_eq!(err.code, ErrorCode::InvalidParameter);
        assert_eq!(err.param.as_deref(), Some("ebnf"));
        assert!(err.message.contains("regex"), "{}", err.message);
    }

    #[test]
    fn inputs_must_be_present_and_non_empty() {
        let err = check_inputs("input", &[]).expect_err("no inputs");
        assert_eq!(err.param.as_deref(), Some("input"));
        let err = check_inputs(
            "prompt",
            &[InputItem::Text("a".into()), InputItem::TokenIds(Vec::new())],
        )
        .expect_err("empty second input");
        assert_eq!(err.message, "input 1 is empty");
        check_inputs("prompt", &[InputItem::TokenIds(vec![1])]).expect("one input");
    }

    #[test]
    fn ranges_describe_themselves() {
        assert_eq!(TEMPERATURE.to_string(), "[0, 2]");
        assert_eq!(TOP_P.to_string(), "(0, 1]");
        assert_eq!(PENALTY.to_string(), "[-2, 2]");
    }
}
