//! Docker container names a node can tell without the Docker API, from the engine's on-disk state.
//!
//! A cgroup path gives a Docker container only by id (`/docker/<64 hex>`, `docker-<id>.scope`). The
//! engine keeps one directory per container, `<data root>/containers/<id>/`, whose `config.v2.json`
//! holds its name as `"Name": "/<name>"` (and its id as `"ID"`). The engine replaces the file
//! atomically (write to a temporary file, rename) whenever the container's state or name changes
//! (`docker rename` included), so a reader never sees half a file, and a changed inode or mtime
//! says the name may have changed.
//!
//! Where the file is missing, unreadable, oversized or not what it should be (another data root,
//! rootless Docker, a corrupt file), the functions return `None` and callers keep the short id; they
//! never panic. Only the Docker engine's layout is read: no socket, no API call, nothing written.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::sys::file_stamp::FileStamp;

/// The engine's default data root.
pub const DEFAULT_DATA_ROOT: &str = "/var/lib/docker";
/// The engine's configuration file, which may move the data root (`"data-root"`).
pub const DAEMON_JSON: &str = "/etc/docker/daemon.json";
/// Larger files are not read: a real `config.v2.json` is a few KiB (tens with many mounts).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Whether `id` is a full Docker container id: 64 lowercase hex digits (also keeps any path
/// component such as `..` out of the file name).
pub fn is_full_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `name` is a valid Docker container name: `[a-zA-Z0-9][a-zA-Z0-9_.-]+`.
pub fn is_valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() >= 2
        && b.len() <= 255
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// The config file of container `id` under `data_root`.
pub fn config_path(data_root: &Path, id: &str) -> PathBuf {
    data_root.join("containers").join(id).join("config.v2.json")
}

/// The name of container `id` (full id) from `<data_root>/containers/<id>/config.v2.json`,
/// without the leading `/`; `None` when the file is missing, unreadable, too large, not JSON,
/// names another container, or holds no valid name.
pub fn docker_container_name(data_root: &Path, id: &str) -> Option<String> {
    if !is_full_id(id) {
        return None;
    }
    let path = config_path(data_root, id);
    if std::fs::metadata(&path).ok()?.len() > MAX_CONFIG_BYTES {
        return None;
    }
    name_from_config(&std::fs::read(&path).ok()?, id)
}

#[derive(serde::Deserialize)]
struct ConfigV2 {
    #[serde(rename = "ID", default)]
    id: Option<String>,
    #[serde(rename = "Name", default)]
    name: Option<String>,
}

/// What the environment is read from (apart from [`ConfigV2`], so an odd `Config` never costs a
/// container its name).
#[derive(serde::Deserialize)]
struct ConfigV2Env {
    #[serde(rename = "ID", default)]
    id: Option<String>,
    #[serde(rename = "Config", default)]
    config: Option<ContainerConfig>,
}

/// The part of `config.v2.json`'s `"Config"` the agent reads.
#[derive(serde::Deserialize)]
struct ContainerConfig {
    /// `NAME=value` strings: the image's `ENV` merged with `docker run -e` (and, under Kubernetes,
    /// what the kubelet and device plugins set), as the engine gave them to the container.
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
}

/// The environment the engine gave container `id`, from the text of its `config.v2.json`
/// (`Config.Env`), as `NAME=value` strings. An error says why the file cannot be used: not JSON,
/// another container's file, no `Config.Env`.
pub fn env_from_config(bytes: &[u8], id: &str) -> Result<Vec<String>, String> {
    let cfg: ConfigV2Env =
        serde_json::from_slice(bytes).map_err(|e| format!("not a Docker container config: {e}"))?;
    if cfg.id.as_deref().is_some_and(|i| i != id) {
        return Err("the file names another container".to_string());
    }
    cfg.config
        .and_then(|c| c.env)
        .ok_or_else(|| "no Config.Env in the file".to_string())
}

/// The name in the text of a `config.v2.json`, checked against the container id `id`.
fn name_from_config(bytes: &[u8], id: &str) -> Option<String> {
    let cfg: ConfigV2 = serde_json::from_slice(bytes).ok()?;
    if cfg.id.as_deref().is_some_and(|i| i != id) {
        return None;
    }
    let name = cfg.name?;
    let name = name.strip_prefix('/').unwrap_or(&name);
    is_valid_name(name).then(|| name.to_string())
}

/// The engine's data root: `"data-root"` (or the legacy `"graph"`) of the daemon configuration
/// `daemon_json` (normally [`DAEMON_JSON`]) when it sets one, else [`DEFAULT_DATA_ROOT`].
pub fn data_root_from(daemon_json: &Path) -> PathBuf {
    #[derive(serde::Deserialize)]
    struct DaemonJson {
        #[serde(rename = "data-root", default)]
        data_root: Option<String>,
        #[serde(default)]
        graph: Option<String>,
    }
    std::fs::read(daemon_json)
        .ok()
        .and_then(|b| serde_json::from_slice::<DaemonJson>(&b).ok())
        .and_then(|d| d.data_root.or(d.graph))
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_ROOT))
}

struct Entry {
    stamp: Option<FileStamp>,
    name: Option<String>,
    used: bool,
}

/// Container names by id, re-read only when the container's config file changes (one `stat` per
/// look-up otherwise). Entries not looked up between two [`DockerNames::sweep`]s are dropped, so
/// the cache holds only live containers.
pub struct DockerNames {
    data_root: PathBuf,
    entries: HashMap<String, Entry>,
    reads: u64,
}

impl DockerNames {
    /// A cache over the data root `data_root`.
    pub fn new(data_root: PathBuf) -> Self {
        Self {
            data_root,
            entries: HashMap::new(),
            reads: 0,
        }
    }

    /// The data root.
    pub fn data_root(&self) -> &Path {
        &self.data_root
    }

    /// How many times a config file was read (parsed) so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Number of cached containers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The name of container `id` (full id), or `None` when the engine's files do not tell it.
    pub fn name(&mut self, id: &str) -> Option<String> {
        if !is_full_id(id) {
            return None;
        }
        let stamp = FileStamp::of(&config_path(&self.data_root, id));
        if let Some(e) = self.entries.get_mut(id)
            && e.stamp == stamp
        {
            e.used = true;
            return e.name.clone();
        }
        let name = match stamp {
            Some(_) => {
                self.reads += 1;
                docker_container_name(&self.data_root, id)
            }
            None => None,
        };
        self.entries.insert(
            id.to_string(),
            Entry {
                stamp,
                name: name.clone(),
                used: true,
            },
        );
        name
    }

    /// Drops the containers not looked up since the previous sweep.
    pub fn sweep(&mut self) {
        self.entries.retain(|_, e| std::mem::take(&mut e.used));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_testkit::TempTree;
    use std::fs;

    const ID: &str = "3f2a9c8e7d6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f";
    const OTHER: &str = "0000000000000000000000000000000000000000000000000000000000000001";

    fn tree(tag: &str) -> TempTree {
        TempTree::new(&format!("gpushare-docker-names-{tag}-"))
    }

    /// Writes a container's config file atomically, as the engine does.
    fn write_config(root: &TempTree, id: &str, text: &str) {
        let dir = root.path().join("containers").join(id);
        fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join(".tmp-config.v2.json");
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, dir.join("config.v2.json")).unwrap();
    }

    /// The shape the engine writes (abridged: the real file has many more fields).
    fn config(id: &str, name: &str) -> String {
        format!(
            r#"{{"StreamConfig":{{}},"State":{{"Running":true,"Paused":false,"Pid":4242}},"ID":"{id}","Created":"2026-01-01T00:00:00Z","Managed":false,"Path":"/bin/sh","Args":[],"Config":{{"Hostname":"3f2a9c8e7d6b","Env":["PATH=/bin"],"Image":"busybox","Labels":{{"a":"b"}}}},"Image":"sha256:00","Name":"{name}","RestartCount":0,"Driver":"overlay2","MountLabel":"","ProcessLabel":"","AppArmorProfile":"","HostnamePath":"/var/lib/docker/containers/{id}/hostname"}}"#
        )
    }

    #[test]
    fn the_name_comes_from_the_engines_config_file_without_its_slash() {
        let root = tree("name");
        write_config(&root, ID, &config(ID, "/trainer-0"));
        assert_eq!(
            docker_container_name(root.path(), ID),
            Some("trainer-0".to_string())
        );
        // Generated names, dots and underscores are names too.
        write_config(&root, OTHER, &config(OTHER, "/quirky_turing.v2"));
        assert_eq!(
            docker_container_name(root.path(), OTHER),
            Some("quirky_turing.v2".to_string())
        );
    }

    #[test]
    fn missing_corrupt_or_foreign_files_give_no_name_and_no_panic() {
        let root = tree("bad");
        // No such container, no such data root.
        assert_eq!(docker_container_name(root.path(), ID), None);
        assert_eq!(docker_container_name(&root.path().join("nope"), ID), None);
        // Not an id: never turned into a path.
        for bad in [
            "../../etc",
            "",
            &ID[..12],
            &ID.to_uppercase(),
            "x".repeat(64).as_str(),
        ] {
            assert_eq!(docker_container_name(root.path(), bad), None, "{bad}");
        }
        let cases: Vec<(&str, String)> = vec![
            ("empty file", String::new()),
            ("truncated", config(ID, "/trainer")[..40].to_string()),
            ("not json", "\u{0}\u{1}garbage".to_string()),
            ("json array", "[1,2,3]".to_string()),
            ("no name", format!(r#"{{"ID":"{ID}"}}"#)),
            ("name not a string", format!(r#"{{"ID":"{ID}","Name":7}}"#)),
            ("empty name", config(ID, "/")),
            ("name with a slash", config(ID, "/a/b")),
            ("name with a space", config(ID, "/a b")),
            ("another container's file", config(OTHER, "/trainer")),
        ];
        for (what, text) in &cases {
            write_config(&root, ID, text);
            assert_eq!(docker_container_name(root.path(), ID), None, "{what}");
        }
        // A directory where the file should be, and an unreadable oversized file.
        let dir = config_path(root.path(), ID);
        fs::remove_file(&dir).unwrap();
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(docker_container_name(root.path(), ID), None);
        fs::remove_dir(&dir).unwrap();
        let f = fs::File::create(&dir).unwrap();
        f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        assert_eq!(docker_container_name(root.path(), ID), None);
    }

    #[test]
    fn the_environment_the_engine_gave_the_container() {
        assert_eq!(
            env_from_config(config(ID, "/x").as_bytes(), ID),
            Ok(vec!["PATH=/bin".to_string()])
        );
        for (what, text) in [
            ("another container", config(OTHER, "/x")),
            ("no Config", format!(r#"{{"ID":"{ID}"}}"#)),
            ("no Env", format!(r#"{{"ID":"{ID}","Config":{{}}}}"#)),
            (
                "Env not a list",
                format!(r#"{{"ID":"{ID}","Config":{{"Env":"A=1"}}}}"#),
            ),
            ("garbage", "\u{0}{".to_string()),
        ] {
            assert!(env_from_config(text.as_bytes(), ID).is_err(), "{what}");
        }
    }

    #[test]
    fn a_file_without_an_id_is_trusted_for_its_directory() {
        let root = tree("noid");
        write_config(&root, ID, r#"{"Name":"/web"}"#);
        assert_eq!(docker_container_name(root.path(), ID), Some("web".into()));
    }

    #[test]
    fn the_cache_rereads_only_changed_files_and_forgets_gone_containers() {
        let root = tree("cache");
        write_config(&root, ID, &config(ID, "/trainer"));
        let mut names = DockerNames::new(root.path().to_path_buf());
        assert_eq!(names.name(ID).as_deref(), Some("trainer"));
        assert_eq!(names.name(ID).as_deref(), Some("trainer"));
        assert_eq!(names.reads(), 1, "unchanged file: one read");
        // `docker rename`: the engine replaces the file; the cache notices (new inode).
        write_config(&root, ID, &config(ID, "/trainer-renamed"));
        assert_eq!(names.name(ID).as_deref(), Some("trainer-renamed"));
        assert_eq!(names.reads(), 2);
        // Unknown containers are not read at all, and cost nothing but a stat.
        assert_eq!(names.name(OTHER), None);
        assert_eq!(names.name("not-an-id"), None);
        assert_eq!(names.reads(), 2);
        assert_eq!(names.len(), 2);
        // Container removed: no name, and the entry goes at the next sweeps.
        fs::remove_dir_all(root.path().join("containers").join(ID)).unwrap();
        assert_eq!(names.name(ID), None);
        names.sweep();
        assert_eq!(names.len(), 2, "both were looked up since the last sweep");
        names.sweep();
        assert!(names.is_empty(), "nothing looked up: all dropped");
        // A container that appears later is found.
        write_config(&root, OTHER, &config(OTHER, "/late"));
        assert_eq!(names.name(OTHER).as_deref(), Some("late"));
    }

    #[test]
    fn the_data_root_comes_from_daemon_json_when_it_sets_one() {
        let dir = tree("daemon-json");
        let f = dir.path().join("daemon.json");
        assert_eq!(data_root_from(&f), PathBuf::from(DEFAULT_DATA_ROOT));
        fs::write(
            &f,
            r#"{"data-root":"/srv/docker","log-driver":"json-file"}"#,
        )
        .unwrap();
        assert_eq!(data_root_from(&f), PathBuf::from("/srv/docker"));
        fs::write(&f, r#"{"graph":"/data/docker"}"#).unwrap();
        assert_eq!(data_root_from(&f), PathBuf::from("/data/docker"));
        for bad in [
            r#"{"data-root":"relative"}"#,
            "{not json",
            r#"{"data-root":5}"#,
        ] {
            fs::write(&f, bad).unwrap();
            assert_eq!(
                data_root_from(&f),
                PathBuf::from(DEFAULT_DATA_ROOT),
                "{bad}"
            );
        }
    }
}
