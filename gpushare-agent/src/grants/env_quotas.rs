//! The node as a grant source: what a container's runtime gave it, in its environment and its
//! devices, with the kubelet's grant joined.
//!
//! - Reads: a container's environment variables and devices, from its runtime spec, else its
//!   init process ([`runtime_spec`]), cached per workload; the kubelet's last view, when
//!   `[kubernetes] kubelet` is on ([`crate::grants::kubelet`]).
//! - Grants, per GPU, with the vendor's source ([`crate::grants::env`]: GPUShare, HAMi, NVIDIA,
//!   MPS) placed on the devices the runtime gave, joined with the kubelet's grant (source
//!   `kubelet`, the smallest per GPU: [`crate::grants::merge`]), with how far it is trusted
//!   ([`EnvQuotaReader::quota_with`]: `(EnvQuota, Trust)`, asked once per workload per step).
//!
//! Design note: what is cached is the raw quota variables per workload, keyed by where they were
//! read (the spec file's inode, size and mtime, or the init process's pid and start time), so a
//! recreated container or a restarted init is read afresh and an unchanged one costs one `stat`
//! per step. The quota itself is recomputed from the variables at every call (cheap), so a reload
//! that changes `gpushare_memory_unit`, or GPUs that appear, apply at once. An init's environment
//! is read once per init: what it writes into its environment block later is never seen.
//!
//! Only containers and pods have environment quotas. A systemd unit or a plain cgroup may run many
//! users' processes (`cron.service`, a notebook hub): honouring a variable one of them sets would
//! let any user have the whole unit signalled and frozen (a confused deputy). Those are enforced
//! only by file entries.
//!
//! Where the variables come from and which process is a container's init:
//! [`runtime_spec`]. Malformed variables and unreadable spec files are counted
//! ([`EnvQuotaReader::problems_total`]) and logged when they change, never fatal.

pub mod runtime_spec;

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::{Duration, Instant},
};

use log::{info, warn};

use self::runtime_spec::{EnvOrigin, SpecRoots};
use super::{
    env::{Disagreement, DisagreementKind, UnitCheck, env_quota_on},
    merge,
};
use crate::sys::file_stamp::FileStamp;
use crate::{
    attribution::{WorkloadId, WorkloadKind, procinfo},
    grants::kubelet::{self, PodResourcesView, devices::devices_disagree},
    quota::{DeviceRef, EnvQuota, GpuInfo, GpuShareUnit, GrantSource, Trust, resolve_device},
};

/// How often a workload without a spec is looked up again (a spec that appears later, e.g. the
/// runtime's state directory mounted late, is found within this).
const RETRY: Duration = Duration::from_secs(10);

struct Entry {
    origin: Option<EnvOrigin>,
    stamp: Option<FileStamp>,
    vars: Vec<(String, String)>,
    /// The GPUs the runtime gave (its spec's device nodes or CDI devices), when it says.
    devices: Option<Vec<DeviceRef>>,
    /// Its name in its pod, from the spec's CRI annotations.
    container_name: Option<String>,
    /// Why the kubelet's grant could not be matched, as last logged.
    logged_kubelet: String,
    looked_up: Instant,
    /// Last problems and unit check logged, so each is logged (and counted) once per change.
    logged_problems: String,
    logged_unit: String,
    unit_check: UnitCheck,
    trust: Option<Trust>,
    /// What its variables and its runtime's devices disagree on, as of its last quota, in words.
    disagreements: String,
    logged_request: Option<u64>,
}

/// Devices with their minors and UUIDs resolved to NVML indices where `gpus` tell.
fn resolved(devices: Option<&[DeviceRef]>, gpus: &[GpuInfo]) -> Option<Vec<DeviceRef>> {
    devices.map(|d| d.iter().map(|d| resolve_device(d.clone(), gpus)).collect())
}

fn entry_origin(o: &Option<EnvOrigin>) -> String {
    o.as_ref().map_or("?".into(), EnvOrigin::describe)
}

/// Reads and caches workloads' environment quotas (see the module note).
pub struct EnvQuotaReader {
    roots: SpecRoots,
    v2_root: PathBuf,
    entries: HashMap<String, Entry>,
    problems_total: u64,
    disagreements_total: BTreeMap<DisagreementKind, u64>,
}

impl EnvQuotaReader {
    /// A reader over the spec locations `roots` and the cgroup v2 hierarchy at `v2_root`.
    pub fn new(roots: SpecRoots, v2_root: PathBuf) -> Self {
        Self {
            roots,
            v2_root,
            entries: HashMap::new(),
            problems_total: 0,
            disagreements_total: BTreeMap::new(),
        }
    }

    /// A reader over the system's spec locations ([`SpecRoots::system`]).
    pub fn system(v2_root: PathBuf) -> Self {
        Self::new(SpecRoots::system(), v2_root)
    }

    /// The env quota of `workload` and how far it is trusted; `None` for workloads that are not
    /// containers or pods, and where no variable sets a limit. `gpus` are the node's GPUs (for
    /// device mapping and the unit cross-check).
    pub fn quota_for(
        &mut self,
        workload: &WorkloadId,
        unit: GpuShareUnit,
        gpus: &[GpuInfo],
    ) -> Option<(EnvQuota, Trust)> {
        self.quota_with(workload, unit, gpus, None)
    }

    /// [`Self::quota_for`] with the kubelet's pod-resources view: its grant is a trusted source,
    /// and the smallest of it and the environment applies on every GPU
    /// ([`crate::grants::merge`]); the devices it names resolve per-device variables like the
    /// runtime spec's (where both name devices and disagree, the limits are placed both ways and
    /// the smaller applies).
    pub fn quota_with(
        &mut self,
        workload: &WorkloadId,
        unit: GpuShareUnit,
        gpus: &[GpuInfo],
        kubelet: Option<&PodResourcesView>,
    ) -> Option<(EnvQuota, Trust)> {
        let key = workload.key();
        if !matches!(
            workload.kind,
            WorkloadKind::Container { .. } | WorkloadKind::Pod { .. }
        ) {
            self.entries.remove(&key);
            return None;
        }
        let fresh = self
            .entries
            .get(&key)
            .is_some_and(|e| self.still_valid(workload, e));
        if !fresh {
            let entry = self.lookup(workload);
            if let Some(o) = &entry.origin {
                info!(
                    "{key}: environment quota variables read from {} ({} variable(s), trust {})",
                    o.describe(),
                    entry.vars.len(),
                    o.trust().as_str()
                );
            }
            self.entries.insert(key.clone(), entry);
        }
        let entry = self.entries.get_mut(&key)?;
        let trust = entry.origin.as_ref().map(EnvOrigin::trust);
        let assignment = match kubelet
            .map(|v| kubelet::assignment(v, workload, entry.container_name.as_deref()))
            .transpose()
        {
            Ok(a) => {
                entry.logged_kubelet.clear();
                a.flatten()
            }
            Err(why) => {
                if why != entry.logged_kubelet {
                    warn!("{key}: {why}");
                    self.problems_total += 1;
                    entry.logged_kubelet = why;
                }
                None
            }
        };
        let kube_devices = assignment.and_then(|a| a.grant.devices.clone());
        let spec_devices = resolved(entry.devices.as_deref(), gpus);
        // Devices from the spec, else the kubelet's; both and different: placed both ways.
        let placements: Vec<Option<Vec<DeviceRef>>> = match (&spec_devices, &kube_devices) {
            (Some(s), Some(k)) if devices_disagree(s, k) => {
                vec![Some(s.clone()), Some(k.clone())]
            }
            (Some(s), _) => vec![Some(s.clone())],
            (None, k) => vec![k.clone()],
        };
        let env_on = |granted: Option<&[DeviceRef]>| {
            env_quota_on(
                entry.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                unit,
                gpus,
                granted,
            )
        };
        let mut report = env_on(placements[0].as_deref());
        let mut kube_quota = assignment.and_then(|a| {
            kubelet::part_of(a, &entry.vars, unit, gpus, placements[0].as_deref()).quota
        });
        if let Some(other) = placements.get(1) {
            let second = env_on(other.as_deref());
            report.quota = merge::placements(report.quota.take(), second.quota);
            if let Some(a) = assignment {
                kube_quota = merge::placements(
                    kube_quota,
                    kubelet::part_of(a, &entry.vars, unit, gpus, other.as_deref()).quota,
                );
            }
            report.disagreements.push(Disagreement {
                kind: DisagreementKind::KubeletDevices,
                var: "pod-resources".into(),
                said: format!(
                    "the kubelet says it was given {:?}, its runtime spec {:?}: per-device limits apply to both, the smaller binds",
                    kube_devices.as_deref().unwrap_or_default(),
                    spec_devices.as_deref().unwrap_or_default()
                ),
            });
        }
        let from = || entry_origin(&entry.origin);
        let problems: Vec<String> = report
            .problems
            .iter()
            .map(|p| format!("ignoring {p}"))
            .collect();
        let problems = problems.join("; ");
        if problems != entry.logged_problems {
            if !problems.is_empty() {
                warn!("{key}: environment quota from {}: {problems}", from());
            }
            self.problems_total += report.problems.len() as u64;
            entry.logged_problems = problems;
        }
        let unit_said = report.unit_check.describe().unwrap_or_default();
        if unit_said != entry.logged_unit {
            if !unit_said.is_empty() {
                warn!("{key}: environment quota from {}: {unit_said}", from());
            }
            entry.logged_unit = unit_said;
        }
        let disagreements = report
            .disagreements
            .iter()
            .map(|d| d.said.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        if disagreements != entry.disagreements {
            if !disagreements.is_empty() {
                warn!("{key}: environment quota from {}: {disagreements}", from());
            }
            for d in &report.disagreements {
                *self.disagreements_total.entry(d.kind).or_default() += 1;
            }
            entry.disagreements = disagreements;
        }
        if report.request != entry.logged_request {
            if let Some(r) = report.request {
                info!(
                    "{key}: requests {} of GPU memory (NVIDIA_GPU_MEMORY_REQUEST); its limit is the quota",
                    crate::quota::ByteSize(r).approx()
                );
            }
            entry.logged_request = report.request;
        }
        entry.unit_check = report.unit_check;
        let env_quota = report.quota.zip(trust);
        let result = match (kube_quota, env_quota) {
            (None, e) => e,
            (Some(k), None) => Some((k, Trust::Kubelet)),
            (Some(k), Some((e, t))) => {
                let q = merge::kubelet_and_env(k, e);
                let kubelet_binds = q.sources == GrantSource::Kubelet.into();
                Some((q, if kubelet_binds { Trust::Kubelet } else { t }))
            }
        };
        entry.trust = result.as_ref().map(|(_, t)| *t);
        result
    }

    /// Whether a cached entry still describes the workload: its spec file is unchanged, or its
    /// init still runs (and, for a container, a spec search is not due).
    fn still_valid(&self, w: &WorkloadId, e: &Entry) -> bool {
        match &e.origin {
            Some(EnvOrigin::Spec { path, .. }) => FileStamp::of(path) == e.stamp,
            Some(EnvOrigin::Init(id)) => {
                procinfo::is_same_process(*id)
                    && (e.looked_up.elapsed() < RETRY
                        || !matches!(w.kind, WorkloadKind::Container { .. })
                        || self.spec_path(w).is_none())
            }
            None => e.looked_up.elapsed() < RETRY,
        }
    }

    fn spec_path(&self, w: &WorkloadId) -> Option<(runtime_spec::SpecKind, PathBuf)> {
        match &w.kind {
            WorkloadKind::Container {
                runtime,
                container_id,
                ..
            } => runtime_spec::find_spec(&self.roots, *runtime, container_id),
            _ => None,
        }
    }

    fn lookup(&mut self, w: &WorkloadId) -> Entry {
        let mut entry = Entry {
            origin: None,
            stamp: None,
            vars: Vec::new(),
            devices: None,
            container_name: None,
            logged_kubelet: String::new(),
            looked_up: Instant::now(),
            logged_problems: String::new(),
            logged_unit: String::new(),
            unit_check: UnitCheck::NotApplicable,
            trust: None,
            disagreements: String::new(),
            logged_request: None,
        };
        if let (Some((kind, path)), Some(id)) = (self.spec_path(w), w.container_id()) {
            let stamp = FileStamp::of(&path);
            match runtime_spec::read_spec_grant(kind, &path, id) {
                Ok(grant) => {
                    entry.origin = Some(EnvOrigin::Spec { kind, path });
                    entry.stamp = stamp;
                    entry.vars = grant.vars;
                    entry.devices = grant.devices;
                    entry.container_name = grant.container_name;
                    return entry;
                }
                Err(e) => {
                    self.problems_total += 1;
                    warn!(
                        "{}: cannot read its runtime spec ({e}); falling back to its init process's environment",
                        w.key()
                    );
                }
            }
        }
        let dir = crate::sys::kernel_text::under(&self.v2_root, &w.cgroup_path);
        if let Some(init) = runtime_spec::find_init(&dir)
            && let Some(vars) = runtime_spec::read_init_environ(init)
        {
            entry.origin = Some(EnvOrigin::Init(init));
            entry.vars = vars;
        }
        entry
    }

    /// Forgets workloads not in `live` (workload keys).
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.entries.retain(|k, _| live(k));
    }

    /// Malformed variables and unreadable spec files seen so far.
    pub fn problems_total(&self) -> u64 {
        self.problems_total
    }

    /// Workloads whose `ALIYUN_COM_GPU_MEM_DEV` disagrees with the configured unit, with what it
    /// says, as of their last [`Self::quota_for`].
    pub fn unit_mismatches(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.unit_check.disagrees())
            .filter_map(|(k, e)| Some((k.clone(), e.unit_check.describe()?)))
            .collect();
        v.sort();
        v
    }

    /// Where workloads' variables and the devices their runtime gave disagree, or hold a value no
    /// plugin writes, with what was said, as of their last [`Self::quota_for`].
    pub fn disagreements(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.disagreements.is_empty())
            .map(|(k, e)| (k.clone(), e.disagreements.clone()))
            .collect();
        v.sort();
        v
    }

    /// Disagreements seen so far, by kind (each counted once per change of what a workload's
    /// variables say).
    pub fn disagreements_total(&self) -> Vec<(&'static str, u64)> {
        self.disagreements_total
            .iter()
            .map(|(k, n)| (k.as_str(), *n))
            .collect()
    }

    /// The raw quota variables cached for `key` (name, value), as its spec or init gave them.
    pub fn vars_of(&self, key: &str) -> &[(String, String)] {
        self.entries.get(key).map_or(&[], |e| e.vars.as_slice())
    }

    /// Where the quota of `key` came from, as of its last [`Self::quota_for`], when it has one.
    pub fn trust_of(&self, key: &str) -> Option<Trust> {
        self.entries.get(key).and_then(|e| e.trust)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::{
        attribution::parse_cgroup_path,
        quota::{DeviceRef, GrantSource, Sources},
    };

    const ID: &str = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    struct Fixture {
        dir: PathBuf,
        reader: EnvQuotaReader,
    }

    impl Fixture {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("gpushare-env-quotas-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            let roots = SpecRoots {
                docker_data_root: dir.join("docker"),
                containerd_task_roots: vec![dir.join("containerd")],
                crio_container_roots: vec![dir.join("crio")],
            };
            // No cgroup tree here: only specs can be found.
            let reader = EnvQuotaReader::new(roots, dir.join("no-cgroups"));
            Self { dir, reader }
        }

        /// Writes container ID's Docker config with `env`, atomically as the engine does.
        fn docker_env(&self, env: &[&str]) {
            let d = self.dir.join("docker/containers").join(ID);
            fs::create_dir_all(&d).unwrap();
            let text = serde_json::json!({ "ID": ID, "Name": "/x", "Config": { "Env": env } });
            fs::write(d.join("tmp"), text.to_string()).unwrap();
            fs::rename(d.join("tmp"), d.join("config.v2.json")).unwrap();
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    fn gpus() -> Vec<GpuInfo> {
        vec![GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            memory_total: 80 * GIB,
            minor: Some(0),
        }]
    }

    fn docker() -> WorkloadId {
        parse_cgroup_path(&format!("/docker/{ID}"))
    }

    #[test]
    fn the_quota_comes_from_the_spec_and_follows_it() {
        let mut f = Fixture::new("spec");
        f.docker_env(&["PATH=/bin", "ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
        let (q, trust) = f
            .reader
            .quota_for(&docker(), GpuShareUnit::GiB, &gpus())
            .unwrap();
        assert_eq!(
            (q.sources, q.each_gpu, trust),
            (GrantSource::GpuShare.into(), Some(GIB), Trust::RuntimeSpec)
        );
        assert_eq!(f.reader.trust_of(&docker().key()), Some(Trust::RuntimeSpec));
        // The unit is applied at each call: a reload to MiB reaches the running container at once.
        let (q, _) = f
            .reader
            .quota_for(&docker(), GpuShareUnit::MiB, &gpus())
            .unwrap();
        assert_eq!(q.each_gpu, Some(MIB));
        // The engine rewrites the file (a recreated container): read again.
        f.docker_env(&["ALIYUN_COM_GPU_MEM_CONTAINER=3", "ALIYUN_COM_GPU_MEM_IDX=0"]);
        let (q, _) = f
            .reader
            .quota_for(&docker(), GpuShareUnit::GiB, &gpus())
            .unwrap();
        assert_eq!(q.per_gpu, vec![(DeviceRef::Index(0), 3 * GIB)]);
        // Gone: no quota (no cgroup to fall back on here).
        fs::remove_dir_all(f.dir.join("docker")).unwrap();
        assert_eq!(
            f.reader.quota_for(&docker(), GpuShareUnit::GiB, &gpus()),
            None
        );
    }

    #[test]
    fn problems_are_counted_once_and_mismatches_reported() {
        let mut f = Fixture::new("problems");
        f.docker_env(&[
            "ALIYUN_COM_GPU_MEM_CONTAINER=4096",
            "ALIYUN_COM_GPU_MEM_DEV=81920",
            "CUDA_DEVICE_MEMORY_LIMIT=lots",
        ]);
        for _ in 0..3 {
            let (q, _) = f
                .reader
                .quota_for(&docker(), GpuShareUnit::GiB, &gpus())
                .unwrap();
            assert_eq!(q.each_gpu, Some(4 * GIB), "MiB, as the device size shows");
        }
        assert_eq!(
            f.reader.problems_total(),
            1,
            "counted once, not at every step"
        );
        let m = f.reader.unit_mismatches();
        assert_eq!(m.len(), 1);
        assert!(m[0].1.contains("MiB"), "{m:?}");
        // Configured right: no mismatch.
        f.reader.quota_for(&docker(), GpuShareUnit::MiB, &gpus());
        assert!(f.reader.unit_mismatches().is_empty());
        // A corrupt spec is counted too.
        let p = f
            .dir
            .join("docker/containers")
            .join(ID)
            .join("config.v2.json");
        fs::write(&p, "{").unwrap();
        assert_eq!(
            f.reader.quota_for(&docker(), GpuShareUnit::GiB, &gpus()),
            None
        );
        assert_eq!(f.reader.problems_total(), 2);
        f.reader.retain(|_| false);
        assert!(f.reader.unit_mismatches().is_empty());
    }

    #[test]
    fn a_limit_lands_on_the_gpu_the_runtime_gave_and_the_disagreement_is_counted_once() {
        let mut f = Fixture::new("granted");
        let d = f.dir.join("crio").join(ID).join("userdata");
        fs::create_dir_all(&d).unwrap();
        let spec = serde_json::json!({
            "process": { "env": [
                "CUDA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000",
                "CUDA_DEVICE_MEMORY_LIMIT_0=1024m",
            ] },
            "linux": { "devices": [ { "path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0 } ] }
        });
        fs::write(d.join("config.json"), spec.to_string()).unwrap();
        let w = parse_cgroup_path(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0d3a8c2e_5f3b_4c1e_9a7d_2b6e8f1c4a90.slice/crio-{ID}.scope"
        ));
        for _ in 0..3 {
            let (q, trust) = f.reader.quota_for(&w, GpuShareUnit::GiB, &gpus()).unwrap();
            assert_eq!(q.per_gpu, vec![(DeviceRef::Index(0), GIB)]);
            assert_eq!(trust, Trust::RuntimeSpec);
        }
        assert_eq!(f.reader.disagreements_total(), vec![("not_granted", 1)]);
        let said = f.reader.disagreements();
        assert_eq!(said.len(), 1);
        assert!(said[0].1.contains("did not give"), "{said:?}");
        f.reader.retain(|_| false);
        assert!(f.reader.disagreements().is_empty());
    }

    /// A pod's container with a CRI-O spec naming it `main`, its env `env` and GPU node `node`.
    fn crio_pod(f: &Fixture, env: &[&str], node: u32) -> WorkloadId {
        let d = f.dir.join("crio").join(ID).join("userdata");
        fs::create_dir_all(&d).unwrap();
        let spec = serde_json::json!({
            "process": { "env": env },
            "linux": { "devices": [ { "path": format!("/dev/nvidia{node}"), "type": "c" } ] },
            "annotations": { "io.kubernetes.container.name": "main" }
        });
        fs::write(d.join("config.json"), spec.to_string()).unwrap();
        parse_cgroup_path(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{ID}.scope",
            POD.replace('-', "_")
        ))
    }

    const POD: &str = "0d3a8c2e-5f3b-4c1e-9a7d-2b6e8f1c4a90";

    fn view(ids: &[(&str, &[&str])]) -> PodResourcesView {
        use crate::grants::kubelet::{
            ContainerAssignment, KubeletStatus, PodAssignment, devices::container_grant,
        };
        let mut v = PodResourcesView::empty(
            KubeletStatus::Answering,
            &crate::quota::KubeletSettings::default(),
        );
        let grant = container_grant(ids.iter().map(|(r, i)| (*r, i.iter().copied())));
        let pod = PodAssignment {
            namespace: "ns".into(),
            name: "p".into(),
            containers: [(
                "main".to_string(),
                ContainerAssignment { grant, dra: vec![] },
            )]
            .into_iter()
            .collect(),
        };
        v.by_uid.insert(POD.into(), std::sync::Arc::new(pod));
        v
    }

    fn two_gpus() -> Vec<GpuInfo> {
        (0..2)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{i}"),
                memory_total: 80 * GIB,
                minor: Some(i),
            })
            .collect()
    }

    #[test]
    fn the_kubelets_grant_and_the_environment_the_smallest_applies() {
        let mut f = Fixture::new("kubelet");
        let w = crio_pod(
            &f,
            &["ALIYUN_COM_GPU_MEM_CONTAINER=8", "ALIYUN_COM_GPU_MEM_IDX=0"],
            0,
        );
        let two = view(&[("aliyun.com/gpu-mem", &["GPU-0-_-0", "GPU-1-_-5"])]);
        let (q, t) = f
            .reader
            .quota_with(&w, GpuShareUnit::GiB, &two_gpus(), Some(&two))
            .unwrap();
        assert_eq!(
            (q.sources, q.per_gpu, t),
            (
                Sources::from(GrantSource::Kubelet),
                vec![(DeviceRef::Index(0), 2 * GIB)],
                Trust::Kubelet
            ),
            "two units beat the environment's 8"
        );
        assert_eq!(f.reader.trust_of(&w.key()), Some(Trust::Kubelet));
        let ten: Vec<String> = (0..10).map(|i| format!("GPU-0-_-{i}")).collect();
        let ten: Vec<&str> = ten.iter().map(String::as_str).collect();
        let big = view(&[("aliyun.com/gpu-mem", &ten)]);
        let (q, t) = f
            .reader
            .quota_with(&w, GpuShareUnit::GiB, &two_gpus(), Some(&big))
            .unwrap();
        assert_eq!(
            (q.sources, q.per_gpu, t),
            (
                Sources::from(GrantSource::GpuShare),
                vec![(DeviceRef::Index(0), 8 * GIB)],
                Trust::RuntimeSpec
            ),
            "the environment's 8 beats ten units"
        );
        // Without the view: the environment alone.
        let (q, _) = f
            .reader
            .quota_for(&w, GpuShareUnit::GiB, &two_gpus())
            .unwrap();
        assert_eq!(q.per_gpu, vec![(DeviceRef::Index(0), 8 * GIB)]);
        // Another container of the pod, or another pod: nothing from the kubelet.
        let other = view(&[]);
        let (q, _) = f
            .reader
            .quota_with(&w, GpuShareUnit::GiB, &two_gpus(), Some(&other))
            .unwrap();
        assert_eq!(q.sources, GrantSource::GpuShare.into());
    }

    #[test]
    fn kubelet_devices_that_disagree_with_the_spec_bound_both_and_are_counted_once() {
        let mut f = Fixture::new("kubelet-devices");
        let w = crio_pod(&f, &["CUDA_DEVICE_MEMORY_LIMIT_0=1024m"], 0);
        let v = view(&[("nvidia.com/gpu", &["GPU-1"])]);
        for _ in 0..3 {
            let (q, _) = f
                .reader
                .quota_with(&w, GpuShareUnit::GiB, &two_gpus(), Some(&v))
                .unwrap();
            assert_eq!(
                q.per_gpu,
                vec![(DeviceRef::Index(0), GIB), (DeviceRef::Index(1), GIB)],
                "ordinal 0 is GPU 0 by the spec and GPU 1 by the kubelet: both bound"
            );
        }
        assert_eq!(f.reader.disagreements_total(), vec![("kubelet_devices", 1)]);
        // Agreeing: only the GPU given.
        let v = view(&[("nvidia.com/gpu", &["GPU-0::2"])]);
        let (q, _) = f
            .reader
            .quota_with(&w, GpuShareUnit::GiB, &two_gpus(), Some(&v))
            .unwrap();
        assert_eq!(q.per_gpu, vec![(DeviceRef::Index(0), GIB)]);
    }

    #[test]
    fn units_and_plain_cgroups_never_get_environment_quotas() {
        let mut f = Fixture::new("kinds");
        for path in ["/system.slice/cron.service", "/custom/job", "/"] {
            assert_eq!(
                f.reader
                    .quota_for(&parse_cgroup_path(path), GpuShareUnit::GiB, &gpus()),
                None,
                "{path}"
            );
        }
    }
}
