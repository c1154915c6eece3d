//! Warnings about a valid quota configuration: things that load fine but probably do not do what
//! the operator meant. `gpushare-agent check` prints them and the agent logs them at each load; they
//! never reject a file.
//!
//! - A bare `container_name` entry next to pod entries: the name is chosen by a pod's author and
//!   matches in every namespace, so on a node shared by tenants a pod that no entry names by id or
//!   pod can pick that entry's quota by naming its container after it (see [`super::select`]).
//! - A `protect` pattern over cgroup paths that also covers containers: with the systemd cgroup
//!   driver containers live in `/system.slice/docker-<id>.scope`, `/system.slice/crio-<id>.scope`,
//!   ..., so `cgroup:///system.slice/*` protects every one of them from enforcement.

use super::{QuotaSet, Selector, WorkloadMeta};
use crate::workload::parse_cgroup_path;

/// A container id used for the sample paths below.
const SAMPLE_ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
/// A pod UID used for the sample paths below (dashed, and with `_` as the systemd driver writes it).
const SAMPLE_UID: &str = "01234567-89ab-cdef-0123-456789abcdef";

/// Where Docker, containerd and CRI-O put a container's cgroup, with either cgroup driver, plain and
/// in a Kubernetes pod: what a `protect` pattern should not cover by accident.
pub fn sample_container_paths() -> Vec<String> {
    let id = SAMPLE_ID;
    let uid = SAMPLE_UID;
    let uid_ = SAMPLE_UID.replace('-', "_");
    let mut paths = vec![
        // Docker: cgroupfs and systemd drivers.
        format!("/docker/{id}"),
        format!("/system.slice/docker-{id}.scope"),
        // containerd and CRI-O outside Kubernetes, systemd driver.
        format!("/system.slice/cri-containerd-{id}.scope"),
        format!("/system.slice/crio-{id}.scope"),
        format!("/machine.slice/libpod-{id}.scope"),
    ];
    for qos in ["", "burstable", "besteffort"] {
        // Kubernetes, cgroupfs driver: the runtime is not in the path.
        let parent = if qos.is_empty() {
            "/kubepods".to_string()
        } else {
            format!("/kubepods/{qos}")
        };
        paths.push(format!("{parent}/pod{uid}/{id}"));
        // Kubernetes, systemd driver: one scope per runtime.
        let slice = if qos.is_empty() {
            format!("/kubepods.slice/kubepods-pod{uid_}.slice")
        } else {
            format!("/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid_}.slice")
        };
        for runtime in ["cri-containerd", "crio", "docker"] {
            paths.push(format!("{slice}/{runtime}-{id}.scope"));
        }
    }
    paths
}

impl QuotaSet {
    /// Warnings about a configuration that loads but probably does not do what was meant, each
    /// naming where the entry or pattern is written when known.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let pod_entries: Vec<String> = self
            .entries()
            .iter()
            .filter(|e| {
                matches!(
                    e.selector,
                    Selector::PodUid(_) | Selector::PodName { .. } | Selector::PodContainer { .. }
                )
            })
            .map(|e| format!("{}:{}", e.origin.file, e.origin.line))
            .collect();
        if !pod_entries.is_empty() {
            for e in self.entries() {
                if let Selector::ContainerName(name) = &e.selector {
                    out.push(format!(
                        "{}: `container_name = \"{name}\"` matches every container named \"{name}\" in every pod and namespace, \
                         and this configuration also has pod entries ({}): on a node shared by tenants, a pod that no entry \
                         names can get this quota by naming its container \"{name}\". A bare container_name is meant for \
                         single-tenant nodes; name the pod too (`pod` or `pod_uid` with `container_name`)",
                        e.origin,
                        pod_entries.join(", ")
                    ));
                }
            }
        }
        let samples: Vec<WorkloadMeta> = sample_container_paths()
            .iter()
            .map(|p| WorkloadMeta::new(parse_cgroup_path(p)))
            .collect();
        for p in &self.protect {
            let pattern = p.0.pattern();
            if !pattern.starts_with("cgroup://") {
                continue; // a pattern over container keys names containers on purpose
            }
            if let Some(w) = samples.iter().find(|w| p.matches(w)) {
                out.push(format!(
                    "protect pattern \"{pattern}\" also covers containers (e.g. {}, as the {} cgroup driver names them): \
                     no container there would ever be enforced. Protect services by unit (\"unit://sshd.service\") \
                     and containers by key (\"docker://<id>\") instead",
                    w.id.cgroup_path,
                    if w.id.cgroup_path.ends_with(".scope") {
                        "systemd"
                    } else {
                        "cgroupfs"
                    }
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f3d8e2a-6b1c-4d5e-9f7a-8b2c1d0e3f4a";

    fn warnings(text: &str) -> Vec<String> {
        QuotaSet::parse(text, "q.toml").unwrap().warnings()
    }

    #[test]
    fn a_bare_container_name_next_to_pod_entries_is_flagged() {
        let w = warnings(&format!(
            "[[quota]]\ncontainer_name = \"main\"\ngpu_memory = \"40GiB\"\n\n[[quota]]\npod_uid = \"{UID}\"\ngpu_memory = \"1GiB\"\n"
        ));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("q.toml:1:1: `container_name = \"main\"`"),
            "{w:?}"
        );
        assert!(w[0].contains("q.toml:5"), "names the pod entry: {w:?}");
        assert!(w[0].contains("single-tenant"), "{w:?}");
        // Alone, or with a pod + container name entry only as pod entries.
        assert!(
            warnings("[[quota]]\ncontainer_name = \"main\"\ngpu_memory = \"4GiB\"\n").is_empty()
        );
        assert_eq!(
            warnings("[[quota]]\ncontainer_name = \"a\"\ngpu_memory = \"4GiB\"\n\n[[quota]]\npod = \"ml/x\"\ncontainer_name = \"b\"\ngpu_memory = \"1GiB\"\n").len(),
            1
        );
        assert!(
            warnings(&format!(
                "[[quota]]\npod_uid = \"{UID}\"\ngpu_memory = \"1GiB\"\n"
            ))
            .is_empty()
        );
    }

    #[test]
    fn a_protect_glob_over_cgroup_paths_that_covers_containers_is_flagged() {
        let w = warnings("protect = [\"cgroup:///system.slice/*\"]\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("/system.slice/docker-"), "{w:?}");
        assert!(warnings("protect = [\"cgroup:///kubepods/**\"]\n")[0].contains("cgroupfs"));
        for fine in [
            "unit://sshd.service",
            "cgroup:///system.slice/sshd.service",
            "cgroup:///system.slice/*.service",
            "docker://*",
            "pod://*",
        ] {
            assert!(
                warnings(&format!("protect = [\"{fine}\"]\n")).is_empty(),
                "{fine}"
            );
        }
    }

    /// The TOML the project ships: deploy/quotas.toml, the ConfigMap's quotas.toml, and every
    /// ```toml block of docs/quotas.md.
    fn shipped_examples() -> Vec<(String, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        let mut out = vec![("deploy/quotas.toml".to_string(), read("deploy/quotas.toml"))];
        let cm = read("deploy/kubernetes/configmap.yaml");
        let body: Vec<&str> = cm
            .lines()
            .skip_while(|l| l.trim() != "quotas.toml: |")
            .skip(1)
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .map(|l| l.get(4..).unwrap_or(""))
            .collect();
        assert!(body.len() > 5, "no quotas.toml in the ConfigMap");
        out.push(("deploy/kubernetes/configmap.yaml".into(), body.join("\n")));
        let md = read("docs/quotas.md");
        for (i, block) in md.split("```toml\n").skip(1).enumerate() {
            let toml = block.split("```").next().unwrap();
            out.push((format!("docs/quotas.md block {i}"), toml.to_string()));
        }
        assert!(out.len() >= 3);
        out
    }

    #[test]
    fn the_shipped_examples_protect_no_docker_containerd_or_crio_workload() {
        for (name, text) in shipped_examples() {
            let set = QuotaSet::parse(&text, &name).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            for path in sample_container_paths() {
                let w = WorkloadMeta::new(parse_cgroup_path(&path));
                assert!(
                    !set.is_protected(&w),
                    "{name} protects the container {path}"
                );
            }
            assert!(set.warnings().is_empty(), "{name}: {:?}", set.warnings());
        }
    }

    #[test]
    fn the_sample_paths_are_containers() {
        for p in sample_container_paths() {
            assert!(parse_cgroup_path(&p).container_id().is_some(), "{p}");
        }
    }
}
