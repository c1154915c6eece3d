//! The agent's HTTP endpoints. TCP (default 127.0.0.1:9402) serves `/metrics` and `/healthz` only:
//! any local user reaches loopback, and any pod reaches a node's address, so nothing per workload
//! beyond the metrics a scrape needs is served there (per-process series only when the operator
//! turns them on). Per-workload and per-process detail (`/api/v1/state`, what `status` shows) and
//! the write endpoint (`release`) are served on the local Unix socket only, created owned by root
//! with mode 0600.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, Result};
use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use log::{info, warn};
use tokio::sync::{mpsc, oneshot};

use crate::{
    metrics::Metrics,
    snapshot::{SharedSnapshot, latest},
};

/// Default TCP address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9402";
/// Default local socket.
pub const DEFAULT_SOCKET: &str = "/run/gpushare/agent.sock";

/// An operator's request to release a workload, answered by the agent loop.
pub struct ReleaseRequest {
    /// The workload key (or a unique prefix / short name).
    pub workload: String,
    /// Where the answer goes: a message, or an error.
    pub reply: oneshot::Sender<Result<String, String>>,
}

#[derive(Clone)]
struct Ctx {
    snapshot: SharedSnapshot,
    metrics: Arc<Metrics>,
    release: Option<mpsc::Sender<ReleaseRequest>>,
}

/// What every listener serves: what a scrape and a probe need.
fn public_routes() -> Router<Ctx> {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
}

/// Serves `/metrics` and `/healthz` on `addr`.
pub async fn serve_tcp(
    addr: SocketAddr,
    snapshot: SharedSnapshot,
    metrics: Arc<Metrics>,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("listening on {addr} (is another agent running? use --listen to change)")
    })?;
    info!(
        "serving /metrics and /healthz on http://{addr} (the state and release on the local \
         socket only)"
    );
    let app = public_routes().with_state(Ctx {
        snapshot,
        metrics,
        release: None,
    });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!("HTTP server on {addr} stopped: {e}");
        }
    });
    Ok(())
}

/// Serves every endpoint, `/api/v1/state` and `release` included, on a root-only Unix socket at
/// `path`.
pub async fn serve_unix(
    path: &Path,
    snapshot: SharedSnapshot,
    metrics: Arc<Metrics>,
    release: mpsc::Sender<ReleaseRequest>,
) -> Result<PathBuf> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // A stale socket of a dead agent is replaced; a live agent's is not (bind would race it).
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("{} is in use: another agent is running", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::from_std(bind_private(path)?)
        .with_context(|| format!("listening on {}", path.display()))?;
    let app = public_routes()
        .route("/api/v1/state", get(state))
        .route("/api/v1/release", post(release_handler))
        .with_state(Ctx {
            snapshot,
            metrics,
            release: Some(release),
        });
    let shown = path.to_path_buf();
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!("local API on {} stopped: {e}", shown.display());
        }
    });
    info!(
        "local API (/api/v1/state, release) on {} (root only)",
        path.display()
    );
    Ok(path.to_path_buf())
}

/// A listening Unix socket at `path` that is created owner-only (0600): the socket's mode is set
/// before `bind` (Linux creates the file with the unbound socket's mode, less the umask), so no
/// user can connect in the moment between `bind` and a `chmod`, whatever the umask (under umask
/// 000 a connection made then would have outlived the chmod).
fn bind_private(path: &Path) -> Result<std::os::unix::net::UnixListener> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let bytes = path.as_os_str().as_encoded_bytes();
    // SAFETY: a zeroed sockaddr_un is valid; the path is copied within its bounds (checked).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        anyhow::bail!("socket path {} is too long", path.display());
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket(2); the fd is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("creating a Unix socket");
    }
    // SAFETY: a new fd this function owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let check = |rc: libc::c_int, what: &str| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
                .with_context(|| format!("{what} {}", path.display()))
        }
    };
    // SAFETY: fchmod(2), bind(2) and listen(2) on the owned fd, with the address built above.
    check(
        unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) },
        "setting the mode of",
    )?;
    check(
        unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        },
        "binding",
    )?;
    check(unsafe { libc::listen(fd.as_raw_fd(), 128) }, "listening on")?;
    Ok(std::os::unix::net::UnixListener::from(fd))
}

async fn metrics(State(ctx): State<Ctx>, headers: HeaderMap) -> Response {
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            ctx.metrics.render_openmetrics(),
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            ctx.metrics.render_prometheus(),
        )
            .into_response()
    }
}

async fn healthz(State(ctx): State<Ctx>) -> Response {
    let snap = latest(&ctx.snapshot);
    let h = &snap.health;
    let body = serde_json::json!({
        "ready": h.ready,
        "attribution": h.attribution,
        "nvml": h.nvml,
        "degraded": h.degraded,
        "dry_run": h.dry_run,
    });
    let code = if h.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

async fn state(State(ctx): State<Ctx>) -> Response {
    let snap = latest(&ctx.snapshot);
    Json(snap.as_ref().clone()).into_response()
}

#[derive(serde::Deserialize)]
struct ReleaseBody {
    workload: String,
}

async fn release_handler(State(ctx): State<Ctx>, Json(body): Json<ReleaseBody>) -> Response {
    let Some(tx) = ctx.release else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let (reply, rx) = oneshot::channel();
    if tx
        .send(ReleaseRequest {
            workload: body.workload,
            reply,
        })
        .await
        .is_err()
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "agent is shutting down\n").into_response();
    }
    match rx.await {
        Ok(Ok(msg)) => (StatusCode::OK, format!("{msg}\n")).into_response(),
        Ok(Err(msg)) => (StatusCode::NOT_FOUND, format!("{msg}\n")).into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "agent did not answer\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41: the local API's socket is owner-only from the moment it exists (its mode was
    /// set after `bind`: under umask 000 any user could connect in between, and stay connected).
    #[test]
    fn the_socket_is_created_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = bind_private(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "created {mode:o}");
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        drop(listener);
        let long = dir.path().join("x".repeat(200));
        let err = bind_private(&long).unwrap_err().to_string();
        assert!(err.contains("too long"), "{err}");
    }
}
