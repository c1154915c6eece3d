//! `[kubernetes]`, the API server's keys (`api`, `events`, `node_name`, `service_account_dir`,
//! `api_server`): checked here and turned into a [`KubernetesPatch`]. (The kubelet's keys are
//! checked beside them by their own module.)

use super::{KubernetesPatch, spec::KubernetesSpec, validate::Cx};

/// The API server's keys of one `[kubernetes]` table, each checked; errors go to `cx`.
pub(super) fn patch(cx: &mut Cx, k: &KubernetesSpec) -> KubernetesPatch {
    let node_name = k.node_name.as_ref().and_then(|n| {
        let s = n.get_ref();
        match node_name_problem(s) {
            None => Some(s.clone()),
            Some(why) => {
                cx.err(
                    &n.span(),
                    format!(
                        "`node_name = \"{s}\"`: {why}; write the node's name as `kubectl get nodes` shows it, or leave it out to use NODE_NAME"
                    ),
                );
                None
            }
        }
    });
    let service_account_dir = k.service_account_dir.as_ref().and_then(|d| {
        let s = d.get_ref();
        if s.starts_with('/') {
            Some(std::path::PathBuf::from(s))
        } else {
            cx.err(
                &d.span(),
                format!(
                    "`service_account_dir = \"{s}\"` is not an absolute path: write e.g. \"{}\"",
                    crate::quota::SERVICE_ACCOUNT_DIR
                ),
            );
            None
        }
    });
    let api_server = k.api_server.as_ref().and_then(|u| {
        let s = u.get_ref();
        match api_server_problem(s) {
            None => Some(s.trim_end_matches('/').to_string()),
            Some(why) => {
                cx.err(
                    &u.span(),
                    format!(
                        "`api_server = \"{s}\"`: {why}; write e.g. \"https://10.96.0.1:443\", or leave it out to use KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT"
                    ),
                );
                None
            }
        }
    });
    KubernetesPatch {
        api: k.api.as_ref().map(|b| *b.get_ref()),
        events: k.events.as_ref().map(|b| *b.get_ref()),
        node_name,
        service_account_dir,
        api_server,
    }
}

/// Why `s` cannot be a node's name (a DNS subdomain: at most 253 characters, lower-case letters,
/// digits, `-` and `.`, starting and ending with a letter or digit), or `None`.
fn node_name_problem(s: &str) -> Option<&'static str> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if s.is_empty() {
        Some("it is empty")
    } else if s.len() > 253 {
        Some("it is longer than 253 characters")
    } else if !s.chars().all(|c| alnum(c) || c == '-' || c == '.') {
        Some("a node name has only lower-case letters, digits, `-` and `.`")
    } else if !s.starts_with(alnum) || !s.ends_with(alnum) {
        Some("a node name starts and ends with a letter or a digit")
    } else {
        None
    }
}

/// Why `s` cannot be the API server's URL (`https://host[:port]`), or `None`.
fn api_server_problem(s: &str) -> Option<&'static str> {
    let Some(rest) = s.strip_prefix("https://") else {
        return Some("the API server is reached over TLS: the URL starts with https://");
    };
    match s.parse::<hyper::Uri>() {
        Ok(u) if u.host().is_some_and(|h| !h.is_empty()) && !rest.starts_with('/') => None,
        _ => Some("not a URL with a host"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::quota::{KubernetesSettings, QuotaSet, SERVICE_ACCOUNT_DIR};

    fn settings(text: &str) -> KubernetesSettings {
        QuotaSet::parse(text, "q.toml")
            .unwrap()
            .defaults()
            .kubernetes
            .clone()
    }

    fn error(text: &str) -> String {
        match QuotaSet::parse(text, "q.toml") {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e[0].to_string(),
        }
    }

    #[test]
    fn the_api_server_keys_are_read_with_their_defaults() {
        let off = settings("");
        assert_eq!(off, KubernetesSettings::default());
        assert!(!off.api && !off.events && !off.uses_api_server());
        assert_eq!(off.service_account_dir, PathBuf::from(SERVICE_ACCOUNT_DIR));
        let on = settings(
            "[kubernetes]\napi = true\nevents = true\nnode_name = \"gpu-node-1.example\"\n\
             service_account_dir = \"/tmp/sa\"\napi_server = \"https://127.0.0.1:6443/\"\n",
        );
        assert_eq!(
            on,
            KubernetesSettings {
                api: true,
                events: true,
                node_name: Some("gpu-node-1.example".into()),
                service_account_dir: "/tmp/sa".into(),
                api_server: Some("https://127.0.0.1:6443".into()),
            }
        );
        assert!(settings("[kubernetes]\nevents = true\n").uses_api_server());
        assert!(settings("[kubernetes]\napi = true\n").uses_api_server());
    }

    #[test]
    fn bad_api_server_keys_say_where_and_how_to_fix() {
        let e = error("[kubernetes]\napi = true\nnode_name = \"Node_1\"\n");
        assert!(e.starts_with("q.toml:3:13"), "{e}");
        assert!(e.contains("lower-case"), "{e}");
        for bad in ["", "-a", "a-", &"a".repeat(254)] {
            let e = error(&format!("[kubernetes]\nnode_name = \"{bad}\"\n"));
            assert!(e.contains("node_name"), "{bad}: {e}");
        }
        let e = error("[kubernetes]\napi_server = \"http://10.0.0.1\"\n");
        assert!(e.contains("https://"), "{e}");
        for bad in ["https://", "https://:443", "https:///api"] {
            let e = error(&format!("[kubernetes]\napi_server = \"{bad}\"\n"));
            assert!(e.contains("not a URL with a host"), "{bad}: {e}");
        }
        let e = error("[kubernetes]\nservice_account_dir = \"sa\"\n");
        assert!(e.contains("not an absolute path"), "{e}");
        let e = error("[kubernetes]\napi = \"yes\"\n");
        assert!(e.starts_with("q.toml:2:7") && e.contains("boolean"), "{e}");
        let e = error("[kubernetes]\nevnets = true\n");
        assert!(e.contains("did you mean `events`"), "{e}");
    }

    #[test]
    fn kubernetes_is_a_main_file_table() {
        let main = crate::quota::parse_str("", "main.toml").unwrap();
        let dropin = crate::quota::parse_str("[kubernetes]\napi = true\n", "d.toml").unwrap();
        let e = QuotaSet::build(main, vec![dropin]).unwrap_err();
        assert!(
            e[0].message.contains("only allowed in the main file"),
            "{e:?}"
        );
    }

    #[test]
    fn a_node_name_of_253_characters_is_a_name() {
        let name = format!("a{}", ".b".repeat(126));
        assert_eq!(name.len(), 253);
        let s = settings(&format!("[kubernetes]\nnode_name = \"{name}\"\n"));
        assert_eq!(s.node_name, Some(name));
    }
}
