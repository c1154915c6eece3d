//! The HTTP/1.1 client for the agent's own endpoints (`status`, `release`, the tests, the benches
//! and xtask's demo), over TCP or the local Unix socket, on the hyper that axum already links.
//!
//! One request per connection, blocking for the caller: each call runs on a small current-thread
//! runtime of its own and gives up after [`TIMEOUT`]. No TLS, no redirects: the server is the agent
//! on this node. In `gpushare-base`, so xtask (which must build before the agent can) uses it
//! too.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::{
    Request,
    body::Bytes,
    header::{CONNECTION, CONTENT_TYPE, HOST},
};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpStream, UnixStream},
};

/// The longest one request may take, connecting included.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Where the agent is.
#[derive(Clone, Debug)]
pub enum Endpoint<'a> {
    /// `host:port`.
    Tcp(&'a str),
    /// A Unix socket path.
    Unix(&'a Path),
}

/// Sends one request (a JSON `body`, if any); returns (status code, body). Must not be called
/// from within an async runtime.
pub fn request(
    ep: &Endpoint<'_>,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String)> {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, "gpushare")
        .header(CONNECTION, "close")
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or("").to_owned())))
        .context("building the request")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the client's runtime")?;
    rt.block_on(async {
        let exchange = async {
            match ep {
                Endpoint::Tcp(addr) => {
                    let s = TcpStream::connect(addr)
                        .await
                        .with_context(|| format!("connecting to {addr}"))?;
                    exchange(s, req).await
                }
                Endpoint::Unix(p) => {
                    let s = UnixStream::connect(p)
                        .await
                        .with_context(|| format!("connecting to {}", p.display()))?;
                    exchange(s, req).await
                }
            }
        };
        tokio::time::timeout(TIMEOUT, exchange)
            .await
            .with_context(|| format!("no answer within {TIMEOUT:?}"))?
    })
}

async fn exchange(
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    req: Request<Full<Bytes>>,
) -> Result<(u16, String)> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake")?;
    // The connection is driven beside the request; it ends when the server closes it.
    let conn = tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .context("sending the request")?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading the answer")?
        .to_bytes();
    drop(sender);
    let _ = conn.await;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::TcpListener,
    };

    use super::*;

    /// Serves `raw` as the answer to one request on a loopback port.
    fn serve_once(raw: &'static [u8]) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(raw);
        });
        addr
    }

    #[test]
    fn reads_plain_and_chunked_answers() {
        let get = |raw| request(&Endpoint::Tcp(&serve_once(raw)), "GET", "/x", None);
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi";
        assert_eq!(get(plain).unwrap(), (200, "hi".into()));
        let chunked = b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(get(chunked).unwrap(), (404, "abcde".into()));
        assert!(get(b"garbage").is_err());
    }
}
