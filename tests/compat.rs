//! The compatibility contract with SMG's launch flags.
//!
//! `tests/fixtures/smg_flags.toml` lists SMG's flags as SMG's `--help`
//! states them (default, unit, what each takes); `smg::cli::SMG_FLAGS` says
//! what smg does with each. These tests hold the two together: every SMG
//! flag is classified once; a supported one is a real flag of `smg launch`
//! with SMG's default and unit (or a stated reason why not); an ignored one
//! is accepted with a WARN naming it; a refused one fails start-up naming
//! it and what to use instead. The README's table is checked against the
//! same classification.

use std::collections::BTreeMap;

use smg::cli::{
    CliError, IGNORED_HEADING, Invocation, SMG_FLAGS, SmgFlag, Takes, Treatment, parse_bytes,
};

#[derive(Debug, serde::Deserialize)]
struct Fixture {
    flag: Vec<FixtureFlag>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureFlag {
    name: String,
    heading: String,
    default: Option<String>,
    unit: Option<String>,
    takes: String,
    #[serde(default)]
    aliases: Vec<String>,
}

fn fixture() -> Vec<FixtureFlag> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/smg_flags.toml");
    let text = std::fs::read_to_string(path).expect("the SMG flag fixture");
    let fixture: Fixture = toml::from_str(&text).expect("a valid fixture");
    fixture.flag
}

fn entry(name: &str) -> &'static SmgFlag {
    SMG_FLAGS
        .iter()
        .find(|flag| flag.name == name)
        .unwrap_or_else(|| panic!("--{name} is not in smg's compatibility table"))
}

/// The `smg launch` argument that SMG's `name` is (its long flag or an
/// alias), leaving out the arguments the table adds for flags smg does not
/// implement.
fn launch_arg(name: &str) -> Option<clap::Arg> {
    let command = smg::cli::command();
    let launch = command.find_subcommand("launch").expect("launch");
    launch
        .get_arguments()
        .find(|arg| {
            arg.get_help_heading() != Some(IGNORED_HEADING)
                && (arg.get_long() == Some(name)
                    || arg
                        .get_all_aliases()
                        .is_some_and(|aliases| aliases.contains(&name)))
        })
        .cloned()
}

fn launch(line: &[String]) -> Result<smg::config::GatewayConfig, CliError> {
    let argv = ["smg", "--worker-urls", "grpc://127.0.0.1:1"]
        .into_iter()
        .map(str::to_owned)
        .chain(line.iter().cloned());
    match smg::cli::parse_from(argv)? {
        Invocation::Launch(config) => Ok(*config),
        Invocation::Demo(_) => panic!("not a launch line"),
    }
}

/// A command line giving SMG's flag with a value of the kind it takes.
fn given(flag: &SmgFlag) -> Vec<String> {
    let mut line = vec![format!("--{}", flag.name)];
    match flag.takes {
        Takes::Switch => {}
        Takes::Value | Takes::Values | Takes::UrlPort => line.push("1".to_owned()),
    }
    line
}

/// Two defaults as SMG and smg print them, compared as what they mean.
fn same_default(unit: Option<&str>, smg: &str, ours: &str) -> bool {
    if unit == Some("bytes") {
        return parse_bytes(smg).ok() == parse_bytes(ours).ok();
    }
    match (smg.parse::<f64>(), ours.parse::<f64>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => smg == ours,
    }
}

#[test]
fn every_smg_flag_is_classified_once() {
    let fixture = fixture();
    let mut seen = BTreeMap::new();
    for flag in &fixture {
        assert!(
            seen.insert(flag.name.as_str(), ()).is_none(),
            "--{} twice in the fixture",
            flag.name
        );
        let entry = entry(&flag.name);
        assert_eq!(entry.takes.name(), flag.takes, "--{} takes", flag.name);
        assert!(!flag.heading.is_empty());
    }
    for entry in SMG_FLAGS {
        assert!(
            seen.contains_key(entry.name),
            "--{} is classified but is no SMG flag (not in the fixture)",
            entry.name
        );
    }
    assert_eq!(SMG_FLAGS.len(), fixture.len(), "a flag classified twice");
}

#[test]
fn a_supported_flag_has_smgs_meaning_unit_and_default_or_says_why_not() {
    for flag in fixture() {
        let Treatment::Supported { differs } = entry(&flag.name).treatment else {
            continue;
        };
        let arg = launch_arg(&flag.name)
            .unwrap_or_else(|| panic!("--{} is supported but smg launch lacks it", flag.name));
        for alias in &flag.aliases {
            assert!(
                launch_arg(alias).is_some_and(|a| a.get_id() == arg.get_id()),
                "--{alias} (SMG's other spelling of --{}) is not the same flag here",
                flag.name
            );
        }
        let ours: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|value| value.to_string_lossy().into_owned())
            .collect();
        let takes_value = flag.takes != "switch";
        if takes_value {
            let same = match (&flag.default, ours.is_empty()) {
                (None, true) => true,
                (Some(smg), false) => same_default(flag.unit.as_deref(), smg, &ours.join(",")),
                _ => false,
            };
            assert!(
                same || differs.is_some(),
                "--{}: SMG's default is {:?}, smg's {ours:?}, and the table gives no reason",
                flag.name,
                flag.default
            );
        }
        let unit_name = match flag.unit.as_deref() {
            Some("secs") => Some("SECS"),
            Some("ms") => Some("MS"),
            Some("bytes") => Some("BYTES"),
            Some("tokens") => Some("TOKENS"),
            _ => None,
        };
        if let Some(unit_name) = unit_name {
            let value_name = arg
                .get_value_names()
                .and_then(|names| names.first())
                .map(|name| name.as_str().to_owned());
            assert_eq!(
                value_name.as_deref(),
                Some(unit_name),
                "--{} is in {} in SMG: smg's --help must say so",
                flag.name,
                flag.unit.as_deref().unwrap_or_default()
            );
        }
    }
}

#[test]
fn an_ignored_flag_is_accepted_with_a_warning_naming_it() {
    let mut ignored = 0;
    for flag in SMG_FLAGS {
        let Treatment::Ignored(why) = flag.treatment else {
            continue;
        };
        ignored += 1;
        let config = launch(&given(flag))
            .unwrap_or_else(|err| panic!("--{} should be accepted: {err}", flag.name));
        assert_eq!(config.warnings.len(), 1, "--{}", flag.name);
        let warning = &config.warnings[0];
        assert!(
            warning.starts_with(&format!("--{} ", flag.name)) && warning.contains(why),
            "--{}: {warning}",
            flag.name
        );
        assert!(
            launch_arg(flag.name).is_none(),
            "--{} is a flag of smg: classify it as supported",
            flag.name
        );
    }
    assert!(ignored > 0);
}

#[test]
fn a_refused_flag_fails_naming_it_and_what_to_use_instead() {
    for flag in SMG_FLAGS {
        let expected = match flag.treatment {
            Treatment::Refused(instead) => instead.to_owned(),
            Treatment::Coming(issue) => format!("issue {issue}"),
            _ => continue,
        };
        assert!(
            launch_arg(flag.name).is_none(),
            "--{} is a flag of smg now: classify it as supported",
            flag.name
        );
        match launch(&given(flag)) {
            Err(CliError::Config(err)) => {
                assert_eq!(err.flag, flag.name);
                assert!(err.reason.contains(&expected), "--{}: {err}", flag.name);
                assert!(err.to_string().starts_with(&format!("--{}: ", flag.name)));
            }
            other => panic!("--{} should be refused, got {other:?}", flag.name),
        }
    }
}

/// The rows of the README's flag table: SMG flag → what smg does.
fn readme_rows() -> BTreeMap<String, String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let start = readme
        .find("<!-- smg-flags:start -->")
        .expect("the README's SMG flag table starts with <!-- smg-flags:start -->");
    let end = readme
        .find("<!-- smg-flags:end -->")
        .expect("and ends with <!-- smg-flags:end -->");
    let mut rows = BTreeMap::new();
    for line in readme[start..end].lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, flag, _default, treatment, ..] = cells.as_slice() else {
            continue;
        };
        let Some(name) = flag
            .strip_prefix("`--")
            .and_then(|rest| rest.split(['`', ' ']).next())
        else {
            continue;
        };
        assert!(
            rows.insert(name.to_owned(), (*treatment).to_owned())
                .is_none(),
            "--{name} twice in the README's table"
        );
    }
    rows
}

#[test]
fn the_readme_table_says_what_the_contract_says() {
    let rows = readme_rows();
    let expected: BTreeMap<String, String> = SMG_FLAGS
        .iter()
        .map(|flag| (flag.name.to_owned(), flag.treatment.label().to_owned()))
        .collect();
    let missing: Vec<_> = expected
        .iter()
        .filter(|(name, label)| rows.get(*name) != Some(label))
        .map(|(name, label)| format!("--{name}: {label}"))
        .collect();
    let extra: Vec<_> = rows
        .keys()
        .filter(|name| !expected.contains_key(*name))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "README rows to fix: {missing:#?}; rows of no SMG flag: {extra:?}\n\
         The table as the contract has it:\n{}",
        table()
    );
}

/// The README's table, written from the contract (printed when the README
/// disagrees, to paste).
fn table() -> String {
    let defaults: BTreeMap<String, Option<String>> = fixture()
        .into_iter()
        .map(|flag| {
            let default = flag.default.map(|d| match flag.unit {
                Some(unit) => format!("{d} {unit}"),
                None => d,
            });
            (flag.name, default)
        })
        .collect();
    let mut text = String::from("| SMG flag | SMG default | smg | notes |\n|---|---|---|---|\n");
    for flag in SMG_FLAGS {
        let note = match flag.treatment {
            Treatment::Supported { differs } => differs.unwrap_or_default().to_owned(),
            Treatment::Ignored(why) => why.to_owned(),
            Treatment::Refused(instead) => instead.to_owned(),
            Treatment::Coming(issue) => format!("not yet: issue {issue} adds it"),
        };
        let default = defaults
            .get(flag.name)
            .cloned()
            .flatten()
            .map_or_else(String::new, |d| format!("`{d}`"));
        text.push_str(&format!(
            "| `--{}` | {default} | {} | {} |\n",
            flag.name,
            flag.treatment.label(),
            note.replace('|', "\\|")
        ));
    }
    text
}

#[test]
fn an_smg_launch_script_of_supported_flags_starts_unchanged() {
    // SMG's own examples and common script flags, as written for SMG (gRPC
    // worker URLs): each parses to a gateway config, with no WARN.
    let line = "--worker-urls grpc://10.0.0.1:50051 grpc://10.0.0.2:50051 --policy cache_aware \
        --cache-threshold 0.3 --balance-abs-threshold 64 --balance-rel-threshold 1.5 \
        --max-tree-size 67108864 --host 0.0.0.0 --port 30000 --prometheus-port 29000 \
        --prometheus-host 0.0.0.0 --max-payload-size 536870912 --max-concurrent-requests 64 \
        --queue-size 100 --queue-timeout-secs 60 --request-timeout-secs 1800 \
        --worker-startup-timeout-secs 600 --worker-startup-check-interval 10 \
        --shutdown-grace-period-secs 180 --retry-max-retries 5 --retry-backoff-multiplier 1.5 \
        --cb-failure-threshold 10 --health-check-interval-secs 60 --log-level info \
        --model /models/qwen --backend sglang --request-id-headers x-request-id \
        --cors-allowed-origins https://app.example --api-key sk-test";
    let argv: Vec<String> = std::iter::once("smg")
        .chain(line.split_whitespace())
        .map(str::to_owned)
        .collect();
    let config = match smg::cli::parse_from(argv) {
        Ok(Invocation::Launch(config)) => config,
        other => panic!("refused: {other:?}"),
    };
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    assert_eq!(config.listen.host, "0.0.0.0");
    assert_eq!(config.routing.tunables.cache_aware.max_pages, 1 << 22);
    assert_eq!(config.startup.timeout.as_secs(), 600);
}
