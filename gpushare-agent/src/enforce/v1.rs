//! Which group to freeze: the workload's v2 root group where it has a v2 freezer, else its root in
//! the v1 freezer hierarchy (hybrid hosts), found through the v1 group of one of its processes.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use super::{Enforcer, freeze::Freezer};
use crate::attribution::parse_cgroup_path;

impl Enforcer {
    /// The v1 freezer group of a process.
    pub(super) fn v1_freezer_dir_of(&self, pid: u32) -> Result<PathBuf> {
        let root = self
            .v1_freezer_root
            .as_ref()
            .context("no v1 freezer mounted")?;
        let path = v1_group_of(pid, "freezer")?;
        Ok(crate::sys::kernel_text::under(root, &path))
    }

    /// The group to freeze and its freezer: the v2 root group, else the workload's root in the v1
    /// freezer hierarchy (the root of the v1 path of one of its processes, which must name the
    /// same workload).
    pub(super) fn freezer_for(
        &self,
        workload: &str,
        rel: &str,
        pid_hint: Option<u32>,
    ) -> Result<(PathBuf, Freezer)> {
        let v2 = self.v2_dir(rel);
        if v2.join("cgroup.freeze").exists() {
            return Ok((v2, Freezer::V2));
        }
        let root = self
            .v1_freezer_root
            .as_ref()
            .context("no cgroup v2 freezer for the group and no v1 freezer mounted")?;
        let pid = pid_hint.context("no process known to find the group's v1 freezer")?;
        let v1_path = v1_group_of(pid, "freezer")?;
        let id = parse_cgroup_path(&v1_path);
        // The v1 group must be the workload's own: the same key for a container, pod or unit;
        // the workload's root or below it for a plain cgroup (whose root is then frozen).
        let group = if workload.starts_with("cgroup://") {
            let root_rel = format!("/{}", rel.trim_matches('/'));
            if v1_path != root_rel && !v1_path.starts_with(&format!("{root_rel}/")) {
                bail!("the v1 freezer group of pid {pid} ({v1_path}) is not under {root_rel}");
            }
            root_rel
        } else if id.key() == workload {
            id.cgroup_path
        } else {
            bail!("the v1 freezer group of pid {pid} ({v1_path}) is not {workload}'s");
        };
        self.check_target(&group)?;
        Ok((crate::sys::kernel_text::under(root, &group), Freezer::V1))
    }
}

/// The group of a process in the v1 hierarchy of `controller`, as `/proc/<pid>/cgroup` spells it.
pub(super) fn v1_group_of(pid: u32, controller: &str) -> Result<String> {
    crate::sys::proc_cgroup::v1_path(pid, controller)?
        .with_context(|| format!("process has no v1 {controller} group"))
}
