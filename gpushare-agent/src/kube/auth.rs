//! The service account's bearer token, read from its file as client-go reads it: trimmed of
//! surrounding whitespace (a file ending in a newline works), and re-read when the file changes
//! (projected tokens are rotated hourly, by an atomic rename), so every request carries the
//! token on disk now. kube 5's own `token_file` sends the file's bytes untrimmed (a trailing
//! newline fails every request with "invalid bearer token") and re-reads it only once a minute.
//!
//! A file that cannot be read (or holds no token) keeps the last good token, said once per
//! cause; requests without any token are sent as they are and answered 401 by the server.

use std::{
    os::unix::fs::MetadataExt,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::SystemTime,
};

use hyper::{
    Request,
    header::{AUTHORIZATION, HeaderValue},
};
use log::{info, warn};

/// What identifies one version of the file: (modified, inode, length).
type Version = (Option<SystemTime>, u64, u64);

#[derive(Default)]
struct Cached {
    version: Option<Version>,
    header: Option<HeaderValue>,
    said: String,
}

/// The token file and its last good header.
pub struct TokenFile {
    path: PathBuf,
    cached: Mutex<Cached>,
}

impl TokenFile {
    /// The token of `path` (read on first use).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            cached: Mutex::default(),
        }
    }

    /// The `Authorization` header for the token on disk now (re-read only when the file changed).
    pub fn header(&self) -> Option<HeaderValue> {
        let mut c = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        let read = std::fs::metadata(&self.path).and_then(|m| {
            let v: Version = (m.modified().ok(), m.ino(), m.len());
            if c.version == Some(v) {
                return Ok(None);
            }
            std::fs::read_to_string(&self.path).map(|t| Some((v, t)))
        });
        let problem = match read {
            Ok(None) => return c.header.clone(),
            Ok(Some((v, text))) => {
                let token = text.trim();
                let header = HeaderValue::from_str(&format!("Bearer {token}")).ok();
                match header.filter(|_| !token.is_empty()) {
                    Some(mut h) => {
                        h.set_sensitive(true);
                        if c.header.is_some() {
                            info!("{}: the rotated token is used", self.path.display());
                        }
                        c.version = Some(v);
                        c.header = Some(h);
                        c.said.clear();
                        return c.header.clone();
                    }
                    None => "holds no usable token (empty, or bytes a header cannot carry)".into(),
                }
            }
            Err(e) => e.to_string(),
        };
        if c.said != problem {
            warn!(
                "{}: {problem}; the last good token is kept",
                self.path.display()
            );
            c.said = problem;
        }
        c.header.clone()
    }
}

/// A layer that sets each request's `Authorization` from a [`TokenFile`].
#[derive(Clone)]
pub struct TokenLayer(pub Arc<TokenFile>);

impl<S> tower::Layer<S> for TokenLayer {
    type Service = WithToken<S>;

    fn layer(&self, inner: S) -> WithToken<S> {
        WithToken {
            inner,
            file: self.0.clone(),
        }
    }
}

/// The service of [`TokenLayer`].
#[derive(Clone)]
pub struct WithToken<S> {
    inner: S,
    file: Arc<TokenFile>,
}

impl<S, B> tower::Service<Request<B>> for WithToken<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(h) = self.file.header() {
            req.headers_mut().insert(AUTHORIZATION, h);
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_trimmed_re_read_when_rotated_and_kept_when_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let f = TokenFile::new(&path);
        assert_eq!(f.header(), None, "no file, no token yet");
        std::fs::write(&path, "abc\n").unwrap();
        assert_eq!(f.header().unwrap(), "Bearer abc");
        let tmp = dir.path().join("t");
        std::fs::write(&tmp, " rotated\r\n").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert_eq!(f.header().unwrap(), "Bearer rotated");
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(
            f.header().unwrap(),
            "Bearer rotated",
            "empty: the last good kept"
        );
        std::fs::write(&path, "bad\x01token").unwrap();
        assert_eq!(f.header().unwrap(), "Bearer rotated", "unsendable: kept");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(f.header().unwrap(), "Bearer rotated", "gone: kept");
    }
}
