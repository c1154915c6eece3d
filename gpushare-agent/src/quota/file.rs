//! Quota files: TOML in, a validated [`QuotaSet`] or located errors out.
//!
//! Design note: parsing is two-staged. serde reads the TOML into permissive "spec" structs
//! (`deny_unknown_fields`, every value wrapped in [`toml::Spanned`]); validation then turns them into
//! resolved types and reports every problem as `file:line:col: what is wrong and how to fix it`.
//! Values that carry units (sizes, durations, GPUs) are read as any TOML value so that a bare number
//! gets a helpful message instead of serde's "invalid type".
//!
//! Format (see the tests and `tests/data/quotas/good/` for complete examples):
//!
//! ```toml
//! protect = ["unit://sshd.service", "cgroup:///system.slice/*"]   # top level, any file
//!
//! [defaults]                # main file only; every key optional
//! mode = "strict"           # or "elastic"
//! tolerance = "64MiB"       # or "5%"
//! grace = "3s"
//! ladder = [ { action = "alert" }, { action = "signal", signal = "SIGUSR1", after = "5s" },
//!            { action = "freeze", after = "15s" } ]
//! elastic_reserve = "1GiB"
//! gpushare_memory_unit = "GiB"   # or "MiB": unit of ALIYUN_COM_GPU_MEM_* values
//! env_quotas = true              # honour GPUShare/HAMi env quotas
//!
//! [[quota]]
//! name = "trainer"          # optional label
//! container = "3f2a9c8e7d6b"   # exactly one selector (see below)
//! gpu = "all"               # "all" (default, summed over GPUs) | 0 | "GPU-<uuid>"
//! gpu_memory = "4GiB"
//! # mode, tolerance, grace, ladder may be overridden here
//! ```
//!
//! Selectors: `container` (full id or a prefix of at least 12 hex digits), `container_name`,
//! `pod_uid`, `pod` (`namespace/name`), `pod` or `pod_uid` plus `container_name`, `cgroup` (glob over
//! the cgroup path), `unit` (a name without a dot gets `.service`).
//!
//! Decisions: a missing main file is an empty configuration; `[defaults]` in a drop-in is an error; two
//! entries with the same selector and GPU are an error, in one file or across files (no silent
//! override), reported at the later one with the location of the first; all files load or none does
//! (the caller keeps the last good set). Ladder steps must be in escalation order (alert, signal,
//! freeze, kill) with non-decreasing `after`; `after` defaults to `0s`, and `0s` is allowed.

use std::{
    collections::BTreeMap,
    ops::Range,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;
use toml::{Spanned, Value};

use super::{
    Defaults, DeviceRef, Enforcement, GpuSel, GpuShareUnit, LadderStep, Location, Mode, PathGlob,
    PodRef, ProtectPattern, QuotaEntry, QuotaSet, Selector, Signal, StepAction, Tolerance,
    select::KEY_SCHEMES,
    size::{SizeError, parse_size},
};

/// A problem in a quota file, with where it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("{location}: {message}")]
pub struct LocatedError {
    /// `file:line:col`.
    pub location: Location,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Overrides of enforcement settings, from `[defaults]` or an entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyPatch {
    /// `mode`.
    pub mode: Option<Mode>,
    /// `tolerance`.
    pub tolerance: Option<Tolerance>,
    /// `grace`.
    pub grace: Option<Duration>,
    /// `ladder`.
    pub ladder: Option<Vec<LadderStep>>,
}

impl PolicyPatch {
    fn apply(&self, base: &Enforcement) -> Enforcement {
        Enforcement {
            mode: self.mode.unwrap_or(base.mode),
            tolerance: self.tolerance.unwrap_or(base.tolerance),
            grace: self.grace.unwrap_or(base.grace),
            ladder: self.ladder.clone().unwrap_or_else(|| base.ladder.clone()),
        }
    }
}

/// A validated `[defaults]` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefaultsPatch {
    /// Enforcement overrides.
    pub policy: PolicyPatch,
    /// `elastic_reserve`, bytes.
    pub elastic_reserve: Option<u64>,
    /// `gpushare_memory_unit`.
    pub gpushare_unit: Option<GpuShareUnit>,
    /// `env_quotas`.
    pub env_quotas: Option<bool>,
}

/// A validated `[[quota]]` entry whose enforcement is not yet merged with the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryDraft {
    /// Where its table starts.
    pub origin: Location,
    /// Where its selector is written.
    pub selector_at: Location,
    /// `name`.
    pub name: Option<String>,
    /// The selector.
    pub selector: Selector,
    /// `gpu`.
    pub gpu: GpuSel,
    /// `gpu_memory`, bytes.
    pub gpu_memory: u64,
    /// Per-entry overrides.
    pub policy: PolicyPatch,
}

/// One validated file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaFile {
    /// The name it was parsed under.
    pub origin: String,
    /// `[defaults]` with its location, if present.
    pub defaults: Option<(Location, DefaultsPatch)>,
    /// `protect`.
    pub protect: Vec<ProtectPattern>,
    /// `[[quota]]` entries in order.
    pub entries: Vec<EntryDraft>,
}

impl QuotaFile {
    /// A file with nothing in it (a missing main file).
    pub fn empty(origin: &str) -> Self {
        Self {
            origin: origin.to_string(),
            defaults: None,
            protect: Vec::new(),
            entries: Vec::new(),
        }
    }
}

// ---- serde spec -------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    protect: Option<Spanned<Vec<Spanned<String>>>>,
    defaults: Option<Spanned<DefaultsSpec>>,
    #[serde(default)]
    quota: Vec<Spanned<EntrySpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultsSpec {
    mode: Option<Spanned<Value>>,
    tolerance: Option<Spanned<Value>>,
    grace: Option<Spanned<Value>>,
    ladder: Option<Spanned<Vec<Spanned<StepSpec>>>>,
    elastic_reserve: Option<Spanned<Value>>,
    gpushare_memory_unit: Option<Spanned<Value>>,
    env_quotas: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntrySpec {
    name: Option<Spanned<String>>,
    container: Option<Spanned<String>>,
    container_name: Option<Spanned<String>>,
    pod_uid: Option<Spanned<String>>,
    pod: Option<Spanned<String>>,
    cgroup: Option<Spanned<String>>,
    unit: Option<Spanned<String>>,
    gpu: Option<Spanned<Value>>,
    gpu_memory: Option<Spanned<Value>>,
    mode: Option<Spanned<Value>>,
    tolerance: Option<Spanned<Value>>,
    grace: Option<Spanned<Value>>,
    ladder: Option<Spanned<Vec<Spanned<StepSpec>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepSpec {
    action: Option<Spanned<String>>,
    signal: Option<Spanned<String>>,
    after: Option<Spanned<Value>>,
}

// ---- positions and messages -------------------------------------------------------------------

fn location(text: &str, origin: &str, offset: usize) -> Location {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Location {
        file: origin.to_string(),
        line: before.matches('\n').count() + 1,
        col: before[line_start..].chars().count() + 1,
    }
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The closest candidate within a small edit distance.
fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    let candidates: Vec<&str> = candidates.into_iter().collect();
    // An abbreviation (`sig` for `signal`) first, then a small edit distance.
    if word.len() >= 3
        && let Some(c) = candidates.iter().find(|c| c.starts_with(&word))
    {
        return Some(c);
    }
    candidates
        .into_iter()
        .map(|c| (levenshtein(&word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 4) && *d < c.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn backticked(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

/// Makes serde/toml's messages say how to fix the problem.
fn explain_toml_message(message: &str) -> String {
    let message = message.trim();
    if message.starts_with("unknown field") {
        let words = backticked(message);
        let Some((field, expected)) = words.split_first() else {
            return message.to_string();
        };
        let in_entry = expected.contains(&"gpu_memory");
        let hint = if *field == "protect" && !expected.contains(&"quota") {
            Some("`protect` is a top-level key: move it above the first [table] header".to_string())
        } else if expected.contains(&"elastic_reserve")
            && ["gpu_memory", "container", "pod", "unit", "cgroup", "gpu"].contains(field)
        {
            Some(format!(
                "`{field}` belongs in a [[quota]] entry, not in [defaults]"
            ))
        } else if in_entry
            && ["elastic_reserve", "gpushare_memory_unit", "env_quotas"].contains(field)
        {
            Some(format!(
                "`{field}` can only be set in [defaults] (in the main file)"
            ))
        } else if expected.contains(&"quota")
            && ["mode", "tolerance", "grace", "ladder", "elastic_reserve"].contains(field)
        {
            Some(format!(
                "put `{field}` under [defaults], or in a [[quota]] entry; top-level keys must come before the first [table]"
            ))
        } else {
            did_you_mean(field, expected.iter().copied()).map(|s| format!("did you mean `{s}`?"))
        };
        let allowed = expected
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ");
        return match hint {
            Some(h) => format!("unknown key `{field}`: {h} (allowed here: {allowed})"),
            None => format!("unknown key `{field}` (allowed here: {allowed})"),
        };
    }
    if message.contains("invalid type: map, expected a sequence") {
        return format!("{message}: write each entry as [[quota]] (double brackets)");
    }
    if message.contains("expected a sequence") {
        return format!("{message}: write a list, e.g. [\"...\"]");
    }
    format!("invalid TOML: {message}")
}

struct Cx<'t> {
    text: &'t str,
    origin: &'t str,
    errors: Vec<LocatedError>,
}

impl Cx<'_> {
    fn at(&self, span: &Range<usize>) -> Location {
        location(self.text, self.origin, span.start)
    }

    fn err(&mut self, span: &Range<usize>, message: impl Into<String>) {
        let location = self.at(span);
        self.errors.push(LocatedError {
            location,
            message: message.into(),
        });
    }
}

fn value_words(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::Datetime(d) => d.to_string(),
        Value::Array(_) => "a list".to_string(),
        Value::Table(_) => "a table".to_string(),
    }
}

// ---- values -----------------------------------------------------------------------------------

fn size_value(cx: &mut Cx, field: &str, v: &Spanned<Value>) -> Option<u64> {
    let span = v.span();
    match v.get_ref() {
        Value::String(s) => match parse_size(s) {
            Ok(b) => Some(b),
            Err(SizeError::NoUnit(n)) => {
                cx.err(
                    &span,
                    format!(
                        "`{field}` needs a unit: \"{n}\" is ambiguous; write \"{n}MiB\" or \"{n}GiB\""
                    ),
                );
                None
            }
            Err(e) => {
                cx.err(&span, format!("`{field}`: {e}"));
                None
            }
        },
        Value::Integer(n) if *n < 0 => {
            cx.err(&span, format!("`{field}` cannot be negative"));
            None
        }
        Value::Integer(_) | Value::Float(_) => {
            let n = value_words(v.get_ref());
            cx.err(
                &span,
                format!(
                    "`{field} = {n}` is a bare number, which is ambiguous: write \"{n}MiB\" or \"{n}GiB\" (a quoted string with a unit)"
                ),
            );
            None
        }
        other => {
            cx.err(
                &span,
                format!(
                    "`{field}` must be a size like \"4GiB\" or \"512MiB\", not {}",
                    value_words(other)
                ),
            );
            None
        }
    }
}

fn duration_value(cx: &mut Cx, field: &str, v: &Spanned<Value>) -> Option<Duration> {
    let span = v.span();
    match v.get_ref() {
        Value::String(s) => match super::duration::parse_duration(s) {
            Ok(d) => Some(d),
            Err(e) => {
                cx.err(&span, format!("`{field}`: {e}"));
                None
            }
        },
        Value::Integer(n) if *n < 0 => {
            cx.err(&span, format!("`{field}` cannot be negative"));
            None
        }
        Value::Integer(_) | Value::Float(_) => {
            let n = value_words(v.get_ref());
            cx.err(
                &span,
                format!("`{field} = {n}` has no unit: write \"{n}s\" or \"{n}ms\""),
            );
            None
        }
        other => {
            cx.err(
                &span,
                format!(
                    "`{field}` must be a duration like \"5s\" or \"500ms\", not {}",
                    value_words(other)
                ),
            );
            None
        }
    }
}

fn percent(s: &str) -> Option<u32> {
    let s = s.trim();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty()
        || int.len() > 3
        || frac.len() > 2
        || (s.contains('.') && frac.is_empty())
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let frac_value: u32 = format!("{frac:0<2}").parse().ok()?;
    let hundredths = int.parse::<u32>().ok()? * 100 + frac_value;
    (hundredths <= 10_000).then_some(hundredths)
}

fn tolerance_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<Tolerance> {
    if let Value::String(s) = v.get_ref()
        && let Some(p) = s.trim().strip_suffix('%')
    {
        return match percent(p) {
            Some(h) => Some(Tolerance::Percent(h)),
            None => {
                cx.err(
                    &v.span(),
                    format!(
                        "`tolerance = \"{s}\"`: a percentage must be between 0% and 100% with at most two decimals, e.g. \"5%\""
                    ),
                );
                None
            }
        };
    }
    size_value(cx, "tolerance", v).map(Tolerance::Bytes)
}

fn mode_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<Mode> {
    match v.get_ref() {
        Value::String(s) if s == "strict" => Some(Mode::Strict),
        Value::String(s) if s == "elastic" => Some(Mode::Elastic),
        other => {
            let hint = match other {
                Value::String(s) => did_you_mean(s, ["strict", "elastic"])
                    .map(|m| format!(" (did you mean \"{m}\"?)"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            cx.err(
                &v.span(),
                format!(
                    "`mode` must be \"strict\" or \"elastic\", not {}{hint}",
                    value_words(other)
                ),
            );
            None
        }
    }
}

fn is_gpu_uuid(s: &str) -> bool {
    s.strip_prefix("GPU-").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
    })
}

fn gpu_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<GpuSel> {
    const HELP: &str = "`gpu` must be \"all\", a GPU index like 0, or a UUID like \"GPU-8f1c2d3e-...\" (as `nvidia-smi -L` prints it)";
    match v.get_ref() {
        Value::String(s) if s == "all" => Some(GpuSel::All),
        Value::String(s) if is_gpu_uuid(s) => Some(GpuSel::Device(DeviceRef::Uuid(s.clone()))),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            match s.parse::<u32>() {
                Ok(i) => Some(GpuSel::Device(DeviceRef::Index(i))),
                Err(_) => {
                    cx.err(&v.span(), HELP);
                    None
                }
            }
        }
        Value::Integer(i) => match u32::try_from(*i) {
            Ok(i) => Some(GpuSel::Device(DeviceRef::Index(i))),
            Err(_) => {
                cx.err(&v.span(), format!("{HELP}; {i} is not a GPU index"));
                None
            }
        },
        other => {
            cx.err(&v.span(), format!("{HELP}; got {}", value_words(other)));
            None
        }
    }
}

fn unit_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<GpuShareUnit> {
    match v.get_ref() {
        Value::String(s) if s == "GiB" => Some(GpuShareUnit::GiB),
        Value::String(s) if s == "MiB" => Some(GpuShareUnit::MiB),
        other => {
            cx.err(
                &v.span(),
                format!(
                    "`gpushare_memory_unit` must be \"GiB\" or \"MiB\" (the device plugin's --memory-unit), not {}",
                    value_words(other)
                ),
            );
            None
        }
    }
}

fn ladder_value(cx: &mut Cx, ladder: &Spanned<Vec<Spanned<StepSpec>>>) -> Option<Vec<LadderStep>> {
    const ACTIONS: [&str; 4] = ["alert", "signal", "freeze", "kill"];
    let errors_before = cx.errors.len();
    let mut steps: Vec<LadderStep> = Vec::new();
    for step in ladder.get_ref() {
        let spec = step.get_ref();
        let Some(action) = &spec.action else {
            cx.err(
                &step.span(),
                "ladder step has no `action`: write e.g. { action = \"freeze\", after = \"15s\" }",
            );
            continue;
        };
        let name = action.get_ref().as_str();
        if !ACTIONS.contains(&name) {
            let hint = did_you_mean(name, ACTIONS)
                .map(|a| format!(" (did you mean \"{a}\"?)"))
                .unwrap_or_default();
            cx.err(
                &action.span(),
                format!(
                    "unknown action \"{name}\": use \"alert\", \"signal\", \"freeze\" or \"kill\"{hint}"
                ),
            );
            continue;
        }
        let signal = match &spec.signal {
            None => None,
            Some(_) if !matches!(name, "signal" | "kill") => {
                let span = spec.signal.as_ref().map(Spanned::span).unwrap_or_default();
                cx.err(
                    &span,
                    format!("`signal` does not apply to a \"{name}\" step, only to \"signal\" and \"kill\": remove it"),
                );
                continue;
            }
            Some(s) => match Signal::from_name(s.get_ref()) {
                Some(sig) => Some(sig),
                None => {
                    let names: Vec<&str> = super::SIGNALS.iter().map(|s| s.name).collect();
                    cx.err(
                        &s.span(),
                        format!(
                            "unknown signal \"{}\": use one of {}",
                            s.get_ref(),
                            names.join(", ")
                        ),
                    );
                    continue;
                }
            },
        };
        let after = match &spec.after {
            None => Duration::ZERO,
            Some(a) => match duration_value(cx, "after", a) {
                Some(d) => d,
                None => continue,
            },
        };
        let action = match name {
            "alert" => StepAction::Alert,
            "signal" => StepAction::Signal(signal.unwrap_or(Signal::USR1)),
            "freeze" => StepAction::Freeze,
            _ => StepAction::Kill(signal.unwrap_or(Signal::KILL)),
        };
        if let Some(prev) = steps.last() {
            let pos = spec.after.as_ref().map_or(step.span(), Spanned::span);
            if action.rank() < prev.action.rank() {
                cx.err(
                    &action_span(spec, step),
                    format!(
                        "ladder out of order: \"{}\" comes after \"{}\"; list steps in the order alert, signal, freeze, kill",
                        action.name(),
                        prev.action.name()
                    ),
                );
                continue;
            }
            if action.rank() == prev.action.rank() && !matches!(action, StepAction::Signal(_)) {
                cx.err(
                    &action_span(spec, step),
                    format!(
                        "duplicate \"{}\" step: a ladder has at most one (only \"signal\" may repeat)",
                        action.name()
                    ),
                );
                continue;
            }
            if after < prev.after {
                cx.err(
                    &pos,
                    format!(
                        "ladder out of order: \"{}\" after {} comes before the previous step's {}; `after` must not decrease",
                        action.name(),
                        super::fmt_duration(after),
                        super::fmt_duration(prev.after)
                    ),
                );
                continue;
            }
        }
        steps.push(LadderStep { action, after });
    }
    (cx.errors.len() == errors_before).then_some(steps)
}

fn action_span(spec: &StepSpec, step: &Spanned<StepSpec>) -> Range<usize> {
    spec.action.as_ref().map_or(step.span(), Spanned::span)
}

fn policy_patch(
    cx: &mut Cx,
    mode: &Option<Spanned<Value>>,
    tolerance: &Option<Spanned<Value>>,
    grace: &Option<Spanned<Value>>,
    ladder: &Option<Spanned<Vec<Spanned<StepSpec>>>>,
) -> PolicyPatch {
    PolicyPatch {
        mode: mode.as_ref().and_then(|v| mode_value(cx, v)),
        tolerance: tolerance.as_ref().and_then(|v| tolerance_value(cx, v)),
        grace: grace.as_ref().and_then(|v| duration_value(cx, "grace", v)),
        ladder: ladder.as_ref().and_then(|v| ladder_value(cx, v)),
    }
}

// ---- selectors --------------------------------------------------------------------------------

fn is_pod_uid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn container_id(cx: &mut Cx, v: &Spanned<String>) -> Option<String> {
    let raw = v.get_ref().trim();
    if let Some((scheme, _)) = raw.split_once("://") {
        cx.err(
            &v.span(),
            format!("`container` takes the bare id: remove `{scheme}://`"),
        );
        return None;
    }
    let id = raw.to_ascii_lowercase();
    if !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        cx.err(
            &v.span(),
            format!(
                "`container = \"{raw}\"` is not a container id (hex digits); to select by name use `container_name`"
            ),
        );
        return None;
    }
    if !(12..=64).contains(&id.len()) {
        cx.err(
            &v.span(),
            format!(
                "container id \"{raw}\" has {} digits: give the full id or a prefix of at least 12 (as `docker ps` shows)",
                id.len()
            ),
        );
        return None;
    }
    Some(id)
}

fn non_empty(cx: &mut Cx, field: &str, v: &Spanned<String>) -> Option<String> {
    let s = v.get_ref().trim();
    if s.is_empty() {
        cx.err(&v.span(), format!("`{field}` is empty"));
        return None;
    }
    Some(s.to_string())
}

fn selector(cx: &mut Cx, e: &EntrySpec, entry_span: &Range<usize>) -> Option<(Selector, Location)> {
    let given: Vec<(&str, &Spanned<String>)> = [
        ("container", &e.container),
        ("container_name", &e.container_name),
        ("pod_uid", &e.pod_uid),
        ("pod", &e.pod),
        ("cgroup", &e.cgroup),
        ("unit", &e.unit),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    .collect();
    let names: Vec<&str> = given.iter().map(|(k, _)| *k).collect();
    let pod_with_name = names.len() == 2
        && names.contains(&"container_name")
        && (names.contains(&"pod") || names.contains(&"pod_uid"));
    if given.is_empty() {
        cx.err(
            entry_span,
            "quota entry has no selector: add one of `container`, `container_name`, `pod_uid`, `pod`, `cgroup` or `unit`",
        );
        return None;
    }
    if given.len() > 1 && !pod_with_name {
        let (second, v) = given[1];
        cx.err(
            &v.span(),
            format!(
                "quota entry has two selectors, `{}` and `{second}`: keep one per [[quota]] entry (only `pod` or `pod_uid` may be combined with `container_name`)",
                given[0].0
            ),
        );
        return None;
    }
    let at = cx.at(&given[0].1.span());
    let pod_ref = |cx: &mut Cx| -> Option<PodRef> {
        if let Some(uid) = &e.pod_uid {
            let u = uid.get_ref().trim().to_ascii_lowercase();
            if !is_pod_uid(&u) {
                cx.err(
                    &uid.span(),
                    format!(
                        "`pod_uid = \"{}\"` is not a pod UID like \"0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a\" (kubectl get pod -o jsonpath='{{.metadata.uid}}')",
                        uid.get_ref()
                    ),
                );
                return None;
            }
            return Some(PodRef::Uid(u));
        }
        let pod = e.pod.as_ref()?;
        match pod.get_ref().trim().split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Some(PodRef::Name {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => {
                cx.err(
                    &pod.span(),
                    format!(
                        "`pod = \"{}\"` must be \"namespace/name\", e.g. \"default/trainer-0\"",
                        pod.get_ref()
                    ),
                );
                None
            }
        }
    };
    let sel = if pod_with_name {
        let name = non_empty(cx, "container_name", e.container_name.as_ref()?)?;
        Selector::PodContainer {
            pod: pod_ref(cx)?,
            container_name: name,
        }
    } else {
        let (key, v) = given[0];
        match key {
            "container" => Selector::ContainerId(container_id(cx, v)?),
            "container_name" => {
                Selector::ContainerName(non_empty(cx, key, v)?.trim_start_matches('/').to_string())
            }
            "pod_uid" | "pod" => match pod_ref(cx)? {
                PodRef::Uid(u) => Selector::PodUid(u),
                PodRef::Name { namespace, name } => Selector::PodName { namespace, name },
            },
            "cgroup" => {
                let pattern = non_empty(cx, key, v)?;
                if !pattern.starts_with('/') {
                    cx.err(
                        &v.span(),
                        format!(
                            "`cgroup = \"{pattern}\"` must be an absolute cgroup path glob like \"/gpushare.slice/*\""
                        ),
                    );
                    return None;
                }
                match PathGlob::cgroup(&pattern) {
                    Ok(g) => Selector::Cgroup(g),
                    Err(err) => {
                        cx.err(
                            &v.span(),
                            format!(
                                "`cgroup = \"{pattern}\"` is not a valid glob: {}",
                                err.kind()
                            ),
                        );
                        return None;
                    }
                }
            }
            _ => {
                let unit = non_empty(cx, key, v)?;
                if unit.contains('/') {
                    cx.err(
                        &v.span(),
                        format!(
                            "`unit = \"{unit}\"` must be a unit name like \"train.service\"; to select a cgroup path use `cgroup`"
                        ),
                    );
                    return None;
                }
                Selector::Unit(if unit.contains('.') {
                    unit
                } else {
                    format!("{unit}.service")
                })
            }
        }
    };
    Some((sel, at))
}

fn protect_pattern(cx: &mut Cx, v: &Spanned<String>) -> Option<ProtectPattern> {
    let p = v.get_ref().trim();
    if p != "host" && !KEY_SCHEMES.iter().any(|s| p.starts_with(s)) {
        cx.err(
            &v.span(),
            format!(
                "protect pattern \"{p}\" must start with one of {} (e.g. \"unit://sshd.service\", \"cgroup:///system.slice/*\")",
                KEY_SCHEMES.join(", ")
            ),
        );
        return None;
    }
    match PathGlob::key(p) {
        Ok(g) => Some(ProtectPattern(g)),
        Err(e) => {
            cx.err(
                &v.span(),
                format!("protect pattern \"{p}\" is not a valid glob: {}", e.kind()),
            );
            None
        }
    }
}

// ---- entry points -----------------------------------------------------------------------------

/// Parses and validates one file's text. `origin` names it in errors. Returns every validation
/// error (a TOML syntax or structure error stops at the first), in file order.
pub fn parse_str(text: &str, origin: &str) -> Result<QuotaFile, Vec<LocatedError>> {
    let spec: FileSpec = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        let mut message = explain_toml_message(e.message());
        if e.message().trim() == "duplicate key" {
            let key = text.get(span.clone()).unwrap_or("").trim();
            message = format!(
                "duplicate key `{key}`: a key may appear once per table; remove one (for two quotas write two [[quota]] entries)"
            );
        }
        vec![LocatedError {
            location: location(text, origin, span.start),
            message,
        }]
    })?;
    let mut cx = Cx {
        text,
        origin,
        errors: Vec::new(),
    };
    let protect = spec
        .protect
        .as_ref()
        .map(|list| {
            list.get_ref()
                .iter()
                .filter_map(|p| protect_pattern(&mut cx, p))
                .collect()
        })
        .unwrap_or_default();
    let defaults = spec.defaults.as_ref().map(|d| {
        let at = cx.at(&d.span());
        let s = d.get_ref();
        let patch = DefaultsPatch {
            policy: policy_patch(&mut cx, &s.mode, &s.tolerance, &s.grace, &s.ladder),
            elastic_reserve: s
                .elastic_reserve
                .as_ref()
                .and_then(|v| size_value(&mut cx, "elastic_reserve", v)),
            gpushare_unit: s
                .gpushare_memory_unit
                .as_ref()
                .and_then(|v| unit_value(&mut cx, v)),
            env_quotas: s.env_quotas.as_ref().map(|b| *b.get_ref()),
        };
        (at, patch)
    });
    let mut entries = Vec::new();
    for entry in &spec.quota {
        let span = entry.span();
        let e = entry.get_ref();
        let origin_at = cx.at(&span);
        let selector = selector(&mut cx, e, &span);
        let gpu = match &e.gpu {
            None => Some(GpuSel::All),
            Some(v) => gpu_value(&mut cx, v),
        };
        let gpu_memory = match &e.gpu_memory {
            None => {
                cx.err(
                    &span,
                    "quota entry has no `gpu_memory`: add e.g. gpu_memory = \"4GiB\"",
                );
                None
            }
            Some(v) => size_value(&mut cx, "gpu_memory", v),
        };
        let name = e.name.as_ref().map(|n| n.get_ref().clone());
        let policy = policy_patch(&mut cx, &e.mode, &e.tolerance, &e.grace, &e.ladder);
        if let (Some((selector, selector_at)), Some(gpu), Some(gpu_memory)) =
            (selector, gpu, gpu_memory)
        {
            entries.push(EntryDraft {
                origin: origin_at,
                selector_at,
                name,
                selector,
                gpu,
                gpu_memory,
                policy,
            });
        }
    }
    if cx.errors.is_empty() {
        Ok(QuotaFile {
            origin: origin.to_string(),
            defaults,
            protect,
            entries,
        })
    } else {
        let mut errors = cx.errors;
        errors.sort_by_key(|e| (e.location.line, e.location.col));
        Err(errors)
    }
}

impl QuotaSet {
    /// Combines a main file and its drop-ins (in the order given) into a set: applies `[defaults]`
    /// (main file only), rejects duplicate selector+GPU pairs, concatenates `protect` lists.
    pub fn build(main: QuotaFile, dropins: Vec<QuotaFile>) -> Result<QuotaSet, Vec<LocatedError>> {
        let mut errors = Vec::new();
        let mut defaults = Defaults::default();
        if let Some((_, patch)) = &main.defaults {
            defaults.enforcement = patch.policy.apply(&defaults.enforcement);
            defaults.elastic_reserve = patch.elastic_reserve.unwrap_or(defaults.elastic_reserve);
            defaults.gpushare_unit = patch.gpushare_unit.unwrap_or(defaults.gpushare_unit);
            defaults.env_quotas = patch.env_quotas.unwrap_or(defaults.env_quotas);
        }
        for d in &dropins {
            if let Some((at, _)) = &d.defaults {
                errors.push(LocatedError {
                    location: at.clone(),
                    message: format!(
                        "[defaults] is only allowed in the main file ({}): move it there, or override settings per [[quota]] entry",
                        main.origin
                    ),
                });
            }
        }
        let mut seen: BTreeMap<(String, String), Location> = BTreeMap::new();
        let mut entries = Vec::new();
        let mut protect = Vec::new();
        for file in std::iter::once(main).chain(dropins) {
            protect.extend(file.protect);
            for e in file.entries {
                let key = (e.selector.describe(), e.gpu.to_string());
                if let Some(first) = seen.get(&key) {
                    errors.push(LocatedError {
                        location: e.selector_at.clone(),
                        message: format!(
                            "duplicate quota for {} on {}: already set at {first}; remove one of them",
                            key.0, key.1
                        ),
                    });
                    continue;
                }
                seen.insert(key, e.origin.clone());
                entries.push(QuotaEntry {
                    origin: e.origin,
                    name: e.name,
                    selector: e.selector,
                    gpu: e.gpu,
                    gpu_memory: e.gpu_memory,
                    enforcement: e.policy.apply(&defaults.enforcement),
                });
            }
        }
        if errors.is_empty() {
            Ok(QuotaSet::from_parts(defaults, entries, protect))
        } else {
            Err(errors)
        }
    }
}

fn read_error(path: &Path, e: &std::io::Error) -> LocatedError {
    LocatedError {
        location: Location {
            file: path.display().to_string(),
            line: 1,
            col: 1,
        },
        message: format!("cannot read the file: {e}"),
    }
}

/// Loads the main file (missing = empty) and every `*.toml` in each drop-in directory (missing
/// directories are skipped), sorted by file name within each directory. Any error in any file
/// fails the whole load; every error found is returned.
pub fn load_dir_set(main: &Path, dropin_dirs: &[PathBuf]) -> Result<QuotaSet, Vec<LocatedError>> {
    let mut errors = Vec::new();
    let parse = |path: &Path, errors: &mut Vec<LocatedError>| -> Option<QuotaFile> {
        match std::fs::read_to_string(path) {
            Ok(text) => parse_str(&text, &path.display().to_string())
                .map_err(|e| errors.extend(e))
                .ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && path == main => {
                Some(QuotaFile::empty(&path.display().to_string()))
            }
            Err(e) => {
                errors.push(read_error(path, &e));
                None
            }
        }
    };
    let main_file = parse(main, &mut errors);
    let mut dropins = Vec::new();
    for dir in dropin_dirs {
        let listing = match std::fs::read_dir(dir) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                errors.push(read_error(dir, &e));
                continue;
            }
        };
        let mut paths: Vec<PathBuf> = listing
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        paths.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        for path in paths {
            dropins.extend(parse(&path, &mut errors));
        }
    }
    match main_file {
        Some(main) if errors.is_empty() => QuotaSet::build(main, dropins),
        _ => Err(errors),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    fn first_error(text: &str) -> LocatedError {
        match QuotaSet::parse(text, "q.toml") {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(errors) => errors.into_iter().next().unwrap(),
        }
    }

    /// `tests/data/quotas/{good,bad}`: every good file loads; every bad file fails with the line,
    /// column and message its first line announces (`# expect: <line>:<col> <substring>`).
    #[test]
    fn corpus() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quotas");
        let files = |dir: &str| -> Vec<PathBuf> {
            let mut v: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            v.sort();
            v
        };
        let good = files("good");
        assert!(good.len() >= 3, "good corpus too small");
        for path in good {
            let text = std::fs::read_to_string(&path).unwrap();
            if let Err(e) = QuotaSet::parse(&text, &path.display().to_string()) {
                panic!("{} rejected: {e:?}", path.display());
            }
        }
        let bad = files("bad");
        assert!(bad.len() >= 15, "bad corpus too small");
        for path in bad {
            let text = std::fs::read_to_string(&path).unwrap();
            let expect = text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("# expect: "))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: first line must be `# expect: L:C text`",
                        path.display()
                    )
                });
            let (pos, want) = expect.split_once(' ').unwrap();
            let (line, col) = pos.split_once(':').unwrap();
            let (line, col): (usize, usize) = (line.parse().unwrap(), col.parse().unwrap());
            // Files named `dropin-*` are loaded as a drop-in after an empty main file.
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let origin = path.display().to_string();
            let result = if name.starts_with("dropin-") {
                parse_str(&text, &origin)
                    .and_then(|f| QuotaSet::build(QuotaFile::empty("quotas.toml"), vec![f]))
            } else {
                QuotaSet::parse(&text, &origin)
            };
            let errors = match result {
                Ok(_) => panic!("{name} was accepted"),
                Err(e) => e,
            };
            let e = &errors[0];
            assert_eq!(
                (e.location.line, e.location.col),
                (line, col),
                "{name}: wrong position for `{e}`"
            );
            assert!(
                e.message.contains(want.trim()),
                "{name}: `{e}` lacks `{want}`"
            );
            assert_eq!(e.location.file, origin);
        }
    }

    #[test]
    fn a_full_file_resolves_defaults_and_overrides() {
        let set = QuotaSet::parse(
            r#"
protect = ["unit://sshd.service"]

[defaults]
mode = "elastic"
tolerance = "5%"
grace = "500ms"
ladder = [{ action = "alert" }, { action = "freeze", after = "10s" }]
elastic_reserve = "2GiB"
gpushare_memory_unit = "MiB"

[[quota]]
container_name = "trainer"
gpu_memory = "4GiB"

[[quota]]
pod = "ml/job-0"
container_name = "main"
gpu = 1
gpu_memory = "1.5GB"
mode = "strict"
ladder = []
"#,
            "q.toml",
        )
        .unwrap();
        let d = set.defaults();
        assert_eq!(d.elastic_reserve, 2 * GIB);
        assert_eq!(d.gpushare_unit, GpuShareUnit::MiB);
        assert_eq!(d.enforcement.mode, Mode::Elastic);
        assert_eq!(d.enforcement.grace, Duration::from_millis(500));
        let [a, b] = set.entries() else {
            panic!("two entries expected")
        };
        assert_eq!(a.enforcement, d.enforcement);
        assert_eq!(a.gpu, GpuSel::All);
        assert_eq!(b.enforcement.mode, Mode::Strict);
        assert_eq!(b.enforcement.tolerance, Tolerance::Percent(500));
        assert!(b.enforcement.ladder.is_empty());
        assert_eq!(b.gpu, GpuSel::Device(DeviceRef::Index(1)));
        assert_eq!(b.gpu_memory, 1_500_000_000);
        assert_eq!(
            b.selector,
            Selector::PodContainer {
                pod: PodRef::Name {
                    namespace: "ml".into(),
                    name: "job-0".into()
                },
                container_name: "main".into()
            }
        );
        assert_eq!(set.protect_patterns(), vec!["unit://sshd.service"]);
        // An empty file is the built-in defaults.
        let empty = QuotaSet::parse("", "q.toml").unwrap();
        assert_eq!(empty, QuotaSet::empty());
    }

    #[test]
    fn validation_reports_every_error_in_order() {
        let errors = QuotaSet::parse(
            "[[quota]]\nunit = \"a\"\ngpu_memory = 5\n\n[[quota]]\ncontainer = \"xyz\"\ngpu_memory = \"1GiB\"\n",
            "q.toml",
        )
        .unwrap_err();
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(
            shown[0].starts_with("q.toml:3:14: `gpu_memory = 5` is a bare number"),
            "{shown:?}"
        );
        assert!(
            shown[1].starts_with("q.toml:6:13: `container = \"xyz\"` is not a container id"),
            "{shown:?}"
        );
    }

    #[test]
    fn unknown_keys_get_a_suggestion() {
        let e = first_error("[[quota]]\ncontaner = \"abc\"\n");
        assert_eq!((e.location.line, e.location.col), (2, 1));
        assert!(e.message.contains("did you mean `container`?"), "{e}");
        let e = first_error("[defaults]\ngrace = \"1s\"\nprotect = []\n");
        assert!(e.message.contains("top-level key"), "{e}");
        let e = first_error("[[quota]]\nunit = \"a\"\ngpu_memory = \"1GiB\"\nprotect = []\n");
        assert!(e.message.contains("top-level key"), "{e}");
        let e = first_error(
            "[[quota]]\nunit = \"a\"\ngpu_memory = \"1GiB\"\nelastic_reserve = \"1GiB\"\n",
        );
        assert!(e.message.contains("only be set in [defaults]"), "{e}");
        let e = first_error("[defaults]\nladder = [{ action = \"signal\", sig = \"USR1\" }]\n");
        assert!(e.message.contains("did you mean `signal`?"), "{e}");
    }

    #[test]
    fn units_and_durations_of_every_field() {
        assert_eq!(percent("5"), Some(500));
        assert_eq!(percent("2.5"), Some(250));
        assert_eq!(percent("100"), Some(10_000));
        assert_eq!(percent("100.01"), None);
        assert_eq!(percent("1."), None);
        assert_eq!(percent("1.234"), None);
        assert_eq!(percent("x"), None);
        assert_eq!(
            did_you_mean("frezze", ["alert", "signal", "freeze", "kill"]),
            Some("freeze")
        );
        assert_eq!(
            did_you_mean("zzz", ["alert", "signal", "freeze", "kill"]),
            None
        );
        assert_eq!(
            location("ab\ncdé\nf", "x", 7),
            Location {
                file: "x".into(),
                line: 2,
                col: 4
            }
        );
    }

    #[test]
    fn drop_ins_load_in_name_order_and_failures_fail_the_whole_load() {
        let dir = std::env::temp_dir().join(format!("gpushare-quota-test-{}", std::process::id()));
        let d = dir.join("quotas.d");
        std::fs::create_dir_all(&d).unwrap();
        let main = dir.join("quotas.toml");
        std::fs::write(&main, "[defaults]\ngrace = \"1s\"\n").unwrap();
        std::fs::write(
            d.join("20-b.toml"),
            "[[quota]]\nunit = \"b\"\ngpu_memory = \"2GiB\"\n",
        )
        .unwrap();
        std::fs::write(
            d.join("10-a.toml"),
            "[[quota]]\nunit = \"a\"\ngpu_memory = \"1GiB\"\n",
        )
        .unwrap();
        std::fs::write(d.join("ignored.conf"), "garbage").unwrap();
        let set = load_dir_set(&main, &[d.clone(), dir.join("missing.d")]).unwrap();
        let units: Vec<String> = set
            .entries()
            .iter()
            .map(|e| e.selector.describe())
            .collect();
        assert_eq!(units, vec!["unit = \"a.service\"", "unit = \"b.service\""]);
        assert_eq!(set.entries()[0].enforcement.grace, Duration::from_secs(1));
        // A duplicate across files names both places.
        std::fs::write(
            d.join("30-c.toml"),
            "[[quota]]\nunit = \"a.service\"\ngpu_memory = \"3GiB\"\n",
        )
        .unwrap();
        let errors = load_dir_set(&main, std::slice::from_ref(&d)).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0]
                .to_string()
                .contains("30-c.toml:2:8: duplicate quota"),
            "{}",
            errors[0]
        );
        assert!(errors[0].message.contains("10-a.toml:1:1"), "{}", errors[0]);
        // A missing main file is empty, not an error.
        std::fs::remove_file(d.join("30-c.toml")).unwrap();
        std::fs::remove_file(&main).unwrap();
        assert_eq!(load_dir_set(&main, &[d]).unwrap().entries().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest! {
        #[test]
        fn parse_never_panics(text in "(\\[\\[quota\\]\\]\n|\\[defaults\\]\n|[a-z_]{1,14} = (\"[^\"\n]{0,12}\"|-?[0-9]{1,4}|\\[\\]|\\{ action = \"[a-z]{0,7}\" \\})\n|.{0,10}\n){0,8}") {
            let _ = QuotaSet::parse(&text, "fuzz.toml");
        }

        #[test]
        fn arbitrary_text_never_panics(text in ".{0,200}") {
            let _ = QuotaSet::parse(&text, "fuzz.toml");
        }
    }
}
