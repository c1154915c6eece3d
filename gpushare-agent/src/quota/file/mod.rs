//! Quota files: TOML in, a validated [`QuotaSet`](crate::quota::QuotaSet) or located errors out.
//!
//! Design note: one job a file. Parsing is two-staged: serde reads the TOML into permissive "spec" structs
//! (`deny_unknown_fields`, every value wrapped in [`toml::Spanned`]); validation then turns them into
//! resolved types and reports every problem as `file:line:col: what is wrong and how to fix it`.
//! Values that carry units (sizes, durations, GPUs) are read as any TOML value so that a bare number
//! gets a helpful message instead of serde's "invalid type".
//!
//! - [`spec`]: the serde shapes (what TOML may hold);
//! - `validate` (values) and `selectors`: spec values into resolved types, errors collected;
//! - `explain`: positions (`file:line:col`) and messages that say how to fix the problem;
//! - `load`: reading the files and combining a main file and its drop-ins into a `QuotaSet`;
//! - this file: the public types and [`parse_str`], which runs one file through the stages.
//!
//! Format (see the tests and `tests/data/quotas/good/` for complete examples):
//!
//! ```toml
//! protect = ["unit://sshd.service", "docker://3f2a9c8e7d6b*"]   # top level, any file
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
//! take_unheld = false            # a dry run takes the grants no other mechanism holds
//!
//! [kubernetes]              # main file only; every key optional
//! pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"   # absent: not read
//! pod_logs_dir = "/var/log/pods"   # joins the kubelet's namespace/name to pod UIDs
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
//! Decisions: a missing main file is an empty configuration; `[defaults]` or `[kubernetes]` in a
//! drop-in is an error; two
//! entries with the same selector and GPU are an error, in one file or across files (no silent
//! override), reported at the later one with the location of the first; all files load or none does
//! (the caller keeps the last good set). Ladder steps must be in escalation order (alert, signal,
//! freeze, kill) with non-decreasing `after`; `after` defaults to `0s`, and `0s` is allowed.

mod explain;
mod kube_api;
mod load;
mod selectors;
pub mod spec;
mod validate;

use std::time::Duration;

pub use self::load::{ConfigFiles, build_files, load_dir_set, read_files};

/// The operator's main quota file (its sibling `quotas.d/*.toml` is read with it).
pub const DEFAULT_QUOTAS: &str = "/etc/gpushare/quotas.toml";
/// Runtime quota drop-ins (written by `launch`, read by the agent).
pub const RUNTIME_QUOTAS_DIR: &str = "/run/gpushare/quotas.d";
use self::{
    explain::{explain_toml_message, location},
    selectors::{protect_pattern, selector},
    spec::FileSpec,
    validate::{Cx, gpu_value, policy_patch, size_value, unit_value},
};
use super::{
    Enforcement, GpuSel, GpuShareUnit, LadderStep, Location, Mode, ProtectPattern, Selector,
    Tolerance,
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
    /// `context_overhead`.
    pub context_overhead: Option<crate::quota::OverheadSetting>,
    /// `take_unheld`.
    pub take_unheld: Option<bool>,
}

/// A validated `[kubernetes]` table: only the keys written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubernetesPatch {
    /// `api`.
    pub api: Option<bool>,
    /// `events`.
    pub events: Option<bool>,
    /// `node_name`.
    pub node_name: Option<String>,
    /// `service_account_dir`.
    pub service_account_dir: Option<std::path::PathBuf>,
    /// `api_server`.
    pub api_server: Option<String>,
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
    /// `[kubernetes]` with its location, if present.
    pub kubernetes: Option<(Location, KubernetesPatch)>,
    /// `protect`.
    pub protect: Vec<ProtectPattern>,
    /// `[[quota]]` entries in order.
    pub entries: Vec<EntryDraft>,
    /// `[kubernetes]` with its location, if present.
    pub kubelet: Option<(Location, crate::quota::KubeletSettings)>,
}

impl QuotaFile {
    /// A file with nothing in it (a missing main file).
    pub fn empty(origin: &str) -> Self {
        Self {
            origin: origin.to_string(),
            defaults: None,
            kubernetes: None,
            protect: Vec::new(),
            entries: Vec::new(),
            kubelet: None,
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
            context_overhead: s
                .context_overhead
                .as_ref()
                .and_then(|v| validate::overhead_value(&mut cx, v)),
            take_unheld: s
                .take_unheld
                .as_ref()
                .and_then(|v| validate::take_unheld_value(&mut cx, v)),
        };
        (at, patch)
    });
    let kubernetes = spec.kubernetes.as_ref().map(|k| {
        let at = cx.at(&k.span());
        (at, kube_api::patch(&mut cx, k.get_ref()))
    });
    let kubelet = spec.kubernetes.as_ref().map(|k| {
        let at = cx.at(&k.span());
        (at, validate::kubernetes_settings(&mut cx, k.get_ref()))
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
            kubernetes,
            protect,
            entries,
            kubelet,
        })
    } else {
        let mut errors = cx.errors;
        errors.sort_by_key(|e| (e.location.line, e.location.col));
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use proptest::prelude::*;

    use super::*;
    use crate::quota::{DeviceRef, PodRef, QuotaSet};

    const GIB: u64 = 1 << 30;

    fn first_error(text: &str) -> LocatedError {
        match QuotaSet::parse(text, "q.toml") {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(errors) => errors.into_iter().next().unwrap(),
        }
    }

    /// `tests/data/quotas/{good,bad}`: every good file loads; every bad file fails with the line,
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
    fn context_overhead_is_learned_set_for_every_gpu_or_per_model() {
        use crate::quota::OverheadSetting;
        let of = |text: &str| {
            QuotaSet::parse(&format!("[defaults]\n{text}"), "q.toml")
                .unwrap()
                .defaults()
                .context_overhead
                .clone()
        };
        assert_eq!(of(""), OverheadSetting::default());
        assert!(OverheadSetting::default().learn, "learned unless set");
        assert_eq!(
            of("context_overhead = \"auto\"\n"),
            OverheadSetting::default()
        );
        let every = of("context_overhead = \"450MiB\"\n");
        assert_eq!(
            (every.learn, every.set_for("any")),
            (false, Some(450 << 20))
        );
        assert_eq!(of("context_overhead = \"none\"\n").set_for("any"), Some(0));
        let models =
            of("context_overhead = { \"Tesla T4\" = \"300MiB\", \"NVIDIA H100\" = \"auto\" }\n");
        assert!(models.learn);
        assert_eq!(models.set_for("Tesla T4"), Some(300 << 20));
        assert_eq!(models.set_for("NVIDIA H100"), None, "auto: learned");
        let e = first_error("[defaults]\ncontext_overhead = \"450\"\n");
        assert_eq!((e.location.line, e.location.col), (2, 20), "{e}");
        assert!(e.message.contains("needs a unit"), "{e}");
        let e = first_error("[defaults]\ncontext_overhead = 3\n");
        assert!(e.message.contains("\"auto\""), "{e}");
        let e = first_error("[defaults]\ncontext_overhead = { \"Tesla T4\" = 3 }\n");
        assert!(e.message.contains("\"Tesla T4\""), "{e}");
        let e = first_error(&format!(
            "[[quota]]\ncontainer = \"{}\"\ngpu_memory = \"1GiB\"\ncontext_overhead = \"1GiB\"\n",
            "a".repeat(64)
        ));
        assert!(e.message.contains("only be set in [defaults]"), "{e}");
    }

    #[test]
    fn the_kubernetes_table_names_the_kubelets_socket_and_log_directories() {
        use crate::quota::KubeletSettings;
        let set = QuotaSet::parse("", "q.toml").unwrap();
        assert_eq!(set.kubelet(), &KubeletSettings::default());
        assert_eq!(set.kubelet().pod_resources_socket, None, "off unless set");
        let set = QuotaSet::parse(
            "[kubernetes]\npod_resources_socket = \"/var/lib/kubelet/pod-resources/kubelet.sock\"\npod_logs_dir = \"/host/var/log/pods\"\n",
            "q.toml",
        )
        .unwrap();
        assert_eq!(
            set.kubelet(),
            &KubeletSettings {
                pod_resources_socket: Some("/var/lib/kubelet/pod-resources/kubelet.sock".into()),
                pod_logs_dir: "/host/var/log/pods".into(),
            }
        );
        let e = first_error("[kubernetes]\npod_resources_socket = \"kubelet.sock\"\n");
        assert_eq!((e.location.line, e.location.col), (2, 24), "{e}");
        assert!(e.message.contains("absolute path"), "{e}");
        let e = first_error("[kubernetes]\npod_logs_dir = 3\n");
        assert!(e.message.contains("a path in quotes"), "{e}");
        let e = first_error("[kubernetes]\nsocket = \"/x\"\n");
        assert!(
            e.message.contains("unknown key `socket`")
                && e.message.contains("`pod_resources_socket`"),
            "{e}"
        );
        let e = first_error("[kubernetes]\npod_log_dir = \"/x\"\n");
        assert!(e.message.contains("did you mean `pod_logs_dir`"), "{e}");
        // Main file only.
        let main = parse_str("", "main.toml").unwrap();
        let dropin = parse_str("[kubernetes]\npod_logs_dir = \"/x\"\n", "d.toml").unwrap();
        let errors = QuotaSet::build(main, vec![dropin]).unwrap_err();
        assert!(
            errors[0].message.contains("only allowed in the main file"),
            "{errors:?}"
        );
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
