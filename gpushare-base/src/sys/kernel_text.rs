//! Names the kernel hands over as bytes (cgroup paths, mount points, process names), held as
//! text that keeps every byte.
//!
//! The kernel's names are bytes, and a tenant chooses many of them: a process renames itself
//! (`prctl(PR_SET_NAME)`), any user makes groups below its own delegated `user@UID.service`, any
//! user mounts a FUSE filesystem wherever it may write. Reading such a file as UTF-8 fails on the
//! first byte that is not (0xff, say), so a parser that did lost the whole file: the process went
//! unattributed and its GPU memory was charged to no one, and one odd mount anywhere on the host
//! stopped the agent. Every parser of `/proc` reads bytes.
//!
//! The agent keeps a cgroup path as a `String` (it is a key, a label, a quota's selector, a
//! ledger entry). [`text`] makes that string from the kernel's bytes **without loss**: valid
//! UTF-8 is kept as it is (so every name seen before is the same string), and each byte that is
//! not part of valid UTF-8 becomes U+0000 followed by the character whose code point is that byte
//! (U+0080..=U+00FF). The kernel never puts NUL in a name, so the two cannot be confused (and a
//! NUL in other bytes is written twice, so that every input has its own text), and [`bytes`]
//! gives back exactly the kernel's bytes: a group named `\xff` and one named `ÿ` stay two groups,
//! and the agent acts on the one it saw ([`under`]). Only display loses it: `shown`
//! writes such a byte as `\xff`.
//!
//! (Holding paths as `OsString` everywhere would say the same in types, but would change the
//! key, label, selector and ledger formats and some 180 uses for the rare name that needs it; the
//! encoding changes none of them for a name that is UTF-8.) Uses only `std`.

use std::{
    borrow::Cow,
    ffi::OsStr,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

/// The character that stands before a byte that is not UTF-8.
pub const RAW: char = '\0';

/// The kernel's bytes as the agent's text: valid UTF-8 unchanged (borrowed), each other byte as
/// [`RAW`] and the character of that byte's value (a NUL byte, which no kernel name holds, as
/// two).
pub fn text(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(bytes)
        && !s.contains(RAW)
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for (i, part) in chunk.valid().split(RAW).enumerate() {
            if i > 0 {
                out.push(RAW);
                out.push(RAW);
            }
            out.push_str(part);
        }
        for &b in chunk.invalid() {
            out.push(RAW);
            out.push(char::from(b));
        }
    }
    Cow::Owned(out)
}

/// [`text`], owned.
pub fn string(bytes: &[u8]) -> String {
    text(bytes).into_owned()
}

/// The kernel's bytes of a text made by [`text`] (borrowed when it holds no [`RAW`]). A [`RAW`]
/// that no byte follows (a text [`text`] did not make) is kept as a NUL byte.
pub fn bytes(text: &str) -> Cow<'_, [u8]> {
    if !text.contains(RAW) {
        return Cow::Borrowed(text.as_bytes());
    }
    let mut out = Vec::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == RAW
            && let Some(&n) = chars.peek()
            && let Ok(b) = u8::try_from(n)
            && (b >= 0x80 || b == 0)
        {
            chars.next();
            out.push(b);
            continue;
        }
        let mut buf = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }
    Cow::Owned(out)
}

/// The directory of `rel` (a path the kernel gave, as [`text`] spells it, `/`-rooted or not)
/// below `root`: the exact bytes the kernel names.
pub fn under(root: &Path, rel: &str) -> PathBuf {
    let rel = rel.trim_start_matches('/');
    match bytes(rel) {
        Cow::Borrowed(_) => root.join(rel),
        Cow::Owned(b) => root.join(OsStr::from_bytes(&b)),
    }
}

/// A path's bytes as [`text`] spells them.
pub fn of_path(path: &Path) -> Cow<'_, str> {
    text(path.as_os_str().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_kept_and_other_bytes_round_trip() {
        assert!(matches!(text(b"/docker/abc"), Cow::Borrowed("/docker/abc")));
        assert!(matches!(text("/é/ÿ".as_bytes()), Cow::Borrowed("/é/ÿ")));
        let odd = b"/a/\xff/\xc3(/\xe2\x82";
        let t = text(odd);
        assert_eq!(t, "/a/\0\u{ff}/\0\u{c3}(/\0\u{e2}\0\u{82}");
        assert_eq!(&*bytes(&t), odd);
        assert!(matches!(bytes("/a/b"), Cow::Borrowed(b"/a/b")));
    }

    #[test]
    fn a_byte_and_the_character_of_its_value_stay_two_names() {
        // 0xff and U+00FF (ÿ, bytes c3 bf) are different groups.
        assert_ne!(text(b"\xff"), text("ÿ".as_bytes()));
        assert_eq!(&*bytes(&text("ÿ".as_bytes())), "ÿ".as_bytes());
        // A NUL that no byte follows is kept (no text made here has one).
        assert_eq!(&*bytes("a\0b"), b"a\0b");
        assert_eq!(&*bytes("a\0"), b"a\0");
    }

    /// Found by the fuzzer: bytes holding a NUL and then the UTF-8 of U+00CA read back as 0xCA.
    /// A NUL in the input is written twice, so every input has a text of its own.
    #[test]
    fn bytes_with_a_nul_round_trip_too() {
        for input in [
            &b"0::\xc3\x8a\0\xc3\x8a:0:"[..],
            b"\0",
            b"\0\0\xff",
            b"a\0\xff\0",
        ] {
            let t = text(input);
            assert_eq!(&*bytes(&t), input, "{t:?}");
        }
        assert_ne!(text(b"\0\xc3\x8a"), text(b"\xca"));
        assert_eq!(text(b"a\0b"), "a\0\0b");
    }

    #[test]
    fn the_directory_under_a_root_is_the_kernels_bytes() {
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(under(root, "/x/y"), Path::new("/sys/fs/cgroup/x/y"));
        let dir = under(root, &text(b"/x/\xff"));
        assert_eq!(dir.as_os_str().as_bytes(), b"/sys/fs/cgroup/x/\xff");
        assert_eq!(of_path(&dir), text(b"/sys/fs/cgroup/x/\xff"));
    }
}
