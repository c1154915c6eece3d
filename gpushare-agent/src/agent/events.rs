//! The Kubernetes Event of an executed action: on the pod of the workload, with what happened, the
//! usage and quota on which GPU, the quota's source and what the operator can do. Posting, the
//! spam filter and repeat counting are [`crate::kube::events`]'.
//!
//! The message leaves out what changes from one occurrence to the next (how long the workload has
//! been over, the attempt number), so repeats are counted on one Event.

use crate::{
    attribution::WorkloadKind,
    grants::claims::KubeView,
    kube::events::PodEvent,
    policy::{Action, ActionKind},
    quota::{ByteSize, WorkloadMeta},
    snapshot::GrantView,
    verify::{GrantVerdict, MechanismState},
};

/// The pod (namespace, name, UID) and container name of a workload, from the API server's view,
/// else from the names the node's files tell.
fn pod_of(
    meta: Option<&WorkloadMeta>,
    view: Option<&KubeView>,
) -> Option<(String, String, String, Option<String>)> {
    let from_view = |pred: &dyn Fn(&str, &crate::grants::claims::KubeContainer) -> bool| {
        let (_, c) = view?.containers.iter().find(|(id, c)| pred(id, c))?;
        let (ns, name) = c.pod.split_once('/')?;
        Some((
            ns.to_string(),
            name.to_string(),
            c.pod_uid.clone(),
            Some(c.name.clone()),
        ))
    };
    let meta = meta?;
    let found = match &meta.id.kind {
        WorkloadKind::Container { container_id, .. } => from_view(&|id, _| id == container_id),
        WorkloadKind::Pod { pod_uid, .. } => {
            from_view(&|_, c| c.pod_uid == *pod_uid).map(|(ns, n, u, _)| (ns, n, u, None))
        }
        _ => None,
    };
    found.or_else(|| {
        let uid = match &meta.id.kind {
            WorkloadKind::Container {
                pod_uid: Some(u), ..
            }
            | WorkloadKind::Pod { pod_uid: u, .. } => u.clone(),
            _ => return None,
        };
        Some((
            meta.pod_namespace.clone()?,
            meta.pod_name.clone()?,
            uid,
            meta.container_name.clone(),
        ))
    })
}

/// The reason, whether it is a warning, what was done, and what the operator can do.
fn words(kind: ActionKind) -> (&'static str, bool, &'static str, &'static str) {
    const RELEASE: &str = "lower its GPU memory, raise its quota at the source named, or run \
                           `gpushare-agent release <workload>` on the node";
    match kind {
        ActionKind::Alert => (
            "GpuMemoryOverQuota",
            true,
            "is over its GPU-memory quota",
            RELEASE,
        ),
        ActionKind::Signal(_) => ("GpuMemorySignalled", true, "was signalled", RELEASE),
        ActionKind::Freeze => ("GpuMemoryFrozen", true, "was frozen", RELEASE),
        ActionKind::Suspend => (
            "GpuMemorySuspended",
            true,
            "is being suspended (its GPU memory moved to host memory)",
            RELEASE,
        ),
        ActionKind::Kill(_) => (
            "GpuMemoryKilled",
            true,
            "was killed",
            "lower its GPU memory or raise its quota at the source named before restarting it",
        ),
        ActionKind::Thaw => ("GpuMemoryThawed", false, "was thawed", "nothing"),
        ActionKind::Resume => ("GpuMemoryResumed", false, "was resumed", "nothing"),
    }
}

/// The Event for action `a` on the workload `meta`, when it is in a pod.
pub(super) fn pod_event(
    a: &Action,
    meta: Option<&WorkloadMeta>,
    view: Option<&KubeView>,
) -> Option<PodEvent> {
    let (namespace, pod, uid, container) = pod_of(meta, view)?;
    let (reason, warning, done, hint) = words(a.kind);
    let who = container.map_or_else(|| "the pod".to_string(), |c| format!("container {c}"));
    let mut message = format!("gpushare: {who} {done}");
    if let (Some(used), Some(quota)) = (a.usage, a.limit) {
        message += &format!(
            ": uses {} of its {} quota on {}",
            ByteSize(used).approx(),
            ByteSize(quota).approx(),
            a.gpu
        );
    }
    if warning && let Some((_, source)) = a.reason.rsplit_once("; ") {
        message += &format!(" (quota from {source})");
    }
    if a.dry_run {
        message += " [dry run: nothing was done]";
    }
    message += &format!(". To do: {hint}.");
    Some(PodEvent {
        namespace,
        pod,
        uid,
        warning,
        reason: reason.into(),
        message,
    })
}

/// The Event of a grant whose verdict turned bad (`unenforced` or `violated`), when its workload is
/// in a pod: which grant, and each mechanism that is not in force with why.
pub(super) fn grant_event(
    g: &GrantView,
    meta: Option<&WorkloadMeta>,
    view: Option<&KubeView>,
) -> Option<PodEvent> {
    let reason = match g.verdict {
        GrantVerdict::Held => return None,
        GrantVerdict::Unenforced => "GpuMemoryGrantUnenforced",
        GrantVerdict::Violated => "GpuMemoryGrantViolated",
    };
    let (namespace, pod, uid, container) = pod_of(meta, view)?;
    let who = container.map_or_else(|| "the pod".to_string(), |c| format!("container {c}"));
    let why: Vec<String> = g
        .mechanisms
        .iter()
        .filter(|m| m.state != MechanismState::InForce)
        .map(|m| {
            format!(
                "{} {}: {}",
                m.mechanism.as_str(),
                m.state.as_str(),
                m.reason
            )
        })
        .collect();
    let message = format!(
        "gpushare: the GPU memory grant of {who} ({} on {}) is {}: {}. To do: see docs/verify.md.",
        ByteSize(g.grant_bytes).approx(),
        g.gpu_uuid,
        g.verdict.as_str(),
        why.join("; ")
    );
    Some(PodEvent {
        namespace,
        pod,
        uid,
        warning: true,
        reason: reason.into(),
        message,
    })
}
