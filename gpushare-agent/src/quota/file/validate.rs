//! Values: each spec value (sizes, durations, tolerances, modes, GPUs, units, ladders) checked and
//! turned into its resolved type. Problems are collected in a [`Cx`] with their position, so one
//! pass reports every error of a file.

use std::{collections::BTreeMap, ops::Range, time::Duration};

use toml::{Spanned, Value};

use super::{
    PolicyPatch,
    explain::{did_you_mean, location, value_words},
    spec::StepSpec,
};
use crate::quota::{
    DeviceRef, GpuSel, GpuShareUnit, LadderStep, LocatedError, Location, Mode, OverheadSetting,
    Signal, StepAction, Tolerance,
    size::{SizeError, parse_size},
};

pub(super) struct Cx<'t> {
    pub(super) text: &'t str,
    pub(super) origin: &'t str,
    pub(super) errors: Vec<LocatedError>,
}

impl Cx<'_> {
    pub(super) fn at(&self, span: &Range<usize>) -> Location {
        location(self.text, self.origin, span.start)
    }

    pub(super) fn err(&mut self, span: &Range<usize>, message: impl Into<String>) {
        let location = self.at(span);
        self.errors.push(LocatedError {
            location,
            message: message.into(),
        });
    }
}

// ---- [kubernetes]: pod-resources keys (issue 22a) ---------------------------------------------

/// A path value: a non-empty absolute path string.
fn path_value(cx: &mut Cx, field: &str, v: &Spanned<Value>) -> Option<std::path::PathBuf> {
    match v.get_ref() {
        Value::String(s) if s.starts_with('/') && !s.contains('\0') => Some(s.into()),
        Value::String(s) => {
            cx.err(
                &v.span(),
                format!("`{field}` must be an absolute path (starting with `/`), not \"{s}\""),
            );
            None
        }
        other => {
            cx.err(
                &v.span(),
                format!(
                    "`{field}` must be a path in quotes, like \"/var/lib/kubelet/pod-resources/kubelet.sock\", not {}",
                    value_words(other)
                ),
            );
            None
        }
    }
}

/// The pod-resources keys of `[kubernetes]`: `pod_resources_socket` (absent = not read) and
/// `pod_logs_dir`.
pub(super) fn kubernetes_settings(
    cx: &mut Cx,
    k: &super::spec::KubernetesSpec,
) -> crate::quota::KubeletSettings {
    let mut out = crate::quota::KubeletSettings::default();
    if let Some(v) = &k.pod_resources_socket {
        out.pod_resources_socket = path_value(cx, "pod_resources_socket", v);
    }
    if let Some(v) = &k.pod_logs_dir
        && let Some(p) = path_value(cx, "pod_logs_dir", v)
    {
        out.pod_logs_dir = p;
    }
    out
}

pub(super) fn size_value(cx: &mut Cx, field: &str, v: &Spanned<Value>) -> Option<u64> {
    let Value::String(s) = v.get_ref() else {
        return not_a_string(cx, field, v, "a size like \"4GiB\" or \"512MiB\"", |n| {
            format!(
                "`{field} = {n}` is a bare number, which is ambiguous: write \"{n}MiB\" or \"{n}GiB\" (a quoted string with a unit)"
            )
        });
    };
    match parse_size(s) {
        Ok(b) => Some(b),
        Err(SizeError::NoUnit(n)) => {
            cx.err(
                &v.span(),
                format!(
                    "`{field}` needs a unit: \"{n}\" is ambiguous; write \"{n}MiB\" or \"{n}GiB\""
                ),
            );
            None
        }
        Err(e) => {
            cx.err(&v.span(), format!("`{field}`: {e}"));
            None
        }
    }
}

pub(super) fn duration_value(cx: &mut Cx, field: &str, v: &Spanned<Value>) -> Option<Duration> {
    let Value::String(s) = v.get_ref() else {
        return not_a_string(cx, field, v, "a duration like \"5s\" or \"500ms\"", |n| {
            format!("`{field} = {n}` has no unit: write \"{n}s\" or \"{n}ms\"")
        });
    };
    crate::quota::parse_duration(s)
        .map_err(|e| cx.err(&v.span(), format!("`{field}`: {e}")))
        .ok()
}

/// A value with a unit written as something other than a string: a negative number, a bare
/// number (`bare` says how to write it with a unit) or another type (`like` shows the form).
fn not_a_string<T>(
    cx: &mut Cx,
    field: &str,
    v: &Spanned<Value>,
    like: &str,
    bare: impl FnOnce(String) -> String,
) -> Option<T> {
    let message = match v.get_ref() {
        Value::Integer(n) if *n < 0 => format!("`{field}` cannot be negative"),
        Value::Integer(_) | Value::Float(_) => bare(value_words(v.get_ref())),
        other => format!("`{field}` must be {like}, not {}", value_words(other)),
    };
    cx.err(&v.span(), message);
    None
}

pub(super) fn percent(s: &str) -> Option<u32> {
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

pub(super) fn tolerance_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<Tolerance> {
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

/// `context_overhead`: `"auto"` (learned), a size for every GPU (`"none"`: 0), or a table of
/// sizes by GPU model (`"auto"` allowed as a value), the models it does not name learned.
pub(super) fn overhead_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<OverheadSetting> {
    const LIKE: &str = "\"auto\", a size like \"450MiB\", \"none\", or a table of sizes by GPU \
                        model like { \"Tesla T4\" = \"450MiB\" }";
    let size = |cx: &mut Cx, s: &str| match s.trim() {
        "none" => Some(0),
        _ => size_value(
            cx,
            "context_overhead",
            &Spanned::new(v.span(), Value::String(s.to_string())),
        ),
    };
    match v.get_ref() {
        Value::String(s) if s.trim() == "auto" => Some(OverheadSetting::default()),
        Value::String(s) => size(cx, s).map(|b| OverheadSetting {
            learn: false,
            every: Some(b),
            models: BTreeMap::new(),
        }),
        Value::Table(t) => {
            let mut models = BTreeMap::new();
            let mut ok = true;
            for (model, value) in t {
                match value {
                    Value::String(s) if s.trim() == "auto" => {}
                    Value::String(s) => match size(cx, s) {
                        Some(b) => {
                            models.insert(model.clone(), b);
                        }
                        None => ok = false,
                    },
                    other => {
                        cx.err(
                            &v.span(),
                            format!(
                                "`context_overhead` of \"{model}\" must be a size like \"450MiB\", \"none\" or \"auto\", not {}",
                                value_words(other)
                            ),
                        );
                        ok = false;
                    }
                }
            }
            ok.then_some(OverheadSetting {
                learn: true,
                every: None,
                models,
            })
        }
        other => {
            cx.err(
                &v.span(),
                format!(
                    "`context_overhead` must be {LIKE}, not {}",
                    value_words(other)
                ),
            );
            None
        }
    }
}

pub(super) fn mode_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<Mode> {
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

pub(super) fn is_gpu_uuid(s: &str) -> bool {
    s.strip_prefix("GPU-").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
    })
}

pub(super) fn gpu_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<GpuSel> {
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

pub(super) fn unit_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<GpuShareUnit> {
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

/// `take_unheld`: `true` or `false`, nothing else (a string "true" or a number is a mistake
/// worth naming: the setting lets an auditor act).
pub(super) fn take_unheld_value(cx: &mut Cx, v: &Spanned<Value>) -> Option<bool> {
    match v.get_ref() {
        Value::Boolean(b) => Some(*b),
        other => {
            cx.err(
                &v.span(),
                format!(
                    "`take_unheld` must be true or false (unquoted), not {}: write `take_unheld = true` \
                     to let a dry run take the grants no other mechanism holds",
                    value_words(other)
                ),
            );
            None
        }
    }
}

pub(super) fn ladder_value(
    cx: &mut Cx,
    ladder: &Spanned<Vec<Spanned<StepSpec>>>,
) -> Option<Vec<LadderStep>> {
    const ACTIONS: [&str; 5] = StepAction::NAMES;
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
                    "unknown action \"{name}\": use \"alert\", \"signal\", \"freeze\", \"suspend\" or \"kill\"{hint}"
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
                    let names: Vec<&str> = crate::quota::SIGNALS.iter().map(|s| s.name).collect();
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
        let Some(action) = StepAction::from_name(name, signal) else {
            continue; // unknown names were reported above
        };
        if let Some(prev) = steps.last() {
            let pos = spec.after.as_ref().map_or(step.span(), Spanned::span);
            if action.rank() < prev.action.rank() {
                cx.err(
                    &action_span(spec, step),
                    format!(
                        "ladder out of order: \"{}\" comes after \"{}\"; list steps in the order alert, signal, freeze, suspend, kill",
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
                        crate::quota::fmt_duration(after),
                        crate::quota::fmt_duration(prev.after)
                    ),
                );
                continue;
            }
        }
        steps.push(LadderStep { action, after });
    }
    (cx.errors.len() == errors_before).then_some(steps)
}

pub(super) fn action_span(spec: &StepSpec, step: &Spanned<StepSpec>) -> Range<usize> {
    spec.action.as_ref().map_or(step.span(), Spanned::span)
}

pub(super) fn policy_patch(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages() {
        assert_eq!(percent("5"), Some(500));
        assert_eq!(percent("2.5"), Some(250));
        assert_eq!(percent("100"), Some(10_000));
        assert_eq!(percent("100.01"), None);
        assert_eq!(percent("1."), None);
        assert_eq!(percent("1.234"), None);
        assert_eq!(percent("x"), None);
    }
}
