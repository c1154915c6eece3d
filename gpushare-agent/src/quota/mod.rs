//! Quotas: files, environment, matching. (in progress)
