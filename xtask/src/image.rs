//! `cargo xtask image`: the agent's container image, built here without pulling a base image.
//!
//! One layer holds the release binary at [`AGENT_PATH`] and the runtime files it, and the NVIDIA
//! libraries the NVIDIA container runtime mounts in beside it, need, copied from this (Debian)
//! host like a distroless image: the dynamic loader and the glibc runtime set ([`RUNTIME_LIBS`]:
//! `libc`, `libdl`, `libpthread`, `librt`, `libm`, `libstdc++`, `libgcc_s`) with their
//! copyright files, `/etc/passwd` and `/etc/group` (root, and `nonroot` 65532 for the subcommands
//! that need no privilege), `/etc/nsswitch.conf`, `/tmp`, the agent's own directories. No shell,
//! no package manager, no CA certificates (the agent makes no TLS connection).
//!
//! The image runs as root: the DaemonSet needs it (privileged, `runAsUser: 0`). Its cgroup writes
//! go to root-owned files of the host's hierarchy, it reads other users' `/proc/<pid>/environ` and
//! `fd/`, and loads eBPF; a non-root user would need those capabilities as ambient capabilities,
//! which Kubernetes cannot grant (only root's effective set gets `capabilities.add`).
//!
//! The archive `target/image/gpushare-agent-<version>.tar` is at once an OCI image layout
//! (`oci-layout`, `index.json`, `blobs/sha256/…`) and a Docker archive (`manifest.json` naming the
//! same config and layer blobs), so `docker load` (Debian's Docker 20.10 too), `skopeo copy
//! oci-archive:` / `docker-archive:` and `ctr images import` all take it. It is reproducible: the
//! layer is written with sorted entries, uid/gid 0, no extended attributes, normalised modes and
//! one mtime (`SOURCE_DATE_EPOCH`, else the commit's time), and the JSON documents are serialised
//! in a fixed order, so one commit gives one digest.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::json;
use sha2::{Digest, Sha256};

/// The image's repository name as the archive tags it (`<NAME>:<version>`); the DaemonSet refers
/// to it by this name and kustomize maps it to the operator's registry (`images:` in
/// deploy/kubernetes/kustomization.yaml, checked by deploy/validate.sh).
pub const NAME: &str = "gpushare-agent";
/// Where the agent is in the image (its entrypoint).
pub const AGENT_PATH: &str = "/usr/local/bin/gpushare-agent";
/// The glibc runtime set, by soname: what NVIDIA's libraries (mounted in by the NVIDIA container
/// runtime) load, beyond what the agent links itself (added from `ldd`).
pub const RUNTIME_LIBS: [&str; 7] = [
    "libc.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libm.so.6",
    "libstdc++.so.6",
    "libgcc_s.so.1",
];
/// Debian packages whose copyright files go with the libraries.
const LICENSE_PACKAGES: [&str; 3] = ["libc6", "libgcc-s1", "libstdc++6"];
/// The unprivileged user (distroless's number).
pub const NONROOT_UID: u32 = 65532;

/// What an image is built from.
pub struct Inputs {
    /// The agent binary.
    pub agent: PathBuf,
    /// `org.opencontainers.image.version` and the tag.
    pub version: String,
    /// `org.opencontainers.image.revision` (the commit).
    pub revision: String,
    /// Every timestamp in the image (seconds since the epoch).
    pub epoch: u64,
    /// Root of the host filesystem the runtime files are taken from (`/`; a test may point
    /// elsewhere).
    pub host_root: PathBuf,
}

/// What was built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The archive.
    pub archive: PathBuf,
    /// `sha256:<hex>` of the image manifest (the digest a registry reports).
    pub manifest_digest: String,
    /// `sha256:<hex>` of the config (Docker's image id).
    pub config_digest: String,
    /// `<NAME>:<version>`.
    pub reference: String,
    /// Bytes of the archive.
    pub size: u64,
}

impl Inputs {
    /// The inputs of the workspace at `root`: its release agent, version, revision and epoch, and
    /// this host's runtime files.
    fn of(root: &Path) -> Result<Self> {
        Ok(Self {
            agent: root.join("target/release/gpushare-agent"),
            version: env!("CARGO_PKG_VERSION").to_string(),
            revision: revision(root),
            epoch: epoch(root)?,
            host_root: PathBuf::from("/"),
        })
    }
}

/// `cargo xtask image`: the release build, then the archive in target/image/.
pub fn build(root: &Path) -> Result<Built> {
    let started = std::time::Instant::now();
    super::build_release(root)?;
    let inputs = Inputs::of(root)?;
    let out = root.join(format!("target/image/{NAME}-{}.tar", inputs.version));
    let built = write_archive(&inputs, &out)?;
    eprintln!(
        "xtask: image {} ({} MiB, revision {}) in {}\nxtask:   manifest {}\nxtask:   image id {}\nxtask:   built in {:.1} s (release build included)",
        built.reference,
        built.size.div_ceil(1 << 20),
        inputs.revision,
        built.archive.display(),
        built.manifest_digest,
        built.config_digest,
        started.elapsed().as_secs_f64()
    );
    Ok(built)
}

/// Builds the archive twice from the same inputs (the second beside the first) and fails unless
/// both have the same bytes: the reproducibility check of `cargo xtask test`.
pub fn build_checked(root: &Path) -> Result<Built> {
    let built = build(root)?;
    let inputs = Inputs::of(root)?;
    let again = built.archive.with_extension("again.tar");
    let second = write_archive(&inputs, &again)?;
    let same = fs::read(&built.archive)? == fs::read(&again)?;
    let _ = fs::remove_file(&again);
    if !same || second.manifest_digest != built.manifest_digest {
        bail!(
            "the image is not reproducible: {} then {}",
            built.manifest_digest,
            second.manifest_digest
        );
    }
    eprintln!("xtask: built twice: one digest {}", built.manifest_digest);
    Ok(built)
}

/// The commit (`git rev-parse HEAD`, `-dirty` when tracked files differ from it), or `unknown`
/// outside a git checkout.
pub fn revision(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{head}-dirty") } else { head }
        }
        None => "unknown".into(),
    }
}

/// `SOURCE_DATE_EPOCH`, else the commit's time, else 0.
pub fn epoch(root: &Path) -> Result<u64> {
    if let Ok(v) = std::env::var("SOURCE_DATE_EPOCH") {
        return v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds"));
    }
    let out = Command::new("git")
        .current_dir(root)
        .args(["log", "-1", "--format=%ct", "HEAD"])
        .output();
    Ok(out
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0))
}

/// One entry of the layer.
enum Entry {
    Dir(u32),
    File(u32, Vec<u8>),
    Link(String),
}

/// The layer's entries by path (no leading `/`), sorted.
#[derive(Default)]
struct Tree(BTreeMap<String, Entry>);

impl Tree {
    fn dir(&mut self, path: &str, mode: u32) {
        self.parents(path);
        self.0
            .insert(path.trim_matches('/').to_string(), Entry::Dir(mode));
    }

    fn file(&mut self, path: &str, mode: u32, data: Vec<u8>) {
        self.parents(path);
        self.0
            .insert(path.trim_matches('/').to_string(), Entry::File(mode, data));
    }

    fn link(&mut self, path: &str, target: &str) {
        self.parents(path);
        self.0.insert(
            path.trim_matches('/').to_string(),
            Entry::Link(target.into()),
        );
    }

    /// Every missing ancestor of `path` as a 0755 directory.
    fn parents(&mut self, path: &str) {
        let path = path.trim_matches('/');
        let mut at = 0;
        while let Some(i) = path[at..].find('/') {
            let parent = &path[..at + i];
            self.0
                .entry(parent.to_string())
                .or_insert(Entry::Dir(0o755));
            at += i + 1;
        }
    }

    /// The layer as a tar stream: sorted, uid/gid 0, no names, one mtime, no extended attributes.
    fn tar(&self, mtime: u64) -> Result<Vec<u8>> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, entry) in &self.0 {
            let mut h = tar::Header::new_ustar();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(mtime);
            match entry {
                Entry::Dir(mode) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_size(0);
                    b.append_data(&mut h, format!("{path}/"), std::io::empty())?;
                }
                Entry::File(mode, data) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, path, data.as_slice())?;
                }
                Entry::Link(target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    b.append_link(&mut h, path, target)?;
                }
            }
        }
        Ok(b.into_inner()?)
    }
}

/// `(multiarch triple, OCI architecture, dynamic loader's soname, directory it is looked up in)`.
fn arch() -> Result<(&'static str, &'static str, &'static str, &'static str)> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(("x86_64-linux-gnu", "amd64", "ld-linux-x86-64.so.2", "lib64")),
        "aarch64" => Ok(("aarch64-linux-gnu", "arm64", "ld-linux-aarch64.so.1", "lib")),
        other => bail!("no image layout for {other}"),
    }
}

/// The shared libraries `ldd` lists for `bin` (absolute paths as the host resolves them).
fn ldd(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .context("running ldd (Debian: libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "ldd {}: {}{}",
            bin.display(),
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.contains("not found") {
            bail!("ldd {}: {line}", bin.display());
        }
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// Adds the library `soname` found in `host_lib` (the host's multiarch directory): its real file
/// under its real name in /usr/lib/<triple>/, and the soname as a link to it.
fn add_lib(tree: &mut Tree, host_root: &Path, triple: &str, soname: &str) -> Result<()> {
    let host = host_root.join("usr/lib").join(triple).join(soname);
    let real = fs::canonicalize(&host)
        .with_context(|| format!("{} (the glibc runtime set)", host.display()))?;
    let real_name = real
        .file_name()
        .and_then(|n| n.to_str())
        .context("a library name that is not UTF-8")?
        .to_string();
    let data = fs::read(&real).with_context(|| format!("reading {}", real.display()))?;
    tree.file(&format!("usr/lib/{triple}/{real_name}"), 0o755, data);
    if real_name != soname {
        tree.link(&format!("usr/lib/{triple}/{soname}"), &real_name);
    }
    Ok(())
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// Writes the archive for `inputs` to `out` (replaced atomically).
pub fn write_archive(inputs: &Inputs, out: &Path) -> Result<Built> {
    let (triple, oci_arch, loader, loader_dir) = arch()?;
    let mut tree = Tree::default();

    // The base: the usual directories, merged /usr (as Debian), no shell.
    for (d, mode) in [
        ("etc", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("root", 0o700),
        ("tmp", 0o1777),
        ("var/tmp", 0o1777),
        ("home/nonroot", 0o700),
        ("usr/local/bin", 0o755),
        ("usr/share/doc", 0o755),
        // The agent's directories (the DaemonSet mounts over them; empty here).
        ("etc/gpushare", 0o755),
        ("var/lib/gpushare", 0o700),
        ("run/gpushare", 0o755),
    ] {
        tree.dir(d, mode);
    }
    tree.dir(&format!("usr/lib/{triple}"), 0o755);
    tree.link("lib", "usr/lib");
    if loader_dir == "lib64" {
        tree.dir("usr/lib64", 0o755);
        tree.link("lib64", "usr/lib64");
    }
    tree.file(
        "etc/passwd",
        0o644,
        format!(
            "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT_UID}:{NONROOT_UID}:nonroot:/home/nonroot:/sbin/nologin\n"
        )
        .into_bytes(),
    );
    tree.file(
        "etc/group",
        0o644,
        format!("root:x:0:\nnonroot:x:{NONROOT_UID}:\n").into_bytes(),
    );
    tree.file(
        "etc/nsswitch.conf",
        0o644,
        b"passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n".to_vec(),
    );

    // The dynamic loader, at the path every binary names, and the glibc runtime set.
    add_lib(&mut tree, &inputs.host_root, triple, loader)?;
    let loader_link = if loader_dir == "lib64" {
        format!("usr/lib64/{loader}")
    } else {
        String::new()
    };
    if !loader_link.is_empty() {
        tree.link(&loader_link, &format!("../lib/{triple}/{loader}"));
    }
    let mut sonames: Vec<String> = RUNTIME_LIBS.iter().map(|s| s.to_string()).collect();
    // And whatever the agent links beyond them.
    if inputs.host_root == Path::new("/") {
        for lib in ldd(&inputs.agent)? {
            let name = lib
                .file_name()
                .and_then(|n| n.to_str())
                .context("a library name that is not UTF-8")?;
            if name != loader
                && !name.starts_with("linux-vdso")
                && !sonames.iter().any(|s| s == name)
            {
                sonames.push(name.to_string());
            }
        }
    }
    for soname in &sonames {
        add_lib(&mut tree, &inputs.host_root, triple, soname)?;
    }
    for pkg in LICENSE_PACKAGES {
        let f = inputs
            .host_root
            .join(format!("usr/share/doc/{pkg}/copyright"));
        if let Ok(data) = fs::read(&f) {
            tree.file(&format!("usr/share/doc/{pkg}/copyright"), 0o644, data);
        }
    }

    // The agent.
    let agent = fs::read(&inputs.agent).with_context(|| {
        format!(
            "reading {} (build it: cargo build --release -p gpushare-agent)",
            inputs.agent.display()
        )
    })?;
    tree.file(AGENT_PATH, 0o755, agent);

    let layer = tree.tar(inputs.epoch)?;
    let layer_digest = sha256(&layer);

    let created = jiff::Timestamp::from_second(
        i64::try_from(inputs.epoch).context("an epoch past 2^63 seconds")?,
    )
    .context("an epoch jiff cannot represent")?
    .to_string();
    let reference = format!("{NAME}:{}", inputs.version);
    let labels = json!({
        "org.opencontainers.image.title": NAME,
        "org.opencontainers.image.description": "gpushare node agent: attributes GPU processes to containers and enforces GPU-memory quotas",
        "org.opencontainers.image.version": inputs.version,
        "org.opencontainers.image.revision": inputs.revision,
        "org.opencontainers.image.source": env!("CARGO_PKG_REPOSITORY"),
        "org.opencontainers.image.licenses": env!("CARGO_PKG_LICENSE"),
        "org.opencontainers.image.created": created,
    });
    let config = json!({
        "created": created,
        "architecture": oci_arch,
        "os": "linux",
        "config": {
            "User": "0:0",
            "Env": ["PATH=/usr/local/bin:/usr/bin"],
            "Entrypoint": [AGENT_PATH],
            "WorkingDir": "/",
            "ExposedPorts": { "9402/tcp": {} },
            "Labels": labels,
        },
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        "history": [{ "created": created, "created_by": "cargo xtask image" }],
    });
    let config = serde_json::to_vec(&config)?;
    let config_digest = sha256(&config);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer.len(),
        }],
        "annotations": labels,
    });
    let manifest = serde_json::to_vec(&manifest)?;
    let manifest_digest = sha256(&manifest);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": {
                // containerd's and skopeo's names for it.
                "io.containerd.image.name": format!("docker.io/library/{reference}"),
                "org.opencontainers.image.ref.name": inputs.version,
            },
        }],
    });
    let blob = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
    let docker_manifest = json!([{
        "Config": blob(&config_digest),
        "RepoTags": [reference],
        "Layers": [blob(&layer_digest)],
    }]);

    let mut outer = Tree::default();
    outer.file(
        "oci-layout",
        0o644,
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
    );
    outer.file("index.json", 0o644, serde_json::to_vec(&index)?);
    outer.file(
        "manifest.json",
        0o644,
        serde_json::to_vec(&docker_manifest)?,
    );
    outer.file(&blob(&config_digest), 0o644, config);
    outer.file(&blob(&manifest_digest), 0o644, manifest);
    outer.file(&blob(&layer_digest), 0o644, layer);
    let archive = outer.tar(inputs.epoch)?;

    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = out.with_extension("tar.partial");
    fs::write(&tmp, &archive).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, out)?;
    Ok(Built {
        archive: out.to_path_buf(),
        manifest_digest,
        config_digest,
        reference,
        size: archive.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        io::Read,
        time::{Duration, SystemTime},
    };

    use super::*;

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let d = std::env::temp_dir().join(format!(
                "gpushare-xtask-image-{name}-{}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(&d).unwrap();
            Self(d)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A dynamically linked host program standing in for the agent, copied with mtime `mtime`.
    fn fake_agent(dir: &Path, mtime: SystemTime) -> PathBuf {
        let p = dir.join("gpushare-agent");
        fs::copy("/usr/bin/true", &p).unwrap();
        fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        p
    }

    fn inputs(agent: PathBuf, epoch: u64) -> Inputs {
        Inputs {
            agent,
            version: "9.8.7".into(),
            revision: "0123456789abcdef0123456789abcdef01234567".into(),
            epoch,
            host_root: "/".into(),
        }
    }

    /// The entries of a tar stream: path -> (header, contents).
    fn entries(bytes: &[u8]) -> BTreeMap<String, (tar::Header, Vec<u8>)> {
        let mut out = BTreeMap::new();
        let mut order = Vec::new();
        let mut ar = tar::Archive::new(bytes);
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().to_string();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            order.push(path.clone());
            out.insert(path, (e.header().clone(), data));
        }
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "entries are sorted");
        out
    }

    fn blob<'a>(outer: &'a BTreeMap<String, (tar::Header, Vec<u8>)>, digest: &str) -> &'a Vec<u8> {
        let (_, data) = outer
            .get(&format!(
                "blobs/sha256/{}",
                digest.trim_start_matches("sha256:")
            ))
            .unwrap_or_else(|| panic!("no blob {digest}"));
        assert_eq!(sha256(data), digest, "blob content matches its name");
        data
    }

    #[test]
    fn one_set_of_inputs_gives_one_archive_whatever_the_files_mtimes_and_another_epoch_another() {
        let s = Scratch::new("repro");
        let (a, b) = (s.0.join("a"), s.0.join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        let agent_a = fake_agent(&a, SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000));
        let agent_b = fake_agent(&b, SystemTime::now());
        let one = write_archive(&inputs(agent_a.clone(), 1_700_000_000), &a.join("i.tar")).unwrap();
        let two = write_archive(&inputs(agent_b, 1_700_000_000), &b.join("i.tar")).unwrap();
        assert_eq!(one.manifest_digest, two.manifest_digest);
        assert_eq!(one.config_digest, two.config_digest);
        assert!(
            fs::read(&one.archive).unwrap() == fs::read(&two.archive).unwrap(),
            "the same bytes"
        );
        let later = write_archive(&inputs(agent_a, 1_700_000_001), &a.join("j.tar")).unwrap();
        assert_ne!(later.manifest_digest, one.manifest_digest);
    }

    #[test]
    fn the_archive_is_an_oci_layout_and_a_docker_archive_of_one_layer_with_the_runtime_set() {
        let s = Scratch::new("layout");
        let epoch = 1_700_000_000;
        let built = write_archive(
            &inputs(fake_agent(&s.0, SystemTime::now()), epoch),
            &s.0.join("i.tar"),
        )
        .unwrap();
        assert_eq!(built.reference, "gpushare-agent:9.8.7");
        let outer = entries(&fs::read(&built.archive).unwrap());
        let json = |name: &str| -> serde_json::Value {
            serde_json::from_slice(&outer.get(name).unwrap_or_else(|| panic!("no {name}")).1)
                .unwrap()
        };
        assert_eq!(json("oci-layout")["imageLayoutVersion"], "1.0.0");

        // OCI: index -> manifest -> config, layer.
        let index = json("index.json");
        let m = &index["manifests"][0];
        assert_eq!(m["digest"], built.manifest_digest.as_str());
        let manifest: serde_json::Value =
            serde_json::from_slice(blob(&outer, &built.manifest_digest)).unwrap();
        assert_eq!(manifest["config"]["digest"], built.config_digest.as_str());
        let layer_digest = manifest["layers"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string();
        let config: serde_json::Value =
            serde_json::from_slice(blob(&outer, &built.config_digest)).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest.as_str());
        assert_eq!(config["config"]["User"], "0:0");
        assert_eq!(config["config"]["Entrypoint"][0], AGENT_PATH);
        let labels = &config["config"]["Labels"];
        for (k, v) in [
            ("version", "9.8.7"),
            ("revision", "0123456789abcdef0123456789abcdef01234567"),
            ("source", env!("CARGO_PKG_REPOSITORY")),
            ("licenses", "MIT OR Apache-2.0"),
            ("title", "gpushare-agent"),
        ] {
            assert_eq!(labels[format!("org.opencontainers.image.{k}")], v, "{k}");
        }

        // Docker: manifest.json names the same blobs and the tag.
        let docker = json("manifest.json");
        assert_eq!(docker[0]["RepoTags"][0], "gpushare-agent:9.8.7");
        assert_eq!(
            docker[0]["Config"],
            format!(
                "blobs/sha256/{}",
                built.config_digest.trim_start_matches("sha256:")
            )
        );
        assert_eq!(
            docker[0]["Layers"][0],
            format!(
                "blobs/sha256/{}",
                layer_digest.trim_start_matches("sha256:")
            )
        );

        // The layer: uid/gid 0, one mtime, the agent, the loader and the whole runtime set.
        let layer = entries(blob(&outer, &layer_digest));
        for (path, (h, _)) in &layer {
            assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0), "{path}");
            assert_eq!(h.mtime().unwrap(), epoch, "{path}");
        }
        let (triple, _, loader, _) = arch().unwrap();
        let present = |p: &str| layer.contains_key(p) || layer.contains_key(&format!("{p}/"));
        assert!(present("usr/local/bin/gpushare-agent"));
        assert!(present(&format!("usr/lib/{triple}/{loader}")));
        for so in RUNTIME_LIBS {
            assert!(present(&format!("usr/lib/{triple}/{so}")), "{so}");
        }
        assert!(present("lib"));
        let passwd = String::from_utf8(layer["etc/passwd"].1.clone()).unwrap();
        assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
        assert_eq!(layer["tmp/"].0.mode().unwrap(), 0o1777);
    }
}
