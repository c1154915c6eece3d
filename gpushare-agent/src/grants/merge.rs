//! The one place grants are combined: a container's limit on a GPU is the smallest over the
//! trusted sources it has, and no source lifts another's limit (pure). Every room that holds two
//! grants of a workload (the environment placed on two device lists, the kubelet's and the
//! environment's, a DRA claim and the pod's annotations, the node's and the API server's) hands
//! them here; `cargo xtask structure` fails on a call of [`smallest`] or [`smallest_of`] anywhere
//! else outside tests.
//!
//! A quota here is an [`EnvQuota`]: limits for named devices (`per_gpu`) and one for every other
//! GPU (`each_gpu`); the limit on a device is its own entry, else `each_gpu`. Combining two
//! sources keeps, on every device either names and on every other GPU, the smaller of the two
//! limits there (a source with no limit somewhere does not lift the other's there).

use std::collections::BTreeMap;

use crate::{
    grants::claims::KubeView,
    quota::{DeviceRef, EnvQuota, Sources},
};

/// The limit `q` puts on device `d`.
fn limit_on(q: &EnvQuota, d: &DeviceRef) -> Option<u64> {
    q.per_gpu
        .iter()
        .find(|(x, _)| x == d)
        .map(|(_, b)| *b)
        .or(q.each_gpu)
}

fn smaller(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

/// Whether limit `a` is strictly tighter than `b` (a limit is tighter than none).
fn tighter(a: Option<u64>, b: Option<u64>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x < y,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The smallest of `first` (the more trusted source, e.g. the kubelet's grant) and `second` on
/// every device, with the sources that bind: `first`'s where it binds everywhere it differs or
/// ties, `second`'s where only it binds, both sets where each binds somewhere.
pub fn smallest(first: &EnvQuota, second: &EnvQuota) -> EnvQuota {
    let mut per: BTreeMap<DeviceRef, u64> = BTreeMap::new();
    let mut first_binds = tighter(first.each_gpu, second.each_gpu);
    let mut second_binds = tighter(second.each_gpu, first.each_gpu);
    for d in first.per_gpu.iter().chain(&second.per_gpu).map(|(d, _)| d) {
        let (a, b) = (limit_on(first, d), limit_on(second, d));
        first_binds |= tighter(a, b);
        second_binds |= tighter(b, a);
        if let Some(l) = smaller(a, b) {
            per.insert(d.clone(), l);
        }
    }
    let sources: Sources = match (first_binds, second_binds) {
        (true, true) => first.sources | second.sources,
        (false, true) => second.sources,
        _ => first.sources,
    };
    EnvQuota {
        sources,
        per_gpu: per.into_iter().collect(),
        each_gpu: smaller(first.each_gpu, second.each_gpu),
    }
}

/// [`smallest`] of what is there: either alone when the other is absent.
pub fn smallest_of(first: Option<EnvQuota>, second: Option<EnvQuota>) -> Option<EnvQuota> {
    match (first, second) {
        (Some(a), Some(b)) => Some(smallest(&a, &b)),
        (a, b) => a.or(b),
    }
}

/// One source read twice (an environment placed on the spec's devices and on the kubelet's, where
/// they disagree): the smaller applies on each GPU, so both placements bound it.
pub fn placements(first: Option<EnvQuota>, second: Option<EnvQuota>) -> Option<EnvQuota> {
    smallest_of(first, second)
}

/// The kubelet's grant and the environment's limits: the kubelet's is named where it binds
/// everywhere it ties (the more trusted source).
pub fn kubelet_and_env(kubelet: EnvQuota, env: EnvQuota) -> EnvQuota {
    smallest(&kubelet, &env)
}

/// What the node says (the environment, the kubelet) and what the API server grants.
pub fn node_and_api_server(node: Option<EnvQuota>, api: Option<EnvQuota>) -> Option<EnvQuota> {
    smallest_of(node, api)
}

/// What the API server grants container `container_id`: its own claims and its pod's
/// annotations, the smallest per GPU; `None` when it grants nothing.
pub fn kube_container(view: &KubeView, container_id: &str) -> Option<EnvQuota> {
    let c = view.containers.get(container_id)?;
    smallest_of(c.dra.clone(), c.annotation.clone())
}

/// What the API server grants a pod whose containers share a claim: the claims' memory, lowered
/// by any sharer's annotation.
pub fn kube_pod(view: &KubeView, pod_uid: &str) -> Option<EnvQuota> {
    let (q, ids) = view.shared.get(pod_uid)?;
    ids.iter()
        .filter_map(|id| view.containers.get(id)?.annotation.as_ref())
        .fold(q.clone(), |q, a| smallest(&q, a))
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::GrantSource;

    const GIB: u64 = 1 << 30;

    fn q(sources: Sources, per: &[(u32, u64)], each: Option<u64>) -> EnvQuota {
        EnvQuota {
            sources,
            per_gpu: per
                .iter()
                .map(|(i, b)| (DeviceRef::Index(*i), b * GIB))
                .collect(),
            each_gpu: each.map(|b| b * GIB),
        }
    }

    fn kubelet(per: &[(u32, u64)], each: Option<u64>) -> EnvQuota {
        q(GrantSource::Kubelet.into(), per, each)
    }

    fn env(per: &[(u32, u64)], each: Option<u64>) -> EnvQuota {
        q(GrantSource::Hami.into(), per, each)
    }

    /// The kubelet's and the environment's sources together.
    fn both() -> Sources {
        Sources::from(GrantSource::Kubelet) | GrantSource::Hami.into()
    }

    fn merged(a: &EnvQuota, b: &EnvQuota) -> EnvQuota {
        smallest(a, b)
    }

    #[test]
    fn a_grant_beats_a_larger_environment_value_and_a_smaller_one_beats_the_grant() {
        // Grant 2 GiB on GPU 0; the environment says 8 GiB there: the grant binds.
        let m = merged(&kubelet(&[(0, 2)], None), &env(&[(0, 8)], None));
        assert_eq!(m, kubelet(&[(0, 2)], None));
        // The environment says 1 GiB: it binds, and the source says so.
        let m = merged(&kubelet(&[(0, 2)], None), &env(&[(0, 1)], None));
        assert_eq!(m, env(&[(0, 1)], None));
        // Equal: the trusted source is named.
        let m = merged(&kubelet(&[(0, 2)], None), &env(&[(0, 2)], None));
        assert_eq!(m.sources, GrantSource::Kubelet.into());
    }

    #[test]
    fn every_gpu_limits_bound_named_devices_and_neither_lifts_the_other() {
        // Grant on every GPU (no GPU index known) 2 GiB; env names GPU 1 with 6 GiB.
        let m = merged(&kubelet(&[], Some(2)), &env(&[(1, 6)], None));
        assert_eq!(m, kubelet(&[(1, 2)], Some(2)));
        // Env on every GPU 1 GiB; grant names GPU 0 with 4 GiB.
        let m = merged(&kubelet(&[(0, 4)], None), &env(&[], Some(1)));
        assert_eq!(m, env(&[(0, 1)], Some(1)));
        // Each binds somewhere: both named.
        let m = merged(&kubelet(&[(0, 2)], Some(9)), &env(&[(1, 3)], Some(5)));
        assert_eq!(m, q(both(), &[(0, 2), (1, 3)], Some(5)));
        // A device only one names keeps its limit there; the other's absence lifts nothing.
        let m = merged(&kubelet(&[(0, 2)], None), &env(&[(1, 3)], None));
        assert_eq!(m, q(both(), &[(0, 2), (1, 3)], None));
        // The every-GPU limits: the smaller, either way round.
        assert_eq!(
            merged(&kubelet(&[], Some(3)), &env(&[], Some(4))).each_gpu,
            Some(3 * GIB)
        );
        assert_eq!(
            merged(&kubelet(&[], Some(4)), &env(&[], Some(3))).each_gpu,
            Some(3 * GIB)
        );
        assert_eq!(
            merged(&kubelet(&[], Some(4)), &env(&[], Some(3))).sources,
            GrantSource::Hami.into()
        );
        assert_eq!(
            merged(&kubelet(&[], None), &env(&[], Some(3))).sources,
            GrantSource::Hami.into()
        );
        assert_eq!(
            merged(&kubelet(&[], Some(3)), &env(&[], None)).sources,
            GrantSource::Kubelet.into()
        );
    }

    /// The sources are a set: two grants of one source (one environment placed on two device
    /// lists, two annotations) that each bind somewhere name that source once, not "several".
    #[test]
    fn one_source_twice_is_named_once() {
        let m = smallest(&env(&[(0, 2)], Some(9)), &env(&[(1, 3)], Some(5)));
        assert_eq!(m.sources, GrantSource::Hami.into());
        assert_eq!(m.sources.as_str(), "hami env");
        let both = smallest(&kubelet(&[(0, 2)], Some(9)), &env(&[(1, 3)], Some(5)));
        assert_eq!(
            both.sources.as_str(),
            "kubelet and env (the smallest applies)"
        );
    }

    /// The combinations the other rooms call: the kubelet is named where it ties (the more
    /// trusted), the node's and the API server's sources together are "several".
    #[test]
    fn each_combination_names_the_sources_that_bind() {
        let tie = kubelet_and_env(kubelet(&[(0, 2)], None), env(&[(0, 2)], None));
        assert_eq!(tie.sources, GrantSource::Kubelet.into());
        let node = kubelet_and_env(kubelet(&[(0, 2)], Some(9)), env(&[(1, 3)], Some(5)));
        assert_eq!(node.sources, both());
        let api = q(GrantSource::Dra.into(), &[(2, 1)], None);
        let m = node_and_api_server(Some(node.clone()), Some(api)).unwrap();
        assert_eq!(m.sources.as_str(), "several sources (the smallest applies)");
        assert_eq!(m.per_gpu.len(), 3);
        assert_eq!(node_and_api_server(Some(node.clone()), None), Some(node));
        let twice = placements(Some(env(&[(0, 2)], None)), Some(env(&[(1, 3)], None)));
        assert_eq!(twice, Some(env(&[(0, 2), (1, 3)], None)));
    }

    #[test]
    fn an_absent_source_changes_nothing() {
        let k = kubelet(&[(0, 2)], None);
        let e = env(&[(0, 1)], None);
        assert_eq!(smallest_of(Some(k.clone()), None), Some(k.clone()));
        assert_eq!(smallest_of(None, Some(e.clone())), Some(e.clone()));
        assert_eq!(smallest_of(None, None), None);
        assert_eq!(smallest_of(Some(k), Some(e.clone())), Some(e));
    }

    proptest::proptest! {
        /// A source is named alone only where it alone gives every limit of the result (on each
        /// device and on every other GPU); `both` only where neither does.
        #[test]
        fn a_source_is_named_only_where_it_gives_every_limit(
            a in proptest::collection::btree_map(0u32..3, 1u64..6, 0..3),
            ae in proptest::option::of(1u64..6),
            b in proptest::collection::btree_map(0u32..3, 1u64..6, 0..3),
            be in proptest::option::of(1u64..6),
        ) {
            let (a, b) = (
                kubelet(&a.into_iter().collect::<Vec<_>>(), ae),
                env(&b.into_iter().collect::<Vec<_>>(), be),
            );
            let m = merged(&a, &b);
            let gives_all = |src: &EnvQuota| {
                m.each_gpu == src.each_gpu
                    && (0..4).all(|i| {
                        let d = DeviceRef::Index(i);
                        limit_on(&m, &d) == limit_on(src, &d)
                    })
            };
            if m.sources == a.sources {
                proptest::prop_assert!(gives_all(&a), "{m:?}");
            } else if m.sources == b.sources {
                proptest::prop_assert!(gives_all(&b), "{m:?}");
            } else {
                proptest::prop_assert_eq!(m.sources, both());
                proptest::prop_assert!(!gives_all(&a) && !gives_all(&b), "{m:?}");
            }
        }

        /// The result is never above either source on any device or on every other GPU.
        #[test]
        fn never_above_either(
            a in proptest::collection::vec((0u32..3, 1u64..10), 0..3),
            ae in proptest::option::of(1u64..10),
            b in proptest::collection::vec((0u32..3, 1u64..10), 0..3),
            be in proptest::option::of(1u64..10),
        ) {
            let dedup = |v: Vec<(u32, u64)>| {
                let m: BTreeMap<u32, u64> = v.into_iter().collect();
                m.into_iter().collect::<Vec<_>>()
            };
            let (a, b) = (kubelet(&dedup(a), ae), env(&dedup(b), be));
            let m = merged(&a, &b);
            for i in 0..4 {
                let d = DeviceRef::Index(i);
                let got = limit_on(&m, &d);
                for src in [&a, &b] {
                    if let Some(l) = limit_on(src, &d) {
                        proptest::prop_assert!(got.is_some_and(|g| g <= l));
                    }
                }
            }
        }
    }

    /// The API server's grants: a container's claims and its pod's annotations, combined here.
    mod kube_api {
        use serde_json::json;

        use super::super::{kube_container, kube_pod, smallest};
        use crate::{
            grants::claims::{
                NVIDIA_DRA_DRIVER, describe,
                tests::{GI, UID, ann, cid, claim, dra, one, pod},
                view,
            },
            quota::{DeviceRef, EnvQuota, GpuShareUnit, GrantSource, Sources},
        };

        #[test]
        fn the_smallest_applies_on_each_gpu_and_names_its_source() {
            let min = |a: &EnvQuota, b: &EnvQuota| {
                kube_container(&one(Some(a.clone()), Some(b.clone())), &cid(0)).unwrap()
            };
            let a = dra(&[(0, 4 * GI)], None);
            let b = ann(Some(2 * GI), &[]);
            let m = min(&a, &b);
            assert_eq!(m.per_gpu, vec![(DeviceRef::Minor(0), 2 * GI)]);
            assert_eq!(m.each_gpu, Some(2 * GI));
            assert_eq!(
                m.sources,
                GrantSource::Annotation.into(),
                "b's limits are kept"
            );
            // An annotation never lifts: 8 GiB over a 4 GiB claim keeps 4 GiB on its GPU; the
            // annotation's 8 GiB bounds every other GPU, so both are named.
            let m = min(&a, &ann(Some(8 * GI), &[]));
            assert_eq!(m.per_gpu, vec![(DeviceRef::Minor(0), 4 * GI)]);
            assert_eq!(m.each_gpu, Some(8 * GI));
            assert_eq!(
                m.sources,
                Sources::from(GrantSource::Dra) | GrantSource::Annotation.into()
            );
            // The claim's `gpu-0` is a device minor, the annotation's GPU 0 an NVML index: which GPU each
            // is, NVML tells (here minor 0 is GPU 0, minor 1 GPU 1), and there the claim's limit is kept.
            let gpus: Vec<crate::quota::GpuInfo> = (0..2)
                .map(|i| crate::quota::GpuInfo {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    memory_total: 80 * GI,
                    minor: Some(i),
                })
                .collect();
            let m = crate::quota::resolve_quota(min(&a, &ann(None, &[(0, 8 * GI)])), &gpus);
            assert_eq!(m.per_gpu, vec![(DeviceRef::Index(0), 4 * GI)]);
            let m = crate::quota::resolve_quota(min(&a, &ann(None, &[(1, GI)])), &gpus);
            assert_eq!(
                m.per_gpu,
                vec![(DeviceRef::Index(0), 4 * GI), (DeviceRef::Index(1), GI)]
            );
            assert_eq!(
                m.sources,
                Sources::from(GrantSource::Dra) | GrantSource::Annotation.into()
            );
            let q = |d, a| kube_container(&one(d, a), &cid(0));
            assert_eq!(q(None, Some(b.clone())), Some(b.clone()));
            assert_eq!(q(Some(a.clone()), None), Some(a.clone()));
            assert_eq!(q(None, None), None);
            assert_eq!(kube_container(&one(None, None), &cid(1)), None);
            let m = min(&dra(&[], Some(GI)), &ann(Some(3 * GI), &[]));
            assert_eq!((m.each_gpu, m.sources), (Some(GI), GrantSource::Dra.into()));
        }

        #[test]
        fn a_sharers_annotation_lowers_the_pods_union() {
            let p = pod(
                json!({ "nvidia.com/container.b.gpu-memory.limit": "1Gi" }),
                &[("a", &["gpu"]), ("b", &["gpu"])],
                &[("gpu", "x")],
            );
            let c = claim("x", &[(NVIDIA_DRA_DRIVER, "gpu-0", Some("4Gi"))]);
            let v = view(&[p], &[c], GpuShareUnit::GiB);
            let q = kube_pod(&v, UID).unwrap();
            assert_eq!(q.per_gpu, vec![(DeviceRef::Minor(0), GI)]);
            assert_eq!(describe(Some(&q)), "/dev/nvidia0: 1 GiB, each GPU: 1 GiB");
            assert_eq!(describe(None), "none");
        }

        /// One rule: the API server's minimum of a claim and an annotation is `smallest`'s, the
        /// source it names included (a copy of the rule here once named the claim where an annotation's
        /// every-GPU limit bound the other GPUs, and the annotation where the claim's did).
        #[test]
        fn a_claim_and_an_annotation_combine_by_the_trusted_rule() {
            let cases = [
                // The claim names GPU 0 only; the annotation bounds every GPU: each binds somewhere.
                (dra(&[(0, 4 * GI)], None), ann(Some(8 * GI), &[])),
                // The claim bounds every GPU; the annotation names GPU 0 only.
                (dra(&[], Some(8 * GI)), ann(None, &[(0, 4 * GI)])),
                (dra(&[], Some(GI)), ann(None, &[(0, 8 * GI)])),
                (dra(&[(0, 4 * GI)], None), ann(Some(2 * GI), &[])),
                (dra(&[(0, 4 * GI)], None), ann(None, &[(1, GI)])),
                (dra(&[(0, 4 * GI)], None), ann(None, &[(0, 8 * GI)])),
                (dra(&[(0, 2 * GI)], Some(GI)), ann(Some(GI), &[(0, 2 * GI)])),
            ];
            for (i, (d, a)) in cases.into_iter().enumerate() {
                let v = one(Some(d.clone()), Some(a.clone()));
                let want = smallest(&d, &a);
                assert_eq!(
                    kube_container(&v, &cid(0)),
                    Some(want.clone()),
                    "{d:?} {a:?}"
                );
                assert_eq!(kube_pod(&v, UID), Some(want.clone()), "{d:?} {a:?}");
                if i < 2 {
                    assert_eq!(
                        want.sources,
                        Sources::from(GrantSource::Dra) | GrantSource::Annotation.into(),
                        "{d:?} {a:?}"
                    );
                }
            }
        }
    }
}
