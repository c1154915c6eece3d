//! Loading: the main file and the drop-in directories read from disk, and the files of one load
//! combined into a [`QuotaSet`] (defaults applied, duplicates across files rejected).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{LocatedError, QuotaFile, parse_str};
use crate::quota::{Defaults, Location, QuotaEntry, QuotaSet};

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
            defaults.take_unheld = patch.take_unheld.unwrap_or(defaults.take_unheld);
            if let Some(o) = &patch.context_overhead {
                defaults.context_overhead.clone_from(o);
            }
        }
        let kubelet = main.kubelet.clone().map(|(_, k)| k).unwrap_or_default();
        if let Some((_, k)) = &main.kubernetes {
            defaults.kubernetes.apply(k);
        }
        for d in &dropins {
            if let Some((at, _)) = &d.kubernetes {
                errors.push(LocatedError {
                    location: at.clone(),
                    message: format!(
                        "[kubernetes] is only allowed in the main file ({}): move it there",
                        main.origin
                    ),
                });
            }
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
            Ok(QuotaSet::from_parts(defaults, entries, protect).with_kubelet(kubelet))
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

/// The text of every file of one configuration, as read: what was parsed is what can be kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigFiles {
    /// The main file and its text; `None` when it does not exist (an empty configuration).
    pub main: (PathBuf, Option<String>),
    /// Per drop-in directory (in the order given), its `*.toml` files in name order.
    pub dropins: Vec<(PathBuf, Vec<(PathBuf, String)>)>,
}

/// Reads the main file (missing = empty) and every `*.toml` in each drop-in directory (missing
/// directories are skipped), sorted by file name within each directory. Files that cannot be
/// read are errors.
pub fn read_files(main: &Path, dropin_dirs: &[PathBuf]) -> (ConfigFiles, Vec<LocatedError>) {
    let mut errors = Vec::new();
    let main_text = match std::fs::read_to_string(main) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            errors.push(read_error(main, &e));
            None
        }
    };
    let mut dropins = Vec::new();
    for dir in dropin_dirs {
        let mut files = Vec::new();
        match std::fs::read_dir(dir) {
            Ok(listing) => {
                let mut paths: Vec<PathBuf> = listing
                    .filter_map(|entry| entry.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
                    .collect();
                paths.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
                for path in paths {
                    match std::fs::read_to_string(&path) {
                        Ok(text) => files.push((path, text)),
                        Err(e) => errors.push(read_error(&path, &e)),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(read_error(dir, &e)),
        }
        dropins.push((dir.clone(), files));
    }
    (
        ConfigFiles {
            main: (main.to_path_buf(), main_text),
            dropins,
        },
        errors,
    )
}

/// Parses and combines the files of one configuration. Any error in any file fails the whole
/// set; every error found is returned.
pub fn build_files(files: &ConfigFiles) -> Result<QuotaSet, Vec<LocatedError>> {
    let mut errors = Vec::new();
    let (main_path, main_text) = &files.main;
    let main_origin = main_path.display().to_string();
    let main = match main_text {
        Some(text) => parse_str(text, &main_origin)
            .map_err(|e| errors.extend(e))
            .ok(),
        None => Some(QuotaFile::empty(&main_origin)),
    };
    let mut dropins = Vec::new();
    for (path, text) in files.dropins.iter().flat_map(|(_, f)| f) {
        dropins.extend(
            parse_str(text, &path.display().to_string())
                .map_err(|e| errors.extend(e))
                .ok(),
        );
    }
    match main {
        Some(main) if errors.is_empty() => QuotaSet::build(main, dropins),
        _ => Err(errors),
    }
}

/// Loads the main file (missing = empty) and every `*.toml` in each drop-in directory (missing
/// directories are skipped), sorted by file name within each directory. Any error in any file
/// fails the whole load; every error found is returned.
pub fn load_dir_set(main: &Path, dropin_dirs: &[PathBuf]) -> Result<QuotaSet, Vec<LocatedError>> {
    let (files, mut errors) = read_files(main, dropin_dirs);
    match build_files(&files) {
        Ok(set) if errors.is_empty() => Ok(set),
        Ok(_) => Err(errors),
        Err(e) => {
            errors.extend(e);
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
}
