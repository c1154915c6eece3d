//! A minimal HTTP/1.1 client for the agent's own endpoints (`status`, `release`), over TCP or the
//! local Unix socket. One request per connection (`Connection: close`); no TLS, no redirects: the
//! server is the agent on this node. Small enough that a general-purpose client crate would be all
//! weight and no gain (none of the well-kept ones speaks HTTP over a Unix socket without a runtime).

use std::{
    io::{Read, Write},
    net::TcpStream,
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use anyhow::{Context, Result, bail};

/// Where the agent is.
#[derive(Clone, Debug)]
pub enum Endpoint<'a> {
    /// `host:port`.
    Tcp(&'a str),
    /// A Unix socket path.
    Unix(&'a Path),
}

/// Sends one request; returns (status code, body).
pub fn request(
    ep: &Endpoint<'_>,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String)> {
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: gpushare\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let raw = match ep {
        Endpoint::Tcp(addr) => {
            let mut s =
                TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(req.as_bytes())?;
            read_all(&mut s)?
        }
        Endpoint::Unix(p) => {
            let mut s =
                UnixStream::connect(p).with_context(|| format!("connecting to {}", p.display()))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(req.as_bytes())?;
            read_all(&mut s)?
        }
    };
    parse_response(&raw)
}

fn read_all(r: &mut impl Read) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Splits a raw HTTP/1.1 response into status and body (handles chunked bodies).
pub fn parse_response(raw: &[u8]) -> Result<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("malformed HTTP response")
    };
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("malformed HTTP status line")?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").context("malformed chunk")?;
        let n = usize::from_str_radix(size.trim(), 16).context("malformed chunk size")?;
        if n == 0 {
            return Ok(out);
        }
        if rest.len() < n {
            bail!("truncated chunk");
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_responses() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi";
        assert_eq!(parse_response(plain).unwrap(), (200, "hi".into()));
        let chunked = b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (404, "abcde".into()));
        assert!(parse_response(b"garbage").is_err());
    }
}
