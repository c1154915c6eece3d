//! What a launch registers, as text: service names, `--action` ladders and the runtime drop-in a
//! launch writes. Pure: strings in, strings or errors out.
//!
//! The drop-in is an ordinary quota file (see [`crate::quota::file`]) with one `[[quota]]` entry whose
//! selector is the service's exact cgroup path, plus a comment line that records who owns it
//! (`# gpushare-launch: pid=<pid> start=<ticks> cgroup=<path>`), so a later launch can remove the
//! drop-in of a launcher that was killed before it could clean up.

use std::{ffi::OsStr, time::Duration};

use crate::quota::{ByteSize, LadderStep, Signal, StepAction, fmt_duration, parse_duration};

/// The cgroup every launched service lives under, below the v2 root.
pub const PARENT_SLICE: &str = "gpushare.slice";
/// First word of the ownership comment of a launch drop-in.
pub const MARKER: &str = "# gpushare-launch:";
/// Prefix of launch drop-in file names (`launch-<name>.toml`).
pub const FILE_PREFIX: &str = "launch-";
/// Longest service name.
pub const MAX_NAME: usize = 64;

/// When each `--action` step fires unless `@AFTER` says otherwise: time over quota (a step never
/// fires before the grace period has passed).
pub const DEFAULT_AFTER: [(&str, Duration); 5] = [
    ("alert", Duration::ZERO),
    ("signal", Duration::from_secs(5)),
    ("freeze", Duration::from_secs(15)),
    ("suspend", Duration::from_secs(20)),
    ("kill", Duration::from_secs(30)),
];

/// Checks a service name: 1 to 64 characters out of `A-Z a-z 0-9 _ . -`, starting with a letter
/// or digit, not ending in `.`, no `..`, and not itself ending in `.scope`, `.service` or `.slice`.
/// The name becomes a cgroup directory (`<name>.scope`) and part of an exact cgroup selector, so
/// glob characters, slashes and spaces are out.
pub fn validate_name(name: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "invalid service name {name:?}: {why} (use 1 to {MAX_NAME} of A-Z a-z 0-9 _ . -, starting with a letter or digit)"
        ))
    };
    if name.is_empty() || name.len() > MAX_NAME {
        return bad("wrong length");
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return bad("it must start with a letter or a digit");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return bad(&format!("{c:?} is not allowed"));
    }
    if name.ends_with('.') || name.contains("..") {
        return bad("no trailing dot and no `..`");
    }
    for suffix in [".scope", ".service", ".slice"] {
        if name.ends_with(suffix) {
            return bad(&format!("leave out `{suffix}`: `.scope` is added"));
        }
    }
    Ok(())
}

/// `<basename of the command>-<suffix>`, cleaned up to a valid name.
pub fn default_name(command: &OsStr, suffix: &str) -> String {
    let base = std::path::Path::new(command)
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut clean: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    clean = clean
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();
    clean.truncate(MAX_NAME - suffix.len() - 1);
    if clean.is_empty() {
        clean = "service".into();
    }
    format!("{clean}-{suffix}")
}

/// The service's cgroup path below the v2 root: `/gpushare.slice/<name>.scope`.
pub fn cgroup_path(name: &str) -> String {
    format!("/{PARENT_SLICE}/{name}.scope")
}

/// The drop-in's file name: `launch-<name>.toml`.
pub fn file_name(name: &str) -> String {
    format!("{FILE_PREFIX}{name}.toml")
}

/// Parses `--action`: `none` (observe only), or comma-separated steps `ACTION[:SIGNAL][@AFTER]`
/// with ACTION one of `alert`, `signal`, `freeze`, `suspend`, `kill`; SIGNAL only for `signal`
/// (default SIGUSR1) and `kill` (default SIGKILL); AFTER a duration such as `2s` (defaults: alert
/// 0s, signal 5s, freeze 15s, suspend 20s, kill 30s). Steps go in the order alert, signal, freeze,
/// suspend, kill, with
/// `after` never decreasing. Examples: `freeze`, `alert,signal,freeze`,
/// `signal:SIGTERM@1s,kill@10s`.
pub fn parse_actions(s: &str) -> Result<Vec<LadderStep>, String> {
    let s = s.trim();
    if s == "none" {
        return Ok(Vec::new());
    }
    let mut steps: Vec<LadderStep> = Vec::new();
    for raw in s.split(',') {
        let raw = raw.trim();
        let (head, after) = match raw.split_once('@') {
            Some((h, a)) => (h, Some(a)),
            None => (raw, None),
        };
        let (name, signal) = match head.split_once(':') {
            Some((n, sig)) => (n.trim(), Some(sig.trim())),
            None => (head.trim(), None),
        };
        let Some((_, default_after)) = DEFAULT_AFTER.iter().find(|(n, _)| *n == name) else {
            return Err(format!(
                "unknown action {name:?} in {raw:?}: use alert, signal[:SIG], freeze, suspend, kill[:SIG] (or `none`), each optionally @AFTER, separated by commas"
            ));
        };
        let signal = match signal {
            None => None,
            Some(_) if !matches!(name, "signal" | "kill") => {
                return Err(format!("{raw:?}: only `signal` and `kill` take a signal"));
            }
            Some(sig) => Some(Signal::from_name(sig).ok_or_else(|| {
                let names: Vec<&str> = crate::quota::SIGNALS.iter().map(|s| s.name).collect();
                format!(
                    "{raw:?}: unknown signal {sig:?}; use one of {}",
                    names.join(", ")
                )
            })?),
        };
        let after = match after {
            None => *default_after,
            Some(a) => parse_duration(a).map_err(|e| format!("{raw:?}: {e}"))?,
        };
        let action = StepAction::from_name(name, signal)
            .ok_or_else(|| format!("unknown action {name:?} in {raw:?}"))?;
        if let Some(prev) = steps.last() {
            if action.rank() < prev.action.rank()
                || (action.rank() == prev.action.rank() && !matches!(action, StepAction::Signal(_)))
            {
                return Err(format!(
                    "{raw:?} after {:?}: list steps once each in the order alert, signal, freeze, suspend, kill (only signal may repeat)",
                    prev.action.name()
                ));
            }
            if after < prev.after {
                return Err(format!(
                    "{raw:?} fires at {} but the step before it at {}: `after` must not decrease (write e.g. `{name}@{}`)",
                    fmt_duration(after),
                    fmt_duration(prev.after),
                    fmt_duration(prev.after)
                ));
            }
        }
        steps.push(LadderStep { action, after });
    }
    Ok(steps)
}

fn toml_step(step: &LadderStep) -> String {
    let after = fmt_duration(step.after);
    match step.action {
        StepAction::Signal(s) | StepAction::Kill(s) => format!(
            "{{ action = \"{}\", signal = \"{}\", after = \"{after}\" }}",
            step.action.name(),
            s.name
        ),
        a => format!("{{ action = \"{}\", after = \"{after}\" }}", a.name()),
    }
}

/// Who owns a drop-in: the launcher's pid and start time, and the service's cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The launcher's pid.
    pub pid: u32,
    /// Its start time, clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
    /// The service's cgroup path.
    pub cgroup: String,
}

impl Owner {
    /// The comment line.
    pub fn marker(&self) -> String {
        format!(
            "{MARKER} pid={} start={} cgroup={}",
            self.pid, self.start_ticks, self.cgroup
        )
    }

    /// Reads the comment line back from a drop-in's text.
    pub fn from_text(text: &str) -> Option<Owner> {
        let line = text.lines().find_map(|l| l.strip_prefix(MARKER))?;
        let mut pid = None;
        let mut start = None;
        let mut cgroup = None;
        for word in line.split_whitespace() {
            match word.split_once('=') {
                Some(("pid", v)) => pid = v.parse().ok(),
                Some(("start", v)) => start = v.parse().ok(),
                Some(("cgroup", v)) => cgroup = Some(v.to_string()),
                _ => {}
            }
        }
        Some(Owner {
            pid: pid?,
            start_ticks: start?,
            cgroup: cgroup?,
        })
    }
}

/// Everything a launch registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// Service name.
    pub name: String,
    /// NVML index of the chosen GPU.
    pub gpu_index: u32,
    /// Its UUID (a comment in the file; the entry uses the index).
    pub gpu_uuid: String,
    /// The quota, bytes.
    pub bytes: u64,
    /// `--action`, when given.
    pub ladder: Option<Vec<LadderStep>>,
    /// `--grace`, when given.
    pub grace: Option<Duration>,
    /// Who owns it.
    pub owner: Owner,
}

impl Registration {
    /// The drop-in's text: a valid quota file with one entry.
    pub fn render(&self) -> String {
        let mut out = format!(
            "# Written by `gpushare-agent launch` for the service `{name}`; removed when it exits.\n\
             {marker}\n\
             [[quota]]\n\
             name = \"launch:{name}\"\n\
             cgroup = \"{cgroup}\"\n\
             gpu = {index}  # {uuid}\n\
             gpu_memory = \"{bytes}\"\n",
            name = self.name,
            marker = self.owner.marker(),
            cgroup = self.owner.cgroup,
            index = self.gpu_index,
            uuid = self.gpu_uuid,
            bytes = ByteSize(self.bytes),
        );
        if let Some(g) = self.grace {
            out.push_str(&format!("grace = \"{}\"\n", fmt_duration(g)));
        }
        if let Some(ladder) = &self.ladder {
            let steps: Vec<String> = ladder.iter().map(toml_step).collect();
            out.push_str(&format!("ladder = [{}]\n", steps.join(", ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{DeviceRef, GpuSel, QuotaSet, Selector, WorkloadMeta};

    #[test]
    fn names_are_checked() {
        for ok in ["train", "train-1", "a.b_c-9", "X", &"a".repeat(64)] {
            assert_eq!(validate_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-x",
            ".x",
            "a/b",
            "a*",
            "a b",
            "a..b",
            "a.",
            "x.scope",
            "x.service",
            "x.slice",
            "é",
            &"a".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            default_name(OsStr::new("/usr/bin/python3.11"), "1a2b"),
            "python3-11-1a2b"
        );
        assert_eq!(default_name(OsStr::new("./--weird"), "9"), "weird-9");
        assert_eq!(default_name(OsStr::new("..."), "9"), "service-9");
        let long = default_name(OsStr::new(&"x".repeat(200)), "abcdef");
        assert_eq!(long.len(), MAX_NAME);
        assert_eq!(validate_name(&long), Ok(()));
        assert_eq!(cgroup_path("t"), "/gpushare.slice/t.scope");
    }

    #[test]
    fn actions_map_to_ladders() {
        let l = parse_actions("freeze").unwrap();
        assert_eq!(
            l,
            vec![LadderStep {
                action: StepAction::Freeze,
                after: Duration::from_secs(15)
            }]
        );
        let l = parse_actions("alert, signal, freeze").unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(l[1].action, StepAction::Signal(Signal::USR1));
        let l = parse_actions("signal:TERM@1s,signal:SIGUSR2@1s,kill@2s").unwrap();
        assert_eq!(l[0].action.name(), "signal");
        assert_eq!(l[2].action, StepAction::Kill(Signal::KILL));
        assert_eq!(l[2].after, Duration::from_secs(2));
        assert_eq!(parse_actions("none").unwrap(), vec![]);
        assert_eq!(parse_actions("alert@0s").unwrap()[0].after, Duration::ZERO);
        assert!(parse_actions("freeze,alert").unwrap_err().contains("order"));
        assert!(parse_actions("freeze,freeze").unwrap_err().contains("once"));
        assert!(parse_actions("signal@20s").is_ok());
        assert!(
            parse_actions("signal@20s,freeze")
                .unwrap_err()
                .contains("must not decrease")
        );
        assert!(parse_actions("freeze:KILL").unwrap_err().contains("only"));
        assert!(
            parse_actions("kill:STOP")
                .unwrap_err()
                .contains("unknown signal")
        );
        assert!(
            parse_actions("snooze")
                .unwrap_err()
                .contains("unknown action")
        );
        assert!(parse_actions("alert@soon").is_err());
        assert!(parse_actions("").is_err());
    }

    #[test]
    fn zero_durations_need_a_unit_too() {
        // The one duration grammar ([`crate::quota::duration`]), zero allowed.
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("0parsecs").is_err());
        assert!(
            parse_actions("signal@5")
                .unwrap_err()
                .contains("has no unit")
        );
    }

    #[test]
    fn the_drop_in_is_a_valid_quota_file_selecting_exactly_the_service() {
        let reg = Registration {
            name: "train-1".into(),
            gpu_index: 1,
            gpu_uuid: "GPU-abc".into(),
            bytes: 3 << 29,
            ladder: Some(parse_actions("alert,signal:SIGTERM@1s,freeze@2s,kill@1m").unwrap()),
            grace: Some(Duration::from_millis(500)),
            owner: Owner {
                pid: 42,
                start_ticks: 4242,
                cgroup: cgroup_path("train-1"),
            },
        };
        let text = reg.render();
        assert_eq!(Owner::from_text(&text), Some(reg.owner.clone()));
        let set = QuotaSet::parse(&text, "launch-train-1.toml").unwrap();
        let [e] = set.entries() else { panic!("{text}") };
        assert_eq!(e.gpu, GpuSel::Device(DeviceRef::Index(1)));
        assert_eq!(e.gpu_memory, 3 << 29);
        assert_eq!(e.name.as_deref(), Some("launch:train-1"));
        assert_eq!(e.enforcement.grace, Duration::from_millis(500));
        assert_eq!(e.enforcement.ladder, reg.ladder.clone().unwrap());
        let Selector::Cgroup(glob) = &e.selector else {
            panic!()
        };
        assert!(glob.is_match("/gpushare.slice/train-1.scope"));
        assert!(!glob.is_match("/gpushare.slice/train-12.scope"));
        assert!(!glob.is_match("/gpushare.slice/train-1.scope/child"));
        let w = WorkloadMeta::new(crate::attribution::parse_cgroup_path(
            "/gpushare.slice/train-1.scope",
        ));
        assert!(set.named_by_file(&w));
        // Without --action and --grace the entry inherits the defaults.
        let plain = Registration {
            ladder: None,
            grace: None,
            ..reg.clone()
        };
        let set = QuotaSet::parse(&plain.render(), "x.toml").unwrap();
        assert_eq!(
            set.entries()[0].enforcement,
            crate::quota::Enforcement::default()
        );
        let none = Registration {
            ladder: Some(Vec::new()),
            ..reg
        };
        let set = QuotaSet::parse(&none.render(), "x.toml").unwrap();
        assert!(set.entries()[0].enforcement.ladder.is_empty());
        assert_eq!(Owner::from_text("# nothing"), None);
    }
}
